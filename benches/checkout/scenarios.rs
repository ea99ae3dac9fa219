//! The scenarios that compare: first clicks counted by the server, replays
//! beside the bare SELECT, the order flow with and without its key; and the
//! helpers every scenario uses (capacity.rs and storage.rs hold the rest).
//! Each drives one server with one kind of request and puts its figures in
//! the report.

use std::sync::Arc;
use std::time::Duration;

use idempotency::{IdempotencyKey, RequestHash};
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use serde_json::{json, Value};
use stagedoor_checkout::config::LockMode;
use test_support::Seen;
use uuid::Uuid;

use crate::fixtures::{self, order_body, Buyers, Holds};
use crate::load::{self, Sent, Stats};
use crate::servers::{self, BareQuery, Replayed, RunningApp};
use crate::{postgres, Bench};

/// Concurrency of the fixed-concurrency runs.
pub const CONCURRENCY: usize = 64;
/// Unmeasured start of each segment of an alternating comparison.
pub const SEGMENT_WARMUP: Duration = Duration::from_millis(500);

/// One stored 201 and the request that replays it.
pub struct Stored {
    pub buyer: usize,
    pub key: String,
    pub request: String,
    pub body: Vec<u8>,
}

/// Sends one first click per unit: a new key, a new hold.
pub fn orders_to(
    url: String,
    buyers: Arc<Buyers>,
    holds: Arc<Holds>,
    connections: usize,
) -> impl Fn() -> futures_util::future::BoxFuture<'static, Sent> + Clone + Send + Sync + 'static {
    let http = fixtures::client(connections);
    move || {
        let (http, url, buyers, holds) = (http.clone(), url.clone(), buyers.clone(), holds.clone());
        Box::pin(async move {
            let Some((buyer, hold)) = holds.take() else {
                return Sent::Exhausted;
            };
            let sent = http
                .post(&url)
                .header(AUTHORIZATION, buyers.auth[buyer].clone())
                .header("Idempotency-Key", Uuid::new_v4().to_string())
                .header(CONTENT_TYPE, "application/json")
                .body(order_body(hold))
                .send()
                .await;
            answered(sent, 201).await
        })
    }
}

/// One response read whole (`Seen::read`, as every scenario reads one), or
/// `None` if it did not come (connection error, timeout).
pub async fn seen(sent: reqwest::Result<reqwest::Response>) -> Option<Seen> {
    Seen::read(sent.ok()?).await.ok()
}

/// First clicks at `concurrency` to the server at `url` (`orders_to`, a
/// connection per worker): `warmup`, then `measure`.
pub async fn first_clicks(
    bench: &Bench,
    url: &str,
    holds: Arc<Holds>,
    concurrency: usize,
    warmup: Duration,
    measure: Duration,
) -> Stats {
    let send = orders_to(
        format!("{url}/orders"),
        bench.buyers.clone(),
        holds,
        concurrency,
    );
    load::closed(concurrency, warmup, measure, send).await
}

async fn answered(sent: reqwest::Result<reqwest::Response>, expected: u16) -> Sent {
    match seen(sent).await {
        Some(seen) if seen.status == expected => Sent::Ok(1),
        Some(seen) => Sent::Status(seen.status),
        None => Sent::Failed,
    }
}

/// Holds enough for `rps` over a run of `secs`, with room to spare.
pub async fn holds_for(bench: &Bench, rps: f64, secs: f64) -> Arc<Holds> {
    let count = (rps * secs * 1.3).clamp(5_000.0, 400_000.0) as usize;
    bench.factory.holds(count).await
}

/// A guess at the order rate, for sizing fixtures: what was measured, else
/// generous.
pub fn order_rate(bench: &Bench) -> f64 {
    bench
        .report
        .get("order_rps")
        .or(bench.report.get("order_rps_mirror"))
        // The machine is shared: a later run may go twice as fast.
        .map_or(4_000.0, |rps| rps * 3.0)
}

pub fn run_secs(bench: &Bench) -> f64 {
    (bench.profile.warmup + bench.profile.measure).as_secs_f64()
}

/// First clicks on a fresh instance, nothing else connected to the database,
/// so that the server's own counters across the run are the orders' alone:
/// `pg_stat_statements` calls and `pg_stat_database.xact_commit`.
pub async fn orders(bench: &mut Bench) {
    println!("\n== orders: first clicks (new key, new hold), sandbox latency 0, {CONCURRENCY} concurrent");
    let holds = holds_for(bench, order_rate(bench), run_secs(bench)).await;
    let app = RunningApp::start(bench.settings(LockMode::Table)).await;
    let monitor = postgres::connect(&bench.pg.url("postgres")).await;
    let database = bench.pg.database.clone();
    // Warm up first: the pool opens its connections and prepares its
    // statements (each first Parse is a transaction of its own). An idle
    // backend reports its counters within 10 s.
    let warmup = first_clicks(
        bench,
        &app.url,
        holds.clone(),
        CONCURRENCY,
        Duration::ZERO,
        bench.profile.warmup,
    )
    .await;
    let warmed = holds.used();
    println!(
        "  warm-up: {}; waiting 11 s for the counters",
        warmup.summary()
    );
    tokio::time::sleep(Duration::from_secs(11)).await;
    let counted = bench.pg.is_throwaway();
    if counted {
        monitor
            .execute("SELECT pg_stat_statements_reset()", &[])
            .await
            .expect("reset pg_stat_statements");
    }
    if counted {
        // Autovacuum's transactions would count as the orders'.
        autovacuum(&monitor, false).await;
    }
    let commits_before = postgres::commits(&monitor, &database).await;
    let worker_commits_before = bench.pg.worker_commits().await;
    let stats = first_clicks(
        bench,
        &app.url,
        holds.clone(),
        CONCURRENCY,
        Duration::ZERO,
        bench.profile.measure,
    )
    .await;
    app.stop().await;
    postgres::wait_quiet(&monitor, &database).await;
    let commits_after = postgres::commits(&monitor, &database).await;
    let worker_commits = bench.pg.worker_commits().await - worker_commits_before;
    if counted {
        autovacuum(&monitor, true).await;
    }
    println!("  {}", stats.summary());
    println!("  {}", stats.cpu_summary());
    let orders = stats.ok_total as f64;
    let attempts = (holds.used() - warmed) as f64;
    bench.report.set("order_rps", stats.rps());
    bench.report.set("order_p50_ms", stats.p50_ms());
    bench.report.set("order_p99_ms", stats.p99_ms());
    let commits = (commits_after - commits_before) as f64;
    bench.report.set("commits_per_order", commits / orders);
    if bench.pg.is_citus() {
        // The coordinator's commits are the clicks' own; each statement
        // Citus routes to a worker outside a transaction block commits
        // there as well.
        bench
            .report
            .set("worker_commits_per_order", worker_commits as f64 / orders);
    }
    let mut detail = json!({
        "orders": orders, "requests": attempts, "commits": commits,
        "errors": stats.errors(), "cpu": stats.cpu_json(),
    });
    if counted {
        let rows = monitor
            .query(
                "SELECT s.calls, round(s.mean_exec_time::numeric, 4)::float8,
                        round(s.total_exec_time::numeric, 1)::float8,
                        regexp_replace(s.query, '\\s+', ' ', 'g'),
                        s.plans, round(s.mean_plan_time::numeric, 4)::float8
                 FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid
                 WHERE d.datname = $1
                 ORDER BY s.calls DESC, s.total_exec_time DESC",
                &[&database],
            )
            .await
            .expect("pg_stat_statements");
        // Deferred foreign-key checks run at commit, outside any statement
        // of the service's, so pg_stat_statements lists them as top-level
        // statements of their own; they are counted apart.
        let is_fk_check =
            |query: &str| query.contains(" FROM ONLY ") && query.contains("FOR KEY SHARE OF x");
        let calls: i64 = rows
            .iter()
            .filter(|r| !is_fk_check(&r.get::<_, String>(3)))
            .map(|r| r.get::<_, i64>(0))
            .sum();
        let fk_checks: i64 = rows
            .iter()
            .filter(|r| is_fk_check(&r.get::<_, String>(3)))
            .map(|r| r.get::<_, i64>(0))
            .sum();
        bench
            .report
            .set("statements_per_order", calls as f64 / orders);
        bench
            .report
            .set("fk_checks_per_order", fk_checks as f64 / orders);
        println!(
            "  {calls} statements (and {fk_checks} foreign-key checks) and {commits} commits for {orders} orders ({attempts} requests)"
        );
        let statements: Vec<Value> = rows
            .iter()
            .map(|r| {
                let query: String = r.get(3);
                json!({
                    "calls": r.get::<_, i64>(0),
                    "per_order": (r.get::<_, i64>(0) as f64 / orders * 1000.0).round() / 1000.0,
                    "mean_ms": r.get::<_, f64>(1),
                    "total_ms": r.get::<_, f64>(2),
                    "plans": r.get::<_, i64>(4),
                    "mean_plan_ms": r.get::<_, f64>(5),
                    "query": query.chars().take(160).collect::<String>(),
                })
            })
            .collect();
        for s in &statements {
            println!(
                "    {:>6.3}/order  mean {:>7.4} ms  planned {:>6} times, mean {:>7.4} ms  {}",
                s["per_order"].as_f64().unwrap_or(0.0),
                s["mean_ms"].as_f64().unwrap_or(0.0),
                s["plans"].as_i64().unwrap_or(0),
                s["mean_plan_ms"].as_f64().unwrap_or(0.0),
                s["query"]
                    .as_str()
                    .unwrap_or("")
                    .chars()
                    .take(90)
                    .collect::<String>()
            );
        }
        detail["statements"] = json!(statements);
    } else {
        bench.report.note(
            "statements_per_order not counted: no pg_stat_statements on the machine's server",
        );
    }
    bench.report.detail("orders", detail);
}

/// Pauses or resumes autovacuum on the throwaway server.
async fn autovacuum(monitor: &tokio_postgres::Client, on: bool) {
    let sql = if on {
        "ALTER SYSTEM RESET autovacuum"
    } else {
        "ALTER SYSTEM SET autovacuum = off"
    };
    monitor.batch_execute(sql).await.expect(sql);
    monitor
        .batch_execute("SELECT pg_reload_conf()")
        .await
        .expect("reload");
    // Let running workers see it and finish.
    tokio::time::sleep(Duration::from_millis(300)).await;
}

/// One stored 201, replayed at 64 concurrency, beside the bare servers
/// reading the same row: by a SELECT, then by the replay's own statement.
pub async fn replay(bench: &mut Bench, app: &RunningApp) {
    println!("\n== replay: one stored 201 replayed, {CONCURRENCY} concurrent; bare baselines, alternating");
    let holds = bench.factory.holds(1).await;
    let (buyer, hold) = holds.take().expect("a hold");
    let key = Uuid::new_v4().to_string();
    let request = order_body(hold);
    let response = bench
        .http
        .post(format!("{}/orders", app.url))
        .header(AUTHORIZATION, bench.buyers.auth[buyer].clone())
        .header("Idempotency-Key", &key)
        .header(CONTENT_TYPE, "application/json")
        .body(request.clone())
        .send()
        .await
        .expect("the first order");
    assert_eq!(response.status(), 201, "the first order");
    let body = response.bytes().await.expect("body").to_vec();
    bench.replay = Some(Stored {
        buyer,
        key: key.clone(),
        request: request.clone(),
        body: body.clone(),
    });

    let settings = bench.settings(LockMode::Table);
    let http = fixtures::client(CONCURRENCY);
    // Both servers get the replay's request, byte for byte, so that the load
    // generator, which shares the cores with them, does the same work for
    // each.
    let auth = bench.buyers.auth[buyer].clone();
    let send_to = |url: String, expected_status: u16, replayed: bool| {
        let (http, auth, key, request, body) = (
            http.clone(),
            auth.clone(),
            key.clone(),
            request.clone(),
            body.clone(),
        );
        move || {
            let (http, url, auth, key, request, expected) = (
                http.clone(),
                url.clone(),
                auth.clone(),
                key.clone(),
                request.clone(),
                body.clone(),
            );
            async move {
                let sent = http
                    .post(&url)
                    .header(AUTHORIZATION, auth)
                    .header("Idempotency-Key", key)
                    .header(CONTENT_TYPE, "application/json")
                    .body(request)
                    .send()
                    .await;
                match seen(sent).await {
                    Some(seen)
                        if seen.status == expected_status
                            && seen.replayed == replayed
                            && seen.body == expected =>
                    {
                        Sent::Ok(1)
                    }
                    Some(seen) if seen.status == expected_status => Sent::Status(1),
                    Some(seen) => Sent::Status(seen.status),
                    None => Sent::Failed,
                }
            }
        }
    };
    // The replay beside each baseline in turn: the bare SELECT bounds a
    // one-query request; the bare server running the replay's own statement
    // tells the statement's cost from the HTTP stack's.
    let beside = async |query: BareQuery, name: &str, service: &str| {
        let replayed = Replayed {
            user_id: fixtures::name(buyer),
            key: IdempotencyKey::parse(key.as_bytes()).expect("a valid key"),
            hash: RequestHash::of("POST", "/orders", request.as_bytes()),
        };
        let bare = servers::bare(&settings, query, replayed);
        let (bare_stats, replay_stats) = load::abba(
            bench.profile.pairs,
            CONCURRENCY,
            SEGMENT_WARMUP,
            bench.profile.segment,
            send_to(format!("{}/bare", bare.url), 200, false),
            send_to(format!("{service}/orders"), 201, true),
        )
        .await;
        bare.stop().await;
        println!("  {name}: {}", bare_stats.summary());
        println!("    {}", bare_stats.cpu_summary());
        println!("  replay: {}", replay_stats.summary());
        println!("    {}", replay_stats.cpu_summary());
        (bare_stats, replay_stats)
    };
    let (bare_stats, replay_stats) = beside(BareQuery::Select, "bare SELECT", &app.url).await;
    let (claim_stats, replay_again) = beside(BareQuery::Claim, "bare claim", &app.url).await;
    // The same replay on an instance without the answer cache: every replay
    // is the key statement's round trip to PostgreSQL.
    println!("  the same on an instance with idempotency.answer_cache_mb = 0:");
    let mut uncached = bench.settings(LockMode::Table);
    uncached.idempotency.answer_cache_mb = 0;
    let uncached = servers::RunningApp::start(uncached).await;
    let (bare_again, replay_uncached) =
        beside(BareQuery::Select, "bare SELECT", &uncached.url).await;
    uncached.stop().await;
    bench.report.set("bare_select_rps", bare_stats.rps());
    bench.report.set("replay_rps", replay_stats.rps());
    bench.report.set("replay_p99_ms", replay_stats.p99_ms());
    bench
        .report
        .set("replay_ratio", replay_stats.rps() / bare_stats.rps());
    bench
        .report
        .set("replay_rps_no_cache", replay_uncached.rps());
    bench.report.set(
        "replay_ratio_no_cache",
        replay_uncached.rps() / bare_again.rps(),
    );
    bench.report.set("bare_claim_rps", claim_stats.rps());
    bench.report.set(
        "replay_ratio_same_statement",
        replay_again.rps() / claim_stats.rps(),
    );
    bench.report.detail(
        "replay",
        json!({
            "bare_select_p99_ms": bare_stats.p99_ms(),
            "bare_select_errors": bare_stats.errors(),
            "bare_claim_errors": claim_stats.errors(),
            "replay_errors": replay_stats.errors() + replay_again.errors(),
            "replay_rps_beside_bare_claim": replay_again.rps(),
            "stored_body_bytes": bench.replay.as_ref().map_or(0, |s| s.body.len()),
            "cpu_per_request": {
                "bare_select": bare_stats.cpu_json(),
                "replay": replay_stats.cpu_json(),
                "bare_claim": claim_stats.cpu_json(),
                "replay_beside_bare_claim": replay_again.cpu_json(),
            },
        }),
    );
}

/// The same first clicks on the mirror of the service's HTTP stack, with and
/// without the key statements, alternating.
pub async fn mirror(bench: &mut Bench) {
    println!("\n== mirror: first clicks with the key, and the same flow with the key statements left out, alternating");
    let mirror = servers::mirror(&bench.settings(LockMode::Table)).await;
    let secs = (SEGMENT_WARMUP + bench.profile.segment).as_secs_f64() * bench.profile.pairs as f64;
    let keyed_holds = holds_for(bench, order_rate(bench), secs).await;
    let keyless_holds = holds_for(bench, order_rate(bench) * 1.5, secs).await;
    let (keyed, keyless) = load::abba(
        bench.profile.pairs,
        CONCURRENCY,
        SEGMENT_WARMUP,
        bench.profile.segment,
        orders_to(
            format!("{}/orders", mirror.url),
            bench.buyers.clone(),
            keyed_holds,
            CONCURRENCY,
        ),
        orders_to(
            format!("{}/bench/orders-without-key", mirror.url),
            bench.buyers.clone(),
            keyless_holds,
            CONCURRENCY,
        ),
    )
    .await;
    mirror.stop().await;
    println!("  with the key (POST /orders): {}", keyed.summary());
    println!("    {}", keyed.cpu_summary());
    println!(
        "  key statements left out (benches/checkout/without_key.rs): {}",
        keyless.summary()
    );
    println!("    {}", keyless.cpu_summary());
    bench.report.set("order_rps_mirror", keyed.rps());
    bench.report.set("order_rps_no_idempotency", keyless.rps());
    bench
        .report
        .set("idempotency_ratio", keyed.rps() / keyless.rps());
    bench.report.detail(
        "mirror",
        json!({
            "keyed_p99_ms": keyed.p99_ms(),
            "no_idempotency_p99_ms": keyless.p99_ms(),
            "errors": [keyed.errors(), keyless.errors()],
            "cpu_per_request": { "keyed": keyed.cpu_json(), "no_idempotency": keyless.cpu_json() },
        }),
    );
}
