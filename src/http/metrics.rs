use actix_web::{get, web, HttpResponse};

use super::AppState;
use crate::observe;

/// `/metrics` alone, for its own listener (`server.metrics_addr`).
pub fn routes(cfg: &mut web::ServiceConfig) {
    cfg.service(metrics);
}

/// `GET /metrics`: Prometheus text format, no token (scrapers live inside
/// the deployment's network: in production it is served on
/// `server.metrics_addr` only).
#[utoipa::path(
    tag = "operations",
    summary = "Prometheus metrics",
    description = "This instance's counters, gauges and histograms in the Prometheus text \
        exposition format (0.0.4); every known label value is there from the first scrape. No \
        token: scrape it from inside the deployment's network.",
    security(),
    responses((status = 200, description = "Prometheus text exposition format",
        body = String, content_type = "text/plain"))
)]
#[get("/metrics")]
pub async fn metrics(state: web::Data<AppState>) -> HttpResponse {
    observe::pool(state.pool.status());
    observe::process();
    HttpResponse::Ok()
        .content_type("text/plain; version=0.0.4; charset=utf-8")
        .body(observe::render())
}
