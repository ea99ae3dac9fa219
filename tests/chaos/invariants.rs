//! The checker of the invariants (README, "What always holds") against the
//! two sources of truth: the service's database and Payrail's ledger
//! (`GET /v1/sandbox/charges`). It needs nothing but a `tokio_postgres::Client`
//! and the ledger's JSON, so any test binary can include it
//! (`#[path = "…/invariants.rs"] mod invariants;`). Each violation names the
//! rows involved.
//!
//! Checked: one order per key (1); every charge belongs to exactly one
//! order of its key, with the same amount, charged once, and a succeeded
//! charge's order is paid, a declined charge's order declined (2, so run
//! it after reconciliation has settled what it can); no paid order without a
//! succeeded charge; no seat in two live holds or orders (5); a paid
//! order owns all its holds and a declined one none; and every answer stored
//! on an order's key agrees with that order, headers included. Replays are
//! compared byte for byte where they are received (the tests' and the chaos
//! load's own checks).

use std::collections::HashMap;

use serde_json::Value;

pub async fn violations(db: &tokio_postgres::Client, ledger: &[Value]) -> Vec<String> {
    let mut found = Vec::new();

    // 1. For every key: at most one order (and so at most one charge key).
    for row in db
        .query(
            "SELECT user_id, idempotency_key, array_agg(order_id::text)
             FROM orders GROUP BY 1, 2 HAVING count(*) > 1",
            &[],
        )
        .await
        .expect("orders per key")
    {
        let (user, key, orders): (String, String, Vec<String>) =
            (row.get(0), row.get(1), row.get(2));
        found.push(format!("key {user}/{key} made several orders: {orders:?}"));
    }

    // 2. Every charge key is `order-{order_id}` of an order, decided once,
    // and the order agrees with Payrail's decision.
    let orders: HashMap<String, (String, i64)> = db
        .query(
            "SELECT order_id::text, status, amount_cents FROM orders",
            &[],
        )
        .await
        .expect("orders")
        .iter()
        .map(|row| (row.get(0), (row.get(1), row.get(2))))
        .collect();
    let mut charged: HashMap<&str, usize> = HashMap::new();
    let mut succeeded: HashMap<&str, usize> = HashMap::new();
    for charge in ledger {
        let key = charge["idempotency_key"].as_str().unwrap_or_default();
        let Some(order_id) = key.strip_prefix("order-") else {
            found.push(format!("charge with a foreign key: {charge}"));
            continue;
        };
        *charged.entry(order_id).or_default() += 1;
        let status = charge["status"].as_str().unwrap_or_default();
        if status == "succeeded" {
            *succeeded.entry(order_id).or_default() += 1;
        }
        match (status, orders.get(order_id)) {
            (_, None) => found.push(format!("charge without an order: {charge}")),
            (_, Some((order_status, amount))) => {
                if !matches!(
                    (status, order_status.as_str()),
                    ("succeeded", "paid") | ("declined", "declined")
                ) {
                    found.push(format!(
                        "charge {status} but order {order_id} is {order_status}: {charge}"
                    ));
                }
                if charge["amount_cents"].as_i64() != Some(*amount) {
                    found.push(format!(
                        "charge amount differs from order {order_id}'s {amount}: {charge}"
                    ));
                }
            }
        }
        if charge["reference"].as_str() != Some(order_id) {
            found.push(format!("charge reference differs from its key: {charge}"));
        }
    }
    for (order_id, n) in &charged {
        if *n > 1 {
            found.push(format!("order {order_id} was charged {n} times"));
        }
    }
    // Whatever key was used: Payrail was asked to charge one order once.
    let mut per_reference: HashMap<&str, Vec<&str>> = HashMap::new();
    for charge in ledger {
        let reference = charge["reference"].as_str().unwrap_or_default();
        let key = charge["idempotency_key"].as_str().unwrap_or_default();
        per_reference.entry(reference).or_default().push(key);
    }
    for (reference, keys) in per_reference {
        if keys.len() > 1 {
            found.push(format!(
                "order {reference} has {} charges, under keys {keys:?}",
                keys.len()
            ));
        }
    }
    // No paid order lacks a succeeded charge.
    for (order_id, (status, _)) in &orders {
        if status == "paid" && !succeeded.contains_key(order_id.as_str()) {
            found.push(format!(
                "order {order_id} is paid without a succeeded charge"
            ));
        }
    }

    // 5. No seat in two live holds or two orders.
    for row in db
        .query(
            "SELECT a.seat_id, a.hold_id, b.hold_id FROM holds a JOIN holds b
               ON a.seat_id = b.seat_id AND a.hold_id < b.hold_id
             WHERE (a.order_id IS NOT NULL OR a.expires_at > now())
               AND (b.order_id IS NOT NULL OR b.expires_at > now())",
            &[],
        )
        .await
        .expect("seats")
    {
        let (seat, a, b): (i64, i64, i64) = (row.get(0), row.get(1), row.get(2));
        found.push(format!("seat {seat} is in holds {a} and {b} at once"));
    }

    // A paid or pending order owns every hold it names; a declined one gave
    // them all back.
    for row in db
        .query(
            "SELECT o.order_id::text, o.status, h.hold_id, h.order_id::text
             FROM orders o CROSS JOIN LATERAL unnest(o.hold_ids) AS named (hold_id)
             LEFT JOIN holds h ON h.hold_id = named.hold_id
             WHERE (o.status <> 'declined' AND h.order_id IS DISTINCT FROM o.order_id)
                OR (o.status = 'declined' AND h.order_id = o.order_id)",
            &[],
        )
        .await
        .expect("holds of orders")
    {
        let (order_id, status, hold, owner): (String, String, Option<i64>, Option<String>) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        found.push(format!(
            "{status} order {order_id} names hold {hold:?}, which belongs to order {owner:?}"
        ));
    }

    // A stored answer of an order's key agrees with the order it made: a
    // 201 naming it in `Location`, or a 402 problem naming nothing.
    for row in db
        .query(
            "SELECT k.user_id, k.key, k.response_status, k.response_content_type,
                    k.response_location, o.order_id::text, o.status
             FROM idempotency_keys k JOIN orders o ON o.order_id::text = k.effect
             WHERE k.response_status IS NOT NULL",
            &[],
        )
        .await
        .expect("keys")
    {
        let (user, key, order_id): (String, String, String) = (row.get(0), row.get(1), row.get(5));
        let (code, media, location, status): (i16, String, Option<String>, String) =
            (row.get(2), row.get(3), row.get(4), row.get(6));
        let names_the_order = location.as_deref() == Some(format!("/orders/{order_id}").as_str());
        let agrees = match (code, status.as_str()) {
            (201, "paid") => media == "application/json" && names_the_order,
            (402, "declined") => media == "application/problem+json" && location.is_none(),
            _ => false,
        };
        if !agrees {
            found.push(format!(
                "key {user}/{key} stored {code} ({media}, Location {location:?}) \
                 but order {order_id} is {status}"
            ));
        }
    }
    found
}
