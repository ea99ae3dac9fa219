//! The actix-web adapter (feature `actix`): reads the key and the request's
//! fingerprint off an `HttpRequest`, and turns a [`Reply`] into a response.
//! How a refusal (409, 422) or a bad key (400) looks is the caller's: they
//! come back as values for the caller's own error type.

use actix_web::http::{header, StatusCode};
use actix_web::{HttpRequest, HttpResponse};

use crate::{IdempotencyKey, KeyError, Reply, RequestHash, StoredResponse};

/// The header a replayed answer carries.
pub const REPLAYED: &str = "Idempotent-Replayed";

/// The `Idempotency-Key` header: `None` when absent, an error when malformed
/// or sent twice. Read it before anything is stored.
pub fn key(req: &HttpRequest) -> Result<Option<IdempotencyKey>, KeyError> {
    let mut values = req.headers().get_all("Idempotency-Key");
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(KeyError::Repeated);
    }
    IdempotencyKey::parse(value.as_bytes()).map(Some)
}

/// The request's fingerprint: its method, its path with the query, and the
/// exact body bytes.
pub fn fingerprint(req: &HttpRequest, body: &[u8]) -> RequestHash {
    let path = req
        .uri()
        .path_and_query()
        .map_or(req.path(), |pq| pq.as_str());
    RequestHash::of(req.method().as_str(), path, body)
}

/// What a reply refuses, for the caller to render as its own error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// 409: another request holds the intent; retry shortly.
    InProgress,
    /// 422: the key was first sent with another request.
    KeyReused,
}

/// The response for a reply: the stored answer (plus `Idempotent-Replayed:
/// true` on a replay), or the refusal to render.
pub fn respond(reply: Reply) -> Result<HttpResponse, Refusal> {
    match reply {
        Reply::First(response) => Ok(response_of(&response, false)),
        Reply::Replay(response) => Ok(response_of(&response, true)),
        Reply::InProgress => Err(Refusal::InProgress),
        Reply::KeyReused => Err(Refusal::KeyReused),
    }
}

/// A stored answer as HTTP: the same status, body bytes, `Location` and
/// `Content-Type`.
pub fn response_of(response: &StoredResponse, replayed: bool) -> HttpResponse {
    let status = StatusCode::from_u16(response.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut builder = HttpResponse::build(status);
    builder.insert_header((header::CONTENT_TYPE, response.content_type.as_str()));
    if let Some(location) = &response.location {
        builder.insert_header((header::LOCATION, location.as_str()));
    }
    if replayed {
        builder.insert_header((REPLAYED, "true"));
    }
    builder.body(response.body.clone())
}
