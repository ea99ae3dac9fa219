//! `shards` (with `--citus`): which workers, and which shards of each, every
//! step of a click touches, from the workers' own counters. Before and after
//! each step the bench reads, on every worker, the scans and row changes of
//! every shard of the buyers' tables (`orders`, `idempotency_keys`) and of
//! the seat side (`holds`, `seats`) (`pg_stat_user_tables`); a shard whose
//! counters moved was touched, and so was the worker that holds it. Nothing
//! else runs meanwhile: the instance's background jobs wait an hour, and the
//! steps go one at a time.
//!
//! Then what a click costs each node ([`per_click_costs`]): the PostgreSQL
//! CPU time of the coordinator and of the workers (every process of each
//! server, from the kernel's counters), the statements the coordinator
//! received (`pg_stat_statements`: one per round trip of the service) and
//! the transactions prepared for two-phase commits (each node's
//! `pg_dist_transaction`, one per node a 2PC it coordinated prepared on), over
//! [`COST_CLICKS`] clicks of each kind, one at a time: a first click, its
//! replay, `GET /orders/{id}`, and a seat map's first view (its read).

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{HeaderValue, AUTHORIZATION, CONTENT_TYPE};
use stagedoor_checkout::checkout::orders::Orders;
use stagedoor_checkout::checkout::seats;
use stagedoor_checkout::config::LockMode;
use stagedoor_checkout::jobs::cleanup::Cleanup;
use stagedoor_checkout::jobs::reconcile::Reconcile;
use stagedoor_checkout::payrail;
use uuid::Uuid;

use crate::fixtures::order_body;
use crate::servers::RunningApp;
use crate::Bench;
use crate::{cpu, postgres};

/// How long an idle backend takes at most to report its counters: at once
/// when it goes idle, unless it reported less than a second before; then
/// ten seconds later.
const REPORTED_WITHIN: Duration = Duration::from_secs(11);

/// The tables whose shards a step may touch.
const TABLES: [&str; 4] = ["orders", "idempotency_keys", "holds", "seats"];

/// Per shard id: the worker that holds it ("host:port") and its table.
struct Shards(HashMap<i64, (String, String)>);

impl Shards {
    async fn of(bench: &Bench) -> Self {
        let client = postgres::connect(&bench.pg.bench_url()).await;
        let rows = client
            .query(
                "SELECT shardid, nodename || ':' || nodeport, table_name::text FROM citus_shards
                 WHERE table_name::text = ANY ($1)",
                &[&TABLES.as_slice()],
            )
            .await
            .expect("citus_shards");
        Self(
            rows.iter()
                .map(|row| (row.get(0), (row.get(1), row.get(2))))
                .collect(),
        )
    }

    fn workers(&self) -> usize {
        self.0
            .values()
            .map(|(node, _)| node)
            .collect::<HashSet<_>>()
            .len()
    }
}

/// Every shard's counters, on every worker: shard id -> scans + row changes.
async fn counters(bench: &Bench) -> HashMap<i64, i64> {
    tokio::time::sleep(REPORTED_WITHIN).await;
    let mut all = HashMap::new();
    for worker in bench.pg.worker_bench_urls() {
        let client = postgres::connect(&worker).await;
        // Citus hides the shards from the catalog unless asked.
        client
            .batch_execute("SET citus.override_table_visibility TO off")
            .await
            .expect("show the shards");
        let rows = client
            .query(
                "SELECT substring(relname FROM '_([0-9]+)$')::bigint,
                        seq_scan + coalesce(idx_scan, 0) + n_tup_ins + n_tup_upd + n_tup_del
                 FROM pg_stat_user_tables
                 WHERE relname ~ '^(orders|idempotency_keys|holds|seats)_[0-9]+$'",
                &[],
            )
            .await
            .expect("a worker's pg_stat_user_tables");
        all.extend(
            rows.iter()
                .map(|row| (row.get::<_, i64>(0), row.get::<_, i64>(1))),
        );
    }
    all
}

/// Runs `step` alone and says how many workers (and shards of each table)
/// it touched; the figure is `shards_<name>`, the workers.
async fn step<F: std::future::Future<Output = ()>>(
    bench: &mut Bench,
    shards: &Shards,
    name: &str,
    what: &str,
    step: F,
) {
    let before = counters(bench).await;
    step.await;
    let after = counters(bench).await;
    let touched: Vec<&(String, String)> = after
        .iter()
        .filter(|(shard, n)| before.get(shard) != Some(n))
        .filter_map(|(shard, _)| shards.0.get(shard))
        .collect();
    let workers = touched
        .iter()
        .map(|(node, _)| node)
        .collect::<HashSet<_>>()
        .len();
    let per_table: Vec<String> = TABLES
        .iter()
        .map(|table| {
            let n = touched.iter().filter(|(_, t)| t == table).count();
            format!("{table} {n}")
        })
        .collect();
    println!(
        "  {what:<52} {workers:>2} of {} workers ({})",
        shards.workers(),
        per_table.join(", "),
    );
    bench.report.set(&format!("shards_{name}"), workers as f64);
}

pub async fn per_click(bench: &mut Bench, app: &RunningApp) {
    let shards = Shards::of(bench).await;
    println!(
        "\n== shards: the workers each step touches, of {} (workers' pg_stat_user_tables)",
        shards.workers()
    );
    let holds = bench.factory.holds(1).await;
    let (buyer, hold) = holds.take().expect("a hold");
    let auth = bench.buyers.auth[buyer].clone();
    let (key, body) = (Uuid::new_v4().to_string(), order_body(hold));
    let http = bench.http.clone();
    let order = |expected: u16| {
        let request = http
            .post(format!("{}/orders", app.url))
            .header(AUTHORIZATION, auth.clone())
            .header("Idempotency-Key", &key)
            .header(CONTENT_TYPE, "application/json")
            .body(body.clone());
        async move {
            let response = request.send().await.expect("POST /orders");
            assert_eq!(response.status(), expected, "POST /orders");
            response
                .headers()
                .get("location")
                .and_then(|l| l.to_str().ok())
                .map(str::to_owned)
        }
    };
    let location = std::sync::Mutex::new(None);
    step(
        bench,
        &shards,
        "order",
        "a first click: claim, order, charge, settle, answer",
        async {
            *location.lock().expect("location") = order(201).await;
        },
    )
    .await;
    step(
        bench,
        &shards,
        "replay",
        "the same click again: a replay",
        async {
            order(201).await;
        },
    )
    .await;
    let location = location
        .into_inner()
        .expect("location")
        .expect("a Location");
    let get = bench
        .http
        .get(format!("{}{location}", app.url))
        .header(AUTHORIZATION, auth.clone());
    step(bench, &shards, "get", "GET /orders/{id}", async {
        assert_eq!(get.send().await.expect("GET").status(), 200);
    })
    .await;

    let settings = bench.settings(stagedoor_checkout::config::LockMode::Table);
    let pool = app.pool.clone();
    let payrail = payrail::Client::new(&settings.payrail, &settings.payrail.base_url)
        .expect("a Payrail client");
    let orders = Orders::new(pool.clone(), Arc::new(payrail));
    let reconcile = Reconcile::new(pool.clone(), orders, &settings.reconcile);
    step(
        bench,
        &shards,
        "reconcile",
        "a reconciliation run (nothing due)",
        async {
            reconcile.run().await.expect("a reconciliation run");
        },
    )
    .await;
    let cleanup = Cleanup::new(pool, settings.idempotency.ttl());
    step(
        bench,
        &shards,
        "cleanup",
        "a cleanup run (nothing expired)",
        async {
            cleanup.run().await.expect("a cleanup run");
        },
    )
    .await;
}

/// Clicks of each kind that [`per_click_costs`] divides by.
const COST_CLICKS: usize = 40;

/// A monitoring connection to the bench database of one node, and the
/// pid of its backend (whose postmaster's processes are the node's CPU).
struct Node {
    client: tokio_postgres::Client,
    backend: u32,
    /// Whether `pg_stat_statements` is loaded there (scripts/citus.sh
    /// preloads it on the nodes it makes).
    statements: bool,
}

impl Node {
    async fn open(url: &str) -> Self {
        let client = postgres::connect(url).await;
        let backend: i32 = client
            .query_one("SELECT pg_backend_pid()", &[])
            .await
            .expect("backend pid")
            .get(0);
        let statements = client
            .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .await
            .is_ok()
            && client
                .batch_execute("SELECT pg_stat_statements_reset()")
                .await
                .is_ok();
        Self {
            client,
            backend: backend.unsigned_abs(),
            statements,
        }
    }

    /// (CPU nanoseconds, statements) so far; the monitor's own statements
    /// (this backend's) left out.
    async fn sample(&self) -> (u64, i64) {
        let statements = if self.statements {
            self.client
                .query_one(
                    "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
                     WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                       AND query NOT LIKE '%pg_stat_statements%'
                       AND query NOT LIKE '%pg_dist_transaction%'
                       AND query NOT LIKE '%recover_prepared_transactions%'",
                    &[],
                )
                .await
                .expect("pg_stat_statements")
                .get(0)
        } else {
            0
        };
        (cpu::postgres_of(self.backend), statements)
    }
}

/// Seats of each event whose map [`per_click_costs`] reads, half of them
/// held.
const MAP_SEATS: u32 = 200;

/// [`COST_CLICKS`] new events of [`MAP_SEATS`] seats, half of them held by
/// a buyer who does not view them: the first view of each reads its map
/// from the database (a view within `seat_maps::MAX_AGE` of another is
/// served from memory and reaches no node).
async fn seat_map_events(bench: &Bench) -> Vec<String> {
    let run = Uuid::new_v4().simple().to_string();
    let events: Vec<String> = (0..COST_CLICKS).map(|i| format!("map-{run}-{i}")).collect();
    let pool = test_support::db::pool(&bench.pg.bench_url(), 1);
    let client = pool.get().await.expect("a connection");
    for event in &events {
        seats::seed(&client, event, MAP_SEATS, 4500)
            .await
            .expect("a map's event and seats");
    }
    client
        .execute(
            "INSERT INTO holds (slot, seat_id, user_id, expires_at)
             SELECT slot, seat_id, $2, now() + interval '2 hours' FROM seats
             WHERE event_id = ANY ($1) AND seat_id % 2 = 0",
            &[&events, &"map-holder"],
        )
        .await
        .expect("the map holds");
    events
}

/// One GET of each `(authorization, path)`, each answered 200.
fn gets<'a>(
    http: &'a reqwest::Client,
    url: &'a str,
    requests: &'a [(HeaderValue, String)],
) -> Vec<impl std::future::Future<Output = ()> + 'a> {
    requests
        .iter()
        .map(|(auth, path)| {
            let request = http
                .get(format!("{url}{path}"))
                .header(AUTHORIZATION, auth.clone());
            async move {
                assert_eq!(request.send().await.expect("GET").status(), 200, "{path}");
            }
        })
        .collect()
}

/// What one kind of click cost, per click, on each side.
struct Cost {
    coordinator_cpu: u64,
    worker_cpu: u64,
    coordinator_statements: f64,
    prepared: f64,
}

/// The transactions that the nodes prepared on other nodes, still on
/// record: a two-phase commit is one row of its coordinating node's
/// `pg_dist_transaction` (one `gid`) per node it prepared on, until
/// recovery drops it. A worker coordinates a click's commits.
async fn prepared(nodes: &[&Node]) -> i64 {
    let mut sum = 0;
    for node in nodes {
        sum += node
            .client
            .query_one("SELECT count(DISTINCT gid) FROM pg_dist_transaction", &[])
            .await
            .expect("pg_dist_transaction")
            .get::<_, i64>(0);
    }
    sum
}

/// How long the nodes are watched with no click, for the CPU that is no
/// click's: each node's maintenance daemon (deadlock detection, recovery)
/// and the instance's own jobs, which run whatever the traffic.
const IDLE: Duration = Duration::from_secs(10);

/// The nodes' CPU with no click, in nanoseconds per second.
struct Idle {
    coordinator: f64,
    workers: f64,
}

impl Idle {
    async fn of(coordinator: &Node, workers: &[Node]) -> Self {
        let started = std::time::Instant::now();
        let c0 = coordinator.sample().await.0;
        let w0 = workers_cpu(workers).await;
        tokio::time::sleep(IDLE).await;
        let secs = started.elapsed().as_secs_f64();
        Self {
            coordinator: coordinator.sample().await.0.saturating_sub(c0) as f64 / secs,
            workers: workers_cpu(workers).await.saturating_sub(w0) as f64 / secs,
        }
    }
}

async fn workers_cpu(workers: &[Node]) -> u64 {
    let mut sum = 0;
    for worker in workers {
        sum += worker.sample().await.0;
    }
    sum
}

/// Runs `clicks` (each a future making one click), one at a time, and says
/// what they cost per click, beyond what the nodes spend idle for as long.
async fn cost<F: std::future::Future<Output = ()>>(
    coordinator: &Node,
    workers: &[Node],
    idle: &Idle,
    clicks: Vec<F>,
) -> Cost {
    // The records of earlier commits go first, so that what remains after
    // the clicks is theirs (a maintenance daemon's own recovery, once a
    // minute, could still drop some: the count is then low, never high).
    let nodes: Vec<&Node> = std::iter::once(coordinator).chain(workers).collect();
    for node in &nodes {
        node.client
            .query_one("SELECT recover_prepared_transactions()", &[])
            .await
            .expect("recover_prepared_transactions");
    }
    let before = prepared(&nodes).await;
    let started = std::time::Instant::now();
    let (c0, cs0) = coordinator.sample().await;
    let w0 = workers_cpu(workers).await;
    let n = clicks.len().max(1) as u64;
    for click in clicks {
        click.await;
    }
    let (c1, cs1) = coordinator.sample().await;
    let worker_cpu = workers_cpu(workers).await.saturating_sub(w0);
    let secs = started.elapsed().as_secs_f64();
    let prepared_here = prepared(&nodes).await - before;
    let per = |total: i64| total as f64 / n as f64;
    let beyond_idle = |used: u64, rate: f64| used.saturating_sub((rate * secs) as u64) / n;
    Cost {
        coordinator_cpu: beyond_idle(c1.saturating_sub(c0), idle.coordinator),
        worker_cpu: beyond_idle(worker_cpu, idle.workers),
        coordinator_statements: per(cs1 - cs0),
        prepared: per(prepared_here),
    }
}

pub async fn per_click_costs(bench: &mut Bench, app: &RunningApp) {
    println!(
        "\n== per click on the cluster ({COST_CLICKS} clicks of each kind, one at a time): \
         PostgreSQL CPU, statements (round trips) and transactions prepared on workers (2PC)"
    );
    let coordinator = Node::open(&bench.pg.bench_url()).await;
    let mut workers = Vec::new();
    for worker in bench.pg.worker_bench_urls() {
        workers.push(Node::open(&worker).await);
    }
    if !coordinator.statements {
        println!("  (no pg_stat_statements on the coordinator: statements not counted)");
    }
    let holds = bench.factory.holds(COST_CLICKS).await;
    let clicks: Vec<(HeaderValue, String, String)> = (0..COST_CLICKS)
        .map(|_| {
            let (buyer, hold) = holds.take().expect("a hold");
            (
                bench.buyers.auth[buyer].clone(),
                Uuid::new_v4().to_string(),
                order_body(hold),
            )
        })
        .collect();
    let http = bench.http.clone();
    let url = app.url.clone();
    let post_to = |url: &str, (auth, key, body): &(HeaderValue, String, String)| {
        let request = http
            .post(format!("{url}/orders"))
            .header(AUTHORIZATION, auth.clone())
            .header("Idempotency-Key", key.clone())
            .header(CONTENT_TYPE, "application/json")
            .body(body.clone());
        async move {
            let response = request.send().await.expect("POST /orders");
            assert_eq!(response.status(), 201, "POST /orders");
            response
                .headers()
                .get("location")
                .and_then(|l| l.to_str().ok())
                .map(str::to_owned)
                .expect("a Location")
        }
    };
    let post = |click| post_to(&url, click);
    let locations = std::sync::Mutex::new(Vec::new());
    let idle = Idle::of(&coordinator, &workers).await;
    println!(
        "  idle, for {IDLE:?}: the coordinator {:.1} ms of CPU a second, the workers {:.1} ms \
         (taken off each kind's figures for its time)",
        idle.coordinator / 1e6,
        idle.workers / 1e6
    );
    let first = cost(
        &coordinator,
        &workers,
        &idle,
        clicks
            .iter()
            .map(|click| async {
                let location = post(click).await;
                locations
                    .lock()
                    .expect("locations")
                    .push((click.0.clone(), location));
            })
            .collect(),
    )
    .await;
    let replay = cost(
        &coordinator,
        &workers,
        &idle,
        clicks
            .iter()
            .map(|click| async {
                post(click).await;
            })
            .collect(),
    )
    .await;
    let locations = locations.into_inner().expect("locations");
    let get = cost(&coordinator, &workers, &idle, gets(&http, &url, &locations)).await;
    // The same replays asked of an instance without the answer cache, its
    // connections opened beforehand (an order's read each): the claim that
    // finds the stored answer.
    let mut uncached = bench.settings(LockMode::Table);
    uncached.idempotency.answer_cache_mb = 0;
    let uncached = RunningApp::start(uncached).await;
    for warm in gets(&http, &uncached.url, &locations) {
        warm.await;
    }
    let replay_uncached = cost(
        &coordinator,
        &workers,
        &idle,
        clicks
            .iter()
            .map(|click| async {
                post_to(&uncached.url, click).await;
            })
            .collect(),
    )
    .await;
    uncached.stop().await;
    let auth = &bench.buyers.auth[0];
    let events = seat_map_events(bench).await;
    let maps: Vec<(HeaderValue, String)> = events
        .iter()
        .map(|event| (auth.clone(), format!("/events/{event}/seats")))
        .collect();
    let map = cost(&coordinator, &workers, &idle, gets(&http, &url, &maps)).await;
    println!(
        "  {:<24} {:>16} {:>16} {:>11} {:>6}",
        "", "coordinator CPU", "workers' CPU", "statements", "prepared"
    );
    for (name, what, cost) in [
        ("first", "a first click (201)", &first),
        ("replay", "its replay", &replay),
        ("replay_uncached", "its replay, no cache", &replay_uncached),
        ("get", "GET /orders/{id}", &get),
        ("map", "a seat map's read", &map),
    ] {
        let ms = |nanos: u64| nanos as f64 / 1e6;
        println!(
            "  {what:<24} {:>13.3} ms {:>13.3} ms {:>11.1} {:>6.2}",
            ms(cost.coordinator_cpu),
            ms(cost.worker_cpu),
            cost.coordinator_statements,
            cost.prepared
        );
        let report = &mut bench.report;
        report.set(
            &format!("citus_{name}_coordinator_cpu_ms"),
            ms(cost.coordinator_cpu),
        );
        report.set(&format!("citus_{name}_worker_cpu_ms"), ms(cost.worker_cpu));
        report.set(
            &format!("citus_{name}_coordinator_statements"),
            cost.coordinator_statements,
        );
        report.set(&format!("citus_{name}_prepared"), cost.prepared);
    }
}
