//! The answer cache (`idempotency.answer_cache_mb`): two instances on one
//! database, the second a real process whose metrics say whether an answer
//! came from memory. A replay from memory is the database's, byte for byte;
//! a purge on one instance reaches the other within a second; an expired key
//! is never replayed from memory; another body is 422 from memory too; and
//! an instance that lost its listening connection trusts nothing it holds
//! until it listens again.

use std::time::Duration;

use serde_json::json;
use test_support::process::ServiceProcess;

use crate::cli::run;
use crate::helpers::{new_key, spawn_app, spawn_app_with, Seen, TestApp};
use crate::invariants::assert_invariants;

/// A keyed hold on the instance at `url`.
async fn hold_on(app: &TestApp, url: &str, seat: i64, key: &str) -> Seen {
    let response = app
        .http
        .post(format!("{url}/holds"))
        .bearer_auth(app.token("alice"))
        .header("Idempotency-Key", key)
        .json(&json!({ "seat_id": seat }))
        .send()
        .await
        .expect("POST /holds");
    Seen::of(response).await
}

/// The instance's count of one cache event.
async fn cache_events(app: &TestApp, instance: &ServiceProcess, event: &str) -> u64 {
    let text = app
        .http
        .get(format!("{}/metrics", instance.url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let series = format!("idempotency_answer_cache_total{{event=\"{event}\"}} ");
    text.lines()
        .find_map(|line| line.strip_prefix(&series))
        .and_then(|value| value.trim().parse().ok())
        .unwrap_or_else(|| panic!("{series} missing from:\n{text}"))
}

fn same_answer(a: &Seen, b: &Seen) {
    assert_eq!(
        (a.status, &a.content_type, &a.location, &a.body),
        (b.status, &b.content_type, &b.location, &b.body)
    );
}

/// How many instances listen for invalidations. A listener's connection
/// shows up before its `LISTEN` has run, and until then its instance learns
/// nothing: only a connection idle after `LISTEN` counts.
async fn listeners(app: &TestApp) -> i64 {
    app.count(&format!(
        "SELECT count(*) FROM pg_stat_activity
         WHERE application_name = 'idempotency-listener' AND datname = current_database()
           AND state = 'idle' AND query = 'LISTEN {}'",
        idempotency::ANSWER_CHANNEL
    ))
    .await
}

async fn until_listening(app: &TestApp, n: i64) {
    for _ in 0..100 {
        if listeners(app).await == n {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{n} listeners never came");
}

/// Waits until `instance` answers from memory. The server shows its
/// listener idle after `LISTEN` a moment before the instance itself takes
/// it as listening, and until then it learns nothing: a throwaway key's
/// answer (a 404: no such seat) is asked again until it comes from memory.
async fn until_trusted(app: &TestApp, instance: &ServiceProcess) {
    let key = new_key();
    let hits = cache_events(app, instance, "hit").await;
    for _ in 0..100 {
        assert_eq!(
            hold_on(app, instance.url(), 999_999_999, &key).await.status,
            404
        );
        if cache_events(app, instance, "hit").await > hits {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{} never answered from memory", instance.url());
}

#[tokio::test]
async fn a_replay_from_memory_is_the_databases_byte_for_byte_and_another_body_is_422() {
    let app = spawn_app().await;
    let seats = app.seed("show", 2, 2500).await;
    let other = app.spawn_process().await;
    until_listening(&app, 2).await;
    until_trusted(&app, &other).await;
    let key = new_key();
    let first = hold_on(&app, &app.address, seats[0], &key).await;
    assert_eq!(first.status, 201);

    // The other instance reads the answer from the database once...
    let hits = cache_events(&app, &other, "hit").await;
    let from_db = hold_on(&app, other.url(), seats[0], &key).await;
    assert!(from_db.replayed);
    assert_eq!(cache_events(&app, &other, "hit").await, hits);
    // ...and then answers from memory, the same bytes and headers.
    let from_memory = hold_on(&app, other.url(), seats[0], &key).await;
    assert_eq!(cache_events(&app, &other, "hit").await, hits + 1);
    assert!(from_memory.replayed);
    same_answer(&from_memory, &from_db);
    same_answer(&from_memory, &first);

    // The same key with another body, from memory: 422, never the answer.
    let reused = hold_on(&app, other.url(), seats[1], &key).await;
    assert_eq!(cache_events(&app, &other, "hit").await, hits + 2);
    assert_eq!(reused.status, 422);
    assert_eq!(reused.problem(), "idempotency-key-reused");
    assert_eq!(app.count("SELECT count(*) FROM holds").await, 1);
    assert_invariants(&app).await;
}

#[tokio::test]
async fn a_purge_on_one_instance_makes_the_key_a_new_intent_on_the_other_within_a_second() {
    let app = spawn_app().await;
    let seats = app.seed("show", 2, 2500).await;
    let other = app.spawn_process().await;
    until_listening(&app, 2).await;
    until_trusted(&app, &other).await;
    let key = new_key();
    assert_eq!(hold_on(&app, other.url(), seats[0], &key).await.status, 201);
    let hits = cache_events(&app, &other, "hit").await;
    assert!(hold_on(&app, other.url(), seats[0], &key).await.replayed);
    assert_eq!(cache_events(&app, &other, "hit").await, hits + 1, "cached");

    let purged = run(
        &app,
        &["keys", "purge", "--user", "alice", "--key", &key],
        &[],
    )
    .await;
    assert!(
        purged.status.success(),
        "{}",
        String::from_utf8_lossy(&purged.stderr)
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    // A new intent: the key holds nothing, so another seat is held, not 422.
    let fresh = hold_on(&app, other.url(), seats[1], &key).await;
    assert_eq!((fresh.status, fresh.replayed), (201, false));
    assert_eq!(cache_events(&app, &other, "invalidation").await, 1);
    assert_invariants(&app).await;
}

#[tokio::test]
async fn an_expired_key_is_never_replayed_from_memory() {
    let app = spawn_app_with(|s| s.idempotency.ttl_secs = 2).await;
    let seats = app.seed("show", 2, 2500).await;
    let other = app.spawn_process().await;
    until_listening(&app, 2).await;
    until_trusted(&app, &other).await;
    let key = new_key();
    let first = hold_on(&app, other.url(), seats[0], &key).await;
    assert_eq!(first.status, 201);
    let hits = cache_events(&app, &other, "hit").await;
    assert!(hold_on(&app, other.url(), seats[0], &key).await.replayed);
    assert_eq!(cache_events(&app, &other, "hit").await, hits + 1, "cached");

    tokio::time::sleep(Duration::from_millis(2_200)).await;
    let again = hold_on(&app, other.url(), seats[0], &key).await;
    assert!(!again.replayed, "a new intent, not a stale replay");
    assert_eq!(again.problem(), "seat-unavailable");
    let other_body = hold_on(&app, other.url(), seats[1], &key).await;
    assert_eq!(other_body.status, 422, "the key is the new intent's now");
}

#[tokio::test]
async fn an_instance_that_lost_its_listener_trusts_its_cache_only_once_it_listens_again() {
    let app = spawn_app_with(|s| s.idempotency.answer_cache_mb = 0).await;
    let seats = app.seed("show", 1, 2500).await;
    let other = app.spawn_process().await;
    until_listening(&app, 1).await;
    until_trusted(&app, &other).await;
    let key = new_key();
    assert_eq!(hold_on(&app, other.url(), seats[0], &key).await.status, 201);
    let hits = cache_events(&app, &other, "hit").await;
    assert!(hold_on(&app, other.url(), seats[0], &key).await.replayed);
    assert_eq!(cache_events(&app, &other, "hit").await, hits + 1, "cached");

    let killed = app
        .count(
            "SELECT count(*) FROM (
                 SELECT pg_terminate_backend(pid) FROM pg_stat_activity
                 WHERE application_name = 'idempotency-listener'
                   AND datname = current_database()) AS t",
        )
        .await;
    assert_eq!(killed, 1);
    tokio::time::sleep(Duration::from_millis(200)).await;
    // A purge it cannot hear now: the replays come from the database.
    for _ in 0..3 {
        let replay = hold_on(&app, other.url(), seats[0], &key).await;
        assert!(replay.replayed);
    }
    assert_eq!(
        cache_events(&app, &other, "hit").await,
        hits + 1,
        "nothing from memory while not listening"
    );
    assert!(cache_events(&app, &other, "invalidation").await >= 1);

    until_listening(&app, 1).await;
    // Listening again: the answer is learned afresh and served from memory.
    let mut served = hits + 1;
    for _ in 0..50 {
        hold_on(&app, other.url(), seats[0], &key).await;
        served = cache_events(&app, &other, "hit").await;
        if served > hits + 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(served > hits + 1, "the cache answers again");
}

#[tokio::test]
async fn with_the_cache_off_every_replay_reads_the_database() {
    let app = spawn_app_with(|s| s.idempotency.answer_cache_mb = 0).await;
    let seats = app.seed("show", 1, 2500).await;
    let key = new_key();
    let first = hold_on(&app, &app.address, seats[0], &key).await;
    app.db
        .client()
        .await
        .execute(
            "UPDATE idempotency_keys SET response_body = response_body || ' '::bytea",
            &[],
        )
        .await
        .unwrap();
    let replay = hold_on(&app, &app.address, seats[0], &key).await;
    assert_eq!(replay.body.len(), first.body.len() + 1, "read from the row");
    assert_eq!(listeners(&app).await, 0);
}
