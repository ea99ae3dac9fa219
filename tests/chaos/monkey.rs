//! The controller of the chaos: Payrail faults that change every few
//! seconds, a shop's event endpoint that fails, answers late and drops
//! connections, SIGKILLed service processes restarted on their own ports, and
//! one restart of PostgreSQL in the middle; on a Citus cluster, a worker's
//! PostgreSQL SIGKILLed and started again instead. Everything it does is
//! logged with the time since the start, and counted.
//!
//! What to break and for how long comes from schedules, each drawn from a
//! PRNG stream of the run's seed ([`FaultSchedule`], [`ShopSchedule`],
//! [`KillSchedule`], on Citus [`CrashSchedule`]): the same seed gives the
//! same sequence of fault profiles, of the shop's moods, of kills and of crashes (which one, how long it stays down, how
//! long until the next). The database restarts are evenly spread, with no
//! randomness.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use test_support::citus::Worker;
use test_support::in_doubt::{self, InDoubt};
use test_support::postgres::Postgres;
use test_support::receiver::{Mode, Receiver};
use test_support::{sandbox, Rng};

use crate::cluster::Services;

/// The PRNG streams of the run's seed that the schedules draw from.
const FAULT_STREAM: u64 = 1;
const KILL_STREAM: u64 = 2;
const CRASH_STREAM: u64 = 3;
const SHOP_STREAM: u64 = 4;

/// One fault profile of the sandbox, and how long it stays on.
pub struct FaultStep {
    pub name: &'static str,
    pub faults: Value,
    pub lasts: Duration,
}

/// The endless sequence of fault profiles of a seed: one in three quiet,
/// the others latency past the service's Payrail timeout, errors, dropped
/// answers after the charge, or both; each for 3-6 s. Every profile, quiet
/// ones included, also makes Payrail's events late (up to 1.5 s), doubled
/// and lost on the way back (up to 40 % each), so that they race the
/// service's own answers, reconciliation and each other.
pub struct FaultSchedule {
    rng: Rng,
    timeout_ms: u64,
}

impl FaultSchedule {
    pub fn new(seed: u64, timeout_ms: u64) -> Self {
        Self {
            rng: Rng::stream(seed, FAULT_STREAM),
            timeout_ms,
        }
    }
}

impl Iterator for FaultSchedule {
    type Item = FaultStep;

    fn next(&mut self) -> Option<FaultStep> {
        let rng = &mut self.rng;
        let rate = |rng: &mut Rng| (rng.range(30, 100) as f64) / 100.0;
        let (name, faults) = match rng.pick(6) {
            0 | 1 => ("quiet", json!({})),
            2 => (
                "latency",
                json!({"latency_ms": self.timeout_ms + rng.range(200, 800)}),
            ),
            3 => ("errors", json!({"error_rate": rate(rng)})),
            4 => ("drops", json!({"drop_after_charge_rate": rate(rng)})),
            _ => (
                "errors+drops",
                json!({
                    "error_rate": rate(rng) / 2.0,
                    "drop_after_charge_rate": rate(rng) / 2.0,
                }),
            ),
        };
        let mut faults = faults;
        faults["webhook_delay_ms"] = json!(rng.range(0, 1_500));
        faults["webhook_duplicate_rate"] = json!(rng.range(0, 40) as f64 / 100.0);
        faults["webhook_fail_rate"] = json!(rng.range(0, 40) as f64 / 100.0);
        let lasts = Duration::from_millis(rng.range(3_000, 6_000));
        Some(FaultStep {
            name,
            faults,
            lasts,
        })
    }
}

/// The endless sequence of the shop's event endpoint's moods of a seed:
/// half the time it takes events at once; else it answers 503, answers
/// 200 after the service's delivery timeout (`timeout_ms`), or drops the
/// connection; each for 2-5 s.
pub struct ShopSchedule {
    rng: Rng,
    timeout_ms: u64,
}

impl ShopSchedule {
    pub fn new(seed: u64, timeout_ms: u64) -> Self {
        Self {
            rng: Rng::stream(seed, SHOP_STREAM),
            timeout_ms,
        }
    }
}

impl Iterator for ShopSchedule {
    type Item = (Mode, Duration);

    fn next(&mut self) -> Option<(Mode, Duration)> {
        let rng = &mut self.rng;
        let mode = match rng.pick(6) {
            0..=2 => Mode::Accept,
            3 => Mode::Answer(503),
            4 => Mode::Slow(Duration::from_millis(self.timeout_ms + rng.range(100, 600))),
            _ => Mode::Crash,
        };
        Some((mode, Duration::from_millis(rng.range(2_000, 5_000))))
    }
}

/// One kill: after `wait`, SIGKILL `instance`, start it again after `down`.
pub struct KillStep {
    pub wait: Duration,
    pub instance: usize,
    pub down: Duration,
}

/// The endless sequence of kills of a seed: the first after 8-15 s, then
/// one every 10-20 s after the last instance is back, each down for
/// 0.3-2 s.
pub struct KillSchedule {
    rng: Rng,
    instances: usize,
    first: bool,
}

impl KillSchedule {
    pub fn new(seed: u64, instances: usize) -> Self {
        Self {
            rng: Rng::stream(seed, KILL_STREAM),
            instances,
            first: true,
        }
    }
}

impl Iterator for KillSchedule {
    type Item = KillStep;

    fn next(&mut self) -> Option<KillStep> {
        let wait = if std::mem::take(&mut self.first) {
            self.rng.range(8_000, 15_000)
        } else {
            self.rng.range(10_000, 20_000)
        };
        Some(KillStep {
            wait: Duration::from_millis(wait),
            instance: self.rng.pick(self.instances),
            down: Duration::from_millis(self.rng.range(300, 2_000)),
        })
    }
}

/// One crash: after `wait`, SIGKILL a worker's PostgreSQL, start it again
/// after `down`. An `aimed` crash is of the worker coordinating a commit
/// caught between its two phases (`test_support::in_doubt`); `worker` is
/// the one crashed when none is caught.
pub struct CrashStep {
    pub wait: Duration,
    pub aimed: bool,
    pub worker: usize,
    pub down: Duration,
}

/// The endless sequence of a cluster's worker crashes of a seed: the first
/// after 5-10 s, then one every 6-12 s after the worker is back, each down
/// for 0.2-2 s. Under the load some click of that worker is always between
/// the prepare and the commit of a two-phase transaction, at whatever
/// moment the crash comes; every other crash, the first among them, waits
/// for such a moment and crashes the worker coordinating the commit.
pub struct CrashSchedule {
    rng: Rng,
    workers: usize,
    steps: u64,
}

impl CrashSchedule {
    pub fn new(seed: u64, workers: usize) -> Self {
        Self {
            rng: Rng::stream(seed, CRASH_STREAM),
            workers,
            steps: 0,
        }
    }
}

impl Iterator for CrashSchedule {
    type Item = CrashStep;

    fn next(&mut self) -> Option<CrashStep> {
        let wait = if self.steps == 0 {
            self.rng.range(5_000, 10_000)
        } else {
            self.rng.range(6_000, 12_000)
        };
        self.steps += 1;
        Some(CrashStep {
            wait: Duration::from_millis(wait),
            aimed: self.steps % 2 == 1,
            worker: self.rng.pick(self.workers),
            down: Duration::from_millis(self.rng.range(200, 2_000)),
        })
    }
}

/// The first steps of both schedules of `seed`, as the monkey will log
/// them (a replay with the same seed prints the same).
pub fn preview(seed: u64, timeout_ms: u64, instances: usize, steps: usize) -> [String; 2] {
    let faults: Vec<String> = FaultSchedule::new(seed, timeout_ms)
        .take(steps)
        .map(|step| format!("{} {} for {:.1?}", step.name, step.faults, step.lasts))
        .collect();
    let kills: Vec<String> = KillSchedule::new(seed, instances)
        .take(steps)
        .map(|step| {
            format!(
                "after {:.1?} instance {} down {:.1?}",
                step.wait, step.instance, step.down
            )
        })
        .collect();
    [faults.join("; "), kills.join("; ")]
}

/// How long a restarted instance may take to be healthy again.
const RESTART_WITHIN: Duration = Duration::from_secs(60);

/// How long an aimed crash watches for a commit between its phases.
const AIM_WITHIN: Duration = Duration::from_secs(10);

/// How long a crashed worker's maintenance daemon may take, once the
/// worker is back, to finish the commit it was coordinating: it runs its
/// recovery when it starts, then every `citus.recover_2pc_interval` (60 s).
const DAEMON_WITHIN: Duration = Duration::from_secs(70);

pub struct Monkey {
    started: Instant,
    /// For the sandbox's fault switch. No idle connection is kept: the
    /// sandbox closes one after 5 s, and a switch every 3-6 s would now and
    /// then write into one it is closing.
    control: reqwest::Client,
    pub kills: AtomicU64,
    pub db_restarts: AtomicU64,
    pub worker_crashes: AtomicU64,
    /// Crashes of a worker coordinating a commit caught between its phases.
    pub caught: AtomicU64,
    /// Prepared transactions a crashed worker still had when it was back:
    /// clicks whose commit the crash cut between its two phases.
    pub in_doubt: AtomicU64,
    /// What Citus's `recover_prepared_transactions()` finished (committed
    /// or rolled back) on every node after the crashes.
    pub recovered: AtomicU64,
    pub fault_changes: AtomicU64,
    /// Things the service should have survived and did not.
    pub problems: Mutex<Vec<String>>,
}

impl Monkey {
    pub fn new(started: Instant) -> Self {
        Self {
            started,
            control: reqwest::Client::builder()
                .pool_max_idle_per_host(0)
                .build()
                .expect("an HTTP client"),
            kills: AtomicU64::new(0),
            db_restarts: AtomicU64::new(0),
            worker_crashes: AtomicU64::new(0),
            caught: AtomicU64::new(0),
            in_doubt: AtomicU64::new(0),
            recovered: AtomicU64::new(0),
            fault_changes: AtomicU64::new(0),
            problems: Mutex::new(Vec::new()),
        }
    }

    pub fn say(&self, what: &str) {
        println!(
            "chaos [{:>6.1}s] {what}",
            self.started.elapsed().as_secs_f64()
        );
    }

    fn problem(&self, what: String) {
        self.say(&format!("PROBLEM: {what}"));
        self.problems
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(what);
    }

    /// Sets the sandbox's faults; an error here is the harness's, so it panics.
    pub async fn set_faults(&self, sandbox: &str, faults: &Value) {
        sandbox::set_faults(&self.control, sandbox, faults).await;
    }

    /// The fault profiles of `schedule`, each for its time, until `until`;
    /// then none.
    pub async fn faults(self: Arc<Self>, sandbox: String, schedule: FaultSchedule, until: Instant) {
        for step in schedule {
            if Instant::now() >= until {
                break;
            }
            self.set_faults(&sandbox, &step.faults).await;
            self.fault_changes.fetch_add(1, Ordering::Relaxed);
            self.say(&format!(
                "payrail faults: {} {} for {:.1?}",
                step.name, step.faults, step.lasts
            ));
            sleep_until_or(until, step.lasts).await;
        }
        self.set_faults(&sandbox, &json!({})).await;
        self.say("payrail faults: off");
    }

    /// The shop's moods of `schedule`, each for its time, until `until`;
    /// then it takes every event.
    pub async fn shop(
        self: Arc<Self>,
        shop: Arc<Receiver>,
        schedule: ShopSchedule,
        until: Instant,
    ) {
        for (mode, lasts) in schedule {
            if Instant::now() >= until {
                break;
            }
            shop.set(mode);
            self.say(&format!("shop's event endpoint: {mode:?} for {lasts:.1?}"));
            sleep_until_or(until, lasts).await;
        }
        shop.set(Mode::Accept);
        self.say("shop's event endpoint: accepting");
    }

    /// The kills of `schedule` until 5 s before `until`: SIGKILL the
    /// instance and start it again on its port; instances that died by
    /// themselves are noted and restarted first.
    pub async fn kills(
        self: Arc<Self>,
        services: Arc<Services>,
        schedule: KillSchedule,
        until: Instant,
    ) {
        for step in schedule {
            sleep_until_or(until, step.wait).await;
            if Instant::now() + Duration::from_secs(5) >= until {
                break;
            }
            self.revive(&services).await;
            let i = step.instance;
            services.kill(i).await;
            self.kills.fetch_add(1, Ordering::Relaxed);
            self.say(&format!("SIGKILL instance {i} (down {:.1?})", step.down));
            tokio::time::sleep(step.down).await;
            match services.start(i, RESTART_WITHIN).await {
                Ok(took) => self.say(&format!("instance {i} healthy again after {took:.1?}")),
                Err(error) => self.problem(error),
            }
        }
    }

    /// Restarts every instance that is not running (noting those that
    /// exited without being killed).
    pub async fn revive(&self, services: &Services) {
        for i in services.check_exits().await {
            self.say(&format!("instance {i} is down: starting it"));
            if let Err(error) = services.start(i, RESTART_WITHIN).await {
                self.problem(error);
            }
        }
    }

    /// `pg_ctl restart -m fast` at each of `at`.
    pub async fn restart_database(self: Arc<Self>, postgres: Arc<Postgres>, at: Vec<Instant>) {
        for at in at {
            tokio::time::sleep_until(at.into()).await;
            self.say("PostgreSQL: restart -m fast");
            let started = Instant::now();
            let pg = postgres.clone();
            let restarted = tokio::task::spawn_blocking(move || pg.restart())
                .await
                .expect("the restart task");
            self.db_restarts.fetch_add(1, Ordering::Relaxed);
            match restarted {
                Ok(()) => self.say(&format!("PostgreSQL: back after {:.1?}", started.elapsed())),
                Err(error) => self.problem(format!("PostgreSQL restart: {error}")),
            }
        }
    }
}

impl Monkey {
    /// The crashes of `schedule` until 5 s before `until`: SIGKILL a
    /// worker's PostgreSQL, start it again after the step's time down,
    /// count the prepared transactions it came back with, and have every
    /// node (`nodes`: the run's database on each) finish those it started:
    /// a click's two-phase commit is coordinated by the node its statement
    /// reached, the coordinator or a buyer's worker. An aimed crash's
    /// commit, caught between its phases, must be finished by the crashed
    /// worker's own maintenance daemon before anything else is asked to.
    pub async fn crash_workers(
        self: Arc<Self>,
        workers: Vec<Worker>,
        nodes: Vec<String>,
        schedule: CrashSchedule,
        until: Instant,
    ) {
        let mut aims = 0;
        for step in schedule {
            sleep_until_or(until, step.wait).await;
            if Instant::now() + Duration::from_secs(5) >= until {
                break;
            }
            let mut caught = None;
            let aimed_at = Instant::now();
            if step.aimed {
                aims += 1;
                match in_doubt::catch(&nodes, &workers, aimed_at + AIM_WITHIN).await {
                    Ok(found) => caught = found,
                    Err(error) => self.problem(format!("watching for a commit in doubt: {error}")),
                }
                if caught.is_none() {
                    self.say(&format!(
                        "no commit caught between its phases within {AIM_WITHIN:?}"
                    ));
                }
            }
            let worker = workers[caught.as_ref().map_or(step.worker, |c| c.worker)].clone();
            let port = worker.port;
            let crashed = {
                let worker = worker.clone();
                tokio::task::spawn_blocking(move || worker.crash())
                    .await
                    .expect("the crash task")
            };
            if let Err(error) = crashed {
                self.problem(format!("crashing the worker on port {port}: {error}"));
                continue;
            }
            self.worker_crashes.fetch_add(1, Ordering::Relaxed);
            match &caught {
                Some(doubt) => {
                    self.caught.fetch_add(1, Ordering::Relaxed);
                    self.say(&format!(
                        "SIGKILL the worker's PostgreSQL on port {port}, coordinating {} \
                         prepared on {}, caught after {:.1?} of watching (down {:.1?})",
                        doubt.gid,
                        doubt.participant,
                        aimed_at.elapsed(),
                        step.down
                    ));
                }
                None => self.say(&format!(
                    "SIGKILL the worker's PostgreSQL on port {port} (down {:.1?})",
                    step.down
                )),
            }
            tokio::time::sleep(step.down).await;
            let started = Instant::now();
            let back = {
                let worker = worker.clone();
                tokio::task::spawn_blocking(move || worker.start())
                    .await
                    .expect("the start task")
            };
            if let Err(error) = back {
                self.problem(format!("restarting the worker on port {port}: {error}"));
                continue;
            }
            if let Some(doubt) = &caught {
                self.finished_by_its_daemon(doubt, port).await;
            }
            let in_doubt = match number(
                &worker.url,
                "SELECT count(*) FROM pg_prepared_xacts WHERE database = current_database()",
            )
            .await
            {
                Ok(n) => n,
                Err(error) => {
                    self.problem(format!(
                        "the worker on port {port} after its restart: {error}"
                    ));
                    continue;
                }
            };
            self.in_doubt.fetch_add(in_doubt, Ordering::Relaxed);
            let recovered = self.recover(&nodes).await;
            self.say(&format!(
                "worker on port {port} back after {:.1?} with {in_doubt} prepared \
                 transactions; the nodes recovered {recovered}",
                started.elapsed()
            ));
        }
        if aims > 0 && self.caught.load(Ordering::Relaxed) == 0 {
            self.problem(format!(
                "none of {aims} aimed crashes caught a commit between its phases"
            ));
        }
    }

    /// Waits until the part of `doubt` prepared on its participant is
    /// committed or rolled back, which only the maintenance daemon of the
    /// crashed worker (on `port`) can decide: it alone holds the record of
    /// whether the commit's coordinator committed.
    async fn finished_by_its_daemon(&self, doubt: &InDoubt, port: u16) {
        let started = Instant::now();
        loop {
            match number(
                &doubt.participant,
                &format!(
                    "SELECT count(*) FROM pg_prepared_xacts WHERE gid = '{}'",
                    doubt.gid
                ),
            )
            .await
            {
                Ok(0) => break,
                Ok(_) if started.elapsed() < DAEMON_WITHIN => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Ok(_) => {
                    return self.problem(format!(
                        "{} still prepared on {} {DAEMON_WITHIN:?} after the worker on port \
                         {port} was back",
                        doubt.gid, doubt.participant
                    ));
                }
                Err(error) => return self.problem(format!("{}: {error}", doubt.participant)),
            }
        }
        self.say(&format!(
            "{} finished by the maintenance daemon of the worker on port {port} after {:.1?}",
            doubt.gid,
            started.elapsed()
        ));
    }

    /// Citus's `recover_prepared_transactions()` on each of `nodes`: the
    /// prepared transactions of the others that each finished, in all.
    pub async fn recover(&self, nodes: &[String]) -> u64 {
        let mut recovered = 0;
        for node in nodes {
            match number(node, "SELECT recover_prepared_transactions()::bigint").await {
                Ok(n) => recovered += n,
                Err(error) => self.problem(format!("recover_prepared_transactions(): {error}")),
            }
        }
        self.recovered.fetch_add(recovered, Ordering::Relaxed);
        recovered
    }
}

/// The one number `sql` returns on the database `url` names, on a
/// connection of its own.
async fn number(url: &str, sql: &str) -> Result<u64, String> {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .map_err(|e| format!("{url}: {e}"))?;
    tokio::spawn(connection);
    let row = client
        .query_one(sql, &[])
        .await
        .map_err(|e| format!("{sql}: {e}"))?;
    Ok(row.get::<_, i64>(0) as u64)
}

/// Sleeps `wait`, but not past `until`.
async fn sleep_until_or(until: Instant, wait: Duration) {
    let now = Instant::now();
    tokio::time::sleep(wait.min(until.saturating_duration_since(now))).await;
}
