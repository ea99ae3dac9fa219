//! `payrail-sandbox`: the Payrail double as a stand-alone server, for
//! compose and for running the service against a sandbox it does not own.
//!
//! stdout carries exactly one line, `payrail-sandbox listening on
//! http://HOST:PORT`, once the port is bound (tests and scripts parse it); logs
//! go to stderr, one JSON object a line when `STAGEDOOR_ENV=production` (as
//! the service's, and so in the image, which sets it), else text. SIGTERM or
//! SIGINT stops it gracefully with exit status 0.

use std::io::Write;
use std::net::TcpListener;

use anyhow::Context;
use clap::Parser;
use payrail_sandbox::{Sandbox, Webhook};

/// A stand-alone imitation of the Payrail payment provider, for development
/// and tests only: it never moves money and keeps everything in memory.
///
/// Endpoints: POST /v1/charges and POST /v1/charges/cancel (bearer API key
/// and Idempotency-Key required), GET|POST /v1/sandbox/faults, GET|DELETE
/// /v1/sandbox/charges, GET /v1/sandbox/events, GET /healthz.
/// Test cards: pm_card_declined, pm_card_slow (answered late), pm_card_late
/// (answered and its event sent late), pm_card_error; any other pm_…
/// succeeds.
#[derive(Debug, Parser)]
#[command(name = "payrail-sandbox", version)]
struct Args {
    /// Port to listen on; 0 picks any free port (the chosen one is printed).
    #[arg(long, env = "PAYRAIL_SANDBOX_PORT", default_value_t = 8081)]
    port: u16,

    /// Address to bind; use 0.0.0.0 inside a container.
    #[arg(long, env = "PAYRAIL_SANDBOX_HOST", default_value = "127.0.0.1")]
    host: String,

    /// API key clients must send as `Authorization: Bearer <key>` on /v1/charges.
    #[arg(
        long,
        env = "PAYRAIL_API_KEY",
        default_value = "sk_test_stagedoor",
        hide_env_values = true
    )]
    api_key: String,

    /// Where to POST a signed event for every charge decided (none when unset).
    #[arg(long, env = "PAYRAIL_SANDBOX_WEBHOOK_URL", requires = "webhook_secret")]
    webhook_url: Option<String>,

    /// The secret events are signed with (`Payrail-Signature`).
    #[arg(long, env = "PAYRAIL_SANDBOX_WEBHOOK_SECRET", hide_env_values = true)]
    webhook_secret: Option<String>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    init_logging();

    let listener = TcpListener::bind((args.host.as_str(), args.port))
        .with_context(|| format!("cannot bind {}:{}", args.host, args.port))?;
    let address = listener.local_addr()?;
    let webhook = args
        .webhook_url
        .zip(args.webhook_secret)
        .map(|(url, secret)| Webhook { url, secret });
    let sandbox = Sandbox::start_with(listener, args.api_key, webhook)?;

    let mut stdout = std::io::stdout();
    writeln!(stdout, "payrail-sandbox listening on http://{address}")?;
    stdout.flush()?;

    shutdown_signal().await?;
    tracing::info!("payrail-sandbox stopping");
    sandbox.stop().await;
    Ok(())
}

/// Logs to stderr so that stdout keeps only the listening line: JSON in
/// production, where a log collector reads it beside the service's, text
/// elsewhere. `RUST_LOG` sets the level (default `info`).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    if std::env::var("STAGEDOOR_ENV").as_deref() == Ok("production") {
        builder.json().flatten_event(true).init();
    } else {
        builder.init();
    }
}

/// Waits for SIGTERM (how containers are stopped) or SIGINT (Ctrl-C).
async fn shutdown_signal() -> std::io::Result<()> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut terminate = signal(SignalKind::terminate())?;
        tokio::select! {
            _ = terminate.recv() => Ok(()),
            interrupted = tokio::signal::ctrl_c() => interrupted,
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await
    }
}
