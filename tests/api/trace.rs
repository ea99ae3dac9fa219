//! One click, one trace: the service reads the caller's `traceparent`,
//! logs its trace id, sends it on to Payrail as the parent of its call, and
//! exports its spans to an OTLP/HTTP receiver started here (a real one:
//! protobuf over HTTP, decoded with `opentelemetry-proto`).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix_web::{web, App, HttpResponse, HttpServer};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::json;
use stagedoor_checkout::auth::{BuyerId, Tokens};
use test_support::process::{free_port, Service};

use crate::helpers::{new_key, order_body, spawn_app, Seen};

type Received = Arc<Mutex<Vec<Span>>>;

/// An OTLP/HTTP trace receiver on a port of its own.
struct Receiver {
    url: String,
    spans: Received,
    handle: actix_web::dev::ServerHandle,
}

async fn export(spans: web::Data<Received>, body: web::Bytes) -> HttpResponse {
    let Ok(request) = ExportTraceServiceRequest::decode(body) else {
        return HttpResponse::BadRequest().finish();
    };
    let received = request
        .resource_spans
        .into_iter()
        .flat_map(|r| r.scope_spans)
        .flat_map(|s| s.spans);
    spans.lock().unwrap().extend(received);
    HttpResponse::Ok()
        .content_type("application/x-protobuf")
        .body(ExportTraceServiceResponse::default().encode_to_vec())
}

impl Receiver {
    fn start() -> Self {
        let spans = Received::default();
        let data = web::Data::new(spans.clone());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = HttpServer::new(move || {
            App::new()
                .app_data(data.clone())
                .app_data(web::PayloadConfig::new(16 << 20))
                .route("/v1/traces", web::post().to(export))
        })
        .workers(1)
        .listen(listener)
        .unwrap()
        .run();
        let handle = server.handle();
        tokio::spawn(server);
        Self { url, spans, handle }
    }

    fn spans_of(&self, trace_id: &[u8]) -> Vec<Span> {
        let spans = self.spans.lock().unwrap();
        spans
            .iter()
            .filter(|s| s.trace_id == trace_id)
            .cloned()
            .collect()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test]
async fn one_click_is_one_exported_trace_that_holds_the_payrail_call() {
    // A database of its own (from a test app), and the real binary with its
    // embedded sandbox, whose log lines go to the same log.
    let app = spawn_app().await;
    let receiver = Receiver::start();
    let port = free_port();
    let service = Service::new(
        env!("CARGO_BIN_EXE_stagedoor-checkout"),
        format!("http://127.0.0.1:{port}"),
    )
    .arg("serve")
    .env("STAGEDOOR_ENV", "local")
    .env(
        "STAGEDOOR_CONFIG_DIR",
        format!("{}/config", env!("CARGO_MANIFEST_DIR")),
    )
    .env("DATABASE_URL", &app.db.url)
    .env("STAGEDOOR__SERVER__PORT", port.to_string())
    .env(
        "STAGEDOOR__DATABASE__GENERIC_PLANS",
        app.settings.database.generic_plans.to_string(),
    )
    .env("STAGEDOOR__TELEMETRY__OTLP_ENDPOINT", &receiver.url)
    .env("RUST_LOG", "info")
    .spawn_or_panic(Duration::from_secs(20))
    .await;
    let url = |path: &str| format!("{}{path}", service.url());
    let token = Tokens::new(&app.settings.auth.jwt_secret)
        .unwrap()
        .sign(
            &BuyerId::parse("auth0|traced-buyer").unwrap(),
            Duration::from_secs(600),
        )
        .unwrap();
    let seats = Seen::of(
        app.http
            .get(url("/events/demo/seats"))
            .bearer_auth(&token)
            .send()
            .await
            .unwrap(),
    )
    .await;
    let seat_id = seats.json()["seats"][0]["seat_id"].as_i64().unwrap();
    let hold = Seen::of(
        app.http
            .post(url("/holds"))
            .bearer_auth(&token)
            .json(&json!({ "seat_id": seat_id }))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(hold.status, 201, "{}", hold.text());
    let hold_id = hold.json()["hold_id"].as_i64().unwrap();

    // The click, in the shop page's trace.
    let (trace_id, page_span) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let order = Seen::of(
        app.http
            .post(url("/orders"))
            .bearer_auth(&token)
            .header("Idempotency-Key", new_key())
            .header("traceparent", format!("00-{trace_id}-{page_span}-01"))
            .header("tracestate", "shop=checkout")
            .header("Content-Type", "application/json")
            .body(order_body(&[hold_id], "pm_card_visa"))
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(order.status, 201, "{}", order.text());
    // A graceful stop sends the spans still buffered.
    let log = {
        let mut service = service;
        service.signal("TERM");
        assert!(service.wait(Duration::from_secs(20)).await.is_some());
        service.log()
    };

    let trace: Vec<u8> = (0..16)
        .map(|i| u8::from_str_radix(&trace_id[2 * i..2 * i + 2], 16).unwrap())
        .collect();
    let spans = receiver.spans_of(&trace);
    let named = |name: &str| {
        spans
            .iter()
            .find(|s| s.name == name)
            .unwrap_or_else(|| panic!("no span {name} in {:?}", names(&spans)))
    };
    let request = named("POST /orders");
    assert_eq!(hex(&request.parent_span_id), page_span);
    let charge = named("payrail charge");
    let claim = named("begin");
    for span in [charge, claim, named("create order"), named("settle order")] {
        assert!(
            descends_from(span, request, &spans),
            "{} is not inside the request: {:?}",
            span.name,
            names(&spans)
        );
    }
    // Everything the click did is in this one trace: no span of its
    // request belongs to another.
    let all = receiver.spans.lock().unwrap().clone();
    let orders_requests = all.iter().filter(|s| s.name == "POST /orders").count();
    assert_eq!(orders_requests, 1);

    // Payrail got the trace with the call's span as parent (the sandbox
    // logs it), and the request's log lines carry the trace id.
    let sent = format!("00-{trace_id}-{}-01", hex(&charge.span_id));
    assert!(
        log.lines()
            .any(|l| l.contains("payrail sandbox charge request") && l.contains(&sent)),
        "no sandbox line with {sent}:\n{log}"
    );
    assert!(
        log.lines().any(|l| l.contains("request finished")
            && l.contains("/orders")
            && l.contains(&format!("trace_id={trace_id}"))),
        "no request line with the trace id:\n{log}"
    );
    receiver.handle.stop(false).await;
}

fn names(spans: &[Span]) -> Vec<&str> {
    spans.iter().map(|s| s.name.as_str()).collect()
}

/// Whether `ancestor` is on `span`'s chain of parents.
fn descends_from(span: &Span, ancestor: &Span, spans: &[Span]) -> bool {
    let mut current = span;
    while let Some(parent) = spans.iter().find(|s| s.span_id == current.parent_span_id) {
        if parent.span_id == ancestor.span_id {
            return true;
        }
        current = parent;
    }
    false
}
