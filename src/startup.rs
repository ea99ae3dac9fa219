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
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use idempotency::{AnswerCache, Engine, Gate, Policy, Route};
use secrecy::ExposeSecret;

use crate::auth::{self, KeySource, Provider, Verifier};
use crate::checkout::holds::{self, HoldPolicy};
use crate::checkout::orders::{self, Orders};
use crate::checkout::seat_maps::SeatMaps;
use crate::checkout::seats;
use crate::config::{LockMode, Settings};
use crate::http::payrail_events::{self, PayrailEvents};
use crate::http::{self, AppState};
use crate::jobs::{cleanup, outcomes, reconcile, retention, sale, shards, Jobs};
use crate::payrail;
use crate::readiness::Readiness;
use crate::{db, observe, telemetry};

/// The demo event a fresh local run offers.
pub const DEMO_EVENT: &str = "demo";
const DEMO_SEATS: u32 = 200;
const DEMO_PRICE_CENTS: i64 = 4_500;

pub struct Application {
    port: u16,
    pool: Pool,
    server: Server,
    metrics: Option<MetricsListener>,
    jobs: Jobs,
    key_refresh: Option<KeyRefresh>,
    sandbox: Option<EmbeddedSandbox>,
}

impl Application {
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        // Every module that reports a metric, so that its series are there
        // from the first scrape.
        observe::install(&[
            auth::METRICS,
            cleanup::METRICS,
            reconcile::METRICS,
            outcomes::METRICS,
            retention::METRICS,
            sale::METRICS,
            holds::METRICS,
            orders::METRICS,
            payrail::METRICS,
            payrail_events::METRICS,
        ]);
        prepare_database(&settings).await?;
        let pool = db::pool(&settings.database)?;
        let route = db::route(&settings.database, pool.clone())?;
        let workers = shards::refresh_logged(&route).await;
        if workers > 0 {
            tracing::info!(
                workers,
                "each buyer's statements go to the worker of its shard"
            );
        }
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

        let listener = TcpListener::bind((settings.server.host.as_str(), settings.server.port))
            .with_context(|| {
                format!(
                    "binding {}:{} (server.host / server.port)",
                    settings.server.host, settings.server.port
                )
            })?;
        let address = listener.local_addr()?;
        let port = address.port();
        let sandbox = if settings.payrail.sandbox && settings.payrail.base_url.is_empty() {
            Some(EmbeddedSandbox::start(&settings, address)?)
        } else {
            None
        };
        let payrail_url = sandbox.as_ref().map_or_else(
            || settings.payrail.base_url.clone(),
            EmbeddedSandbox::base_url,
        );
        let mut state = state(&settings, route.clone(), &payrail_url).await?;
        let outcomes = outcomes::Outcomes::new(pool.clone(), &settings.outcomes)
            .context("the order events' HTTP client (outcomes.*)")?;
        let key_refresh = match KeySource::from_settings(&settings.auth) {
            Some(source) => {
                let provider = Provider::new(source, &settings.auth)?;
                state.verifier = state.verifier.with_provider(provider.clone());
                Some(KeyRefresh::start(provider).await)
            }
            None => None,
        };
        let state = web::Data::new(state);
        let metrics = MetricsListener::start(&settings, &state)?;
        // Production shows its metrics to its own network only.
        let metrics_on_api = metrics.is_none() && !settings.is_production();
        let (orders, limit) = (state.orders.clone(), state.limit.clone());
        let cors_origins = settings.http.cors_origins.clone();
        let key_life = settings.idempotency.ttl();
        let mut server = HttpServer::new(move || {
            App::new()
                .wrap(http::cors::cors(&cors_origins))
                .wrap(http::bare_refusals_as_problems())
                .wrap(from_fn(telemetry::log_request))
                .wrap(from_fn(http::watch::track))
                .app_data(state.clone())
                .configure(http::routes(key_life, metrics_on_api))
                .default_service(web::to(http::not_found))
        })
        .shutdown_timeout(settings.server.shutdown_timeout_secs)
        // `http.request_timeout_secs` for the head of a connection's first
        // request; `http::watch` bounds the heads of the next ones, and
        // `http::body::read` every body.
        .client_request_timeout(settings.http.request_timeout())
        .keep_alive(http::watch::KEEP_ALIVE)
        .on_connect(http::watch::on_connect(settings.http.request_timeout()))
        .listen(listener)?;
        if settings.server.workers > 0 {
            server = server.workers(settings.server.workers);
        }
        let server = server.run();
        let jobs = Jobs::spawn(route, orders, limit, outcomes, &settings);
        tracing::info!(
            port,
            metrics_port = metrics.as_ref().map(|m| m.port),
            environment = %settings.environment,
            "stagedoor checkout listening"
        );
        Ok(Self {
            port,
            pool,
            server,
            metrics,
            jobs,
            key_refresh,
            sandbox,
        })
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The port of `/metrics`' own listener (`server.metrics_addr`).
    pub fn metrics_port(&self) -> Option<u16> {
        self.metrics.as_ref().map(|m| m.port)
    }

    /// The instance's connection pool, for the benchmark's pool-wait probe
    /// (`benches/checkout/load.rs`): it times `get()` beside real traffic.
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
        if let Some(metrics) = self.metrics {
            metrics.stop().await;
        }
        self.jobs.stop().await;
        if let Some(refresh) = self.key_refresh {
            refresh.stop().await;
        }
        if let Some(sandbox) = self.sandbox {
            sandbox.stop().await;
        }
        tracing::info!("stopped");
        served
    }
}

/// `/metrics` on a listener of its own (`server.metrics_addr`): one worker,
/// no signals of its own, stopped after the API's server.
struct MetricsListener {
    port: u16,
    handle: ServerHandle,
    served: JoinHandle<std::io::Result<()>>,
}

impl MetricsListener {
    fn start(settings: &Settings, state: &web::Data<AppState>) -> anyhow::Result<Option<Self>> {
        let address = &settings.server.metrics_addr;
        if address.is_empty() {
            return Ok(None);
        }
        let listener = TcpListener::bind(address.as_str())
            .with_context(|| format!("binding {address} (server.metrics_addr)"))?;
        let port = listener.local_addr()?.port();
        let state = state.clone();
        let server = HttpServer::new(move || {
            App::new()
                .app_data(state.clone())
                .configure(http::metrics::routes)
                .default_service(web::to(http::not_found))
        })
        .workers(1)
        .disable_signals()
        .shutdown_timeout(1)
        .listen(listener)?
        .run();
        Ok(Some(Self {
            port,
            handle: server.handle(),
            served: tokio::spawn(server),
        }))
    }

    async fn stop(self) {
        self.handle.stop(true).await;
        if let Ok(Err(error)) = self.served.await {
            tracing::warn!(%error, "the metrics listener stopped with an error");
        }
    }
}

/// What the handlers share: the pool, the idempotency engine (with the
/// Redis gate when `idempotency.lock = redis`), the orders with their
/// Payrail client at `payrail_url`, and the request limits.
pub async fn state(
    settings: &Settings,
    route: Route,
    payrail_url: &str,
) -> anyhow::Result<AppState> {
    let pool = route.home().clone();
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
    let mut engine = Engine::new(route.clone(), policy)
        .with_gate(gate)
        .with_limit(limit.clone())
        .on_outcome(observe::idempotency)
        .on_wait(observe::idempotency_wait);
    // The listeners' own connections, outside the pool (and without the
    // pool's session options).
    let (listen, tls) = db::target(&settings.database)?;
    let cache_mb = settings.idempotency.answer_cache_mb;
    if cache_mb > 0 {
        let cache = AnswerCache::start(
            cache_mb << 20,
            listen.clone(),
            tls.clone(),
            observe::answer_cache_event,
        );
        engine = engine.with_answer_cache(cache);
    }
    let seat_maps = SeatMaps::default();
    seat_maps.listen(listen, tls);
    let webhook_secret = &settings.payrail.webhook_secret;
    let events = (!webhook_secret.expose_secret().is_empty()).then(|| PayrailEvents {
        verifier: payrail::Verifier::new(
            webhook_secret.clone(),
            settings.payrail.webhook_tolerance(),
        ),
        engine: Engine::new(route.clone(), policy),
    });
    Ok(AppState {
        engine,
        orders: Orders::new(route.clone(), payrail),
        seat_maps,
        limit,
        readiness: Readiness::new(pool.clone()),
        pool,
        route,
        verifier: Verifier::new(&settings.auth).context("auth.jwt_secret")?,
        max_wait_secs: settings.idempotency.max_wait_secs,
        holds: HoldPolicy::from(&settings.holds),
        max_body_bytes: settings.http.max_body_bytes,
        request_timeout: settings.http.request_timeout(),
        events,
    })
}

/// The background refresh of the identity provider's keys, after a first
/// fetch at start; a provider that does not answer yet delays nothing
/// (readiness says so until a set arrives).
struct KeyRefresh {
    cancel: CancellationToken,
    task: JoinHandle<()>,
}

impl KeyRefresh {
    async fn start(provider: Provider) -> Self {
        let next = provider.refresh().await.unwrap_or(Duration::from_secs(1));
        let cancel = CancellationToken::new();
        let task = tokio::spawn(provider.run(next, cancel.clone()));
        Self { cancel, task }
    }

    async fn stop(self) {
        self.cancel.cancel();
        let _ = self.task.await;
    }
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
/// no `payrail.base_url`). With `payrail.webhook_secret` set it sends its
/// events to this instance (`service`, its bound address), so a lost answer
/// settles by its event out of the box. A build without the `sandbox`
/// feature (the container's) cannot embed one and says so.
#[cfg(feature = "sandbox")]
struct EmbeddedSandbox(payrail_sandbox::Sandbox);

#[cfg(feature = "sandbox")]
impl EmbeddedSandbox {
    fn start(settings: &Settings, service: std::net::SocketAddr) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let secret = settings.payrail.webhook_secret.expose_secret();
        let webhook = (!secret.is_empty()).then(|| {
            // An instance bound to every address is reached on loopback.
            let host = match service.ip() {
                ip if ip.is_unspecified() => std::net::Ipv4Addr::LOCALHOST.into(),
                ip => ip,
            };
            let service = std::net::SocketAddr::new(host, service.port());
            payrail_sandbox::Webhook {
                url: format!("http://{service}/payrail/events"),
                secret: secret.to_owned(),
            }
        });
        let api_key = settings.payrail.api_key.expose_secret().to_owned();
        let sandbox = payrail_sandbox::Sandbox::start_with(listener, api_key, webhook)?;
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
    fn start(_settings: &Settings, _service: std::net::SocketAddr) -> anyhow::Result<Self> {
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
