//! What the chaos run owns and tears down: a scratch directory, a throwaway
//! PostgreSQL server in it, one `payrail-sandbox` process and the
//! `stagedoor-checkout serve` processes. Every piece stops (and the directory
//! goes) when it is dropped, so a failing run cleans up as well as a passing
//! one. Set `CHAOS_KEEP=1` to keep the directory (logs) for a post-mortem.

use std::fs::{self, File, OpenOptions};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::Child;
use tokio::sync::Mutex;

/// The API key the sandbox demands and the services send.
pub const API_KEY: &str = "sk_test_stagedoor";

/// A port nobody listens on right now (the OS picks it).
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|listener| listener.local_addr())
        .expect("a free port")
        .port()
}

/// A directory of our own under the system's temp dir, removed on drop.
pub struct Scratch {
    pub path: PathBuf,
}

const SCRATCH_PREFIX: &str = "stagedoor-chaos-";
/// The pids of every process a run spawned, for the sweep of a killed run.
const PIDS: &str = "pids";

fn note_pid(scratch: &Path, pid: Option<u32>) {
    use std::io::Write;
    if let (Some(pid), Ok(mut file)) = (
        pid,
        OpenOptions::new()
            .create(true)
            .append(true)
            .open(scratch.join(PIDS)),
    ) {
        let _ = writeln!(file, "{pid}");
    }
}

impl Scratch {
    pub fn new() -> Self {
        Self::sweep_stale();
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos());
        let path =
            std::env::temp_dir().join(format!("{SCRATCH_PREFIX}{}-{nanos}", std::process::id()));
        fs::create_dir_all(&path).expect("create the scratch directory");
        Self { path }
    }

    /// A run that was SIGKILLed (a CI timeout) could not clean up: stop the
    /// PostgreSQL it left running and remove its directory. The directory's
    /// name carries the pid of the run that made it; one whose process is
    /// alive is left alone, and so is one kept by CHAOS_KEEP (no server).
    fn sweep_stale() {
        let Ok(entries) = fs::read_dir(std::env::temp_dir()) else {
            return;
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(pid) = name
                .strip_prefix(SCRATCH_PREFIX)
                .and_then(|rest| rest.split('-').next())
            else {
                continue;
            };
            let data = entry.path().join("pg").join("data");
            if Path::new("/proc").join(pid).exists() || !data.join("postmaster.pid").exists() {
                continue;
            }
            // Its service and sandbox processes, if they still run.
            for pid in fs::read_to_string(entry.path().join(PIDS))
                .unwrap_or_default()
                .split_whitespace()
            {
                let cmdline =
                    fs::read(Path::new("/proc").join(pid).join("cmdline")).unwrap_or_default();
                let cmdline = String::from_utf8_lossy(&cmdline);
                if cmdline.contains("stagedoor-checkout") || cmdline.contains("payrail-sandbox") {
                    let _ = Command::new("kill").args(["-KILL", pid]).status();
                }
            }
            let _ = pg_command(running_as_root(), &postgres_bindir(), "pg_ctl")
                .arg("-D")
                .arg(&data)
                .args(["-m", "immediate", "-w", "stop"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
            eprintln!(
                "chaos: removing {} (left by an earlier run)",
                entry.path().display()
            );
            let _ = fs::remove_dir_all(entry.path());
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if std::env::var_os("CHAOS_KEEP").is_some() {
            eprintln!("chaos: kept {}", self.path.display());
        } else {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

/// A PostgreSQL server of our own: `initdb` into the scratch directory
/// (trust auth), TCP on 127.0.0.1 and a port of its own, its unix socket in
/// its own directory. Root may not run postgres, so as root every server
/// command runs as the `postgres` system user in a directory it owns.
pub struct Postgres {
    bin: PathBuf,
    dir: PathBuf,
    data: PathBuf,
    out: PathBuf,
    pub port: u16,
    as_postgres: bool,
}

impl Postgres {
    pub fn start(scratch: &Path) -> Self {
        let as_postgres = running_as_root();
        let dir = scratch.join("pg");
        fs::create_dir(&dir).expect("create the PostgreSQL directory");
        if as_postgres {
            let status = Command::new("chown")
                .args(["postgres:postgres"])
                .arg(&dir)
                .status()
                .expect("chown");
            assert!(status.success(), "chown postgres {}", dir.display());
        }
        let mut postgres = Self {
            bin: postgres_bindir(),
            data: dir.join("data"),
            out: scratch.join("pg_ctl.out"),
            dir,
            port: free_port(),
            as_postgres,
        };
        let data = postgres.data.display().to_string();
        postgres
            .run(
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
            )
            .expect("initdb");
        // The port was free a moment ago; should someone take it meanwhile,
        // try another.
        for attempt in 1..=3 {
            match postgres.run("pg_ctl", &postgres.pg_ctl_args("start")) {
                Ok(()) => break,
                Err(error) if attempt == 3 => panic!("pg_ctl start: {error}"),
                Err(_) => postgres.port = free_port(),
            }
        }
        postgres
    }

    /// `postgres://postgres@127.0.0.1:PORT/<db>`.
    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    /// `pg_ctl restart -m fast`: every connection is cut, the server comes
    /// back on the same port. Blocks until it accepts connections again.
    pub fn restart(&self) -> Result<(), String> {
        let mut args = self.pg_ctl_args("restart");
        args.extend(["-m".to_owned(), "fast".to_owned()]);
        self.run("pg_ctl", &args)
    }

    fn pg_ctl_args(&self, action: &str) -> Vec<String> {
        // Durability is not under test (the server is stopped cleanly or
        // thrown away), so skip the fsyncs the two cores would pay for.
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c max_connections=200 \
             -c fsync=off -c synchronous_commit=off -c full_page_writes=off",
            self.port,
            self.dir.display()
        );
        [
            "-D",
            &self.data.display().to_string(),
            "-l",
            &self.dir.join("postgres.log").display().to_string(),
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

    fn run<S: AsRef<std::ffi::OsStr>>(&self, program: &str, args: &[S]) -> Result<(), String> {
        let mut command = pg_command(self.as_postgres, &self.bin, program);
        let out = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.out)
            .map_err(|e| e.to_string())?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let status = command
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
                fs::read_to_string(&self.out).unwrap_or_default(),
                fs::read_to_string(self.dir.join("postgres.log")).unwrap_or_default()
            ))
        }
    }
}

impl Drop for Postgres {
    fn drop(&mut self) {
        let data = self.data.display().to_string();
        if let Err(error) = self.run("pg_ctl", &["-D", &data, "-m", "immediate", "-w", "stop"]) {
            eprintln!("chaos: stopping the throwaway PostgreSQL: {error}");
        }
    }
}

/// A PostgreSQL program, run as the `postgres` user when we are root.
fn pg_command(as_postgres: bool, bin: &Path, program: &str) -> Command {
    let path = bin.join(program);
    if as_postgres {
        let mut command = Command::new("runuser");
        command.args(["-u", "postgres", "--"]).arg(path);
        command
    } else {
        Command::new(path)
    }
}

fn running_as_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim() == "0")
        .unwrap_or(false)
}

/// The newest `/usr/lib/postgresql/<version>/bin` with an `initdb`, else the
/// directory `pg_config --bindir` names, else `/usr/local/bin`.
fn postgres_bindir() -> PathBuf {
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
        return bin;
    }
    Command::new("pg_config")
        .arg("--bindir")
        .output()
        .ok()
        .map(|out| PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
        .filter(|bin| bin.join("initdb").exists())
        .unwrap_or_else(|| PathBuf::from("/usr/local/bin"))
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
    pub stderr: PathBuf,
    _child: Child,
}

impl SandboxProcess {
    pub async fn spawn(scratch: &Path) -> Self {
        let stderr = scratch.join("payrail-sandbox.stderr");
        let mut child = tokio::process::Command::new(sandbox_binary())
            .args(["--port", "0", "--api-key", API_KEY])
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(File::create(&stderr).expect("sandbox stderr"))
            .kill_on_drop(true)
            .spawn()
            .expect("spawn payrail-sandbox");
        note_pid(scratch, child.id());
        let stdout = child.stdout.take().expect("sandbox stdout");
        let mut line = String::new();
        tokio::time::timeout(
            Duration::from_secs(30),
            BufReader::new(stdout).read_line(&mut line),
        )
        .await
        .expect("payrail-sandbox announces its address within 30 s")
        .expect("read the sandbox's stdout");
        let url = line
            .trim()
            .strip_prefix("payrail-sandbox listening on ")
            .unwrap_or_else(|| panic!("unexpected sandbox line {line:?}"))
            .to_owned();
        Self {
            url,
            stderr,
            _child: child,
        }
    }
}

/// One `serve` process slot: a fixed port, the live child (if any), and a
/// stderr file that every generation appends to.
struct Slot {
    port: u16,
    child: Option<Child>,
    stderr: PathBuf,
    /// Exits we did not cause (the process died by itself).
    unexpected_exits: Vec<String>,
}

/// The service instances: started, killed and restarted on their own ports.
pub struct Services {
    scratch: PathBuf,
    env: Vec<(String, String)>,
    slots: Vec<Mutex<Slot>>,
    pub urls: Vec<String>,
    http: reqwest::Client,
}

impl Services {
    pub fn new(scratch: &Path, count: usize, env: Vec<(String, String)>) -> Self {
        let slots: Vec<Slot> = (0..count)
            .map(|i| Slot {
                port: free_port(),
                child: None,
                stderr: scratch.join(format!("service-{i}.stderr")),
                unexpected_exits: Vec::new(),
            })
            .collect();
        let urls = slots
            .iter()
            .map(|slot| format!("http://127.0.0.1:{}", slot.port))
            .collect();
        Self {
            scratch: scratch.to_owned(),
            env,
            slots: slots.into_iter().map(Mutex::new).collect(),
            urls,
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(2))
                .build()
                .expect("http client"),
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
            .stdin(Stdio::null())
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
        let url = &self.urls[i];
        while started.elapsed() < within {
            {
                let mut slot = self.slots[i].lock().await;
                let running = match slot.child.as_mut() {
                    Some(child) => matches!(child.try_wait(), Ok(None)),
                    None => false,
                };
                if !running {
                    let stderr = OpenOptions::new()
                        .create(true)
                        .append(true)
                        .open(&slot.stderr)
                        .map_err(|e| e.to_string())?;
                    let child =
                        tokio::process::Command::new(env!("CARGO_BIN_EXE_stagedoor-checkout"))
                            .arg("serve")
                            .envs(self.env.iter().cloned())
                            .env("STAGEDOOR__SERVER__PORT", slot.port.to_string())
                            .stdin(Stdio::null())
                            .stdout(Stdio::null())
                            .stderr(stderr)
                            .kill_on_drop(true)
                            .spawn()
                            .map_err(|e| format!("spawn stagedoor-checkout: {e}"))?;
                    note_pid(&self.scratch, child.id());
                    slot.child = Some(child);
                }
            }
            for _ in 0..20 {
                if let Ok(response) = self.http.get(format!("{url}/healthz")).send().await {
                    if response.status().is_success() {
                        return Ok(started.elapsed());
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
                let mut slot = self.slots[i].lock().await;
                if let Some(Ok(Some(_))) = slot.child.as_mut().map(|c| c.try_wait()) {
                    break; // it gave up (database down?): start it again
                }
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        Err(format!(
            "instance {i} ({url}) not healthy within {within:?}"
        ))
    }

    /// SIGKILL, and wait until the process is gone.
    pub async fn kill(&self, i: usize) {
        let mut slot = self.slots[i].lock().await;
        if let Some(mut child) = slot.child.take() {
            let _ = child.start_kill();
            let _ = tokio::time::timeout(Duration::from_secs(10), child.wait()).await;
        }
    }

    /// Notes every instance that exited without being killed by us, and
    /// returns the indexes of those not running.
    pub async fn check_exits(&self) -> Vec<usize> {
        let mut down = Vec::new();
        for (i, slot) in self.slots.iter().enumerate() {
            let mut slot = slot.lock().await;
            let exited = match slot.child.as_mut() {
                Some(child) => child.try_wait().ok().flatten(),
                None => {
                    down.push(i);
                    continue;
                }
            };
            if let Some(status) = exited {
                slot.unexpected_exits
                    .push(format!("instance {i} exited by itself: {status}"));
                slot.child = None;
                down.push(i);
            }
        }
        down
    }

    /// Unexpected exits so far, and every line of the services' stderr that
    /// says a thread panicked.
    pub async fn troubles(&self) -> (Vec<String>, Vec<String>) {
        let mut exits = Vec::new();
        let mut panics = Vec::new();
        for (i, slot) in self.slots.iter().enumerate() {
            let slot = slot.lock().await;
            exits.extend(slot.unexpected_exits.iter().cloned());
            panics.extend(panicked_lines(&slot.stderr, &format!("instance {i}")));
        }
        (exits, panics)
    }

    pub async fn stderr_paths(&self) -> Vec<PathBuf> {
        let mut paths = Vec::new();
        for slot in &self.slots {
            paths.push(slot.lock().await.stderr.clone());
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
