//! What the service counts, served at `/metrics` in Prometheus text format.
//! The `metrics` facade is process-wide, so the recorder is installed once
//! and shared by every instance in the process.
//!
//! A module that counts something declares its metric beside the code that
//! counts it: a [`Counter`], [`Gauge`] or [`Histogram`] with its name, help
//! and labels, each label an enum made by [`labels!`]. Whoever installs the
//! recorder hands it every such metric (`startup`), and each one's series
//! with known labels are registered then, at zero: alerts and `rate()` need a
//! series before its first event. The series registered and the series
//! counted come from the same declaration, so the two cannot drift apart.
//! A [`GaugeSet`] is the exception: its series (one per event on sale) are
//! replaced whole at each refresh, and rendered here.
//! This module names none of those modules; it counts only what has no
//! module of ours to own it: the engine's hooks, the HTTP requests (whose
//! labels are open-ended, routes times statuses, so they appear at first
//! use), the database pool, the build and the process (`process`).

mod process;

use std::fmt::Write as _;
use std::marker::PhantomData;
use std::sync::{Mutex, OnceLock};

use metrics::{counter, describe_counter, describe_gauge, describe_histogram, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

/// The values of one label: an enum with a variant per value, made by
/// [`labels!`].
pub trait Label: Copy + 'static {
    /// The label's name in a series.
    const NAME: &'static str;
    /// Every value, in declaration order.
    const ALL: &'static [Self];
    /// The value as the series shows it.
    fn as_str(self) -> &'static str;
}

/// Declares a [`Label`] enum, `#[label = "name"]` after its doc comment
/// and each variant written `Variant = "text"`: the values, the list of
/// them and the text of each are then one list, and cannot disagree.
macro_rules! labels {
    (
        $(#[doc = $doc:literal])*
        #[label = $name:literal]
        $vis:vis enum $label:ident {
            $($(#[doc = $variant_doc:literal])* $variant:ident = $value:literal),+ $(,)?
        }
    ) => {
        $(#[doc = $doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq)]
        $vis enum $label {
            $($(#[doc = $variant_doc])* $variant),+
        }

        impl $crate::observe::Label for $label {
            const NAME: &'static str = $name;
            const ALL: &'static [Self] = &[$(Self::$variant),+];

            fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $value),+
                }
            }
        }
    };
}
pub(crate) use labels;

/// The labels of one series: none (`()`), one [`Label`], or two.
pub trait Labels: Copy + 'static {
    /// Every combination of values: the series registered at zero.
    fn every() -> Vec<Self>;
    fn pairs(self) -> Vec<metrics::Label>;
}

impl Labels for () {
    fn every() -> Vec<Self> {
        vec![()]
    }

    fn pairs(self) -> Vec<metrics::Label> {
        Vec::new()
    }
}

impl<L: Label> Labels for L {
    fn every() -> Vec<Self> {
        L::ALL.to_vec()
    }

    fn pairs(self) -> Vec<metrics::Label> {
        vec![metrics::Label::from_static_parts(L::NAME, self.as_str())]
    }
}

impl<A: Label, B: Label> Labels for (A, B) {
    fn every() -> Vec<Self> {
        A::ALL
            .iter()
            .flat_map(|a| B::ALL.iter().map(move |b| (*a, *b)))
            .collect()
    }

    fn pairs(self) -> Vec<metrics::Label> {
        let (a, b) = self;
        [a.pairs(), b.pairs()].concat()
    }
}

/// A metric as the recorder learns of it: described, and each of its
/// series with known labels registered at zero (`increment(0)` makes a
/// series without changing it).
pub trait Metric: Sync {
    fn register(&self);

    /// What `/metrics` shows of it besides the recorder's text: only a
    /// [`GaugeSet`] has any.
    fn render(&self, _page: &mut String) {}
}

/// A counter whose series are one per combination of `L`'s values.
pub struct Counter<L = ()> {
    name: &'static str,
    help: &'static str,
    labels: PhantomData<fn() -> L>,
}

impl<L: Labels> Counter<L> {
    pub const fn new(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            help,
            labels: PhantomData,
        }
    }

    /// The series of these label values.
    pub fn of(&self, labels: L) -> metrics::Counter {
        counter!(self.name, labels.pairs())
    }
}

impl Counter {
    pub fn get(&self) -> metrics::Counter {
        self.of(())
    }
}

impl<L: Labels> Metric for Counter<L> {
    fn register(&self) {
        describe_counter!(self.name, self.help);
        for labels in L::every() {
            self.of(labels).increment(0);
        }
    }
}

/// A gauge whose series are one per combination of `L`'s values.
pub struct Gauge<L = ()> {
    name: &'static str,
    help: &'static str,
    labels: PhantomData<fn() -> L>,
}

impl<L: Labels> Gauge<L> {
    pub const fn new(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            help,
            labels: PhantomData,
        }
    }

    /// The series of these label values.
    pub fn of(&self, labels: L) -> metrics::Gauge {
        gauge!(self.name, labels.pairs())
    }
}

impl Gauge {
    pub fn get(&self) -> metrics::Gauge {
        self.of(())
    }
}

impl<L: Labels> Metric for Gauge<L> {
    fn register(&self) {
        describe_gauge!(self.name, self.help);
        for labels in L::every() {
            self.of(labels).increment(0.0);
        }
    }
}

/// A histogram without labels; a name that ends in `_seconds` gets the
/// latency buckets below.
pub struct Histogram {
    name: &'static str,
    help: &'static str,
}

impl Histogram {
    pub const fn new(name: &'static str, help: &'static str) -> Self {
        Self { name, help }
    }

    pub fn get(&self) -> metrics::Histogram {
        histogram!(self.name)
    }
}

impl Metric for Histogram {
    fn register(&self) {
        describe_histogram!(self.name, self.help);
        let _ = self.get();
    }
}

/// A gauge whose series are replaced together at each refresh: a series
/// left out of the last one is gone from the page. The recorder keeps
/// every series it was ever given, which would keep, say, every event
/// that was ever on sale; this one is rendered here from its last refresh,
/// and stays as bounded as what it is refreshed with.
pub struct GaugeSet {
    name: &'static str,
    help: &'static str,
    /// Each series' labels, as the page writes them, and its value.
    series: Mutex<Vec<(String, f64)>>,
}

impl GaugeSet {
    pub const fn new(name: &'static str, help: &'static str) -> Self {
        Self {
            name,
            help,
            series: Mutex::new(Vec::new()),
        }
    }

    /// Every series from now on: each one's labels (name, value) and value.
    pub fn replace<'a>(&self, series: impl IntoIterator<Item = (Vec<(&'a str, &'a str)>, f64)>) {
        let series = series
            .into_iter()
            .map(|(labels, value)| {
                let labels: Vec<String> = labels
                    .iter()
                    .map(|(name, value)| format!("{name}=\"{}\"", escaped(value)))
                    .collect();
                (labels.join(","), value)
            })
            .collect();
        if let Ok(mut current) = self.series.lock() {
            *current = series;
        }
    }
}

/// A label value as the text format writes it: `\`, `"` and line breaks escaped.
fn escaped(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

impl Metric for GaugeSet {
    fn register(&self) {}

    fn render(&self, page: &mut String) {
        let Ok(series) = self.series.lock() else {
            return;
        };
        if series.is_empty() {
            return;
        }
        let (name, help) = (self.name, self.help);
        let _ = write!(page, "# HELP {name} {help}\n# TYPE {name} gauge\n");
        for (labels, value) in series.iter() {
            let _ = writeln!(page, "{name}{{{labels}}} {value}");
        }
        page.push('\n');
    }
}

static HANDLE: OnceLock<PrometheusHandle> = OnceLock::new();
/// Every metric handed to [`install`], for what it renders itself.
static REPORTED: OnceLock<Vec<&'static dyn Metric>> = OnceLock::new();

/// Latency buckets, in seconds: 1 ms to 10 s. 2 s is the objective of
/// `POST /orders` (deploy/prometheus/alerts.yml), so it is a bucket.
const BUCKETS: [f64; 15] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 2.5, 5.0, 7.5, 10.0,
];

/// Installs the recorder (first call only) and registers this module's
/// metrics and `reported`, each module's, at zero.
pub fn install(reported: &[&'static [&'static dyn Metric]]) -> &'static PrometheusHandle {
    REPORTED.get_or_init(|| reported.iter().copied().flatten().copied().collect());
    HANDLE.get_or_init(|| {
        let builder = PrometheusBuilder::new();
        let builder = builder
            .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &BUCKETS)
            .unwrap_or_else(|_| PrometheusBuilder::new());
        let recorder = builder.build_recorder();
        let handle = recorder.handle();
        if metrics::set_global_recorder(recorder).is_ok() {
            describe_counter!(
                HTTP_REQUESTS,
                "HTTP requests by method, route, status and problem type"
            );
            describe_histogram!(
                HTTP_REQUEST_DURATION,
                "HTTP request latency by method and route"
            );
            for metric in OWN.iter().chain(reported.iter().copied().flatten()) {
                metric.register();
            }
            describe_gauge!(
                BUILD_INFO,
                "1, labelled with the version of the running build"
            );
            gauge!(BUILD_INFO, "version" => env!("CARGO_PKG_VERSION")).set(1.0);
            process::describe();
        }
        handle
    })
}

/// The current figures, as Prometheus text; empty before [`install`].
pub fn render() -> String {
    let mut page = HANDLE
        .get()
        .map(PrometheusHandle::render)
        .unwrap_or_default();
    for metric in REPORTED.get().into_iter().flatten() {
        metric.render(&mut page);
    }
    page
}

const BUILD_INFO: &str = "build_info";
const HTTP_REQUESTS: &str = "http_requests_total";
const HTTP_REQUEST_DURATION: &str = "http_request_duration_seconds";

/// One request: its method, route template, status, problem slug (`none`
/// for an answer that is not a problem) and latency.
pub fn http_request(method: &str, route: &str, status: u16, problem: &'static str, seconds: f64) {
    // Anyone can send a made-up method: only the standard ones get a label
    // of their own, so clients cannot grow the series without bound.
    let method = match method {
        "GET" | "HEAD" | "POST" | "PUT" | "DELETE" | "PATCH" | "OPTIONS" | "TRACE" | "CONNECT" => {
            method
        }
        _ => "other",
    };
    let (method, route) = (method.to_owned(), route.to_owned());
    counter!(HTTP_REQUESTS, "method" => method.clone(), "route" => route.clone(),
             "status" => status.to_string(), "problem" => problem)
    .increment(1);
    histogram!(HTTP_REQUEST_DURATION, "method" => method, "route" => route).record(seconds);
}

/// This module's metrics with known labels.
const OWN: &[&dyn Metric] = &[
    &IDEMPOTENCY_OUTCOMES,
    &IDEMPOTENCY_WAITS,
    &IDEMPOTENCY_WAIT_DURATION,
    &ANSWER_CACHE,
    &DB_POOL_CONNECTIONS,
];

// The engine's labels: its enums list their values, and name none.
impl Label for idempotency::Outcome {
    const NAME: &'static str = "outcome";
    const ALL: &'static [Self] = &idempotency::Outcome::ALL;

    fn as_str(self) -> &'static str {
        idempotency::Outcome::as_str(self)
    }
}

impl Label for idempotency::WaitOutcome {
    const NAME: &'static str = "outcome";
    const ALL: &'static [Self] = &idempotency::WaitOutcome::ALL;

    fn as_str(self) -> &'static str {
        idempotency::WaitOutcome::as_str(self)
    }
}

impl Label for idempotency::CacheEvent {
    const NAME: &'static str = "event";
    const ALL: &'static [Self] = &idempotency::CacheEvent::ALL;

    fn as_str(self) -> &'static str {
        idempotency::CacheEvent::as_str(self)
    }
}

const IDEMPOTENCY_OUTCOMES: Counter<idempotency::Outcome> = Counter::new(
    "idempotency_outcomes_total",
    "Keyed requests by what the key row decided (outcome)",
);
const IDEMPOTENCY_WAITS: Counter<idempotency::WaitOutcome> = Counter::new(
    "idempotency_waits_total",
    "Prefer: wait requests by how their wait ended (outcome)",
);
const IDEMPOTENCY_WAIT_DURATION: Histogram = Histogram::new(
    "idempotency_wait_duration_seconds",
    "How long Prefer: wait requests waited",
);
const ANSWER_CACHE: Counter<idempotency::CacheEvent> = Counter::new(
    "idempotency_answer_cache_total",
    "The answer cache's hits, misses, evictions and invalidations (event)",
);

/// The engine's outcome hook.
pub fn idempotency(outcome: idempotency::Outcome) {
    IDEMPOTENCY_OUTCOMES.of(outcome).increment(1);
}

/// The answer cache's hook: hits, misses, evictions, invalidations.
pub fn answer_cache_event(event: idempotency::CacheEvent) {
    ANSWER_CACHE.of(event).increment(1);
}

/// The engine's wait hook: how a `Prefer: wait` request's wait ended.
pub fn idempotency_wait(outcome: idempotency::WaitOutcome, waited: std::time::Duration) {
    IDEMPOTENCY_WAITS.of(outcome).increment(1);
    IDEMPOTENCY_WAIT_DURATION.get().record(waited.as_secs_f64());
}

labels! {
    /// The states `db_pool_connections` reports, each read from the pool's status.
    #[label = "state"]
    pub enum PoolState {
        /// The pool's size limit (`database.pool_size`).
        Max = "max",
        /// Connections open, in use or idle.
        Open = "open",
        Idle = "idle",
        /// Requests waiting for a connection.
        Waiting = "waiting",
    }
}

impl PoolState {
    fn of(self, status: &deadpool_postgres::Status) -> usize {
        match self {
            PoolState::Max => status.max_size,
            PoolState::Open => status.size,
            PoolState::Idle => status.available,
            PoolState::Waiting => status.waiting,
        }
    }
}

const DB_POOL_CONNECTIONS: Gauge<PoolState> = Gauge::new(
    "db_pool_connections",
    "Database pool connections by state, at scrape time",
);

/// The process's CPU time, memory, descriptors and threads, read now (at
/// scrape time).
pub fn process() {
    process::sample();
}

pub fn pool(status: deadpool_postgres::Status) {
    for state in PoolState::ALL {
        DB_POOL_CONNECTIONS.of(*state).set(state.of(&status) as f64);
    }
}
