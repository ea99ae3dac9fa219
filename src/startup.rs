//! Builds an instance from its settings (database, migrations, Payrail,
//! listener, jobs) and runs it until it is stopped, draining in order:
//! HTTP first (in-flight requests finish, bounded), then the jobs.

use std::net::TcpListener;
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::{Server, ServerHandle};
use actix_web::middleware::from_fn;
use actix_web::{web, App, HttpServer};
use anyhow::Context;
use deadpool_postgres::Pool;

use crate::auth::Tokens;
use crate::checkout::seats;
use crate::config::Settings;
use crate::http::{self, AppState};
use crate::idempotency::store::KeyPolicy;
use crate::idempotency::Gate;
use crate::jobs::Jobs;
use crate::payrail::{self, sandbox::Sandbox};
use crate::{db, observe, telemetry};

/// The demo event a fresh local run offers.
pub const DEMO_EVENT: &str = "demo";
const DEMO_SEATS: u32 = 200;
const DEMO_PRICE_CENTS: i64 = 4_500;

pub struct Application {
    port: u16,
    pool: Pool,
    server: Server,
    jobs: Jobs,
    sandbox: Option<Sandbox>,
}

impl Application {
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        observe::install();
        prepare_database(&settings).await?;
        let pool = db::pool(&settings.database)?;
        if settings.demo.seed {
            let client = pool.get().await.context("connecting to the database")?;
            seats::seed(&client, DEMO_EVENT, DEMO_SEATS, DEMO_PRICE_CENTS).await?;
        }

        let sandbox = if settings.payrail.sandbox && settings.payrail.base_url.is_empty() {
            let listener = TcpListener::bind("127.0.0.1:0")?;
            let api_key =
                secrecy::ExposeSecret::expose_secret(&settings.payrail.api_key).to_owned();
            let sandbox = Sandbox::start(listener, api_key)?;
            tracing::info!(url = %sandbox.base_url(), "embedded payrail sandbox started");
            Some(sandbox)
        } else {
            None
        };
        let payrail_url = sandbox
            .as_ref()
            .map_or_else(|| settings.payrail.base_url.clone(), Sandbox::base_url);
        let payrail = Arc::new(payrail::Client::new(&settings.payrail, &payrail_url)?);

        let listener = TcpListener::bind((settings.server.host.as_str(), settings.server.port))
            .with_context(|| {
                format!(
                    "binding {}:{} (server.host / server.port)",
                    settings.server.host, settings.server.port
                )
            })?;
        let port = listener.local_addr()?.port();
        let state = web::Data::new(AppState {
            pool: pool.clone(),
            payrail: payrail.clone(),
            tokens: Tokens::new(&settings.auth.jwt_secret).context("auth.jwt_secret")?,
            gate: Gate::connect(&settings.idempotency, &settings.redis).await?,
            keys: KeyPolicy {
                ttl: settings.idempotency.ttl(),
                lease: settings.idempotency.lease(),
            },
            hold_ttl: Duration::from_secs(settings.holds.ttl_secs),
            max_body_bytes: settings.http.max_body_bytes,
        });
        let cors_origins = settings.http.cors_origins.clone();
        let mut server = HttpServer::new(move || {
            App::new()
                .wrap(http::cors::cors(&cors_origins))
                .wrap(http::bare_refusals_as_problems())
                .wrap(from_fn(telemetry::log_request))
                .app_data(state.clone())
                .configure(http::routes)
                .default_service(web::to(http::not_found))
        })
        .shutdown_timeout(settings.server.shutdown_timeout_secs)
        .listen(listener)?;
        if settings.server.workers > 0 {
            server = server.workers(settings.server.workers);
        }
        let server = server.run();
        let jobs = Jobs::spawn(pool.clone(), payrail, &settings);
        tracing::info!(port, environment = %settings.environment, "stagedoor checkout listening");
        Ok(Self {
            port,
            pool,
            server,
            jobs,
            sandbox,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The instance's connection pool, for the benchmark's pool-wait probe
    /// (`benches/checkout.rs`): it times `get()` beside real traffic.
    #[doc(hidden)]
    pub fn pool(&self) -> Pool {
        self.pool.clone()
    }

    /// Stops the server from elsewhere (tests); signals do the same in `serve`.
    pub fn handle(&self) -> ServerHandle {
        self.server.handle()
    }

    /// Serves until SIGTERM/SIGINT or `handle().stop(..)`: stops accepting,
    /// lets in-flight requests finish (`server.shutdown_timeout_secs`), then
    /// stops the jobs and the embedded sandbox.
    pub async fn run_until_stopped(self) -> std::io::Result<()> {
        let served = self.server.await;
        self.jobs.stop().await;
        if let Some(sandbox) = self.sandbox {
            sandbox.stop().await;
        }
        tracing::info!("stopped");
        served
    }
}

/// Creates the database when allowed, then applies pending migrations.
pub async fn prepare_database(settings: &Settings) -> anyhow::Result<()> {
    if settings.database.create_if_missing {
        db::create_if_missing(&settings.database)
            .await
            .context("creating the database (database.url)")?;
    }
    db::migrate(&settings.database)
        .await
        .context("applying migrations (database.url)")?;
    Ok(())
}
