//! The per-buyer limit on new intents: past it a new click is 429 and
//! writes nothing, while every retry still reaches its answer and other
//! buyers go on unhindered.

use crate::helpers::{new_key, spawn_app_with, Seen};
use crate::invariants::assert_invariants;

#[tokio::test]
async fn a_buyer_past_the_limit_gets_429_and_writes_nothing_while_retries_and_others_go_on() {
    let app = spawn_app_with(|s| {
        s.limits.new_keys_per_sec = 1;
        s.limits.burst = 3;
    })
    .await;
    let seats = app.seed("show", 8, 2500).await;

    // Three keyed holds fit the burst; the first is answered and kept.
    let first_key = new_key();
    let first = Seen::of(app.post_hold("mallory", seats[0], Some(&first_key)).await).await;
    assert_eq!(first.status, 201);
    for seat in &seats[1..3] {
        let seen = Seen::of(app.post_hold("mallory", *seat, Some(&new_key())).await).await;
        assert_eq!(seen.status, 201);
    }

    // The next new click is refused, with nothing written for its key.
    let refused_key = new_key();
    let refused = Seen::of(app.post_hold("mallory", seats[3], Some(&refused_key)).await).await;
    assert_eq!(refused.status, 429);
    assert_eq!(refused.problem(), "rate-limited");
    let retry_after: u64 = refused
        .retry_after
        .as_deref()
        .and_then(|v| v.parse().ok())
        .expect("a Retry-After in seconds");
    assert!((1..=2).contains(&retry_after), "{retry_after}");
    let rows = app
        .db
        .client()
        .await
        .query_one(
            "SELECT count(*) FROM idempotency_keys WHERE key = $1",
            &[&refused_key],
        )
        .await
        .unwrap()
        .get::<_, i64>(0);
    assert_eq!(rows, 0, "a refused click stores nothing");
    assert_eq!(app.count("SELECT count(*) FROM holds").await, 3);
    // An unkeyed hold is a new intent too.
    assert_eq!(app.post_hold("mallory", seats[4], None).await.status(), 429);

    // A retry of the answered click still gets its replay, byte for byte.
    let replay = Seen::of(app.post_hold("mallory", seats[0], Some(&first_key)).await).await;
    assert_eq!((replay.status, replay.replayed), (201, true));
    assert_eq!(replay.body, first.body);

    // Another buyer's checkout goes on.
    let other = Seen::of(app.post_hold("alice", seats[5], Some(&new_key())).await).await;
    assert_eq!(other.status, 201);
    let order = Seen::of(
        app.post_order(
            "alice",
            &new_key(),
            &[other.json()["hold_id"].as_i64().unwrap()],
            "pm_card_visa",
        )
        .await,
    )
    .await;
    assert_eq!(order.status, 201);

    // The bucket refills: after Retry-After a new click is taken again.
    tokio::time::sleep(std::time::Duration::from_secs(retry_after)).await;
    let later = Seen::of(app.post_hold("mallory", seats[3], Some(&refused_key)).await).await;
    assert_eq!(
        later.status,
        201,
        "{}",
        String::from_utf8_lossy(&later.body)
    );
    assert_invariants(&app).await;
}

/// A refusal costs the refused nothing but an in-memory check: past the
/// limit, a new click is answered 429 with the database gone, where a
/// click that is not refused finds it gone.
#[tokio::test]
async fn a_click_past_the_limit_is_refused_without_a_statement() {
    let app = spawn_app_with(|s| {
        s.limits.new_keys_per_sec = 1;
        s.limits.burst = 1;
        s.database.pool_timeout_ms = 1_000;
    })
    .await;
    let seats = app.seed("show", 4, 2500).await;
    let held = Seen::of(app.post_hold("mallory", seats[0], Some(&new_key())).await).await;
    assert_eq!(held.status, 201);

    // The database takes no connection any more, and the instance's are cut.
    app.db.close().await;

    let refused = Seen::of(app.post_hold("mallory", seats[1], Some(&new_key())).await).await;
    assert_eq!(
        (refused.status, refused.problem()),
        (429, "rate-limited".to_owned()),
        "{}",
        String::from_utf8_lossy(&refused.body)
    );
    assert_eq!(app.post_hold("mallory", seats[2], None).await.status(), 429);
    let order = app
        .post_order(
            "mallory",
            &new_key(),
            &[held.json()["hold_id"].as_i64().unwrap()],
            "pm_card_visa",
        )
        .await;
    assert_eq!(order.status(), 429);
    // Another buyer's click, under its own limit, does meet the database.
    let other = app
        .post_hold("alice", seats[3], Some(&new_key()))
        .await
        .status();
    assert!(other.is_server_error(), "{other}");
}
