//! The actix-web adapter (feature `actix`): a keyed request in ([`run`]:
//! its key, its fingerprint and its `Prefer: wait`), the engine's reply out
//! as a response. How a refusal (409, 422, 429) or a bad key (400) looks is
//! the caller's: they come back as values for the caller's own error type.

use std::future::Future;
use std::time::Duration;

use actix_web::http::header::{self, TryIntoHeaderPair};
use actix_web::http::StatusCode;
use actix_web::{HttpRequest, HttpResponse};

use crate::claim::{Claim, Done};
use crate::engine::Engine;
use crate::fingerprint::RequestHash;
use crate::key::{IdempotencyKey, KeyError};
use crate::reply::{Reply, RunError};
use crate::response::StoredResponse;
use crate::statement::Opening;
use crate::wait::WaitOutcome;

/// A keyed request answered: the response, and the answer it carries, as
/// stored (the caller may read what it says, for its logs).
pub struct Answered {
    pub response: HttpResponse,
    pub answer: StoredResponse,
}

/// Why [`run`] has no stored answer to give: a refusal to render, or a
/// failure (the engine's, or the work's, which is never stored).
#[derive(Debug)]
pub enum Unanswered<E> {
    Refused(Refusal),
    Failed(RunError<E>),
}

/// Runs `work` at most once for (`scope`, `key`, this request) and answers
/// with the intent's stored answer (`Idempotent-Replayed: true` on a
/// replay). `opening` is the work's first step, run with the claim (see
/// [`Opening`]). A request that finds its key in progress waits for the
/// holder's answer when it asks to (`Prefer: wait=N`, RFC 7240, at most
/// `max_wait`), and is told so (`Preference-Applied: wait=N`) when it got
/// the answer by waiting.
pub async fn run<W, Fut, E>(
    engine: &Engine,
    scope: &str,
    key: &IdempotencyKey,
    (req, body): (&HttpRequest, &[u8]),
    opening: Option<&Opening>,
    max_wait: Duration,
    work: W,
) -> Result<Answered, Unanswered<E>>
where
    W: FnOnce(Claim) -> Fut,
    Fut: Future<Output = Result<Done, E>>,
{
    let hash = fingerprint(req, body);
    let wait = preferred_wait(req).map(|asked| Duration::from_secs(asked).min(max_wait));
    let ran = engine
        .run(scope, key, &hash, opening, wait.unwrap_or_default(), work)
        .await
        .map_err(Unanswered::Failed)?;
    let applied = ran
        .waited
        .is_some_and(|(outcome, _)| outcome != WaitOutcome::TimedOut);
    let (answer, replayed) = answer_of(ran.reply).map_err(Unanswered::Refused)?;
    let mut response = response_of(&answer, replayed);
    if let (true, Some(wait)) = (applied, wait) {
        let pair = (PREFERENCE_APPLIED, format!("wait={}", wait.as_secs())).try_into_pair();
        if let Ok((name, value)) = pair {
            response.headers_mut().insert(name, value);
        }
    }
    Ok(Answered { response, answer })
}

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

/// A reply's stored answer and whether it is a replay, or its refusal.
fn answer_of(reply: Reply) -> Result<(StoredResponse, bool), Refusal> {
    match reply {
        Reply::First(answer) => Ok((answer, false)),
        Reply::Replay(answer) => Ok((answer, true)),
        Reply::InProgress { effect } => Err(Refusal::InProgress { effect }),
        Reply::KeyReused => Err(Refusal::KeyReused),
        Reply::Limited(wait) => Err(Refusal::Limited(wait)),
    }
}

/// The response for a reply: the stored answer (plus `Idempotent-Replayed:
/// true` on a replay), or the refusal to render.
pub fn respond(reply: Reply) -> Result<HttpResponse, Refusal> {
    let (answer, replayed) = answer_of(reply)?;
    Ok(response_of(&answer, replayed))
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
