//! The PostgreSQL pool (and on a Citus cluster one per worker, each buyer's
//! statements routed to its shard's), database creation for local runs,
//! and the embedded migrations. Everything else asks this module for a
//! `Pool` or a `Route` and never opens connections of its own. At start,
//! [`Patience`] waits for a database that is not up yet
//! (`database.connect_timeout_secs`). Every connection is secured as
//! `database.url`'s `sslmode` says ([`tls`]).

mod tls;

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::DatabaseSettings;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod, Runtime};
use idempotency::Route;
use secrecy::ExposeSecret;
pub use tls::{PgTls, TlsError};
use tokio_postgres::error::SqlState;

refinery::embed_migrations!("migrations");

/// Any database failure. Callers map `Unavailable` to 503, the rest to 500.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("no database connection available")]
    Pool(#[from] deadpool_postgres::PoolError),
    #[error("database error")]
    Postgres(#[from] tokio_postgres::Error),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("building the pool")]
    Build(#[from] deadpool_postgres::BuildError),
    #[error("migrations failed")]
    Migrate(#[from] refinery::Error),
    #[error("the idempotency engine")]
    Engine(#[from] idempotency::Error),
    #[error(
        "not reachable after {tries} tries in {waited_secs} s (database.connect_timeout_secs)"
    )]
    GaveUp {
        tries: u32,
        waited_secs: u64,
        #[source]
        last: Box<DbError>,
    },
}

impl DbError {
    /// True when the database could not be reached (as opposed to a query that
    /// failed): the caller may try again later.
    pub fn is_unavailable(&self) -> bool {
        match self {
            DbError::Pool(_) => true,
            DbError::Postgres(e) => {
                !tls::is_refused_certificate(e) && idempotency::is_unavailable(e)
            }
            DbError::Engine(e) => e.is_unavailable(),
            DbError::GaveUp { .. } => true,
            _ => false,
        }
    }
}

/// The wait after the first refused try; it doubles after each one, up to
/// [`RETRY_MAX`].
const RETRY_FIRST: Duration = Duration::from_millis(200);
const RETRY_MAX: Duration = Duration::from_secs(5);

/// How long the start waits for a database that is not up yet (a container
/// started beside this one, a server restarting): `database.connect_timeout_secs`
/// from the moment it is made, one budget for every step it retries.
#[derive(Debug, Clone, Copy)]
pub struct Patience {
    started: Instant,
    /// `None`: a timeout too long to represent, which is no deadline.
    deadline: Option<Instant>,
}

impl Patience {
    pub fn new(settings: &DatabaseSettings) -> Self {
        let started = Instant::now();
        Self {
            started,
            deadline: started.checked_add(settings.connect_timeout()),
        }
    }

    /// Runs `attempt` (`what`: what it does, for the log) until it
    /// succeeds, fails for another reason than an unreachable database (a
    /// bad password, a missing database, a failed migration: that error at
    /// once), or the deadline has passed. Between tries it waits 0.2 s,
    /// doubling up to 5 s, never past the deadline; each failed try is a
    /// WARN line with its error and the wait before the next. With a timeout
    /// of 0 the first failure is the answer, as it is.
    pub async fn retrying<T, F, Fut>(&self, what: &str, mut attempt: F) -> Result<T, DbError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, DbError>>,
    {
        let mut delay = RETRY_FIRST;
        let mut tries: u32 = 0;
        loop {
            tries += 1;
            let error = match attempt().await {
                Ok(value) => {
                    if tries > 1 {
                        tracing::info!(step = what, tries, "the database answers");
                    }
                    return Ok(value);
                }
                Err(error) if error.is_unavailable() => error,
                Err(error) => return Err(error),
            };
            let left = self.deadline.map_or(Duration::MAX, |deadline| {
                deadline.saturating_duration_since(Instant::now())
            });
            if left.is_zero() {
                return Err(if tries == 1 {
                    error
                } else {
                    DbError::GaveUp {
                        tries,
                        waited_secs: self.started.elapsed().as_secs(),
                        last: Box::new(error),
                    }
                });
            }
            let wait = delay.min(left);
            tracing::warn!(
                step = what,
                attempt = tries,
                error = %with_sources(&error),
                retry_in_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                "the database is not reachable yet; retrying"
            );
            tokio::time::sleep(wait).await;
            delay = (delay * 2).min(RETRY_MAX);
        }
    }
}

/// `error: its source: ...`, for a log line.
fn with_sources(error: &(dyn std::error::Error + 'static)) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// A server option every pooled connection starts with.
const GENERIC_PLANS: &str = "-c plan_cache_mode=force_generic_plan";

/// `database.url`'s connection settings and the connector that secures
/// them: every connection the service opens is made with both.
pub fn target(settings: &DatabaseSettings) -> Result<(tokio_postgres::Config, PgTls), DbError> {
    Ok(tls::target(settings.url.expose_secret())?)
}

pub fn pool(settings: &DatabaseSettings) -> Result<Pool, DbError> {
    let (config, tls) = target(settings)?;
    Ok(pool_on(settings, config, tls)?)
}

/// A pool of `settings.pool_size` connections made with `config`.
fn pool_on(
    settings: &DatabaseSettings,
    mut config: tokio_postgres::Config,
    tls: PgTls,
) -> Result<Pool, deadpool_postgres::BuildError> {
    // Every statement the service prepares finds its rows by key, so a plan
    // made for the actual parameters is never better than the generic one,
    // but PostgreSQL keeps re-planning a statement whose custom plans look
    // cheaper (an array parameter's real length, a CASE on a parameter):
    // the order statement's planning cost more than its execution.
    // Citus cannot split a generic plan into its distributed steps, so
    // there it is a setting (`database.generic_plans`) that is turned off.
    if settings.generic_plans {
        let options = [config.get_options(), Some(GENERIC_PLANS)]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(" ");
        config.options(&options);
    }
    let manager = Manager::from_config(
        config,
        tls,
        ManagerConfig {
            recycling_method: RecyclingMethod::Fast,
        },
    );
    let pool = Pool::builder(manager)
        .max_size(settings.pool_size)
        .runtime(Runtime::Tokio1)
        .wait_timeout(Some(settings.pool_timeout()))
        .create_timeout(Some(settings.pool_timeout()))
        .build()?;
    Ok(pool)
}

/// Where each buyer's statements go: with `database.route_to_workers`, to
/// the worker of the buyer's shard once [`Route::refresh`] has read the
/// cluster's shards (nowhere else on one PostgreSQL), else to `home`; and
/// each statement on a seat or a hold, to the worker of its slot's shard
/// of `holds` (with `seats` and `events`, co-located).
/// A worker's pool is made like `home`'s, on the worker's address.
pub fn route(settings: &DatabaseSettings, home: Pool) -> Result<Route, DbError> {
    if !settings.route_to_workers {
        return Ok(Route::from(home).with_slots("holds"));
    }
    let (config, tls) = target(settings)?;
    let settings = settings.clone();
    let open = move |host: &str, port: u16| {
        pool_on(&settings, on_worker(&config, host, port), tls.clone())
    };
    Ok(Route::to_workers(home, Arc::new(open)).with_slots("holds"))
}

/// `config`'s connection settings on another server: the URL's user,
/// password, database, options and timeouts (tokio-postgres has no way to
/// take a host back out of a configuration, so the rest is copied).
fn on_worker(config: &tokio_postgres::Config, host: &str, port: u16) -> tokio_postgres::Config {
    let mut worker = tokio_postgres::Config::new();
    worker
        .host(host)
        .port(port)
        .ssl_mode(config.get_ssl_mode())
        .keepalives(config.get_keepalives())
        .keepalives_idle(config.get_keepalives_idle())
        .load_balance_hosts(config.get_load_balance_hosts())
        .target_session_attrs(config.get_target_session_attrs())
        .channel_binding(config.get_channel_binding());
    if let Some(user) = config.get_user() {
        worker.user(user);
    }
    if let Some(password) = config.get_password() {
        worker.password(password);
    }
    if let Some(dbname) = config.get_dbname() {
        worker.dbname(dbname);
    }
    if let Some(options) = config.get_options() {
        worker.options(options);
    }
    if let Some(name) = config.get_application_name() {
        worker.application_name(name);
    }
    if let Some(timeout) = config.get_connect_timeout() {
        worker.connect_timeout(*timeout);
    }
    if let Some(timeout) = config.get_tcp_user_timeout() {
        worker.tcp_user_timeout(*timeout);
    }
    if let Some(interval) = config.get_keepalives_interval() {
        worker.keepalives_interval(interval);
    }
    if let Some(retries) = config.get_keepalives_retries() {
        worker.keepalives_retries(retries);
    }
    worker
}

/// Opens one connection outside the pool (migrations, admin commands).
pub async fn connect(
    config: &tokio_postgres::Config,
    tls: PgTls,
) -> Result<tokio_postgres::Client, DbError> {
    let (client, connection) = config.connect(tls).await?;
    tokio::spawn(async move {
        if let Err(error) = connection.await {
            tracing::warn!(%error, "database connection closed");
        }
    });
    Ok(client)
}

/// Creates the configured database when it does not exist yet. Two instances
/// racing here are fine: the loser's "already exists" is success.
pub async fn create_if_missing(settings: &DatabaseSettings) -> Result<(), DbError> {
    let (mut maintenance, tls) = target(settings)?;
    let Some(name) = maintenance.get_dbname().map(str::to_owned) else {
        return Ok(());
    };
    maintenance.dbname("postgres");
    let client = connect(&maintenance, tls).await?;
    let exists = client
        .query_opt("SELECT 1 FROM pg_database WHERE datname = $1", &[&name])
        .await?
        .is_some();
    if exists {
        return Ok(());
    }
    let create = format!("CREATE DATABASE \"{}\"", name.replace('"', "\"\""));
    match client.batch_execute(&create).await {
        Ok(()) => {
            tracing::info!(database = %name, "created database");
            Ok(())
        }
        Err(e) if e.code() == Some(&SqlState::DUPLICATE_DATABASE) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Applies pending migrations: the service's, then the idempotency engine's
/// (which finds the key table that the service's V3 made in its shape) with
/// its functions, then the service's functions
/// (`migrations/functions/checkout.sql`), which call the engine's. An
/// advisory lock lets several instances start at once without running the
/// same migration twice or replacing one function twice at once.
pub async fn migrate(settings: &DatabaseSettings) -> Result<usize, DbError> {
    const MIGRATION_LOCK: i64 = 0x5354_4147_4544_4f4f; // "STAGEDOO"
    let (config, tls) = target(settings)?;
    let mut client = connect(&config, tls).await?;
    // The engine's migration creates its table `IF NOT EXISTS`, which the
    // service's V3 already made: PostgreSQL's NOTICE about that is expected,
    // and in the start's log it would read like a fault.
    client
        .batch_execute("SET client_min_messages = warning")
        .await?;
    client
        .execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    let applied = apply_all(&mut client).await;
    client
        .execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK])
        .await?;
    let applied = applied?;
    if applied > 0 {
        tracing::info!(applied, "applied migrations");
    }
    Ok(applied)
}

async fn apply_all(client: &mut tokio_postgres::Client) -> Result<usize, DbError> {
    const FUNCTIONS: &str = include_str!("../migrations/functions/checkout.sql");
    let service = migrations::runner()
        .run_async(client)
        .await?
        .applied_migrations()
        .len();
    let engine = idempotency::migrate(client).await?;
    // A migration of either may have dropped a function, or a type, that
    // the service's functions define or return.
    idempotency::replace_functions(client, "checkout", FUNCTIONS, service + engine > 0).await?;
    Ok(service + engine)
}
