//! The order flow with the idempotency key left out, for the mirror's
//! `POST /bench/orders-without-key` only: what the service does for a first
//! click (the checks, the holds claim and order insert, the Payrail call,
//! the settlement, the 201 body) minus everything that touches
//! `idempotency_keys`: the order step's key-less core
//! (`checkout_make_order`, which the keyed `checkout_place_order` calls
//! after the claim) and the domain's settlement (`record_decision`), with
//! no claim, no link and no stored answer. The difference in throughput
//! against the keyed `POST /orders` on the same stack is what the key
//! costs.

use deadpool_postgres::Pool;
use idempotency::StoredResponse;
use stagedoor_checkout::checkout::orders::{self, click, NewOrder, CURRENCY};

use stagedoor_checkout::payrail::{self, Charge};
use uuid::Uuid;

/// The order, with no key (migrations/functions/checkout.sql).
const CREATE: &str = "SELECT * FROM checkout_make_order($1, '', $2, $3, $4, $5)";

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
                &[&user_id, &order_id, &hold_ids, &CURRENCY, &payment_method],
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
    Ok(click::answer(&settled))
}
