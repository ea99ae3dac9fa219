use actix_web::{get, web, HttpResponse};

use super::problem::Problem;
use super::{AppState, Buyer};
use crate::checkout::seats::{self, SeatMap};

#[utoipa::path(
    operation_id = "seat_map",
    tag = "seats",
    summary = "The seat map of an event",
    description = "Every seat of the event, in seat order, with its label, price and status: \
        `available`, `held` (a live hold has it, or an order waiting for its payment) or `sold` \
        (a paid order has it). A seat the caller holds (live, not yet in an order) carries \
        `your_hold`, the hold's id and expiry; every other seat has `null` there. An event \
        that does not exist is 404.",
    params(("event_id" = String, Path, description = "The event's id", example = "demo")),
    security(("bearer" = [])),
    responses(
        (status = 200, description = "Every seat of the event and its status", body = SeatMap),
    )
)]
#[get("/events/{event_id}/seats")]
pub async fn seat_map(
    state: web::Data<AppState>,
    buyer: Buyer,
    event_id: web::Path<String>,
) -> Result<HttpResponse, Problem> {
    let client = state.pool.get().await?;
    let map = seats::seat_map(&client, &event_id, &buyer.0)
        .await?
        .ok_or(Problem::NotFound("there is no event with this id"))?;
    Ok(HttpResponse::Ok().json(map))
}
