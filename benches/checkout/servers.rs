//! The servers under load: the real `Application` (in-process, port 0),
//! the bare one-query baselines, the "mirror" that adds the key-less order
//! route to the service's own HTTP stack, and the real binary as a process
//! of its own (for its memory).

use std::net::TcpListener;
use std::path::Path;
use std::time::Duration;

use actix_web::body::MessageBody;
use actix_web::dev::{ServerHandle, ServiceFactory, ServiceRequest, ServiceResponse};
use actix_web::middleware::from_fn;
use actix_web::{web, App, HttpResponse, HttpServer};
use deadpool_postgres::Pool;
use idempotency::{Done, Engine, IdempotencyKey, Policy, Reply, RequestHash};
use secrecy::SecretString;
use serde::Deserialize;
use stagedoor_checkout::config::{LockMode, Settings};
use stagedoor_checkout::http::{self, AppState, Buyer};
use stagedoor_checkout::startup::{self, Application};
use stagedoor_checkout::{db, jobs, payrail, telemetry};
use test_support::process::{free_port, Service, ServiceProcess};

use crate::without_key;

/// What every instance of the bench starts from: config/test.toml, the
/// layer of the tests' and the chaos run's instances too (port 0, jobs out
/// of the way, no per-buyer limits, a breaker that does not open on an
/// overloaded second, the sandbox's API key).
pub fn test_layer() -> Settings {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    Settings::load_from(&dir, "test").expect("config/test.toml")
}

/// The test layer, then this database (made at start if missing) and
/// sandbox; the pool (16) and workers (one per core) are the defaults.
pub fn settings(database_url: &str, sandbox_url: &str, lock: LockMode) -> Settings {
    let mut settings = test_layer();
    settings.database.url = SecretString::from(database_url.to_owned());
    settings.database.create_if_missing = true;
    settings.payrail.base_url = sandbox_url.to_owned();
    settings.idempotency.lock = lock;
    settings
}

/// An `Application` serving in this process.
pub struct RunningApp {
    pub url: String,
    pub pool: Pool,
    handle: ServerHandle,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl RunningApp {
    pub async fn start(settings: Settings) -> Self {
        let app = Application::build(settings)
            .await
            .expect("build the application");
        let url = format!("http://127.0.0.1:{}", app.port());
        let (handle, pool) = (app.handle(), app.pool());
        let task = tokio::spawn(app.run_until_stopped());
        Self {
            url,
            pool,
            handle,
            task,
        }
    }

    /// Stops it and waits until its pool (and so every connection) is gone.
    pub async fn stop(self) {
        let Self {
            pool, handle, task, ..
        } = self;
        drop(pool);
        handle.stop(true).await;
        let _ = task.await;
    }
}

/// A server of the bench's own, stopped on `stop`.
pub struct Plain {
    pub url: String,
    handle: ServerHandle,
}

impl Plain {
    pub async fn stop(self) {
        self.handle.stop(true).await;
    }
}

/// What the bare server runs for each request.
#[derive(Clone, Copy)]
pub enum BareQuery {
    /// One prepared, indexed SELECT of the stored answer: the ceiling for a
    /// one-query request on this stack.
    Select,
    /// The replay's own statement, the claim, through an engine with no
    /// answer cache: the same lookup, but inside an `INSERT … ON CONFLICT`,
    /// so that PostgreSQL runs a data-modifying statement even when the
    /// row is there.
    Claim,
}

/// The replay that the bare server answers: whose, which key, which request.
pub struct Replayed {
    pub user_id: String,
    pub key: IdempotencyKey,
    pub hash: RequestHash,
}

/// A minimal server: actix-web with the same worker count, a deadpool built
/// by `db::pool` (same size, same recycling, same plans), one query per
/// request, the stored answer's bytes as the body. No auth, no middleware;
/// the request (a `POST`, the replay's own) is taken and not looked at.
pub fn bare(settings: &Settings, query: BareQuery, replayed: Replayed) -> Plain {
    let pool = db::pool(&settings.database).expect("pool");
    let policy = Policy {
        ttl: settings.idempotency.ttl(),
        lease: settings.idempotency.lease(),
    };
    let engine = Engine::new(pool.clone(), policy);
    let state = web::Data::new((pool, query, replayed, engine));
    serve(settings, move || {
        App::new()
            .app_data(state.clone())
            .route("/bare", web::post().to(bare_answer))
    })
}

/// Serves `app` on a port of 127.0.0.1 with the service's worker count,
/// signals left to the bench, in-flight requests given 1 s at the stop.
fn serve<F, T, B>(settings: &Settings, app: F) -> Plain
where
    F: Fn() -> App<T> + Send + Clone + 'static,
    T: ServiceFactory<
            ServiceRequest,
            Config = (),
            Response = ServiceResponse<B>,
            Error = actix_web::Error,
            InitError = (),
        > + 'static,
    B: MessageBody + 'static,
{
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let mut server = HttpServer::new(app).disable_signals().shutdown_timeout(1);
    if settings.server.workers > 0 {
        server = server.workers(settings.server.workers);
    }
    let server = server.listen(listener).expect("listen").run();
    let handle = server.handle();
    tokio::spawn(server);
    Plain { url, handle }
}

async fn bare_answer(state: web::Data<(Pool, BareQuery, Replayed, Engine)>) -> HttpResponse {
    let (pool, query, replayed, engine) = state.get_ref();
    let (user_id, key) = (replayed.user_id.as_str(), &replayed.key);
    let body = match query {
        BareQuery::Select => {
            let Ok(client) = pool.get().await else {
                return HttpResponse::ServiceUnavailable().finish();
            };
            let statement = client
                .prepare_cached(
                    "SELECT response_status, response_body FROM idempotency_keys
                     WHERE user_id = $1 AND key = $2",
                )
                .await;
            match statement {
                Ok(statement) => client
                    .query_opt(&statement, &[&user_id, &key.as_str()])
                    .await
                    .ok()
                    .flatten()
                    .map(|row| row.get::<_, Vec<u8>>(1)),
                Err(_) => None,
            }
        }
        BareQuery::Claim => {
            // An answered key: the work never runs.
            let never = |_| async { Err::<Done, ()>(()) };
            let ran = engine
                .run(user_id, key, &replayed.hash, None, Duration::ZERO, never)
                .await;
            match ran.map(|ran| ran.reply) {
                Ok(Reply::Replay(response)) => Some(response.body),
                _ => None,
            }
        }
    };
    match body {
        Some(body) => HttpResponse::Ok()
            .content_type("application/json")
            .body(body),
        None => HttpResponse::InternalServerError().finish(),
    }
}

/// The service's HTTP stack as `Application::build` assembles it (the same
/// middleware, state, routes and worker count; no jobs, no embedded
/// sandbox), plus `POST /bench/orders-without-key`, which runs the order
/// flow with the key statements left out (`without_key.rs`). Both the
/// keyed `POST /orders` and the key-less route are measured on it, so that
/// the comparison differs in the key and nothing else.
pub async fn mirror(settings: &Settings) -> Plain {
    let pool = db::pool(&settings.database).expect("pool");
    let route = db::route(&settings.database, pool).expect("the buyers' route");
    jobs::shards::refresh_logged(&route).await;
    let state = web::Data::new(
        startup::state(settings, route, &settings.payrail.base_url)
            .await
            .expect("the service's state"),
    );
    let payrail = web::Data::new(
        payrail::Client::new(&settings.payrail, &settings.payrail.base_url)
            .expect("payrail client"),
    );
    let cors_origins = settings.http.cors_origins.clone();
    let key_life = settings.idempotency.ttl();
    serve(settings, move || {
        App::new()
            .wrap(http::cors::cors(&cors_origins))
            .wrap(http::bare_refusals_as_problems())
            .wrap(from_fn(telemetry::log_request))
            .app_data(state.clone())
            .app_data(payrail.clone())
            .route(
                "/bench/orders-without-key",
                web::post().to(order_without_key),
            )
            .configure(http::routes(key_life, true))
            .default_service(web::to(http::not_found))
    })
}

#[derive(Deserialize)]
struct OrderBody {
    hold_ids: Vec<i64>,
    payment_method: String,
}

async fn order_without_key(
    state: web::Data<AppState>,
    payrail: web::Data<payrail::Client>,
    buyer: Buyer,
    body: web::Bytes,
) -> HttpResponse {
    let Ok(OrderBody {
        hold_ids,
        payment_method,
    }) = serde_json::from_slice(&body)
    else {
        return HttpResponse::BadRequest().finish();
    };
    let placed = without_key::place(
        &state.pool,
        &payrail,
        buyer.0.as_str(),
        hold_ids,
        &payment_method,
    )
    .await;
    match placed {
        Ok(answer) => {
            // The holds went into the order (or came back with a decline):
            // the seat maps of every instance learn it, as after a keyed
            // click, because telling them is not the key's cost.
            state.seat_maps.changed(&state.pool, &buyer.0).await;
            idempotency::actix::response_of(&answer, false)
        }
        Err(error) => HttpResponse::ServiceUnavailable().body(error),
    }
}

/// `stagedoor-checkout serve` as a process of its own, killed on drop: the
/// test layer, this database (made already) and sandbox.
pub async fn service_process(database_url: &str, sandbox_url: &str) -> ServiceProcess {
    let port = free_port();
    let config = format!("{}/config", env!("CARGO_MANIFEST_DIR"));
    Service::new(
        env!("CARGO_BIN_EXE_stagedoor-checkout"),
        format!("http://127.0.0.1:{port}"),
    )
    .arg("serve")
    .env("STAGEDOOR_ENV", "test")
    .env("STAGEDOOR_CONFIG_DIR", config)
    .env("DATABASE_URL", database_url)
    .env("STAGEDOOR__SERVER__PORT", port.to_string())
    .env("STAGEDOOR__PAYRAIL__BASE_URL", sandbox_url)
    .env("RUST_LOG", "warn")
    .spawn_or_panic(Duration::from_secs(20))
    .await
}

/// A field of /proc/<pid>/status of the process, in MiB (VmHWM, VmRSS).
pub fn status_mib(process: &ServiceProcess, field: &str) -> Option<f64> {
    let pid = process.pid()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib / 1024.0)
}
