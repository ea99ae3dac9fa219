use std::time::{SystemTime, UNIX_EPOCH};

use jsonwebtoken::{encode, Algorithm, EncodingKey, Header};
use serde_json::{json, Value};

use crate::helpers::{spawn_app, Seen};

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

fn sign(secret: &str, algorithm: Algorithm, claims: Value) -> String {
    encode(
        &Header::new(algorithm),
        &claims,
        &EncodingKey::from_secret(secret.as_bytes()).unwrap(),
    )
    .unwrap()
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

#[tokio::test]
async fn every_authentication_failure_is_a_401_problem_with_a_bearer_challenge() {
    let app = spawn_app().await;
    let secret = secrecy::ExposeSecret::expose_secret(&app.settings.auth.jwt_secret).to_owned();
    let valid_claims = json!({"sub": "alice", "exp": now() + 600});
    let unsigned = format!(
        "{}.{}.",
        b64(br#"{"alg":"none","typ":"JWT"}"#),
        b64(valid_claims.to_string().as_bytes())
    );
    let cases: Vec<(&str, Option<String>)> = vec![
        ("no Authorization header", None),
        ("not a bearer scheme", Some("Basic YWxpY2U6cHc=".into())),
        ("an empty bearer", Some("Bearer ".into())),
        ("not a JWT", Some("Bearer not.a.jwt".into())),
        (
            "signed with another secret",
            Some(format!(
                "Bearer {}",
                sign(
                    "another-secret-entirely-0000",
                    Algorithm::HS256,
                    valid_claims.clone()
                )
            )),
        ),
        ("alg none", Some(format!("Bearer {unsigned}"))),
        (
            "alg HS512",
            Some(format!(
                "Bearer {}",
                sign(&secret, Algorithm::HS512, valid_claims.clone())
            )),
        ),
        (
            "expired",
            Some(format!(
                "Bearer {}",
                sign(
                    &secret,
                    Algorithm::HS256,
                    json!({"sub": "alice", "exp": now() - 120})
                )
            )),
        ),
        (
            "no exp",
            Some(format!(
                "Bearer {}",
                sign(&secret, Algorithm::HS256, json!({"sub": "alice"}))
            )),
        ),
        (
            "not valid yet",
            Some(format!(
                "Bearer {}",
                sign(
                    &secret,
                    Algorithm::HS256,
                    json!({"sub": "alice", "exp": now() + 600, "nbf": now() + 300})
                )
            )),
        ),
        (
            "no sub",
            Some(format!(
                "Bearer {}",
                sign(&secret, Algorithm::HS256, json!({"exp": now() + 600}))
            )),
        ),
        (
            "a sub with a control character",
            Some(format!(
                "Bearer {}",
                sign(
                    &secret,
                    Algorithm::HS256,
                    json!({"sub": "a\u{7}b", "exp": now() + 600})
                )
            )),
        ),
        (
            "a sub of 256 bytes",
            Some(format!(
                "Bearer {}",
                sign(
                    &secret,
                    Algorithm::HS256,
                    json!({"sub": "x".repeat(256), "exp": now() + 600})
                )
            )),
        ),
        (
            "an oversized token",
            Some(format!("Bearer {}", "a".repeat(10_000))),
        ),
    ];
    for (why, header) in cases {
        let mut request = app.http.get(app.url("/events/demo/seats"));
        if let Some(header) = header {
            request = request.header("Authorization", header);
        }
        let response = request.send().await.unwrap();
        assert_eq!(
            response
                .headers()
                .get("www-authenticate")
                .map(|v| v.to_str().unwrap()),
            Some("Bearer"),
            "{why}"
        );
        let seen = Seen::of(response).await;
        assert_eq!(seen.status, 401, "{why}");
        assert_eq!(seen.problem(), "unauthorized", "{why}");
    }
}

#[tokio::test]
async fn a_valid_hs256_token_is_accepted() {
    let app = spawn_app().await;
    app.seed("show", 1, 1000).await;
    let secret = secrecy::ExposeSecret::expose_secret(&app.settings.auth.jwt_secret).to_owned();
    // Subjects as identity providers make them, and a token a few seconds
    // past its `exp` (within auth.leeway_secs).
    for (sub, exp) in [
        ("Buyer_1.x-y", now() + 60),
        ("auth0|64f0c2a1b2c3d4e5f6a7b8c9", now() + 60),
        ("AAAAAAAAAAAAAAAAAAAAAIkzqFVrSaSaFHy782bbtaQ", now() + 60),
        ("ana.lima+tickets@shop.example", now() + 60),
        ("f81d4fae-7dec-11d0-a765-00a0c91e6bf6", now() - 5),
    ] {
        let token = sign(&secret, Algorithm::HS256, json!({"sub": sub, "exp": exp}));
        let response = app
            .http
            .get(app.url("/events/show/seats"))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{sub}");
    }
}

#[tokio::test]
async fn the_browser_files_need_no_token_and_ignore_a_bad_one() {
    // The demo page and the client module are public (they hold no secret;
    // the API calls they make carry the buyer's own token): a stale token
    // left in a browser must not keep the checkout page from loading.
    let app = spawn_app().await;
    for path in ["/demo/", "/client/checkout.js", "/client/checkout.d.ts"] {
        for authorization in [None, Some("Bearer not.a.jwt"), Some("Basic YWxpY2U6cHc=")] {
            let mut request = app.http.get(app.url(path));
            if let Some(value) = authorization {
                request = request.header("Authorization", value);
            }
            let response = request.send().await.unwrap();
            assert_eq!(response.status(), 200, "{path} with {authorization:?}");
            assert!(
                response.headers().get("www-authenticate").is_none(),
                "{path}"
            );
        }
    }
}
