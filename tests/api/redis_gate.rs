//! The Redis gate (`idempotency.lock = redis`): in front of the
//! table, never instead of it. The rest of the suite runs in this mode too
//! with `STAGEDOOR_TEST_LOCK=redis` (see `.ci/run`).

use stagedoor_checkout::config::LockMode;

use crate::helpers::{new_key, spawn_app_with, Seen};

async fn redis() -> redis::aio::MultiplexedConnection {
    redis::Client::open("redis://127.0.0.1:6379")
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .expect("Redis must run (scripts/services.sh starts it)")
}

#[tokio::test]
async fn a_held_gate_turns_duplicates_away_without_writing_to_the_table() {
    let app = spawn_app_with(|s| s.idempotency.lock = LockMode::Redis).await;
    let seats = app.seed("show", 1, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    let key = new_key();
    let mut redis = redis().await;
    // Another request of this click is in flight and holds the gate.
    let _: () = redis::cmd("SET")
        .arg(format!("idem:alice:{key}"))
        .arg(1)
        .arg("EX")
        .arg(30)
        .query_async(&mut redis)
        .await
        .unwrap();

    let turned_away = Seen::of(app.post_order("alice", &key, &[hold], "pm_card_visa").await).await;
    assert_eq!(turned_away.problem(), "request-in-progress");
    assert_eq!(turned_away.retry_after.as_deref(), Some("1"));
    assert_eq!(app.buyer_keys().await, 0);

    let _: () = redis::cmd("DEL")
        .arg(format!("idem:alice:{key}"))
        .query_async(&mut redis)
        .await
        .unwrap();
    let first = Seen::of(app.post_order("alice", &key, &[hold], "pm_card_visa").await).await;
    assert_eq!(first.status, 201);
    let lock: Option<String> = redis::cmd("GET")
        .arg(format!("idem:alice:{key}"))
        .query_async(&mut redis)
        .await
        .unwrap();
    assert_eq!(lock, None, "the gate opens when the claim is over");

    // A lock that outlives its request (or expires early) never causes a
    // second execution: the table still holds the answer.
    let _: () = redis::cmd("SET")
        .arg(format!("idem:alice:{key}"))
        .arg(1)
        .arg("EX")
        .arg(30)
        .query_async(&mut redis)
        .await
        .unwrap();
    let replay = Seen::of(app.post_order("alice", &key, &[hold], "pm_card_visa").await).await;
    assert_eq!((replay.status, replay.replayed), (201, true));
    assert_eq!(replay.body, first.body);
    assert_eq!(app.charges().await.len(), 1);
}
