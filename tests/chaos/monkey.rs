//! The controller of the chaos: Payrail faults that change every few
//! seconds, SIGKILLed service processes restarted on their own ports, and
//! one restart of PostgreSQL in the middle. Everything it does is logged
//! with the time since the start, and counted.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::cluster::{Postgres, Services};
use crate::load::Rng;

/// How long a restarted instance may take to be healthy again.
const RESTART_WITHIN: Duration = Duration::from_secs(60);

pub struct Monkey {
    started: Instant,
    /// For the sandbox's fault switch. No idle connection is kept: the
    /// sandbox closes one after 5 s, and a switch every 3-6 s would now and
    /// then write into one it is closing.
    control: reqwest::Client,
    pub kills: AtomicU64,
    pub db_restarts: AtomicU64,
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
        let response = self
            .control
            .post(format!("{sandbox}/v1/sandbox/faults"))
            .json(faults)
            .send()
            .await
            .expect("POST /v1/sandbox/faults");
        assert!(
            response.status().is_success(),
            "setting faults {faults}: {}",
            response.status()
        );
    }

    /// A new fault profile every 3-6 s until `until`, then none.
    pub async fn faults(self: Arc<Self>, sandbox: String, timeout_ms: u64, until: Instant) {
        let mut rng = Rng::seeded();
        while Instant::now() < until {
            let rate = |rng: &mut Rng| (rng.range(30, 100) as f64) / 100.0;
            let (name, faults) = match rng.pick(6) {
                0 | 1 => ("quiet", json!({})),
                2 => (
                    "latency",
                    json!({"latency_ms": timeout_ms + rng.range(200, 800)}),
                ),
                3 => ("errors", json!({"error_rate": rate(&mut rng)})),
                4 => ("drops", json!({"drop_after_charge_rate": rate(&mut rng)})),
                _ => (
                    "errors+drops",
                    json!({
                        "error_rate": rate(&mut rng) / 2.0,
                        "drop_after_charge_rate": rate(&mut rng) / 2.0,
                    }),
                ),
            };
            self.set_faults(&sandbox, &faults).await;
            self.fault_changes.fetch_add(1, Ordering::Relaxed);
            self.say(&format!("payrail faults: {name} {faults}"));
            sleep_until_or(until, Duration::from_millis(rng.range(3_000, 6_000))).await;
        }
        self.set_faults(&sandbox, &json!({})).await;
        self.say("payrail faults: off");
    }

    /// SIGKILL a random instance every 10-20 s and start it again on its
    /// port; instances that died by themselves are noted and restarted.
    pub async fn kills(self: Arc<Self>, services: Arc<Services>, until: Instant) {
        let mut rng = Rng::seeded();
        sleep_until_or(until, Duration::from_millis(rng.range(8_000, 15_000))).await;
        while Instant::now() + Duration::from_secs(5) < until {
            self.revive(&services).await;
            let i = rng.pick(services.len());
            services.kill(i).await;
            self.kills.fetch_add(1, Ordering::Relaxed);
            self.say(&format!("SIGKILL instance {i}"));
            tokio::time::sleep(Duration::from_millis(rng.range(300, 2_000))).await;
            match services.start(i, RESTART_WITHIN).await {
                Ok(took) => self.say(&format!("instance {i} healthy again after {took:.1?}")),
                Err(error) => self.problem(error),
            }
            sleep_until_or(until, Duration::from_millis(rng.range(10_000, 20_000))).await;
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

/// Sleeps `wait`, but not past `until`.
async fn sleep_until_or(until: Instant, wait: Duration) {
    let now = Instant::now();
    tokio::time::sleep(wait.min(until.saturating_duration_since(now))).await;
}
