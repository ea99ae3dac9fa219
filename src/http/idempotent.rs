//! The glue between a keyed request and the idempotency mechanism: header and
//! body bytes in; then either the stored answer, a 409/422, or the work done
//! once and its answer stored as the last act. Any endpoint can use it.

use std::future::Future;

use actix_web::http::{header, StatusCode};
use actix_web::{HttpRequest, HttpResponse};

use super::AppState;
use crate::auth::BuyerId;
use crate::idempotency::{
    store, Begin, Claim, ClaimKind, Finished, IdempotencyKey, RequestHash, StoredResponse,
};
use crate::observe;
use crate::problem::Problem;

pub const REPLAYED: &str = "Idempotent-Replayed";

/// The `Idempotency-Key` header: `None` when absent, 400 when malformed or
/// repeated. Read before anything is stored.
pub fn key(req: &HttpRequest) -> Result<Option<IdempotencyKey>, Problem> {
    let mut values = req.headers().get_all("Idempotency-Key");
    let Some(value) = values.next() else {
        return Ok(None);
    };
    if values.next().is_some() {
        return Err(crate::idempotency::KeyError::Repeated.into());
    }
    Ok(Some(IdempotencyKey::parse(value.as_bytes())?))
}

/// Runs `work` at most once for this (buyer, key, request) and answers.
pub async fn run<W, Fut>(
    state: &AppState,
    buyer: &BuyerId,
    key: IdempotencyKey,
    req: &HttpRequest,
    body: &[u8],
    work: W,
) -> Result<HttpResponse, Problem>
where
    W: FnOnce(Claim) -> Fut,
    Fut: Future<Output = Result<Finished, Problem>>,
{
    let path = req
        .uri()
        .path_and_query()
        .map_or(req.path(), |pq| pq.as_str());
    let hash = RequestHash::of(req.method().as_str(), path, body);
    let admitted = state
        .gate
        .enter(buyer.as_str(), &key, state.keys.lease)
        .await;
    let begun = {
        let client = state.pool.get().await?;
        if admitted {
            store::begin(&client, state.keys, buyer.as_str(), &key, &hash).await?
        } else {
            store::current(&client, state.keys, buyer.as_str(), &key, &hash).await?
        }
    };
    observe::idempotency(match &begun {
        Begin::Claimed(claim) => match claim.kind {
            ClaimKind::First => "first",
            ClaimKind::Expired => "expired_takeover",
            ClaimKind::Abandoned => "lease_takeover",
        },
        Begin::Replay(_) => "replay",
        Begin::InProgress => "in_progress",
        Begin::KeyReused => "key_reused",
    });
    let claim = match begun {
        Begin::Claimed(claim) => claim,
        other => {
            if admitted {
                state.gate.leave(buyer.as_str(), &key).await;
            }
            return answer_begun(other);
        }
    };
    let finished = work(claim.clone()).await;
    let fenced = matches!(finished, Ok(Finished::Fenced));
    let answer = match finished {
        Ok(Finished::Stored(response)) => Ok(respond(&response, false)),
        Ok(Finished::Answer(response)) => store_and_answer(state, &claim, &hash, response).await,
        Ok(Finished::Fenced) => answer_current(state, &claim, &hash).await,
        Err(problem) if problem.status().is_server_error() => {
            // Not an answer: nothing is stored. If nothing durable was made
            // the key is given back so that a retry starts afresh; otherwise
            // it stays in progress until the intent has an outcome.
            if let Ok(client) = state.pool.get().await {
                if let Err(error) = store::release(&client, &claim).await {
                    tracing::warn!(%error, "could not release an idempotency key");
                }
            }
            Err(problem)
        }
        Err(problem) => store_and_answer(state, &claim, &hash, problem.to_response()).await,
    };
    // The gate marks a claim in flight. This one is over, unless it was
    // fenced off, in which case the gate now belongs to the request that took
    // the key over.
    if !fenced {
        state.gate.leave(&claim.user_id, &claim.key).await;
    }
    answer
}

/// The answer of a request with no key: the work's answer, unstored.
pub fn unkeyed(finished: Result<Finished, Problem>) -> Result<HttpResponse, Problem> {
    match finished? {
        Finished::Answer(response) | Finished::Stored(response) => Ok(respond(&response, false)),
        Finished::Fenced => Err(Problem::RequestInProgress),
    }
}

async fn store_and_answer(
    state: &AppState,
    claim: &Claim,
    hash: &RequestHash,
    response: StoredResponse,
) -> Result<HttpResponse, Problem> {
    let client = state.pool.get().await?;
    if store::complete(&client, claim, &response).await? {
        return Ok(respond(&response, false));
    }
    drop(client);
    answer_current(state, claim, hash).await
}

/// For a request fenced off by a takeover: whatever the key says now.
async fn answer_current(
    state: &AppState,
    claim: &Claim,
    hash: &RequestHash,
) -> Result<HttpResponse, Problem> {
    let client = state.pool.get().await?;
    answer_begun(store::current(&client, state.keys, &claim.user_id, &claim.key, hash).await?)
}

fn answer_begun(begun: Begin) -> Result<HttpResponse, Problem> {
    match begun {
        Begin::Replay(response) => Ok(respond(&response, true)),
        Begin::KeyReused => Err(Problem::KeyReused),
        Begin::InProgress | Begin::Claimed(_) => Err(Problem::RequestInProgress),
    }
}

/// A stored answer as HTTP: the same status, body bytes, `Location` and
/// `Content-Type`, plus `Idempotent-Replayed: true` on a replay.
fn respond(response: &StoredResponse, replayed: bool) -> HttpResponse {
    let status = StatusCode::from_u16(response.status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut builder = HttpResponse::build(status);
    builder.insert_header((header::CONTENT_TYPE, response.media.content_type()));
    if let Some(location) = response.location() {
        builder.insert_header((header::LOCATION, location));
    }
    if replayed {
        builder.insert_header((REPLAYED, "true"));
    }
    builder.body(response.body.clone())
}
