//! Attacks, each with what the attacker sees (status and problem slug) and
//! proof that nothing was stored or charged: the rows of `idempotency_keys`,
//! `orders` and `holds`, and the sandbox's ledger.
//!
//! One file per attack surface: [`tokens`] (bearer tokens), [`buyers`]
//! (one buyer against another), [`sql`] (SQL metacharacters in every field),
//! [`resources`] (what an anonymous client can make the service keep).

mod buyers;
mod resources;
mod sql;
mod tokens;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use jsonwebtoken::{Algorithm, EncodingKey};
use reqwest::Response;
use serde_json::{json, Value};

use crate::helpers::{new_key, order_body, spawn_app, Seen, TestApp};

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock")
        .as_secs()
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

fn secret(app: &TestApp) -> Vec<u8> {
    secrecy::ExposeSecret::expose_secret(&app.settings.auth.jwt_secret)
        .as_bytes()
        .to_vec()
}

/// A token with exactly this header and these claim bytes, signed with
/// HMAC-SHA256 under `key` whatever the header says.
fn forge(header: &Value, claims: &str, key: &[u8]) -> String {
    let message = format!(
        "{}.{}",
        b64(header.to_string().as_bytes()),
        b64(claims.as_bytes())
    );
    let signature = jsonwebtoken::crypto::sign(
        message.as_bytes(),
        &EncodingKey::from_secret(key).expect("key"),
        Algorithm::HS256,
    )
    .expect("sign");
    format!("{message}.{signature}")
}

fn hs256() -> Value {
    json!({"alg": "HS256", "typ": "JWT"})
}

/// Valid claims for alice, as JSON text.
fn alice_claims() -> String {
    json!({"sub": "alice", "exp": now() + 600}).to_string()
}

/// The row counts an attack must leave as they were. The keys are the
/// buyers' (`TestApp::buyer_keys`): the sale job's are its own.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
struct Rows {
    keys: i64,
    orders: i64,
    holds: i64,
}

async fn rows(app: &TestApp) -> Rows {
    Rows {
        keys: app.buyer_keys().await,
        orders: app.count("SELECT count(*) FROM orders").await,
        holds: app.count("SELECT count(*) FROM holds").await,
    }
}

/// `POST /orders` for alice's hold with this Authorization header and a new key.
async fn order_with_authorization(app: &TestApp, authorization: &str, hold: i64) -> Response {
    app.http
        .post(app.url("/orders"))
        .header("Authorization", authorization)
        .header("Idempotency-Key", new_key())
        .header("Content-Type", "application/json")
        .body(order_body(&[hold], "pm_card_visa"))
        .send()
        .await
        .expect("POST /orders")
}

/// Asserts a refused token: 401 `unauthorized` with the Bearer challenge,
/// and nothing stored or charged.
async fn assert_refused(app: &TestApp, response: Response, before: Rows, why: &str) {
    assert_eq!(
        response
            .headers()
            .get("www-authenticate")
            .and_then(|v| v.to_str().ok()),
        Some("Bearer"),
        "{why}"
    );
    let seen = Seen::of(response).await;
    assert_eq!(seen.status, 401, "{why}");
    assert_eq!(seen.problem(), "unauthorized", "{why}");
    assert_eq!(rows(app).await, before, "{why}: nothing stored");
    assert!(app.charges().await.is_empty(), "{why}: nothing charged");
}

/// An app with one event and alice holding its first seat.
async fn alice_with_a_hold() -> (TestApp, i64) {
    let app = spawn_app().await;
    let seats = app.seed("show", 3, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    (app, hold)
}

/// The status line of the answer to raw request bytes, if any came. Unlike
/// `raw_http`, a write cut short by the server is expected here.
async fn raw_status(port: u16, request: &[u8]) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let _ = stream.write_all(request).await;
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    while !answer.windows(2).any(|w| w == b"\r\n") {
        match tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await {
            Ok(Ok(n)) if n > 0 => answer.extend_from_slice(&buf[..n]),
            _ => break,
        }
    }
    let text = String::from_utf8_lossy(&answer);
    text.strip_prefix("HTTP/1.1 ")?.get(..3)?.parse().ok()
}
