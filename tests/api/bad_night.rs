//! Payrail misbehaving for real (sandbox faults and test cards): each test
//! causes the failure, then checks the outcome the buyer sees and the
//! invariants.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use stagedoor_checkout::checkout::orders::Orders;
use stagedoor_checkout::config::Settings;
use stagedoor_checkout::jobs::reconcile::Reconcile;
use stagedoor_checkout::{db, payrail};
use tokio::sync::Barrier;

use crate::helpers::{new_key, order_body, spawn_app_with, Seen, TestApp};
use crate::invariants::assert_invariants;

/// Retries one click until it has an answer other than 409, as a client
/// honouring `Retry-After` would (bounded).
async fn retry_until_answered(app: &TestApp, buyer: &str, key: &str, holds: &[i64]) -> Seen {
    for _ in 0..60 {
        let seen = Seen::of(app.post_order(buyer, key, holds, "pm_card_visa").await).await;
        if seen.status != 409 {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("the click never got an answer");
}

/// A reconciliation of its own on the instance's database and Payrail, run
/// by the test when it chooses.
fn reconciliation(settings: &Settings) -> Reconcile {
    let pool = db::pool(&settings.database).unwrap();
    let payrail = payrail::Client::new(&settings.payrail, &settings.payrail.base_url).unwrap();
    let orders = Orders::new(pool.clone(), Arc::new(payrail));
    Reconcile::new(pool, orders, &settings.reconcile)
}

#[tokio::test]
async fn payrail_errors_are_503_unstored_and_a_retry_after_recovery_charges_once() {
    let app = spawn_app_with(|s| s.idempotency.lease_secs = 1).await;
    let seats = app.seed("show", 1, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    let key = new_key();
    app.set_faults(json!({"error_rate": 1.0})).await;

    let failed = Seen::of(app.post_order("alice", &key, &[hold], "pm_card_visa").await).await;
    assert_eq!(failed.status, 503);
    assert_eq!(failed.problem(), "payment-unavailable");
    assert!(failed.retry_after.is_some());
    // The order exists, so the key stays in progress: a retry is 409, not a
    // second order.
    let during = Seen::of(app.post_order("alice", &key, &[hold], "pm_card_visa").await).await;
    assert_eq!(during.problem(), "request-in-progress");
    assert!(app.charges().await.is_empty());

    app.set_faults(json!({})).await;
    let healed = retry_until_answered(&app, "alice", &key, &[hold]).await;
    assert_eq!(
        healed.status,
        201,
        "{}",
        String::from_utf8_lossy(&healed.body)
    );
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);
    assert_eq!(app.charges().await.len(), 1);
    let replay = Seen::of(app.post_order("alice", &key, &[hold], "pm_card_visa").await).await;
    assert_eq!((replay.replayed, &replay.body), (true, &healed.body));
    assert_invariants(&app).await;
}

#[tokio::test]
async fn a_charge_answered_too_late_is_504_then_settled_by_reconciliation_and_replayed() {
    let app = spawn_app_with(|s| {
        s.payrail.timeout_ms = 300;
        s.payrail.max_attempts = 1;
        s.reconcile.interval_secs = 1;
        s.reconcile.grace_secs = 1;
    })
    .await;
    let seats = app.seed("show", 1, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    app.set_faults(json!({"slow_ms": 5_000})).await;
    let key = new_key();

    let timed_out = Seen::of(app.post_order("alice", &key, &[hold], "pm_card_slow").await).await;
    assert_eq!(timed_out.status, 504);
    assert_eq!(timed_out.problem(), "payment-timeout");
    let ledger = app.charges().await;
    assert_eq!(
        ledger.len(),
        1,
        "the charge was made before the answer was lost"
    );

    let retry = Seen::of(app.post_order("alice", &key, &[hold], "pm_card_slow").await).await;
    assert_eq!(retry.problem(), "request-in-progress");
    assert_eq!(retry.retry_after.as_deref(), Some("1"));

    // Reconciliation asks Payrail again with the order's key (a repeat answers
    // at once), settles the order and stores the answer on the key.
    let mut settled = None;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let seen = Seen::of(app.post_order("alice", &key, &[hold], "pm_card_slow").await).await;
        if seen.status != 409 {
            settled = Some(seen);
            break;
        }
    }
    let settled = settled.expect("reconciliation settled the order");
    assert_eq!((settled.status, settled.replayed), (201, true));
    assert_eq!(settled.json()["status"], "paid");
    let ledger = app.charges().await;
    assert_eq!(ledger.len(), 1);
    assert_eq!(settled.json()["charge_id"], ledger[0]["id"]);
    assert_invariants(&app).await;
}

#[tokio::test]
async fn an_outage_opens_the_breaker_after_one_buyer_more_than_its_threshold_and_its_time_closes_it(
) {
    let app = spawn_app_with(|s| {
        s.payrail.breaker_failures = 2;
        s.payrail.breaker_open_secs = 1;
        s.payrail.max_attempts = 2;
    })
    .await;
    let seats = app.seed("show", 4, 2500).await;
    let (a, c, d, b) = (
        app.hold("alice", seats[0]).await,
        app.hold("carol", seats[1]).await,
        app.hold("dave", seats[2]).await,
        app.hold("bob", seats[3]).await,
    );
    app.set_faults(json!({"error_rate": 1.0})).await;

    // Payrail fails for three buyers, more than half of the four the
    // breaker remembers: that is Payrail, not a few buyers' cards.
    for (buyer, hold) in [("alice", a), ("carol", c), ("dave", d)] {
        let failed = Seen::of(
            app.post_order(buyer, &new_key(), &[hold], "pm_card_visa")
                .await,
        )
        .await;
        assert_eq!(failed.problem(), "payment-unavailable", "{buyer}");
    }

    // Payrail is healthy again, but the breaker is open: answered at once
    // without calling Payrail (a call would have charged), and since nothing
    // was made the key is released, so the same click can start afresh.
    app.set_faults(json!({})).await;
    let key = new_key();
    let refused = Seen::of(app.post_order("bob", &key, &[b], "pm_card_visa").await).await;
    assert_eq!(refused.status, 503);
    assert_eq!(refused.problem(), "payment-unavailable");
    assert!(refused.retry_after.is_some());
    assert!(app.charges().await.is_empty(), "Payrail was not called");
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_keys WHERE user_id = 'bob'")
            .await,
        0
    );
    assert_eq!(
        app.count("SELECT count(*) FROM orders WHERE user_id = 'bob'")
            .await,
        0
    );

    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let healed = Seen::of(app.post_order("bob", &key, &[b], "pm_card_visa").await).await;
    assert_eq!((healed.status, healed.replayed), (201, false));
    assert_invariants(&app).await;
}

/// Five accounts whose cards make Payrail fail (`pm_card_error`), click
/// after click, while honest buyers pay: they never open the breaker (SPEC
/// §13), however often they click. Before the breaker counted buyers, two
/// of them opened it for everyone.
#[tokio::test]
async fn five_accounts_failing_click_after_click_never_open_the_breaker_for_the_others() {
    let app = spawn_app_with(|s| {
        s.payrail.breaker_failures = 5;
        s.payrail.breaker_open_secs = 60;
        s.payrail.max_attempts = 1;
    })
    .await;
    let attackers = ["mallory", "mallet", "trudy", "eve", "oscar"];
    let seats = app.seed("show", 14, 2500).await;
    let mut seats = seats.into_iter();
    let mut paid = 0;
    for round in 0..2 {
        for attacker in attackers {
            let hold = app.hold(attacker, seats.next().unwrap()).await;
            let failed = Seen::of(
                app.post_order(attacker, &new_key(), &[hold], "pm_card_error")
                    .await,
            )
            .await;
            assert_eq!(failed.problem(), "payment-unavailable", "{attacker}");
            assert!(failed.retry_after.is_some());
        }
        for buyer in ["alice", "bob"] {
            let hold = app.hold(buyer, seats.next().unwrap()).await;
            let click = Seen::of(
                app.post_order(buyer, &new_key(), &[hold], "pm_card_visa")
                    .await,
            )
            .await;
            assert_eq!(
                click.status, 201,
                "{buyer}, round {round}: {:?}",
                click.slug
            );
            paid += 1;
        }
    }
    let ledger = app.charges().await;
    // (Not `payrail_breaker_open`: the gauge is the process's, and other
    // tests of this binary open their own breakers.)
    assert_eq!(ledger.len(), paid, "the honest charges alone: {ledger:?}");
    assert_invariants(&app).await;
}

#[tokio::test]
async fn a_charge_that_keeps_failing_stays_pending_and_is_retried_with_growing_delays() {
    let app = spawn_app_with(|s| {
        s.reconcile.interval_secs = 1;
        s.reconcile.grace_secs = 0;
        s.payrail.max_attempts = 1;
    })
    .await;
    let seats = app.seed("show", 1, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    let failed = Seen::of(
        app.post_order("alice", &new_key(), &[hold], "pm_card_error")
            .await,
    )
    .await;
    assert_eq!(failed.problem(), "payment-unavailable");

    tokio::time::sleep(Duration::from_millis(3_600)).await;
    let row = app
        .db
        .client()
        .await
        .query_one(
            "SELECT status, reconcile_attempts,
                    extract(epoch FROM reconcile_after - now())::float8 AS next_in
             FROM orders",
            &[],
        )
        .await
        .unwrap();
    let (status, attempts, next_in): (String, i32, f64) = (row.get(0), row.get(1), row.get(2));
    assert_eq!(status, "payment_pending", "never settled without an answer");
    // Attempts at about 1 s and 2 s, then the next waits until 4 s: the
    // delay doubles instead of hammering Payrail every interval.
    assert!((2..=3).contains(&attempts), "attempts {attempts}");
    assert!(
        next_in > 0.0,
        "the next attempt is scheduled ahead: {next_in}"
    );
    assert!(app.charges().await.is_empty());
    assert_invariants(&app).await;
}

/// Reconciliation settles a declined click while Payrail's answer to the
/// click itself is still on its way: the click's first answer is the one
/// reconciliation stored on its key, Payrail's reason and all, byte for
/// byte as its replays.
#[tokio::test]
async fn a_decline_settled_by_reconciliation_first_answers_the_click_as_its_replays() {
    let app = spawn_app_with(|s| {
        s.reconcile.grace_secs = 0;
        s.payrail.max_attempts = 1;
        s.payrail.timeout_ms = 5_000;
    })
    .await;
    let seats = app.seed("race", 1, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    app.set_faults(json!({"latency_ms": 2_000})).await;
    let key = new_key();
    let click = {
        let request = app
            .as_buyer(app.http.post(app.url("/orders")), "alice")
            .header("Idempotency-Key", &key)
            .header("Content-Type", "application/json")
            .body(order_body(&[hold], "pm_card_declined"));
        tokio::spawn(async move { Seen::of(request.send().await.expect("the click")).await })
    };
    app.until_charged().await;
    // Declined at Payrail, the click's answer held back: reconciliation
    // asks again with the order's key and hears the decline at once.
    app.set_faults(json!({})).await;
    let report = reconciliation(&app.settings).run().await.unwrap();
    assert_eq!(report.settled, 1, "reconciliation settled the order first");

    let first = click.await.unwrap();
    assert_eq!(
        (first.status, first.slug.as_deref(), first.replayed),
        (402, Some("payment-declined"), false),
        "the click's own answer, not a replay"
    );
    assert_eq!(first.json()["decline_code"], "card_declined");
    let again = Seen::of(
        app.post_order("alice", &key, &[hold], "pm_card_declined")
            .await,
    )
    .await;
    assert!(again.replayed);
    assert_eq!(
        String::from_utf8_lossy(&again.body),
        String::from_utf8_lossy(&first.body),
        "one answer for the click"
    );
    let order_id = first.json()["order_id"].as_str().unwrap().to_owned();
    let order = Seen::of(app.get_order("alice", &order_id).await).await;
    assert_eq!(order.json()["decline_code"], "card_declined");
    assert_eq!(app.charges().await.len(), 1);
    assert_invariants(&app).await;
}

/// Several instances reconciling at the same moment: each reads the same
/// due orders, and each order is claimed by exactly one of them (one
/// attempt recorded, one settlement counted), charged once.
#[tokio::test]
async fn instances_reconciling_at_once_settle_each_pending_order_once() {
    const ORDERS: usize = 12;
    const INSTANCES: usize = 4;
    let app = spawn_app_with(|s| {
        s.reconcile.grace_secs = 0;
        s.payrail.max_attempts = 1;
    })
    .await;
    let seats = app.seed("race", ORDERS as u32, 2500).await;
    // Payrail fails every new charge while the orders are placed: each is
    // left payment_pending, its click answered 503.
    app.set_faults(json!({"error_rate": 1.0})).await;
    for (i, seat) in seats.iter().enumerate() {
        let buyer = format!("buyer{i}");
        let hold = app.hold(&buyer, *seat).await;
        let failed = Seen::of(
            app.post_order(&buyer, &new_key(), &[hold], "pm_card_visa")
                .await,
        )
        .await;
        assert_eq!(failed.problem(), "payment-unavailable");
    }
    app.set_faults(json!({})).await;

    let barrier = Arc::new(Barrier::new(INSTANCES));
    let runs = (0..INSTANCES).map(|_| {
        let (settings, barrier) = (app.settings.clone(), barrier.clone());
        tokio::spawn(async move {
            let reconcile = reconciliation(&settings);
            barrier.wait().await;
            reconcile.run().await.unwrap()
        })
    });
    let mut settled = 0;
    for run in futures_util::future::join_all(runs).await {
        let report = run.unwrap();
        assert_eq!(report.failed, 0);
        settled += report.settled;
    }
    assert_eq!(
        settled, ORDERS,
        "every order settled by exactly one instance"
    );

    let rows = app
        .db
        .client()
        .await
        .query("SELECT status, reconcile_attempts FROM orders", &[])
        .await
        .unwrap();
    assert_eq!(rows.len(), ORDERS);
    for row in rows {
        let (status, attempts): (String, i32) = (row.get(0), row.get(1));
        assert_eq!((status.as_str(), attempts), ("paid", 1));
    }
    let charges = app.charges().await;
    assert_eq!(charges.len(), ORDERS, "one charge per order: {charges:?}");
    assert_invariants(&app).await;
}
