//! The bench's own PostgreSQL: `initdb` into a temp directory, started with
//! `pg_stat_statements` preloaded on a free port, stopped and removed on
//! drop. As root, every server command runs as the `postgres` user (root may
//! not run the server). When that fails (no `initdb`, no `postgres` user)
//! the bench falls back to the machine's server (`DATABASE_URL` or
//! `postgres://postgres@127.0.0.1:5432/postgres`), counting commits from
//! `pg_stat_database` only, and says so.

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{SystemTime, UNIX_EPOCH};

/// Server settings of the throwaway instance: durable (fsync and synchronous
/// commit stay on, as in production), sized like a small dedicated server.
const SERVER_OPTIONS: &[&str] = &[
    "listen_addresses=127.0.0.1",
    "max_connections=400",
    "shared_buffers=1GB",
    "max_wal_size=4GB",
    "shared_preload_libraries=pg_stat_statements",
    "pg_stat_statements.track_utility=on",
    "pg_stat_statements.track_planning=on",
];

pub struct Server {
    /// `postgres://postgres@127.0.0.1:PORT` (no database).
    base: String,
    /// Some when the bench started it.
    throwaway: Option<Throwaway>,
    /// The database the bench works in.
    pub database: String,
}

impl Server {
    /// A throwaway server if one can be had, else the machine's.
    pub fn start() -> (Self, Option<String>) {
        match Throwaway::start() {
            Ok(throwaway) => (
                Self {
                    base: format!("postgres://postgres@127.0.0.1:{}", throwaway.port),
                    throwaway: Some(throwaway),
                    database: "bench".to_owned(),
                },
                None,
            ),
            Err(error) => {
                let url = std::env::var("DATABASE_URL")
                    .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".to_owned());
                let base = url
                    .rsplit_once('/')
                    .map_or(url.clone(), |(base, _)| base.to_owned());
                let note = format!(
                    "no throwaway PostgreSQL ({error}); using the machine's server at {base}: \
                     commits from pg_stat_database only, statements not counted"
                );
                (
                    Self {
                        base,
                        throwaway: None,
                        database: format!("stagedoor_bench_{}", std::process::id()),
                    },
                    Some(note),
                )
            }
        }
    }

    pub fn url(&self, database: &str) -> String {
        format!("{}/{database}", self.base)
    }

    pub fn bench_url(&self) -> String {
        self.url(&self.database)
    }

    pub fn is_throwaway(&self) -> bool {
        self.throwaway.is_some()
    }

    pub fn settings_note(&self) -> String {
        match &self.throwaway {
            Some(t) => format!(
                "throwaway server ({}), {}",
                t.bin.display(),
                SERVER_OPTIONS.join(" ")
            ),
            None => "the machine's server, as configured".to_owned(),
        }
    }
}

struct Throwaway {
    bin: PathBuf,
    scratch: PathBuf,
    data: PathBuf,
    port: u16,
    as_postgres: bool,
}

impl Throwaway {
    fn start() -> Result<Self, String> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let scratch =
            std::env::temp_dir().join(format!("stagedoor-bench-{}-{nanos}", std::process::id()));
        fs::create_dir_all(&scratch).map_err(|e| format!("{}: {e}", scratch.display()))?;
        let as_postgres = running_as_root();
        if as_postgres {
            run_plain(
                "chown",
                &["postgres:postgres", &scratch.display().to_string()],
            )?;
        }
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map_err(|e| e.to_string())?
            .port();
        let server = Self {
            bin: bindir().ok_or("no initdb found")?,
            data: scratch.join("data"),
            scratch,
            port,
            as_postgres,
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
        let mut options = format!("-p {port} -k {}", server.scratch.display());
        for option in SERVER_OPTIONS {
            options.push_str(" -c ");
            options.push_str(option);
        }
        let log = server.scratch.join("postgres.log").display().to_string();
        server.run(
            "pg_ctl",
            &[
                "-D", &data, "-l", &log, "-w", "-t", "60", "-o", &options, "start",
            ],
        )?;
        Ok(server)
    }

    fn run(&self, program: &str, args: &[&str]) -> Result<(), String> {
        let path = self.bin.join(program);
        let mut command = if self.as_postgres {
            let mut command = Command::new("runuser");
            command.args(["-u", "postgres", "--"]).arg(&path);
            command
        } else {
            Command::new(&path)
        };
        let out = command
            .args(args)
            .current_dir(&self.scratch)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("{program}: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "{program} failed: {}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }
}

impl Drop for Throwaway {
    fn drop(&mut self) {
        let data = self.data.display().to_string();
        if let Err(error) = self.run("pg_ctl", &["-D", &data, "-m", "fast", "-w", "stop"]) {
            eprintln!("bench: stopping the throwaway PostgreSQL: {error}");
        }
        let _ = fs::remove_dir_all(&self.scratch);
    }
}

fn run_plain(program: &str, args: &[&str]) -> Result<(), String> {
    let status = Command::new(program)
        .args(args)
        .status()
        .map_err(|e| format!("{program}: {e}"))?;
    status
        .success()
        .then_some(())
        .ok_or_else(|| format!("{program} {} failed", args.join(" ")))
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
        .unwrap_or(false)
}

/// The newest `/usr/lib/postgresql/<version>/bin` with an `initdb`, else
/// what `pg_config --bindir` names.
fn bindir() -> Option<PathBuf> {
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
        .filter(|bin| Path::new(bin).join("initdb").exists())
}

/// A plain connection (fixtures, counters); dropped by the caller.
pub async fn connect(url: &str) -> tokio_postgres::Client {
    let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
        .await
        .unwrap_or_else(|e| panic!("connecting to {url}: {e}"));
    tokio::spawn(connection);
    client
}
