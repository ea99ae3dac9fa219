//! The Payrail sandbox: a small, real HTTP server that behaves like the Payrail
//! payment provider, for local runs, compose, tests and benchmarks.
//!
//! It keeps the one promise the checkout builds on: a repeated
//! `Idempotency-Key` with the same body gets the first answer again, byte for
//! byte, and concurrent repeats charge once. Test cards (`pm_card_declined`,
//! `pm_card_slow`, `pm_card_late`, `pm_card_error`) and global faults (latency, errors,
//! answers lost after the charge) let tests provoke the failures a real
//! provider shows, and the ledger (`GET /v1/sandbox/charges`) records every
//! charge decided, as the truth the service is checked against.
//!
//! Given a webhook ([`Webhook`]), it also pushes a signed event for every
//! charge it decides, at least once (`webhook`), and lists them at `GET
//! /v1/sandbox/events`. `POST /v1/charges/cancel` voids a key: nothing is
//! ever charged under it afterwards, and a charge already made is refunded.
//!
//! It never moves money, never calls anything but the webhook and never persists: all
//! state is in memory and dies with the process. The `/v1/sandbox/*` control
//! endpoints need no API key (it is a test double), so it must never be
//! reachable from outside a test or development network.

use std::net::TcpListener;
use std::time::Duration;

use actix_web::dev::ServerHandle;
use actix_web::http::{header, StatusCode};
use actix_web::web::{self, Bytes};
use actix_web::{App, HttpRequest, HttpResponse, HttpServer};
use serde_json::json;

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
        Sandbox::start_with(listener, api_key, None)
    }

    /// As [`start`](Sandbox::start), sending events to `webhook` when given.
    pub fn start_with(
        listener: TcpListener,
        api_key: String,
        webhook: Option<Webhook>,
    ) -> std::io::Result<Sandbox> {
        let port = listener.local_addr()?.port();
        let sender = webhook.map(webhook::Sender::new).transpose()?;
        // One Arc for all workers, so they share one idempotency table.
        let state = web::Data::new(State::new(api_key, sender));
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
        web::resource("/v1/charges/cancel")
            .route(web::post().to(cancel_charge))
            .default_service(web::to(method_not_allowed)),
    )
    .service(
        web::resource("/v1/sandbox/events")
            .route(web::get().to(list_events))
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

mod book;
mod request;
mod webhook;

use book::{Answer, Canceled, Decision, State};
use request::{ChargeRequest, Faults};
pub use webhook::{sign, Webhook, SIGNATURE_HEADER};

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
    state: &web::Data<State>,
    req: &HttpRequest,
    body: Result<Bytes, actix_web::Error>,
) -> HttpResponse {
    let key = match authorized_key(state, req) {
        Ok(key) => key,
        Err(refused) => return refused.response(),
    };
    // The caller's trace: a test, or a person on call, links the two logs by it.
    if let Some(traceparent) = req.headers().get("traceparent") {
        tracing::info!(
            idempotency_key = %key,
            traceparent = %String::from_utf8_lossy(traceparent.as_bytes()),
            "payrail sandbox charge request"
        );
    }
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
        Decision::Void => error(
            StatusCode::CONFLICT,
            "Idempotency-Key was canceled; nothing is charged under it",
        ),
        Decision::Refuse => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "payrail sandbox processing error; nothing was charged",
        ),
        Decision::Charged {
            answer,
            event,
            delay,
            event_late,
            drop,
        } => {
            // The event leaves as soon as the charge is made, whatever
            // becomes of the answer (held back by a slow card, or lost);
            // a late card's waits with its answer.
            if event_late {
                tokio::time::sleep(delay).await;
                webhook::deliver(state, event);
            } else {
                webhook::deliver(state, event);
                tokio::time::sleep(delay).await;
            }
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

/// `POST /v1/charges/cancel`: voids the key, refunding its charge if one
/// was made; a repeat answers the same.
async fn cancel_charge(state: web::Data<State>, req: HttpRequest) -> HttpResponse {
    let key = match authorized_key(&state, &req) {
        Ok(key) => key,
        Err(refused) => return refused.response(),
    };
    let canceled = state.book().cancel(&key);
    match canceled {
        Canceled::Nothing => HttpResponse::Ok().json(json!({"status": "canceled"})),
        Canceled::Refunded { charge_id } => {
            HttpResponse::Ok().json(json!({"status": "refunded", "id": charge_id}))
        }
    }
}

/// Why a charge or cancel request is refused before its key is looked at.
enum Refused {
    Unauthorized,
    BadKey(&'static str),
}

impl Refused {
    fn response(self) -> HttpResponse {
        match self {
            Refused::Unauthorized => HttpResponse::Unauthorized()
                .insert_header((header::WWW_AUTHENTICATE, "Bearer"))
                .json(json!({"error": "missing or wrong API key (Authorization: Bearer <key>)"})),
            Refused::BadKey(message) => error(StatusCode::BAD_REQUEST, message),
        }
    }
}

/// The key of a request carrying the right API key, or the refusal.
fn authorized_key(state: &State, req: &HttpRequest) -> Result<String, Refused> {
    if !state.authorized(req) {
        return Err(Refused::Unauthorized);
    }
    idempotency_key(req).map_err(Refused::BadKey)
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

async fn list_events(state: web::Data<State>) -> HttpResponse {
    let rows = state.book().event_rows();
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
