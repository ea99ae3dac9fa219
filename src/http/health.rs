//! Liveness and readiness for orchestrators.

use actix_web::{web, HttpResponse};

use super::AppState;
use crate::problem::Problem;

/// The process is up.
pub async fn healthz() -> HttpResponse {
    HttpResponse::Ok().json(serde_json::json!({"status": "ok"}))
}

/// The database answers: this instance can serve.
pub async fn readyz(state: web::Data<AppState>) -> Result<HttpResponse, Problem> {
    let client = state.pool.get().await?;
    client.simple_query("SELECT 1").await?;
    Ok(HttpResponse::Ok().json(serde_json::json!({"status": "ready"})))
}
