//! The glue between a keyed request and the idempotency engine: the key and
//! the body bytes in; out, the stored answer, a 409/422, or the work done
//! once with its answer stored. Any endpoint uses it the same way.

use std::time::Duration;

use actix_web::http::header::{HeaderName, HeaderValue};
use actix_web::{HttpRequest, HttpResponse};
use idempotency::{actix, Claim, Done, IdempotencyKey, Opening, Reply, WaitOutcome};

use super::problem::{self, Problem};
use super::AppState;
use crate::auth::BuyerId;
use crate::checkout::CheckoutError;
use crate::telemetry::{self, ProblemSlug};

/// The `Idempotency-Key` header: `None` when absent, 400 when malformed or
/// repeated. Read before anything is stored.
pub fn key(req: &HttpRequest) -> Result<Option<IdempotencyKey>, Problem> {
    Ok(actix::key(req)?)
}

/// Runs `work` at most once for this (buyer, key, request) and answers;
/// `opening` is the work's first step, run with the claim (see
/// `idempotency::Opening`).
pub async fn run<W, Fut>(
    state: &AppState,
    buyer: &BuyerId,
    key: IdempotencyKey,
    (req, body): (&HttpRequest, &[u8]),
    opening: Option<&Opening>,
    work: W,
) -> Result<HttpResponse, Problem>
where
    W: FnOnce(Claim) -> Fut,
    Fut: std::future::Future<Output = Result<Done, CheckoutError>>,
{
    let hash = actix::fingerprint(req, body);
    // `Prefer: wait=N` (RFC 7240): a retry that finds its click still in
    // progress waits for the answer instead of a 409, up to the configured
    // longest wait.
    let wait = actix::preferred_wait(req).map(|asked| asked.min(state.max_wait_secs));
    let ran = state
        .engine
        .run(
            buyer.as_str(),
            &key,
            &hash,
            opening,
            Duration::from_secs(wait.unwrap_or(0)),
            |claim| async move { answer_or_fail(work(claim).await) },
        )
        .await?;
    let applied = ran
        .waited
        .is_some_and(|(outcome, _)| outcome != WaitOutcome::TimedOut);
    let told = match &ran.reply {
        Reply::First(answer) | Reply::Replay(answer) => problem::told(answer),
        _ => None,
    };
    let mut response = actix::respond(ran.reply)?;
    if let Some(told) = told {
        // A stored problem is no `Problem` here: what it is comes from its body.
        response.extensions_mut().insert(ProblemSlug(told.slug));
        if let Some(order_id) = told.order_id {
            telemetry::note_order(req, order_id);
        }
    }
    if let (true, Some(secs)) = (applied, wait) {
        response.headers_mut().insert(
            HeaderName::from_static("preference-applied"),
            HeaderValue::from_str(&format!("wait={secs}"))
                .unwrap_or(HeaderValue::from_static("wait")),
        );
    }
    Ok(response)
}

/// A domain refusal (a 4xx) is the intent's answer, stored like any other;
/// anything else is a failure that is never stored.
fn answer_or_fail(done: Result<Done, CheckoutError>) -> Result<Done, Problem> {
    match done {
        Ok(done) => Ok(done),
        Err(error) => {
            let problem = Problem::from(error);
            if problem.is_answer() {
                Ok(Done::Answer(problem.to_response()))
            } else {
                Err(problem)
            }
        }
    }
}
