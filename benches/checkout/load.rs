//! The load generator: a closed loop at a fixed concurrency, an open loop at
//! a fixed arrival rate, and a probe that times `pool.get()`. Latencies go
//! into HDR histograms in microseconds (1 µs to 60 s, 3 significant digits).

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hdrhistogram::Histogram;
use test_support::Rng;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cpu;

/// What one unit of work (a request, or a storm of them) came to.
pub enum Sent {
    /// `n` requests answered as expected.
    Ok(u64),
    /// An unexpected status (counted by status, not in the throughput).
    Status(u16),
    /// No answer: connection error or client timeout.
    Failed,
    /// The fixtures ran out (no more holds): the worker stops.
    Exhausted,
}

pub fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram bounds")
}

/// The figures of one run, over its measured window.
pub struct Stats {
    /// Requests answered as expected within the window.
    pub ok: u64,
    /// Units completed within the window (requests, or storms).
    pub units: u64,
    /// Requests answered as expected over the whole run, warm-up included.
    pub ok_total: u64,
    pub statuses: BTreeMap<u16, u64>,
    pub failed: u64,
    pub exhausted: bool,
    pub secs: f64,
    pub hist: Histogram<u64>,
    /// CPU spent over the measured window (closed loops only).
    pub cpu: cpu::Usage,
}

impl Stats {
    pub fn rps(&self) -> f64 {
        self.ok as f64 / self.secs.max(1e-9)
    }

    pub fn p50_ms(&self) -> f64 {
        self.hist.value_at_quantile(0.50) as f64 / 1000.0
    }

    pub fn p99_ms(&self) -> f64 {
        self.hist.value_at_quantile(0.99) as f64 / 1000.0
    }

    pub fn errors(&self) -> u64 {
        self.failed + self.statuses.values().sum::<u64>()
    }

    /// "1234 rps, p50 3.1 ms, p99 9.8 ms" and any errors.
    pub fn summary(&self) -> String {
        let mut line = format!(
            "{:.0} rps, p50 {:.1} ms, p99 {:.1} ms ({} ok in {:.1} s)",
            self.rps(),
            self.p50_ms(),
            self.p99_ms(),
            self.ok,
            self.secs
        );
        if self.errors() > 0 {
            line.push_str(&format!(
                "; unexpected: {:?}, no answer: {}",
                self.statuses, self.failed
            ));
        }
        if self.exhausted {
            line.push_str("; fixtures ran out before the end");
        }
        line
    }
}

impl Stats {
    /// "CPU per request: service 41 µs, PostgreSQL 38 µs, load generator 40 µs".
    pub fn cpu_summary(&self) -> String {
        let (server, postgres, load) = self.cpu.per_request_us(self.ok);
        format!(
            "CPU per request: service {server:.0} µs, PostgreSQL {postgres:.0} µs, \
             load generator {load:.0} µs"
        )
    }

    /// The same, for the JSON details.
    pub fn cpu_json(&self) -> serde_json::Value {
        let (server, postgres, load) = self.cpu.per_request_us(self.ok);
        serde_json::json!({ "service_us": server, "postgres_us": postgres, "load_us": load })
    }
}

impl Stats {
    /// Adds another run of the same kind (one side of an ABBA comparison).
    pub fn absorb(&mut self, other: Stats) {
        self.ok += other.ok;
        self.units += other.units;
        self.ok_total += other.ok_total;
        for (status, n) in other.statuses {
            *self.statuses.entry(status).or_default() += n;
        }
        self.failed += other.failed;
        self.exhausted |= other.exhausted;
        self.secs += other.secs;
        self.hist.add(&other.hist).expect("same bounds");
        self.cpu += other.cpu;
    }
}

/// Two kinds of load compared on a shared, noisy machine: segments in the
/// order A B B A A B …, so that a drift in what else the machine does falls
/// on both sides alike. Each side's figures are over all its segments.
pub async fn abba<A, FA, B, FB>(
    pairs: usize,
    concurrency: usize,
    warmup: Duration,
    segment: Duration,
    a: A,
    b: B,
) -> (Stats, Stats)
where
    A: Fn() -> FA + Clone + Send + Sync + 'static,
    FA: Future<Output = Sent> + Send + 'static,
    B: Fn() -> FB + Clone + Send + Sync + 'static,
    FB: Future<Output = Sent> + Send + 'static,
{
    let (mut side_a, mut side_b): (Option<Stats>, Option<Stats>) = (None, None);
    for pair in 0..pairs.max(1) {
        let a_first = pair % 2 == 0;
        for is_a in [a_first, !a_first] {
            let stats = if is_a {
                closed(concurrency, warmup, segment, a.clone()).await
            } else {
                closed(concurrency, warmup, segment, b.clone()).await
            };
            let side = if is_a { &mut side_a } else { &mut side_b };
            match side {
                Some(side) => side.absorb(stats),
                None => *side = Some(stats),
            }
        }
    }
    (
        side_a.expect("at least one pair"),
        side_b.expect("at least one pair"),
    )
}

#[derive(Default)]
struct Shared {
    ok: AtomicU64,
    units: AtomicU64,
    ok_total: AtomicU64,
    failed: AtomicU64,
    statuses: Mutex<BTreeMap<u16, u64>>,
    exhausted_at: Mutex<Option<Instant>>,
    hist: Mutex<Option<Histogram<u64>>>,
}

impl Shared {
    fn merge(&self, hist: &Histogram<u64>) {
        let mut merged = self.hist.lock().unwrap_or_else(|p| p.into_inner());
        match merged.as_mut() {
            Some(merged) => merged.add(hist).expect("same bounds"),
            None => *merged = Some(hist.clone()),
        }
    }

    fn count(&self, sent: Sent, in_window: bool, at: Instant) -> bool {
        match sent {
            Sent::Ok(n) => {
                self.ok_total.fetch_add(n, Ordering::Relaxed);
                if in_window {
                    self.ok.fetch_add(n, Ordering::Relaxed);
                    self.units.fetch_add(1, Ordering::Relaxed);
                }
            }
            Sent::Status(status) => {
                *self
                    .statuses
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .entry(status)
                    .or_default() += 1;
            }
            Sent::Failed => {
                self.failed.fetch_add(1, Ordering::Relaxed);
            }
            Sent::Exhausted => {
                let mut at_ = self.exhausted_at.lock().unwrap_or_else(|p| p.into_inner());
                at_.get_or_insert(at);
                return false;
            }
        }
        true
    }

    fn stats(&self, from: Instant, end: Instant) -> Stats {
        let exhausted_at = *self.exhausted_at.lock().unwrap_or_else(|p| p.into_inner());
        let until = exhausted_at.map_or(end, |at| at.min(end)).max(from);
        Stats {
            ok: self.ok.load(Ordering::Relaxed),
            units: self.units.load(Ordering::Relaxed),
            ok_total: self.ok_total.load(Ordering::Relaxed),
            statuses: self
                .statuses
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .clone(),
            failed: self.failed.load(Ordering::Relaxed),
            exhausted: exhausted_at.is_some(),
            secs: (until - from).as_secs_f64(),
            hist: self
                .hist
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take()
                .unwrap_or_else(histogram),
            cpu: cpu::Usage::default(),
        }
    }
}

/// `concurrency` workers, each sending its next unit as soon as the last one
/// is answered, for `warmup` (not measured) and then `measure`. A unit counts
/// when it completes inside the measured window; in-flight units are awaited
/// at the end but not counted.
pub async fn closed<F, Fut>(
    concurrency: usize,
    warmup: Duration,
    measure: Duration,
    send: F,
) -> Stats
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Sent> + Send + 'static,
{
    let send = Arc::new(send);
    let shared = Arc::new(Shared::default());
    let from = Instant::now() + warmup;
    let end = from + measure;
    let window = tokio::spawn(async move {
        tokio::time::sleep_until(from).await;
        let start = cpu::Usage::now();
        tokio::time::sleep_until(end).await;
        cpu::Usage::now() - start
    });
    let workers: Vec<_> = (0..concurrency)
        .map(|_| {
            let (send, shared) = (send.clone(), shared.clone());
            tokio::spawn(async move {
                let mut hist = histogram();
                loop {
                    let started = Instant::now();
                    if started >= end {
                        break;
                    }
                    let sent = send().await;
                    let done = Instant::now();
                    let in_window = done >= from && done <= end;
                    let ok = matches!(sent, Sent::Ok(_));
                    if !shared.count(sent, in_window, done) {
                        break;
                    }
                    if ok && in_window {
                        let micros = (done - started).as_micros().max(1) as u64;
                        hist.saturating_record(micros);
                    }
                }
                shared.merge(&hist);
            })
        })
        .collect();
    for worker in workers {
        worker.await.expect("a load worker");
    }
    let mut stats = shared.stats(from, end);
    stats.cpu = window.await.expect("the CPU probe");
    stats
}

/// Units started at a fixed `rate` per second until `stop` is cancelled (and
/// at least `min` has passed), each timed from when it was due, not from
/// when it went out, so a stalled server shows in the latencies instead of
/// slowing the clock (no coordinated omission). At most `max_in_flight` at
/// once; units due beyond that are counted as failed.
pub async fn open<F, Fut>(
    rate: f64,
    min: Duration,
    max: Duration,
    stop: CancellationToken,
    max_in_flight: u64,
    send: F,
) -> Stats
where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Sent> + Send + 'static,
{
    let send = Arc::new(send);
    let shared = Arc::new(Shared::default());
    let in_flight = Arc::new(AtomicU64::new(0));
    let hist = Arc::new(Mutex::new(histogram()));
    let start = Instant::now();
    let interval = Duration::from_secs_f64(1.0 / rate);
    let done_flag = Arc::new(AtomicBool::new(false));
    let mut tasks = tokio::task::JoinSet::new();
    let mut k: u32 = 0;
    loop {
        let due = start + interval * k;
        k += 1;
        let elapsed = due - start;
        if elapsed >= max || (elapsed >= min && stop.is_cancelled()) {
            break;
        }
        tokio::time::sleep_until(due).await;
        if done_flag.load(Ordering::Relaxed) {
            break;
        }
        if in_flight.load(Ordering::Relaxed) >= max_in_flight {
            shared.failed.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        in_flight.fetch_add(1, Ordering::Relaxed);
        let (send, shared, hist, in_flight, done_flag) = (
            send.clone(),
            shared.clone(),
            hist.clone(),
            in_flight.clone(),
            done_flag.clone(),
        );
        tasks.spawn(async move {
            let sent = send().await;
            let now = Instant::now();
            let ok = matches!(sent, Sent::Ok(_));
            if !shared.count(sent, true, now) {
                done_flag.store(true, Ordering::Relaxed);
            }
            if ok {
                let micros = (now - due).as_micros().max(1) as u64;
                hist.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .saturating_record(micros);
            }
            in_flight.fetch_sub(1, Ordering::Relaxed);
        });
        while tasks.try_join_next().is_some() {}
    }
    let end = Instant::now();
    while tasks.join_next().await.is_some() {}
    shared.merge(&hist.lock().unwrap_or_else(|p| p.into_inner()));
    shared.stats(start, end)
}

/// Times `pool.get()` at random moments (every 1-3 ms) until cancelled: the
/// wait a request arriving then would have had for a connection (the pool's
/// queue is fair, so the probe waits its turn like a request). The
/// connection goes straight back.
pub async fn pool_probe(pool: deadpool_postgres::Pool, stop: CancellationToken) -> Histogram<u64> {
    let mut hist = histogram();
    let mut rng = Rng::from_seed(0x9E37_79B9_7F4A_7C15);
    while !stop.is_cancelled() {
        tokio::time::sleep(Duration::from_micros(1_000 + rng.below(2_000))).await;
        let started = Instant::now();
        match pool.get().await {
            Ok(client) => {
                hist.saturating_record(started.elapsed().as_micros().max(1) as u64);
                drop(client);
            }
            Err(_) => hist.saturating_record(started.elapsed().as_micros().max(1) as u64),
        }
    }
    hist
}
