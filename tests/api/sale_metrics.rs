//! The sale, as `/metrics` tells it, on a process of its own (the recorder
//! is process-wide): orders by final status and decline reason, holds by
//! how they ended (an expiry counted once, though two instances look),
//! seats by status for the events still on sale, and the order events'
//! backlog without a webhook URL.

use std::time::{Duration, Instant};

use serde_json::json;
use test_support::process::ServiceProcess;

use crate::helpers::{new_key, order_body, spawn_app, TestApp};

/// `/metrics` of `process`: each sample line's series and value.
async fn samples(app: &TestApp, process: &ServiceProcess) -> Vec<(String, String)> {
    let text = app
        .http
        .get(format!("{}/metrics", process.url()))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.is_empty())
        .filter_map(|line| line.rsplit_once(' '))
        .map(|(series, value)| (series.to_owned(), value.to_owned()))
        .collect()
}

/// Waits (up to `patience`) until every series of `expected` has its value
/// on `process`'s page.
async fn until_shown(
    app: &TestApp,
    process: &ServiceProcess,
    expected: &[(&str, &str)],
    patience: Duration,
) -> Vec<(String, String)> {
    let started = Instant::now();
    loop {
        let page = samples(app, process).await;
        let missing: Vec<_> = expected
            .iter()
            .filter(|(series, value)| !page.iter().any(|(s, v)| s == series && v == value))
            .collect();
        if missing.is_empty() {
            return page;
        }
        assert!(
            started.elapsed() < patience,
            "still not shown: {missing:?}\nin {page:#?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test]
async fn the_sale_is_counted_once_each_and_seats_shown_for_events_on_sale() {
    let app = spawn_app().await;
    let seats = app.seed("sale", 4, 4_500).await;
    let gone = app.seed("gone", 1, 4_500).await;
    // Two instances look at the same holds: an expiry is counted by one.
    // (The test's own instance, whose counts are every in-process test's,
    // stays out.)
    app.stop().await;
    let first = app.spawn_process().await;
    let second = app.spawn_process().await;
    let url = first.url().to_owned();
    let post = |path: &str, buyer: &str| {
        app.http
            .post(format!("{url}{path}"))
            .bearer_auth(app.token(buyer))
    };
    let hold = |buyer: &'static str, seat: i64| {
        let request = post("/holds", buyer).json(&json!({ "seat_id": seat }));
        async move {
            let hold: serde_json::Value = request.send().await.unwrap().json().await.unwrap();
            hold["hold_id"].as_i64().unwrap()
        }
    };
    let order = |buyer: &'static str, holds: Vec<i64>, card: &'static str| {
        let request = post("/orders", buyer)
            .header("Idempotency-Key", new_key())
            .header("Content-Type", "application/json")
            .body(order_body(&holds, card));
        async move { request.send().await.unwrap().status() }
    };

    let paid = hold("alice", seats[0]).await;
    assert_eq!(order("alice", vec![paid], "pm_card_visa").await, 201);
    let gone_hold = hold("alice", gone[0]).await;
    assert_eq!(order("alice", vec![gone_hold], "pm_card_visa").await, 201);
    let declined = hold("bob", seats[1]).await;
    assert_eq!(order("bob", vec![declined], "pm_card_declined").await, 402);
    let released = hold("carol", seats[2]).await;
    let deleted = app
        .http
        .delete(format!("{url}/holds/{released}"))
        .bearer_auth(app.token("carol"))
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 204);
    // A hold whose time ran out just now.
    let expired = hold("dave", seats[3]).await;
    let client = app.db.client().await;
    client
        .execute(
            "UPDATE holds SET created_at = now() - interval '10 minutes',
                              expires_at = now() - interval '1 second'
             WHERE hold_id = $1",
            &[&expired],
        )
        .await
        .unwrap();

    let counted = [
        (r#"orders_settled_total{status="paid",reason="none"}"#, "2"),
        (
            r#"orders_settled_total{status="declined",reason="card_declined"}"#,
            "1",
        ),
        (r#"holds_ended_total{how="ordered"}"#, "2"),
        (r#"holds_ended_total{how="released"}"#, "1"),
        (r#"event_seats{event_id="sale",status="sold"}"#, "1"),
        (r#"event_seats{event_id="sale",status="held"}"#, "1"),
        (r#"event_seats{event_id="sale",status="available"}"#, "2"),
        ("order_events_pending", "3"),
    ];
    let page = until_shown(&app, &first, &counted, Duration::from_secs(25)).await;
    assert!(
        !page
            .iter()
            .any(|(series, _)| series.contains(r#"event_id="gone""#)),
        "a sold-out event is not on sale: {page:#?}"
    );

    // The window of the expiry passes (15 s, counted 2 s after its end,
    // looked at every 5 s): one of the two instances counts it.
    let expired_once = [(r#"holds_ended_total{how="expired"}"#, "1")];
    let patience = Duration::from_secs(40);
    let started = Instant::now();
    loop {
        let mut counts = Vec::new();
        for process in [&first, &second] {
            let page = samples(&app, process).await;
            let count = page
                .iter()
                .find(|(series, _)| series == expired_once[0].0)
                .map_or(0, |(_, value)| value.parse::<u32>().unwrap());
            counts.push(count);
        }
        if counts.iter().sum::<u32>() > 0 {
            // Both have looked at that window by the next tick.
            tokio::time::sleep(Duration::from_secs(6)).await;
            let mut total = 0;
            for process in [&first, &second] {
                total += samples(&app, process)
                    .await
                    .iter()
                    .find(|(series, _)| series == expired_once[0].0)
                    .map_or(0, |(_, value)| value.parse::<u32>().unwrap());
            }
            assert_eq!(total, 1, "counted once across the two instances");
            break;
        }
        assert!(started.elapsed() < patience, "never counted: {counts:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
