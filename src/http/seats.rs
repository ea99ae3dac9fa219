use actix_web::{web, HttpResponse};

use super::{AppState, Buyer};
use crate::checkout::seats;
use crate::problem::Problem;

/// `GET /events/{event_id}/seats`
pub async fn seat_map(
    state: web::Data<AppState>,
    _buyer: Buyer,
    event_id: web::Path<String>,
) -> Result<HttpResponse, Problem> {
    let client = state.pool.get().await?;
    let map = seats::seat_map(&client, &event_id)
        .await?
        .ok_or(Problem::NotFound("there is no event with this id"))?;
    Ok(HttpResponse::Ok().json(map))
}
