//! `http.request_timeout_secs`: a client that sends its request slowly is
//! answered 408 `request-timeout` (or closed) and changes nothing; the
//! same click sent whole afterwards is served as if the slow one never
//! came.

use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::helpers::{new_key, order_body, raw_http_within, sign_now, spawn_app_with, TestApp};

/// Longer than any answer here takes (they come after a 1 s timeout), so
/// that only a server that never answers makes a test give up.
const PATIENCE: Duration = Duration::from_secs(30);

async fn slow_app() -> TestApp {
    spawn_app_with(|s| s.http.request_timeout_secs = 1).await
}

fn assert_408(answer: &str, case: &str) {
    assert!(answer.starts_with("HTTP/1.1 408"), "{case}: {answer:?}");
    assert!(
        answer.contains("application/problem+json")
            && answer.contains("https://stagedoor.example/problems/request-timeout"),
        "{case}: {answer}"
    );
}

#[tokio::test]
async fn an_order_whose_body_stalls_is_408_claims_nothing_and_its_retry_is_served() {
    let app = slow_app().await;
    let seats = app.seed("ev", 1, 1_000).await;
    let hold = app.hold("alice", seats[0]).await;
    let key = new_key();
    let body = order_body(&[hold], "pm_card_visa");
    let half = &body[..body.len() / 2];
    let request = format!(
        "POST /orders HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {}\r\n\
         Idempotency-Key: {key}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\n\r\n{half}",
        app.token("alice"),
        body.len()
    );
    let answer = raw_http_within(app.port, request.as_bytes(), PATIENCE).await;
    assert_408(&answer, "half a body");
    assert_eq!(
        app.count(&format!(
            "SELECT count(*) FROM idempotency_keys WHERE key = '{key}'"
        ))
        .await,
        0,
        "no key claimed"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM orders").await,
        0,
        "no order"
    );
    assert!(app.charges().await.is_empty(), "no charge");
    let retry = app.post_order_raw("alice", &key, &body).await;
    assert_eq!(retry.status(), 201);
    assert!(!retry.headers().contains_key("Idempotent-Replayed"));
    let order: Value = retry.json().await.unwrap();
    assert_eq!(order["status"], "paid");
}

#[tokio::test]
async fn a_signed_event_whose_body_stalls_is_408_and_records_nothing() {
    let app = slow_app().await;
    let body = br#"{"id":"evt_slow","type":"charge.succeeded","created":0,"data":{}}"#;
    let request = format!(
        "POST /payrail/events HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n\
         Payrail-Signature: {}\r\nContent-Length: {}\r\n\r\n{}",
        sign_now(body),
        body.len(),
        String::from_utf8_lossy(&body[..10])
    );
    let answer = raw_http_within(app.port, request.as_bytes(), PATIENCE).await;
    assert_408(&answer, "half an event");
    assert_eq!(
        app.count("SELECT count(*) FROM idempotency_keys WHERE key LIKE 'evt_%'")
            .await,
        0,
        "no event recorded"
    );
}

#[tokio::test]
async fn a_stalled_head_is_answered_408_or_closed() {
    let app = slow_app().await;
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", app.port))
        .await
        .expect("connect");
    stream
        .write_all(b"POST /orders HTTP/1.1\r\nHost: loc")
        .await
        .expect("write");
    let mut answer = Vec::new();
    let read = tokio::time::timeout(PATIENCE, stream.read_to_end(&mut answer)).await;
    assert!(
        matches!(read, Ok(Ok(_))),
        "the server closed the connection: {read:?}"
    );
    let answer = String::from_utf8_lossy(&answer);
    assert!(
        answer.is_empty() || answer.starts_with("HTTP/1.1 408"),
        "{answer:?}"
    );
}

#[tokio::test]
async fn the_next_head_on_a_reused_connection_cannot_stall_for_ever() {
    let app = slow_app().await;
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", app.port))
        .await
        .expect("connect");
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .await
        .expect("write");
    let mut first = Vec::new();
    while !String::from_utf8_lossy(&first).ends_with(r#"{"status":"ok"}"#) {
        let mut buf = [0u8; 1024];
        let n = stream.read(&mut buf).await.expect("the first answer");
        assert!(n > 0, "closed before the first answer");
        first.extend_from_slice(&buf[..n]);
    }
    // The connection is kept open; the next head starts, then stalls.
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHo")
        .await
        .expect("write");
    let mut rest = Vec::new();
    let read = tokio::time::timeout(PATIENCE, stream.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the server closed the connection: {read:?}");
}
