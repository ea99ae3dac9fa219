use std::time::Duration;

use actix_web::{delete, post, web, HttpRequest, HttpResponse};
use serde::Deserialize;

use idempotency::{actix, StoredResponse};

use super::problem::answered;
use super::{body, seats, AppState, Buyer};
use crate::checkout::holds::{self, Hold};
use crate::checkout::slot_of;
use crate::problem::{answer_or_fail, Problem};

#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct HoldRequest {
    seat_id: i64,
}

/// Idempotent when an `Idempotency-Key` is sent.
#[utoipa::path(
    operation_id = "hold_seat",
    tag = "holds",
    summary = "Hold a seat",
    description = "The seat stays the buyer's for `holds.ttl_secs`. With an `Idempotency-Key` \
        the first answer (2xx or 4xx) is stored and a retry with the same key gets it back. \
        A seat that does not exist is 404.",
    params(
        ("Idempotency-Key" = Option<String>, Header, min_length = 1, max_length = 255,
            pattern = "^[!#-~]{1,255}$",
            description = "Optional. 1-255 visible ASCII characters, made once per click; \
                the structured-field form `\"...\"` means the text inside the quotes"),
        ("Prefer" = Option<String>, Header, example = "wait=5",
            description = "RFC 7240. `wait=N`: if the key's first request is still in \
                progress, wait up to N seconds (at most `idempotency.max_wait_secs`) for its \
                answer and get it as a replay, instead of an immediate 409"),
    ),
    request_body = HoldRequest,
    security(("bearer" = [])),
    responses(
        (status = 201, description = "Held", body = Hold,
            links(
                ("ReleaseHold" = (operation_id = "release_hold",
                    parameters(("hold_id" = "$response.body#/hold_id")))),
                ("PayForHold" = (operation_id = "place_order",
                    request_body = json!({
                        "hold_ids": ["$response.body#/hold_id"],
                        "payment_method": "pm_card_visa"
                    }))),
            )),
    )
)]
#[post("/holds")]
pub async fn create(
    state: web::Data<AppState>,
    buyer: Buyer,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, Problem> {
    let key = actix::key(&req)?;
    let bytes = body::read(&req, payload, &state).await?;
    let request: HoldRequest = body::json(&bytes)?;
    let answered = match key {
        Some(key) => {
            // The hold's unit runs where the seat's holds are (the worker
            // of its slot, on a cluster): the buyer's lock per event that
            // bounds its holds is an advisory lock, which only that node's
            // transactions see.
            let (pool, policy) = (
                &state.route.slot_pool(slot_of(request.seat_id)),
                state.holds,
            );
            actix::run(
                &state.engine,
                buyer.0.as_str(),
                &key,
                (&req, &bytes),
                None,
                Duration::from_secs(state.max_wait_secs),
                |claim| async move {
                    answer_or_fail(
                        holds::place_claimed(pool, &claim, request.seat_id, policy, answer).await,
                    )
                },
            )
            .await
            .map(|done| answered(&req, done))
            .map_err(Problem::from)
        }
        None => place_unkeyed(&state, &buyer, request.seat_id).await,
    };
    seats::holds_may_have_changed(&state, &buyer.0, &answered).await;
    answered
}

/// Every unkeyed hold is a new intent: limited like a new key.
async fn place_unkeyed(
    state: &AppState,
    buyer: &Buyer,
    seat_id: i64,
) -> Result<HttpResponse, Problem> {
    state
        .limit
        .take(buyer.0.as_str())
        .map_err(|retry_after| Problem::RateLimited { retry_after })?;
    let client = state.route.slot_pool(slot_of(seat_id)).get().await?;
    let hold = holds::place(&client, buyer.0.as_str(), seat_id, state.holds).await?;
    Ok(idempotency::actix::response_of(&answer(&hold), false))
}

/// How a hold is answered: 201 with the hold.
fn answer(hold: &Hold) -> StoredResponse {
    // Serializing numbers and a string cannot fail.
    StoredResponse::new(
        201,
        "application/json",
        serde_json::to_vec(hold).unwrap_or_default(),
    )
}

/// The buyer's own, unordered holds only.
#[utoipa::path(
    operation_id = "release_hold",
    tag = "holds",
    summary = "Give a held seat back",
    description = "Deletes one of the buyer's own holds that is in no order, so that its seat is \
        available again. An unknown hold, another buyer's, or one in an order is 404 alike: a \
        hold id tells nobody else anything.",
    params(("hold_id" = i64, Path, description = "The hold's id")),
    security(("bearer" = [])),
    responses((status = 204, description = "Released"))
)]
#[delete("/holds/{hold_id}")]
pub async fn release(
    state: web::Data<AppState>,
    buyer: Buyer,
    hold_id: web::Path<String>,
) -> Result<HttpResponse, Problem> {
    let not_found = || Problem::NotFound("there is no such hold of yours that can be released");
    let hold_id: i64 = hold_id.parse().map_err(|_| not_found())?;
    let client = state.route.slot_pool(slot_of(hold_id)).get().await?;
    let released = holds::release(&client, buyer.0.as_str(), hold_id).await?;
    drop(client);
    if !released {
        return Err(not_found());
    }
    let answered = Ok(HttpResponse::NoContent().finish());
    seats::holds_may_have_changed(&state, &buyer.0, &answered).await;
    answered
}
