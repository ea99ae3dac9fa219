//! CORS for the buyer's browser: only the origins in
//! `http.cors_origins` may call the API from a page of their own, with the
//! request headers a checkout needs (`Prefer` too, so that a retry may wait
//! for an earlier attempt's answer; `If-None-Match`, so that a page polling
//! the seat map gets a 304 when nothing changed; `traceparent` and
//! `tracestate`, so that the shop page's trace goes on here), and they may
//! read the response headers a retrying or polling client acts on. The same goes for importing `/client/checkout.js`:
//! a module script is fetched in CORS mode.
//!
//! Preflights are answered here, before routing and before authentication: a
//! browser never sends a bearer token with an `OPTIONS` preflight. With no
//! origins configured the middleware adds nothing at all, and an `OPTIONS`
//! request reaches the routes like any other method.

use actix_cors::Cors;
use actix_web::http::Method;

use idempotency::actix::REPLAYED;

/// How long a browser may cache a preflight answer (seconds).
const PREFLIGHT_MAX_AGE_SECS: usize = 600;

/// The CORS middleware for these origins (exact `scheme://host[:port]`).
pub fn cors(origins: &[String]) -> Cors {
    if origins.is_empty() {
        return Cors::default().disable_preflight().disable_vary_header();
    }
    origins
        .iter()
        .fold(Cors::default(), |cors, origin| cors.allowed_origin(origin))
        .allowed_methods([Method::GET, Method::POST, Method::DELETE, Method::OPTIONS])
        .allowed_headers([
            "Authorization",
            "Content-Type",
            "Idempotency-Key",
            "Prefer",
            "If-None-Match",
            "traceparent",
            "tracestate",
        ])
        .expose_headers([
            "Location",
            "Retry-After",
            REPLAYED,
            "Preference-Applied",
            "ETag",
        ])
        .max_age(PREFLIGHT_MAX_AGE_SECS)
}
