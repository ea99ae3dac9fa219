//! A directory of a run's own under the system's temp dir (logs, a
//! throwaway PostgreSQL's data), removed on drop, and the sweep of the
//! directories that a killed run (a CI timeout, a SIGKILL) could not clean
//! up: their processes are killed, their PostgreSQL stopped.
//!
//! A directory is named `<prefix><pid>-<nanos>`, `<pid>` being the process
//! that made it; processes spawned for it are listed in its `pids` file
//! ([`note_pid`]), a PostgreSQL of [`crate::postgres`] lives in its `pg`.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The file of a scratch directory that lists the processes spawned for it.
const PIDS: &str = "pids";

/// A temp directory of our own, removed on drop unless kept.
#[derive(Debug)]
pub struct ScratchDir {
    path: PathBuf,
    keep: bool,
}

impl ScratchDir {
    /// Sweeps the stale directories of `prefix` (see [`sweep_stale`]), then
    /// makes a new one.
    pub fn new(prefix: &str) -> std::io::Result<Self> {
        sweep_stale(prefix);
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path = std::env::temp_dir().join(format!("{prefix}{}-{nanos}", std::process::id()));
        fs::create_dir_all(&path)?;
        Ok(Self { path, keep: false })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Keeps the directory when dropped (for a post-mortem of its logs); its
    /// path is printed then.
    pub fn keep(&mut self, keep: bool) {
        self.keep = keep;
    }
}

impl Drop for ScratchDir {
    fn drop(&mut self) {
        if self.keep {
            eprintln!("kept {}", self.path.display());
        } else {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

/// Notes a process spawned for the scratch directory `dir` (`program` is
/// what its command line contains), for the sweep of a killed run.
pub fn note_pid(dir: &Path, pid: u32, program: &str) {
    if let Ok(mut file) = OpenOptions::new()
        .create(true)
        .append(true)
        .open(dir.join(PIDS))
    {
        let _ = writeln!(file, "{pid} {program}");
    }
}

/// Cleans up after the runs that were killed: every directory of `prefix`
/// whose process is gone and that still has a PostgreSQL running or a
/// noted process alive. Its noted processes are SIGKILLed (only if their
/// command line still names the noted program: pids are reused), its
/// PostgreSQL is stopped, and it is removed. A directory whose run is alive
/// is left alone, and so is one with nothing running (a kept one).
pub fn sweep_stale(prefix: &str) {
    let Ok(entries) = fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(pid) = name
            .strip_prefix(prefix)
            .and_then(|rest| rest.split('-').next())
        else {
            continue;
        };
        if pid.is_empty() || Path::new("/proc").join(pid).exists() {
            continue;
        }
        let dir = entry.path();
        let alive = noted_alive(&dir);
        let server = crate::postgres::left_running(&dir);
        if alive.is_empty() && !server {
            continue;
        }
        // Some may end by themselves in between: the others are killed all
        // the same.
        let _ = crate::process::kill(&alive);
        if server {
            crate::postgres::stop_left_running(&dir);
        }
        eprintln!("removing {} (left by an earlier run)", dir.display());
        let _ = fs::remove_dir_all(&dir);
    }
}

/// The noted processes of `dir` that still run the program noted for them.
fn noted_alive(dir: &Path) -> Vec<u32> {
    fs::read_to_string(dir.join(PIDS))
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let (pid, program) = line.split_once(' ')?;
            let pid: u32 = pid.parse().ok()?;
            let cmdline = fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            String::from_utf8_lossy(&cmdline)
                .contains(program)
                .then_some(pid)
        })
        .collect()
}
