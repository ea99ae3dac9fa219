//! Logging and tracing: a tracing subscriber (JSON in production, human
//! text elsewhere), a root span per request carrying its id, trace id,
//! method, path, status and latency (the line that ends it also names the
//! buyer, the order and the problem type, when the handlers know them), and
//! W3C Trace Context: a request's
//! `traceparent` / `tracestate` make its span a child of the caller's (else
//! it starts a trace), and calls out (Payrail) carry the current span as
//! their parent ([`trace_headers`]). With `telemetry.otlp_endpoint` set, the
//! spans are exported over OTLP/HTTP. Secrets never reach a field.

use std::io::IsTerminal;
use std::time::Instant;

use actix_web::body::MessageBody;
use actix_web::dev::{ServiceRequest, ServiceResponse};
use actix_web::http::header::{HeaderMap, HeaderName, HeaderValue};
use actix_web::middleware::Next;
use actix_web::HttpMessage;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry::trace::{TraceContextExt, TracerProvider as _};
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use opentelemetry_sdk::Resource;
use tracing::Instrument;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::layer::{Layer as _, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::EnvFilter;
use uuid::Uuid;

use crate::config::TelemetrySettings;

const REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");
const SERVICE_NAME: &str = "stagedoor-checkout";

/// The installed tracing pipeline; [`Telemetry::shutdown`] sends the spans
/// still buffered before the process exits.
pub struct Telemetry(Option<SdkTracerProvider>);

#[derive(Debug, thiserror::Error)]
#[error("configuration key `telemetry.otlp_endpoint`: {0}")]
pub struct TelemetryError(#[from] opentelemetry_otlp::ExporterBuildError);

/// Installs the global subscriber once; later calls (tests) are no-ops.
/// `RUST_LOG` overrides the default level.
pub fn init(json: bool, settings: &TelemetrySettings) -> Result<Telemetry, TelemetryError> {
    let mut provider = SdkTracerProvider::builder()
        .with_resource(Resource::builder().with_service_name(SERVICE_NAME).build());
    if !settings.otlp_endpoint.is_empty() {
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(traces_url(&settings.otlp_endpoint))
            .build()?;
        provider = provider.with_batch_exporter(exporter);
    }
    let provider = provider.build();
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let fmt = tracing_subscriber::fmt::layer()
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let fmt = if json {
        fmt.json().flatten_event(true).boxed()
    } else {
        fmt.boxed()
    };
    let installed = tracing_subscriber::registry()
        .with(fmt)
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer(SERVICE_NAME)))
        .with(filter)
        .try_init();
    Ok(Telemetry(installed.is_ok().then_some(provider)))
}

impl Telemetry {
    pub fn shutdown(self) {
        if let Some(provider) = self.0 {
            if let Err(error) = provider.shutdown() {
                tracing::warn!(%error, "could not send the last spans");
            }
        }
    }
}

/// The collector's traces URL: `<endpoint>/v1/traces`, as OTLP/HTTP names it.
fn traces_url(endpoint: &str) -> String {
    let endpoint = endpoint.trim_end_matches('/');
    if endpoint.ends_with("/v1/traces") {
        endpoint.to_owned()
    } else {
        format!("{endpoint}/v1/traces")
    }
}

/// The `traceparent` (and `tracestate`) of the current span, for a call
/// out; empty when no trace is being recorded.
pub fn trace_headers() -> reqwest::header::HeaderMap {
    let mut headers = reqwest::header::HeaderMap::new();
    let context = tracing::Span::current().context();
    TraceContextPropagator::new().inject_context(
        &context,
        &mut opentelemetry_http::HeaderInjector(&mut headers),
    );
    headers
}

/// A request's headers as the propagator reads them.
struct RequestHeaders<'a>(&'a HeaderMap);

impl Extractor for RequestHeaders<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

/// The buyer a request was authenticated as, kept in its extensions for
/// its log line (`user_id`).
#[derive(Debug, Clone)]
pub struct Caller(pub String);

/// The order a request made or read, kept in its extensions for its log
/// line (`order_id`).
#[derive(Debug, Clone, Copy)]
pub struct OrderOf(pub Uuid);

/// The slug of a problem answer, kept in the response's extensions for the
/// request's log line and the request counter (`problem`). A slug of the
/// catalogue, so the counter's series stay bounded.
#[derive(Debug, Clone, Copy)]
pub struct ProblemSlug(pub &'static str);

/// Marks the order `req` made or read, for its log line.
pub fn note_order(req: &actix_web::HttpRequest, order_id: Uuid) {
    req.extensions_mut().insert(OrderOf(order_id));
}

/// Middleware: one span per request and one line when it ends. A sane
/// incoming `X-Request-Id` is kept, else one is made; either way it is
/// echoed. A valid `traceparent` makes the span its child.
pub async fn log_request(
    req: ServiceRequest,
    next: Next<impl MessageBody>,
) -> Result<ServiceResponse<impl MessageBody>, actix_web::Error> {
    let started = Instant::now();
    let request_id = req
        .headers()
        .get(&REQUEST_ID)
        .and_then(|v| v.to_str().ok())
        .filter(|v| !v.is_empty() && v.len() <= 64 && v.bytes().all(|c| c.is_ascii_graphic()))
        .map_or_else(|| Uuid::new_v4().to_string(), str::to_owned);
    let span = tracing::info_span!(
        "request",
        %request_id,
        trace_id = tracing::field::Empty,
        method = %req.method(),
        path = %req.path(),
        otel.name = %format_args!("{} {}", req.method(), req.path()),
    );
    let parent = TraceContextPropagator::new().extract(&RequestHeaders(req.headers()));
    // Without a tracing pipeline (a library use) the span has no context.
    let _ = span.set_parent(parent);
    let trace_id = span.context().span().span_context().trace_id();
    if trace_id != opentelemetry::trace::TraceId::INVALID {
        span.record("trace_id", tracing::field::display(trace_id));
    }
    let mut response = next.call(req).instrument(span.clone()).await?;
    let status = response.status().as_u16();
    let elapsed = started.elapsed().as_secs_f64();
    let latency_ms = elapsed * 1000.0;
    let route = response.request().match_pattern();
    let problem = response
        .response()
        .extensions()
        .get::<ProblemSlug>()
        .map(|p| p.0);
    let (user_id, order_id) = {
        let extensions = response.request().extensions();
        let user_id = extensions.get::<Caller>().map(|caller| caller.0.clone());
        (user_id, extensions.get::<OrderOf>().map(|order| order.0))
    };
    crate::observe::http_request(
        response.request().method().as_str(),
        route.as_deref().unwrap_or("unmatched"),
        status,
        problem.unwrap_or("none"),
        elapsed,
    );
    let user_id = user_id.as_deref();
    let order_id = order_id.map(tracing::field::display);
    span.in_scope(|| {
        if status >= 500 {
            tracing::warn!(
                status,
                latency_ms,
                user_id,
                order_id,
                problem,
                "request finished"
            );
        } else {
            tracing::info!(
                status,
                latency_ms,
                user_id,
                order_id,
                problem,
                "request finished"
            );
        }
    });
    if let Ok(value) = HeaderValue::from_str(&request_id) {
        response.headers_mut().insert(REQUEST_ID, value);
    }
    Ok(response)
}
