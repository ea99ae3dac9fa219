//! The checker of SPEC §9, run at the end of tests against the database and
//! the sandbox's ledger (the truth about charges). Each violation names the
//! rows involved.

use std::collections::HashMap;

use serde_json::Value;

use crate::helpers::TestApp;

/// Panics with every violation found.
pub async fn assert_invariants(app: &TestApp) {
    let violations = violations(app).await;
    assert!(
        violations.is_empty(),
        "SPEC §9 violations:\n  {}",
        violations.join("\n  ")
    );
}

pub async fn violations(app: &TestApp) -> Vec<String> {
    let db = app.db.client().await;
    let ledger = app.charges().await;
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

    // Every charge key is `order-{order_id}` and Payrail decided it once.
    let orders: HashMap<String, String> = db
        .query("SELECT order_id::text, status FROM orders", &[])
        .await
        .expect("orders")
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    let mut charged: HashMap<String, usize> = HashMap::new();
    for charge in &ledger {
        let key = charge["idempotency_key"].as_str().unwrap_or_default();
        let Some(order_id) = key.strip_prefix("order-") else {
            found.push(format!("charge with a foreign key: {charge}"));
            continue;
        };
        *charged.entry(order_id.to_owned()).or_default() += 1;
        // 2. Every succeeded charge belongs to exactly one order, which is paid.
        let status = charge["status"].as_str().unwrap_or_default();
        match (status, orders.get(order_id).map(String::as_str)) {
            (_, None) => found.push(format!("charge without an order: {charge}")),
            ("succeeded", Some("paid")) | ("declined", Some("declined")) => {}
            (_, Some(order_status)) => found.push(format!(
                "charge {status} but order {order_id} is {order_status}: {charge}"
            )),
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
    // No paid order lacks a succeeded charge.
    for (order_id, status) in &orders {
        let succeeded = ledger.iter().any(|c: &Value| {
            c["idempotency_key"].as_str() == Some(&format!("order-{order_id}"))
                && c["status"] == "succeeded"
        });
        if status == "paid" && !succeeded {
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

    // A stored answer of an order's key agrees with the order it made.
    for row in db
        .query(
            "SELECT k.key, k.response_status, o.order_id::text, o.status
             FROM idempotency_keys k JOIN orders o ON o.order_id = k.order_id
             WHERE k.response_status IS NOT NULL",
            &[],
        )
        .await
        .expect("keys")
    {
        let (key, code, order_id, status): (String, i16, String, String) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        let agrees = matches!((code, status.as_str()), (201, "paid") | (402, "declined"));
        if !agrees {
            found.push(format!(
                "key {key} stored {code} but order {order_id} is {status}"
            ));
        }
    }
    found
}
