//! `POST /payrail/events` costs an unsigned caller next to nothing: a
//! `Payrail-Signature` past its bounds (longer than 1 KiB, more than 4 `v1`,
//! a `v1` that is not 64 hex digits) is refused before any MAC, and a
//! request whose header does not pass is answered before its body is read.

use serde_json::{json, Value};

use crate::helpers::{event_body, raw_http, sign_now, spawn_app, unix_now, TestApp};

/// An event about an order that does not exist: a believed one is 200
/// `unknown`, so that what the bounds refuse is all that differs.
fn unknown_event() -> Vec<u8> {
    event_body(
        "evt_bounds",
        "charge.succeeded",
        &json!({"id": "ch_x", "amount_cents": 1, "reference": uuid::Uuid::new_v4().to_string(),
                "idempotency_key": "order-elsewhere"}),
    )
}

/// The hex tag of a right signature of `body`, signed now.
fn right_tag(body: &[u8]) -> (u64, String) {
    let signed = sign_now(body);
    let (t, tag) = signed.split_once(",v1=").expect("t=<unix s>,v1=<hex>");
    (
        t.trim_start_matches("t=").parse().expect("t"),
        tag.to_owned(),
    )
}

/// The event is refused as a bad signature, with its problem body.
pub async fn assert_refused(app: &TestApp, body: &[u8], header: Option<&str>, case: &str) {
    let response = app.post_event_to(&app.address, body, header).await;
    assert_eq!(response.status(), 400, "{case}");
    assert_eq!(
        response.headers()["Content-Type"],
        "application/problem+json",
        "{case}"
    );
    let problem: Value = response.json().await.unwrap();
    assert_eq!(
        problem["type"], "https://stagedoor.example/problems/webhook-signature-invalid",
        "{case}"
    );
}

#[tokio::test]
async fn a_signature_header_past_its_bounds_is_400_even_with_the_right_tag_in_it() {
    let app = spawn_app().await;
    let body = unknown_event();
    let (t, tag) = right_tag(&body);
    let wrong = "0".repeat(64);
    let padded = format!("t={t},v1={tag},pad={}", "x".repeat(1_024));
    let five = format!("t={t},v1={wrong},v1={wrong},v1={wrong},v1={wrong},v1={tag}");
    let cases = [
        (padded, "longer than 1 KiB"),
        (five, "five v1, the right one last"),
        (
            format!("t={t},v1=,v1={tag}"),
            "an empty v1 beside the right one",
        ),
        (
            format!("t={t},v1=abcd,v1={tag}"),
            "a short v1 beside the right one",
        ),
        (
            format!("t={t},v1={tag}00"),
            "the right tag with two digits more",
        ),
    ];
    for (header, case) in &cases {
        assert_refused(&app, &body, Some(header), case).await;
    }
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_keys WHERE key LIKE 'evt_%'")
            .await,
        0,
        "no refused event was recorded"
    );
    // Four `v1` is a rotation with room to spare: the right one among them
    // is believed, wherever it stands.
    let four = format!("t={t},v1={wrong},v1={wrong},v1={tag},v1={wrong}");
    let response = app.post_event_to(&app.address, &body, Some(&four)).await;
    assert_eq!(response.status(), 200);
    let answer: Value = response.json().await.unwrap();
    assert_eq!(answer["result"], "unknown");
}

#[tokio::test]
async fn a_request_without_a_current_signature_is_answered_before_its_body_arrives() {
    let app = spawn_app().await;
    let stale = format!("t={},v1={}", unix_now() - 3_600, "0".repeat(64));
    let cases = [
        (String::new(), "no signature"),
        (
            format!("Payrail-Signature: {stale}\r\n"),
            "a stale signature",
        ),
        (
            format!("Payrail-Signature: t={},v1=\r\n", unix_now()),
            "an empty v1",
        ),
    ];
    for (header, case) in cases {
        // The head promises 60 000 bytes, and none follow: the answer must
        // not wait for them.
        let head = format!(
            "POST /payrail/events HTTP/1.1\r\nHost: localhost\r\n\
             Content-Type: application/json\r\nContent-Length: 60000\r\n{header}\r\n"
        );
        let answer = raw_http(app.port, head.as_bytes()).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{case}: {answer:?}");
        assert!(
            answer.contains("/problems/webhook-signature-invalid"),
            "{case}: {answer}"
        );
    }
}
