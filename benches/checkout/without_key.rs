//! The order flow with the idempotency key left out, for the mirror's
//! `POST /bench/orders-without-key` only: what the service runs for a first
//! click (the checks, the holds claim and order insert, the Payrail call,
//! the settlement, the 201 body) minus everything that touches
//! `idempotency_keys` (no key insert, no link, no stored answer, so no
//! transaction around either step). The difference in throughput against
//! the keyed `POST /orders` on the same stack is what the key costs.

use deadpool_postgres::Pool;
use serde_json::json;
use stagedoor_checkout::checkout::orders::{NewOrder, CURRENCY};
use stagedoor_checkout::payrail::{self, Charge, ChargeOutcome};
use uuid::Uuid;

/// The service's order statement without its key: the buyer's live holds
/// locked in id order and claimed, and the order written, all or nothing.
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
         WHERE hold_id IN (SELECT hold_id FROM held)
           AND (SELECT all_held FROM decision)
     ), inserted AS (
         INSERT INTO orders (order_id, user_id, status, amount_cents, currency,
                             payment_method, hold_ids, seats, idempotency_key)
         SELECT $1, $3, 'payment_pending', sum(price_cents)::bigint, $4, $5, $2,
                array_agg(label ORDER BY array_position($2, hold_id)), ''
         FROM held
         HAVING (SELECT all_held FROM decision)
         RETURNING created_at, amount_cents, seats
     )
     SELECT d.all_held, i.created_at, i.amount_cents, i.seats
     FROM decision d LEFT JOIN inserted i ON true";

/// The service's settlement without its key.
const SETTLE: &str = "WITH settled AS (
         UPDATE orders SET status = $2, charge_id = $3, updated_at = now()
         WHERE order_id = $1 AND status = 'payment_pending'
         RETURNING order_id, status, amount_cents, currency, hold_ids, seats, charge_id,
                   created_at
     ), released AS (
         UPDATE holds SET order_id = NULL
         WHERE order_id = $1 AND $2 = 'declined' AND EXISTS (SELECT 1 FROM settled)
     )
     SELECT order_id, status, amount_cents, currency, hold_ids, seats, charge_id,
            to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"') AS created_at
     FROM settled";

/// Makes, charges and settles an order for `user_id`'s holds: the status
/// and body a first click would get, or why not.
pub async fn place(
    pool: &Pool,
    payrail: &payrail::Client,
    user_id: &str,
    hold_ids: Vec<i64>,
    payment_method: &str,
) -> Result<(u16, Vec<u8>), String> {
    NewOrder::parse(hold_ids.clone(), payment_method).map_err(|e| e.to_string())?;
    payrail.ready().map_err(|e| e.to_string())?;
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
        return Ok((409, b"hold-unavailable".to_vec()));
    }
    let charge = Charge {
        amount_cents: row.get("amount_cents"),
        currency: CURRENCY.to_owned(),
        payment_method: payment_method.to_owned(),
        reference: order_id,
    };
    let (status, charge_id) = match payrail
        .charge(order_id, &charge)
        .await
        .map_err(|e| e.to_string())?
    {
        ChargeOutcome::Succeeded { charge_id } => ("paid", Some(charge_id)),
        ChargeOutcome::Declined { charge_id } => ("declined", charge_id),
    };
    let client = pool.get().await.map_err(|e| e.to_string())?;
    let statement = client
        .prepare_cached(SETTLE)
        .await
        .map_err(|e| e.to_string())?;
    let row = client
        .query_one(&statement, &[&order_id, &status, &charge_id])
        .await
        .map_err(|e| e.to_string())?;
    let body = json!({
        "order_id": row.get::<_, Uuid>("order_id"),
        "status": row.get::<_, String>("status"),
        "amount_cents": row.get::<_, i64>("amount_cents"),
        "currency": row.get::<_, String>("currency"),
        "hold_ids": row.get::<_, Vec<i64>>("hold_ids"),
        "seats": row.get::<_, Vec<String>>("seats"),
        "charge_id": row.get::<_, Option<String>>("charge_id"),
        "created_at": row.get::<_, String>("created_at"),
    });
    Ok((201, serde_json::to_vec(&body).unwrap_or_default()))
}
