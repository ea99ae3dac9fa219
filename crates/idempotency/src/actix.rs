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
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// 409: another request holds the intent; retry shortly. With the
    /// effect it has linked already, if any, for the answer to point at.
    InProgress { effect: Option<String> },
    /// 422: the key was first sent with another request.
    KeyReused,
    /// 429: a new intent past the scope's limit; retry after this long.
    Limited(std::time::Duration),
}

/// The response for a reply: the stored answer (plus `Idempotent-Replayed:
/// true` on a replay), or the refusal to render.
pub fn respond(reply: Reply) -> Result<HttpResponse, Refusal> {
    match reply {
        Reply::First(response) => Ok(response_of(&response, false)),
        Reply::Replay(response) => Ok(response_of(&response, true)),
        Reply::InProgress { effect } => Err(Refusal::InProgress { effect }),
        Reply::KeyReused => Err(Refusal::KeyReused),
        Reply::Limited(wait) => Err(Refusal::Limited(wait)),
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

/// The header that says a preference was honoured (RFC 7240).
pub const PREFERENCE_APPLIED: &str = "Preference-Applied";

/// The seconds a `Prefer: wait=N` header asks for (RFC 7240; any number of
/// `Prefer` headers, preferences separated by commas, names in any case, a
/// quoted value allowed). `None` when no valid `wait` is asked for: an
/// unknown or malformed preference is ignored, as the RFC says.
pub fn preferred_wait(req: &HttpRequest) -> Option<u64> {
    req.headers()
        .get_all("Prefer")
        .filter_map(|value| value.to_str().ok())
        .flat_map(|value| value.split(','))
        .find_map(|preference| {
            let preference = preference.split(';').next()?.trim();
            let (name, value) = preference.split_once('=')?;
            if !name.trim().eq_ignore_ascii_case("wait") {
                return None;
            }
            value.trim().trim_matches('"').parse().ok()
        })
}

#[cfg(test)]
mod tests {
    use actix_web::test::TestRequest;

    use super::preferred_wait;

    #[test]
    fn prefer_wait_is_read_as_rfc_7240_writes_it() {
        let cases: [(&[&str], Option<u64>); 8] = [
            (&["wait=5"], Some(5)),
            (&["respond-async, wait=10"], Some(10)),
            (&["WAIT = 3"], Some(3)),
            (&["wait=\"7\""], Some(7)),
            (&["handling=lenient", "wait=2;x=y"], Some(2)),
            (&["wait=-1"], None),
            (&["wait=soon"], None),
            (&["return=minimal"], None),
        ];
        for (headers, want) in cases {
            let mut req = TestRequest::default();
            for header in headers {
                req = req.append_header(("Prefer", *header));
            }
            assert_eq!(preferred_wait(&req.to_http_request()), want, "{headers:?}");
        }
    }
}
