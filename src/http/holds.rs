use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;

use super::{body, idempotent, AppState, Buyer};
use crate::checkout::holds;
use crate::idempotency::{Finished, StoredResponse};
use crate::problem::Problem;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct HoldRequest {
    seat_id: i64,
}

/// `POST /holds`: idempotent when an `Idempotency-Key` is sent.
pub async fn create(
    state: web::Data<AppState>,
    buyer: Buyer,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, Problem> {
    let key = idempotent::key(&req)?;
    let bytes = body::read(&req, payload, state.max_body_bytes).await?;
    let request: HoldRequest = body::json(&bytes)?;
    let work = || async {
        let client = state.pool.get().await?;
        let hold = holds::place(&client, buyer.0.as_str(), request.seat_id, state.hold_ttl).await?;
        Ok(Finished::Answer(StoredResponse {
            status: 201,
            body: serde_json::to_vec(&hold).unwrap_or_default(),
            location: None,
            content_type: "application/json".to_owned(),
        }))
    };
    match key {
        Some(key) => idempotent::run(&state, &buyer.0, key, &req, &bytes, |_| work()).await,
        None => idempotent::unkeyed(work().await),
    }
}

/// `DELETE /holds/{hold_id}`: the buyer's own, unordered holds only.
pub async fn release(
    state: web::Data<AppState>,
    buyer: Buyer,
    hold_id: web::Path<String>,
) -> Result<HttpResponse, Problem> {
    let not_found = Problem::NotFound("there is no such hold of yours that can be released");
    let hold_id: i64 = hold_id
        .parse()
        .map_err(|_| Problem::NotFound("there is no such hold"))?;
    let client = state.pool.get().await?;
    if holds::release(&client, buyer.0.as_str(), hold_id).await? {
        Ok(HttpResponse::NoContent().finish())
    } else {
        Err(not_found)
    }
}
