//! A key's lifetime: past the TTL it is a new intent, and the cleanup job
//! deletes it in batches, one instance at a time.

use std::time::Duration;

use idempotency::cleanup::CLEANUP_LOCK;
use stagedoor_checkout::jobs::cleanup::{Cleanup, Swept};

use crate::helpers::{new_key, spawn_app, spawn_app_with, Seen};
use crate::invariants::assert_invariants;

#[tokio::test]
async fn a_key_past_its_ttl_is_a_new_intent_even_before_it_is_deleted() {
    let app = spawn_app_with(|s| s.idempotency.ttl_secs = 1).await;
    let seats = app.seed("show", 2, 2500).await;
    let key = new_key();
    let first = Seen::of(app.post_hold("alice", seats[0], Some(&key)).await).await;
    assert_eq!(first.status, 201);
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    assert_eq!(app.buyer_keys().await, 1, "not deleted yet");

    // Another body with the old key: not 422, a new intent.
    let other = Seen::of(app.post_hold("alice", seats[1], Some(&key)).await).await;
    assert_eq!((other.status, other.replayed), (201, false));
    tokio::time::sleep(Duration::from_millis(1_200)).await;
    // The first body again: not a stale replay, the work is done afresh.
    let again = Seen::of(app.post_hold("alice", seats[0], Some(&key)).await).await;
    assert_eq!((again.status, again.replayed), (409, false));
    assert_eq!(again.problem(), "seat-unavailable");
}

/// `n` answered keys of user `load`, the youngest `age` old, each `spacing`
/// older than the one before.
async fn insert_keys(app: &crate::helpers::TestApp, n: i64, age: &str, spacing: &str) {
    app.db
        .client()
        .await
        .execute(
            &format!(
                "INSERT INTO idempotency_keys (user_id, key, request_hash, claim_token,
                     lease_expires_at, response_status, response_content_type, response_body,
                     created_at)
                 SELECT 'load', 'k-' || g || '-' || md5(random()::text), '\\x00', g,
                        now(), 201, 'application/json', '{{}}',
                        now() - interval '{age}' - g * interval '{spacing}'
                 FROM generate_series(1, $1::bigint) g"
            ),
            &[&n],
        )
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cleanup_deletes_expired_keys_in_batches_while_orders_go_on() {
    let app = spawn_app().await;
    // A day of a key every 10 s, a gap of a week, then a burst of a key every
    // 10 ms: the cleanup's slices of `created_at` jump the gap and shrink
    // to the burst.
    insert_keys(&app, 8_000, "2 days", "10 s").await;
    insert_keys(&app, 4_345, "10 days", "10 ms").await;
    insert_keys(&app, 10, "1 hour", "1 s").await;
    let seats = app.seed("show", 10, 2500).await;
    let mut holds = Vec::new();
    for seat in &seats {
        holds.push(app.hold("alice", *seat).await);
    }
    let pool = stagedoor_checkout::db::pool(&app.settings.database).unwrap();
    let cleanup = Cleanup::new(pool, app.settings.idempotency.ttl());

    // Another instance holds the cleanup lock: this one skips and deletes nothing.
    let other_instance = app.db.client().await;
    other_instance
        .execute("SELECT pg_advisory_lock($1)", &[&CLEANUP_LOCK])
        .await
        .unwrap();
    assert_eq!(cleanup.run().await.unwrap(), Swept::Skipped);
    assert_eq!(app.buyer_keys().await, 12_355);
    other_instance
        .execute("SELECT pg_advisory_unlock($1)", &[&CLEANUP_LOCK])
        .await
        .unwrap();

    let traffic = {
        let app_url = app.url("/orders");
        let token = app.token("alice");
        let http = app.http.clone();
        tokio::spawn(async move {
            let mut statuses = Vec::new();
            for hold in holds {
                let response = http
                    .post(&app_url)
                    .bearer_auth(&token)
                    .header("Idempotency-Key", new_key())
                    .body(crate::helpers::order_body(&[hold], "pm_card_visa"))
                    .send()
                    .await
                    .unwrap();
                statuses.push(response.status().as_u16());
            }
            statuses
        })
    };
    assert_eq!(cleanup.run().await.unwrap(), Swept::Deleted(12_345));
    assert!(traffic.await.unwrap().iter().all(|s| *s == 201));
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_keys WHERE user_id = 'load'")
            .await,
        10,
        "young keys stay"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM orders").await,
        10,
        "orders outlive keys"
    );
    assert_invariants(&app).await;
}

#[tokio::test]
async fn the_cleanup_command_prints_how_many_rows_went() {
    let app = spawn_app().await;
    insert_keys(&app, 42, "3 days", "1 s").await;
    let output = crate::cli::run(&app, &["cleanup"], &[]).await;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&output.stdout).trim(), "42");
    assert_eq!(app.buyer_keys().await, 0);
}

/// A click whose payment is still undecided when its key's TTL runs out
/// keeps its key: the cleanup leaves it, and a retry finishes that click
/// (the same order, the same Payrail key) instead of starting a new one that
/// would find its own hold taken.
#[tokio::test]
async fn a_click_still_settling_past_the_ttl_keeps_its_key_and_its_order() {
    let app = spawn_app_with(|s| {
        s.payrail.timeout_ms = 300;
        s.payrail.max_attempts = 1;
        s.idempotency.ttl_secs = 2;
        s.idempotency.lease_secs = 1;
    })
    .await;
    let seats = app.seed("show", 1, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    let key = new_key();
    let timed_out = Seen::of(app.post_order("alice", &key, &[hold], "pm_card_slow").await).await;
    assert_eq!(timed_out.status, 504, "{:?}", timed_out.slug);
    tokio::time::sleep(Duration::from_millis(2_300)).await;

    let pool = stagedoor_checkout::db::pool(&app.settings.database).unwrap();
    let cleanup = Cleanup::new(pool, app.settings.idempotency.ttl());
    assert_eq!(cleanup.run().await.unwrap(), Swept::Deleted(0));
    let linked = "SELECT count(*) FROM idempotency_keys WHERE effect IS NOT NULL";
    assert_eq!(app.count(linked).await, 1, "the settling key stays, linked");

    let retry = Seen::of(app.post_order("alice", &key, &[hold], "pm_card_slow").await).await;
    assert_ne!(
        retry.slug.as_deref(),
        Some("hold-unavailable"),
        "the retry resumes its own order"
    );
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 1);
    assert_eq!(
        app.buyer_keys().await,
        1,
        "the click's one key, linked or answered with its order (the invariants)"
    );
    assert!(app.charges().await.len() <= 1);
    assert_invariants(&app).await;
}
