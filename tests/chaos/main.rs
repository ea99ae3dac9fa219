//! The chaos run: real `stagedoor-checkout serve` processes on
//! a throwaway PostgreSQL and a real `payrail-sandbox`, a crowd of buyers
//! clicking and retrying, while Payrail slows down, fails and drops answers,
//! instances are SIGKILLed and restarted, and PostgreSQL restarts once (on
//! the Citus profile, `STAGEDOOR_TEST_CITUS=1`: a worker's PostgreSQL is
//! SIGKILLed and started again now and then, cutting two-phase commits
//! between their phases, every other time the worker that coordinates a
//! commit caught there, which its own maintenance daemon must finish; then
//! every node recovers what is left). At the end
//! every click is retried with its own key until it has an answer, then
//! the database and Payrail's ledger are checked against the invariants
//! (docs/DESIGN.md, "What always holds") and against every answer the
//! buyers saw; on Citus no node may keep a prepared transaction. The
//! instances deliver their order events to a shop's endpoint that fails,
//! answers late and drops connections on a schedule of its own: at the end
//! every settled order's one event has been delivered, and every event the
//! shop acknowledged is its order's, in the order's state.
//!
//! ```sh
//! CHAOS_SECS=300 cargo test --release --test chaos -- --nocapture
//! ```
//!
//! `CHAOS_SECS` is how long the chaos lasts (default 60); the settling at the
//! end adds up to three minutes more. `CHAOS_BUYERS` (default 24),
//! `CHAOS_INSTANCES` (default 3) and `CHAOS_DB_RESTARTS` (default 1, spread
//! evenly) size it; `CHAOS_KEEP=1` keeps the scratch directory with every
//! process's log, and `CHAOS_SERVICE_LOG` is the services' `RUST_LOG`
//! (default `warn`; `info` logs every request). Not part of a plain `cargo test`
//! (`test = false` in Cargo.toml): it needs a release build to mean anything.
//!
//! Every random decision of the run is drawn from PRNG streams of one seed,
//! printed at the start and in the failure message: which fault profile the
//! sandbox gets and for how long, which instance is killed when and for how
//! long (the first steps of both are printed too), and what the buyers do.
//! `CHAOS_SEED=<n>` replays the run of seed `n`: the same schedule of faults
//! and kills, in the same order (the times drift by what the machine does,
//! and the requests race as they will, so the answers differ). Without it a
//! fresh seed is drawn.
//!
//! ```sh
//! CHAOS_SEED=1234 CHAOS_SECS=60 cargo test --release --test chaos -- --nocapture
//! ```

mod cluster;
mod load;
mod monkey;

use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use stagedoor_checkout::auth::{BuyerId, Tokens};
use stagedoor_checkout::config::Settings;
use test_support::db::connect;
use test_support::{invariants, sandbox, Rng};

use cluster::{SandboxProcess, Services, Store};
use load::{buyer_name, Click, Seats, Shop};
use monkey::{CrashSchedule, FaultSchedule, KillSchedule, Monkey, ShopSchedule};
use test_support::receiver::Receiver;

/// The service's Payrail timeout; the latency faults exceed it.
const PAYRAIL_TIMEOUT_MS: u64 = 800;
/// The order events' delivery timeout; the shop's late answers exceed it.
const EVENTS_TIMEOUT_MS: u64 = 500;
/// What the order events are signed with in the chaos run.
const EVENTS_SECRET: &str = "stagedoor_chaos_events_0123456789abcdef";
/// How long the end may take to get every click an answer, and to settle
/// every pending order.
const FINISH_WITHIN: Duration = Duration::from_secs(60);
const SETTLE_WITHIN: Duration = Duration::from_secs(60);
/// How long the final sweep may take to replay every answered click.
const REPLAY_WITHIN: Duration = Duration::from_secs(90);

struct Profile {
    secs: u64,
    buyers: usize,
    instances: usize,
    db_restarts: u64,
    seats: u32,
    /// Of every PRNG of the run: `CHAOS_SEED`, else a fresh one.
    seed: u64,
}

impl Profile {
    fn from_env() -> Self {
        let number = |name: &str, default: u64| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse::<u64>().ok())
                .unwrap_or(default)
        };
        let secs = number("CHAOS_SECS", 60).max(10);
        Self {
            secs,
            buyers: number("CHAOS_BUYERS", 24).clamp(1, 512) as usize,
            instances: number("CHAOS_INSTANCES", 3).clamp(1, 8) as usize,
            // A Citus cluster is not the run's to restart.
            db_restarts: if test_support::citus::enabled() {
                0
            } else {
                number("CHAOS_DB_RESTARTS", 1).min(secs / 5)
            },
            // More than this machine can sell (about 250 a second), so the
            // buyers never run out; they still collide on a seat now and then.
            seats: (secs * 600).clamp(12_000, 1_000_000) as u32,
            seed: std::env::var("CHAOS_SEED")
                .ok()
                .map(|v| {
                    v.trim()
                        .parse()
                        .unwrap_or_else(|_| panic!("CHAOS_SEED={v}: not a number"))
                })
                .unwrap_or_else(Rng::fresh_seed),
        }
    }
}

#[test]
fn chaos_keeps_one_click_one_order_and_at_most_one_charge() {
    let profile = Profile::from_env();
    let seed = profile.seed;
    println!("chaos: seed {seed} (CHAOS_SEED={seed} replays this run's faults and kills)");
    let [faults, kills] = monkey::preview(seed, PAYRAIL_TIMEOUT_MS, profile.instances, 5);
    println!("chaos: the first faults: {faults}");
    println!("chaos: the first kills: {kills}");
    // Torn down at the end, panics included: the runtime (and with it every
    // process it spawned; a panic drops the store first), then the store
    // (PostgreSQL or the cluster's database), then the directory.
    let mut scratch = cluster::scratch();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let store = runtime.block_on(Store::new(scratch.path()));
    let violations = runtime.block_on(run(&profile, &store, scratch.path()));
    runtime.shutdown_timeout(Duration::from_secs(10));
    if !violations.is_empty() {
        // The instances' and PostgreSQL's logs say why: keep them.
        scratch.keep(true);
        println!("chaos: logs kept in {}", scratch.path().display());
    }
    assert!(
        violations.is_empty(),
        "{} violations with seed {seed} (CHAOS_SEED={seed} replays its faults and kills; \
         the first 20, the report above lists 50):\n  {}",
        violations.len(),
        violations[..violations.len().min(20)].join("\n  ")
    );
}

/// What every service process starts from: config/test.toml, the layer of
/// the API tests' and the bench's instances too (port 0, no per-buyer
/// limits, the sandbox's API key and webhook secret, a token secret). The
/// processes read it as `STAGEDOOR_ENV=test`; the run reads it here for
/// what the sandbox and the buyers must agree on with them.
fn test_layer() -> Settings {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    Settings::load_from(&dir, "test").expect("config/test.toml")
}

/// The environment of every service process (and of the `seed` command):
/// the test layer, then this run's database, sandbox, shop, sizes and
/// faster jobs, breaker and lease.
fn service_env(
    store: &Store,
    sandbox: &str,
    shop: &str,
    profile: &Profile,
) -> Vec<(String, String)> {
    let config = format!("{}/config", env!("CARGO_MANIFEST_DIR"));
    let hold_ttl = (profile.secs + 600).to_string();
    let log = std::env::var("CHAOS_SERVICE_LOG").unwrap_or_else(|_| "warn".to_owned());
    [
        ("STAGEDOOR_ENV", "test"),
        ("STAGEDOOR_CONFIG_DIR", config.as_str()),
        ("DATABASE_URL", store.url().as_str()),
        ("STAGEDOOR__DATABASE__CREATE_IF_MISSING", "true"),
        (
            "STAGEDOOR__DATABASE__GENERIC_PLANS",
            if test_support::citus::enabled() {
                "false"
            } else {
                "true"
            },
        ),
        ("STAGEDOOR__DATABASE__POOL_SIZE", "8"),
        ("STAGEDOOR__DATABASE__POOL_TIMEOUT_MS", "2000"),
        ("STAGEDOOR__SERVER__WORKERS", "2"),
        ("STAGEDOOR__PAYRAIL__BASE_URL", sandbox),
        (
            "STAGEDOOR__PAYRAIL__TIMEOUT_MS",
            &PAYRAIL_TIMEOUT_MS.to_string(),
        ),
        ("STAGEDOOR__PAYRAIL__MAX_ATTEMPTS", "2"),
        ("STAGEDOOR__PAYRAIL__BREAKER_FAILURES", "5"),
        ("STAGEDOOR__PAYRAIL__BREAKER_OPEN_SECS", "1"),
        ("STAGEDOOR__IDEMPOTENCY__LOCK", "table"),
        ("STAGEDOOR__IDEMPOTENCY__LEASE_SECS", "2"),
        ("STAGEDOOR__RECONCILE__INTERVAL_SECS", "1"),
        ("STAGEDOOR__RECONCILE__GRACE_SECS", "2"),
        ("STAGEDOOR__HOLDS__TTL_SECS", hold_ttl.as_str()),
        ("STAGEDOOR__OUTCOMES__WEBHOOK_URL", shop),
        ("STAGEDOOR__OUTCOMES__WEBHOOK_SECRET", EVENTS_SECRET),
        (
            "STAGEDOOR__OUTCOMES__TIMEOUT_MS",
            &EVENTS_TIMEOUT_MS.to_string(),
        ),
        ("STAGEDOOR__OUTCOMES__POLL_MS", "200"),
        ("STAGEDOOR__OUTCOMES__MAX_BACKOFF_SECS", "2"),
        ("RUST_LOG", log.as_str()),
    ]
    .iter()
    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
    .collect()
}

async fn count(db: &tokio_postgres::Client, sql: &str) -> i64 {
    db.query_one(sql, &[]).await.expect(sql).get(0)
}

/// Signs a token per buyer with the services' secret, valid for the whole
/// run.
fn tokens(layer: &Settings, buyers: usize, ttl: Duration) -> Vec<String> {
    let tokens = Tokens::new(&layer.auth.jwt_secret).expect("jwt secret");
    (0..buyers)
        .map(|i| {
            let buyer = BuyerId::parse(&buyer_name(i)).expect("buyer id");
            tokens.sign(&buyer, ttl).expect("sign")
        })
        .collect()
}

async fn run(profile: &Profile, store: &Store, scratch: &Path) -> Vec<String> {
    let admin = connect(&store.admin_url()).await;
    assert_eq!(
        count(
            &admin,
            "SELECT count(*) FROM pg_available_extensions WHERE name = 'btree_gist'"
        )
        .await,
        1,
        "the btree_gist extension (PostgreSQL contrib) must be installed"
    );
    drop(admin);

    // The sandbox's port first: the services are told it, and it is told
    // where to send its events (the first instance, killed now and then
    // like the others, so events are retried until it is back).
    let sandbox_port = test_support::process::free_port();
    let shop_events = Arc::new(Receiver::start().await);
    let env = service_env(
        store,
        &format!("http://127.0.0.1:{sandbox_port}"),
        &shop_events.url(),
        profile,
    );
    let services = Arc::new(Services::new(scratch, profile.instances, env));
    let events_url = format!("{}/payrail/events", services.urls[0]);
    let layer = test_layer();
    let sandbox = SandboxProcess::spawn(scratch, sandbox_port, &events_url, &layer.payrail).await;
    services.admin(&["migrate"]).await;
    store.lay_out().await;
    // `seed` makes at most 100,000 seats per event.
    let mut left = profile.seats;
    for event in 1.. {
        let seats = left.min(100_000);
        services
            .admin(&[
                "seed",
                "--event",
                &format!("chaos-{event}"),
                "--seats",
                &seats.to_string(),
                "--price-cents",
                "2500",
            ])
            .await;
        left -= seats;
        if left == 0 {
            break;
        }
    }
    let seat_ids: Vec<i64> = connect(&store.url())
        .await
        .query("SELECT seat_id FROM seats ORDER BY seat_id", &[])
        .await
        .expect("seat ids")
        .iter()
        .map(|row| row.get(0))
        .collect();
    let starts = (0..services.len()).map(|i| services.start(i, Duration::from_secs(60)));
    for started in futures_util::future::join_all(starts).await {
        started.expect("every instance starts");
    }
    println!(
        "chaos: {} s of chaos, {} instances, {} buyers, {} seats; {}, sandbox {}",
        profile.secs,
        profile.instances,
        profile.buyers,
        seat_ids.len(),
        store.describe(),
        sandbox.url
    );

    let tokens = tokens(
        &layer,
        profile.buyers,
        Duration::from_secs(profile.secs + 3_600),
    );
    let shop = Arc::new(Shop::new(
        services.urls.clone(),
        tokens,
        Seats::new(seat_ids),
        profile.seed,
    ));
    let started = Instant::now();
    let chaos_ends = started + Duration::from_secs(profile.secs);
    let monkey = Arc::new(Monkey::new(started));
    let mut controllers = vec![
        tokio::spawn(monkey.clone().faults(
            sandbox.url.clone(),
            FaultSchedule::new(profile.seed, PAYRAIL_TIMEOUT_MS),
            chaos_ends,
        )),
        tokio::spawn(monkey.clone().shop(
            shop_events.clone(),
            ShopSchedule::new(profile.seed, EVENTS_TIMEOUT_MS),
            chaos_ends,
        )),
        tokio::spawn(monkey.clone().kills(
            services.clone(),
            KillSchedule::new(profile.seed, services.len()),
            chaos_ends,
        )),
    ];
    let workers = store.workers().await;
    // The run's database on every node of a cluster, the coordinator first.
    let nodes: Vec<String> = std::iter::once(store.url())
        .chain(workers.iter().map(|worker| worker.url.clone()))
        .collect();
    if !workers.is_empty() {
        controllers.push(tokio::spawn(monkey.clone().crash_workers(
            workers.clone(),
            nodes.clone(),
            CrashSchedule::new(profile.seed, workers.len()),
            chaos_ends,
        )));
    }
    if let Some(postgres) = store.restartable() {
        controllers.push(tokio::spawn(
            monkey.clone().restart_database(
                postgres,
                (1..=profile.db_restarts)
                    .map(|i| {
                        started + Duration::from_secs(profile.secs * i / (profile.db_restarts + 1))
                    })
                    .collect(),
            ),
        ));
    }
    let buyers: Vec<_> = (0..profile.buyers)
        .map(|i| tokio::spawn(shop.clone().buyer(i, chaos_ends)))
        .collect();
    let mut clicks: Vec<Click> = Vec::new();
    for buyer in buyers {
        clicks.extend(buyer.await.expect("a buyer task"));
    }
    let sold_out = shop.stats.sold_out_at_ms.load(Ordering::Relaxed);
    if sold_out > 0 {
        // Not a failure of the service, but the chaos ran without traffic
        // from then on: say so loudly.
        monkey.say(&format!(
            "WARNING: the seats ran out at {:.1} s; raise the seat count",
            sold_out as f64 / 1000.0
        ));
    }
    for controller in controllers {
        controller.await.expect("a controller task");
    }

    // The end: no more faults or kills. Every click without an answer is
    // retried with its own key until it has one.
    monkey.set_faults(&sandbox.url, &json!({})).await;
    monkey.revive(&services).await;
    let unanswered = clicks.iter().filter(|c| c.final_answer().is_none()).count();
    monkey.say(&format!(
        "chaos over: {} clicks, {unanswered} without an answer yet; retrying them",
        clicks.len()
    ));
    shop.finish(&mut clicks, Instant::now() + FINISH_WITHIN)
        .await;
    let db = connect(&store.url()).await;
    let settle_by = Instant::now() + SETTLE_WITHIN;
    let pending_sql = "SELECT count(*) FROM orders WHERE status = 'payment_pending'";
    while count(&db, pending_sql).await > 0 && Instant::now() < settle_by {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let undelivered_sql = "SELECT count(*) FROM order_events WHERE delivered_at IS NULL";
    while count(&db, undelivered_sql).await > 0 && Instant::now() < settle_by {
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let received = shop_events.received();
    monkey.say(&format!(
        "the shop's event endpoint read {} deliveries of {} events, acknowledged {}",
        received.len(),
        count(&db, "SELECT count(*) FROM order_events").await,
        received.iter().filter(|r| r.acknowledged()).count()
    ));
    monkey.say("settled; checking");
    if !workers.is_empty() {
        // What the crashes left prepared and the recovery after each did not
        // finish yet (a commit in flight then) is finished now, as Citus's
        // maintenance daemon would within `citus.recover_2pc_interval`.
        let recovered = monkey.recover(&nodes).await;
        monkey.say(&format!(
            "recover_prepared_transactions() at the end: {recovered}"
        ));
    }

    let swept = shop
        .replay_all(&mut clicks, Instant::now() + REPLAY_WITHIN)
        .await;
    monkey.say(&format!("replayed {swept} answered clicks"));

    let ledger = sandbox::ledger(&reqwest::Client::new(), &sandbox.url).await;
    let orders = load::db_orders(&db).await;
    let mut violations = invariants::violations(&db, &ledger).await;
    violations.extend(load::check_clicks(&clicks, &orders, &ledger));
    // Every settled order's one event reached the shop (`violations` has
    // checked there is one, of its state), and everything the shop
    // acknowledged is such an event.
    for row in db
        .query(
            "SELECT order_id::text, event_id, attempts, last_error FROM order_events
             WHERE delivered_at IS NULL",
            &[],
        )
        .await
        .expect("undelivered events")
    {
        let (order_id, event_id, attempts, error): (String, String, i32, Option<String>) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        violations.push(format!(
            "event {event_id} of order {order_id} never delivered ({attempts} attempts, \
             last error {error:?})"
        ));
    }
    violations.extend(invariants::events_violations(&db, &received).await);
    violations.extend(
        shop.seen_violations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..),
    );
    for row in db
        .query(
            "SELECT order_id::text, user_id, idempotency_key, reconcile_attempts
             FROM orders WHERE status = 'payment_pending'",
            &[],
        )
        .await
        .expect("pending orders")
    {
        let (order_id, user, key, attempts): (String, String, String, i32) =
            (row.get(0), row.get(1), row.get(2), row.get(3));
        violations.push(format!(
            "order {order_id} of {user}/{key} still payment_pending after settling \
             ({attempts} reconcile attempts)"
        ));
    }
    // Every charge Payrail decided ended its order (by the service's own
    // answer, an event or reconciliation), whatever the events went through.
    let status_of: std::collections::HashMap<&str, &str> = orders
        .values()
        .map(|o| (o.order_id.as_str(), o.status.as_str()))
        .collect();
    for charge in &ledger {
        let reference = charge["reference"].as_str().unwrap_or_default();
        if status_of
            .get(reference)
            .is_none_or(|status| *status == "payment_pending")
        {
            violations.push(format!("decided charge {charge} did not settle its order"));
        }
    }
    if !workers.is_empty() {
        violations.extend(test_support::citus::dangling_prepared(&db, &store.url()).await);
    }
    violations.extend(
        monkey
            .problems
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..),
    );
    let (exits, panics) = services.troubles().await;
    violations.extend(exits);
    violations.extend(panics);
    violations.extend(cluster::panicked_lines(&sandbox.log, "payrail-sandbox"));

    print_report(
        &db,
        &ledger,
        &shop,
        &monkey,
        &clicks,
        &services,
        &violations,
    )
    .await;
    println!(
        "chaos: {} requests, {} orders, {} charges, {} kills, {} violations (seed {})",
        shop.stats.requests.load(Ordering::Relaxed),
        orders.len(),
        ledger.len(),
        monkey.kills.load(Ordering::Relaxed),
        violations.len(),
        profile.seed
    );
    violations
}

async fn print_report(
    db: &tokio_postgres::Client,
    ledger: &[Value],
    shop: &Shop,
    monkey: &Monkey,
    clicks: &[Click],
    services: &Services,
    violations: &[String],
) {
    let s = &shop.stats;
    let n = |c: &std::sync::atomic::AtomicU64| c.load(Ordering::Relaxed);
    let orders = count(db, "SELECT count(*) FROM orders").await;
    let paid = count(db, "SELECT count(*) FROM orders WHERE status = 'paid'").await;
    let declined = count(db, "SELECT count(*) FROM orders WHERE status = 'declined'").await;
    let reconciled = count(
        db,
        "SELECT count(*) FROM orders WHERE reconcile_attempts > 0",
    )
    .await;
    let keys = count(db, "SELECT count(*) FROM idempotency_keys").await;
    let succeeded = ledger.iter().filter(|c| c["status"] == "succeeded").count();
    let retried_charges = ledger
        .iter()
        .filter(|c| c["requests"].as_u64().unwrap_or(0) > 1)
        .count();
    let sends: usize = clicks.iter().map(|c| c.answers.len()).sum();
    let five_xx = n(&s.internal_500) + n(&s.unavailable_503) + n(&s.timeout_504) + n(&s.other_5xx);
    let rows: Vec<(&str, String)> = vec![
        (
            "requests",
            format!(
                "{} (POST /orders {}, POST /holds {}, GET {})",
                n(&s.requests),
                n(&s.order_posts),
                n(&s.hold_posts),
                n(&s.reads)
            ),
        ),
        (
            "clicks (keys)",
            format!(
                "{} ({} answers recorded; duplicate bursts {}, declined first {}, borrowed keys {})",
                clicks.len(),
                sends,
                n(&s.duplicate_bursts),
                n(&s.declined_first),
                n(&s.borrowed_keys)
            ),
        ),
        (
            "holds",
            format!(
                "{} (409 seat-unavailable {}; hot-seat races {}; seats handed out {} of {})",
                n(&s.holds),
                n(&s.seat_unavailable),
                n(&s.hot_seat_races),
                shop.seats.handed_out(),
                shop.seats.len()
            ),
        ),
        (
            "orders",
            format!("{orders} (paid {paid}, declined {declined}; touched by reconciliation {reconciled}); key rows {keys}"),
        ),
        (
            "charges",
            format!(
                "{} (succeeded {succeeded}, declined {}; asked more than once {retried_charges})",
                ledger.len(),
                ledger.len() - succeeded
            ),
        ),
        ("201", n(&s.created).to_string()),
        ("402", n(&s.declined).to_string()),
        (
            "replays",
            format!(
                "{} (late replays asked {}, final sweep {}; read-backs/cross reads {}/{})",
                n(&s.replays),
                n(&s.late_replays),
                n(&s.swept),
                n(&s.reads) - n(&s.cross_reads),
                n(&s.cross_reads)
            ),
        ),
        (
            "409s",
            format!(
                "{} request-in-progress, {} seat-unavailable (holds), {} other",
                n(&s.in_progress),
                n(&s.seat_unavailable),
                n(&s.conflicts_other) - n(&s.seat_unavailable)
            ),
        ),
        (
            "422s",
            format!(
                "{} idempotency-key-reused (probes {}), {} other",
                n(&s.key_reused),
                n(&s.reuse_probes),
                n(&s.unprocessable_other)
            ),
        ),
        (
            "5xx",
            format!(
                "{five_xx} (500 {}, 503 {}, 504 {}, other {})",
                n(&s.internal_500),
                n(&s.unavailable_503),
                n(&s.timeout_504),
                n(&s.other_5xx)
            ),
        ),
        (
            "timeouts",
            format!(
                "{} client timeouts (5 s), {} connection errors",
                n(&s.client_timeouts),
                n(&s.connection_errors)
            ),
        ),
        ("kills", n(&monkey.kills).to_string()),
        ("db restarts", n(&monkey.db_restarts).to_string()),
        (
            "worker crashes",
            format!(
                "{} ({} of a worker coordinating a commit between its phases; prepared \
                 transactions found on the way back {}, recovered {})",
                n(&monkey.worker_crashes),
                n(&monkey.caught),
                n(&monkey.in_doubt),
                n(&monkey.recovered)
            ),
        ),
        ("fault changes", n(&monkey.fault_changes).to_string()),
        ("violations", violations.len().to_string()),
    ];
    println!("\n{:-<78}", "");
    for (name, value) in rows {
        println!("  {name:<14} {value}");
    }
    println!("{:-<78}", "");
    for (i, path) in services.log_paths().await.iter().enumerate() {
        let errors = std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains("ERROR"))
            .count();
        println!("  instance {i} logged {errors} ERROR lines (5xx answers, mostly 503)");
    }
    for timeout in shop
        .timed_out
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .take(20)
    {
        println!("  client timeout: {timeout}");
    }
    for violation in violations.iter().take(50) {
        println!("  VIOLATION: {violation}");
    }
}
