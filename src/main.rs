use clap::Parser;
use stagedoor_checkout::cli::{self, Cli};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let failed = cli.failure();
    match cli::run(cli).await {
        Ok(status) => status,
        Err(error) => {
            eprintln!("error: {error:#}");
            failed
        }
    }
}
