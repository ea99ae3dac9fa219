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

use idempotency::{Engine, Gate, Policy};
use secrecy::ExposeSecret;

use crate::auth::Tokens;
use crate::checkout::orders::Orders;
use crate::checkout::seats;
use crate::config::{LockMode, Settings};
use crate::http::{self, AppState};
use crate::jobs::Jobs;
use crate::payrail;
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
    sandbox: Option<EmbeddedSandbox>,
}

impl Application {
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        observe::install();
        prepare_database(&settings).await?;
        let pool = db::pool(&settings.database)?;
        if settings.demo.seed {
            let client = pool.get().await.context("connecting to the database")?;
            let seeded = seats::seed(&client, DEMO_EVENT, DEMO_SEATS, DEMO_PRICE_CENTS).await?;
            tracing::info!(
                event_id = %seeded.event_id,
                seats = seeded.seats,
                created = seeded.created,
                "the demo event is ready (demo.seed)"
            );
        }

        let sandbox = if settings.payrail.sandbox && settings.payrail.base_url.is_empty() {
            Some(EmbeddedSandbox::start(
                settings.payrail.api_key.expose_secret(),
            )?)
        } else {
            None
        };
        let payrail_url = sandbox.as_ref().map_or_else(
            || settings.payrail.base_url.clone(),
            EmbeddedSandbox::base_url,
        );
        let state = web::Data::new(state(&settings, pool.clone(), &payrail_url).await?);
        let (orders, limit) = (state.orders.clone(), state.limit.clone());
        let listener = TcpListener::bind((settings.server.host.as_str(), settings.server.port))
            .with_context(|| {
                format!(
                    "binding {}:{} (server.host / server.port)",
                    settings.server.host, settings.server.port
                )
            })?;
        let port = listener.local_addr()?.port();
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
        let jobs = Jobs::spawn(pool.clone(), orders, limit, &settings);
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

/// What the handlers share: the pool, the idempotency engine (with the
/// Redis gate when `idempotency.lock = redis`), the orders with their
/// Payrail client at `payrail_url`, and the request limits.
pub async fn state(settings: &Settings, pool: Pool, payrail_url: &str) -> anyhow::Result<AppState> {
    let payrail = Arc::new(payrail::Client::new(&settings.payrail, payrail_url)?);
    let gate = match settings.idempotency.lock {
        LockMode::Table => Gate::Table,
        LockMode::Redis => Gate::redis(settings.redis.url.expose_secret())
            .await
            .context("connecting to Redis (redis.url)")?,
    };
    let policy = Policy {
        ttl: settings.idempotency.ttl(),
        lease: settings.idempotency.lease(),
    };
    let limit = settings.limits.limit();
    Ok(AppState {
        engine: Engine::new(pool.clone(), policy)
            .with_gate(gate)
            .with_limit(limit.clone())
            .on_outcome(observe::idempotency)
            .on_wait(observe::idempotency_wait),
        orders: Orders::new(pool.clone(), payrail, http::order_answer),
        limit,
        pool,
        tokens: Tokens::new(&settings.auth.jwt_secret).context("auth.jwt_secret")?,
        max_wait_secs: settings.idempotency.max_wait_secs,
        hold_ttl: Duration::from_secs(settings.holds.ttl_secs),
        max_body_bytes: settings.http.max_body_bytes,
    })
}

/// Creates the database when allowed, then applies pending migrations;
/// both wait for a database that is not up yet, for
/// `database.connect_timeout_secs` in all (`db::Patience`).
pub async fn prepare_database(settings: &Settings) -> anyhow::Result<()> {
    let database = &settings.database;
    let patience = db::Patience::new(database);
    if database.create_if_missing {
        patience
            .retrying("creating the database", || db::create_if_missing(database))
            .await
            .context("creating the database (database.url)")?;
    }
    patience
        .retrying("applying migrations", || db::migrate(database))
        .await
        .context("applying migrations (database.url)")?;
    Ok(())
}

/// The Payrail sandbox `serve` embeds for local runs (`payrail.sandbox` with
/// no `payrail.base_url`). A build without the `sandbox` feature (the
/// container's) cannot embed one and says so.
#[cfg(feature = "sandbox")]
struct EmbeddedSandbox(payrail_sandbox::Sandbox);

#[cfg(feature = "sandbox")]
impl EmbeddedSandbox {
    fn start(api_key: &str) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let sandbox = payrail_sandbox::Sandbox::start(listener, api_key.to_owned())?;
        tracing::info!(url = %sandbox.base_url(), "embedded payrail sandbox started");
        Ok(Self(sandbox))
    }

    fn base_url(&self) -> String {
        self.0.base_url()
    }

    async fn stop(self) {
        self.0.stop().await;
    }
}

#[cfg(not(feature = "sandbox"))]
enum EmbeddedSandbox {}

#[cfg(not(feature = "sandbox"))]
impl EmbeddedSandbox {
    fn start(_api_key: &str) -> anyhow::Result<Self> {
        anyhow::bail!(
            "configuration key `payrail.sandbox`: this build has no embedded sandbox \
             (built without the `sandbox` feature); set payrail.base_url"
        )
    }

    fn base_url(&self) -> String {
        match *self {}
    }

    async fn stop(self) {
        match self {}
    }
}
