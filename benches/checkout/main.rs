//! `cargo bench --bench checkout [-- --quick] [--citus] [scenario ...]`
//!
//! What the checkout does on this machine, beside the baselines that bound
//! it. The bench starts its own PostgreSQL (initdb, `pg_stat_statements`),
//! a Payrail sandbox and the service's `Application` in this process on port
//! 0, then drives them with an async HTTP load generator at a fixed
//! concurrency, latencies in HDR histograms. It prints a table with the
//! targets of docs/PERFORMANCE.md and writes the same figures as JSON.
//!
//! `--quick` runs every scenario briefly (CI); the default runs them long
//! enough to trust. Naming scenarios runs only those (figures that need a
//! missing one are left out): orders, replay, mirror, storm, wait_storm,
//! payrail, redis, keyrows, cleanup, rss, lost_answers, abuse, outcomes,
//! onsale.
//!
//! Modules: `main` (profiles, the order of the scenarios), `load` (the load
//! generator), `report` (the table and the JSON), `fixtures` (buyers and
//! holds), `postgres` (the bench's server and its counters), `servers` (the
//! instances under load and the baselines), `cpu`, `scenarios` (orders,
//! replay, mirror), `capacity` (storms, payrail, redis, rss), `storage`
//! (keyrows, cleanup), `outcomes`, `abuse`, `lost_answers`, `without_key`,
//! `shards` (Citus), `onsale` (a crowd buying out an event while it polls
//! the seat map, and first clicks from thousands of connections).
//!
//! `--citus` runs on the three-node cluster of `scripts/citus.sh` instead
//! (`DATABASE_URL`: its coordinator), with the tables distributed as the
//! script does: orders, replay, storm, cleanup and shards (the shards of the
//! cluster each step of a click touches, then what a first click, a replay
//! and a read cost the coordinator and the workers: PostgreSQL CPU,
//! statements, two-phase commits) unless others are named.

mod abuse;
mod capacity;
mod cpu;
mod fixtures;
mod load;
mod lost_answers;
mod onsale;
mod outcomes;
mod postgres;
mod report;
mod scenarios;
mod servers;
mod shards;
mod storage;
mod without_key;

use std::net::TcpListener;
use std::sync::Arc;
use std::time::{Duration, Instant};

use payrail_sandbox::Sandbox;
use secrecy::ExposeSecret;
use serde_json::json;
use stagedoor_checkout::config::LockMode;
use test_support::sandbox;

use fixtures::{Buyers, Factory};
use report::Report;

/// How long each part runs.
pub struct Profile {
    pub name: &'static str,
    pub warmup: Duration,
    pub measure: Duration,
    /// Per concurrency step of the Payrail-latency search.
    pub step: Duration,
    pub cleanup_rows: i64,
    /// ABBA comparisons: pairs of segments, and each segment's length.
    pub pairs: usize,
    pub segment: Duration,
    /// The on-sale: its seats, its buyers, and how long it may take to sell
    /// out before it is given up.
    pub sale_seats: u32,
    pub sale_buyers: usize,
    pub sale_limit: Duration,
    /// Connections of the crowd's first clicks.
    pub crowd: usize,
}

impl Profile {
    fn quick() -> Self {
        Self {
            name: "quick",
            warmup: Duration::from_secs(1),
            measure: Duration::from_secs(4),
            step: Duration::from_secs(3),
            cleanup_rows: 200_000,
            pairs: 2,
            segment: Duration::from_secs(2),
            sale_seats: 300,
            sale_buyers: 3_000,
            sale_limit: Duration::from_secs(60),
            crowd: 4_096,
        }
    }

    fn full() -> Self {
        Self {
            name: "full",
            warmup: Duration::from_secs(3),
            measure: Duration::from_secs(15),
            step: Duration::from_secs(8),
            cleanup_rows: 1_000_000,
            pairs: 3,
            segment: Duration::from_secs(5),
            sale_seats: 2_000,
            sale_buyers: 20_000,
            sale_limit: Duration::from_secs(300),
            crowd: 4_096,
        }
    }
}

pub const SCENARIOS: &[&str] = &[
    "orders",
    "replay",
    "mirror",
    "storm",
    "wait_storm",
    "payrail",
    "redis",
    "keyrows",
    "cleanup",
    "rss",
    "lost_answers",
    "abuse",
    "shards",
    "outcomes",
    "onsale",
];

/// What `--citus` runs when no scenario is named.
const CITUS_SCENARIOS: &[&str] = &["orders", "replay", "storm", "cleanup", "shards"];

/// Everything the scenarios share.
pub struct Bench {
    pub profile: Profile,
    pub pg: postgres::Server,
    pub sandbox_url: String,
    pub buyers: Arc<Buyers>,
    pub factory: Factory,
    pub report: Report,
    /// A stored 201: (buyer, key, body sent, body stored).
    pub replay: Option<scenarios::Stored>,
    pub http: reqwest::Client,
}

impl Bench {
    pub fn settings(&self, lock: LockMode) -> stagedoor_checkout::config::Settings {
        let mut settings = servers::settings(&self.pg.bench_url(), &self.sandbox_url, lock);
        // Citus cannot split a generic plan into its distributed steps.
        settings.database.generic_plans = !self.pg.is_citus();
        settings
    }

    pub async fn set_latency(&self, latency_ms: u64) {
        let faults = json!({ "latency_ms": latency_ms });
        sandbox::set_faults(&self.http, &self.sandbox_url, &faults).await;
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let citus = args.iter().any(|a| a == "--citus");
    let profile = if args.iter().any(|a| a == "--quick") {
        Profile::quick()
    } else {
        Profile::full()
    };
    let mut selected: Vec<String> = args
        .iter()
        .filter(|a| !a.starts_with("--"))
        .cloned()
        .collect();
    if citus && selected.is_empty() {
        selected = CITUS_SCENARIOS.iter().map(|s| s.to_string()).collect();
    }
    assert!(
        citus || !selected.iter().any(|s| s == "shards"),
        "shards counts the shards of a Citus cluster: add --citus"
    );
    for name in &selected {
        assert!(
            SCENARIOS.contains(&name.as_str()),
            "unknown scenario {name}; known: {}",
            SCENARIOS.join(", ")
        );
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let (path, double_charges) = runtime.block_on(run(profile, selected, citus));
    runtime.shutdown_timeout(Duration::from_secs(5));
    println!("wrote {}", path.display());
    // Slow is a figure; a click charged twice is a broken promise.
    if double_charges > 0.0 {
        eprintln!(
            "a click was charged more than once, a seat sold twice or a paid order has no \
             charge: see the storm, abuse and onsale figures above"
        );
        std::process::exit(1);
    }
}

async fn run(profile: Profile, selected: Vec<String>, citus: bool) -> (std::path::PathBuf, f64) {
    let started = Instant::now();
    let wants = |name: &str| selected.is_empty() || selected.iter().any(|s| s == name);
    let load_before = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "checkout bench ({} profile); load average before: {}",
        profile.name,
        load_before.trim()
    );
    let (pg, fallback) = if citus {
        (postgres::Server::citus().await, None)
    } else {
        postgres::Server::start().await
    };
    // A crowd's connections are descriptors of this process twice over:
    // the load generator's and the in-process service's.
    let open_files = stagedoor_checkout::descriptors::raise_to_hard_limit()
        .map(|(before, after)| {
            println!(
                "open files: soft limit {} (was {}), hard limit {}",
                after.soft, before.soft, after.hard
            );
            json!({ "soft_before": before.soft, "soft": after.soft, "hard": after.hard })
        })
        .unwrap_or_else(|error| {
            println!("open files: the soft limit stays as it was ({error})");
            json!(null)
        });
    let mut report = Report::new(citus);
    if let Some(note) = fallback {
        report.note(note);
    }
    let admin = postgres::connect(&pg.url("postgres")).await;
    if pg.is_throwaway() {
        admin
            .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .await
            .expect("pg_stat_statements");
    }
    let backend: i32 = admin
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .expect("backend pid")
        .get(0);
    cpu::watch_postgres(backend.unsigned_abs());
    let pg_version: String = admin
        .query_one("SHOW server_version", &[])
        .await
        .expect("version")
        .get(0);
    drop(admin);

    let api_key = servers::test_layer().payrail.api_key;
    let sandbox = Sandbox::start(
        TcpListener::bind("127.0.0.1:0").expect("bind the sandbox"),
        api_key.expose_secret().to_owned(),
    )
    .expect("sandbox");
    let sandbox_url = sandbox.base_url();
    // Creates the database and applies the migrations.
    let mut settings = servers::settings(&pg.bench_url(), &sandbox_url, LockMode::Table);
    settings.database.generic_plans = !pg.is_citus();
    stagedoor_checkout::startup::prepare_database(&settings)
        .await
        .expect("prepare the bench database");
    pg.lay_out().await;
    let buyers = Arc::new(Buyers::new(&settings, 1_000));
    let factory = Factory::new(pg.bench_url(), buyers.len()).await;
    let mut bench = Bench {
        profile,
        pg,
        sandbox_url,
        buyers,
        factory,
        report,
        replay: None,
        http: fixtures::client(8),
    };

    // The counted order run comes first, while nothing else is connected
    // to the bench database. Its key rows are the ones `keyrows` measures.
    if wants("orders") || wants("keyrows") {
        scenarios::orders(&mut bench).await;
    }
    let app = servers::RunningApp::start(bench.settings(LockMode::Table)).await;
    if wants("replay") || wants("keyrows") || wants("cleanup") {
        scenarios::replay(&mut bench, &app).await;
    }
    if wants("mirror") {
        scenarios::mirror(&mut bench).await;
    }
    if wants("outcomes") {
        outcomes::outcomes(&mut bench).await;
    }
    if wants("storm") {
        capacity::storm(&mut bench, &app.url, "", false).await;
    }
    if wants("wait_storm") {
        capacity::storm(&mut bench, &app.url, "", true).await;
    }
    if wants("abuse") {
        abuse::abuse(&mut bench).await;
    }
    if wants("payrail") {
        capacity::payrail(&mut bench, &app).await;
    }
    if wants("redis") {
        capacity::redis(&mut bench).await;
    }
    if wants("keyrows") {
        storage::key_rows(&mut bench).await;
    }
    if wants("cleanup") {
        storage::cleanup(&mut bench, &app).await;
    }
    // Only on a cluster (main refuses `shards` named without `--citus`).
    if bench.pg.is_citus() && wants("shards") {
        shards::per_click(&mut bench, &app).await;
        shards::per_click_costs(&mut bench, &app).await;
    }
    app.stop().await;
    if wants("onsale") {
        onsale::onsale(&mut bench).await;
    }
    if wants("lost_answers") {
        lost_answers::lost_answers(&mut bench).await;
    }
    if wants("rss") {
        capacity::rss(&mut bench).await;
    }
    sandbox.stop().await;

    let load_after = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")
                .map(|m| m.trim_start_matches([' ', '\t', ':']).to_owned())
        })
        .unwrap_or_default();
    let meta = json!({
        "profile": bench.profile.name,
        "scenarios": if selected.is_empty() { SCENARIOS.iter().map(|s| s.to_string()).collect() } else { selected },
        "cores": std::thread::available_parallelism().map_or(0, |n| n.get()),
        "cpu": cpu,
        "postgresql": pg_version,
        "postgresql_server": bench.pg.settings_note(),
        "open_files": open_files,
        "load_average_before": load_before.trim(),
        "load_average_after": load_after.trim(),
        "elapsed_secs": started.elapsed().as_secs(),
        "unix_time": std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    });
    println!(
        "\nmachine: {} cores ({cpu}), PostgreSQL {pg_version}; {} s in all; load average after: {}",
        meta["cores"],
        started.elapsed().as_secs(),
        load_after.trim()
    );
    let double_charges = [
        "storm_double_charges",
        "wait_storm_double_charges",
        "storm_double_charges_redis",
        "abuse_double_charges",
        "abuse_seats_sold_twice",
        "onsale_violations",
    ]
    .iter()
    .filter_map(|name| bench.report.get(name))
    .sum();
    let file = if citus {
        "checkout-citus.json"
    } else {
        "checkout.json"
    };
    (bench.report.finish(meta, file), double_charges)
}
