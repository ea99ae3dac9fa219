//! A payment Payrail never decides still ends: after
//! `reconcile.give_up_secs` the charge's key is canceled at Payrail and the
//! order is `failed`, its click answered 402 `payment-failed`, its seats
//! free for a new click; a cancel racing a late success ends one way only;
//! and a stuck order does not keep the breaker open for everybody else.

use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::helpers::{new_key, order_body, spawn_app_with, TestApp};
use crate::invariants::assert_invariants;

/// Reconciliation every second, from the first second, giving up after
/// `give_up_secs`; one Payrail attempt per click.
fn quick_give_up(give_up_secs: u64) -> impl FnOnce(&mut stagedoor_checkout::config::Settings) {
    move |s| {
        s.payrail.max_attempts = 1;
        s.reconcile.interval_secs = 1;
        s.reconcile.grace_secs = 0;
        s.reconcile.give_up_secs = give_up_secs;
    }
}

/// Retries the click (same key, same body) until it has a stored answer.
async fn answer_of(app: &TestApp, key: &str, body: &str, within: Duration) -> (u16, Vec<u8>) {
    let deadline = Instant::now() + within;
    loop {
        let response = app
            .as_buyer(app.http.post(app.url("/orders")), "alice")
            .header("Idempotency-Key", key)
            .header("Content-Type", "application/json")
            .header("Prefer", "wait=2")
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        if status < 500 && status != 409 {
            return (status, response.bytes().await.unwrap().to_vec());
        }
        assert!(Instant::now() < deadline, "still {status} after {within:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test]
async fn an_undecided_payment_is_canceled_then_failed_and_its_seat_paid_again() {
    let app = spawn_app_with(quick_give_up(2)).await;
    let seats = app.seed("ev", 1, 1_000).await;
    let hold = app.hold("alice", seats[0]).await;
    let key = new_key();
    let body = order_body(&[hold], "pm_card_error");
    let first = app.post_order_raw("alice", &key, &body).await;
    assert_eq!(first.status(), 503, "Payrail answered 500");

    let (status, failed) = answer_of(&app, &key, &body, Duration::from_secs(20)).await;
    assert_eq!(status, 402);
    let problem: Value = serde_json::from_slice(&failed).unwrap();
    assert_eq!(
        problem["type"],
        "https://stagedoor.example/problems/payment-failed"
    );
    let order_id = problem["order_id"].as_str().unwrap().to_owned();
    let order: Value = app
        .get_order("alice", &order_id)
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(order["status"], "failed");

    // Replayed like a decline, byte for byte.
    let replay = app.post_order_raw("alice", &key, &body).await;
    assert_eq!(replay.status(), 402);
    assert_eq!(replay.headers()["Idempotent-Replayed"], "true");
    assert_eq!(replay.bytes().await.unwrap(), failed);

    assert!(
        app.charges()
            .await
            .iter()
            .all(|c| c["status"] != "succeeded"),
        "no charge succeeded"
    );
    // The hold came back: a new click pays for the same seat.
    let paid = app
        .post_order("alice", &new_key(), &[hold], "pm_card_visa")
        .await;
    assert_eq!(paid.status(), 201);
    let seat_map: Value = app.get_seats("alice", "ev").await.json().await.unwrap();
    assert_eq!(seat_map["seats"][0]["status"], "sold");
    assert_invariants(&app).await;
}

/// Clicks whose Payrail answer comes 2.5 s after the charge, while the
/// service gives up on undecided orders after 2 s: some answers come before
/// reconciliation gives up, some after it canceled. Each ends one way only.
/// (Reconciliation first looks at an order when it is due to give up: an
/// earlier look would ask again and get the slow card's answer at once.)
#[tokio::test]
async fn a_cancel_racing_a_late_success_ends_with_one_outcome_only() {
    let app = spawn_app_with(|s| {
        quick_give_up(2)(s);
        s.reconcile.grace_secs = 2;
        s.payrail.timeout_ms = 10_000;
    })
    .await;
    let seats = app.seed("ev", 8, 1_000).await;
    app.set_faults(json!({"slow_ms": 2_500})).await;
    let mut clicks = Vec::new();
    for (i, seat) in seats.iter().enumerate() {
        let hold = app.hold("alice", *seat).await;
        let key = new_key();
        let body = order_body(&[hold], "pm_card_slow");
        let request = app
            .as_buyer(app.http.post(app.url("/orders")), "alice")
            .header("Idempotency-Key", key.clone())
            .header("Content-Type", "application/json")
            .body(body.clone());
        tokio::time::sleep(Duration::from_millis(150 * i as u64)).await;
        clicks.push((key, body, tokio::spawn(async move { request.send().await })));
    }
    let mut outcomes = Vec::new();
    for (key, body, click) in clicks {
        let _ = click.await.unwrap();
        let (status, answer) = answer_of(&app, &key, &body, Duration::from_secs(30)).await;
        let answer: Value = serde_json::from_slice(&answer).unwrap();
        let order_id = answer["order_id"].as_str().unwrap().to_owned();
        let order: Value = app
            .get_order("alice", &order_id)
            .await
            .json()
            .await
            .unwrap();
        let charge = app
            .charges()
            .await
            .into_iter()
            .find(|c| c["reference"] == order_id.as_str())
            .expect("every slow click charged");
        let outcome = (
            status,
            order["status"].as_str().unwrap().to_owned(),
            charge["status"].as_str().unwrap().to_owned(),
        );
        assert!(
            matches!(
                (outcome.0, outcome.1.as_str(), outcome.2.as_str()),
                (201, "paid", "succeeded") | (402, "failed", "refunded")
            ),
            "{outcome:?}"
        );
        outcomes.push(outcome);
    }
    eprintln!("outcomes: {outcomes:?}");
    assert_invariants(&app).await;
}

#[tokio::test]
async fn a_stuck_order_retried_by_reconciliation_does_not_hold_the_breaker_open() {
    let app = spawn_app_with(|s| {
        quick_give_up(3_600)(s);
        s.payrail.breaker_failures = 2;
        s.payrail.breaker_open_secs = 60;
    })
    .await;
    let seats = app.seed("ev", 2, 1_000).await;
    let stuck_hold = app.hold("alice", seats[0]).await;
    let stuck = app
        .post_order("alice", &new_key(), &[stuck_hold], "pm_card_error")
        .await;
    assert_eq!(
        stuck.status(),
        503,
        "one failure: the breaker is still closed"
    );
    // Reconciliation asks Payrail about the stuck order again (and again):
    // each a 500, each once counted by the breaker, which opened it.
    let deadline = Instant::now() + Duration::from_secs(15);
    while app
        .count("SELECT coalesce(max(reconcile_attempts), 0)::bigint FROM orders")
        .await
        < 3
    {
        assert!(Instant::now() < deadline, "reconciliation never retried");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let hold = app.hold("alice", seats[1]).await;
    let other = app
        .post_order("alice", &new_key(), &[hold], "pm_card_visa")
        .await;
    assert_eq!(
        other.status(),
        201,
        "another buyer's click still goes through"
    );
    assert_invariants(&app).await;
}
