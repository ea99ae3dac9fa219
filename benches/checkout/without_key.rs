//! The order flow with the idempotency key left out, for the mirror's
//! `POST /bench/orders-without-key` only: what the service does for a first
//! click (the checks, the holds claim and order insert, the Payrail call,
//! the settlement, the 201 body) minus everything that touches
//! `idempotency_keys`: no key insert, no claim or link in the order
//! statement (below: the domain's, less its key CTEs), no stored answer
//! (the domain's settlement, `record_decision`). The difference in
//! throughput against the keyed `POST /orders` on the same stack is what
//! the key costs.

use deadpool_postgres::Pool;
use idempotency::StoredResponse;
use stagedoor_checkout::checkout::orders::{self, NewOrder, CURRENCY};
use stagedoor_checkout::http;
use stagedoor_checkout::payrail::{self, Charge};
use uuid::Uuid;

/// `orders::place`'s order statement without the engine's `claim` and
/// `linked` CTEs: the buyer's live holds locked in id order and claimed, and
/// the order written, all or nothing.
const CREATE: &str = "WITH held AS (
         SELECT h.hold_id, s.label, s.price_cents
         FROM holds h JOIN seats s ON s.seat_id = h.seat_id
         WHERE h.hold_id = ANY ($2) AND h.user_id = $3
           AND h.order_id IS NULL AND h.expires_at > now()
         ORDER BY h.hold_id
         FOR UPDATE OF h
     ), decision AS (
         SELECT (SELECT count(*) FROM held) = cardinality($2::bigint[]) AS all_held
     ), claimed AS (
         UPDATE holds SET order_id = $1
         WHERE hold_id IN (SELECT hold_id FROM held) AND (SELECT all_held FROM decision)
     ), inserted AS (
         INSERT INTO orders (order_id, user_id, status, amount_cents, currency,
                             payment_method, hold_ids, seats, idempotency_key)
         SELECT $1, $3, 'payment_pending', sum(price_cents)::bigint, $4, $5, $2,
                array_agg(label ORDER BY array_position($2, hold_id)), ''
         FROM held
         HAVING (SELECT all_held FROM decision)
         RETURNING amount_cents
     )
     SELECT d.all_held, i.amount_cents FROM decision d LEFT JOIN inserted i ON true";

/// Makes, charges and settles an order for `user_id`'s holds: the answer
/// a first click would get, or why not.
pub async fn place(
    pool: &Pool,
    payrail: &payrail::Client,
    user_id: &str,
    hold_ids: Vec<i64>,
    payment_method: &str,
) -> Result<StoredResponse, String> {
    NewOrder::parse(hold_ids.clone(), payment_method).map_err(|e| e.to_string())?;
    payrail.ready(user_id).map_err(|e| e.to_string())?;
    let order_id = Uuid::new_v4();
    let row = {
        let client = pool.get().await.map_err(|e| e.to_string())?;
        let statement = client
            .prepare_cached(CREATE)
            .await
            .map_err(|e| e.to_string())?;
        client
            .query_one(
                &statement,
                &[&order_id, &hold_ids, &user_id, &CURRENCY, &payment_method],
            )
            .await
            .map_err(|e| e.to_string())?
    };
    if !row.get::<_, bool>("all_held") {
        return Err("a hold is unavailable".into());
    }
    let charge = Charge {
        amount_cents: row.get("amount_cents"),
        currency: CURRENCY.to_owned(),
        payment_method: payment_method.to_owned(),
        reference: order_id,
    };
    let outcome = payrail
        .charge(user_id, order_id, &charge)
        .await
        .map_err(|e| e.to_string())?;
    let client = pool.get().await.map_err(|e| e.to_string())?;
    let settled = orders::record_decision(&client, user_id, order_id, &outcome)
        .await
        .map_err(|e| e.to_string())?
        .ok_or("settled twice")?;
    Ok(http::order_answer(&settled))
}
