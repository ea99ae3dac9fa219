//! `shards` (with `--citus`): which shards of the cluster each step of a
//! click touches, from the workers' own counters. Before and after each step
//! the bench reads, on every worker, the scans and row changes of every
//! shard of `orders` and `idempotency_keys` (`pg_stat_user_tables`); a shard
//! whose counters moved was touched. Shards of the two tables that cover the
//! same hash range are co-located (one shard group, on one worker) and count
//! once. Nothing else runs meanwhile: the instance's background jobs wait an
//! hour, and the steps go one at a time.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{AUTHORIZATION, CONTENT_TYPE};
use stagedoor_checkout::checkout::orders::Orders;
use stagedoor_checkout::jobs::cleanup::Cleanup;
use stagedoor_checkout::jobs::reconcile::Reconcile;
use stagedoor_checkout::{http, payrail};
use uuid::Uuid;

use crate::fixtures::order_body;
use crate::postgres;
use crate::servers::RunningApp;
use crate::Bench;

/// How long an idle backend takes at most to report its counters: at once
/// when it goes idle, unless it reported less than a second before; then
/// ten seconds later.
const REPORTED_WITHIN: Duration = Duration::from_secs(11);

/// Per shard id: its hash range (the shard group) and its table.
struct Shards(HashMap<i64, (String, String)>);

impl Shards {
    async fn of(bench: &Bench) -> Self {
        let client = postgres::connect(&bench.pg.bench_url()).await;
        let rows = client
            .query(
                "SELECT shardid, shardminvalue, logicalrelid::text FROM pg_dist_shard
                 WHERE logicalrelid IN ('orders'::regclass, 'idempotency_keys'::regclass)",
                &[],
            )
            .await
            .expect("pg_dist_shard");
        Self(
            rows.iter()
                .map(|row| (row.get(0), (row.get(1), row.get(2))))
                .collect(),
        )
    }

    fn groups(&self) -> usize {
        self.0
            .values()
            .map(|(range, _)| range)
            .collect::<HashSet<_>>()
            .len()
    }
}

/// Every shard's counters, on every worker: shard id -> scans + row changes.
async fn counters(bench: &Bench) -> HashMap<i64, i64> {
    tokio::time::sleep(REPORTED_WITHIN).await;
    let mut all = HashMap::new();
    for worker in &bench.pg.workers {
        let client = postgres::connect(&format!("{worker}/{}", bench.pg.database)).await;
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
                 WHERE relname ~ '^(orders|idempotency_keys)_[0-9]+$'",
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

/// Runs `step` alone and says how many shard groups (and shards of each
/// table) it touched; the figure is `shards_<name>`.
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
    let groups = touched
        .iter()
        .map(|(range, _)| range)
        .collect::<HashSet<_>>()
        .len();
    let per_table = |table: &str| touched.iter().filter(|(_, t)| t == table).count();
    println!(
        "  {what:<52} {groups:>2} of {} shard groups (orders {}, idempotency_keys {})",
        shards.groups(),
        per_table("orders"),
        per_table("idempotency_keys"),
    );
    bench.report.set(&format!("shards_{name}"), groups as f64);
}

pub async fn per_click(bench: &mut Bench, app: &RunningApp) {
    let shards = Shards::of(bench).await;
    println!(
        "\n== shards: the shard groups each step touches, of {} (workers' pg_stat_user_tables)",
        shards.groups()
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
    let orders = Orders::new(pool.clone(), Arc::new(payrail), http::order_answer);
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
