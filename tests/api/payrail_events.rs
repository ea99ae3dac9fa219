//! `POST /payrail/events`: Payrail's signed events settle a pending order at
//! once, each event once, through the one settlement path; anything not
//! signed right is 400 and writes nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use reqwest::Response;
use serde_json::{json, Value};
use tokio::sync::Barrier;

use crate::helpers::{
    event_body, new_key, order_body, sign_now, spawn_app_with, spawn_app_with_events, unix_now,
    webhook_secret, TestApp,
};
use crate::invariants::assert_invariants;

/// A click whose every answer from Payrail is lost after the charge (one
/// attempt): its order stays pending, charged at Payrail. The key, the
/// hold and the ledger's charge (the latest).
async fn lost_answer_click(app: &TestApp, seat: i64) -> (String, i64, Value) {
    let hold = app.hold("alice", seat).await;
    app.set_faults(json!({"drop_after_charge_rate": 1.0})).await;
    let key = new_key();
    let first = app.post_order("alice", &key, &[hold], "pm_card_visa").await;
    assert!(first.status().is_server_error(), "{}", first.status());
    app.set_faults(json!({})).await;
    let charge = app.charges().await.pop().expect("the charge was made");
    assert_eq!(charge["status"], "succeeded");
    (key, hold, charge)
}

/// The click again (paid with `method`), waiting for its answer.
async fn retry_waiting(app: &TestApp, base: &str, key: &str, hold: i64, method: &str) -> Response {
    app.as_buyer(app.http.post(format!("{base}/orders")), "alice")
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .header("Prefer", "wait=10")
        .body(order_body(&[hold], method))
        .send()
        .await
        .expect("POST /orders")
}

async fn order_status(app: &TestApp, order_id: &str) -> String {
    let order: Value = app.get_order("alice", order_id).await.json().await.unwrap();
    order["status"].as_str().unwrap().to_owned()
}

async fn result_of(response: Response) -> (u16, bool, String) {
    let status = response.status().as_u16();
    let replayed = response.headers().contains_key("Idempotent-Replayed");
    (status, replayed, response.text().await.unwrap())
}

#[tokio::test]
async fn a_lost_answer_is_settled_by_its_event_and_the_waiting_retry_gets_it() {
    let app = spawn_app_with_events(|s| s.payrail.max_attempts = 1).await;
    let seats = app.seed("ev", 1, 1_000).await;
    let started = Instant::now();
    let (key, hold, charge) = lost_answer_click(&app, seats[0]).await;
    let retry = retry_waiting(&app, &app.address, &key, hold, "pm_card_visa").await;
    assert_eq!(retry.status(), 201);
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "reconciliation is off (interval 3600 s): only the event can have settled it"
    );
    let order: Value = retry.json().await.unwrap();
    assert_eq!(order["status"], "paid");
    assert_eq!(order["charge_id"], charge["id"]);
    // The sandbox counts the delivery once the service's 200 is back,
    // which may come after the retry has its answer.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let sent = app.sent_events().await;
        assert_eq!(sent.len(), 1, "{sent:?}");
        if sent[0]["delivered"] == 1 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "never counted as delivered: {sent:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_invariants(&app).await;
}

#[tokio::test]
async fn the_same_event_five_times_at_once_on_two_instances_settles_once() {
    let app = spawn_app_with(|s| s.payrail.max_attempts = 1).await;
    let other = app.another_instance().await;
    let seats = app.seed("ev", 1, 1_000).await;
    let (key, hold, charge) = lost_answer_click(&app, seats[0]).await;
    let body = Arc::new(event_body("evt_dup_1", "charge.succeeded", &charge));
    let barrier = Arc::new(Barrier::new(10));
    let mut sends = Vec::new();
    for i in 0..10 {
        let base = if i % 2 == 0 {
            app.address.clone()
        } else {
            other.address.clone()
        };
        let (http, body, barrier) = (app.http.clone(), body.clone(), barrier.clone());
        sends.push(tokio::spawn(async move {
            barrier.wait().await;
            http.post(format!("{base}/payrail/events"))
                .header("Payrail-Signature", sign_now(&body))
                .body(body.to_vec())
                .send()
                .await
                .unwrap()
        }));
    }
    let mut results = Vec::new();
    for send in sends {
        results.push(result_of(send.await.unwrap()).await);
    }
    assert!(
        results.iter().all(|(status, ..)| *status == 200),
        "{results:?}"
    );
    assert_eq!(
        results.iter().filter(|(_, replayed, _)| !replayed).count(),
        1,
        "one first answer, nine replays: {results:?}"
    );
    assert!(
        results.iter().all(|(.., body)| *body == results[0].2),
        "{results:?}"
    );
    assert_eq!(results[0].2, r#"{"result":"applied"}"#);
    let retry = retry_waiting(&app, &other.address, &key, hold, "pm_card_visa").await;
    assert_eq!(retry.status(), 201);
    assert_eq!(
        app.count("SELECT count(*) FROM orders WHERE status = 'paid'")
            .await,
        1
    );
    assert_invariants(&app).await;
}

#[tokio::test]
async fn an_event_during_the_services_own_call_settles_once_and_wakes_the_waiting_retry() {
    // The service waits for Payrail's slow answer; the event comes at once.
    let app = spawn_app_with_events(|s| {
        s.payrail.timeout_ms = 10_000;
        s.payrail.max_attempts = 1;
    })
    .await;
    let seats = app.seed("ev", 1, 1_000).await;
    let hold = app.hold("alice", seats[0]).await;
    app.set_faults(json!({"slow_ms": 3_000})).await;
    let key = new_key();
    let started = Instant::now();
    let click = {
        let request = app
            .as_buyer(app.http.post(app.url("/orders")), "alice")
            .header("Idempotency-Key", key.clone())
            .header("Content-Type", "application/json")
            .body(order_body(&[hold], "pm_card_slow"));
        tokio::spawn(async move { request.send().await.unwrap() })
    };
    app.until_charged().await;
    let retry = retry_waiting(&app, &app.address, &key, hold, "pm_card_slow").await;
    let woken_after = started.elapsed();
    assert_eq!(retry.status(), 201);
    assert!(
        woken_after < Duration::from_millis(2_500),
        "the event, not the slow answer, woke the retry: {woken_after:?}"
    );
    assert!(
        !click.is_finished(),
        "the service's own call is still in flight"
    );
    let retried = retry.bytes().await.unwrap();
    let click = click.await.unwrap();
    assert_eq!(click.status(), 201, "the late answer changes nothing");
    assert_eq!(
        click.bytes().await.unwrap(),
        retried,
        "one answer for the click"
    );
    let order: Value = serde_json::from_slice(&retried).unwrap();
    assert_eq!(
        order_status(&app, order["order_id"].as_str().unwrap()).await,
        "paid"
    );
    assert_eq!(app.charges().await.len(), 1);
    assert_invariants(&app).await;
}

#[tokio::test]
async fn an_event_ahead_of_payrails_answer_leaves_the_click_its_first_answer() {
    // Payrail's answer waits 500 ms after the charge; its event leaves at
    // once and settles the order before the service hears back.
    let app = spawn_app_with_events(|s| s.payrail.max_attempts = 1).await;
    let seats = app.seed("ev", 1, 1_000).await;
    let hold = app.hold("alice", seats[0]).await;
    app.set_faults(json!({"latency_ms": 500})).await;
    let key = new_key();
    let click = app.post_order("alice", &key, &[hold], "pm_card_visa").await;
    app.set_faults(json!({})).await;
    let events_applied = app
        .count(
            "SELECT count(*) FROM idempotency_keys
             WHERE user_id = chr(1) || 'payrail-events'
               AND response_body = convert_to('{\"result\":\"applied\"}', 'UTF8')",
        )
        .await;
    assert_eq!(events_applied, 1, "the event settled the order");
    let (status, replayed, body) = result_of(click).await;
    assert_eq!(status, 201, "{body}");
    assert!(!replayed, "the click's own answer is not a replay");
    let (status, replayed, again) =
        result_of(app.post_order("alice", &key, &[hold], "pm_card_visa").await).await;
    assert_eq!((status, replayed), (201, true));
    assert_eq!(again, body, "one answer for the click");
    assert_eq!(app.charges().await.len(), 1);
    assert_invariants(&app).await;
}

#[tokio::test]
async fn late_reordered_unknown_and_contradicting_events_change_nothing() {
    let app = spawn_app_with(|s| s.payrail.max_attempts = 1).await;
    let seats = app.seed("ev", 3, 1_000).await;
    // A: paid by the service's own answer; its event comes late.
    let hold_a = app.hold("alice", seats[0]).await;
    let paid = app
        .post_order("alice", &new_key(), &[hold_a], "pm_card_visa")
        .await;
    assert_eq!(paid.status(), 201);
    let order_a: Value = paid.json().await.unwrap();
    let charge_a = app.charges().await.remove(0);
    // B: pending, its answer lost.
    let (key_b, hold_b, charge_b) = lost_answer_click(&app, seats[1]).await;
    // C: declined by the service's own answer; its holds name it no more.
    let hold_c = app.hold("alice", seats[2]).await;
    let declined = app
        .post_order("alice", &new_key(), &[hold_c], "pm_card_declined")
        .await;
    assert_eq!(declined.status(), 402);
    let order_c = app
        .db
        .client()
        .await
        .query_one(
            "SELECT order_id::text FROM orders WHERE status = 'declined'",
            &[],
        )
        .await
        .unwrap()
        .get::<_, String>(0);

    // Out of order: A's late event before B's, then a decline of A
    // (which A's own answer contradicts), an order of nobody's, a type
    // not acted on.
    let event_b = event_body("evt_b_ok", "charge.succeeded", &charge_b);
    let cases: [(&str, Vec<u8>, &str); 6] = [
        (
            "A's event, late: A is paid already",
            event_body("evt_a_ok", "charge.succeeded", &charge_a),
            "already_settled",
        ),
        ("B's event after A's", event_b.clone(), "applied"),
        (
            "a decline of A, which was paid",
            event_body("evt_a_declined", "charge.declined", &charge_a),
            "contradicting",
        ),
        (
            "C's decline, late: C is declined already, found by its order alone",
            event_body(
                "evt_c_declined",
                "charge.declined",
                &json!({"id": "ch_c", "amount_cents": 1_000, "reference": order_c,
                        "idempotency_key": format!("order-{order_c}")}),
            ),
            "already_settled",
        ),
        (
            "an order that does not exist",
            event_body(
                "evt_unknown",
                "charge.succeeded",
                &json!({"id": "ch_x", "amount_cents": 1, "reference": uuid::Uuid::new_v4().to_string(),
                        "idempotency_key": "order-elsewhere"}),
            ),
            "unknown",
        ),
        (
            "a type this service does not act on",
            {
                let mut event: Value =
                    serde_json::from_slice(&event_body("evt_other", "charge.succeeded", &charge_b))
                        .unwrap();
                event["type"] = json!("charge.refunded");
                event.to_string().into_bytes()
            },
            "unknown",
        ),
    ];
    for (case, body, result) in cases {
        let response = app.post_signed_event(&body).await;
        assert_eq!(response.status(), 200, "{case}");
        let answer: Value = response.json().await.unwrap();
        assert_eq!(answer["result"], result, "{case}");
    }
    let order_a_id = order_a["order_id"].as_str().unwrap();
    assert_eq!(
        order_status(&app, order_a_id).await,
        "paid",
        "the decline changed nothing"
    );
    let retry = retry_waiting(&app, &app.address, &key_b, hold_b, "pm_card_visa").await;
    assert_eq!(retry.status(), 201);
    // B's event delivered again, much later: the same bytes under a new
    // signature (a new `t`), answered as a replay of its first answer.
    let again = app.post_signed_event(&event_b).await;
    assert_eq!(again.status(), 200);
    assert_eq!(again.headers()["Idempotent-Replayed"], "true");
    assert_invariants(&app).await;
}

#[tokio::test]
async fn a_bad_stale_or_tampered_signature_is_400_and_writes_nothing() {
    let app = spawn_app_with(|s| s.payrail.max_attempts = 1).await;
    let seats = app.seed("ev", 1, 1_000).await;
    let (key, hold, charge) = lost_answer_click(&app, seats[0]).await;
    let body = event_body("evt_sig", "charge.succeeded", &charge);
    let now = unix_now();
    let secret = webhook_secret();
    let sign =
        |secret: &str, t: u64, body: &[u8]| payrail_sandbox::sign(secret.as_bytes(), t, body);
    let mut tampered = body.clone();
    let at = tampered.len() - 3;
    tampered[at] = b' ';
    let cases: Vec<(&str, Vec<u8>, Option<String>)> = vec![
        ("no signature", body.clone(), None),
        (
            "another secret",
            body.clone(),
            Some(sign("whsec_wrong", now, &body)),
        ),
        (
            "301 s old",
            body.clone(),
            Some(sign(&secret, now - 301, &body)),
        ),
        // `now` ages while the cases before this one are sent: ahead by
        // more than a slow request takes, the exact second is webhook.rs's.
        (
            "310 s ahead",
            body.clone(),
            Some(sign(&secret, now + 310, &body)),
        ),
        (
            "tampered body",
            tampered.clone(),
            Some(sign(&secret, now, &body)),
        ),
        ("no v1", body.clone(), Some(format!("t={now}"))),
        ("garbage", body.clone(), Some("t=abc,v1=xyz".into())),
        (
            "signed garbage is still checked first",
            b"not json".to_vec(),
            Some(sign(&secret, now, &body)),
        ),
    ];
    for (case, body, signature) in cases {
        crate::webhook_bounds::assert_refused(&app, &body, signature.as_deref(), case).await;
    }
    assert_eq!(
        app.count("SELECT count(*) FROM orders WHERE status <> 'payment_pending'")
            .await,
        0,
        "no order settled"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_keys WHERE key LIKE 'evt_%'")
            .await,
        0,
        "no event id recorded"
    );
    // Signed right, the same event is applied: none of the above used it up.
    let response = app.post_signed_event(&body).await;
    assert_eq!(response.status(), 200);
    let retry = retry_waiting(&app, &app.address, &key, hold, "pm_card_visa").await;
    assert_eq!(retry.status(), 201);
}

#[tokio::test]
async fn without_a_webhook_secret_events_are_404() {
    let app = spawn_app_with(|s| s.payrail.webhook_secret = String::new().into()).await;
    let body = br#"{"id":"evt_1"}"#;
    let response = app.post_signed_event(body).await;
    assert_eq!(response.status(), 404);
}

#[tokio::test]
async fn a_signed_event_for_another_amount_or_currency_settles_nothing() {
    let app = spawn_app_with(|s| s.payrail.max_attempts = 1).await;
    let seats = app.seed("ev", 1, 1_000).await;
    let (key, hold, charge) = lost_answer_click(&app, seats[0]).await;
    let order_id = charge["reference"].as_str().unwrap().to_owned();
    let right = event_body("evt_right", "charge.succeeded", &charge);
    let reworded = |id: &str, field: &str, value: Value| {
        let mut event: Value = serde_json::from_slice(&right).unwrap();
        event["id"] = json!(id);
        event["data"]["charge"][field] = value;
        event.to_string().into_bytes()
    };
    let cases = [
        (
            "a cent less",
            reworded("evt_less", "amount_cents", json!(999)),
        ),
        (
            "another currency",
            reworded("evt_eur", "currency", json!("EUR")),
        ),
        ("a decline for another amount", {
            let mut event: Value =
                serde_json::from_slice(&reworded("evt_declined", "amount_cents", json!(1)))
                    .unwrap();
            event["type"] = json!("charge.declined");
            event.to_string().into_bytes()
        }),
    ];
    for (case, body) in cases {
        // 200, so that Payrail does not retry an event that will never be
        // right; stored under its id like any other answer.
        let response = app.post_signed_event(&body).await;
        assert_eq!(response.status(), 200, "{case}");
        let answer: Value = response.json().await.unwrap();
        assert_eq!(answer["result"], "mismatched", "{case}");
        assert_eq!(
            order_status(&app, &order_id).await,
            "payment_pending",
            "{case}"
        );
        assert_eq!(
            app.count(&format!(
                "SELECT count(*) FROM holds WHERE hold_id = {hold} AND order_id = '{order_id}'"
            ))
            .await,
            1,
            "{case}: the seat is still held by its order"
        );
    }
    // The right event still settles it.
    let response = app.post_signed_event(&right).await;
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["result"], "applied");
    let retry = retry_waiting(&app, &app.address, &key, hold, "pm_card_visa").await;
    assert_eq!(retry.status(), 201);
    assert_invariants(&app).await;
}
