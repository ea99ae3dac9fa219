//! A PostgreSQL server of the test's own: `initdb` into a directory (trust
//! auth, UTF8, no locale), started with `pg_ctl` on a free port of
//! 127.0.0.1 (or one the test names) with its unix socket in its own directory, restarted on
//! request, stopped (and its directory removed, when it made it) on drop.
//! For what the machine's server cannot give: server settings of the test's
//! choosing (`pg_stat_statements`, durability), a restart in the middle of
//! a run, statistics that nobody else adds to.
//!
//! Root may not run the server: as root, every server command runs as the
//! `postgres` system user (`runuser`), in a directory it owns.

use std::fs::{self, OpenOptions};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::process::free_port;
use crate::scratch::ScratchDir;

/// The prefix of the scratch directory of a server started by
/// [`Postgres::start`].
pub(crate) const SCRATCH_PREFIX: &str = "stagedoor-pg-";

/// A running throwaway server. Every setting is passed on the command line
/// (`-c name=value`), so that a restart keeps them.
#[derive(Debug)]
pub struct Postgres {
    bin: PathBuf,
    /// `<dir>/pg`: owned by the server's user; data, socket and logs.
    dir: PathBuf,
    data: PathBuf,
    port: u16,
    as_postgres: bool,
    settings: Vec<String>,
    running: bool,
    /// The scratch directory when the server made its own.
    own: Option<ScratchDir>,
}

impl Postgres {
    /// A server in a scratch directory of its own, removed on drop.
    /// `settings` are `name=value` server settings besides
    /// `listen_addresses=127.0.0.1`. `Err` says why it cannot be had here
    /// (no `initdb`, no `postgres` user, ...).
    pub fn start(settings: &[&str]) -> Result<Self, String> {
        Self::start_own(None, settings)
    }

    /// [`Self::start`] on exactly `port` of 127.0.0.1, for a test that
    /// points a client there before any server is up. Nobody else may
    /// listen on it: there is no other port to fall back on.
    pub fn start_on(port: u16, settings: &[&str]) -> Result<Self, String> {
        Self::start_own(Some(port), settings)
    }

    fn start_own(port: Option<u16>, settings: &[&str]) -> Result<Self, String> {
        let scratch = ScratchDir::new(SCRATCH_PREFIX).map_err(|e| format!("scratch dir: {e}"))?;
        let mut server = Self::start_at(scratch.path(), port, settings)?;
        server.own = Some(scratch);
        Ok(server)
    }

    /// A server in `parent/pg` (which must not exist yet); `parent` stays
    /// the caller's. A [`ScratchDir`] of the same prefix sweeps a server
    /// left there by a killed run.
    pub fn start_in(parent: &Path, settings: &[&str]) -> Result<Self, String> {
        Self::start_at(parent, None, settings)
    }

    /// `port`: that one, or (`None`) a free one, and another should
    /// someone take it before the server does.
    fn start_at(parent: &Path, port: Option<u16>, settings: &[&str]) -> Result<Self, String> {
        let as_postgres = running_as_root();
        let dir = parent.join("pg");
        fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        if as_postgres {
            let status = Command::new("chown")
                .arg("postgres:postgres")
                .arg(&dir)
                .status()
                .map_err(|e| format!("chown: {e}"))?;
            if !status.success() {
                return Err(format!("chown postgres {} failed", dir.display()));
            }
        }
        let mut server = Self {
            bin: bindir().ok_or("no initdb found")?,
            data: dir.join("data"),
            dir,
            port: port.unwrap_or_else(free_port),
            as_postgres,
            settings: std::iter::once("listen_addresses=127.0.0.1")
                .chain(settings.iter().copied())
                .map(str::to_owned)
                .collect(),
            running: false,
            own: None,
        };
        let data = server.data.display().to_string();
        server.run(
            "initdb",
            &[
                "-D",
                &data,
                "-U",
                "postgres",
                "--auth=trust",
                "-E",
                "UTF8",
                "--no-locale",
                "--no-sync",
            ],
        )?;
        // The port was free a moment ago; should someone take it meanwhile,
        // try another (unless the caller named this one).
        let attempts = if port.is_some() { 1 } else { 3 };
        for attempt in 1..=attempts {
            match server.run("pg_ctl", &server.pg_ctl_args("start")) {
                Ok(()) => break,
                Err(error) if attempt == attempts => {
                    return Err(format!("pg_ctl start on port {}: {error}", server.port))
                }
                Err(_) => server.port = free_port(),
            }
        }
        server.running = true;
        Ok(server)
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// `postgres://postgres@127.0.0.1:PORT/<database>`.
    pub fn url(&self, database: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{database}", self.port)
    }

    /// The directory of the PostgreSQL programs it runs.
    pub fn bindir(&self) -> &Path {
        &self.bin
    }

    /// Its server settings, as passed to it (`name=value`).
    pub fn settings(&self) -> &[String] {
        &self.settings
    }

    /// The server's log (`postgres.log`).
    pub fn log_path(&self) -> PathBuf {
        self.dir.join("postgres.log")
    }

    /// `pg_ctl restart -m fast`: every connection is cut, the server comes
    /// back on the same port with the same settings. Blocks until it accepts
    /// connections again.
    pub fn restart(&self) -> Result<(), String> {
        let mut args = self.pg_ctl_args("restart");
        args.extend(["-m".to_owned(), "fast".to_owned()]);
        self.run("pg_ctl", &args)
    }

    /// `pg_ctl stop -m fast`, waiting until it is down. Drop stops a server
    /// still running with `-m immediate` (its data is thrown away anyway).
    pub fn stop(&mut self) -> Result<(), String> {
        self.stop_with("fast")
    }

    fn stop_with(&mut self, mode: &str) -> Result<(), String> {
        if !self.running {
            return Ok(());
        }
        let data = self.data.display().to_string();
        self.run("pg_ctl", &["-D", &data, "-m", mode, "-w", "stop"])?;
        self.running = false;
        Ok(())
    }

    fn pg_ctl_args(&self, action: &str) -> Vec<String> {
        let mut options = format!("-p {} -k {}", self.port, self.dir.display());
        for setting in &self.settings {
            options.push_str(" -c ");
            options.push_str(setting);
        }
        [
            "-D",
            &self.data.display().to_string(),
            "-l",
            &self.log_path().display().to_string(),
            "-w",
            "-t",
            "60",
            "-o",
            &options,
            action,
        ]
        .iter()
        .map(|s| (*s).to_owned())
        .collect()
    }

    /// Runs a server program; its output goes to `pg_ctl.out`, and on
    /// failure the error carries that and the server's log.
    fn run<S: AsRef<std::ffi::OsStr>>(&self, program: &str, args: &[S]) -> Result<(), String> {
        let out_path = self.dir.join("pg_ctl.out");
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&out_path)
            .map_err(|e| format!("{}: {e}", out_path.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let status = pg_command(self.as_postgres, &self.bin, program)
            .args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .status()
            .map_err(|e| format!("{program}: {e}"))?;
        if status.success() {
            Ok(())
        } else {
            Err(format!(
                "{program} failed ({status}):\n{}\n{}",
                fs::read_to_string(&out_path).unwrap_or_default(),
                fs::read_to_string(self.log_path()).unwrap_or_default()
            ))
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        if let Err(error) = self.stop_with("immediate") {
            eprintln!("stopping the throwaway PostgreSQL: {error}");
        }
    }
}

/// Whether the scratch directory `dir` holds a server that still runs (or
/// was killed without a chance to stop: its `postmaster.pid` is there).
pub(crate) fn left_running(dir: &Path) -> bool {
    dir.join("pg").join("data").join("postmaster.pid").exists()
}

/// Stops the server that a killed run left in the scratch directory `dir`.
pub(crate) fn stop_left_running(dir: &Path) {
    let Some(bin) = bindir() else { return };
    let _ = pg_command(running_as_root(), &bin, "pg_ctl")
        .arg("-D")
        .arg(dir.join("pg").join("data"))
        .args(["-m", "immediate", "-w", "stop"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// A PostgreSQL program, run as the `postgres` user when we are root.
pub(crate) fn pg_command(as_postgres: bool, bin: &Path, program: &str) -> Command {
    let path = bin.join(program);
    if as_postgres {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(path);
        command
    } else {
        Command::new(path)
    }
}

pub(crate) fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
        .unwrap_or(false)
}

/// The newest `/usr/lib/postgresql/<version>/bin` with an `initdb`, else
/// the directory `pg_config --bindir` names, if it has one.
pub(crate) fn bindir() -> Option<PathBuf> {
    let mut versions: Vec<(u32, PathBuf)> = fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_string_lossy().parse().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").exists().then_some((version, bin))
        })
        .collect();
    versions.sort();
    if let Some((_, bin)) = versions.pop() {
        return Some(bin);
    }
    Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .map(|out| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
        .filter(|bin| bin.join("initdb").exists())
}
