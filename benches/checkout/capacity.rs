//! Capacity: duplicate storms (both lock modes), the search for the
//! concurrency that Payrail's latency calls for, the Redis mode's first
//! clicks, and the memory of the service as a process of its own.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::future::join_all;
use hdrhistogram::Histogram;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use serde_json::json;
use stagedoor_checkout::config::LockMode;
use test_support::sandbox;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::fixtures::{self, order_body};
use crate::load::{self, Sent, Stats};
use crate::scenarios::{first_clicks, holds_for, order_rate, run_secs, seen, CONCURRENCY};
use crate::servers::{self, RunningApp};
use crate::{postgres, Bench};

/// Copies of one click in a storm.
const COPIES: usize = 8;

/// The `Prefer: wait` of a waiting storm's copies, in seconds.
const WAIT_SECS: u64 = 10;

/// Storms: 8 concurrent copies of each click, 8 clicks at a time. Every
/// storm must end with one first 201 and only replays or 409s besides; the
/// sandbox ledger must show at most one charge per click. With `wait`, every
/// copy sends `Prefer: wait` (the `wait_storm`): the copies that would have
/// been told 409 (and had to come back) wait for the answer instead.
pub async fn storm(bench: &mut Bench, url: &str, suffix: &str, wait: bool) {
    let name = if wait { "wait_storm" } else { "storm" };
    println!(
        "\n== {name}{suffix}: {COPIES} concurrent copies per click{}, {} clicks at a time",
        if wait { ", each with Prefer: wait" } else { "" },
        CONCURRENCY / COPIES
    );
    clear_ledger(bench).await;
    let holds = holds_for(bench, order_rate(bench) / 2.0, run_secs(bench)).await;
    let http = fixtures::client(CONCURRENCY);
    let (url, buyers, holds2) = (format!("{url}/orders"), bench.buyers.clone(), holds.clone());
    // Copies answered 409 (no answer yet: each must be sent again), of all
    // copies sent (warm-up included: a share, not a rate).
    let tally = std::sync::Arc::new([AtomicU64::new(0), AtomicU64::new(0)]);
    let tally2 = tally.clone();
    let stats = load::closed(
        CONCURRENCY / COPIES,
        bench.profile.warmup,
        bench.profile.measure,
        move || {
            let (http, url, buyers, holds, tally) = (
                http.clone(),
                url.clone(),
                buyers.clone(),
                holds2.clone(),
                tally2.clone(),
            );
            async move {
                let Some((buyer, hold)) = holds.take() else {
                    return Sent::Exhausted;
                };
                let key = Uuid::new_v4().to_string();
                let body = order_body(hold);
                let copies = (0..COPIES).map(|_| {
                    let copy = http
                        .post(&url)
                        .header(AUTHORIZATION, buyers.auth[buyer].clone())
                        .header("Idempotency-Key", &key)
                        .header(CONTENT_TYPE, "application/json");
                    let copy = if wait {
                        copy.header("Prefer", format!("wait={WAIT_SECS}"))
                    } else {
                        copy
                    };
                    copy.body(body.clone()).send()
                });
                let mut first = 0;
                for sent in join_all(copies).await {
                    tally[0].fetch_add(1, Ordering::Relaxed);
                    let Some(seen) = seen(sent).await else {
                        return Sent::Failed;
                    };
                    match (seen.status, seen.replayed) {
                        (201, false) => first += 1,
                        (201, true) => {}
                        (409, _) => {
                            tally[1].fetch_add(1, Ordering::Relaxed);
                        }
                        (other, _) => return Sent::Status(other),
                    }
                }
                match first {
                    1 => Sent::Ok(COPIES as u64),
                    // Pseudo status: a click answered as first more than once.
                    _ => Sent::Status(2),
                }
            }
        },
    )
    .await;
    println!("  {} (one unit = one storm of {COPIES})", stats.summary());
    println!("  {}", stats.cpu_summary());
    let copies = tally[0].load(Ordering::Relaxed).max(1) as f64;
    let answered = 1.0 - tally[1].load(Ordering::Relaxed) as f64 / copies;
    println!(
        "  requests per click: {COPIES}; copies answered (not 409): {:.1} %",
        answered * 100.0
    );
    let (charges, doubles, orphans) = double_charges(bench).await;
    println!(
        "  ledger: {charges} charges for {} clicks; clicks charged twice or more: {doubles}; charges without an order: {orphans}",
        holds.used()
    );
    bench
        .report
        .set(&format!("{name}_rps{suffix}"), stats.rps());
    bench.report.set(
        &format!("{name}_clicks_per_s{suffix}"),
        stats.units as f64 / stats.secs,
    );
    bench
        .report
        .set(&format!("{name}_p99_ms{suffix}"), stats.p99_ms());
    bench
        .report
        .set(&format!("{name}_answered_share{suffix}"), answered);
    bench.report.set(
        &format!("{name}_double_charges{suffix}"),
        (doubles + orphans) as f64,
    );
    bench.report.detail(
        &format!("{name}{suffix}"),
        json!({
            "requests_per_click": COPIES,
            "storms_per_s": stats.units as f64 / stats.secs,
            "storm_p99_ms": stats.p99_ms(),
            "unexpected": format!("{:?}", stats.statuses),
            "no_answer": stats.failed,
            "charges": charges,
            "cpu": stats.cpu_json(),
        }),
    );
}

pub async fn clear_ledger(bench: &Bench) {
    sandbox::clear_ledger(&bench.http, &bench.sandbox_url).await;
}

/// (charges, clicks with more than one succeeded charge, succeeded charges
/// whose order is unknown), from the sandbox ledger and the orders table.
pub async fn double_charges(bench: &Bench) -> (usize, usize, usize) {
    let ledger = sandbox::ledger(&bench.http, &bench.sandbox_url).await;
    let references: Vec<Uuid> = ledger
        .iter()
        .filter(|c| c["status"] == "succeeded")
        .filter_map(|c| {
            c["reference"]
                .as_str()
                .and_then(|r| Uuid::parse_str(r).ok())
        })
        .collect();
    let client = postgres::connect(&bench.pg.bench_url()).await;
    let rows = client
        .query(
            "SELECT order_id, user_id, idempotency_key FROM orders WHERE order_id = ANY($1)",
            &[&references],
        )
        .await
        .expect("orders of the ledger");
    let mut per_click: HashMap<(String, String), usize> = HashMap::new();
    for row in &rows {
        *per_click.entry((row.get(1), row.get(2))).or_default() += 1;
    }
    let doubles = per_click.values().filter(|n| **n > 1).count();
    (ledger.len(), doubles, references.len() - rows.len())
}

/// Sandbox latency 400 ms; concurrency raised step by step until throughput
/// stops growing (less than 5 % more). A probe times `pool.get()` on the
/// instance's own pool throughout.
pub async fn payrail(bench: &mut Bench, app: &RunningApp) {
    println!(
        "\n== payrail: sandbox latency 400 ms, concurrency raised until throughput stops growing"
    );
    bench.set_latency(400).await;
    let steps = [128usize, 256, 512, 768, 1024, 1536, 2048, 3072];
    let mut best: Option<(usize, Stats, f64)> = None;
    let mut table = Vec::new();
    let warmup = Duration::from_secs(2);
    for concurrency in steps {
        let (stats, pool_wait) = probed_step(bench, app, concurrency, warmup).await;
        let wait_p99 = pool_wait.value_at_quantile(0.99) as f64 / 1000.0;
        println!(
            "  {concurrency:>5} concurrent: {}; pool wait p99 {wait_p99:.2} ms, max {:.1} ms",
            stats.summary(),
            pool_wait.max() as f64 / 1000.0
        );
        table.push(json!({
            "concurrency": concurrency, "rps": stats.rps(), "p50_ms": stats.p50_ms(),
            "p99_ms": stats.p99_ms(), "pool_wait_p99_ms": wait_p99,
            "pool_wait_max_ms": pool_wait.max() as f64 / 1000.0, "errors": stats.errors(),
        }));
        let grew = best
            .as_ref()
            .is_none_or(|(_, b, _)| stats.rps() > b.rps() * 1.05);
        if grew {
            best = Some((concurrency, stats, wait_p99));
        } else {
            break;
        }
    }
    // The same step with four times the pool: if throughput does not follow,
    // the pool is not what bounds it.
    if let Some((concurrency, _, _)) = &best {
        let concurrency = *concurrency;
        let mut settings = bench.settings(LockMode::Table);
        settings.database.pool_size = 64;
        let big = RunningApp::start(settings).await;
        let (stats, pool_wait) = probed_step(bench, &big, concurrency, warmup).await;
        let wait_p99 = pool_wait.value_at_quantile(0.99) as f64 / 1000.0;
        big.stop().await;
        println!(
            "  {concurrency:>5} concurrent, pool of 64: {}; pool wait p99 {wait_p99:.2} ms",
            stats.summary()
        );
        bench.report.set("payrail_400ms_rps_pool64", stats.rps());
        bench
            .report
            .set("payrail_400ms_p99_ms_pool64", stats.p99_ms());
        bench.report.set("pool_wait_p99_ms_pool64", wait_p99);
    }
    bench.set_latency(0).await;
    if let Some((concurrency, stats, wait_p99)) = best {
        bench.report.set("payrail_400ms_rps", stats.rps());
        bench.report.set("payrail_400ms_p99_ms", stats.p99_ms());
        bench
            .report
            .set("payrail_400ms_concurrency", concurrency as f64);
        bench.report.set("pool_wait_p99_ms", wait_p99);
    }
    bench.report.detail("payrail_400ms_steps", json!(table));
    clear_ledger(bench).await;
}

/// One step of the search: first clicks at `concurrency` (enough fresh
/// holds for them, a Payrail latency of 400 ms), and the pool-wait probe's
/// histogram on the instance's own pool over the same time.
async fn probed_step(
    bench: &Bench,
    app: &RunningApp,
    concurrency: usize,
    warmup: Duration,
) -> (Stats, Histogram<u64>) {
    let secs = (warmup + bench.profile.step).as_secs_f64();
    let holds = holds_for(bench, concurrency as f64 / 0.4, secs).await;
    let stop = CancellationToken::new();
    let probe = tokio::spawn(load::pool_probe(app.pool.clone(), stop.clone()));
    let stats = first_clicks(
        bench,
        &app.url,
        holds,
        concurrency,
        warmup,
        bench.profile.step,
    )
    .await;
    stop.cancel();
    (stats, probe.await.expect("probe"))
}

/// First clicks and storms with `idempotency.lock = redis`, beside the
/// table mode measured before.
pub async fn redis(bench: &mut Bench) {
    println!("\n== redis: idempotency.lock = redis (127.0.0.1:6379)");
    if tokio::net::TcpStream::connect("127.0.0.1:6379")
        .await
        .is_err()
    {
        bench
            .report
            .note("redis mode skipped: nothing listens on 127.0.0.1:6379");
        return;
    }
    let app = RunningApp::start(bench.settings(LockMode::Redis)).await;
    let holds = holds_for(bench, order_rate(bench), run_secs(bench)).await;
    let stats = first_clicks(
        bench,
        &app.url,
        holds,
        CONCURRENCY,
        bench.profile.warmup,
        bench.profile.measure,
    )
    .await;
    println!("  first clicks: {}", stats.summary());
    bench.report.set("order_rps_redis", stats.rps());
    bench.report.set("order_p99_ms_redis", stats.p99_ms());
    storm(bench, &app.url, "_redis", false).await;
    app.stop().await;
}

/// The real binary as a process of its own, under the heaviest load of the
/// run (first clicks at the Payrail-latency concurrency, latency 400 ms):
/// its peak resident memory (VmHWM), the load generator not counted.
pub async fn rss(bench: &mut Bench) {
    let concurrency = bench
        .report
        .get("payrail_400ms_concurrency")
        .map_or(1024, |c| c as usize);
    println!("\n== rss: stagedoor-checkout serve as a process, {concurrency} concurrent first clicks, sandbox latency 400 ms");
    let service = servers::service_process(&bench.pg.bench_url(), &bench.sandbox_url).await;
    let idle = servers::status_mib(&service, "VmRSS:").unwrap_or(0.0);
    bench.set_latency(400).await;
    let holds = holds_for(bench, concurrency as f64 / 0.4, run_secs(bench)).await;
    let stats = first_clicks(
        bench,
        service.url(),
        holds,
        concurrency,
        bench.profile.warmup,
        bench.profile.measure,
    )
    .await;
    let peak = servers::status_mib(&service, "VmHWM:").unwrap_or(0.0);
    bench.set_latency(0).await;
    // SIGTERM, and 10 s to exit before SIGKILL.
    service.stop(Duration::from_secs(10)).await;
    clear_ledger(bench).await;
    println!("  {}", stats.summary());
    println!("  resident: {idle:.1} MiB idle, peak {peak:.1} MiB");
    bench.report.set("rss_mb_peak", peak);
    bench.report.detail(
        "rss",
        json!({
            "idle_mb": idle, "concurrency": concurrency, "rps": stats.rps(),
            "p99_ms": stats.p99_ms(), "errors": stats.errors(),
        }),
    );
}
