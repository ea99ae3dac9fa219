//! Liveness and readiness for orchestrators.

use actix_web::{get, web, HttpResponse};
use serde::Serialize;

use super::AppState;
use crate::problem::Problem;

/// The body of `/healthz` and `/readyz`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Health {
    /// `ok` (`/healthz`) or `ready` (`/readyz`).
    #[schema(example = "ok")]
    status: &'static str,
}

/// The process is up.
#[utoipa::path(
    tag = "operations",
    summary = "Liveness",
    description = "200 while the process serves HTTP. It asks nothing of the database (that is \
        `/readyz`), so a database outage never makes an orchestrator restart a healthy \
        instance. No token.",
    security(),
    responses((status = 200, description = "The process is up", body = Health))
)]
#[get("/healthz")]
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(Health { status: "ok" })
}

/// The database answers: this instance can serve.
#[utoipa::path(
    tag = "operations",
    summary = "Readiness",
    description = "200 when a pooled database connection answers and, with an identity \
        provider configured, its signing keys were fetched once; 503 `service-unavailable` \
        while the database is out of reach or no key set was ever fetched, so that a load \
        balancer sends this instance no traffic until it can serve. No token. The database \
        is asked at most once at a time, and an outcome answers for a second: concurrent \
        callers share one check, and never hold more than one pooled connection.",
    security(),
    responses((status = 200, description = "The database answers", body = Health))
)]
#[get("/readyz")]
pub async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, Problem> {
    if !state.verifier.has_keys() {
        return Err(Problem::KeysUnavailable);
    }
    if !state.readiness.database_answers().await {
        return Err(Problem::NotReady);
    }
    Ok(HttpResponse::Ok().json(Health { status: "ready" }))
}
