//! Where the CPU went in a measured window, so that a ratio between two
//! servers can be split into its parts: the bench process's threads by kind
//! (actix workers serve; tokio workers generate the load) and PostgreSQL's
//! processes, from the kernel's run time of each thread (`schedstat`, in
//! nanoseconds). Linux only; elsewhere every figure is zero.

use std::fs;
use std::ops::{AddAssign, Sub};
use std::sync::OnceLock;

static POSTMASTER: OnceLock<u32> = OnceLock::new();

/// Counts PostgreSQL's processes in from now on: the postmaster of this
/// backend (`pg_backend_pid()`) and its children, when it runs here.
pub fn watch_postgres(backend: u32) {
    if let Some(postmaster) = parent(backend) {
        let _ = POSTMASTER.set(postmaster);
    }
}

/// The run time so far, in nanoseconds, of the PostgreSQL server that
/// `backend` (a `pg_backend_pid()` of it) belongs to: its postmaster and
/// every process it started. Zero when that server is not on this machine.
pub fn postgres_of(backend: u32) -> u64 {
    parent(backend).map_or(0, postgres)
}

/// CPU time in nanoseconds, by who spent it.
#[derive(Debug, Clone, Copy, Default)]
pub struct Usage {
    /// actix workers: the servers under load (and the in-process sandbox),
    /// with their database connections' tasks.
    pub server: u64,
    /// tokio workers of the bench's runtime: the load generator.
    pub load: u64,
    /// The postmaster and every process it started.
    pub postgres: u64,
}

impl Usage {
    pub fn now() -> Self {
        let mut usage = Usage::default();
        for (comm, nanos) in threads("/proc/self/task") {
            if comm.starts_with("actix-server") {
                usage.server += nanos;
            } else if comm.starts_with("tokio-rt") {
                usage.load += nanos;
            }
        }
        if let Some(&postmaster) = POSTMASTER.get() {
            usage.postgres = postgres(postmaster);
        }
        usage
    }

    /// Microseconds per request of each part: (server, PostgreSQL, load).
    pub fn per_request_us(&self, requests: u64) -> (f64, f64, f64) {
        let per = |nanos: u64| nanos as f64 / 1000.0 / requests.max(1) as f64;
        (per(self.server), per(self.postgres), per(self.load))
    }
}

impl Sub for Usage {
    type Output = Usage;

    fn sub(self, earlier: Usage) -> Usage {
        Usage {
            server: self.server.saturating_sub(earlier.server),
            load: self.load.saturating_sub(earlier.load),
            postgres: self.postgres.saturating_sub(earlier.postgres),
        }
    }
}

impl AddAssign for Usage {
    fn add_assign(&mut self, other: Usage) {
        self.server += other.server;
        self.load += other.load;
        self.postgres += other.postgres;
    }
}

/// Each thread under a `task` directory: its name and run time.
fn threads(dir: &str) -> Vec<(String, u64)> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| {
            let path = entry.path();
            let comm = fs::read_to_string(path.join("comm")).ok()?;
            Some((comm.trim().to_owned(), run_time(&path.join("schedstat"))?))
        })
        .collect()
}

/// The postmaster's run time and its children's, the live ones' and the
/// exited ones' (PostgreSQL's processes are single-threaded). A backend
/// that exits takes its run time out of the live ones' sum and adds it to
/// the time of the postmaster's reaped children, so the whole never goes
/// back: a connection closed during a measure no longer hides what the
/// others spent.
fn postgres(postmaster: u32) -> u64 {
    let Ok(entries) = fs::read_dir("/proc") else {
        return 0;
    };
    let live: u64 = entries
        .flatten()
        .filter_map(|entry| {
            let pid: u32 = entry.file_name().to_str()?.parse().ok()?;
            let ours = pid == postmaster || parent(pid) == Some(postmaster);
            ours.then(|| run_time(&entry.path().join("schedstat")))
                .flatten()
        })
        .sum();
    live + reaped(postmaster).unwrap_or(0)
}

/// Clock ticks per second of `/proc/<pid>/stat`'s times: Linux's `USER_HZ`,
/// fixed at 100 for every architecture's user space.
const TICKS_PER_SEC: u64 = 100;

/// The run time of `pid`'s exited children that it waited for
/// (`/proc/<pid>/stat`'s `cutime` and `cstime`), in nanoseconds, to the
/// nearest tick.
fn reaped(pid: u32) -> Option<u64> {
    let fields = stat_fields(pid)?;
    // After the name: state (field 3) first, so `cutime` (16) is the 14th.
    let ticks: u64 = [13, 14]
        .iter()
        .map(|&i| fields.get(i)?.parse::<u64>().ok())
        .sum::<Option<u64>>()?;
    Some(ticks * (1_000_000_000 / TICKS_PER_SEC))
}

fn parent(pid: u32) -> Option<u32> {
    stat_fields(pid)?.get(1)?.parse().ok()
}

/// The fields of `/proc/<pid>/stat` after the process's name.
fn stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The name, in parentheses, may hold spaces; the fields after it don't.
    let (_, rest) = stat.rsplit_once(')')?;
    Some(rest.split_whitespace().map(str::to_owned).collect())
}

/// The first field of `schedstat`: nanoseconds spent running.
fn run_time(path: &std::path::Path) -> Option<u64> {
    fs::read_to_string(path)
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}
