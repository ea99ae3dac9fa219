//! Browser clients: CORS for the configured origins only, and the
//! public demo page.

use reqwest::header::HeaderMap;
use reqwest::Method;

use crate::helpers::{new_key, order_body, spawn_app, spawn_app_with, TestApp};

const SHOP: &str = "http://shop.example";

async fn spawn_shop_app() -> TestApp {
    spawn_app_with(|s| s.http.cors_origins = vec![SHOP.into()]).await
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

/// The comma-separated names of a header, lowercased.
fn names(headers: &HeaderMap, name: &str) -> Vec<String> {
    header(headers, name)
        .unwrap_or_default()
        .split(',')
        .map(|n| n.trim().to_ascii_lowercase())
        .filter(|n| !n.is_empty())
        .collect()
}

async fn preflight(app: &TestApp, origin: &str, path: &str, method: &str) -> reqwest::Response {
    app.http
        .request(Method::OPTIONS, app.url(path))
        .header("Origin", origin)
        .header("Access-Control-Request-Method", method)
        .header(
            "Access-Control-Request-Headers",
            "authorization, content-type, idempotency-key, prefer, traceparent, tracestate",
        )
        .send()
        .await
        .expect("preflight")
}

#[tokio::test]
async fn a_preflight_from_an_allowed_origin_is_answered_without_a_token() {
    let app = spawn_shop_app().await;
    for (path, method) in [
        ("/orders", "POST"),
        ("/holds", "POST"),
        ("/holds/1", "DELETE"),
        ("/events/demo/seats", "GET"),
    ] {
        let response = preflight(&app, SHOP, path, method).await;
        assert!(
            response.status().is_success(),
            "preflight of {method} {path}: {}",
            response.status()
        );
        let headers = response.headers();
        assert_eq!(
            header(headers, "access-control-allow-origin"),
            Some(SHOP),
            "{path}"
        );
        let allowed = names(headers, "access-control-allow-headers");
        for wanted in [
            "authorization",
            "content-type",
            "idempotency-key",
            "prefer",
            "if-none-match",
            "traceparent",
            "tracestate",
        ] {
            assert!(
                allowed.iter().any(|h| h == wanted),
                "{wanted} in {allowed:?}"
            );
        }
        let methods = names(headers, "access-control-allow-methods");
        assert!(
            methods.iter().any(|m| m.eq_ignore_ascii_case(method)),
            "{method} in {methods:?}"
        );
        assert!(
            header(headers, "access-control-max-age").is_some_and(|s| s.parse::<u32>().is_ok()),
            "a max age"
        );
    }
}

#[tokio::test]
async fn a_replayed_order_to_an_allowed_origin_exposes_the_headers_a_client_acts_on() {
    let app = spawn_shop_app().await;
    let seats = app.seed("show", 1, 2_500).await;
    let hold = app.hold("alice", seats[0]).await;
    let (key, body) = (new_key(), order_body(&[hold], "pm_card_visa"));
    let post = || {
        app.as_buyer(app.http.post(app.url("/orders")), "alice")
            .header("Origin", SHOP)
            .header("Idempotency-Key", &key)
            .header("Content-Type", "application/json")
            .body(body.clone())
            .send()
    };
    assert_eq!(post().await.unwrap().status(), 201);

    let replay = post().await.unwrap();
    assert_eq!(replay.status(), 201);
    let headers = replay.headers();
    assert_eq!(header(headers, "access-control-allow-origin"), Some(SHOP));
    assert_eq!(header(headers, "idempotent-replayed"), Some("true"));
    assert!(header(headers, "location").is_some());
    let exposed = names(headers, "access-control-expose-headers");
    for wanted in [
        "location",
        "retry-after",
        "idempotent-replayed",
        "preference-applied",
        "etag",
    ] {
        assert!(
            exposed.iter().any(|h| h == wanted),
            "{wanted} in {exposed:?}"
        );
    }
}

#[tokio::test]
async fn another_origin_gets_no_cors_allow_header() {
    let app = spawn_shop_app().await;
    let evil = "http://evil.example";

    let response = preflight(&app, evil, "/orders", "POST").await;
    assert!(!response.status().is_success(), "{}", response.status());
    assert_eq!(
        header(response.headers(), "access-control-allow-origin"),
        None
    );
    // The refusal is a problem like every other error.
    let seen = crate::helpers::Seen::of(response).await;
    assert_eq!(
        (seen.status, seen.problem().as_str()),
        (400, "invalid-request")
    );

    // A simple request is still answered (CORS is the browser's guard, not
    // authentication), but the browser gets nothing that lets the page read it.
    let response = app
        .http
        .get(app.url("/healthz"))
        .header("Origin", evil)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        header(response.headers(), "access-control-allow-origin"),
        None
    );
}

#[tokio::test]
async fn without_configured_origins_there_are_no_cors_headers_at_all() {
    let app = spawn_app().await;
    let response = preflight(&app, SHOP, "/orders", "POST").await;
    assert!(!response.status().is_success(), "{}", response.status());
    let response = app
        .http
        .get(app.url("/healthz"))
        .header("Origin", SHOP)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let cors: Vec<_> = response
        .headers()
        .keys()
        .filter(|name| name.as_str().starts_with("access-control-"))
        .collect();
    assert!(cors.is_empty(), "CORS headers without origins: {cors:?}");
}

#[tokio::test]
async fn the_demo_page_is_served_without_a_token() {
    let app = spawn_app().await;
    let response = app.http.get(app.url("/demo/")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        header(response.headers(), "content-type"),
        Some("text/html; charset=utf-8")
    );
    let csp = header(response.headers(), "content-security-policy")
        .unwrap_or_default()
        .to_owned();
    let page = response.text().await.unwrap();
    assert!(
        page.contains(r#"from '/client/checkout.js'"#),
        "the page makes its keys with the client module"
    );
    assert!(
        csp.contains("script-src 'self'"),
        "the page may load the module: {csp}"
    );
    assert!(page.contains(r#"data-testid="pay""#));
}

#[tokio::test]
async fn demo_without_a_slash_redirects_to_the_page_keeping_the_query() {
    let app = spawn_app().await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let response = http
        .get(app.url("/demo?event=demo&timeout=5"))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 308);
    assert_eq!(
        header(response.headers(), "location"),
        Some("/demo/?event=demo&timeout=5")
    );
}
