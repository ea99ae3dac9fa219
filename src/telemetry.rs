//! Logging: a tracing subscriber (JSON in production, human text elsewhere)
//! and a root span per request carrying its id, method, path, status and
//! latency. Secrets never reach a field.

use std::io::IsTerminal;
use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::middleware::Next;
use tracing::Instrument;
use tracing_subscriber::EnvFilter;
use uuid::Uuid;

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Installs the global subscriber once; later calls (tests) are no-ops.
/// `RUST_LOG` overrides the default level.
pub fn init(json: bool) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let _ = if json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.try_init()
    };
}

/// Middleware: one span per request and one line when it ends. A sane
/// incoming `X-Request-Id` is kept, else one is made; either way it is echoed.
pub async fn log_request(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let started = Instant::now();
    let request_id = req
        .headers()
        .get(&REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 64 && v.bytes().all(|c| c.is_ascii_graphic()))
        .map_or_else(|| Uuid::new_v4().to_string(), str::to_owned);
    let span = tracing::info_span!(
        "request",
        %request_id,
        method = %req.method(),
        path = %req.path(),
    );
    let mut response = next.call(req).instrument(span.clone()).await?;
    let status = response.status().as_u16();
    let elapsed = started.elapsed().as_secs_f64();
    let latency_ms = elapsed * 1000.0;
    let route = response.request().match_pattern();
    crate::observe::http_request(
        response.request().method().as_str(),
        route.as_deref().unwrap_or("unmatched"),
        status,
        elapsed,
    );
    span.in_scope(|| {
        if status >= 500 {
            tracing::warn!(status, latency_ms, "request finished");
        } else {
            tracing::info!(status, latency_ms, "request finished");
        }
    });
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    Ok(response)
}
