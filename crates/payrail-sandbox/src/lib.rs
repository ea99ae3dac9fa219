//! The Payrail sandbox: a small, real HTTP server that behaves like the Payrail
//! payment provider, for local runs, compose, tests and benchmarks.
//!
//! It keeps the one promise the checkout builds on: a repeated
//! `Idempotency-Key` with the same body gets the first answer again, byte for
//! byte, and concurrent repeats charge once. Test cards (`pm_card_declined`,
//! `pm_card_slow`, `pm_card_error`) and global faults (latency, errors,
//! answers lost after the charge) let tests provoke the failures a real
//! provider shows, and the ledger (`GET /v1/sandbox/charges`) records every
//! charge decided, as the truth the service is checked against.
//!
//! It never moves money, never calls anything else and never persists: all
//! state is in memory and dies with the process. The `/v1/sandbox/*` control
//! endpoints need no API key (it is a test double), so it must never be
//! reachable from outside a test or development network.

use std::collections::HashMap;
use std::net::TcpListener;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use actix_web::dev::ServerHandle;
use actix_web::http::{header, StatusCode};
use actix_web::web::{self, Bytes};
use actix_web::{App, HttpRequest, HttpResponse, HttpServer};
use serde::{Deserialize, Serialize};
use serde_json::json;
use uuid::Uuid;

/// Header that marks an answer as a replay of the first one.
const REPLAY_HEADER: &str = "Idempotent-Replayed";
/// Longest idempotency key accepted, as a real provider would bound it.
const MAX_KEY_LEN: usize = 255;
/// Upper bound for `latency_ms` and `slow_ms`, to catch typos (10 minutes).
const MAX_DELAY_MS: u64 = 600_000;
/// A graceful stop waits this long for in-flight answers (a `pm_card_slow`
/// answer may be sleeping) before closing them.
const SHUTDOWN_TIMEOUT_SECS: u64 = 5;

/// A running sandbox server; stop it with [`Sandbox::stop`].
pub struct Sandbox {
    port: u16,
    handle: ServerHandle,
    server: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Sandbox {
    /// Serves the sandbox on an already bound listener (port 0 allowed), in the
    /// current tokio runtime. Signals are left to the caller: the binary stops
    /// it on SIGTERM/SIGINT, the service stops it with its own shutdown.
    pub fn start(listener: TcpListener, api_key: String) -> std::io::Result<Sandbox> {
        let port = listener.local_addr()?.port();
        // One Arc for all workers, so they share one idempotency table.
        let state = web::Data::new(State::new(api_key));
        let server = HttpServer::new(move || App::new().app_data(state.clone()).configure(routes))
            .workers(1) // every wait is async; one worker serves thousands of requests
            .disable_signals()
            .shutdown_timeout(SHUTDOWN_TIMEOUT_SECS)
            .listen(listener)?
            .run();
        let handle = server.handle();
        let server = tokio::spawn(server);
        Ok(Sandbox {
            port,
            handle,
            server,
        })
    }

    /// The port actually bound (useful after binding port 0).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Where a client on this machine reaches the sandbox.
    pub fn base_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Stops accepting, lets in-flight answers finish (bounded), then returns.
    pub async fn stop(self) {
        self.handle.stop(true).await;
        match self.server.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "payrail sandbox stopped with an error"),
            Err(error) => tracing::warn!(%error, "payrail sandbox task failed"),
        }
    }
}

fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(
        web::resource("/v1/charges")
            .route(web::post().to(create_charge))
            .default_service(web::to(method_not_allowed)),
    )
    .service(
        web::resource("/v1/sandbox/faults")
            .route(web::get().to(get_faults))
            .route(web::post().to(set_faults))
            .default_service(web::to(method_not_allowed)),
    )
    .service(
        web::resource("/v1/sandbox/charges")
            .route(web::get().to(list_charges))
            .route(web::delete().to(clear_charges))
            .default_service(web::to(method_not_allowed)),
    )
    .service(
        web::resource("/healthz")
            .route(web::get().to(healthz))
            .default_service(web::to(method_not_allowed)),
    )
    .default_service(web::to(not_found));
}

/// Everything the workers share: the API key and the book behind one mutex.
struct State {
    api_key: String,
    book: Mutex<Book>,
}

impl State {
    fn new(api_key: String) -> Self {
        State {
            api_key,
            book: Mutex::new(Book::new()),
        }
    }

    /// The book is only ever touched synchronously (never across an await), so
    /// a panic cannot leave it half-written; a poisoned lock is still usable.
    fn book(&self) -> MutexGuard<'_, Book> {
        self.book.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn authorized(&self, req: &HttpRequest) -> bool {
        req.headers()
            .get(header::AUTHORIZATION)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.strip_prefix("Bearer "))
            .is_some_and(|token| token == self.api_key)
    }
}

/// The sandbox's memory: faults, idempotency table, request counts, ledger.
struct Book {
    faults: Faults,
    answers: HashMap<String, Stored>,
    requests: HashMap<String, u64>,
    ledger: Vec<Charge>,
    rng: Rng,
}

/// A key's first request and the answer it got, replayed for every repeat.
struct Stored {
    request: ChargeRequest,
    answer: Answer,
}

/// A serialized answer, kept as bytes so that replays are byte-identical.
#[derive(Clone)]
struct Answer {
    status: StatusCode,
    body: Bytes,
}

/// One charge decided, succeeded or declined, as listed in the ledger.
#[derive(Clone, Serialize)]
struct Charge {
    id: String,
    idempotency_key: String,
    reference: String,
    amount_cents: i64,
    status: &'static str,
}

/// What the book decided for one charge request.
enum Decision {
    Replay(Answer),
    Mismatch,
    /// 500 and nothing recorded: `pm_card_error` or an `error_rate` hit.
    Refuse,
    Charged {
        answer: Answer,
        delay: Duration,
        drop: bool,
    },
}

impl Book {
    fn new() -> Self {
        Book {
            faults: Faults::default(),
            answers: HashMap::new(),
            requests: HashMap::new(),
            ledger: Vec::new(),
            rng: Rng::seeded(),
        }
    }

    fn count_request(&mut self, key: &str) {
        *self.requests.entry(key.to_owned()).or_default() += 1;
    }

    /// Decides a charge request completely while the lock is held, so
    /// concurrent repeats see either nothing or the finished answer: no
    /// in-flight state is needed. Faults only hit requests that would charge.
    fn decide(&mut self, key: &str, request: &ChargeRequest) -> Decision {
        self.count_request(key);
        if let Some(stored) = self.answers.get(key) {
            return if stored.request == *request {
                Decision::Replay(stored.answer.clone())
            } else {
                Decision::Mismatch
            };
        }
        let card = Card::of(&request.payment_method);
        if card == Card::Errors || self.rng.chance(self.faults.error_rate) {
            return Decision::Refuse;
        }
        let drop = self.rng.chance(self.faults.drop_after_charge_rate);
        let delay = match card {
            Card::Slow => Duration::from_millis(self.faults.slow_ms),
            _ => Duration::ZERO,
        };
        let answer = self.charge(key, request, card);
        Decision::Charged {
            answer,
            delay,
            drop,
        }
    }

    /// Makes the charge: records it in the ledger and its answer under the key.
    fn charge(&mut self, key: &str, request: &ChargeRequest, card: Card) -> Answer {
        let id = format!("ch_{}", Uuid::new_v4().simple());
        let (status, outcome, body) = if card == Card::Declines {
            let body = json!({"id": id, "status": "declined", "decline_code": "card_declined"});
            (StatusCode::PAYMENT_REQUIRED, "declined", body)
        } else {
            let body = json!({
                "id": id,
                "status": "succeeded",
                "amount_cents": request.amount_cents,
                "currency": request.currency,
                "reference": request.reference,
            });
            (StatusCode::CREATED, "succeeded", body)
        };
        tracing::info!(
            charge_id = %id,
            idempotency_key = key,
            outcome,
            "payrail sandbox charge decided"
        );
        let answer = Answer {
            status,
            body: Bytes::from(body.to_string()),
        };
        self.ledger.push(Charge {
            id,
            idempotency_key: key.to_owned(),
            reference: request.reference.clone(),
            amount_cents: request.amount_cents,
            status: outcome,
        });
        self.answers.insert(
            key.to_owned(),
            Stored {
                request: request.clone(),
                answer: answer.clone(),
            },
        );
        answer
    }

    fn ledger_rows(&self) -> Vec<serde_json::Value> {
        self.ledger
            .iter()
            .map(|charge| {
                let requests = self.requests.get(&charge.idempotency_key).copied();
                let mut row = json!(charge);
                row["requests"] = json!(requests.unwrap_or(0));
                row
            })
            .collect()
    }

    fn clear(&mut self) {
        self.answers.clear();
        self.requests.clear();
        self.ledger.clear();
    }
}

/// The body of `POST /v1/charges`. Requests with one key are compared by
/// these parsed fields, so whitespace or field order never cause a 422.
#[derive(Clone, PartialEq, Deserialize)]
struct ChargeRequest {
    amount_cents: i64,
    currency: String,
    payment_method: String,
    reference: String,
}

impl ChargeRequest {
    fn parse(body: &[u8]) -> Result<Self, String> {
        let request: ChargeRequest =
            serde_json::from_slice(body).map_err(|e| format!("invalid charge body: {e}"))?;
        if request.amount_cents <= 0 {
            return Err("amount_cents must be a positive integer".into());
        }
        if request.currency.trim().is_empty() || request.reference.trim().is_empty() {
            return Err("currency and reference must not be empty".into());
        }
        if !request.payment_method.starts_with("pm_") {
            return Err("payment_method must start with \"pm_\"".into());
        }
        Ok(request)
    }
}

/// Test cards, named by payment method like a real provider's.
#[derive(Clone, Copy, PartialEq)]
enum Card {
    Succeeds,
    Declines,
    Slow,
    Errors,
}

impl Card {
    fn of(payment_method: &str) -> Card {
        match payment_method {
            "pm_card_declined" => Card::Declines,
            "pm_card_slow" => Card::Slow,
            "pm_card_error" => Card::Errors,
            _ => Card::Succeeds,
        }
    }
}

/// Global faults; a field missing from `POST /v1/sandbox/faults` is reset.
#[derive(Clone, Copy, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
struct Faults {
    latency_ms: u64,
    error_rate: f64,
    drop_after_charge_rate: f64,
    slow_ms: u64,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            latency_ms: 0,
            error_rate: 0.0,
            drop_after_charge_rate: 0.0,
            slow_ms: 10_000,
        }
    }
}

impl Faults {
    /// An empty body resets every fault.
    fn parse(body: &[u8]) -> Result<Self, String> {
        if body.iter().all(u8::is_ascii_whitespace) {
            return Ok(Faults::default());
        }
        let faults: Faults =
            serde_json::from_slice(body).map_err(|e| format!("invalid faults body: {e}"))?;
        let is_rate = |rate: f64| (0.0..=1.0).contains(&rate);
        if !is_rate(faults.error_rate) || !is_rate(faults.drop_after_charge_rate) {
            return Err("error_rate and drop_after_charge_rate must be between 0 and 1".into());
        }
        if faults.latency_ms > MAX_DELAY_MS || faults.slow_ms > MAX_DELAY_MS {
            return Err(format!(
                "latency_ms and slow_ms must be at most {MAX_DELAY_MS}"
            ));
        }
        Ok(faults)
    }
}

/// splitmix64: enough randomness to pick which requests a fault hits, without
/// a crate. Seeded from uuid's random bits so runs differ.
struct Rng(u64);

impl Rng {
    fn seeded() -> Self {
        Rng(Uuid::new_v4().as_u64_pair().0)
    }

    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// True with probability `rate`: never at 0, always at 1.
    fn chance(&mut self, rate: f64) -> bool {
        // The top 53 bits give a uniform float in [0, 1).
        rate > 0.0 && ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < rate
    }
}

/// `POST /v1/charges`. Every answer, replays and errors too, waits the
/// configured latency after the work is done.
async fn create_charge(
    state: web::Data<State>,
    req: HttpRequest,
    body: Result<Bytes, actix_web::Error>,
) -> HttpResponse {
    let latency = Duration::from_millis(state.book().faults.latency_ms);
    let response = answer_charge(&state, &req, body).await;
    tokio::time::sleep(latency).await;
    response
}

async fn answer_charge(
    state: &State,
    req: &HttpRequest,
    body: Result<Bytes, actix_web::Error>,
) -> HttpResponse {
    if !state.authorized(req) {
        return HttpResponse::Unauthorized()
            .insert_header((header::WWW_AUTHENTICATE, "Bearer"))
            .json(json!({"error": "missing or wrong API key (Authorization: Bearer <key>)"}));
    }
    let key = match idempotency_key(req) {
        Ok(key) => key,
        Err(message) => return error(StatusCode::BAD_REQUEST, message),
    };
    let request = match parse_charge(body) {
        Ok(request) => request,
        Err((status, message)) => {
            state.book().count_request(&key); // it still carried the key
            return error(status, &message);
        }
    };
    // The guard is a temporary: it is released before any await below.
    let decision = state.book().decide(&key, &request);
    match decision {
        Decision::Replay(answer) => respond(&answer, true),
        Decision::Mismatch => error(
            StatusCode::UNPROCESSABLE_ENTITY,
            "Idempotency-Key was already used with a different request body",
        ),
        Decision::Refuse => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "payrail sandbox processing error; nothing was charged",
        ),
        Decision::Charged {
            answer,
            delay,
            drop,
        } => {
            tokio::time::sleep(delay).await;
            if drop {
                tracing::warn!(
                    idempotency_key = %key,
                    "payrail sandbox drops the answer after charging (fault)"
                );
                dropped_connection()
            } else {
                respond(&answer, false)
            }
        }
    }
}

/// The charge body, or the status and message that reject it (a body too
/// large keeps actix's 413).
fn parse_charge(
    body: Result<Bytes, actix_web::Error>,
) -> Result<ChargeRequest, (StatusCode, String)> {
    let body = body.map_err(|e| (e.as_response_error().status_code(), e.to_string()))?;
    ChargeRequest::parse(&body).map_err(|message| (StatusCode::BAD_REQUEST, message))
}

fn idempotency_key(req: &HttpRequest) -> Result<String, &'static str> {
    let value = req
        .headers()
        .get("Idempotency-Key")
        .ok_or("missing Idempotency-Key header")?;
    let key = value
        .to_str()
        .map_err(|_| "Idempotency-Key must be visible ASCII")?;
    if key.is_empty() || key.len() > MAX_KEY_LEN {
        return Err("Idempotency-Key must be 1 to 255 characters");
    }
    Ok(key.to_owned())
}

fn respond(answer: &Answer, replayed: bool) -> HttpResponse {
    let mut builder = HttpResponse::build(answer.status);
    builder.content_type("application/json");
    if replayed {
        builder.insert_header((REPLAY_HEADER, "true"));
    }
    builder.body(answer.body.clone())
}

/// An answer that never arrives: actix encodes the status line into its write
/// buffer but polls the body before flushing it, and a body whose first poll
/// fails makes it drop the connection with nothing sent.
fn dropped_connection() -> HttpResponse {
    let lost = std::io::Error::other("answer dropped after the charge (sandbox fault)");
    let body = futures_util::stream::once(std::future::ready(Err::<Bytes, _>(lost)));
    HttpResponse::Ok().streaming(body)
}

async fn get_faults(state: web::Data<State>) -> HttpResponse {
    let faults = state.book().faults;
    HttpResponse::Ok().json(faults)
}

async fn set_faults(
    state: web::Data<State>,
    body: Result<Bytes, actix_web::Error>,
) -> HttpResponse {
    let parsed = body
        .map_err(|e| e.to_string())
        .and_then(|body| Faults::parse(&body));
    match parsed {
        Ok(faults) => {
            state.book().faults = faults;
            HttpResponse::Ok().json(faults)
        }
        Err(message) => error(StatusCode::BAD_REQUEST, &message),
    }
}

async fn list_charges(state: web::Data<State>) -> HttpResponse {
    let rows = state.book().ledger_rows();
    HttpResponse::Ok().json(rows)
}

async fn clear_charges(state: web::Data<State>) -> HttpResponse {
    state.book().clear();
    HttpResponse::NoContent().finish()
}

async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(json!({"status": "ok"}))
}

async fn not_found() -> HttpResponse {
    error(StatusCode::NOT_FOUND, "no such path")
}

async fn method_not_allowed() -> HttpResponse {
    error(
        StatusCode::METHOD_NOT_ALLOWED,
        "method not allowed on this path",
    )
}

fn error(status: StatusCode, message: &str) -> HttpResponse {
    HttpResponse::build(status).json(json!({ "error": message }))
}
