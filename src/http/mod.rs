//! The thin actix layer: extract, call the domain, map the answer. Handlers
//! hold no business rules and no SQL.

mod auth;
mod body;
pub mod cors;
mod demo;
mod health;
mod holds;
mod idempotent;
mod metrics;
mod openapi;
mod orders;
mod seats;

use std::sync::Arc;
use std::time::Duration;

use actix_web::{web, HttpResponse};
use deadpool_postgres::Pool;

use crate::auth::Tokens;
use crate::idempotency::store::KeyPolicy;
use crate::idempotency::Gate;
use crate::payrail;
use crate::problem::Problem;

pub use auth::Buyer;

/// What every handler may use; built once per instance.
pub struct AppState {
    pub pool: Pool,
    pub payrail: Arc<payrail::Client>,
    pub tokens: Tokens,
    pub keys: KeyPolicy,
    pub gate: Gate,
    pub hold_ttl: Duration,
    pub max_body_bytes: usize,
}

/// Every route of the API, each path with a 405 for the methods it lacks.
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(resource("/healthz").route(web::get().to(health::healthz)))
        .service(resource("/readyz").route(web::get().to(health::readyz)))
        .service(resource("/metrics").route(web::get().to(metrics::metrics)))
        .service(resource("/openapi.json").route(web::get().to(openapi::openapi_json)))
        .service(resource("/events/{event_id}/seats").route(web::get().to(seats::seat_map)))
        .service(resource("/holds").route(web::post().to(holds::create)))
        .service(resource("/holds/{hold_id}").route(web::delete().to(holds::release)))
        .service(resource("/orders").route(web::post().to(orders::create)))
        .service(resource("/orders/{order_id}").route(web::get().to(orders::show)))
        .service(resource("/demo/").route(web::get().to(demo::page)))
        .service(resource("/demo").route(web::get().to(demo::redirect)));
}

/// A resource whose unknown methods answer 405 instead of actix's 404.
pub fn resource(path: &str) -> actix_web::Resource {
    web::resource(path).default_service(web::to(method_not_allowed))
}

async fn method_not_allowed() -> Result<HttpResponse, Problem> {
    Err(Problem::MethodNotAllowed)
}

/// The answer for paths that do not exist.
pub async fn not_found() -> Result<HttpResponse, Problem> {
    Err(Problem::NotFound("there is nothing at this path"))
}
