//! Bearer tokens: forged, malformed and oversized ones (alg `none`,
//! HS512, `nbf` and plain expiry are in auth.rs).

use serde_json::json;

use super::{
    alice_claims, alice_with_a_hold, assert_refused, b64, forge, hs256, now,
    order_with_authorization, raw_status, rows, secret,
};
use crate::helpers::{new_key, order_body, Seen};
use crate::invariants::assert_invariants;

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
