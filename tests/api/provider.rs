//! Tokens from a real OpenID provider (npm `oidc-provider`, run as a
//! process by tests/oidc/provider.mjs, installed by scripts/oidc-provider.sh),
//! checked against its published keys: the buyer is the token's `sub`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use reqwest::Response;
use serde_json::{json, Value};
use test_support::process::{free_port, Service, ServiceProcess};
use test_support::scratch::ScratchDir;
use tokio::sync::OnceCell;

use crate::helpers::{new_key, order_body, spawn_app_with, Seen, TestApp};

const AUDIENCE: &str = "https://checkout.stagedoor.test";
const RS256: &str = "https://rs.stagedoor.test/rs256";
const ES256: &str = "https://rs.stagedoor.test/es256";
const EXPIRING: &str = "https://rs.stagedoor.test/expiring";
const OTHER_AUDIENCE: &str = "https://rs.stagedoor.test/other";
const AUTH0_BUYER: &str = "auth0|64f0c2a1b2c3d4e5f6a7b8c9";
const GOOGLE_BUYER: &str = "google-oauth2|109876543210987654321";

/// The installed `oidc-provider` module, installed once per run.
async fn provider_module() -> &'static str {
    static MODULE: OnceCell<String> = OnceCell::const_new();
    MODULE
        .get_or_init(|| async {
            let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/oidc-provider.sh");
            let output = tokio::process::Command::new("bash")
                .arg(script)
                .output()
                .await
                .expect("scripts/oidc-provider.sh");
            assert!(
                output.status.success(),
                "scripts/oidc-provider.sh: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            String::from_utf8(output.stdout).unwrap().trim().to_owned()
        })
        .await
}

/// One provider process: its port, keys and issuer are the test's.
struct IdentityProvider {
    process: ServiceProcess,
    http: reqwest::Client,
}

struct Keys<'a> {
    file: PathBuf,
    prefix: &'a str,
}

impl IdentityProvider {
    async fn start(port: u16, issuer: Option<&str>, keys: &Keys<'_>) -> Self {
        let url = format!("http://127.0.0.1:{port}");
        let clients = json!([AUTH0_BUYER, GOOGLE_BUYER]).to_string();
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/oidc/provider.mjs");
        let process = Service::new("node", &url)
            .arg(script)
            .env("OIDC_PROVIDER_MODULE", provider_module().await)
            .env("PORT", port.to_string())
            .env("ISSUER", issuer.unwrap_or(&url))
            .env("KEYS_FILE", &keys.file)
            .env("KEY_PREFIX", keys.prefix)
            .env("AUDIENCE", AUDIENCE)
            .env("CLIENTS", clients)
            .health_path("/.well-known/openid-configuration")
            .spawn_or_panic(Duration::from_secs(30))
            .await;
        Self {
            process,
            http: reqwest::Client::new(),
        }
    }

    fn url(&self) -> &str {
        self.process.url()
    }

    /// An access token for `buyer` (a client of the provider) and `resource`.
    async fn token(&self, buyer: &str, resource: &str) -> String {
        let response = self
            .http
            .post(format!("{}/token", self.url()))
            .header("Content-Type", "application/x-www-form-urlencoded")
            .body(format!(
                "grant_type=client_credentials&client_id={}&client_secret=secret&resource={}",
                encoded(buyer),
                encoded(resource)
            ))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "token for {buyer} {resource}");
        let body: Value = response.json().await.unwrap();
        body["access_token"].as_str().unwrap().to_owned()
    }

    /// A token like an RS256 one, but signed by a key it never published.
    async fn forged(&self, buyer: &str) -> String {
        self.http
            .get(format!("{}/test/forged?sub={}", self.url(), encoded(buyer)))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap()
    }

    async fn stop(self) {
        self.process.stop(Duration::from_secs(10)).await;
    }
}

/// A provider on a port of its own, with keys made for `dir`, and an
/// instance that trusts it (through discovery, with the audience checked).
async fn app_trusting_a_provider(dir: &ScratchDir) -> (TestApp, IdentityProvider, u16) {
    let port = free_port();
    let keys = Keys {
        file: dir.path().join("keys-1.json"),
        prefix: "first",
    };
    let provider = IdentityProvider::start(port, None, &keys).await;
    let issuer = provider.url().to_owned();
    let app = spawn_app_with(|settings| {
        settings.auth.oidc_issuer = issuer;
        settings.auth.audience = AUDIENCE.into();
        settings.auth.leeway_secs = 0;
    })
    .await;
    (app, provider, port)
}

async fn seats(app: &TestApp, token: &str) -> Response {
    app.http
        .get(app.url("/events/idp/seats"))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
}

async fn post_hold(app: &TestApp, token: &str, seat_id: i64, key: &str) -> Seen {
    let response = app
        .http
        .post(app.url("/holds"))
        .bearer_auth(token)
        .header("Idempotency-Key", key)
        .json(&json!({ "seat_id": seat_id }))
        .send()
        .await
        .unwrap();
    Seen::of(response).await
}

async fn post_order(app: &TestApp, token: &str, hold_id: i64, key: &str) -> Seen {
    let response = app
        .http
        .post(app.url("/orders"))
        .bearer_auth(token)
        .header("Idempotency-Key", key)
        .header("Content-Type", "application/json")
        .body(order_body(&[hold_id], "pm_card_visa"))
        .send()
        .await
        .unwrap();
    Seen::of(response).await
}

#[tokio::test]
async fn a_buyer_of_the_identity_provider_holds_pays_and_replays_with_rs256_and_es256() {
    let dir = ScratchDir::new("stagedoor-idp-").unwrap();
    let (app, provider, _) = app_trusting_a_provider(&dir).await;
    let seat_ids = app.seed("idp", 2, 2_500).await;
    for ((buyer, resource), seat_id) in [(AUTH0_BUYER, RS256), (GOOGLE_BUYER, ES256)]
        .into_iter()
        .zip(seat_ids)
    {
        let token = provider.token(buyer, resource).await;
        let (hold_key, order_key) = (new_key(), new_key());
        let hold = post_hold(&app, &token, seat_id, &hold_key).await;
        assert_eq!(hold.status, 201, "{buyer}: {}", hold.text());
        let replayed = post_hold(&app, &token, seat_id, &hold_key).await;
        assert_eq!(replayed.body, hold.body, "{buyer}");
        assert!(replayed.replayed, "{buyer}");

        let hold_id = hold.json()["hold_id"].as_i64().unwrap();
        let order = post_order(&app, &token, hold_id, &order_key).await;
        assert_eq!(order.status, 201, "{buyer}: {}", order.text());
        assert_eq!(order.json()["status"], "paid");
        let replayed = post_order(&app, &token, hold_id, &order_key).await;
        assert_eq!(replayed.body, order.body, "{buyer}");
        assert!(replayed.replayed, "{buyer}");

        // The buyer is the subject, exactly as the provider gave it.
        let order_id = order.json()["order_id"].as_str().unwrap().to_owned();
        let owners = app
            .count(&format!(
                "SELECT count(*) FROM orders WHERE order_id = '{order_id}' AND user_id = '{buyer}'"
            ))
            .await;
        assert_eq!(owners, 1, "{buyer}");
    }
    assert_eq!(app.charges().await.len(), 2);
    provider.stop().await;
}

#[tokio::test]
async fn a_token_for_another_audience_issuer_or_key_or_expired_is_401() {
    let dir = ScratchDir::new("stagedoor-idp-").unwrap();
    let (app, provider, _) = app_trusting_a_provider(&dir).await;
    app.seed("idp", 1, 2_500).await;
    // The same keys under another issuer: only `iss` tells its tokens apart.
    let impostor = IdentityProvider::start(
        free_port(),
        Some("http://127.0.0.1:1/another-issuer"),
        &Keys {
            file: dir.path().join("keys-1.json"),
            prefix: "first",
        },
    )
    .await;
    let expiring = provider.token(AUTH0_BUYER, EXPIRING).await;
    let cases = [
        (
            "another audience",
            provider.token(AUTH0_BUYER, OTHER_AUDIENCE).await,
        ),
        ("another issuer", impostor.token(AUTH0_BUYER, RS256).await),
        ("an unpublished key", provider.forged(AUTH0_BUYER).await),
    ];
    // The control: the provider's own token for this audience is taken.
    let good = provider.token(AUTH0_BUYER, RS256).await;
    assert_eq!(seats(&app, &good).await.status(), 200);
    tokio::time::sleep(Duration::from_millis(2_100)).await;
    for (why, token) in cases.into_iter().chain([("expired", expiring)]) {
        let response = seats(&app, &token).await;
        assert_eq!(
            response
                .headers()
                .get("www-authenticate")
                .map(|v| v.as_bytes()),
            Some(&b"Bearer"[..]),
            "{why}"
        );
        let seen = Seen::of(response).await;
        assert_eq!(seen.status, 401, "{why}: {}", seen.text());
        assert_eq!(seen.problem(), "unauthorized", "{why}");
    }
    impostor.stop().await;
    provider.stop().await;
}

#[tokio::test]
async fn rotated_keys_are_taken_without_a_restart_and_a_stopped_provider_stops_nothing() {
    let dir = ScratchDir::new("stagedoor-idp-").unwrap();
    let (app, provider, port) = app_trusting_a_provider(&dir).await;
    app.seed("idp", 1, 2_500).await;
    let before = provider.token(AUTH0_BUYER, ES256).await;
    assert_eq!(seats(&app, &before).await.status(), 200);

    // The provider comes back on its address with new keys only.
    provider.stop().await;
    let rotated = IdentityProvider::start(
        port,
        None,
        &Keys {
            file: dir.path().join("keys-2.json"),
            prefix: "second",
        },
    )
    .await;
    let after = rotated.token(AUTH0_BUYER, ES256).await;
    assert!(header_kid(&after).starts_with("second-"));
    let seen = Seen::of(seats(&app, &after).await).await;
    assert_eq!(seen.status, 200, "the new kid: {}", seen.text());

    // The provider goes away: the tokens it issued keep working, even once
    // a token with an unknown `kid` made the instance try to fetch the keys
    // again and fail.
    rotated.stop().await;
    assert_eq!(
        seats(&app, &hand_made_rs256_looking_token()).await.status(),
        401
    );
    let seen = Seen::of(seats(&app, &after).await).await;
    assert_eq!(seen.status, 200, "provider down: {}", seen.text());
    let ready = app.http.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 200);
}

#[tokio::test]
async fn an_instance_that_never_got_the_keys_answers_503_not_401() {
    // Nothing listens there: the first fetch fails.
    let nowhere = format!("http://127.0.0.1:{}/jwks", free_port());
    let app = spawn_app_with(|settings| {
        settings.auth.jwks_url = nowhere;
        settings.auth.audience = AUDIENCE.into();
    })
    .await;
    app.seed("idp", 1, 2_500).await;
    let token = hand_made_rs256_looking_token();
    let seen = Seen::of(seats(&app, &token).await).await;
    assert_eq!(seen.status, 503, "{}", seen.text());
    assert_eq!(seen.problem(), "service-unavailable");
    assert!(seen.retry_after.is_some());
    let ready = app.http.get(app.url("/readyz")).send().await.unwrap();
    assert_eq!(ready.status(), 503);
    // HS256 tokens of the local secret are not the provider's: still served.
    assert_eq!(app.get_seats("alice", "idp").await.status(), 200);
}

/// Percent-encoded for a form or a query (all but RFC 3986's unreserved).
fn encoded(value: &str) -> String {
    value
        .bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                char::from(b).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The `kid` of a token's header.
fn header_kid(token: &str) -> String {
    use base64::Engine;
    let header = token.split('.').next().unwrap();
    let header = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(header)
        .unwrap();
    let header: Value = serde_json::from_slice(&header).unwrap();
    header["kid"].as_str().unwrap().to_owned()
}

/// A token whose header says RS256 (its signature does not matter: with no
/// key set, nothing can be checked).
fn hand_made_rs256_looking_token() -> String {
    use base64::Engine;
    let b64 = |v: Value| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(v.to_string());
    format!(
        "{}.{}.c2lnbmF0dXJl",
        b64(json!({"alg": "RS256", "kid": "k"})),
        b64(json!({"sub": AUTH0_BUYER, "exp": 4_000_000_000u64}))
    )
}
