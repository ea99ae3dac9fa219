//! A crash between a keyed request's effect and its stored answer, made
//! real: a trigger stalls the answer's write inside the database, the
//! service process is SIGKILLed, and the stalled backend is terminated. The
//! effect and the answer commit together or not at all, so the retry after
//! the lease either finds nothing and does the work once, or resumes the
//! linked effect; it never meets its own effect as someone else's.

use std::time::Duration;

use serde_json::Value;
use test_support::process::ServiceProcess;

use crate::helpers::{new_key, order_body, spawn_app_with, Seen, TestApp};
use crate::invariants::assert_invariants;

/// Makes every write of an answer (a key row's status going from NULL to a
/// value) sleep until its backend is terminated.
const STALL: &str = "
    CREATE FUNCTION stall_answer() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF NEW.response_status IS NOT NULL AND OLD.response_status IS NULL THEN
            PERFORM pg_sleep(600);
        END IF;
        RETURN NEW;
    END $$;
    CREATE TRIGGER stall_answer BEFORE UPDATE ON idempotency_keys
        FOR EACH ROW EXECUTE FUNCTION stall_answer();";

/// Waits for the stalled write, SIGKILLs the process that sent it, ends
/// the backend (its transaction rolls back, as after a crash of the
/// database connection) and removes the stall.
async fn crash_while_answering(app: &TestApp, service: &mut ServiceProcess) {
    let client = app.db.client().await;
    let mut stalled = None;
    for _ in 0..200 {
        stalled = client
            .query_opt(
                "SELECT pid FROM pg_stat_activity
                 WHERE datname = current_database() AND wait_event = 'PgSleep'",
                &[],
            )
            .await
            .unwrap()
            .map(|row| row.get::<_, i32>(0));
        if stalled.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let pid = stalled.expect("the answer's write stalled");
    service.kill().await;
    client
        .execute("SELECT pg_terminate_backend($1)", &[&pid])
        .await
        .unwrap();
    client
        .batch_execute("DROP TRIGGER stall_answer ON idempotency_keys")
        .await
        .unwrap();
}

/// Retries until the key's lease has run out and the retry is answered.
async fn retry_after_the_lease(send: impl AsyncFn() -> Seen) -> Seen {
    for _ in 0..60 {
        let seen = send().await;
        if seen.status != 409 {
            return seen;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the key stayed in progress");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hold_cut_off_before_its_answer_is_made_once_and_answered_201() {
    let app = spawn_app_with(|s| s.idempotency.lease_secs = 1).await;
    let seats = app.seed("show", 1, 2500).await;
    app.db.client().await.batch_execute(STALL).await.unwrap();
    let mut doomed = app.spawn_process().await;
    let key = new_key();

    let body = serde_json::json!({ "seat_id": seats[0] }).to_string();
    let in_flight = app.in_flight(&doomed, "/holds", &key, body);
    crash_while_answering(&app, &mut doomed).await;
    assert!(
        in_flight.await.unwrap().is_err(),
        "no answer reached the buyer"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM holds").await,
        0,
        "the hold went with its unstored answer"
    );

    let retry = || async { Seen::of(app.post_hold("alice", seats[0], Some(&key)).await).await };
    let answer = retry_after_the_lease(retry).await;
    assert_eq!(
        answer.status,
        201,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    let body: Value = serde_json::from_slice(&answer.body).unwrap();
    let held: i64 = app
        .db
        .client()
        .await
        .query_one(
            "SELECT hold_id FROM holds WHERE seat_id = $1 AND user_id = 'alice'",
            &[&seats[0]],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(
        body["hold_id"], held,
        "the answer names the hold that exists"
    );
    assert_eq!(app.count("SELECT count(*) FROM holds").await, 1);

    let replay = retry().await;
    assert_eq!((replay.status, replay.replayed), (201, true));
    assert_eq!(replay.body, answer.body);
    assert_invariants(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_cut_off_before_its_answer_is_resumed_and_charged_once() {
    let app = spawn_app_with(|s| s.idempotency.lease_secs = 1).await;
    let seats = app.seed("show", 1, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    app.db.client().await.batch_execute(STALL).await.unwrap();
    let mut doomed = app.spawn_process().await;
    let key = new_key();

    let in_flight = app.in_flight(
        &doomed,
        "/orders",
        &key,
        order_body(&[hold], "pm_card_visa"),
    );
    crash_while_answering(&app, &mut doomed).await;
    assert!(
        in_flight.await.unwrap().is_err(),
        "no answer reached the buyer"
    );
    assert_eq!(
        app.charges().await.len(),
        1,
        "Payrail charged before the crash"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM orders WHERE status = 'payment_pending'")
            .await,
        1,
        "the order and its link survived; its settlement did not"
    );

    let retry =
        || async { Seen::of(app.post_order("alice", &key, &[hold], "pm_card_visa").await).await };
    let answer = retry_after_the_lease(retry).await;
    assert_eq!(
        answer.status,
        201,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    let body: Value = serde_json::from_slice(&answer.body).unwrap();
    assert_eq!(body["status"], "paid");
    let order_id = app.only_order_id().await;
    assert_eq!(
        body["order_id"],
        order_id.as_str(),
        "the order that was made"
    );
    let charges = app.charges().await;
    assert_eq!(charges.len(), 1, "charged once: {charges:?}");
    assert_eq!(
        charges[0]["requests"], 2,
        "the takeover asked again, same key"
    );

    let replay = retry().await;
    assert_eq!((replay.status, replay.replayed), (201, true));
    assert_eq!(replay.body, answer.body);
    assert_invariants(&app).await;
}
