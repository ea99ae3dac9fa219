//! The checker of the invariants (docs/DESIGN.md, "What always holds") against the
//! two sources of truth: the service's database and Payrail's ledger
//! ([`crate::sandbox::ledger`], `GET /v1/sandbox/charges`). It needs
//! nothing but a `tokio_postgres::Client` and the ledger's JSON, so the API
//! tests end with it and the chaos run checks with it. Each violation names
//! the rows involved.
//!
//! Checked: one order per key (1); every charge belongs to exactly one
//! order of its key, with the same amount, charged once, and a succeeded
//! charge's order is paid, a declined charge's order declined (or failed:
//! canceled after Payrail declined unheard), a refunded charge's order
//! failed, so that no failed order keeps a succeeded charge (2, so run it
//! after reconciliation has settled what it can); no paid order without a
//! succeeded charge; no seat in two live holds or orders (5); a paid order
//! owns all its holds and a declined or failed one none; and every answer
//! stored on an order's key agrees with that order, headers included; every
//! settled order has exactly one event, of its state, and no pending order
//! has one; and ([`events_violations`]) every event a shop's receiver
//! acknowledged is that event of a settled order in the same state. Replays are
//! compared byte for byte where they are received (the tests' and the chaos
//! load's own checks).
//!
//! Every statement it runs, and every column it reads, is in [`sql`] at the
//! end of this file: when the service's schema changes, that is the one
//! place to change.

use std::collections::HashMap;

use serde_json::Value;

use self::sql::{EventRow, OrderRow, StoredAnswerRow};
use crate::receiver::Received;

/// Every violation found, each naming the rows involved; empty when all
/// holds.
pub async fn violations(db: &tokio_postgres::Client, ledger: &[Value]) -> Vec<String> {
    let mut found = Vec::new();

    // 1. For every key: at most one order (and so at most one charge key).
    for (user, key, orders) in sql::keys_with_several_orders(db).await {
        found.push(format!("key {user}/{key} made several orders: {orders:?}"));
    }

    // 2. Every charge key is `order-{order_id}` of an order, decided once,
    // and the order agrees with Payrail's decision.
    let orders: HashMap<String, OrderRow> = sql::orders(db)
        .await
        .into_iter()
        .map(|order| (order.order_id.clone(), order))
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
        match orders.get(order_id) {
            None => found.push(format!("charge without an order: {charge}")),
            Some(order) => {
                let order_status = order.status.as_str();
                if !matches!(
                    (status, order_status),
                    ("succeeded", "paid")
                        | ("declined", "declined" | "failed")
                        | ("refunded", "failed")
                ) {
                    found.push(format!(
                        "charge {status} but order {order_id} is {order_status}: {charge}"
                    ));
                }
                if charge["amount_cents"].as_i64() != Some(order.amount_cents) {
                    found.push(format!(
                        "charge amount differs from order {order_id}'s {}: {charge}",
                        order.amount_cents
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
    for (order_id, order) in &orders {
        if order.status == "paid" && !succeeded.contains_key(order_id.as_str()) {
            found.push(format!(
                "order {order_id} is paid without a succeeded charge"
            ));
        }
    }

    // 5. No seat in two live holds or two orders.
    for (seat, a, b) in sql::seats_held_twice(db).await {
        found.push(format!("seat {seat} is in holds {a} and {b} at once"));
    }

    // A paid or pending order owns every hold it names; a declined or
    // failed one gave them all back; a hold is sold exactly when its order
    // is paid. Matched here: the orders are the buyers' rows and the holds
    // the events', distributed apart on a cluster.
    let holds: HashMap<i64, (Option<String>, bool)> = sql::holds(db)
        .await
        .into_iter()
        .map(|(hold, owner, sold)| (hold, (owner, sold)))
        .collect();
    for (order_id, status, named) in sql::orders_holds(db).await {
        let owning = matches!(status.as_str(), "paid" | "payment_pending");
        for hold in named {
            let (owner, sold) = holds.get(&hold).cloned().unwrap_or((None, false));
            let owned = owner.as_deref() == Some(order_id.as_str());
            if owned != owning || (owned && sold != (status == "paid")) {
                found.push(format!(
                    "{status} order {order_id} names hold {hold}, which belongs to order \
                     {owner:?} (sold: {sold})"
                ));
            }
        }
    }

    // A stored answer of an order's key agrees with the order it made: a
    // 201 naming it in `Location`, or a 402 problem naming nothing (a
    // decline, or a payment that failed).
    for row in sql::stored_answers_of_orders(db).await {
        let StoredAnswerRow {
            user,
            key,
            code,
            problem,
            located,
            order_id,
            status,
            names_the_order,
        } = row;
        if !names_the_order
            || !matches!(
                (code, problem, located, status.as_str()),
                (201, false, true, "paid") | (402, true, false, "declined" | "failed")
            )
        {
            found.push(format!(
                "key {user}/{key} stored {code} (problem {problem}, Location {located}) \
                 but order {order_id} is {status}"
            ));
        }
    }

    // Every settled order has its one event (the key allows no second),
    // of its state; a pending order has none.
    for (order_id, status, event) in sql::orders_without_their_event(db).await {
        found.push(format!(
            "{status} order {order_id} has event {event:?} (a settled order has one event \
             of its state, a pending one none)"
        ));
    }
    found
}

/// What the shop's receiver acknowledged (answered 2xx), checked against
/// the outbox: each is the one event of a settled order, with that event's
/// id and type, and says the order as it is; an order's every delivery
/// carries the same id.
pub async fn events_violations(db: &tokio_postgres::Client, received: &[Received]) -> Vec<String> {
    let events: HashMap<String, EventRow> = sql::events(db)
        .await
        .into_iter()
        .map(|event| (event.order_id.clone(), event))
        .collect();
    let mut found = Vec::new();
    for delivery in received.iter().filter(|r| r.acknowledged()) {
        let body = delivery.json();
        let (id, kind) = (body["id"].as_str(), body["type"].as_str());
        let order = &body["data"]["order"];
        let order_id = order["order_id"].as_str().unwrap_or_default();
        match events.get(order_id) {
            None => found.push(format!("acknowledged an event of no order's: {body}")),
            Some(event) => {
                let said = order["status"].as_str().unwrap_or_default();
                if id != Some(event.event_id.as_str())
                    || kind != Some(event.kind.as_str())
                    || format!("order.{said}") != event.kind
                    || event.order_status != said
                    || body["data"]["user_id"].as_str() != Some(event.user_id.as_str())
                {
                    found.push(format!(
                        "acknowledged {body}, but order {order_id} of {} is {} with event {} {}",
                        event.user_id, event.order_status, event.event_id, event.kind
                    ));
                }
            }
        }
    }
    found
}

/// THE SQL OF THE CHECKER: every statement it runs against the service's
/// tables (`orders`, `holds`, `idempotency_keys`, `order_events`) and every column it reads
/// back, and nothing else. A change to those tables' columns is adapted
/// here; the checks above see only the rows returned.
pub mod sql {
    use tokio_postgres::Row;

    /// Every row of `sql`, each made into a `T` by `row`.
    async fn rows<T>(db: &tokio_postgres::Client, sql: &str, row: impl Fn(&Row) -> T) -> Vec<T> {
        db.query(sql, &[])
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"))
            .iter()
            .map(row)
            .collect()
    }

    /// Keys with more than one order: (user, key, order ids).
    pub async fn keys_with_several_orders(
        db: &tokio_postgres::Client,
    ) -> Vec<(String, String, Vec<String>)> {
        let sql = "SELECT user_id, idempotency_key, array_agg(order_id::text)
                   FROM orders GROUP BY 1, 2 HAVING count(*) > 1";
        rows(db, sql, |row| (row.get(0), row.get(1), row.get(2))).await
    }

    pub struct OrderRow {
        pub order_id: String,
        pub status: String,
        pub amount_cents: i64,
    }

    /// Every order.
    pub async fn orders(db: &tokio_postgres::Client) -> Vec<OrderRow> {
        let sql = "SELECT order_id::text, status, amount_cents FROM orders";
        rows(db, sql, |row| OrderRow {
            order_id: row.get(0),
            status: row.get(1),
            amount_cents: row.get(2),
        })
        .await
    }

    /// Pairs of live holds (or orders) of one seat: (seat, hold, hold).
    pub async fn seats_held_twice(db: &tokio_postgres::Client) -> Vec<(i64, i64, i64)> {
        let sql = "SELECT a.seat_id, a.hold_id, b.hold_id FROM holds a JOIN holds b
                     ON a.slot = b.slot AND a.seat_id = b.seat_id AND a.hold_id < b.hold_id
                   WHERE (a.order_id IS NOT NULL OR a.expires_at > now())
                     AND (b.order_id IS NOT NULL OR b.expires_at > now())";
        rows(db, sql, |row| (row.get(0), row.get(1), row.get(2))).await
    }

    /// Every order's status and the holds it names: (order, status, holds).
    pub async fn orders_holds(db: &tokio_postgres::Client) -> Vec<(String, String, Vec<i64>)> {
        let sql = "SELECT order_id::text, status, hold_ids FROM orders";
        rows(db, sql, |row| (row.get(0), row.get(1), row.get(2))).await
    }

    /// Every hold, its order and whether it is sold: (hold, order, sold).
    pub async fn holds(db: &tokio_postgres::Client) -> Vec<(i64, Option<String>, bool)> {
        let sql = "SELECT hold_id, order_id::text, sold FROM holds";
        rows(db, sql, |row| (row.get(0), row.get(1), row.get(2))).await
    }

    /// An answer stored on a key that made an order, with that order.
    pub struct StoredAnswerRow {
        pub user: String,
        pub key: String,
        /// The stored status.
        pub code: i16,
        /// The stored answer is a problem (`application/problem+json`).
        pub problem: bool,
        /// The stored answer has a `Location`.
        pub located: bool,
        /// ...and if it has one, it names this order.
        pub names_the_order: bool,
        pub order_id: String,
        /// The order's status.
        pub status: String,
    }

    /// The key table: its stored answers, joined to the orders they made.
    /// An answered key keeps no link to its order: the order names its
    /// click's key, and one made before the key row belongs to an earlier
    /// intent of a key restarted past its TTL.
    pub async fn stored_answers_of_orders(db: &tokio_postgres::Client) -> Vec<StoredAnswerRow> {
        let sql = "SELECT k.user_id, k.key, k.response_status,
                          k.response_content_type = 'application/problem+json',
                          k.response_location IS NOT NULL,
                          o.order_id::text, o.status,
                          coalesce(k.response_location, '/orders/' || o.order_id::text)
                              = '/orders/' || o.order_id::text
                   FROM idempotency_keys k
                   JOIN orders o ON o.user_id = k.user_id AND o.idempotency_key = k.key
                                    AND o.created_at >= k.created_at
                   WHERE k.response_status IS NOT NULL";
        rows(db, sql, |row| StoredAnswerRow {
            user: row.get(0),
            key: row.get(1),
            code: row.get(2),
            problem: row.get(3),
            located: row.get(4),
            order_id: row.get(5),
            status: row.get(6),
            names_the_order: row.get(7),
        })
        .await
    }

    /// Orders whose event is not what their state says: a settled one
    /// without its event or with one of another type, a pending one with
    /// one: (order, status, the event's type).
    pub async fn orders_without_their_event(
        db: &tokio_postgres::Client,
    ) -> Vec<(String, String, Option<String>)> {
        let sql = "SELECT o.order_id::text, o.status, e.type
                   FROM orders o
                   LEFT JOIN order_events e ON e.user_id = o.user_id AND e.order_id = o.order_id
                   WHERE (o.status = 'payment_pending') <> (e.order_id IS NULL)
                      OR e.type <> 'order.' || o.status";
        rows(db, sql, |row| (row.get(0), row.get(1), row.get(2))).await
    }

    /// An order's event, with the order's status.
    pub struct EventRow {
        pub user_id: String,
        pub order_id: String,
        pub event_id: String,
        pub kind: String,
        pub order_status: String,
    }

    /// Every event, with its order's status.
    pub async fn events(db: &tokio_postgres::Client) -> Vec<EventRow> {
        let sql = "SELECT e.user_id, e.order_id::text, e.event_id, e.type, o.status
                   FROM order_events e
                   JOIN orders o ON o.user_id = e.user_id AND o.order_id = e.order_id";
        rows(db, sql, |row| EventRow {
            user_id: row.get(0),
            order_id: row.get(1),
            event_id: row.get(2),
            kind: row.get(3),
            order_status: row.get(4),
        })
        .await
    }
}
