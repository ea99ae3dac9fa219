//! `spawn_app()`: a real instance on port 0, in a database of its own, with a
//! real Payrail sandbox on its own port. One helper per endpoint.

use std::net::TcpListener;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use payrail_sandbox::{Sandbox, Webhook};
use reqwest::{RequestBuilder, Response};
use secrecy::{ExposeSecret, SecretString};
use serde_json::{json, Value};
use stagedoor_checkout::auth::{BuyerId, Tokens};
use stagedoor_checkout::checkout::seats;
use stagedoor_checkout::config::{LockMode, Settings};
use stagedoor_checkout::startup::Application;
use test_support::process::{free_port, Service, ServiceProcess};
use test_support::sandbox;
use uuid::Uuid;

pub use test_support::db::TestDatabase;
pub use test_support::Seen;

/// What every test instance starts from: config/test.toml, the layer the
/// chaos run and the bench start theirs from too.
pub fn test_layer() -> Settings {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    Settings::load_from(&dir, "test").expect("config/test.toml")
}

/// What Payrail signs its events with in tests (the test layer's
/// `payrail.webhook_secret`).
pub fn webhook_secret() -> String {
    test_layer()
        .payrail
        .webhook_secret
        .expose_secret()
        .to_owned()
}
/// What the order events are signed with in tests (`outcomes.webhook_secret`).
pub const OUTCOMES_SECRET: &str = "stagedoor_events_test_0123456789abcdef";

/// The service's own pool (`db::pool`), one connection, to `url`, with
/// generic plans as the profile needs them (off on Citus).
pub fn pool(url: &str) -> deadpool_postgres::Pool {
    pool_with(url, !test_support::citus::enabled())
}

/// [`pool`] with `database.generic_plans` as given.
pub fn pool_with(url: &str, generic_plans: bool) -> deadpool_postgres::Pool {
    stagedoor_checkout::db::pool(&stagedoor_checkout::config::DatabaseSettings {
        url: SecretString::from(url.to_owned()),
        pool_size: 1,
        create_if_missing: false,
        pool_timeout_ms: 5_000,
        connect_timeout_secs: 0,
        generic_plans,
        route_to_workers: true,
    })
    .expect("a pool")
}

pub struct TestApp {
    pub address: String,
    pub port: u16,
    /// `/metrics`' own listener, when `server.metrics_addr` is set.
    pub metrics_port: Option<u16>,
    pub db: Arc<TestDatabase>,
    pub sandbox: Arc<Sandbox>,
    pub settings: Settings,
    pub http: reqwest::Client,
    tokens: Tokens,
    handle: actix_web::dev::ServerHandle,
    /// The instance's run, jobs included, until it has stopped.
    running: Mutex<Option<tokio::task::JoinHandle<std::io::Result<()>>>>,
}

/// Settings for tests: the test layer, this test's database and sandbox, a
/// small pool and two workers, a short Payrail timeout.
pub fn test_settings(db: &TestDatabase, sandbox: &Sandbox) -> Settings {
    let mut settings = test_layer();
    settings.database.url = SecretString::from(db.url.clone());
    settings.database.pool_size = 8;
    settings.server.workers = 2;
    settings.payrail.base_url = sandbox.base_url();
    settings.payrail.timeout_ms = 1_000;
    // Citus cannot plan its distributed steps from a generic plan.
    settings.database.generic_plans = !test_support::citus::enabled();
    // The idempotency suites run in both lock modes (table, Redis gate).
    if std::env::var("STAGEDOOR_TEST_LOCK").as_deref() == Ok("redis") {
        settings.idempotency.lock = LockMode::Redis;
    }
    settings
}

pub async fn spawn_app() -> TestApp {
    spawn_app_with(|_| {}).await
}

pub async fn spawn_app_with(configure: impl FnOnce(&mut Settings)) -> TestApp {
    spawn(configure, false).await
}

/// As [`spawn_app_with`], with the sandbox sending its signed events to
/// the app (on a port picked before either starts).
pub async fn spawn_app_with_events(configure: impl FnOnce(&mut Settings)) -> TestApp {
    spawn(configure, true).await
}

async fn spawn(configure: impl FnOnce(&mut Settings), events: bool) -> TestApp {
    let db = TestDatabase::create_laid_out().await;
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind sandbox");
    let port = free_port();
    let payrail = test_layer().payrail;
    let webhook = events.then(|| Webhook {
        url: format!("http://127.0.0.1:{port}/payrail/events"),
        secret: payrail.webhook_secret.expose_secret().to_owned(),
    });
    let api_key = payrail.api_key.expose_secret().to_owned();
    let sandbox = Arc::new(Sandbox::start_with(listener, api_key, webhook).expect("sandbox"));
    let mut settings = test_settings(&db, &sandbox);
    if events {
        settings.server.port = port;
    }
    configure(&mut settings);
    if test_support::citus::enabled() {
        // The copy's tables are migrated and distributed; a migration the
        // cluster's template lacks would make a table left undistributed.
        let applied = stagedoor_checkout::db::migrate(&settings.database)
            .await
            .expect("migrations");
        assert_eq!(
            applied,
            0,
            "{} predates {applied} migration(s): start the cluster again (scripts/citus.sh)",
            test_support::citus::LAID_OUT
        );
    }
    TestApp::start(db, sandbox, settings).await
}

impl TestApp {
    pub async fn start(db: Arc<TestDatabase>, sandbox: Arc<Sandbox>, settings: Settings) -> Self {
        let app = Application::build(settings.clone())
            .await
            .expect("build the application");
        let port = app.port();
        let metrics_port = app.metrics_port();
        let handle = app.handle();
        let running = tokio::spawn(app.run_until_stopped());
        let tokens = Tokens::new(&settings.auth.jwt_secret).expect("tokens");
        Self {
            address: format!("http://127.0.0.1:{port}"),
            port,
            metrics_port,
            db,
            sandbox,
            settings,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(30))
                .build()
                .expect("client"),
            tokens,
            handle,
            running: Mutex::new(Some(running)),
        }
    }

    /// Stops this in-process instance, its jobs with it: for a test that
    /// reads the counts of its process instances alone (this one's
    /// recorder is every in-process instance's).
    pub async fn stop(&self) {
        self.handle.stop(false).await;
        let running = self
            .running
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(running) = running {
            let _ = running.await;
        }
    }

    /// A second instance on the same database and sandbox.
    pub async fn another_instance(&self) -> TestApp {
        Self::start(self.db.clone(), self.sandbox.clone(), self.settings.clone()).await
    }

    pub fn token(&self, buyer: &str) -> String {
        self.tokens
            .sign(
                &BuyerId::parse(buyer).expect("buyer id"),
                Duration::from_secs(600),
            )
            .expect("sign")
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.address)
    }

    pub fn as_buyer(&self, builder: RequestBuilder, buyer: &str) -> RequestBuilder {
        builder.bearer_auth(self.token(buyer))
    }

    /// Seeds an event and returns its seat ids.
    pub async fn seed(&self, event: &str, seats: u32, price_cents: i64) -> Vec<i64> {
        let pool = stagedoor_checkout::db::pool(&self.settings.database).expect("pool");
        let client = pool.get().await.expect("connection");
        seats::seed(&client, event, seats, price_cents)
            .await
            .expect("seed");
        client
            .query(
                "SELECT seat_id FROM seats WHERE event_id = $1 ORDER BY seat_id",
                &[&event],
            )
            .await
            .expect("seat ids")
            .iter()
            .map(|row| row.get(0))
            .collect()
    }

    pub async fn get_seats(&self, buyer: &str, event: &str) -> Response {
        self.as_buyer(
            self.http.get(self.url(&format!("/events/{event}/seats"))),
            buyer,
        )
        .send()
        .await
        .expect("GET seats")
    }

    pub async fn post_hold(&self, buyer: &str, seat_id: i64, key: Option<&str>) -> Response {
        let mut request = self
            .as_buyer(self.http.post(self.url("/holds")), buyer)
            .json(&json!({ "seat_id": seat_id }));
        if let Some(key) = key {
            request = request.header("Idempotency-Key", key);
        }
        request.send().await.expect("POST /holds")
    }

    /// Holds a seat and returns the hold id (the hold must succeed).
    pub async fn hold(&self, buyer: &str, seat_id: i64) -> i64 {
        let response = self.post_hold(buyer, seat_id, None).await;
        assert_eq!(response.status(), 201, "hold of seat {seat_id}");
        let body: Value = response.json().await.expect("hold body");
        body["hold_id"].as_i64().expect("hold_id")
    }

    pub async fn delete_hold(&self, buyer: &str, hold_id: i64) -> Response {
        self.as_buyer(
            self.http.delete(self.url(&format!("/holds/{hold_id}"))),
            buyer,
        )
        .send()
        .await
        .expect("DELETE hold")
    }

    /// `POST /orders` with exactly these body bytes.
    pub async fn post_order_raw(&self, buyer: &str, key: &str, body: &str) -> Response {
        self.as_buyer(self.http.post(self.url("/orders")), buyer)
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/json")
            .body(body.to_owned())
            .send()
            .await
            .expect("POST /orders")
    }

    pub async fn post_order(
        &self,
        buyer: &str,
        key: &str,
        hold_ids: &[i64],
        method: &str,
    ) -> Response {
        self.post_order_raw(buyer, key, &order_body(hold_ids, method))
            .await
    }

    pub async fn get_order(&self, buyer: &str, order_id: &str) -> Response {
        self.as_buyer(
            self.http.get(self.url(&format!("/orders/{order_id}"))),
            buyer,
        )
        .send()
        .await
        .expect("GET order")
    }

    pub async fn charges(&self) -> Vec<Value> {
        sandbox::ledger(&self.http, &self.sandbox.base_url()).await
    }

    /// The order of the sandbox's last charge (its `reference`).
    pub async fn last_charged_order(&self) -> String {
        let charge = self.charges().await.pop().expect("charged");
        charge["reference"]
            .as_str()
            .expect("a reference")
            .to_owned()
    }

    /// The id of the database's one order.
    pub async fn only_order_id(&self) -> String {
        let client = self.db.client().await;
        let row = client
            .query_one("SELECT order_id::text FROM orders", &[])
            .await;
        row.expect("one order").get(0)
    }

    /// The instance's `/metrics` page, as text.
    pub async fn metrics(&self) -> String {
        let url = self.metrics_port.map_or_else(
            || self.url("/metrics"),
            |port| format!("http://127.0.0.1:{port}/metrics"),
        );
        let response = self.http.get(url).send().await;
        response
            .expect("GET /metrics")
            .text()
            .await
            .expect("the metrics")
    }

    /// Waits (up to 2 s) until Payrail has made a charge, which it then
    /// sits on for as long as its latency says: the moment to kill its caller.
    pub async fn until_charged(&self) {
        for _ in 0..100 {
            if !self.charges().await.is_empty() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// A click of alice's paying for `hold`, sent to a process of its own
    /// while Payrail answers after 3 s: returned once Payrail has charged and
    /// sits on its answer, the moment a crash of that process loses it. The
    /// process, the click's key and the request in flight.
    pub async fn order_charged_on_a_process(
        &self,
        hold: i64,
    ) -> (
        ServiceProcess,
        String,
        tokio::task::JoinHandle<reqwest::Result<Response>>,
    ) {
        let process = self.spawn_process().await;
        self.set_faults(json!({"latency_ms": 3_000})).await;
        let key = new_key();
        let in_flight = self.in_flight(
            &process,
            "/orders",
            &key,
            order_body(&[hold], "pm_card_visa"),
        );
        self.until_charged().await;
        (process, key, in_flight)
    }

    /// Sends `alice`'s keyed `POST path` with `body` to `instance` (another
    /// process) in the background; its answer, if one ever comes.
    pub fn in_flight(
        &self,
        instance: &ServiceProcess,
        path: &str,
        key: &str,
        body: String,
    ) -> tokio::task::JoinHandle<reqwest::Result<Response>> {
        let request = self
            .as_buyer(self.http.post(format!("{}{path}", instance.url())), "alice")
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/json")
            .body(body);
        tokio::spawn(async move { request.send().await })
    }

    /// `POST /payrail/events` with these bytes and this `Payrail-Signature`
    /// (none when `None`), to `base` (this app or another instance).
    pub async fn post_event_to(
        &self,
        base: &str,
        body: &[u8],
        signature: Option<&str>,
    ) -> Response {
        let mut request = self
            .http
            .post(format!("{base}/payrail/events"))
            .header("Content-Type", "application/json")
            .body(body.to_vec());
        if let Some(signature) = signature {
            request = request.header("Payrail-Signature", signature);
        }
        request.send().await.expect("POST /payrail/events")
    }

    /// An event signed now with the test secret, posted to this app.
    pub async fn post_signed_event(&self, body: &[u8]) -> Response {
        let signature = sign_now(body);
        self.post_event_to(&self.address, body, Some(&signature))
            .await
    }

    /// `GET /v1/sandbox/events`: what Payrail sent, and how often.
    pub async fn sent_events(&self) -> Vec<Value> {
        self.http
            .get(format!("{}/v1/sandbox/events", self.sandbox.base_url()))
            .send()
            .await
            .expect("GET /v1/sandbox/events")
            .json()
            .await
            .expect("the events' JSON")
    }

    pub async fn set_faults(&self, faults: Value) {
        sandbox::set_faults(&self.http, &self.sandbox.base_url(), &faults).await;
    }

    /// How many keys buyers' requests stored. The sale job claims a key of
    /// its own scope for each window of expired holds, from its first tick
    /// 5 s after the start: a test that runs longer sees those too.
    pub async fn buyer_keys(&self) -> i64 {
        self.count("SELECT count(*) FROM idempotency_keys WHERE left(user_id, 1) <> chr(1)")
            .await
    }

    /// How many rows a query counts.
    pub async fn count(&self, sql: &str) -> i64 {
        self.db
            .client()
            .await
            .query_one(sql, &[])
            .await
            .expect(sql)
            .get(0)
    }
}

/// Sends raw bytes over a new connection and returns the raw answer (for
/// what an HTTP client library will not send: chunked bodies, odd headers).
pub async fn raw_http(port: u16, request: &[u8]) -> String {
    raw_http_within(port, request, Duration::from_secs(5)).await
}

/// [`raw_http`], giving up on a silent server after `patience` (for the
/// answers that come only after a server-side timeout).
pub async fn raw_http_within(port: u16, request: &[u8], patience: Duration) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    stream.write_all(request).await.expect("write");
    let mut answer = Vec::new();
    let mut buf = [0u8; 8192];
    // Read until the server closes or the answer's body is complete.
    loop {
        match tokio::time::timeout(patience, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Err(_) | Ok(Err(_)) => break,
            Ok(Ok(n)) => answer.extend_from_slice(&buf[..n]),
        }
        let text = String::from_utf8_lossy(&answer);
        if let Some((head, body)) = text.split_once("\r\n\r\n") {
            let length = head
                .lines()
                .find_map(|l| {
                    l.to_ascii_lowercase()
                        .strip_prefix("content-length: ")
                        .map(str::to_owned)
                })
                .and_then(|v| v.trim().parse::<usize>().ok());
            if length.is_some_and(|n| body.len() >= n) {
                break;
            }
        }
    }
    String::from_utf8_lossy(&answer).into_owned()
}

pub fn order_body(hold_ids: &[i64], method: &str) -> String {
    json!({ "hold_ids": hold_ids, "payment_method": method }).to_string()
}

/// The unix time now, in seconds.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_secs()
}

/// `Payrail-Signature` for `body`, signed now under the test secret.
pub fn sign_now(body: &[u8]) -> String {
    payrail_sandbox::sign(webhook_secret().as_bytes(), unix_now(), body)
}

/// An event as Payrail words it, about the ledger's `charge`: `type` is
/// `charge.succeeded` or `charge.declined` (whatever the charge says).
pub fn event_body(event_id: &str, kind: &str, charge: &Value) -> Vec<u8> {
    json!({
        "id": event_id,
        "type": kind,
        "created": unix_now(),
        "data": {"charge": {
            "id": charge["id"],
            "status": kind.trim_start_matches("charge."),
            "amount_cents": charge["amount_cents"],
            "currency": "USD",
            "reference": charge["reference"],
            "idempotency_key": charge["idempotency_key"],
        }},
    })
    .to_string()
    .into_bytes()
}

pub fn new_key() -> String {
    Uuid::new_v4().to_string()
}

impl Drop for TestApp {
    fn drop(&mut self) {
        let handle = self.handle.clone();
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move { handle.stop(false).await });
        }
    }
}

impl TestApp {
    /// The real `stagedoor-checkout` binary, serving on this app's database
    /// and sandbox from the same test layer, with what a test may have
    /// changed of this app's settings: for tests that kill or signal it. Its
    /// log is shown if it does not come up.
    pub async fn spawn_process(&self) -> ServiceProcess {
        self.spawn_process_with(&self.settings).await
    }

    /// [`spawn_process`](Self::spawn_process) with settings of its own
    /// (on this app's database and sandbox).
    pub async fn spawn_process_with(&self, s: &Settings) -> ServiceProcess {
        self.spawn_process_logging(s, "warn").await
    }

    /// [`spawn_process_with`](Self::spawn_process_with), logging at `level`
    /// (`RUST_LOG`): `info` for a test that reads each request's line.
    pub async fn spawn_process_logging(&self, s: &Settings, level: &str) -> ServiceProcess {
        let port = free_port();
        let mut env = self.process_env(s, port);
        env.retain(|(name, _)| *name != "RUST_LOG");
        env.push(("RUST_LOG", level.into()));
        Service::new(
            env!("CARGO_BIN_EXE_stagedoor-checkout"),
            format!("http://127.0.0.1:{port}"),
        )
        .arg("serve")
        .envs(env)
        .spawn_or_panic(Duration::from_secs(10))
        .await
    }

    /// The environment of [`spawn_process_with`](Self::spawn_process_with)'s
    /// process, serving on `port`.
    pub fn process_env(&self, s: &Settings, port: u16) -> Vec<(&'static str, String)> {
        vec![
            ("STAGEDOOR_ENV", "test".into()),
            (
                "STAGEDOOR_CONFIG_DIR",
                format!("{}/config", env!("CARGO_MANIFEST_DIR")),
            ),
            ("DATABASE_URL", self.db.url.clone()),
            ("STAGEDOOR__SERVER__PORT", port.to_string()),
            ("STAGEDOOR__SERVER__WORKERS", "1".into()),
            (
                "STAGEDOOR__SERVER__SHUTDOWN_TIMEOUT_SECS",
                s.server.shutdown_timeout_secs.to_string(),
            ),
            ("STAGEDOOR__DATABASE__POOL_SIZE", "4".into()),
            (
                "STAGEDOOR__DATABASE__GENERIC_PLANS",
                s.database.generic_plans.to_string(),
            ),
            (
                "STAGEDOOR__LIMITS__NEW_KEYS_PER_SEC",
                s.limits.new_keys_per_sec.to_string(),
            ),
            ("STAGEDOOR__LIMITS__BURST", s.limits.burst.to_string()),
            (
                "STAGEDOOR__HOLDS__MAX_PER_BUYER",
                s.holds.max_per_buyer.to_string(),
            ),
            ("STAGEDOOR__HOLDS__TTL_SECS", s.holds.ttl_secs.to_string()),
            ("STAGEDOOR__PAYRAIL__BASE_URL", self.sandbox.base_url()),
            (
                "STAGEDOOR__PAYRAIL__TIMEOUT_MS",
                s.payrail.timeout_ms.to_string(),
            ),
            (
                "STAGEDOOR__PAYRAIL__MAX_ATTEMPTS",
                s.payrail.max_attempts.to_string(),
            ),
            (
                "STAGEDOOR__IDEMPOTENCY__LEASE_SECS",
                s.idempotency.lease_secs.to_string(),
            ),
            (
                "STAGEDOOR__IDEMPOTENCY__TTL_SECS",
                s.idempotency.ttl_secs.to_string(),
            ),
            (
                "STAGEDOOR__RECONCILE__INTERVAL_SECS",
                s.reconcile.interval_secs.to_string(),
            ),
            (
                "STAGEDOOR__RECONCILE__GRACE_SECS",
                s.reconcile.grace_secs.to_string(),
            ),
            (
                "STAGEDOOR__RECONCILE__GIVE_UP_SECS",
                s.reconcile.give_up_secs.to_string(),
            ),
            (
                "STAGEDOOR__OUTCOMES__WEBHOOK_URL",
                s.outcomes.webhook_url.clone(),
            ),
            (
                "STAGEDOOR__OUTCOMES__WEBHOOK_SECRET",
                s.outcomes.webhook_secret.expose_secret().to_owned(),
            ),
            (
                "STAGEDOOR__OUTCOMES__TIMEOUT_MS",
                s.outcomes.timeout_ms.to_string(),
            ),
            (
                "STAGEDOOR__OUTCOMES__POLL_MS",
                s.outcomes.poll_ms.to_string(),
            ),
            (
                "STAGEDOOR__OUTCOMES__MAX_BACKOFF_SECS",
                s.outcomes.max_backoff_secs.to_string(),
            ),
            (
                "STAGEDOOR__OUTCOMES__RETRY_FOR_SECS",
                s.outcomes.retry_for_secs.to_string(),
            ),
            ("RUST_LOG", "warn".into()),
        ]
    }
}
