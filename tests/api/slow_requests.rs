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

/// A connection that has had one request answered and is kept open.
async fn answered_connection(port: u16) -> tokio::net::TcpStream {
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
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
    stream
}

#[tokio::test]
async fn the_next_head_on_a_reused_connection_cannot_stall_for_ever() {
    let app = slow_app().await;
    let mut stream = answered_connection(app.port).await;
    // The connection is kept open; the next head starts, then stalls.
    stream
        .write_all(b"GET /healthz HTTP/1.1\r\nHo")
        .await
        .expect("write");
    let mut rest = Vec::new();
    let read = tokio::time::timeout(PATIENCE, stream.read_to_end(&mut rest)).await;
    assert!(read.is_ok(), "the server closed the connection: {read:?}");
}

/// Sends a keyed order's head a line at a time over about 2 s, then half
/// its body, and stalls; how long after the head's first byte the 408
/// came, and the answer.
async fn slow_head_then_stalled_body(
    app: &TestApp,
    hold: i64,
    stream: &mut tokio::net::TcpStream,
) -> (Duration, String) {
    let body = order_body(&[hold], "pm_card_visa");
    let lines = [
        "POST /orders HTTP/1.1\r\n".to_owned(),
        "Host: localhost\r\n".to_owned(),
        format!("Authorization: Bearer {}\r\n", app.token("alice")),
        format!("Idempotency-Key: {}\r\n", new_key()),
        "Content-Type: application/json\r\n".to_owned(),
        format!("Content-Length: {}\r\n", body.len()),
    ];
    let first_byte = tokio::time::Instant::now();
    for line in &lines {
        stream.write_all(line.as_bytes()).await.expect("write");
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let rest = format!("\r\n{}", &body[..body.len() / 2]);
    stream.write_all(rest.as_bytes()).await.expect("write");
    let mut answer = Vec::new();
    while !answer.ends_with(b"}") {
        let mut buf = [0u8; 2048];
        let read = tokio::time::timeout(PATIENCE, stream.read(&mut buf)).await;
        let n = read.expect("an answer in time").expect("read");
        assert!(n > 0, "closed: {}", String::from_utf8_lossy(&answer));
        answer.extend_from_slice(&buf[..n]);
    }
    (
        first_byte.elapsed(),
        String::from_utf8_lossy(&answer).into_owned(),
    )
}

/// SPEC §12: head and body together within `http.request_timeout_secs` of
/// the first byte, not the head's time and then the body's as long again;
/// on a new connection and on a reused one (where the request's first
/// byte comes after an idle spell, which does not count).
#[tokio::test]
async fn a_slow_head_leaves_its_body_only_the_rest_of_the_requests_time() {
    // Long enough that a loaded machine still sends the head in time.
    let app = spawn_app_with(|s| s.http.request_timeout_secs = 6).await;
    let seats = app.seed("deadline", 2, 1_000).await;
    let holds = [
        app.hold("alice", seats[0]).await,
        app.hold("alice", seats[1]).await,
    ];
    let mut fresh = tokio::net::TcpStream::connect(("127.0.0.1", app.port))
        .await
        .expect("connect");
    let (took, answer) = slow_head_then_stalled_body(&app, holds[0], &mut fresh).await;
    assert_408(&answer, "a new connection");
    assert!(
        (Duration::from_millis(5_900)..Duration::from_millis(7_800)).contains(&took),
        "a new connection: 408 {took:?} after the first byte, for 6 s"
    );

    let mut reused = answered_connection(app.port).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let (took, answer) = slow_head_then_stalled_body(&app, holds[1], &mut reused).await;
    assert_408(&answer, "a reused connection");
    assert!(
        (Duration::from_millis(5_900)..Duration::from_millis(7_800)).contains(&took),
        "a reused connection: 408 {took:?} after the request's first byte, for 6 s"
    );
    assert!(app.charges().await.is_empty(), "no charge");
}
