//! Every outcome of a keyed request (first, replay, 409 in progress, 422
//! reused, and their order of precedence), against the real table.

use std::time::Duration;

use serde_json::json;

use crate::helpers::{new_key, order_body, spawn_app, spawn_app_with, Seen};
use crate::invariants::assert_invariants;

#[tokio::test]
async fn a_retry_with_the_same_key_replays_the_first_answer_byte_for_byte() {
    let app = spawn_app().await;
    let seats = app.seed("show", 1, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    let key = new_key();

    let first = Seen::of(app.post_order("alice", &key, &[hold], "pm_card_visa").await).await;
    assert_eq!(first.status, 201);
    assert!(!first.replayed);
    for _ in 0..3 {
        let again = Seen::of(app.post_order("alice", &key, &[hold], "pm_card_visa").await).await;
        assert!(again.replayed, "Idempotent-Replayed: true");
        assert_eq!(again.status, first.status);
        assert_eq!(again.body, first.body, "the same bytes");
        assert_eq!(again.location, first.location);
        assert_eq!(again.content_type, first.content_type);
    }
    let ledger = app.charges().await;
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0]["requests"], 1, "replays never reach Payrail");
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);
    assert_invariants(&app).await;
}

#[tokio::test]
async fn the_same_key_with_another_body_is_422_key_reused() {
    let app = spawn_app().await;
    let seats = app.seed("show", 2, 2500).await;
    let (a, b) = (
        app.hold("alice", seats[0]).await,
        app.hold("alice", seats[1]).await,
    );
    let key = new_key();
    assert_eq!(
        app.post_order("alice", &key, &[a], "pm_card_visa")
            .await
            .status(),
        201
    );

    let other_body = Seen::of(app.post_order("alice", &key, &[b], "pm_card_visa").await).await;
    assert_eq!(other_body.status, 422);
    assert_eq!(other_body.problem(), "idempotency-key-reused");
    assert!(!other_body.replayed);

    // Whitespace makes other bytes: another request.
    let spaced = format!("{} ", order_body(&[a], "pm_card_visa"));
    let seen = Seen::of(app.post_order_raw("alice", &key, &spaced).await).await;
    assert_eq!(seen.problem(), "idempotency-key-reused");

    // The key of an order sent to another endpoint is another request too.
    let seen = Seen::of(app.post_hold("alice", seats[1], Some(&key)).await).await;
    assert_eq!(seen.status, 422);
    assert_eq!(seen.problem(), "idempotency-key-reused");
    assert_eq!(app.charges().await.len(), 1);
    assert_invariants(&app).await;
}

#[tokio::test]
async fn a_hold_key_reused_for_an_order_is_422() {
    let app = spawn_app().await;
    let seats = app.seed("show", 1, 2500).await;
    let key = new_key();
    let hold = Seen::of(app.post_hold("alice", seats[0], Some(&key)).await).await;
    let hold_id = hold.json()["hold_id"].as_i64().unwrap();
    let seen = Seen::of(
        app.post_order("alice", &key, &[hold_id], "pm_card_visa")
            .await,
    )
    .await;
    assert_eq!(seen.status, 422);
    assert_eq!(seen.problem(), "idempotency-key-reused");
    assert!(app.charges().await.is_empty());
}

#[tokio::test]
async fn a_request_still_in_progress_is_409_with_retry_after_and_its_orders_location() {
    let app = spawn_app_with(|s| s.payrail.timeout_ms = 5_000).await;
    let seats = app.seed("show", 1, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    app.set_faults(json!({"latency_ms": 1_500})).await;
    let key = new_key();

    let first = {
        let request = app
            .as_buyer(app.http.post(app.url("/orders")), "alice")
            .header("Idempotency-Key", key.clone())
            .body(order_body(&[hold], "pm_card_visa"));
        tokio::spawn(async move { Seen::of(request.send().await.unwrap()).await })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    let during = Seen::of(app.post_order("alice", &key, &[hold], "pm_card_visa").await).await;
    assert_eq!(during.status, 409);
    assert_eq!(during.problem(), "request-in-progress");
    assert_eq!(during.retry_after.as_deref(), Some("1"));
    // The click's order exists, waiting for Payrail: the 409 points at it.
    let location = during.location.clone().expect("the order's Location");
    let order_id = location
        .strip_prefix("/orders/")
        .expect("/orders/{order_id}");
    let pending: serde_json::Value = app.get_order("alice", order_id).await.json().await.unwrap();
    assert_eq!(pending["status"], "payment_pending");

    // The hash check comes first: another body is 422 even while in progress.
    let other = Seen::of(
        app.post_order("alice", &key, &[hold + 1], "pm_card_visa")
            .await,
    )
    .await;
    assert_eq!(other.problem(), "idempotency-key-reused");

    let first = first.await.unwrap();
    assert_eq!(first.status, 201);
    assert_eq!(first.location.as_deref(), Some(location.as_str()));
    let after = Seen::of(app.post_order("alice", &key, &[hold], "pm_card_visa").await).await;
    assert!(after.replayed);
    assert_eq!(after.body, first.body);
    assert_eq!(app.charges().await.len(), 1);
    assert_invariants(&app).await;
}

#[tokio::test]
async fn a_declined_card_replays_as_the_same_402_without_a_second_attempt() {
    let app = spawn_app().await;
    let seats = app.seed("show", 1, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    let key = new_key();
    let first = Seen::of(
        app.post_order("alice", &key, &[hold], "pm_card_declined")
            .await,
    )
    .await;
    assert_eq!(first.status, 402);
    assert_eq!(first.problem(), "payment-declined");
    let again = Seen::of(
        app.post_order("alice", &key, &[hold], "pm_card_declined")
            .await,
    )
    .await;
    assert_eq!((again.status, again.replayed), (402, true));
    assert_eq!(again.body, first.body);
    assert_eq!(again.content_type, first.content_type);
    let ledger = app.charges().await;
    assert_eq!(ledger.len(), 1);
    assert_eq!(ledger[0]["requests"], 1);
    assert_invariants(&app).await;
}

#[tokio::test]
async fn a_conflict_answer_is_stored_and_replayed_too() {
    let app = spawn_app().await;
    let seats = app.seed("show", 1, 2500).await;
    let bobs = app.hold("bob", seats[0]).await;
    let key = new_key();
    let first = Seen::of(app.post_order("alice", &key, &[bobs], "pm_card_visa").await).await;
    assert_eq!(first.problem(), "hold-unavailable");
    let again = Seen::of(app.post_order("alice", &key, &[bobs], "pm_card_visa").await).await;
    assert_eq!((again.status, again.replayed), (409, true));
    assert_eq!(again.body, first.body);
}

#[tokio::test]
async fn keys_are_scoped_per_buyer() {
    let app = spawn_app().await;
    let seats = app.seed("show", 3, 2500).await;
    let key = &new_key();

    let alices = Seen::of(app.post_hold("alice", seats[0], Some(key)).await).await;
    assert_eq!(alices.status, 201);
    // Bob's identical request with the same key is his own new intent: not
    // a replay of alice's answer, and not a reuse.
    let bobs = Seen::of(app.post_hold("bob", seats[0], Some(key)).await).await;
    assert_eq!(bobs.status, 409);
    assert_eq!(bobs.problem(), "seat-unavailable");
    assert!(!bobs.replayed);

    let bob_hold = app.hold("bob", seats[1]).await;
    let order_key = &new_key();
    let alice_hold = app.hold("alice", seats[2]).await;
    assert_eq!(
        app.post_order("alice", order_key, &[alice_hold], "pm_card_visa")
            .await
            .status(),
        201
    );
    let seen = Seen::of(
        app.post_order("bob", order_key, &[bob_hold], "pm_card_visa")
            .await,
    )
    .await;
    assert_eq!((seen.status, seen.replayed), (201, false));
    assert_eq!(app.charges().await.len(), 2);
    assert_invariants(&app).await;
}

#[tokio::test]
async fn the_quoted_structured_field_form_is_the_same_key() {
    let app = spawn_app().await;
    let seats = app.seed("show", 1, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    let key = new_key();
    let first = Seen::of(app.post_order("alice", &key, &[hold], "pm_card_visa").await).await;
    let quoted = format!("\"{key}\"");
    let quoted = Seen::of(
        app.post_order("alice", &quoted, &[hold], "pm_card_visa")
            .await,
    )
    .await;
    assert!(quoted.replayed);
    assert_eq!(quoted.body, first.body);
}

#[tokio::test]
async fn a_keyed_hold_replays_and_an_unkeyed_one_does_not() {
    let app = spawn_app().await;
    let seats = app.seed("show", 1, 2500).await;
    let key = new_key();
    let first = Seen::of(app.post_hold("alice", seats[0], Some(&key)).await).await;
    let again = Seen::of(app.post_hold("alice", seats[0], Some(&key)).await).await;
    assert_eq!(
        (first.status, again.status, again.replayed),
        (201, 201, true)
    );
    assert_eq!(again.body, first.body);
    let unkeyed = Seen::of(app.post_hold("alice", seats[0], None).await).await;
    assert_eq!(unkeyed.problem(), "seat-unavailable");
    assert_eq!(app.count("SELECT count(*) FROM holds").await, 1);
}
