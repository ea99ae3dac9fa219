//! The shop hears every outcome: each settled order makes exactly one
//! signed event, whichever path settled it (the click, Payrail's event,
//! reconciliation, a takeover, the give-up), delivered to a real receiver
//! at least once under one id, across failures, late answers, a crash and
//! two instances, and given up (and counted) when the shop stays down.

use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stagedoor_checkout::config::Settings;
use test_support::receiver::{Mode, Received, Receiver};

use crate::cli;
use crate::helpers::{
    new_key, order_body, spawn_app_with, spawn_app_with_events, unix_now, TestApp, OUTCOMES_SECRET,
};
use crate::invariants::assert_invariants;

/// Delivery to `receiver`, looked for every 100 ms, with a short timeout
/// and a backoff that tops out at a second.
fn deliver_to(receiver: &Receiver) -> impl Fn(&mut Settings) {
    let url = receiver.url();
    move |s| {
        s.outcomes.webhook_url = url.clone();
        s.outcomes.webhook_secret = OUTCOMES_SECRET.to_owned().into();
        s.outcomes.poll_ms = 100;
        s.outcomes.timeout_ms = 1_000;
        s.outcomes.max_backoff_secs = 1;
    }
}

/// Alice holds `seat` and clicks once, paying with `method`: the answer.
async fn click(app: &TestApp, seat: i64, method: &str) -> (u16, Value) {
    let hold = app.hold("alice", seat).await;
    let response = app.post_order("alice", &new_key(), &[hold], method).await;
    let status = response.status().as_u16();
    (status, response.json().await.unwrap_or_default())
}

/// The requests that carried `order_id`'s event.
fn of_order<'a>(received: &'a [Received], order_id: &str) -> Vec<&'a Received> {
    received
        .iter()
        .filter(|r| r.json()["data"]["order"]["order_id"] == order_id)
        .collect()
}

/// Waits until the receiver has acknowledged `order_id`'s event; every
/// request that carried it.
async fn delivered(receiver: &Receiver, order_id: &str, within: Duration) -> Vec<Received> {
    let received = receiver
        .until(within, |r| {
            of_order(r, order_id).iter().any(|r| r.acknowledged())
        })
        .await;
    let carried: Vec<Received> = of_order(&received, order_id).into_iter().cloned().collect();
    assert!(
        carried.iter().any(Received::acknowledged),
        "order {order_id}'s event was not delivered within {within:?}: {carried:?}"
    );
    carried
}

/// The delivery is what SPEC §12 says: a JSON `POST` signed with
/// `Stagedoor-Signature` over `<t>.<body>`, `t` now, and the event of
/// `order` (as `GET /orders/{id}` shows it) for alice.
async fn assert_signed_event_of(app: &TestApp, delivery: &Received, kind: &str) -> String {
    assert_eq!(delivery.method, "POST");
    assert_eq!(delivery.header("content-type"), Some("application/json"));
    let signature = delivery.header("stagedoor-signature").expect("signed");
    let t: u64 = signature
        .strip_prefix("t=")
        .and_then(|rest| rest.split(',').next())
        .and_then(|t| t.parse().ok())
        .expect("t=<unix seconds>");
    assert!(unix_now().abs_diff(t) < 60, "t is now: {signature}");
    assert_eq!(
        signature,
        payrail_sandbox::sign(OUTCOMES_SECRET.as_bytes(), t, &delivery.body),
        "the HMAC-SHA256 of <t>.<body> under outcomes.webhook_secret"
    );
    let event = delivery.json();
    let order_id = event["data"]["order"]["order_id"].as_str().unwrap();
    let shown: Value = app.get_order("alice", order_id).await.json().await.unwrap();
    let id = event["id"].as_str().expect("an id");
    assert!(id.starts_with("evt_"), "{id}");
    assert_eq!(event["type"], kind);
    assert_eq!(event["data"]["order"], shown, "the order as GET shows it");
    assert_eq!(event["data"]["user_id"], "alice");
    let created = event["created"].as_u64().expect("created, unix seconds");
    assert!(unix_now().abs_diff(created) < 60, "{created}");
    id.to_owned()
}

/// The rows of `order_id`'s events: (event id, delivered).
async fn event_rows(app: &TestApp, order_id: &str) -> Vec<(String, bool)> {
    app.db
        .client()
        .await
        .query(
            "SELECT event_id, delivered_at IS NOT NULL FROM order_events
             WHERE order_id = $1::text::uuid",
            &[&order_id],
        )
        .await
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect()
}

/// Ends a test: the order's one event, delivered, is the one every request
/// carried; what the receiver acknowledged agrees with the tables.
async fn assert_one_event_delivered(
    app: &TestApp,
    receiver: &Receiver,
    order_id: &str,
    carried: &[Received],
) {
    let rows = event_rows(app, order_id).await;
    assert_eq!(rows.len(), 1, "one event for order {order_id}: {rows:?}");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !event_rows(app, order_id).await[0].1 {
        assert!(Instant::now() < deadline, "never marked delivered");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for delivery in carried {
        assert_eq!(delivery.json()["id"], rows[0].0, "one id on every delivery");
        assert_eq!(delivery.body, carried[0].body, "the same bytes every time");
    }
    let violations =
        test_support::invariants::events_violations(&app.db.client().await, &receiver.received())
            .await;
    assert!(violations.is_empty(), "{violations:?}");
    assert_invariants(app).await;
}

#[tokio::test]
async fn a_paid_click_makes_one_signed_event_with_the_order_as_get_shows_it() {
    let receiver = Receiver::start().await;
    let app = spawn_app_with(deliver_to(&receiver)).await;
    let seats = app.seed("ev", 1, 1_000).await;
    let (status, order) = click(&app, seats[0], "pm_card_visa").await;
    assert_eq!(status, 201);
    let order_id = order["order_id"].as_str().unwrap();
    let carried = delivered(&receiver, order_id, Duration::from_secs(10)).await;
    assert_signed_event_of(&app, &carried[0], "order.paid").await;
    assert_eq!(carried.len(), 1, "answered 200 at once: sent once");
    assert_one_event_delivered(&app, &receiver, order_id, &carried).await;
}

#[tokio::test]
async fn a_declined_click_makes_one_order_declined_event() {
    let receiver = Receiver::start().await;
    let app = spawn_app_with(deliver_to(&receiver)).await;
    let seats = app.seed("ev", 1, 1_000).await;
    let (status, problem) = click(&app, seats[0], "pm_card_declined").await;
    assert_eq!(status, 402);
    let order_id = problem["order_id"].as_str().unwrap();
    let carried = delivered(&receiver, order_id, Duration::from_secs(10)).await;
    assert_signed_event_of(&app, &carried[0], "order.declined").await;
    assert_one_event_delivered(&app, &receiver, order_id, &carried).await;
}

#[tokio::test]
async fn an_order_settled_by_payrails_event_makes_one_event() {
    let receiver = Receiver::start().await;
    let deliver = deliver_to(&receiver);
    let app = spawn_app_with_events(|s| {
        deliver(s);
        s.payrail.max_attempts = 1;
    })
    .await;
    let seats = app.seed("ev", 1, 1_000).await;
    // Payrail charges, then loses its answer: only its event can settle.
    app.set_faults(json!({"drop_after_charge_rate": 1.0})).await;
    let (status, _) = click(&app, seats[0], "pm_card_visa").await;
    assert!(status >= 500, "{status}");
    let order_id = app.last_charged_order().await;
    let carried = delivered(&receiver, &order_id, Duration::from_secs(10)).await;
    assert_signed_event_of(&app, &carried[0], "order.paid").await;
    assert_one_event_delivered(&app, &receiver, &order_id, &carried).await;
}

#[tokio::test]
async fn an_order_settled_by_reconciliation_makes_one_event() {
    let receiver = Receiver::start().await;
    let deliver = deliver_to(&receiver);
    let app = spawn_app_with(|s| {
        deliver(s);
        s.payrail.max_attempts = 1;
        s.reconcile.interval_secs = 1;
        s.reconcile.grace_secs = 0;
    })
    .await;
    let seats = app.seed("ev", 1, 1_000).await;
    app.set_faults(json!({"drop_after_charge_rate": 1.0})).await;
    let (status, _) = click(&app, seats[0], "pm_card_visa").await;
    assert!(status >= 500, "{status}");
    app.set_faults(json!({})).await;
    let order_id = app.last_charged_order().await;
    let carried = delivered(&receiver, &order_id, Duration::from_secs(15)).await;
    assert_signed_event_of(&app, &carried[0], "order.paid").await;
    assert_one_event_delivered(&app, &receiver, &order_id, &carried).await;
}

#[tokio::test]
async fn an_order_given_up_makes_one_order_failed_event() {
    let receiver = Receiver::start().await;
    let deliver = deliver_to(&receiver);
    let app = spawn_app_with(|s| {
        deliver(s);
        s.payrail.max_attempts = 1;
        s.reconcile.interval_secs = 1;
        s.reconcile.grace_secs = 0;
        s.reconcile.give_up_secs = 2;
    })
    .await;
    let seats = app.seed("ev", 1, 1_000).await;
    let (status, _) = click(&app, seats[0], "pm_card_error").await;
    assert_eq!(status, 503);
    let order_id = app.only_order_id().await;
    let carried = delivered(&receiver, &order_id, Duration::from_secs(20)).await;
    assert_signed_event_of(&app, &carried[0], "order.failed").await;
    assert_one_event_delivered(&app, &receiver, &order_id, &carried).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_order_settled_by_a_takeover_makes_one_event() {
    let receiver = Receiver::start().await;
    let deliver = deliver_to(&receiver);
    let app = spawn_app_with(|s| {
        deliver(s);
        s.idempotency.lease_secs = 1;
    })
    .await;
    let seats = app.seed("ev", 1, 1_000).await;
    let hold = app.hold("alice", seats[0]).await;
    // The click's process dies while Payrail sits on its answer.
    let (mut process, key, in_flight) = app.order_charged_on_a_process(hold).await;
    process.kill().await;
    assert!(in_flight.await.unwrap().is_err());
    app.set_faults(json!({})).await;
    // Its retry takes the key over and settles the order it made.
    let body = order_body(&[hold], "pm_card_visa");
    let deadline = Instant::now() + Duration::from_secs(10);
    let order = loop {
        let retry = app.post_order_raw("alice", &key, &body).await;
        if retry.status() == 201 {
            break retry.json::<Value>().await.unwrap();
        }
        assert!(Instant::now() < deadline, "still {}", retry.status());
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let order_id = order["order_id"].as_str().unwrap();
    let carried = delivered(&receiver, order_id, Duration::from_secs(10)).await;
    assert_signed_event_of(&app, &carried[0], "order.paid").await;
    assert_one_event_delivered(&app, &receiver, order_id, &carried).await;
}

#[tokio::test]
async fn a_failing_shop_gets_the_event_again_under_the_same_id() {
    let receiver = Receiver::start().await;
    receiver.set(Mode::Answer(503));
    let app = spawn_app_with(deliver_to(&receiver)).await;
    let seats = app.seed("ev", 1, 1_000).await;
    let (_, order) = click(&app, seats[0], "pm_card_visa").await;
    let order_id = order["order_id"].as_str().unwrap();
    let failed = receiver
        .until(Duration::from_secs(10), |r| {
            of_order(r, order_id).len() >= 3
        })
        .await;
    assert!(
        of_order(&failed, order_id).len() >= 3,
        "retried: {failed:?}"
    );
    // The dropped connection, then a shop that is back.
    receiver.set(Mode::Crash);
    let before = receiver.received().len();
    receiver
        .until(Duration::from_secs(10), |r| r.len() > before)
        .await;
    receiver.set(Mode::Accept);
    let carried = delivered(&receiver, order_id, Duration::from_secs(10)).await;
    assert!(carried.len() >= 4, "{carried:?}");
    let waits: Vec<Duration> = carried
        .windows(2)
        .map(|pair| pair[1].at - pair[0].at)
        .collect();
    assert!(
        waits.iter().all(|wait| *wait >= Duration::from_millis(800)),
        "each retry after the backoff: {waits:?}"
    );
    assert_one_event_delivered(&app, &receiver, order_id, &carried).await;
    // Delivered: never sent again.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(
        of_order(&receiver.received(), order_id).len(),
        carried.len()
    );
}

#[tokio::test]
async fn a_shop_that_answers_2xx_after_the_timeout_gets_it_again_under_the_same_id() {
    let receiver = Receiver::start().await;
    receiver.set(Mode::Slow(Duration::from_millis(1_500)));
    let deliver = deliver_to(&receiver);
    let app = spawn_app_with(|s| {
        deliver(s);
        s.outcomes.timeout_ms = 300;
    })
    .await;
    let seats = app.seed("ev", 1, 1_000).await;
    let (_, order) = click(&app, seats[0], "pm_card_visa").await;
    let order_id = order["order_id"].as_str().unwrap();
    let late = receiver
        .until(Duration::from_secs(10), |r| {
            of_order(r, order_id).iter().any(|r| r.acknowledged())
                && of_order(r, order_id).len() >= 2
        })
        .await;
    let late = of_order(&late, order_id);
    assert!(late.len() >= 2, "sent again after the late 200: {late:?}");
    // The timeout was recorded as a failure: the retry came after the
    // backoff (1 s), not after the lease ran out (the timeout and 5 s).
    let gap = late[1].at - late[0].at;
    assert!(gap < Duration::from_secs(3), "retried after {gap:?}");
    receiver.set(Mode::Accept);
    let carried = receiver
        .until(Duration::from_secs(10), |r| {
            of_order(r, order_id).iter().any(|r| {
                r.acknowledged() && r.at >= late[late.len() - 1].at + Duration::from_millis(1)
            })
        })
        .await;
    let carried: Vec<Received> = of_order(&carried, order_id).into_iter().cloned().collect();
    assert_one_event_delivered(&app, &receiver, order_id, &carried).await;
}

#[tokio::test]
async fn a_shop_down_past_the_retries_has_its_event_given_up_counted_and_resent_by_hand() {
    let receiver = Receiver::start().await;
    receiver.set(Mode::Answer(500));
    let deliver = deliver_to(&receiver);
    let app = spawn_app_with(|s| {
        deliver(s);
        s.outcomes.retry_for_secs = 2;
    })
    .await;
    let seats = app.seed("ev", 1, 1_000).await;
    let (_, order) = click(&app, seats[0], "pm_card_visa").await;
    let order_id = order["order_id"].as_str().unwrap().to_owned();
    let deadline = Instant::now() + Duration::from_secs(15);
    while app
        .count("SELECT count(*) FROM order_events WHERE given_up_at IS NOT NULL")
        .await
        == 0
    {
        assert!(Instant::now() < deadline, "never given up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let tried = of_order(&receiver.received(), &order_id).len();
    assert!(tried >= 2, "tried until given up: {tried}");
    let metrics = app.metrics().await;
    assert!(
        metrics.contains("order_events_given_up_total 1"),
        "{metrics}"
    );
    // Given up: not sent again.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(of_order(&receiver.received(), &order_id).len(), tried);

    // The operator sees it, and once the shop is back, sends it again.
    let shown = cli::run(
        &app,
        &["outcomes", "show", "--user", "alice", "--order", &order_id],
        &[],
    )
    .await;
    assert_eq!(shown.status.code(), Some(0), "{shown:?}");
    let document: Value = serde_json::from_slice(&shown.stdout).unwrap();
    assert_eq!(document["event"]["state"], "given_up", "{document}");
    assert_eq!(document["event"]["type"], "order.paid");
    assert!(
        document["event"]["last_error"]
            .as_str()
            .unwrap()
            .contains("500"),
        "{document}"
    );
    receiver.set(Mode::Accept);
    let resent = cli::run(
        &app,
        &[
            "outcomes", "resend", "--user", "alice", "--order", &order_id,
        ],
        &[],
    )
    .await;
    assert_eq!(resent.status.code(), Some(0), "{resent:?}");
    let document: Value = serde_json::from_slice(&resent.stdout).unwrap();
    assert_eq!(document["event"]["state"], "pending", "{document}");
    let carried = delivered(&receiver, &order_id, Duration::from_secs(10)).await;
    assert_one_event_delivered(&app, &receiver, &order_id, &carried).await;

    let unknown = uuid::Uuid::new_v4().to_string();
    let none = cli::run(
        &app,
        &["outcomes", "show", "--user", "alice", "--order", &unknown],
        &[],
    )
    .await;
    assert_eq!(none.status.code(), Some(1), "{none:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_event_cut_off_by_a_crash_is_delivered_after_the_restart() {
    let receiver = Receiver::start().await;
    receiver.set(Mode::Stall);
    // This instance delivers nothing; the process does, and dies.
    let app = spawn_app_with(|_| {}).await;
    let mut delivering = app.settings.clone();
    deliver_to(&receiver)(&mut delivering);
    let mut process = app.spawn_process_with(&delivering).await;
    let seats = app.seed("ev", 1, 1_000).await;
    let hold = app.hold("alice", seats[0]).await;
    let answer = app
        .in_flight(
            &process,
            "/orders",
            &new_key(),
            order_body(&[hold], "pm_card_visa"),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answer.status(), 201);
    let order: Value = answer.json().await.unwrap();
    let order_id = order["order_id"].as_str().unwrap();
    receiver
        .until(Duration::from_secs(10), |r| {
            !of_order(r, order_id).is_empty()
        })
        .await;
    process.kill().await;
    assert!(
        !event_rows(&app, order_id).await[0].1,
        "in flight when the process died"
    );

    receiver.set(Mode::Accept);
    let _restarted = TestApp::start(app.db.clone(), app.sandbox.clone(), delivering).await;
    let carried = delivered(&receiver, order_id, Duration::from_secs(15)).await;
    assert!(carried.len() >= 2, "{carried:?}");
    assert_one_event_delivered(&app, &receiver, order_id, &carried).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_deliver_each_event_once() {
    let receiver = Receiver::start().await;
    receiver.set(Mode::Slow(Duration::from_millis(200)));
    let app = spawn_app_with(deliver_to(&receiver)).await;
    let other = app.another_instance().await;
    let seats = app.seed("ev", 8, 1_000).await;
    let mut order_ids = Vec::new();
    for (i, seat) in seats.iter().enumerate() {
        let instance = if i % 2 == 0 { &app } else { &other };
        let (status, order) = click(instance, *seat, "pm_card_visa").await;
        assert_eq!(status, 201);
        order_ids.push(order["order_id"].as_str().unwrap().to_owned());
    }
    for order_id in &order_ids {
        let carried = delivered(&receiver, order_id, Duration::from_secs(15)).await;
        assert_eq!(carried.len(), 1, "sent once: {carried:?}");
        assert_one_event_delivered(&app, &receiver, order_id, &carried).await;
    }
    assert_eq!(receiver.received().len(), order_ids.len());
}

#[tokio::test]
async fn a_pending_order_has_no_event_and_without_a_url_nothing_is_sent() {
    let receiver = Receiver::start().await;
    // Delivery off: the events are still written with their orders.
    let app = spawn_app_with(|s| s.payrail.max_attempts = 1).await;
    let seats = app.seed("ev", 2, 1_000).await;
    let (status, order) = click(&app, seats[0], "pm_card_visa").await;
    assert_eq!(status, 201);
    let (status, _) = click(&app, seats[1], "pm_card_error").await;
    assert_eq!(status, 503);
    assert_eq!(
        app.count("SELECT count(*) FROM orders WHERE status = 'payment_pending'")
            .await,
        1
    );
    let order_id = order["order_id"].as_str().unwrap();
    assert_eq!(event_rows(&app, order_id).await.len(), 1);
    assert_eq!(app.count("SELECT count(*) FROM order_events").await, 1);
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(receiver.received().is_empty());
    assert_invariants(&app).await;
}
