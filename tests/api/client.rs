//! The browser client: `GET /client/checkout.js` (the ES module) and
//! `GET /client/checkout.d.ts` (its types), public, compiled in, cacheable
//! and revalidated with their ETag.

use reqwest::header::HeaderMap;

use crate::helpers::{spawn_app, spawn_app_with, TestApp};

const MODULE: &str = include_str!("../../web/client/checkout.js");
const TYPES: &str = include_str!("../../web/client/checkout.d.ts");

/// (path, content type, the bytes) of each served file.
const FILES: &[(&str, &str, &str)] = &[
    (
        "/client/checkout.js",
        "text/javascript; charset=utf-8",
        MODULE,
    ),
    (
        "/client/checkout.d.ts",
        "application/typescript; charset=utf-8",
        TYPES,
    ),
];

fn header<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

async fn get(app: &TestApp, path: &str, if_none_match: Option<&str>) -> reqwest::Response {
    let mut request = app.http.get(app.url(path));
    if let Some(tags) = if_none_match {
        request = request.header("If-None-Match", tags);
    }
    request.send().await.expect("GET")
}

/// The file's ETag, from a plain GET.
async fn etag(app: &TestApp, path: &str) -> String {
    let response = get(app, path, None).await;
    assert_eq!(response.status(), 200, "{path}");
    header(response.headers(), "etag")
        .unwrap_or_else(|| panic!("{path} has an ETag"))
        .to_owned()
}

#[tokio::test]
async fn the_files_are_served_without_a_token_with_their_type_and_cache_headers() {
    let app = spawn_app().await;
    for (path, content_type, bytes) in FILES {
        let response = get(&app, path, None).await;
        assert_eq!(response.status(), 200, "{path}");
        let headers = response.headers().clone();
        assert_eq!(
            header(&headers, "content-type"),
            Some(*content_type),
            "{path}"
        );
        assert_eq!(
            header(&headers, "cache-control"),
            Some("public, max-age=300"),
            "{path}"
        );
        assert_eq!(header(&headers, "x-content-type-options"), Some("nosniff"));
        let tag = header(&headers, "etag").unwrap_or_default();
        assert!(
            tag.len() > 2 && tag.starts_with('"') && tag.ends_with('"'),
            "{path}: a strong ETag, not {tag:?}"
        );
        assert_eq!(response.text().await.unwrap(), *bytes, "{path}: the file");
    }
}

#[tokio::test]
async fn the_module_makes_the_key_at_the_click_and_sends_it() {
    let app = spawn_app().await;
    let module = get(&app, "/client/checkout.js", None)
        .await
        .text()
        .await
        .unwrap();
    for needed in [
        "crypto.randomUUID()",
        "'Idempotency-Key'",
        "headers.Prefer",
        "export class Click",
    ] {
        assert!(module.contains(needed), "the module has {needed}");
    }
}

#[tokio::test]
async fn a_browser_that_has_the_file_gets_304_with_its_validators_and_no_body() {
    let app = spawn_app().await;
    let mut tags = Vec::new();
    for (path, _, _) in FILES {
        let tag = etag(&app, path).await;
        let weak = format!("W/{tag}");
        let listed = format!(r#""not-this-one", {tag}"#);
        for if_none_match in [tag.as_str(), weak.as_str(), listed.as_str(), "*"] {
            let response = get(&app, path, Some(if_none_match)).await;
            assert_eq!(
                response.status(),
                304,
                "{path} with If-None-Match {if_none_match}"
            );
            let headers = response.headers().clone();
            assert_eq!(header(&headers, "etag"), Some(tag.as_str()), "{path}");
            assert_eq!(
                header(&headers, "cache-control"),
                Some("public, max-age=300"),
                "{path}: a 304 refreshes the cached copy's freshness"
            );
            assert!(
                response.bytes().await.unwrap().is_empty(),
                "{path}: no body"
            );
        }
        for stale in [r#""not-this-one""#, "W/\"x\"", "garbage"] {
            let response = get(&app, path, Some(stale)).await;
            assert_eq!(response.status(), 200, "{path} with If-None-Match {stale}");
        }
        tags.push(tag);
    }
    assert_ne!(tags[0], tags[1], "each file its own tag");
}

#[tokio::test]
async fn every_instance_of_one_build_answers_the_same_tag() {
    let app = spawn_app().await;
    let other = app.another_instance().await;
    for (path, _, _) in FILES {
        let tag = etag(&app, path).await;
        assert_eq!(etag(&other, path).await, tag, "{path}");
        let response = get(&other, path, Some(&tag)).await;
        assert_eq!(
            response.status(),
            304,
            "{path}: a tag from one instance, 304 from another"
        );
    }
}

#[tokio::test]
async fn other_methods_are_405_with_allow_get_and_head() {
    let app = spawn_app().await;
    for path in FILES.iter().map(|(path, _, _)| *path).chain(["/demo/"]) {
        let response = app.http.post(app.url(path)).send().await.unwrap();
        assert_eq!(response.status(), 405, "{path}");
        assert_eq!(
            header(response.headers(), "allow"),
            Some("GET, HEAD"),
            "{path}"
        );
    }
}

#[tokio::test]
async fn a_page_on_an_allowed_origin_may_import_the_module() {
    // A module script is fetched in CORS mode: without the allow header a
    // shop page on another origin could not import it.
    let shop = "http://shop.example";
    let app = spawn_app_with(|s| s.http.cors_origins = vec![shop.into()]).await;
    let response = app
        .http
        .get(app.url("/client/checkout.js"))
        .header("Origin", shop)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        header(response.headers(), "access-control-allow-origin"),
        Some(shop)
    );
}

/// A browser, a cache or a link checker probes with `HEAD`: the same status
/// and headers as `GET`, no body (it was 405).
#[tokio::test]
async fn head_answers_the_files_and_the_demo_page_like_get_without_a_body() {
    let app = spawn_app().await;
    for path in ["/client/checkout.js", "/client/checkout.d.ts", "/demo/"] {
        let got = get(&app, path, None).await;
        let head = app.http.head(app.url(path)).send().await.expect("HEAD");
        assert_eq!(head.status(), 200, "{path}");
        for name in ["content-type", "cache-control", "etag", "content-length"] {
            assert_eq!(
                header(head.headers(), name),
                header(got.headers(), name),
                "{path}: {name}"
            );
        }
        assert!(head.bytes().await.unwrap().is_empty(), "{path}: no body");
    }
}

/// A link to `/demo/?token=…` must not sign its visitor in as the link's
/// maker (whose holds and orders the visitor would then pay for): the page
/// served reads no token from its address, and its help text offers none.
#[tokio::test]
async fn the_demo_page_takes_no_token_from_its_address() {
    let app = spawn_app().await;
    let response = get(&app, "/demo/?token=someone-elses", None).await;
    assert_eq!(response.status(), 200);
    let page = response.text().await.expect("the page");
    assert!(page.contains("sessionStorage"), "the token is kept per tab");
    for read in ["get('token')", "has('token')", "?token="] {
        assert!(!page.contains(read), "the page still reads `{read}`");
    }
}
