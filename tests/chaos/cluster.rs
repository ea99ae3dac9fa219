//! What the chaos run owns and tears down: a scratch directory, a throwaway
//! PostgreSQL server in it (or a database of a Citus cluster), one
//! `payrail-sandbox` process and the
//! `stagedoor-checkout serve` processes (all of `test_support`). Every piece
//! stops (and the directory goes) when it is dropped, so a failing run
//! cleans up as well as a passing one; a run that was killed is cleaned up
//! after by the next one. Set `CHAOS_KEEP=1` to keep the directory (logs)
//! for a post-mortem.

use std::fs;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use secrecy::ExposeSecret;
use stagedoor_checkout::config::PayrailSettings;
use test_support::citus::Worker;
use test_support::db::TestDatabase;
use test_support::postgres::Postgres;
use test_support::process::{free_port, Service, ServiceProcess, SpawnError};
use test_support::scratch::ScratchDir;
use tokio::sync::Mutex;

/// The scratch directory of a run, kept when `CHAOS_KEEP` is set.
pub fn scratch() -> ScratchDir {
    let mut scratch = ScratchDir::new("stagedoor-chaos-").expect("create the scratch directory");
    scratch.keep(std::env::var_os("CHAOS_KEEP").is_some());
    scratch
}

/// Where the run keeps its rows: a throwaway PostgreSQL of its own, which
/// the run restarts; or on the Citus profile (`STAGEDOOR_TEST_CITUS=1`) a
/// database of the cluster `DATABASE_URL` names, whose coordinator is not
/// the run's to restart (its workers it crashes).
pub enum Store {
    Own(Arc<Postgres>),
    Citus(Arc<TestDatabase>),
}

impl Store {
    pub async fn new(scratch: &Path) -> Self {
        if test_support::citus::enabled() {
            Store::Citus(TestDatabase::create().await)
        } else {
            Store::Own(Arc::new(postgres(scratch)))
        }
    }

    /// The service's database.
    pub fn url(&self) -> String {
        match self {
            Store::Own(postgres) => postgres.url("stagedoor"),
            Store::Citus(db) => db.url.clone(),
        }
    }

    /// A database that exists before the run makes its own.
    pub fn admin_url(&self) -> String {
        match self {
            Store::Own(postgres) => postgres.url("postgres"),
            Store::Citus(db) => db.url.clone(),
        }
    }

    /// The cluster's workers, which the run crashes (none off Citus).
    pub async fn workers(&self) -> Vec<Worker> {
        match self {
            Store::Own(_) => Vec::new(),
            Store::Citus(db) => Worker::all(&db.client().await, &db.url).await,
        }
    }

    /// The server to restart, when the run may.
    pub fn restartable(&self) -> Option<Arc<Postgres>> {
        match self {
            Store::Own(postgres) => Some(postgres.clone()),
            Store::Citus(_) => None,
        }
    }

    /// Gives the migrated tables their layout (on Citus: distributed).
    pub async fn lay_out(&self) {
        if let Store::Citus(db) = self {
            test_support::citus::distribute(&db.client().await).await;
        }
    }

    pub fn describe(&self) -> String {
        match self {
            Store::Own(postgres) => format!("PostgreSQL on port {}", postgres.port()),
            Store::Citus(db) => format!("Citus database {} (DATABASE_URL's cluster)", db.name),
        }
    }
}

/// The throwaway PostgreSQL of the run. Durability is not under test (the
/// server is stopped cleanly or thrown away), so it skips the fsyncs the
/// two cores would pay for.
fn postgres(scratch: &Path) -> Postgres {
    Postgres::start_in(
        scratch,
        &[
            "max_connections=200",
            "fsync=off",
            "synchronous_commit=off",
            "full_page_writes=off",
        ],
    )
    .unwrap_or_else(|error| panic!("a throwaway PostgreSQL: {error}"))
}

/// The `payrail-sandbox` binary, a crate of its own: built beside the
/// service's (`cargo build --release -p payrail-sandbox`, as `.ci/run` does).
fn sandbox_binary() -> PathBuf {
    let service = Path::new(env!("CARGO_BIN_EXE_stagedoor-checkout"));
    let sandbox = service.with_file_name("payrail-sandbox");
    assert!(
        sandbox.exists(),
        "{} is missing: run `cargo build --release -p payrail-sandbox` first",
        sandbox.display()
    );
    sandbox
}

/// The stand-alone `payrail-sandbox`, killed on drop.
pub struct SandboxProcess {
    pub url: String,
    pub log: PathBuf,
    _process: ServiceProcess,
}

impl SandboxProcess {
    /// On `port`, demanding the services' API key and signing the events it
    /// sends to `webhook_url` with their webhook secret (`payrail.api_key`
    /// and `payrail.webhook_secret` of `payrail`).
    pub async fn spawn(
        scratch: &Path,
        port: u16,
        webhook_url: &str,
        payrail: &PayrailSettings,
    ) -> Self {
        let log = scratch.join("payrail-sandbox.log");
        let process = Service::new(sandbox_binary(), format!("http://127.0.0.1:{port}"))
            .args(["--port", &port.to_string()])
            .args(["--api-key", payrail.api_key.expose_secret()])
            .args([
                "--webhook-url",
                webhook_url,
                "--webhook-secret",
                payrail.webhook_secret.expose_secret(),
            ])
            .env("RUST_LOG", "warn")
            .log_to(&log)
            .note_pid_in(scratch)
            .spawn_or_panic(Duration::from_secs(30))
            .await;
        Self {
            url: process.url().to_owned(),
            log,
            _process: process,
        }
    }
}

/// One `serve` process slot: what it runs (on a fixed port), the live
/// process (if any), whose log every generation appends to.
struct Slot {
    service: Service,
    process: Option<ServiceProcess>,
    log: PathBuf,
    /// Exits we did not cause (the process died by itself).
    unexpected_exits: Vec<String>,
}

/// The service instances: started, killed and restarted on their own ports.
pub struct Services {
    env: Vec<(String, String)>,
    slots: Vec<Mutex<Slot>>,
    pub urls: Vec<String>,
}

impl Services {
    pub fn new(scratch: &Path, count: usize, env: Vec<(String, String)>) -> Self {
        let slots: Vec<Slot> = (0..count)
            .map(|i| {
                let port = free_port();
                let log = scratch.join(format!("service-{i}.stderr"));
                let service = Service::new(
                    env!("CARGO_BIN_EXE_stagedoor-checkout"),
                    format!("http://127.0.0.1:{port}"),
                )
                .arg("serve")
                .envs(env.iter().cloned())
                .env("STAGEDOOR__SERVER__PORT", port.to_string())
                .log_to(&log)
                .note_pid_in(scratch);
                Slot {
                    service,
                    process: None,
                    log,
                    unexpected_exits: Vec::new(),
                }
            })
            .collect();
        let urls = slots
            .iter()
            .map(|slot| slot.service.url().to_owned())
            .collect();
        Self {
            env,
            slots: slots.into_iter().map(Mutex::new).collect(),
            urls,
        }
    }

    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// `stagedoor-checkout <args>` with the services' environment (admin
    /// commands such as `seed`); returns stdout.
    pub async fn admin(&self, args: &[&str]) -> String {
        let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_stagedoor-checkout"))
            .args(args)
            .envs(self.env.iter().cloned())
            .stdin(std::process::Stdio::null())
            .output()
            .await
            .expect("run stagedoor-checkout");
        assert!(
            out.status.success(),
            "stagedoor-checkout {args:?}: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Starts instance `i` on its port and waits until `/healthz` answers.
    /// A process that exits at start (the database is down for its
    /// migrations) is started again; all within `within`.
    pub async fn start(&self, i: usize, within: Duration) -> Result<Duration, String> {
        let started = Instant::now();
        let mut slot = self.slots[i].lock().await;
        loop {
            let left = within.saturating_sub(started.elapsed());
            let running = slot
                .process
                .as_mut()
                .is_some_and(|process| process.try_exit_status().is_none());
            if !running {
                slot.process = Some(slot.service.start().map_err(|e| e.to_string())?);
            }
            let process = slot.process.as_mut().expect("just started");
            match process.wait_healthy(left).await {
                Ok(()) => return Ok(started.elapsed()),
                // It gave up (database down?): start it again.
                Err(SpawnError::Exited { .. }) if started.elapsed() < within => {
                    tokio::time::sleep(Duration::from_millis(300)).await;
                }
                Err(error) => {
                    return Err(format!(
                        "instance {i} ({}) not healthy within {within:?}: {error}",
                        self.urls[i]
                    ))
                }
            }
        }
    }

    /// SIGKILL, and wait until the process is gone.
    pub async fn kill(&self, i: usize) {
        let mut slot = self.slots[i].lock().await;
        if let Some(mut process) = slot.process.take() {
            process.kill().await;
        }
    }

    /// Notes every instance that exited without being killed by us, and
    /// returns the indexes of those not running.
    pub async fn check_exits(&self) -> Vec<usize> {
        let mut down = Vec::new();
        for (i, slot) in self.slots.iter().enumerate() {
            let mut slot = slot.lock().await;
            let exited = match slot.process.as_mut() {
                Some(process) => process.try_exit_status(),
                None => {
                    down.push(i);
                    continue;
                }
            };
            if let Some(status) = exited {
                slot.unexpected_exits
                    .push(format!("instance {i} exited by itself: {status}"));
                slot.process = None;
                down.push(i);
            }
        }
        down
    }

    /// Unexpected exits so far, and every line of the services' logs that
    /// says a thread panicked.
    pub async fn troubles(&self) -> (Vec<String>, Vec<String>) {
        let mut exits = Vec::new();
        let mut panics = Vec::new();
        for (i, slot) in self.slots.iter().enumerate() {
            let slot = slot.lock().await;
            exits.extend(slot.unexpected_exits.iter().cloned());
            panics.extend(panicked_lines(&slot.log, &format!("instance {i}")));
        }
        (exits, panics)
    }

    pub async fn log_paths(&self) -> Vec<PathBuf> {
        let mut paths = Vec::new();
        for slot in &self.slots {
            paths.push(slot.lock().await.log.clone());
        }
        paths
    }
}

/// Lines of a log that report a panic, each prefixed with `who`.
pub fn panicked_lines(path: &Path, who: &str) -> Vec<String> {
    fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|line| line.contains("panicked"))
        .map(|line| format!("{who}: {line}"))
        .collect()
}
