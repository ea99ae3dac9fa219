//! `GET /openapi.json`: an OpenAPI 3 document that lists exactly the routes
//! the app serves, each guarded as it says.

use std::collections::BTreeSet;

use reqwest::Method;
use serde_json::{json, Value};

use crate::helpers::{spawn_app, spawn_app_with, TestApp};

/// Every (method, path template) of the API. With `PAGES`, this list must
/// follow `routes()` in src/http/mod.rs: an API route added there is
/// documented by the same registration, and must be added here.
const SERVED: &[(&str, &str)] = &[
    ("GET", "/healthz"),
    ("GET", "/readyz"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
    ("GET", "/events/{event_id}/seats"),
    ("POST", "/holds"),
    ("DELETE", "/holds/{hold_id}"),
    ("GET", "/orders"),
    ("POST", "/orders"),
    ("GET", "/orders/{order_id}"),
    ("POST", "/payrail/events"),
];

/// Served, but browser files rather than API (the demo page, the client
/// module and its types): not in the document.
const PAGES: &[(&str, &str)] = &[
    ("GET", "/demo/"),
    ("GET", "/demo"),
    ("GET", "/client/checkout.js"),
    ("GET", "/client/checkout.d.ts"),
];

/// The only routes that need no bearer token.
const OPEN: &[&str] = &[
    "/healthz",
    "/readyz",
    "/metrics",
    "/openapi.json",
    "/payrail/events",
];
/// Open routes that believe a request only by its own signature: without
/// one, 400.
const SIGNED: &[&str] = &["/payrail/events"];

const METHODS: &[&str] = &[
    "get", "put", "post", "delete", "options", "head", "patch", "trace",
];

async fn document(app: &TestApp) -> Value {
    let response = app.http.get(app.url("/openapi.json")).send().await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(
        response.headers()["content-type"],
        "application/json",
        "the document's content type"
    );
    response.json().await.expect("the document is JSON")
}

/// (METHOD, path template, operation) for every operation in the document.
fn operations(doc: &Value) -> Vec<(String, String, Value)> {
    let paths = doc["paths"].as_object().expect("paths");
    let mut found = Vec::new();
    for (path, item) in paths {
        for method in METHODS {
            if let Some(operation) = item.get(*method) {
                found.push((method.to_uppercase(), path.clone(), operation.clone()));
            }
        }
    }
    found
}

/// Every `"$ref": "#/..."` in `value`.
fn refs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (name, inner) in map {
                match (name.as_str(), inner) {
                    ("$ref", Value::String(target)) => out.push(target.clone()),
                    _ => refs(inner, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| refs(item, out)),
        _ => {}
    }
}

#[tokio::test]
async fn the_document_is_openapi_3_and_lists_exactly_the_served_routes() {
    let app = spawn_app().await;
    let doc = document(&app).await;
    let version = doc["openapi"].as_str().expect("an openapi member");
    assert!(version.starts_with("3."), "OpenAPI 3.x, not {version}");
    assert!(doc["info"]["title"].is_string() && doc["info"]["version"].is_string());
    // Relative, so that it names whichever instance served the document.
    assert_eq!(doc["servers"][0]["url"], "/", "servers: {}", doc["servers"]);

    let documented: BTreeSet<(String, String)> = operations(&doc)
        .into_iter()
        .map(|(method, path, _)| (method, path))
        .collect();
    let served: BTreeSet<(String, String)> = SERVED
        .iter()
        .map(|(method, path)| (method.to_string(), path.to_string()))
        .collect();
    assert_eq!(documented, served);
    for (method, path) in PAGES {
        assert!(doc["paths"].get(*path).is_none(), "{path} is not API");
        let response = app
            .http
            .request(
                Method::from_bytes(method.as_bytes()).unwrap(),
                app.url(path),
            )
            .send()
            .await
            .unwrap();
        assert!(response.status().is_success(), "{method} {path} is served");
    }

    let mut targets = Vec::new();
    refs(&doc, &mut targets);
    assert!(!targets.is_empty());
    for target in targets {
        let pointer = target
            .strip_prefix('#')
            .unwrap_or_else(|| panic!("{target} is not local"));
        assert!(doc.pointer(pointer).is_some(), "{target} resolves");
    }
    let ids: BTreeSet<String> = operations(&doc)
        .into_iter()
        .filter_map(|(_, _, op)| op["operationId"].as_str().map(str::to_owned))
        .collect();
    assert_eq!(ids.len(), SERVED.len(), "operation ids are unique");
}

#[tokio::test]
async fn every_documented_operation_is_served_and_guarded_as_documented() {
    let app = spawn_app().await;
    let doc = document(&app).await;
    let scheme = &doc["components"]["securitySchemes"]["bearer"];
    assert_eq!(scheme["type"], "http");
    assert_eq!(scheme["scheme"], "bearer");

    for (method, path, operation) in operations(&doc) {
        let what = format!("{method} {path}");
        // Each operation says it: the bearer scheme, or `[]` for none.
        let security = operation["security"]
            .as_array()
            .unwrap_or_else(|| panic!("{what} declares its security"));
        let guarded = security.iter().any(|r| r.get("bearer").is_some());
        assert_eq!(guarded, !OPEN.contains(&path.as_str()), "{what}: security");
        assert!(guarded || security.is_empty(), "{what}: {security:?}");
        assert!(
            operation["description"]
                .as_str()
                .is_some_and(|d| !d.is_empty()),
            "{what} has a description"
        );

        // Without a token a guarded route answers 401 before it looks at
        // anything else, and an open one answers; neither is 404 or 405.
        let concrete = path
            .replace("{event_id}", "demo")
            .replace("{hold_id}", "1")
            .replace("{order_id}", "00000000-0000-0000-0000-000000000000");
        let response = app
            .http
            .request(
                Method::from_bytes(method.as_bytes()).unwrap(),
                app.url(&concrete),
            )
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        assert!(status != 404 && status != 405, "{what} is served: {status}");
        if guarded {
            assert_eq!(status, 401, "{what} without a token");
        } else if SIGNED.contains(&path.as_str()) {
            assert_eq!(status, 400, "{what} without a signature");
        } else {
            assert_eq!(status, 200, "{what} without a token");
        }
        assert!(
            operation["responses"].get(status.to_string()).is_some(),
            "{what}: {status} is documented"
        );
    }
}

#[tokio::test]
async fn the_idempotency_key_is_documented_as_required_on_orders_and_optional_on_holds() {
    let app = spawn_app_with(|s| s.idempotency.ttl_secs = 7_200).await;
    let doc = document(&app).await;
    for (path, required) in [("/orders", true), ("/holds", false)] {
        let parameters = doc["paths"][path]["post"]["parameters"]
            .as_array()
            .unwrap_or_else(|| panic!("POST {path} has parameters"));
        let key = parameters
            .iter()
            .find(|p| p["name"] == "Idempotency-Key" && p["in"] == "header")
            .unwrap_or_else(|| panic!("POST {path} declares Idempotency-Key"));
        assert_eq!(
            key["required"].as_bool().unwrap_or(false),
            required,
            "POST {path}"
        );
        assert_eq!(key["schema"]["maxLength"], 255, "POST {path}");
        let description = key["description"].as_str().unwrap_or_default();
        assert!(
            description.contains("lives 7200 s (`idempotency.ttl_secs`)")
                && description.contains("After it the key is forgotten"),
            "POST {path} publishes the configured lifetime: {description}"
        );
        let created = &doc["paths"][path]["post"]["responses"]["201"]["headers"];
        assert!(created.get("Idempotent-Replayed").is_some(), "POST {path}");
    }
    let order_created = &doc["paths"]["/orders"]["post"]["responses"]["201"]["headers"];
    assert!(order_created.get("Location").is_some());
    let problem = &doc["paths"]["/orders"]["post"]["responses"]["409"];
    assert!(problem["content"].get("application/problem+json").is_some());
    assert!(problem["headers"].get("Retry-After").is_some());
    assert!(
        problem["headers"].get("Location").is_some(),
        "a 409 in progress names its order"
    );
}

#[tokio::test]
async fn the_order_event_sent_to_the_shop_is_a_webhook_of_the_document() {
    let app = spawn_app().await;
    let doc = document(&app).await;
    let hook = &doc["webhooks"]["orderOutcome"]["post"];
    let signature = hook["parameters"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == "Stagedoor-Signature"))
        .unwrap_or_else(|| panic!("the signature header: {hook}"));
    assert_eq!(signature["required"], true);
    assert_eq!(
        hook["requestBody"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/OrderEvent"
    );
    let schemas = &doc["components"]["schemas"];
    let required = schemas["OrderEvent"]["required"].clone();
    assert_eq!(required, json!(["id", "type", "created", "data"]));
    assert_eq!(
        schemas["OrderEventData"]["properties"]["order"]["$ref"], "#/components/schemas/Order",
        "the order as GET /orders/{{order_id}} shows it"
    );
    assert_eq!(
        schemas["EventType"]["enum"],
        json!(["order.paid", "order.declined", "order.failed"])
    );
}
