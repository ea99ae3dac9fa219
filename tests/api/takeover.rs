//! Crashes, stalls and shutdowns: a request that dies or pauses between its
//! claim and its answer, with real processes and real signals.

use std::time::Duration;

use idempotency::{Done, Engine, Fence, IdempotencyKey, Policy, RequestHash, StoredResponse, Unit};
use serde_json::json;
use stagedoor_checkout::checkout::orders::click::{self, Click};
use stagedoor_checkout::checkout::orders::{NewOrder, Orders};
use stagedoor_checkout::payrail;
use test_support::paused::{Failed, Paused};
use tokio::task::JoinHandle;

use crate::helpers::{new_key, order_body, spawn_app_with, Seen, TestApp};
use crate::invariants::assert_invariants;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_killed_mid_request_is_finished_by_a_retry_on_another_instance() {
    let app = spawn_app_with(|s| {
        s.idempotency.lease_secs = 1;
        s.payrail.timeout_ms = 5_000;
    })
    .await;
    let seats = app.seed("show", 1, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    // Payrail has made the charge and is sitting on its answer: kill -9.
    let (mut doomed, key, in_flight) = app.order_charged_on_a_process(hold).await;
    doomed.kill().await.expect("killed");
    assert!(
        in_flight.await.unwrap().is_err(),
        "the client lost its answer"
    );
    app.set_faults(json!({})).await;

    // The retry lands on another instance: 409 while the dead request's lease
    // lasts, then a takeover resumes the same order with the same Payrail key.
    let mut answer = None;
    for _ in 0..40 {
        let seen = Seen::of(app.post_order("alice", &key, &[hold], "pm_card_visa").await).await;
        if seen.status != 409 {
            answer = Some(seen);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let answer = answer.expect("an answer within the lease");
    assert_eq!(
        answer.status,
        201,
        "{}",
        String::from_utf8_lossy(&answer.body)
    );
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);
    let ledger = app.charges().await;
    assert_eq!(ledger.len(), 1, "one charge");
    assert_eq!(answer.json()["charge_id"], ledger[0]["id"]);
    assert_invariants(&app).await;
}

/// An app whose leases last a second and whose Payrail calls may take ten,
/// and a hold of alice's.
async fn stalling_app() -> (TestApp, i64) {
    let app = spawn_app_with(|s| {
        s.idempotency.lease_secs = 1;
        s.payrail.timeout_ms = 10_000;
    })
    .await;
    let seats = app.seed("show", 1, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    (app, hold)
}

/// Alice's order of `hold` under `key`, sent now and answered later.
fn order_in_background(app: &TestApp, key: &str, hold: i64) -> JoinHandle<Seen> {
    let request = app
        .as_buyer(app.http.post(app.url("/orders")), "alice")
        .header("Idempotency-Key", key.to_owned())
        .body(order_body(&[hold], "pm_card_visa"));
    tokio::spawn(async move { Seen::of(request.send().await.unwrap()).await })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_outlives_its_lease_stores_nothing_and_the_taker_answers() {
    let (app, hold) = stalling_app().await;
    app.set_faults(json!({"latency_ms": 2_500})).await;
    let key = new_key();

    let zombie = order_in_background(&app, &key, hold);
    tokio::time::sleep(Duration::from_millis(1_400)).await;
    // The first request's lease is over: this one takes the key over.
    let taker = Seen::of(app.post_order("alice", &key, &[hold], "pm_card_visa").await).await;
    let zombie = zombie.await.unwrap();

    assert_eq!((taker.status, taker.replayed), (201, false));
    // The zombie got its Payrail answer first but could not store it: it
    // answers what the key says (still in progress, or the taker's answer).
    match zombie.status {
        409 => assert_eq!(zombie.problem(), "request-in-progress"),
        201 => assert!(zombie.replayed && zombie.body == taker.body),
        other => panic!("zombie answered {other}"),
    }
    // The zombie settled the order first; the taker found it settled and
    // stored its answer on the key it holds (not only in the answer
    // cache): a retry is a replay.
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_keys WHERE response_status = 201")
            .await,
        1,
        "the taker stored its answer"
    );
    let replay = Seen::of(app.post_order("alice", &key, &[hold], "pm_card_visa").await).await;
    assert!(replay.replayed, "the key was answered: {}", replay.status);
    assert_eq!(replay.body, taker.body, "the stored answer is the taker's");
    assert_eq!(app.charges().await.len(), 1);
    assert_invariants(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_that_wakes_after_the_taker_answered_replays_the_takers_answer() {
    let (app, hold) = stalling_app().await;
    // Payrail charges at once and sits on the first request's answer alone.
    app.set_faults(json!({"latency_ms": 2_500})).await;
    let key = new_key();

    let zombie = order_in_background(&app, &key, hold);
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    app.set_faults(json!({})).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    // The first request's lease is over: this one takes the key over,
    // settles the order with the same charge and answers first.
    let taker = Seen::of(app.post_order("alice", &key, &[hold], "pm_card_visa").await).await;
    assert_eq!((taker.status, taker.replayed), (201, false));
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_keys WHERE response_status = 201")
            .await,
        1,
        "the taker stored its answer"
    );

    // Then the first request hears Payrail and finds the order settled:
    // its claim was taken, so it gives the taker's answer as a replay.
    let zombie = zombie.await.unwrap();
    assert_eq!(
        (zombie.status, zombie.replayed, &zombie.body),
        (201, true, &taker.body),
        "one click, one first answer"
    );
    assert_eq!(app.charges().await.len(), 1);
    assert_invariants(&app).await;
}

#[tokio::test]
async fn a_fenced_off_claim_can_neither_make_an_order_nor_store_an_answer() {
    let app = spawn_app_with(|s| s.idempotency.lease_secs = 1).await;
    let seats = app.seed("show", 1, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    let pool = stagedoor_checkout::db::pool(&app.settings.database).unwrap();
    let payrail = payrail::Client::new(&app.settings.payrail, &app.sandbox.base_url()).unwrap();
    let orders = Orders::new(pool.clone(), payrail.into());
    let policy = Policy {
        ttl: Duration::from_secs(3600),
        lease: Duration::from_secs(1),
    };
    let key = IdempotencyKey::parse(b"paused-click").unwrap();
    let body = order_body(&[hold], "pm_card_visa");
    let hash = RequestHash::of("POST", "/orders", body.as_bytes());
    let request = Click::new(
        &orders,
        NewOrder::parse(vec![hold], "pm_card_visa").unwrap(),
    );
    let mut client = pool.get().await.unwrap();

    let engine = Engine::new(pool.clone(), policy);
    let Ok(paused) = Paused::start(&engine, "alice", &key, &hash).await else {
        panic!("first claim");
    };
    tokio::time::sleep(Duration::from_millis(1_100)).await;
    let Ok(taker) = Paused::start(&engine, "alice", &key, &hash)
        .await
        .map(Paused::crash)
    else {
        panic!("takeover after the lease");
    };

    // The paused request wakes up: its writes are fenced off.
    let fenced = click::place(&orders, &paused.claim, &request)
        .await
        .unwrap();
    assert!(matches!(fenced, Done::Fenced));
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 0);
    let stale = StoredResponse::new(200, "text/plain", b"stale".to_vec());
    let unit = Unit::begin(&paused.claim, &mut client).await.unwrap();
    assert_eq!(unit.store(&stale).await.unwrap(), Fence::Lost);
    unit.rollback().await.unwrap();
    // Its work fails: the key it no longer holds is not given back.
    assert!(paused.resume(Err(Failed)).await.is_err());
    let held: i64 = client
        .query_one(
            "SELECT count(*) FROM idempotency_keys WHERE user_id = 'alice' AND key = $1",
            &[&key.as_str()],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(held, 1, "the taker's key stays");

    // The taker does the work once.
    let done = click::place(&orders, &taker, &request).await.unwrap();
    assert!(matches!(done, Done::Stored(ref r) if r.status == 201));
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);
    assert_eq!(app.charges().await.len(), 1);
    assert_invariants(&app).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_an_in_flight_order_finish_and_exits_zero() {
    let app = spawn_app_with(|s| s.server.shutdown_timeout_secs = 10).await;
    let seats = app.seed("show", 1, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    let mut service = app.spawn_process().await;
    app.set_faults(json!({"latency_ms": 700})).await;

    let in_flight = {
        let request = app
            .as_buyer(app.http.post(format!("{}/orders", service.url())), "alice")
            .header("Idempotency-Key", new_key())
            .body(order_body(&[hold], "pm_card_visa"));
        tokio::spawn(async move { Seen::of(request.send().await.unwrap()).await })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    service.signal("TERM");
    let seen = in_flight.await.unwrap();
    assert_eq!(seen.status, 201, "the in-flight order finished");
    let status = service
        .wait(Duration::from_secs(15))
        .await
        .expect("exits after draining");
    assert!(status.success(), "{status}");
    // Stopped accepting: nothing listens any more.
    assert!(app
        .http
        .get(format!("{}/healthz", service.url()))
        .send()
        .await
        .is_err());
    assert_invariants(&app).await;
}
