//! What the service counts, served at `/metrics` in Prometheus text format.
//! The `metrics` facade is process-wide, so the recorder is installed once
//! and shared by every instance in the process. Metric names live here only.

use std::sync::OnceLock;

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();

/// Latency buckets, in seconds: 1 ms to 10 s.
const BUCKETS: [f64; 14] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 7.5, 10.0,
];

/// Installs the recorder (first call only) and returns its handle.
pub fn install() -> &'static PrometheusHandle {
    HANDLE.get_or_init(|| {
        let builder = PrometheusBuilder::new();
        let builder = builder
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &BUCKETS)
            .unwrap_or_else(|_| PrometheusBuilder::new());
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        if metrics::set_global_recorder(recorder).is_ok() {
            describe();
        }
        handle
    })
}

/// The current figures, as Prometheus text.
pub fn render() -> String {
    install().render()
}

fn describe() {
    describe_counter!(
        "http_requests_total",
        "HTTP requests by method, route and status"
    );
    describe_histogram!(
        "http_request_duration_seconds",
        "HTTP request latency by method and route"
    );
    describe_counter!(
        "idempotency_outcomes_total",
        "What the key row decided: first, replay, in_progress, key_reused, expired_takeover, lease_takeover"
    );
    describe_counter!(
        "idempotency_waits_total",
        "How Prefer: wait requests ended: answered, timed_out, took_over"
    );
    describe_histogram!(
        "idempotency_wait_duration_seconds",
        "How long Prefer: wait requests waited"
    );
    describe_counter!(
        "payrail_attempts_total",
        "Payrail charge attempts by outcome"
    );
    describe_histogram!(
        "payrail_attempt_duration_seconds",
        "Payrail charge attempt latency"
    );
    describe_gauge!(
        "payrail_breaker_open",
        "1 while the Payrail circuit breaker is open"
    );
    describe_counter!(
        "payrail_breaker_rejections_total",
        "Charges refused by the open breaker"
    );
    describe_counter!("reconcile_runs_total", "Reconciliation runs");
    describe_counter!(
        "reconcile_orders_total",
        "Pending orders reconciliation tried, by result"
    );
    describe_gauge!(
        "orders_pending",
        "Orders in payment_pending at the last reconciliation run"
    );
    describe_counter!("cleanup_runs_total", "Expired-key cleanup runs by result");
    describe_counter!(
        "cleanup_rows_deleted_total",
        "Expired idempotency keys deleted"
    );
    describe_gauge!("db_pool_connections", "Database pool connections by state");
}

pub fn http_request(method: &str, route: &str, status: u16, seconds: f64) {
    // Anyone can send a made-up method: only the standard ones get a label
    // of their own, so clients cannot grow the series without bound.
    let method = match method {
        "GET" | "HEAD" | "POST" | "PUT" | "DELETE" | "PATCH" | "OPTIONS" | "TRACE" | "CONNECT" => {
            method
        }
        _ => "other",
    };
    let (method, route) = (method.to_owned(), route.to_owned());
    counter!("http_requests_total", "method" => method.clone(), "route" => route.clone(), "status" => status.to_string())
        .increment(1);
    histogram!("http_request_duration_seconds", "method" => method, "route" => route)
        .record(seconds);
}

/// The engine's outcome hook.
pub fn idempotency(outcome: idempotency::Outcome) {
    counter!("idempotency_outcomes_total", "outcome" => outcome.as_str()).increment(1);
}

/// The engine's wait hook: how a `Prefer: wait` request's wait ended.
pub fn idempotency_wait(outcome: idempotency::WaitOutcome, waited: std::time::Duration) {
    counter!("idempotency_waits_total", "outcome" => outcome.as_str()).increment(1);
    histogram!("idempotency_wait_duration_seconds").record(waited.as_secs_f64());
}

pub fn payrail_attempt(outcome: &'static str, seconds: f64) {
    counter!("payrail_attempts_total", "outcome" => outcome).increment(1);
    histogram!("payrail_attempt_duration_seconds").record(seconds);
}

pub fn breaker_open(open: bool) {
    gauge!("payrail_breaker_open").set(if open { 1.0 } else { 0.0 });
}

pub fn breaker_rejected() {
    counter!("payrail_breaker_rejections_total").increment(1);
}

pub fn reconcile_run(settled: usize, failed: usize) {
    counter!("reconcile_runs_total").increment(1);
    counter!("reconcile_orders_total", "result" => "settled").increment(settled as u64);
    counter!("reconcile_orders_total", "result" => "failed").increment(failed as u64);
}

pub fn orders_pending(count: i64) {
    gauge!("orders_pending").set(count as f64);
}

pub fn cleanup_run(result: &'static str, rows: u64) {
    counter!("cleanup_runs_total", "result" => result).increment(1);
    counter!("cleanup_rows_deleted_total").increment(rows);
}

pub fn pool(status: deadpool_postgres::Status) {
    gauge!("db_pool_connections", "state" => "max").set(status.max_size as f64);
    gauge!("db_pool_connections", "state" => "open").set(status.size as f64);
    gauge!("db_pool_connections", "state" => "idle").set(status.available as f64);
    gauge!("db_pool_connections", "state" => "waiting").set(status.waiting as f64);
}
