//! Attacks, each with what the attacker sees (status and problem slug) and
//! proof that nothing was stored or charged: the rows of `idempotency_keys`,
//! `orders` and `holds`, and the sandbox's ledger.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use idempotency::RequestHash;
use jsonwebtoken::{Algorithm, EncodingKey};
use reqwest::Response;
use serde_json::{json, Value};
use uuid::Uuid;

use crate::helpers::{new_key, order_body, spawn_app, spawn_app_with, Seen, TestApp};
use crate::invariants::assert_invariants;

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

/// The row counts an attack must leave as they were.
#[derive(Debug, PartialEq, Eq, Clone, Copy)]
struct Rows {
    keys: i64,
    orders: i64,
    holds: i64,
}

async fn rows(app: &TestApp) -> Rows {
    let row = app
        .db
        .client()
        .await
        .query_one(
            "SELECT (SELECT count(*) FROM idempotency_keys), (SELECT count(*) FROM orders),
                    (SELECT count(*) FROM holds)",
            &[],
        )
        .await
        .expect("row counts");
    Rows {
        keys: row.get(0),
        orders: row.get(1),
        holds: row.get(2),
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

// ---------------------------------------------------------------------------
// Bearer tokens (alg `none`, HS512, `nbf` and plain expiry are in auth.rs)

#[tokio::test]
async fn a_token_whose_header_names_another_algorithm_than_hs256_orders_nothing() {
    let (app, hold) = alice_with_a_hold().await;
    let before = rows(&app).await;
    let secret = secret(&app);
    // Every one is signed HMAC-SHA256 with the real secret: only the header lies.
    for alg in [
        "RS256", "RS512", "PS256", "ES256", "ES384", "EdDSA", "HS384", "HS512", "hs256", "HS256 ",
        "none", "",
    ] {
        let token = forge(&json!({"alg": alg, "typ": "JWT"}), &alice_claims(), &secret);
        let response = order_with_authorization(&app, &format!("Bearer {token}"), hold).await;
        assert_refused(&app, response, before, &format!("alg {alg:?}")).await;
    }
    // An RS256 header whose HMAC is keyed with a "public key" in PEM form:
    // the classic confusion, where a verifier uses the public key as a secret.
    let pem = b"-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n-----END PUBLIC KEY-----\n";
    let token = forge(&json!({"alg": "RS256"}), &alice_claims(), pem);
    let response = order_with_authorization(&app, &format!("Bearer {token}"), hold).await;
    assert_refused(&app, response, before, "RS256 keyed with a PEM").await;
    // A header that is not a JOSE header at all.
    for header in [json!({"typ": "JWT"}), json!({"alg": ["HS256"]}), json!([])] {
        let token = forge(&header, &alice_claims(), &secret);
        let response = order_with_authorization(&app, &format!("Bearer {token}"), hold).await;
        assert_refused(&app, response, before, &format!("header {header}")).await;
    }
    // The same claims under the honest header go through: the header decided.
    let token = forge(&hs256(), &alice_claims(), &secret);
    let seen =
        Seen::of(order_with_authorization(&app, &format!("Bearer {token}"), hold).await).await;
    assert_eq!(seen.status, 201);
    assert_eq!(app.charges().await.len(), 1);
    assert_invariants(&app).await;
}

#[tokio::test]
async fn a_kid_header_is_ignored_and_the_one_secret_decides() {
    let (app, hold) = alice_with_a_hold().await;
    let before = rows(&app).await;
    let secret = secret(&app);
    // A kid that names a file or a row, with a signature keyed by what that
    // file or row would hold: refused, since the kid looks nothing up.
    let cases: [(&str, &[u8]); 5] = [
        ("../../../../../../dev/null", b"\0"),
        ("/proc/self/environ", b"STAGEDOOR_ENV=local"),
        ("config/local.toml", b"[auth]"),
        ("' UNION SELECT 'attacker-key' --", b"attacker-key"),
        ("x'; DROP TABLE orders; --", b"x"),
    ];
    for (kid, key) in cases {
        let header = json!({"alg": "HS256", "typ": "JWT", "kid": kid});
        let token = forge(&header, &alice_claims(), key);
        let response = order_with_authorization(&app, &format!("Bearer {token}"), hold).await;
        assert_refused(&app, response, before, &format!("kid {kid:?}")).await;
    }
    // The other ways a header can point at a key: an embedded key, or a URL
    // to fetch one from. Signed with the key they offer: refused.
    for header in [
        json!({"alg": "HS256", "jwk": {"kty": "oct", "k": b64(b"attacker-key")}}),
        json!({"alg": "HS256", "jku": "http://127.0.0.1:9/jwks.json", "kid": "attacker-key"}),
        json!({"alg": "HS256", "x5u": "http://127.0.0.1:9/cert.pem"}),
    ] {
        let token = forge(&header, &alice_claims(), b"attacker-key");
        let response = order_with_authorization(&app, &format!("Bearer {token}"), hold).await;
        assert_refused(&app, response, before, &format!("header {header}")).await;
    }
    assert_eq!(
        app.count("SELECT count(*) FROM information_schema.tables WHERE table_name = 'orders'")
            .await,
        1
    );
    // The same kids on tokens signed with the real secret: ignored, accepted.
    for (kid, _) in cases {
        let header = json!({"alg": "HS256", "typ": "JWT", "kid": kid});
        let token = forge(&header, &alice_claims(), &secret);
        let response = app
            .http
            .get(app.url("/events/show/seats"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "kid {kid:?} with the real secret");
    }
    // A junk kid on a valid token is fine, all the way to a paid order.
    let header = json!({"alg": "HS256", "kid": "\u{1F642}junk\u{0}\u{202E}"});
    let token = forge(&header, &alice_claims(), &secret);
    let seen =
        Seen::of(order_with_authorization(&app, &format!("Bearer {token}"), hold).await).await;
    assert_eq!(seen.status, 201);
    assert_eq!(app.charges().await.len(), 1);
    assert_invariants(&app).await;
}

#[tokio::test]
async fn an_exp_or_nbf_that_is_not_a_plain_timestamp_is_refused() {
    let (app, hold) = alice_with_a_hold().await;
    let before = rows(&app).await;
    let secret = secret(&app);
    let later = now() + 600;
    let cases = [
        (
            format!(r#"{{"sub":"alice","exp":"{later}"}}"#),
            "exp as a string",
        ),
        (r#"{"sub":"alice","exp":-1}"#.to_owned(), "a negative exp"),
        (
            r#"{"sub":"alice","exp":-9223372036854775808}"#.to_owned(),
            "the most negative exp",
        ),
        (
            r#"{"sub":"alice","exp":18446744073709551616}"#.to_owned(),
            "an exp one past u64",
        ),
        (
            r#"{"sub":"alice","exp":1e300}"#.to_owned(),
            "an exp of 1e300",
        ),
        (
            format!(r#"{{"sub":"alice","exp":{later}.5}}"#),
            "a fractional exp",
        ),
        (r#"{"sub":"alice","exp":null}"#.to_owned(), "a null exp"),
        (
            format!(r#"{{"sub":"alice","exp":[{later}]}}"#),
            "an exp in an array",
        ),
        (
            format!(r#"{{"sub":"alice","exp":{later},"nbf":"0"}}"#),
            "nbf as a string",
        ),
        (
            format!(r#"{{"sub":"alice","exp":{later},"nbf":-1}}"#),
            "a negative nbf",
        ),
        (
            format!(r#"{{"sub":"alice","exp":{later},"exp":{later}}}"#),
            "exp twice",
        ),
    ];
    for (claims, why) in cases {
        let token = forge(&hs256(), &claims, &secret);
        let response = order_with_authorization(&app, &format!("Bearer {token}"), hold).await;
        assert_refused(&app, response, before, why).await;
    }
    assert_invariants(&app).await;
}

#[tokio::test]
async fn a_sub_with_a_control_character_or_no_text_is_refused_before_any_sql() {
    let (app, hold) = alice_with_a_hold().await;
    let before = rows(&app).await;
    let secret = secret(&app);
    let later = now() + 600;
    for sub in [
        json!("alice\u{0}"),
        json!("\u{0}"),
        json!("alice\n"),
        json!("al\u{1b}[31mice"),
        json!("x".repeat(256)),
        json!(""),
        json!(1),
        json!(["alice"]),
        json!(null),
    ] {
        let claims = json!({"sub": sub, "exp": later}).to_string();
        let token = forge(&hs256(), &claims, &secret);
        let response = order_with_authorization(&app, &format!("Bearer {token}"), hold).await;
        assert_refused(&app, response, before, &format!("sub {sub}")).await;
    }
    assert_invariants(&app).await;
}

#[tokio::test]
async fn a_sub_with_sql_metacharacters_is_just_another_buyer_who_cannot_touch_alices_hold() {
    // Identity providers' subjects are any printable text: they are bound as
    // parameters, never spliced into SQL, so each is a buyer of its own.
    let (app, hold) = alice_with_a_hold().await;
    let secret = secret(&app);
    let later = now() + 600;
    for sub in [
        "alice' OR '1'='1",
        "alice'--",
        "alice\"; DROP TABLE orders; --",
        "alice%",
        "%",
        "al\\ice",
        "\u{0430}lice", // a Cyrillic a
        "alice:bob",
    ] {
        let claims = json!({"sub": sub, "exp": later}).to_string();
        let token = forge(&hs256(), &claims, &secret);
        let seen =
            Seen::of(order_with_authorization(&app, &format!("Bearer {token}"), hold).await).await;
        assert_eq!(seen.status, 409, "sub {sub}: {}", seen.text());
        assert_eq!(seen.problem(), "hold-unavailable", "sub {sub}");
    }
    assert_eq!(app.count("SELECT count(*) FROM orders").await, 0);
    assert_eq!(
        app.count("SELECT count(*) FROM holds WHERE user_id = 'alice'")
            .await,
        1
    );
    assert!(app.charges().await.is_empty());
    assert_invariants(&app).await;
}

#[tokio::test]
async fn an_oversized_token_is_401_and_an_oversized_header_is_a_4xx_never_a_5xx() {
    let (app, hold) = alice_with_a_hold().await;
    let before = rows(&app).await;
    let secret = secret(&app);
    // Signed with the real secret, valid in every claim, but over 8 KiB.
    let claims = json!({"sub": "alice", "exp": now() + 600, "pad": "x".repeat(8_192)});
    let token = forge(&hs256(), &claims.to_string(), &secret);
    assert!(token.len() > 8_192);
    let response = order_with_authorization(&app, &format!("Bearer {token}"), hold).await;
    assert_refused(&app, response, before, "a signed token over 8 KiB").await;
    // A header far larger than any token, still within actix's head buffer.
    let response =
        order_with_authorization(&app, &format!("Bearer {}", "a".repeat(64 * 1024)), hold).await;
    assert_refused(&app, response, before, "a 64 KiB Authorization header").await;

    // Beyond actix's limit on a request head (128 KiB, 96 headers): the server
    // refuses the head itself with 431, before any handler; never a 5xx.
    for (why, head) in [
        (
            "a 200 KiB header",
            format!("X-Junk: {}\r\n", "a".repeat(200 * 1024)),
        ),
        (
            "a 200 KiB Authorization header",
            format!("Authorization: Bearer {}\r\n", "a".repeat(200 * 1024)),
        ),
        (
            "200 headers",
            (0..200).map(|i| format!("X-Junk-{i}: {i}\r\n")).collect(),
        ),
    ] {
        let request = format!(
            "POST /orders HTTP/1.1\r\nHost: 127.0.0.1\r\n{head}Idempotency-Key: {}\r\n\
             Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{{}}",
            new_key()
        );
        let status = raw_status(app.port, request.as_bytes()).await;
        assert_eq!(status, Some(431), "{why}");
    }
    assert_eq!(rows(&app).await, before);
    assert!(app.charges().await.is_empty());
    // The server is still up and serving.
    let seen = Seen::of(app.get_seats("alice", "show").await).await;
    assert_eq!(seen.status, 200);
    assert_invariants(&app).await;
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

#[tokio::test]
async fn a_token_with_a_trailing_dot_or_extra_segments_is_refused() {
    let (app, hold) = alice_with_a_hold().await;
    let before = rows(&app).await;
    let token = app.token("alice");
    let (message, signature) = token.rsplit_once('.').unwrap();
    let (header, payload) = message.split_once('.').unwrap();
    let cases = [
        (format!("{token}."), "a trailing dot"),
        (format!("{token}.."), "two trailing dots"),
        (format!(".{token}"), "a leading dot"),
        (format!("{token}.{signature}"), "the signature twice"),
        (format!("{header}.{token}"), "an extra header in front"),
        (
            format!("{header}.{payload}.{payload}.{signature}"),
            "the payload twice",
        ),
        (message.to_owned(), "no signature segment"),
        (format!("{message}."), "an empty signature"),
        (format!("{token}="), "base64 padding on the signature"),
        (format!("{token} {token}"), "two tokens"),
    ];
    for (candidate, why) in cases {
        let response = order_with_authorization(&app, &format!("Bearer {candidate}"), hold).await;
        assert_refused(&app, response, before, why).await;
    }
    // Two Authorization headers, even if one is good, are one too many.
    let response = app
        .http
        .post(app.url("/orders"))
        .header("Authorization", format!("Bearer {token}"))
        .header("Authorization", "Bearer junk")
        .header("Idempotency-Key", new_key())
        .body(order_body(&[hold], "pm_card_visa"))
        .send()
        .await
        .unwrap();
    assert_refused(&app, response, before, "two Authorization headers").await;
    assert_invariants(&app).await;
}

#[tokio::test]
async fn the_scheme_is_accepted_as_bearer_or_lowercase_bearer() {
    // src/http/auth.rs takes `Bearer` and `bearer` (RFC 9110 makes the scheme
    // case-insensitive; these are the spellings clients send).
    let (app, hold) = alice_with_a_hold().await;
    let before = rows(&app).await;
    let token = app.token("alice");
    for scheme in ["Bearer", "bearer"] {
        let response = app
            .http
            .get(app.url("/events/show/seats"))
            .header("Authorization", format!("{scheme} {token}"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{scheme}");
    }
    // Other schemes, or the token without one, are refused.
    for value in [
        format!("Basic {token}"),
        format!("Token {token}"),
        format!("Bearer: {token}"),
        format!("Bearer{token}"),
        token.clone(),
    ] {
        let response = order_with_authorization(&app, &value, hold).await;
        assert_refused(&app, response, before, &value[..10]).await;
    }
    // An order with the lowercase scheme is a normal order.
    let seen =
        Seen::of(order_with_authorization(&app, &format!("bearer {token}"), hold).await).await;
    assert_eq!(seen.status, 201);
    assert_eq!(app.charges().await.len(), 1);
    assert_invariants(&app).await;
}

// ---------------------------------------------------------------------------
// One buyer against another (invariant 4)

#[tokio::test]
async fn no_other_buyer_can_read_alices_order_however_the_id_is_spelled() {
    let (app, hold) = alice_with_a_hold().await;
    let order = Seen::of(
        app.post_order("alice", &new_key(), &[hold], "pm_card_visa")
            .await,
    )
    .await;
    assert_eq!(order.status, 201);
    let order_id = order.json()["order_id"].as_str().unwrap().to_owned();
    // Buyer ids that a case-insensitive or LIKE comparison would confuse with alice.
    for buyer in [
        "bob", "ALICE", "Alice", "alic_", "_____", "alice.", "alice-",
    ] {
        let seen = Seen::of(app.get_order(buyer, &order_id).await).await;
        assert_eq!(seen.status, 404, "{buyer}");
        assert_eq!(seen.problem(), "not-found", "{buyer}");
        assert!(
            !String::from_utf8_lossy(&seen.body).contains(&order_id),
            "{buyer}"
        );
    }
    assert_eq!(
        Seen::of(app.get_order("alice", &order_id).await)
            .await
            .status,
        200
    );
    assert_invariants(&app).await;
}

#[tokio::test]
async fn bob_replaying_alices_key_and_body_gets_his_own_answer_never_hers() {
    let (app, hold) = alice_with_a_hold().await;
    let key = new_key();
    let alices = Seen::of(app.post_order("alice", &key, &[hold], "pm_card_visa").await).await;
    assert_eq!(alices.status, 201);

    // Bob has seen alice's key and request (a shared device, a log).
    let bobs = Seen::of(app.post_order("bob", &key, &[hold], "pm_card_visa").await).await;
    assert_eq!((bobs.status, bobs.replayed), (409, false));
    assert_eq!(bobs.problem(), "hold-unavailable");
    assert_ne!(bobs.body, alices.body);
    assert_eq!(bobs.location, None);
    // His answer is stored under his own row and replayed to him alone.
    let again = Seen::of(app.post_order("bob", &key, &[hold], "pm_card_visa").await).await;
    assert_eq!((again.status, again.replayed), (409, true));
    assert_eq!(again.body, bobs.body);
    let alices_again = Seen::of(app.post_order("alice", &key, &[hold], "pm_card_visa").await).await;
    assert_eq!((alices_again.status, alices_again.replayed), (201, true));
    assert_eq!(alices_again.body, alices.body);

    assert_eq!(
        rows(&app).await,
        Rows {
            keys: 2,
            orders: 1,
            holds: 1
        }
    );
    assert_eq!(
        app.count("SELECT count(*) FROM orders WHERE user_id = 'bob'")
            .await,
        0
    );
    assert_eq!(app.charges().await.len(), 1);
    assert_invariants(&app).await;
}

#[tokio::test]
async fn bobs_request_in_progress_under_alices_key_does_not_block_alice() {
    let app = spawn_app_with(|s| s.payrail.timeout_ms = 5_000).await;
    let seats = app.seed("show", 2, 2500).await;
    let alices_hold = app.hold("alice", seats[0]).await;
    let bobs_hold = app.hold("bob", seats[1]).await;
    app.set_faults(json!({"latency_ms": 1_500})).await;
    let key = new_key();

    let bobs = {
        let request = app
            .as_buyer(app.http.post(app.url("/orders")), "bob")
            .header("Idempotency-Key", key.clone())
            .body(order_body(&[bobs_hold], "pm_card_visa"));
        tokio::spawn(async move { Seen::of(request.send().await.unwrap()).await })
    };
    let in_progress =
        "SELECT count(*) FROM idempotency_keys WHERE user_id = 'bob' AND response_status IS NULL";
    for _ in 0..100 {
        if app.count(in_progress).await == 1 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        app.count(in_progress).await,
        1,
        "bob's claim is in progress"
    );

    let alices = Seen::of(
        app.post_order("alice", &key, &[alices_hold], "pm_card_visa")
            .await,
    )
    .await;
    assert_eq!((alices.status, alices.replayed), (201, false), "not 409");
    let bobs = bobs.await.unwrap();
    assert_eq!((bobs.status, bobs.replayed), (201, false));
    assert_ne!(alices.json()["order_id"], bobs.json()["order_id"]);
    assert_eq!(
        rows(&app).await,
        Rows {
            keys: 2,
            orders: 2,
            holds: 2
        }
    );
    assert_eq!(app.charges().await.len(), 2);
    assert_invariants(&app).await;
}

#[tokio::test]
async fn bob_can_neither_release_nor_order_alices_hold() {
    let app = spawn_app().await;
    let seats = app.seed("show", 2, 2500).await;
    let alices_hold = app.hold("alice", seats[0]).await;
    let bobs_hold = app.hold("bob", seats[1]).await;
    let before = rows(&app).await;

    let seen = Seen::of(app.delete_hold("bob", alices_hold).await).await;
    assert_eq!(seen.status, 404);
    assert_eq!(seen.problem(), "not-found");
    for holds in [vec![alices_hold], vec![bobs_hold, alices_hold]] {
        let seen = Seen::of(
            app.post_order("bob", &new_key(), &holds, "pm_card_visa")
                .await,
        )
        .await;
        assert_eq!(seen.status, 409, "{holds:?}");
        assert_eq!(seen.problem(), "hold-unavailable", "{holds:?}");
    }
    // The two 409s are stored answers (4xx are stored); nothing else changed.
    assert_eq!(
        rows(&app).await,
        Rows {
            keys: before.keys + 2,
            ..before
        }
    );
    assert_eq!(
        app.count("SELECT count(*) FROM holds WHERE order_id IS NOT NULL")
            .await,
        0
    );
    assert!(app.charges().await.is_empty());

    // Alice's hold is still hers to pay for, and bob's still his.
    for (buyer, hold) in [("alice", alices_hold), ("bob", bobs_hold)] {
        let seen = Seen::of(
            app.post_order(buyer, &new_key(), &[hold], "pm_card_visa")
                .await,
        )
        .await;
        assert_eq!(seen.status, 201, "{buyer}");
    }
    assert_eq!(app.charges().await.len(), 2);
    assert_invariants(&app).await;
}

#[tokio::test]
async fn bob_cannot_take_over_alices_abandoned_key() {
    let app = spawn_app_with(|s| s.idempotency.lease_secs = 1).await;
    let seats = app.seed("show", 1, 2500).await;
    let hold = app.hold("alice", seats[0]).await;
    let key = new_key();
    let body = order_body(&[hold], "pm_card_visa");
    let hash = RequestHash::of("POST", "/orders", body.as_bytes());
    let (order_id, token) = (Uuid::new_v4(), 7_i64);

    // Alice's click died after it made its order and before Payrail was
    // called: a pending order linked to an in-progress key whose lease ran out.
    let db = app.db.client().await;
    db.batch_execute("BEGIN").await.unwrap();
    db.execute(
        "INSERT INTO orders (order_id, user_id, status, amount_cents, currency, payment_method,
                             hold_ids, seats, idempotency_key)
         SELECT $1, 'alice', 'payment_pending', s.price_cents, 'USD', 'pm_card_visa',
                ARRAY[h.hold_id], ARRAY[s.label], $2
         FROM holds h JOIN seats s USING (seat_id) WHERE h.hold_id = $3",
        &[&order_id, &key, &hold],
    )
    .await
    .unwrap();
    db.execute(
        "UPDATE holds SET order_id = $1 WHERE hold_id = $2",
        &[&order_id, &hold],
    )
    .await
    .unwrap();
    db.execute(
        "INSERT INTO idempotency_keys (user_id, key, request_hash, claim_token, lease_expires_at,
                                       effect)
         VALUES ('alice', $1, $2, $3, now() - interval '1 minute', $4)",
        &[&key, &hash.as_bytes(), &token, &order_id.to_string()],
    )
    .await
    .unwrap();
    db.batch_execute("COMMIT").await.unwrap();
    let alices_row = "SELECT claim_token, lease_expires_at::text, effect, response_status
                      FROM idempotency_keys WHERE user_id = 'alice'";
    let snapshot = |row: tokio_postgres::Row| {
        (
            row.get::<_, i64>(0),
            row.get::<_, String>(1),
            row.get::<_, Option<String>>(2),
            row.get::<_, Option<i16>>(3),
        )
    };
    let abandoned = snapshot(db.query_one(alices_row, &[]).await.unwrap());

    // Bob sends the same key and the very same bytes: a takeover would resume
    // alice's order and charge her card. He gets his own intent instead.
    let seen = Seen::of(app.post_order_raw("bob", &key, &body).await).await;
    assert_eq!((seen.status, seen.replayed), (409, false));
    assert_eq!(seen.problem(), "hold-unavailable");
    assert_eq!(
        snapshot(db.query_one(alices_row, &[]).await.unwrap()),
        abandoned,
        "alice's row is untouched"
    );
    assert_eq!(
        app.count("SELECT count(*) FROM orders WHERE status = 'payment_pending'")
            .await,
        1
    );
    assert!(app.charges().await.is_empty(), "nothing charged");

    // Alice's own retry takes her key over and finishes her order, once.
    let alices = Seen::of(app.post_order_raw("alice", &key, &body).await).await;
    assert_eq!(alices.status, 201);
    assert_eq!(alices.json()["order_id"], json!(order_id));
    assert_eq!(app.charges().await.len(), 1);
    assert_invariants(&app).await;
}

// ---------------------------------------------------------------------------
// SQL metacharacters in every field

const SQLISH: [&str; 8] = [
    "'; DROP TABLE orders;--",
    "' OR '1'='1",
    "%",
    "_",
    "\\",
    "sh_w",
    "sho%",
    "\u{1F3AD} \u{0161}ow \u{202E}",
];

/// Percent-encodes every byte of a path segment, so that the server gets
/// exactly this text (and `%` and `_` are data, not syntax).
fn segment(text: &str) -> String {
    text.bytes().map(|b| format!("%{b:02X}")).collect()
}

async fn assert_tables_intact(app: &TestApp, expected: Rows) {
    for table in ["events", "seats", "holds", "orders", "idempotency_keys"] {
        assert_eq!(
            app.count(&format!(
                "SELECT count(*) FROM pg_tables WHERE schemaname = 'public' AND tablename = '{table}'"
            ))
            .await,
            1,
            "table {table}"
        );
    }
    assert_eq!(rows(app).await, expected);
    assert_eq!(app.count("SELECT count(*) FROM events").await, 1);
    assert_eq!(app.count("SELECT count(*) FROM seats").await, 3);
}

#[tokio::test]
async fn sql_metacharacters_in_path_ids_are_404_and_change_nothing() {
    let (app, hold) = alice_with_a_hold().await;
    let order = Seen::of(
        app.post_order("alice", &new_key(), &[hold], "pm_card_visa")
            .await,
    )
    .await;
    let order_id = order.json()["order_id"].as_str().unwrap().to_owned();
    let seats = app.seed("show", 3, 2500).await; // already there: the same ids
    let spare = app.hold("alice", seats[1]).await;
    let before = rows(&app).await;

    let long = "x".repeat(3_000);
    let mut texts: Vec<String> = SQLISH.iter().map(|s| (*s).to_owned()).collect();
    texts.extend([
        format!("{spare} OR 1=1"),
        format!("{spare};DELETE FROM holds"),
        format!("{order_id}' OR '1'='1"),
        format!("{order_id}%"),
        "-1".to_owned(),
        "99999999999999999999".to_owned(),
        long,
    ]);
    for text in &texts {
        let encoded = segment(text);
        let answers = [
            ("GET seats", app.get_seats("alice", &encoded).await),
            ("GET order", app.get_order("alice", &encoded).await),
            ("DELETE hold", delete_hold_at(&app, &encoded).await),
        ];
        for (what, response) in answers {
            let seen = Seen::of(response).await;
            assert_eq!(seen.status, 404, "{what} {text:?}");
            assert_eq!(seen.problem(), "not-found", "{what} {text:?}");
        }
    }
    // Bytes that are not UTF-8 once decoded are not an id either.
    for raw in ["%FF", "%C0%27", "%00"] {
        for path in [
            format!("/events/{raw}/seats"),
            format!("/orders/{raw}"),
            format!("/holds/{raw}"),
        ] {
            let method = if path.starts_with("/holds") {
                reqwest::Method::DELETE
            } else {
                reqwest::Method::GET
            };
            let response = app
                .as_buyer(app.http.request(method, app.url(&path)), "alice")
                .send()
                .await
                .unwrap();
            let seen = Seen::of(response).await;
            assert_eq!(seen.status, 404, "{path}");
            assert_eq!(seen.problem(), "not-found", "{path}");
        }
    }
    assert_tables_intact(&app, before).await;
    // Everything still answers for the real ids.
    assert_eq!(
        Seen::of(app.get_seats("alice", "show").await).await.status,
        200
    );
    assert_eq!(
        Seen::of(app.get_order("alice", &order_id).await)
            .await
            .status,
        200
    );
    assert_eq!(app.delete_hold("alice", spare).await.status(), 204);
    assert_eq!(app.charges().await.len(), 1);
    assert_invariants(&app).await;
}

/// `DELETE /holds/{segment}` with an already-encoded segment.
async fn delete_hold_at(app: &TestApp, segment: &str) -> Response {
    app.as_buyer(
        app.http.delete(app.url(&format!("/holds/{segment}"))),
        "alice",
    )
    .send()
    .await
    .expect("DELETE hold")
}

#[tokio::test]
async fn an_idempotency_key_made_of_sql_is_stored_literally_and_replays() {
    let app = spawn_app().await;
    let seats = app.seed("show", 6, 2500).await;
    // Visible ASCII, so valid keys: data, never syntax.
    let keys = [
        "'OR'1'='1'--",
        "';DROP/**/TABLE/**/idempotency_keys;--",
        "%",
        "a_c",
        "abc",
        "\\'\\\\%_*",
    ];
    let mut first_answers = Vec::new();
    for (key, seat) in keys.iter().zip(&seats) {
        // `a_c` would match `abc` under LIKE: each key here is its own intent.
        let hold = app.hold("alice", *seat).await;
        let seen = Seen::of(app.post_order("alice", key, &[hold], "pm_card_visa").await).await;
        assert_eq!((seen.status, seen.replayed), (201, false), "{key}");
        first_answers.push((key, hold, seen));
    }
    for (key, hold, first) in &first_answers {
        let again = Seen::of(app.post_order("alice", key, &[*hold], "pm_card_visa").await).await;
        assert_eq!((again.status, again.replayed), (201, true), "{key}");
        assert_eq!(again.body, first.body, "{key}");
        assert_eq!(again.location, first.location, "{key}");
        let stored = app
            .db
            .client()
            .await
            .query_one(
                "SELECT count(*) FROM idempotency_keys WHERE user_id = 'alice' AND key = $1",
                &[key],
            )
            .await
            .unwrap()
            .get::<_, i64>(0);
        assert_eq!(stored, 1, "{key} is stored as it was sent");
    }
    // The quoted form is the same key, metacharacters and all.
    let (key, hold, first) = &first_answers[0];
    let quoted = Seen::of(
        app.post_order("alice", &format!("\"{key}\""), &[*hold], "pm_card_visa")
            .await,
    )
    .await;
    assert_eq!((quoted.status, quoted.replayed), (201, true));
    assert_eq!(quoted.body, first.body);

    // With spaces it is no key at all (0x20 is not visible ASCII): refused
    // before the key is touched.
    let before = rows(&app).await;
    for key in ["' OR 1=1 --", "'; DROP TABLE idempotency_keys; --"] {
        let seen = Seen::of(app.post_order("alice", key, &[*hold], "pm_card_visa").await).await;
        assert_eq!(seen.status, 400, "{key}");
        assert_eq!(seen.problem(), "idempotency-key-invalid", "{key}");
    }
    assert_eq!(rows(&app).await, before);
    assert_eq!(app.charges().await.len(), keys.len());
    assert_invariants(&app).await;
}

#[tokio::test]
async fn sql_metacharacters_in_json_fields_are_a_4xx_and_charge_nothing() {
    let (app, hold) = alice_with_a_hold().await;
    let before = rows(&app).await;

    // A payment method of the right type but not of the pm_… form is an
    // answer to the intent (422 `invalid-order`): stored, replayed, no order.
    let methods = [
        "pm_'; --",
        "pm_card_visa' OR '1'='1",
        "pm_card_visa;DROP TABLE orders",
        "pm_card_visa\u{0}",
        "pm_%",
        "pm_\u{0161}",
    ];
    for method in methods {
        let key = new_key();
        let seen = Seen::of(app.post_order("alice", &key, &[hold], method).await).await;
        assert_eq!(seen.status, 422, "{method:?}");
        assert_eq!(seen.problem(), "invalid-order", "{method:?}");
        let again = Seen::of(app.post_order("alice", &key, &[hold], method).await).await;
        assert_eq!((again.status, again.replayed), (422, true), "{method:?}");
        assert_eq!(again.body, seen.body, "{method:?}");
    }
    assert_eq!(
        rows(&app).await,
        Rows {
            keys: before.keys + methods.len() as i64,
            ..before
        }
    );

    // Not the right shape: 400 `invalid-request` before the key is touched.
    let before = rows(&app).await;
    let bodies = [
        format!(
            r#"{{"hold_ids": ["{hold}; DROP TABLE holds"], "payment_method": "pm_card_visa"}}"#
        ),
        format!(r#"{{"hold_ids": "{hold} OR 1=1", "payment_method": "pm_card_visa"}}"#),
        format!(r#"{{"hold_ids": [{hold}], "payment_method": ["pm_card_visa", "'--"]}}"#),
        format!(
            r#"{{"hold_ids": [{hold}], "payment_method": "pm_card_visa", "'; DROP TABLE orders;--": 1}}"#
        ),
        format!(r#"{{"hold_ids": [{hold}], "payment_method\u0000": "pm_card_visa"}}"#),
    ];
    for body in &bodies {
        let seen = Seen::of(app.post_order_raw("alice", &new_key(), body).await).await;
        assert_eq!(seen.status, 400, "{body}");
        assert_eq!(seen.problem(), "invalid-request", "{body}");
    }
    for body in [
        r#"{"seat_id": "1 OR 1=1"}"#,
        r#"{"seat_id": 1, "'; DROP TABLE holds;--": 1}"#,
    ] {
        let response = app
            .as_buyer(app.http.post(app.url("/holds")), "alice")
            .header("Idempotency-Key", new_key())
            .header("Content-Type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        let seen = Seen::of(response).await;
        assert_eq!(seen.status, 400, "{body}");
        assert_eq!(seen.problem(), "invalid-request", "{body}");
    }
    assert_eq!(rows(&app).await, before);
    assert!(app.charges().await.is_empty());
    assert_tables_intact(&app, before).await;

    // The hold was never touched: it can still be paid for.
    let seen = Seen::of(
        app.post_order("alice", &new_key(), &[hold], "pm_card_visa")
            .await,
    )
    .await;
    assert_eq!(seen.status, 201);
    assert_eq!(app.charges().await.len(), 1);
    assert_invariants(&app).await;
}

// ---------------------------------------------------------------------------
// Resources an anonymous client can make the service keep

#[tokio::test]
async fn made_up_http_methods_do_not_grow_the_metrics() {
    let app = spawn_app().await;
    // No token needed: any method on any path is counted.
    for i in 0..100 {
        let method = format!("X{i:03}{}", "A".repeat(1_000));
        let request = format!("{method} /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let status = raw_status(app.port, request.as_bytes()).await;
        assert!(
            status.is_some_and(|s| (400..500).contains(&s)),
            "{status:?}"
        );
    }
    let metrics = app
        .http
        .get(app.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let series = metrics.lines().filter(|l| l.contains("method=\"X")).count();
    assert_eq!(series, 0, "{} bytes of metrics", metrics.len());
}
