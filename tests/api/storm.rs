//! Duplicate storms: many copies of one click at once, over two instances
//! on one database.

use std::sync::Arc;

use serde_json::json;
use tokio::sync::Barrier;

use crate::helpers::{new_key, order_body, spawn_app, Seen, TestApp};
use crate::invariants::assert_invariants;

const KEYS: usize = 20;
const COPIES: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_storm_of_duplicates_over_two_instances_makes_one_order_and_one_charge_per_key() {
    let first = Arc::new(spawn_app().await);
    let second = Arc::new(first.another_instance().await);
    let seats = first.seed("storm", KEYS as u32, 1500).await;
    let mut clicks = Vec::new();
    for (i, seat) in seats.iter().enumerate() {
        let buyer = format!("storm-{i}");
        let hold = first.hold(&buyer, *seat).await;
        clicks.push((buyer, new_key(), order_body(&[hold], "pm_card_visa")));
    }

    let barrier = Arc::new(Barrier::new(KEYS * COPIES));
    let mut tasks = Vec::new();
    for (i, (buyer, key, body)) in clicks.iter().enumerate() {
        for copy in 0..COPIES {
            let app: Arc<TestApp> = if (i + copy) % 2 == 0 {
                first.clone()
            } else {
                second.clone()
            };
            let (barrier, buyer, key, body) =
                (barrier.clone(), buyer.clone(), key.clone(), body.clone());
            tasks.push(tokio::spawn(async move {
                barrier.wait().await;
                (
                    key.clone(),
                    Seen::of(app.post_order_raw(&buyer, &key, &body).await).await,
                )
            }));
        }
    }

    let mut created: std::collections::HashMap<String, Vec<u8>> = Default::default();
    for task in tasks {
        let (key, seen) = task.await.unwrap();
        match seen.status {
            201 => {
                let body = created.entry(key).or_insert_with(|| seen.body.clone());
                assert_eq!(*body, seen.body, "every 201 of one key is identical");
            }
            409 => assert_eq!(seen.problem(), "request-in-progress"),
            other => panic!(
                "unexpected {other}: {}",
                String::from_utf8_lossy(&seen.body)
            ),
        }
    }

    assert_eq!(
        first.count("SELECT count(*) FROM orders").await,
        KEYS as i64
    );
    let ledger = first.charges().await;
    assert_eq!(ledger.len(), KEYS, "one charge per key");
    // Every key ends answered: a retry now replays its 201.
    for (buyer, key, body) in &clicks {
        let seen = Seen::of(first.post_order_raw(buyer, key, body).await).await;
        assert_eq!((seen.status, seen.replayed), (201, true));
        if let Some(earlier) = created.get(key) {
            assert_eq!(&seen.body, earlier);
        }
    }
    assert_invariants(&first).await;
}

#[tokio::test]
async fn an_answer_dropped_after_the_charge_heals_into_one_charge() {
    let app = spawn_app().await;
    let seats = app.seed("show", 1, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    app.set_faults(json!({"drop_after_charge_rate": 1.0})).await;

    let seen = Seen::of(
        app.post_order("alice", &new_key(), &[hold], "pm_card_visa")
            .await,
    )
    .await;
    assert_eq!(seen.status, 201, "{}", String::from_utf8_lossy(&seen.body));
    let ledger = app.charges().await;
    assert_eq!(ledger.len(), 1);
    assert!(
        ledger[0]["requests"].as_u64().unwrap() >= 2,
        "the retry asked again"
    );
    assert_invariants(&app).await;
}
