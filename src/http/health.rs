//! Liveness and readiness for orchestrators.

use actix_web::{web, HttpResponse};
use serde::Serialize;

use super::problem::Problem;
use super::AppState;

/// The body of `/healthz` and `/readyz`.
#[derive(Serialize, utoipa::ToSchema)]
pub struct Health {
    /// `ok` (`/healthz`) or `ready` (`/readyz`).
    #[schema(example = "ok")]
    status: &'static str,
}

/// The process is up.
#[utoipa::path(
    get,
    path = "/healthz",
    tag = "operations",
    summary = "Liveness",
    responses((status = 200, description = "The process is up", body = Health))
)]
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(Health { status: "ok" })
}

/// The database answers: this instance can serve.
#[utoipa::path(
    get,
    path = "/readyz",
    tag = "operations",
    summary = "Readiness",
    responses(
        (status = 200, description = "The database answers", body = Health),
        super::openapi::ServerFailures,
    )
)]
pub async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, Problem> {
    let client = state.pool.get().await?;
    client.simple_query("SELECT 1").await?;
    Ok(HttpResponse::Ok().json(Health { status: "ready" }))
}
