//! The order flow with the idempotency key left out, for the mirror's
//! `POST /bench/orders-without-key` only: what the service does for a first
//! click (the checks, the holds claim and order insert, the Payrail call,
//! the settlement, the 201 body), with the domain's own statements, minus
//! everything that touches `idempotency_keys`: no key insert, no link, no
//! stored answer, so no transaction around either step. The difference in
//! throughput against the keyed `POST /orders` on the same stack is what
//! the key costs.

use deadpool_postgres::Pool;
use idempotency::StoredResponse;
use stagedoor_checkout::checkout::orders::{self, NewOrder};
use stagedoor_checkout::http;
use stagedoor_checkout::payrail;
use uuid::Uuid;

/// Makes, charges and settles an order for `user_id`'s holds: the answer
/// a first click would get, or why not.
pub async fn place(
    pool: &Pool,
    payrail: &payrail::Client,
    user_id: &str,
    hold_ids: Vec<i64>,
    payment_method: &str,
) -> Result<StoredResponse, String> {
    let request = NewOrder::parse(hold_ids, payment_method).map_err(|e| e.to_string())?;
    payrail.ready().map_err(|e| e.to_string())?;
    let order_id = Uuid::new_v4();
    let order = {
        let client = pool.get().await.map_err(|e| e.to_string())?;
        orders::insert_pending(&client, order_id, user_id, "", &request)
            .await
            .map_err(|e| e.to_string())?
            .ok_or("a hold is unavailable")?
    };
    let outcome = payrail
        .charge(order_id, &order.charge())
        .await
        .map_err(|e| e.to_string())?;
    let client = pool.get().await.map_err(|e| e.to_string())?;
    let settled = orders::record_decision(&client, order_id, &outcome)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("settled twice")?;
    Ok(http::order_answer(&settled))
}
