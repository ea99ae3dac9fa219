//! What the service counts, served at `/metrics` in Prometheus text format.
//! The `metrics` facade is process-wide, so the recorder is installed once
//! and shared by every instance in the process. Metric names live here only;
//! each label's values are an enum next to the code that counts them.
//!
//! Every series whose labels are known in advance exists from the first
//! scrape, at zero: alerts and `rate()` need a series before its first event.
//! Each metric's handle is made by one function here, which both the
//! counting and the zero registration call, so the two cannot drift apart.
//! `http_requests_total` and `http_request_duration_seconds` have open-ended
//! labels (routes times statuses) and appear at first use.

use std::sync::OnceLock;

use metrics::{
    counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram, Counter,
    Gauge, Histogram,
};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::checkout::orders::EventResult;
use crate::jobs::{cleanup, reconcile};
use crate::payrail::{AttemptOutcome, EventKind};

const HTTP_REQUESTS: &str = "http_requests_total";
const HTTP_REQUEST_DURATION: &str = "http_request_duration_seconds";
const IDEMPOTENCY_OUTCOMES: &str = "idempotency_outcomes_total";
const IDEMPOTENCY_WAITS: &str = "idempotency_waits_total";
const ANSWER_CACHE: &str = "idempotency_answer_cache_total";
const IDEMPOTENCY_WAIT_DURATION: &str = "idempotency_wait_duration_seconds";
const PAYRAIL_ATTEMPTS: &str = "payrail_attempts_total";
const PAYRAIL_ATTEMPT_DURATION: &str = "payrail_attempt_duration_seconds";
const PAYRAIL_BREAKER_OPEN: &str = "payrail_breaker_open";
const PAYRAIL_BREAKER_REJECTIONS: &str = "payrail_breaker_rejections_total";
const PAYRAIL_EVENTS: &str = "payrail_events_total";
const PAYRAIL_EVENT_AGE: &str = "payrail_event_age_seconds";
const RECONCILE_RUNS: &str = "reconcile_runs_total";
const RECONCILE_ORDERS: &str = "reconcile_orders_total";
const ORDERS_PENDING: &str = "orders_pending";
const CLEANUP_RUNS: &str = "cleanup_runs_total";
const CLEANUP_ROWS_DELETED: &str = "cleanup_rows_deleted_total";
const DB_POOL_CONNECTIONS: &str = "db_pool_connections";
const AUTH_KEY_FETCHES: &str = "auth_key_fetches_total";
const AUTH_KEYS_STALE: &str = "auth_keys_stale";

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
            register_at_zero();
        }
        handle
    })
}

/// The current figures, as Prometheus text.
pub fn render() -> String {
    install().render()
}

fn describe() {
    describe_counter!(HTTP_REQUESTS, "HTTP requests by method, route and status");
    describe_histogram!(
        HTTP_REQUEST_DURATION,
        "HTTP request latency by method and route"
    );
    describe_counter!(
        IDEMPOTENCY_OUTCOMES,
        "Keyed requests by what the key row decided (outcome)"
    );
    describe_counter!(
        IDEMPOTENCY_WAITS,
        "Prefer: wait requests by how their wait ended (outcome)"
    );
    describe_counter!(
        ANSWER_CACHE,
        "The answer cache's hits, misses, evictions and invalidations (event)"
    );
    describe_histogram!(
        IDEMPOTENCY_WAIT_DURATION,
        "How long Prefer: wait requests waited"
    );
    describe_counter!(PAYRAIL_ATTEMPTS, "Payrail charge attempts by outcome");
    describe_histogram!(PAYRAIL_ATTEMPT_DURATION, "Payrail charge attempt latency");
    describe_gauge!(
        PAYRAIL_BREAKER_OPEN,
        "1 while the Payrail circuit breaker is open, else 0"
    );
    describe_counter!(
        PAYRAIL_BREAKER_REJECTIONS,
        "Charges refused by the open breaker"
    );
    describe_counter!(
        PAYRAIL_EVENTS,
        "Payrail events received, by type and result (bad_signature: refused, nothing written)"
    );
    describe_histogram!(
        PAYRAIL_EVENT_AGE,
        "Seconds from Payrail's decision (the event's created) to the event settling its order"
    );
    describe_counter!(
        RECONCILE_RUNS,
        "Reconciliation runs by result (failed: the run could not claim its batch)"
    );
    describe_counter!(
        RECONCILE_ORDERS,
        "Pending orders reconciliation tried, by result"
    );
    describe_gauge!(
        ORDERS_PENDING,
        "Orders in payment_pending at the last reconciliation run"
    );
    describe_counter!(CLEANUP_RUNS, "Expired-key cleanup runs by result");
    describe_counter!(CLEANUP_ROWS_DELETED, "Expired idempotency keys deleted");
    describe_gauge!(
        DB_POOL_CONNECTIONS,
        "Database pool connections by state, at scrape time"
    );
    describe_counter!(
        AUTH_KEY_FETCHES,
        "Fetches of the identity provider's key set, by result"
    );
    describe_gauge!(
        AUTH_KEYS_STALE,
        "1 while the last fetch of the identity provider's keys failed"
    );
}

/// Every series with known labels, at zero (`increment(0)` registers a
/// series without changing it).
fn register_at_zero() {
    for outcome in idempotency::Outcome::ALL {
        idempotency_outcomes(outcome).increment(0);
    }
    for outcome in idempotency::WaitOutcome::ALL {
        idempotency_waits(outcome).increment(0);
    }
    for event in idempotency::CacheEvent::ALL {
        answer_cache(event).increment(0);
    }
    let _ = idempotency_wait_duration();
    for outcome in AttemptOutcome::ALL {
        payrail_attempts(outcome).increment(0);
    }
    let _ = payrail_attempt_duration();
    payrail_breaker_open().increment(0.0);
    payrail_breaker_rejections().increment(0);
    for kind in EventKind::ALL {
        for result in EventResult::ALL {
            payrail_events(kind, result).increment(0);
        }
    }
    let _ = payrail_event_age();
    for result in reconcile::RunResult::ALL {
        reconcile_runs(result).increment(0);
    }
    for result in reconcile::OrderResult::ALL {
        reconcile_orders(result).increment(0);
    }
    orders_pending_gauge().increment(0.0);
    for result in cleanup::RunResult::ALL {
        cleanup_runs(result).increment(0);
    }
    cleanup_rows_deleted().increment(0);
    for state in PoolState::ALL {
        db_pool_connections(state).increment(0.0);
    }
    for ok in [true, false] {
        auth_key_fetches(ok).increment(0);
    }
    auth_keys_stale().increment(0.0);
}

fn idempotency_outcomes(outcome: idempotency::Outcome) -> Counter {
    counter!(IDEMPOTENCY_OUTCOMES, "outcome" => outcome.as_str())
}

fn answer_cache(event: idempotency::CacheEvent) -> Counter {
    counter!(ANSWER_CACHE, "event" => event.as_str())
}

fn idempotency_waits(outcome: idempotency::WaitOutcome) -> Counter {
    counter!(IDEMPOTENCY_WAITS, "outcome" => outcome.as_str())
}

fn idempotency_wait_duration() -> Histogram {
    histogram!(IDEMPOTENCY_WAIT_DURATION)
}

fn payrail_attempts(outcome: AttemptOutcome) -> Counter {
    counter!(PAYRAIL_ATTEMPTS, "outcome" => outcome.as_str())
}

fn payrail_attempt_duration() -> Histogram {
    histogram!(PAYRAIL_ATTEMPT_DURATION)
}

fn payrail_breaker_open() -> Gauge {
    gauge!(PAYRAIL_BREAKER_OPEN)
}

fn payrail_breaker_rejections() -> Counter {
    counter!(PAYRAIL_BREAKER_REJECTIONS)
}

fn payrail_events(kind: EventKind, result: EventResult) -> Counter {
    counter!(PAYRAIL_EVENTS, "type" => kind.as_str(), "result" => result.as_str())
}

fn payrail_event_age() -> Histogram {
    histogram!(PAYRAIL_EVENT_AGE)
}

fn reconcile_runs(result: reconcile::RunResult) -> Counter {
    counter!(RECONCILE_RUNS, "result" => result.as_str())
}

fn reconcile_orders(result: reconcile::OrderResult) -> Counter {
    counter!(RECONCILE_ORDERS, "result" => result.as_str())
}

fn orders_pending_gauge() -> Gauge {
    gauge!(ORDERS_PENDING)
}

fn cleanup_runs(result: cleanup::RunResult) -> Counter {
    counter!(CLEANUP_RUNS, "result" => result.as_str())
}

fn cleanup_rows_deleted() -> Counter {
    counter!(CLEANUP_ROWS_DELETED)
}

fn auth_key_fetches(ok: bool) -> Counter {
    counter!(AUTH_KEY_FETCHES, "result" => if ok { "ok" } else { "failed" })
}

fn auth_keys_stale() -> Gauge {
    gauge!(AUTH_KEYS_STALE)
}

/// A fetch of the identity provider's key set ended; a failed one makes
/// the keys in use stale until the next good one.
pub fn auth_keys_fetched(ok: bool) {
    auth_key_fetches(ok).increment(1);
    auth_keys_stale().set(if ok { 0.0 } else { 1.0 });
}

fn db_pool_connections(state: PoolState) -> Gauge {
    gauge!(DB_POOL_CONNECTIONS, "state" => state.as_str())
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
    counter!(HTTP_REQUESTS, "method" => method.clone(), "route" => route.clone(), "status" => status.to_string())
        .increment(1);
    histogram!(HTTP_REQUEST_DURATION, "method" => method, "route" => route).record(seconds);
}

/// The engine's outcome hook.
pub fn idempotency(outcome: idempotency::Outcome) {
    idempotency_outcomes(outcome).increment(1);
}

/// The answer cache's hook: hits, misses, evictions, invalidations.
pub fn answer_cache_event(event: idempotency::CacheEvent) {
    answer_cache(event).increment(1);
}

/// The engine's wait hook: how a `Prefer: wait` request's wait ended.
pub fn idempotency_wait(outcome: idempotency::WaitOutcome, waited: std::time::Duration) {
    idempotency_waits(outcome).increment(1);
    idempotency_wait_duration().record(waited.as_secs_f64());
}

pub fn payrail_attempt(outcome: AttemptOutcome, seconds: f64) {
    payrail_attempts(outcome).increment(1);
    payrail_attempt_duration().record(seconds);
}

pub fn breaker_open(open: bool) {
    payrail_breaker_open().set(if open { 1.0 } else { 0.0 });
}

pub fn breaker_rejected() {
    payrail_breaker_rejections().increment(1);
}

pub fn reconcile_run(result: reconcile::RunResult, orders: &[reconcile::OrderResult]) {
    reconcile_runs(result).increment(1);
    for order in orders {
        reconcile_orders(*order).increment(1);
    }
}

pub fn payrail_event(kind: EventKind, result: EventResult) {
    payrail_events(kind, result).increment(1);
}

/// How long after Payrail decided an applied event took effect.
pub fn payrail_event_applied_age(secs: f64) {
    payrail_event_age().record(secs.max(0.0));
}

pub fn orders_pending(count: i64) {
    orders_pending_gauge().set(count as f64);
}

pub fn cleanup_run(result: cleanup::RunResult, rows: u64) {
    cleanup_runs(result).increment(1);
    cleanup_rows_deleted().increment(rows);
}

/// The states `db_pool_connections` reports, each read from the pool's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolState {
    /// The pool's size limit (`database.pool_size`).
    Max,
    /// Connections open, in use or idle.
    Open,
    Idle,
    /// Requests waiting for a connection.
    Waiting,
}

impl PoolState {
    pub const ALL: [PoolState; 4] = [
        PoolState::Max,
        PoolState::Open,
        PoolState::Idle,
        PoolState::Waiting,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PoolState::Max => "max",
            PoolState::Open => "open",
            PoolState::Idle => "idle",
            PoolState::Waiting => "waiting",
        }
    }

    fn of(self, status: &deadpool_postgres::Status) -> usize {
        match self {
            PoolState::Max => status.max_size,
            PoolState::Open => status.size,
            PoolState::Idle => status.available,
            PoolState::Waiting => status.waiting,
        }
    }
}

pub fn pool(status: deadpool_postgres::Status) {
    for state in PoolState::ALL {
        db_pool_connections(state).set(state.of(&status) as f64);
    }
}
