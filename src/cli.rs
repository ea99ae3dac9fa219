//! The command line: `serve` (the default) and the admin commands.

mod keys;
mod orders;
mod outcomes;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

use crate::auth::{BuyerId, Tokens};
use crate::checkout::seats;
use crate::config::Settings;
use crate::jobs::cleanup::{Cleanup, Swept};
use crate::startup::{prepare_database, Application};
use crate::{db, descriptors, telemetry};

/// Stagedoor checkout: seat holds and orders where one click is one order
/// and at most one charge.
///
/// Settings: the defaults built in (those of config/default.toml and
/// config/$STAGEDOOR_ENV.toml, local when unset), overridden by the same
/// files in $STAGEDOOR_CONFIG_DIR (./config when unset) where they exist,
/// then by STAGEDOOR__SECTION__KEY environment variables; DATABASE_URL wins
/// for the database. An unknown key stops every command.
#[derive(Debug, Parser)]
#[command(version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the HTTP service and its background jobs (the default).
    Serve,
    /// Apply pending database migrations and exit.
    Migrate,
    /// Print a signed bearer token for a buyer (development and tests).
    Token {
        /// The buyer's id: 1-255 bytes of printable text (e.g. auth0|64f0c2...)
        #[arg(long)]
        sub: String,
        /// How long the token is valid, in seconds.
        #[arg(long, default_value_t = 3600)]
        ttl_secs: u64,
    },
    /// Create an event with n seats (idempotent) and print a JSON summary.
    Seed {
        /// The event's id.
        #[arg(long)]
        event: String,
        /// How many seats it has (labels A1..A20, B1.. in rows of 20).
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..=100_000))]
        seats: u32,
        /// The price of each new seat, in cents.
        #[arg(long, default_value_t = 4_500, value_parser = clap::value_parser!(i64).range(1..))]
        price_cents: i64,
    },
    /// Delete expired idempotency keys once and print how many rows went.
    Cleanup,
    /// Show, purge or count idempotency keys (support and operations).
    ///
    /// Exit status: 0 found or done, 1 no such key, 2 refused (also bad
    /// arguments, as for every command), 3 failed.
    Keys {
        #[command(subcommand)]
        command: keys::KeysCommand,
    },
    /// Show an order from its id alone (its payment, its click's key, its
    /// event), or list a buyer's orders: was the buyer charged?
    ///
    /// Exit status: 0 found or listed, 1 no such order, 3 failed.
    Orders {
        #[command(subcommand)]
        command: orders::OrdersCommand,
    },
    /// Show an order's event for the shop, or send it again.
    ///
    /// Exit status: 0 found or done, 1 the order has no event, 3 failed.
    Outcomes {
        #[command(subcommand)]
        command: outcomes::OutcomesCommand,
    },
}

impl Cli {
    /// The exit status of a command that failed: 3 for `keys`, `orders`
    /// and `outcomes`, whose 1 means "no such key", "no such order" or "no
    /// such event", else 1.
    pub fn failure(&self) -> ExitCode {
        match self.command {
            Some(Command::Keys { .. } | Command::Orders { .. } | Command::Outcomes { .. }) => {
                ExitCode::from(keys::FAILED)
            }
            _ => ExitCode::FAILURE,
        }
    }
}

/// Runs a command; its exit status when it did not fail.
pub async fn run(cli: Cli) -> anyhow::Result<ExitCode> {
    let settings = Settings::load()?;
    let telemetry = telemetry::init(settings.is_production(), &settings.telemetry)?;
    for warning in settings.warnings() {
        tracing::warn!("{warning}");
    }
    let status = run_command(cli, settings).await;
    telemetry.shutdown();
    status
}

async fn run_command(cli: Cli, settings: Settings) -> anyhow::Result<ExitCode> {
    match cli.command.unwrap_or(Command::Serve) {
        Command::Serve => {
            descriptors::raise_logged();
            Application::build(settings)
                .await?
                .run_until_stopped()
                .await?
        }
        Command::Migrate => {
            prepare_database(&settings).await?;
            println!("migrations applied");
        }
        Command::Token { sub, ttl_secs } => {
            let buyer = BuyerId::parse(&sub).context("--sub")?;
            anyhow::ensure!(
                settings.auth.jwt_secret_is_set(),
                "the token command signs with auth.jwt_secret, which is empty"
            );
            let token = Tokens::new(&settings.auth.jwt_secret)?
                .sign(&buyer, Duration::from_secs(ttl_secs))?;
            println!("{token}");
        }
        Command::Seed {
            event,
            seats,
            price_cents,
        } => {
            prepare_database(&settings).await?;
            let pool = db::pool(&settings.database)?;
            let client = pool.get().await.context("connecting to the database")?;
            let summary = seats::seed(&client, &event, seats, price_cents).await?;
            println!("{}", serde_json::to_string(&summary)?);
        }
        Command::Cleanup => {
            let pool = db::pool(&settings.database)?;
            match Cleanup::new(pool, settings.idempotency.ttl()).run().await? {
                Swept::Deleted(rows) => println!("{rows}"),
                Swept::Skipped => {
                    anyhow::bail!("another instance is cleaning up right now; try again later")
                }
            }
        }
        Command::Keys { command } => return keys::run(command, &settings).await,
        Command::Orders { command } => return orders::run(command, &settings).await,
        Command::Outcomes { command } => return outcomes::run(command, &settings).await,
    }
    Ok(ExitCode::SUCCESS)
}
