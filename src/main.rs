use clap::Parser;
use stagedoor_checkout::cli::{self, Cli};

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match cli::run(Cli::parse()).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
