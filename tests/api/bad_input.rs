//! Input rejected before the key is touched: a 4xx problem, nothing stored.

use crate::helpers::{new_key, raw_http, spawn_app, Seen};

#[tokio::test]
async fn malformed_bodies_are_400_invalid_request_and_store_nothing() {
    let app = spawn_app().await;
    let cases = [
        ("", "an empty body"),
        ("not json", "not JSON"),
        (
            "{\"hold_ids\": [1], \"payment_method\": \"pm_card_visa\"",
            "truncated JSON",
        ),
        (
            "{\"hold_ids\": \"1\", \"payment_method\": \"pm_card_visa\"}",
            "a string for a list",
        ),
        (
            "{\"hold_ids\": [1.5], \"payment_method\": \"pm_card_visa\"}",
            "a fraction",
        ),
        (
            "{\"hold_ids\": [99999999999999999999], \"payment_method\": \"pm_card_visa\"}",
            "a huge number",
        ),
        ("{\"payment_method\": \"pm_card_visa\"}", "a missing member"),
        (
            "{\"hold_ids\": [1], \"payment_method\": \"pm_card_visa\", \"x\": 1}",
            "an unknown member",
        ),
        (
            "{\"hold_ids\": [1], \"hold_ids\": [2], \"payment_method\": \"pm_card_visa\"}",
            "a duplicate member",
        ),
        (
            "{\"hold_ids\": [1], \"payment_method\": \"pm_card_visa\"} trailing",
            "trailing garbage",
        ),
        ("[]", "an array"),
    ];
    for (body, why) in cases {
        let seen = Seen::of(app.post_order_raw("alice", &new_key(), body).await).await;
        assert_eq!(seen.status, 400, "{why}");
        assert_eq!(seen.problem(), "invalid-request", "{why}");
    }
    let deep = format!("{}{}", "[".repeat(5_000), "]".repeat(5_000));
    let seen = Seen::of(app.post_order_raw("alice", &new_key(), &deep).await).await;
    assert_eq!(seen.problem(), "invalid-request", "deep nesting");
    let invalid_utf8 = app
        .as_buyer(app.http.post(app.url("/orders")), "alice")
        .header("Idempotency-Key", new_key())
        .body(vec![b'{', 0xff, 0xfe, b'}'])
        .send()
        .await
        .unwrap();
    assert_eq!(Seen::of(invalid_utf8).await.problem(), "invalid-request");
    assert_eq!(app.buyer_keys().await, 0);
}

#[tokio::test]
async fn a_body_over_the_limit_is_413() {
    let app = spawn_app().await;
    let big = format!(
        "{{\"hold_ids\": [1], \"payment_method\": \"pm_{}\"}}",
        "x".repeat(70_000)
    );
    let seen = Seen::of(app.post_order_raw("alice", &new_key(), &big).await).await;
    assert_eq!(seen.status, 413);
    assert_eq!(seen.problem(), "payload-too-large");

    // Without a Content-Length (chunked) the limit holds as well.
    let chunk = " ".repeat(40_000);
    let mut request = format!(
        "POST /orders HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {}\r\n\
         Idempotency-Key: chunked-1\r\nTransfer-Encoding: chunked\r\n\r\n",
        app.token("alice")
    );
    for _ in 0..2 {
        request.push_str(&format!("{:x}\r\n{chunk}\r\n", chunk.len()));
    }
    request.push_str("0\r\n\r\n");
    let answer = raw_http(app.port, request.as_bytes()).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert!(answer.contains("payload-too-large"), "{answer}");
    assert_eq!(app.buyer_keys().await, 0);
}

#[tokio::test]
async fn orders_need_a_valid_idempotency_key() {
    let app = spawn_app().await;
    let body = r#"{"hold_ids":[1],"payment_method":"pm_card_visa"}"#;
    let missing = app
        .as_buyer(app.http.post(app.url("/orders")), "alice")
        .body(body)
        .send()
        .await
        .unwrap();
    let seen = Seen::of(missing).await;
    assert_eq!(seen.status, 400);
    assert_eq!(seen.problem(), "idempotency-key-missing");

    let long = "k".repeat(256);
    let cases: Vec<(Vec<u8>, &str)> = vec![
        (b"".to_vec(), "empty"),
        (long.into_bytes(), "256 characters"),
        (b"a b".to_vec(), "a space"),
        (b"\"abc".to_vec(), "an unbalanced quote"),
        (b"\"\"".to_vec(), "empty quotes"),
        (b"caf\xc3\xa9".to_vec(), "non-ASCII"),
        (b"a\tb".to_vec(), "a tab"),
    ];
    for (raw, why) in cases {
        let value = reqwest::header::HeaderValue::from_bytes(&raw).unwrap();
        let response = app
            .as_buyer(app.http.post(app.url("/orders")), "alice")
            .header("Idempotency-Key", value)
            .body(body)
            .send()
            .await
            .unwrap();
        let seen = Seen::of(response).await;
        assert_eq!(seen.status, 400, "{why}");
        assert_eq!(seen.problem(), "idempotency-key-invalid", "{why}");
    }
    let repeated = app
        .as_buyer(app.http.post(app.url("/orders")), "alice")
        .header("Idempotency-Key", "one")
        .header("Idempotency-Key", "two")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(
        Seen::of(repeated).await.problem(),
        "idempotency-key-invalid"
    );
    let key_255 = format!("{}{}", new_key(), "k".repeat(255 - 36));
    let ok_255 = app.post_order_raw("alice", &key_255, body).await;
    assert_eq!(Seen::of(ok_255).await.problem(), "hold-unavailable");
    assert_eq!(app.buyer_keys().await, 1);
}

#[tokio::test]
async fn an_unauthenticated_request_touches_no_key() {
    let app = spawn_app().await;
    let response = app
        .http
        .post(app.url("/orders"))
        .header("Idempotency-Key", new_key())
        .body(r#"{"hold_ids":[1],"payment_method":"pm_card_visa"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 401);
    assert_eq!(app.buyer_keys().await, 0);
}
