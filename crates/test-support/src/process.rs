//! A real service process (a binary, its arguments and environment), for
//! what an in-process server cannot show: SIGKILL in the middle of a
//! request, SIGTERM and the exit status, the memory of the process. It is
//! started, then waited for until an HTTP health URL answers 2xx; its
//! stdout and stderr go to a log file, whose lines are shown when it does
//! not come up (and when a test panics while it runs). It is SIGKILLed
//! when dropped.
//!
//! And processes known only by their pid, which nothing here spawned (a
//! Citus worker's PostgreSQL, what a killed run left behind): [`kill`],
//! [`children`], [`alive`].

use std::ffi::OsString;
use std::fmt;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::process::Child;

/// How much of a log an error message shows: its last lines.
const LOG_TAIL_LINES: usize = 40;
const HEALTH_POLL: Duration = Duration::from_millis(50);

/// Where [`free_port`] hands ports out: below Linux's ephemeral range
/// (32768–60999), from which every `bind(…:0)` and every outgoing
/// connection's own port is drawn. A port the OS picked could be taken by
/// any of the test's many connections before it is used; one from here is
/// taken only by another `free_port`.
const HANDED_OUT: std::ops::Range<u16> = 20_000..32_000;
/// The ports this process has handed out so far.
static HANDED: AtomicU32 = AtomicU32::new(0);

/// A port of 127.0.0.1 that nobody listens on right now, for a server
/// that must be told its address before it starts. Each process walks
/// [`HANDED_OUT`] from a place of its own, so that two callers in one
/// process never get the same port, and two processes seldom try one.
pub fn free_port() -> u16 {
    let span = u32::from(HANDED_OUT.end - HANDED_OUT.start);
    let start = std::process::id().wrapping_mul(2_654_435_761) % span;
    for _ in 0..span {
        let offset = (start + HANDED.fetch_add(1, Ordering::Relaxed)) % span;
        let port = HANDED_OUT.start + offset as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free port of 127.0.0.1 in {HANDED_OUT:?}")
}

/// What to run, and where it answers. Cheap to clone and to start again
/// (a restart after a kill).
#[derive(Debug, Clone)]
pub struct Service {
    program: PathBuf,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    url: String,
    health_path: String,
    log: Option<PathBuf>,
    note_pid_in: Option<PathBuf>,
    current_dir: Option<PathBuf>,
}

impl Service {
    /// `program`, which will answer at `url` (`http://127.0.0.1:PORT`, the
    /// port being the caller's to pass on), healthy when `GET
    /// {url}/healthz` answers 2xx.
    pub fn new(program: impl Into<PathBuf>, url: impl Into<String>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            url: url.into(),
            health_path: "/healthz".to_owned(),
            log: None,
            note_pid_in: None,
            current_dir: None,
        }
    }

    pub fn arg(mut self, arg: impl Into<OsString>) -> Self {
        self.args.push(arg.into());
        self
    }

    pub fn args<I: IntoIterator<Item = S>, S: Into<OsString>>(mut self, args: I) -> Self {
        self.args.extend(args.into_iter().map(Into::into));
        self
    }

    /// An environment variable, on top of this process's environment.
    pub fn env(mut self, name: impl Into<OsString>, value: impl Into<OsString>) -> Self {
        self.env.push((name.into(), value.into()));
        self
    }

    pub fn envs<I, K, V>(mut self, vars: I) -> Self
    where
        I: IntoIterator<Item = (K, V)>,
        K: Into<OsString>,
        V: Into<OsString>,
    {
        self.env
            .extend(vars.into_iter().map(|(k, v)| (k.into(), v.into())));
        self
    }

    /// The path whose 2xx means healthy (default `/healthz`).
    pub fn health_path(mut self, path: impl Into<String>) -> Self {
        self.health_path = path.into();
        self
    }

    /// Appends the process's output to `path` (kept; each start appends).
    /// Without it, a temp file is used and removed with the process.
    pub fn log_to(mut self, path: impl Into<PathBuf>) -> Self {
        self.log = Some(path.into());
        self
    }

    /// Notes each started process in the scratch directory `dir`
    /// ([`crate::scratch::note_pid`]), for the sweep of a killed run.
    pub fn note_pid_in(mut self, dir: impl Into<PathBuf>) -> Self {
        self.note_pid_in = Some(dir.into());
        self
    }

    /// Runs the process in `dir` (default: this process's directory).
    pub fn current_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.current_dir = Some(dir.into());
        self
    }

    pub fn url(&self) -> &str {
        &self.url
    }

    /// Starts the process and returns at once (see [`ServiceProcess::wait_healthy`]).
    pub fn start(&self) -> Result<ServiceProcess, SpawnError> {
        let (log, own_log) = match &self.log {
            Some(path) => (path.clone(), false),
            None => (temp_log(&self.program), true),
        };
        let open = || {
            OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log)
                .map_err(|e| SpawnError::Spawn(format!("{}: {e}", log.display())))
        };
        let (stdout, stderr): (File, File) = (open()?, open()?);
        let log_from = fs::metadata(&log).map_or(0, |m| m.len());
        let mut command = tokio::process::Command::new(&self.program);
        if let Some(dir) = &self.current_dir {
            command.current_dir(dir);
        }
        let child = command
            .args(&self.args)
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(stdout)
            .stderr(stderr)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| SpawnError::Spawn(format!("{}: {e}", self.program.display())))?;
        if let (Some(dir), Some(pid)) = (&self.note_pid_in, child.id()) {
            let name = self.program.file_name().unwrap_or_default();
            crate::scratch::note_pid(dir, pid, &name.to_string_lossy());
        }
        Ok(ServiceProcess {
            child,
            url: self.url.clone(),
            health: format!("{}{}", self.url, self.health_path),
            log,
            log_from,
            own_log,
            exit: None,
        })
    }

    /// Starts the process and waits until it is healthy, for at most
    /// `within`. On failure the process is killed, and the error says
    /// whether it exited (with its status) or never answered, with the last
    /// lines of its log.
    pub async fn spawn(&self, within: Duration) -> Result<ServiceProcess, SpawnError> {
        let mut process = self.start()?;
        process.wait_healthy(within).await?;
        Ok(process)
    }

    /// [`Self::spawn`] for a harness that cannot go on without the process:
    /// panics with the error (and so the log).
    pub async fn spawn_or_panic(&self, within: Duration) -> ServiceProcess {
        self.spawn(within)
            .await
            .unwrap_or_else(|error| panic!("{} at {}: {error}", self.program.display(), self.url))
    }
}

fn temp_log(program: &Path) -> PathBuf {
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let name = program.file_name().unwrap_or_default().to_string_lossy();
    std::env::temp_dir().join(format!("{name}-{}-{nanos}.log", std::process::id()))
}

/// Why a process is not up.
#[derive(Debug)]
pub enum SpawnError {
    /// It could not be started at all.
    Spawn(String),
    /// It exited before it was healthy.
    Exited { status: ExitStatus, log: String },
    /// It runs, but its health URL did not answer 2xx in time.
    Unhealthy {
        url: String,
        within: Duration,
        log: String,
    },
}

impl fmt::Display for SpawnError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Spawn(error) => write!(f, "could not start: {error}"),
            Self::Exited { status, log } => {
                write!(
                    f,
                    "exited before it was healthy ({status}); its log:\n{log}"
                )
            }
            Self::Unhealthy { url, within, log } => {
                write!(f, "{url} not healthy within {within:?}; its log:\n{log}")
            }
        }
    }
}

impl std::error::Error for SpawnError {}

/// A started process. SIGKILLed on drop, if it still runs.
#[derive(Debug)]
pub struct ServiceProcess {
    child: Child,
    url: String,
    health: String,
    log: PathBuf,
    /// Where this process's output starts in the log.
    log_from: u64,
    own_log: bool,
    exit: Option<ExitStatus>,
}

impl ServiceProcess {
    /// Where it answers (the URL given to [`Service::new`]).
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Its pid, while it has not been waited for.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Everything it has written so far (stdout and stderr).
    pub fn log(&self) -> String {
        let mut text = String::new();
        if let Ok(mut file) = File::open(&self.log) {
            let _ = file.seek(SeekFrom::Start(self.log_from));
            let mut bytes = Vec::new();
            let _ = file.read_to_end(&mut bytes);
            text = String::from_utf8_lossy(&bytes).into_owned();
        }
        text
    }

    /// The last `lines` lines of [`Self::log`].
    pub fn log_tail(&self, lines: usize) -> String {
        let log = self.log();
        let all: Vec<&str> = log.lines().collect();
        all[all.len().saturating_sub(lines)..].join("\n")
    }

    /// Its exit status, if it has exited (without blocking).
    pub fn try_exit_status(&mut self) -> Option<ExitStatus> {
        if self.exit.is_none() {
            self.exit = self.child.try_wait().ok().flatten();
        }
        self.exit
    }

    /// Waits until `GET <url><health path>` answers 2xx, for at most
    /// `within`; fails early if the process exits meanwhile.
    pub async fn wait_healthy(&mut self, within: Duration) -> Result<(), SpawnError> {
        let deadline = Instant::now() + within;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .pool_max_idle_per_host(0)
            .build()
            .expect("an HTTP client");
        loop {
            if let Ok(response) = http.get(&self.health).send().await {
                if response.status().is_success() {
                    return Ok(());
                }
            }
            if let Some(status) = self.try_exit_status() {
                return Err(SpawnError::Exited {
                    status,
                    log: self.log_tail(LOG_TAIL_LINES),
                });
            }
            if Instant::now() >= deadline {
                return Err(SpawnError::Unhealthy {
                    url: self.health.clone(),
                    within,
                    log: self.log_tail(LOG_TAIL_LINES),
                });
            }
            tokio::time::sleep(HEALTH_POLL).await;
        }
    }

    /// Sends it a signal by name (`TERM`, `INT`, `KILL`, ...), as `kill -NAME`
    /// does; panics if it cannot be sent (the process is gone).
    pub fn signal(&self, name: &str) {
        let pid = self.pid().expect("the process runs");
        let status = std::process::Command::new("kill")
            .arg(format!("-{name}"))
            .arg(pid.to_string())
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{name} {pid}");
    }

    /// Waits for it to exit, for at most `within`; `None` if it still runs.
    pub async fn wait(&mut self, within: Duration) -> Option<ExitStatus> {
        if let Some(status) = self.exit {
            return Some(status);
        }
        let status = tokio::time::timeout(within, self.child.wait())
            .await
            .ok()?
            .ok()?;
        self.exit = Some(status);
        Some(status)
    }

    /// SIGKILL, and wait (10 s at most) until it is gone.
    pub async fn kill(&mut self) -> Option<ExitStatus> {
        if self.try_exit_status().is_none() {
            let _ = self.child.start_kill();
        }
        self.wait(Duration::from_secs(10)).await
    }

    /// SIGTERM, and wait for its exit status for at most `within`; SIGKILL
    /// if it is still there then (`None`).
    pub async fn stop(mut self, within: Duration) -> Option<ExitStatus> {
        if self.try_exit_status().is_none() {
            self.signal("TERM");
        }
        match self.wait(within).await {
            Some(status) => Some(status),
            None => {
                self.kill().await;
                None
            }
        }
    }
}

impl Drop for ServiceProcess {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "--- the last lines of {}'s log ({}):\n{}",
                self.url,
                self.log.display(),
                self.log_tail(LOG_TAIL_LINES)
            );
        }
        if self.try_exit_status().is_none() {
            let _ = self.child.start_kill();
        }
        if self.own_log {
            let _ = fs::remove_file(&self.log);
        }
    }
}

/// `kill -KILL` to `pids` (none: nothing to do), and how it ended.
pub(crate) fn kill(pids: &[u32]) -> Result<ExitStatus, String> {
    if pids.is_empty() {
        return Ok(ExitStatus::default());
    }
    Command::new("kill")
        .arg("-KILL")
        .args(pids.iter().map(u32::to_string))
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("kill: {e}"))
}

/// The processes whose parent is `pid` (from `/proc`).
pub(crate) fn children(pid: u32) -> Vec<u32> {
    fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let child: u32 = entry.file_name().to_str()?.parse().ok()?;
            (parent(child)? == pid).then_some(child)
        })
        .collect()
}

/// The parent of `pid`, while it is there.
pub(crate) fn parent(pid: u32) -> Option<u32> {
    stat(pid)?.split_whitespace().nth(1)?.parse().ok()
}

/// Whether `pid` is a live process (a zombie is not).
pub(crate) fn alive(pid: u32) -> bool {
    stat(pid)
        .and_then(|stat| Some(stat.split_whitespace().next()? != "Z"))
        .unwrap_or(false)
}

/// `/proc/<pid>/stat` from the state on: `pid (comm) state ppid ...`, and
/// comm may hold spaces, so after its closing parenthesis.
fn stat(pid: u32) -> Option<String> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    Some(stat.rsplit_once(')')?.1.to_owned())
}

/// Sends `signal` to `pid` at once (no `kill` process started in between,
/// which takes milliseconds); whether it was sent.
pub(crate) fn signal_now(pid: u32, signal: libc::c_int) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: kill(2) takes two integers and touches no memory of ours.
    unsafe { libc::kill(pid, signal) == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_known_by_its_pid_is_found_killed_and_seen_gone() {
        let mut sleeper = Command::new("sleep").arg("60").spawn().expect("sleep");
        let pid = sleeper.id();
        assert!(alive(pid));
        assert!(children(std::process::id()).contains(&pid));
        assert!(kill(&[pid]).expect("kill").success());
        // Dead before it is reaped: a zombie is not alive.
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(pid) {
            assert!(Instant::now() < deadline, "{pid} outlived SIGKILL");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!sleeper.wait().expect("wait").success());
        assert!(kill(&[]).expect("nothing to kill").success());
    }
}
