//! The thin actix layer: extract, call the domain, map the answer. Handlers
//! hold no business rules and no SQL.

mod auth;
mod body;
mod client;
pub mod cors;
mod demo;
mod health;
mod holds;
mod idempotent;
pub mod metrics;
pub mod openapi;
mod orders;
pub mod payrail_events;
pub mod problem;
mod seats;
pub mod watch;

use std::time::Duration;

use actix_web::body::MessageBody;
use actix_web::dev::ServiceResponse;
use actix_web::http::header::{self, HeaderValue};
use actix_web::http::{Method, StatusCode};
use actix_web::middleware::{ErrorHandlerResponse, ErrorHandlers};
use actix_web::{web, FromRequest, Handler, HttpResponse, Responder, ResponseError};
use deadpool_postgres::Pool;
use idempotency::Engine;

use crate::auth::Verifier;
use crate::checkout::orders::Orders;
use crate::readiness::Readiness;
use problem::Problem;

pub use auth::Buyer;
pub use orders::answer as order_answer;

/// What every handler may use; built once per instance.
pub struct AppState {
    pub pool: Pool,
    /// `/readyz`'s database check, shared by concurrent callers.
    pub readiness: Readiness,
    pub engine: Engine,
    /// The per-buyer limit on new intents, shared with the engine (which
    /// applies it to keyed requests); unkeyed `POST /holds` asks it directly.
    pub limit: idempotency::Limit,
    pub orders: Orders,
    /// Checks bearer tokens (the HS256 secret and/or the identity provider).
    pub verifier: Verifier,
    /// The longest a `Prefer: wait` request waits (`idempotency.max_wait_secs`).
    pub max_wait_secs: u64,
    pub holds: crate::checkout::holds::HoldPolicy,
    pub max_body_bytes: usize,
    /// How long a body may take to arrive (`http.request_timeout_secs`).
    pub request_timeout: Duration,
    /// Payrail's events; `None` (404) without `payrail.webhook_secret`.
    pub events: Option<payrail_events::PayrailEvents>,
}

/// Every route: one method per path, and a 405 with `Allow` for the others.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(endpoint("/healthz", Method::GET, health::healthz))
        .service(endpoint("/readyz", Method::GET, health::readyz))
        .service(endpoint("/metrics", Method::GET, metrics::metrics))
        .service(endpoint(
            "/openapi.json",
            Method::GET,
            openapi::openapi_json,
        ))
        .service(endpoint(
            "/events/{event_id}/seats",
            Method::GET,
            seats::seat_map,
        ))
        .service(endpoint("/holds", Method::POST, holds::create))
        .service(endpoint("/holds/{hold_id}", Method::DELETE, holds::release))
        .service(endpoint("/orders", Method::POST, orders::create))
        .service(endpoint("/orders/{order_id}", Method::GET, orders::show))
        .service(endpoint(
            "/payrail/events",
            Method::POST,
            payrail_events::receive,
        ))
        .service(file("/demo/", demo::page))
        .service(file("/demo", demo::redirect))
        .service(file("/client/checkout.js", client::module))
        .service(file("/client/checkout.d.ts", client::types));
}

/// A path served by one method; the others answer 405 `method-not-allowed`
/// with the `Allow` header (actix alone would answer 404).
fn endpoint<F, Args>(path: &str, method: Method, handler: F) -> actix_web::Resource
where
    F: Handler<Args>,
    Args: FromRequest + 'static,
    F::Output: Responder + 'static,
{
    resource(path, &[method], handler)
}

/// A file a browser or a cache may probe: `GET`, and `HEAD` with the same
/// headers and no body (actix leaves the body out of a `HEAD` answer).
fn file<F, Args>(path: &str, handler: F) -> actix_web::Resource
where
    F: Handler<Args>,
    Args: FromRequest + 'static,
    F::Output: Responder + 'static,
{
    resource(path, &[Method::GET, Method::HEAD], handler)
}

fn resource<F, Args>(path: &str, methods: &[Method], handler: F) -> actix_web::Resource
where
    F: Handler<Args>,
    Args: FromRequest + 'static,
    F::Output: Responder + 'static,
{
    let names: Vec<&str> = methods.iter().map(Method::as_str).collect();
    let allow = HeaderValue::from_str(&names.join(", ")).unwrap_or(HeaderValue::from_static("GET"));
    let resource = methods
        .iter()
        .fold(web::resource(path), |resource, method| {
            resource.route(web::method(method.clone()).to(handler.clone()))
        });
    resource.default_service(web::to(move || {
        let allow = allow.clone();
        async move {
            let mut response = Problem::MethodNotAllowed.error_response();
            response.headers_mut().insert(header::ALLOW, allow);
            response
        }
    }))
}

/// Refusals raised outside the handlers (a CORS preflight from an origin
/// that is not allowed) come as plain text; this turns them into problems,
/// so that every error a client sees is RFC 9457.
pub fn bare_refusals_as_problems<B: MessageBody + 'static>() -> ErrorHandlers<B> {
    ErrorHandlers::new().handler(StatusCode::BAD_REQUEST, |res: ServiceResponse<B>| {
        let is_problem = res
            .headers()
            .get(header::CONTENT_TYPE)
            .is_some_and(|v| v.as_bytes() == problem::CONTENT_TYPE.as_bytes());
        if is_problem {
            return Ok(ErrorHandlerResponse::Response(res.map_into_left_body()));
        }
        let detail = res
            .response()
            .error()
            .map_or_else(|| "the request was refused".to_owned(), ToString::to_string);
        let (req, _) = res.into_parts();
        let problem = Problem::InvalidRequest(detail).error_response();
        Ok(ErrorHandlerResponse::Response(
            ServiceResponse::new(req, problem).map_into_right_body(),
        ))
    })
}

/// The answer for paths that do not exist.
pub async fn not_found() -> Result<HttpResponse, Problem> {
    Err(Problem::NotFound("there is nothing at this path"))
}
