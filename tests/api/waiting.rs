//! `Prefer: wait=N` (RFC 7240): a retry that finds its click in progress
//! waits for the answer, on whichever instance the first request runs,
//! instead of being told 409 and left to loop.

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::Response;
use serde_json::json;
use tokio::sync::Barrier;

use crate::helpers::{new_key, order_body, spawn_app_with, Seen, TestApp};
use crate::invariants::assert_invariants;

/// `POST /orders` on `app` with `Prefer: wait=N`.
async fn order_waiting(app: &TestApp, key: &str, hold: i64, wait: u64) -> Response {
    app.as_buyer(app.http.post(app.url("/orders")), "alice")
        .header("Idempotency-Key", key)
        .header("Prefer", format!("wait={wait}"))
        .header("Content-Type", "application/json")
        .body(order_body(&[hold], "pm_card_visa"))
        .send()
        .await
        .expect("POST /orders")
}

fn preference_applied(response: &Response) -> Option<String> {
    response
        .headers()
        .get("Preference-Applied")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_duplicate_on_another_instance_gets_the_replay_never_a_409() {
    let first = Arc::new(spawn_app_with(|s| s.payrail.timeout_ms = 5_000).await);
    let second = first.another_instance().await;
    let seats = first.seed("show", 1, 2500).await;
    let hold = first.hold("alice", seats[0]).await;
    first.set_faults(json!({"latency_ms": 1_500})).await;
    let key = new_key();

    let original = {
        let (first, key) = (first.clone(), key.clone());
        tokio::spawn(async move {
            let seen = Seen::of(
                first
                    .post_order("alice", &key, &[hold], "pm_card_visa")
                    .await,
            )
            .await;
            (seen, Instant::now())
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let response = order_waiting(&second, &key, hold, 5).await;
    let arrived = Instant::now();
    assert_eq!(preference_applied(&response).as_deref(), Some("wait=5"));
    let duplicate = Seen::of(response).await;
    let (original, answered) = original.await.unwrap();
    assert_eq!((original.status, original.replayed), (201, false));
    assert_eq!((duplicate.status, duplicate.replayed), (201, true));
    assert_eq!(duplicate.body, original.body, "byte for byte");
    assert_eq!(duplicate.location, original.location);
    assert_eq!(duplicate.content_type, original.content_type);
    println!(
        "the waiting duplicate answered {} ms after the first request",
        arrived.saturating_duration_since(answered).as_millis()
    );
    assert_eq!(first.charges().await.len(), 1);
    assert_invariants(&first).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_that_runs_out_is_the_409_of_a_retry_that_did_not_wait() {
    let app = Arc::new(spawn_app_with(|s| s.payrail.timeout_ms = 5_000).await);
    let seats = app.seed("show", 1, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    app.set_faults(json!({"latency_ms": 3_000})).await;
    let key = new_key();
    let original = {
        let (app, key) = (app.clone(), key.clone());
        tokio::spawn(async move { app.post_order("alice", &key, &[hold], "pm_card_visa").await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    let response = order_waiting(&app, &key, hold, 1).await;
    let waited = started.elapsed();
    assert_eq!(preference_applied(&response), None);
    let seen = Seen::of(response).await;
    assert_eq!(seen.status, 409);
    assert_eq!(seen.problem(), "request-in-progress");
    assert_eq!(seen.retry_after.as_deref(), Some("1"));
    println!(
        "wait=1 against a 3 s holder: 409 after {} ms",
        waited.as_millis()
    );
    assert!(
        waited >= Duration::from_millis(900),
        "it waited: {waited:?}"
    );
    assert!(
        !original.is_finished(),
        "it gave up before the holder answered"
    );
    assert_eq!(original.await.unwrap().status(), 201);

    // Without the header nothing changes: 409 at once.
    let seen = Seen::of(
        app.post_order("alice", &new_key(), &[hold], "pm_card_visa")
            .await,
    )
    .await;
    assert_eq!(seen.status, 409, "the hold is in the order now");
    assert_invariants(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_hundred_waiters_on_a_pool_of_four_get_the_one_answer_and_others_are_served() {
    let app = Arc::new(
        spawn_app_with(|s| {
            s.database.pool_size = 4;
            s.payrail.timeout_ms = 5_000;
        })
        .await,
    );
    let seats = app.seed("show", 2, 2500).await;
    // Another order of alice's, for a read while the waiters wait.
    let other = app.hold("alice", seats[1]).await;
    let other = Seen::of(
        app.post_order("alice", &new_key(), &[other], "pm_card_visa")
            .await,
    )
    .await
    .json()["order_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let hold = app.hold("alice", seats[0]).await;
    app.set_faults(json!({"latency_ms": 2_000})).await;
    let key = new_key();

    let barrier = Arc::new(Barrier::new(201));
    let waiters: Vec<_> = (0..200)
        .map(|_| {
            let (app, key, barrier) = (app.clone(), key.clone(), barrier.clone());
            tokio::spawn(async move {
                barrier.wait().await;
                let response = order_waiting(&app, &key, hold, 10).await;
                Seen::of(response).await
            })
        })
        .collect();
    barrier.wait().await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    let read = app.get_order("alice", &other).await;
    println!(
        "GET /orders/{{id}} with 200 waiters: {} ms",
        started.elapsed().as_millis()
    );
    assert_eq!(read.status(), 200);
    assert!(
        waiters.iter().all(|w| !w.is_finished()),
        "the read was served while every waiter still waited"
    );

    let mut answers = Vec::new();
    for waiter in waiters {
        answers.push(waiter.await.unwrap());
    }
    let first = answers
        .iter()
        .find(|a| !a.replayed)
        .expect("one did the work");
    assert_eq!(answers.iter().filter(|a| !a.replayed).count(), 1);
    for answer in &answers {
        assert_eq!(
            answer.status,
            201,
            "{}",
            String::from_utf8_lossy(&answer.body)
        );
        assert_eq!(answer.body, first.body);
    }
    assert_eq!(
        app.count("SELECT count(*) FROM orders").await,
        2,
        "alice's two orders, no more"
    );
    let charges = app.charges().await;
    assert_eq!(charges.len(), 2, "one charge per click: {charges:?}");
    assert_invariants(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_holder_is_killed_takes_over_and_charges_once() {
    let app = spawn_app_with(|s| {
        s.idempotency.lease_secs = 1;
        s.payrail.timeout_ms = 5_000;
    })
    .await;
    let seats = app.seed("show", 1, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    let (mut doomed, key, in_flight) = app.order_charged_on_a_process(hold).await;
    let waiter = order_waiting(&app, &key, hold, 10);
    let kill = async {
        tokio::time::sleep(Duration::from_millis(200)).await;
        doomed.kill().await;
        app.set_faults(json!({})).await;
    };
    let (response, ()) = tokio::join!(waiter, kill);
    assert!(in_flight.await.unwrap().is_err(), "the holder died");
    assert_eq!(preference_applied(&response).as_deref(), Some("wait=10"));
    let seen = Seen::of(response).await;
    assert_eq!(seen.status, 201, "{}", String::from_utf8_lossy(&seen.body));
    assert_eq!(seen.json()["status"], "paid");
    let charges = app.charges().await;
    assert_eq!(charges.len(), 1, "charged once: {charges:?}");
    assert_eq!(
        charges[0]["requests"], 2,
        "the waiter asked again, same key"
    );
    assert_invariants(&app).await;
}
