//! The invariants (docs/DESIGN.md, "What always holds"), checked at the end of tests
//! by the same checker as the chaos run (`test_support::invariants`), against
//! the test's database and the sandbox's ledger (the truth about charges).

use test_support::invariants;
use test_support::receiver::Received;

use crate::helpers::{new_key, spawn_app, Seen, TestApp};

/// Panics with every violation found, each naming the rows involved.
pub async fn assert_invariants(app: &TestApp) {
    let db = app.db.client().await;
    let ledger = app.charges().await;
    let violations = invariants::violations(&db, &ledger).await;
    assert!(
        violations.is_empty(),
        "invariants violated:\n  {}",
        violations.join("\n  ")
    );
}

/// The checker finds an answered key whose stored answer disagrees with the
/// order its click made, though the key no longer links it: the order names
/// its click's key.
#[tokio::test]
async fn the_checker_finds_an_answer_that_disagrees_with_its_order() {
    let app = spawn_app().await;
    let seats = app.seed("show", 1, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    let key = new_key();
    let paid = Seen::of(app.post_order("alice", &key, &[hold], "pm_card_visa").await).await;
    assert_eq!(paid.status, 201);
    assert_invariants(&app).await;

    let db = app.db.client().await;
    db.execute(
        "UPDATE idempotency_keys SET response_status = 402 WHERE user_id = 'alice' AND key = $1",
        &[&key],
    )
    .await
    .unwrap();
    let violations = invariants::violations(&db, &app.charges().await).await;
    assert!(
        violations.len() == 1 && violations[0].contains(&format!("key alice/{key} stored 402")),
        "{violations:?}"
    );
}

/// The checker finds a settled order without its event, and an event the
/// shop acknowledged that says another state than its order's.
#[tokio::test]
async fn the_checker_finds_a_settled_order_without_its_event_and_an_event_that_disagrees() {
    let app = spawn_app().await;
    let seats = app.seed("show", 1, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    let paid = Seen::of(
        app.post_order("alice", &new_key(), &[hold], "pm_card_visa")
            .await,
    )
    .await;
    assert_eq!(paid.status, 201);
    let db = app.db.client().await;
    let (event_id, order_id): (String, String) = {
        let row = db
            .query_one("SELECT event_id, order_id::text FROM order_events", &[])
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    let acknowledged = |status: &str| Received {
        method: "POST".into(),
        path: "/".into(),
        headers: Default::default(),
        body: serde_json::json!({
            "id": event_id, "type": format!("order.{status}"), "created": 0,
            "data": {"order": {"order_id": order_id, "status": status}, "user_id": "alice"},
        })
        .to_string()
        .into_bytes(),
        answered: Some(200),
        at: std::time::Instant::now(),
    };
    assert!(invariants::events_violations(&db, &[acknowledged("paid")])
        .await
        .is_empty());
    let violations = invariants::events_violations(&db, &[acknowledged("declined")]).await;
    assert_eq!(violations.len(), 1, "{violations:?}");

    db.execute("DELETE FROM order_events", &[]).await.unwrap();
    let violations = invariants::violations(&db, &app.charges().await).await;
    assert!(
        violations.len() == 1
            && violations[0].contains(&format!("paid order {order_id} has event None")),
        "{violations:?}"
    );
}
