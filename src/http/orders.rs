use actix_web::{web, HttpRequest, HttpResponse};
use uuid::Uuid;

use super::{body, idempotent, AppState, Buyer};
use crate::checkout::orders::{self, OrderRequest};
use crate::problem::Problem;

/// `POST /orders`: the Idempotency-Key is required.
pub async fn create(
    state: web::Data<AppState>,
    buyer: Buyer,
    req: HttpRequest,
    payload: web::Payload,
) -> Result<HttpResponse, Problem> {
    let key = idempotent::key(&req)?.ok_or(Problem::KeyMissing)?;
    let bytes = body::read(&req, payload, state.max_body_bytes).await?;
    let request: OrderRequest = body::json(&bytes)?;
    let (pool, payrail, request) = (&state.pool, &state.payrail, &request);
    idempotent::run(&state, &buyer.0, key, &req, &bytes, |claim| async move {
        orders::place(pool, payrail, &claim, request).await
    })
    .await
}

/// `GET /orders/{order_id}`: another buyer's order is 404.
pub async fn show(
    state: web::Data<AppState>,
    buyer: Buyer,
    order_id: web::Path<String>,
) -> Result<HttpResponse, Problem> {
    let not_found = || Problem::NotFound("there is no such order of yours");
    let order_id = Uuid::parse_str(&order_id).map_err(|_| not_found())?;
    let client = state.pool.get().await?;
    let order = orders::find(&client, buyer.0.as_str(), order_id)
        .await?
        .ok_or_else(not_found)?;
    Ok(HttpResponse::Ok().json(order))
}
