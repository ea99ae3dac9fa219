//! The Citus profile: with `STAGEDOOR_TEST_CITUS=1`, `DATABASE_URL` names a
//! database on the coordinator of a Citus cluster (`scripts/citus.sh` starts
//! one and prints it), and every [`TestDatabase`](crate::db::TestDatabase)
//! is a database of that cluster: copied on the coordinator and on every
//! worker from [`TEMPLATE`], which holds the extension and the workers
//! registered with the coordinator, or from [`LAID_OUT`], which also holds
//! the service's tables (`scripts/citus.sh` makes both). [`distribute`]
//! gives the service's tables of a bare copy the layout of
//! `scripts/citus-distribute.sql`, once they exist. [`Worker`] crashes a
//! worker's server and starts it again, and [`dangling_prepared`] finds the
//! two-phase commits such a crash left half done.

use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use tokio_postgres::{Client, Config, NoTls};

use crate::process::{alive, children, kill};

/// The service's tables on a cluster, as `scripts/citus.sh` lays them out.
pub const LAYOUT: &str = include_str!("../../../scripts/citus-distribute.sql");

/// Whether the tests run on a Citus cluster (`STAGEDOOR_TEST_CITUS=1`).
pub fn enabled() -> bool {
    std::env::var("STAGEDOOR_TEST_CITUS").is_ok_and(|v| v == "1")
}

/// Distributes the service's tables of `db` (after its migrations).
pub async fn distribute(db: &Client) {
    db.batch_execute(LAYOUT)
        .await
        .unwrap_or_else(|e| panic!("scripts/citus-distribute.sql: {e}"));
}

/// The workers of the cluster whose coordinator `admin` is connected to:
/// `(host, port)` of each.
pub async fn workers(admin: &Client) -> Vec<(String, u16)> {
    admin
        .query(
            "SELECT nodename, nodeport FROM pg_dist_node WHERE groupid <> 0 ORDER BY nodeport",
            &[],
        )
        .await
        .unwrap_or_else(|e| {
            panic!("STAGEDOOR_TEST_CITUS=1 but DATABASE_URL is not a Citus coordinator: {e}")
        })
        .iter()
        .map(|row| (row.get(0), row.get::<_, i32>(1) as u16))
        .collect()
}

/// `url` with another host and port (a worker's), same user and database.
pub fn on_node(url: &str, host: &str, port: u16) -> String {
    let config: Config = url.parse().expect("a PostgreSQL URL");
    let user = config.get_user().unwrap_or("postgres");
    let dbname = config.get_dbname().unwrap_or("postgres");
    format!("postgres://{user}@{host}:{port}/{dbname}")
}

/// Runs `sql` on the database `url` names.
async fn execute(url: &str, sql: &str) {
    crate::db::connect(url)
        .await
        .batch_execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{url}: {sql}: {e}: {:?}", e.as_db_error()));
}

/// The database on every node of the cluster that each test's database is
/// copied from: the extension, with the nodes registered, made by
/// `scripts/citus.sh` when it starts the cluster. A copy is a file copy on
/// each node; making the extension and registering the nodes for every
/// test took seconds, one test at a time (`citus_add_node` on two
/// databases at once fails on the roles it copies to the workers).
pub const TEMPLATE: &str = "stagedoor_cluster_template";

/// [`TEMPLATE`] with the service's tables migrated and distributed, by the
/// service binary `scripts/citus.sh` started the cluster with: a test that
/// starts the service copies it, instead of the DDL of both on every node.
pub const LAID_OUT: &str = "stagedoor_cluster_laid_out";

/// Makes `name`, whose coordinator's copy the caller made from `template`,
/// on every worker from it too (`admin` lists them; `maintenance` is the
/// URL it was opened with).
pub(crate) async fn join(admin: &Client, maintenance: &str, name: &str, template: &str) {
    for (host, port) in workers(admin).await {
        execute(
            &on_node(maintenance, &host, port),
            &format!("CREATE DATABASE \"{name}\" TEMPLATE {template}"),
        )
        .await;
    }
}

/// Runs `sql` on every worker (`admin` lists them; `maintenance` is the
/// URL it was opened with, whose database `sql` runs in).
pub(crate) async fn on_every_worker(admin: &Client, maintenance: &str, sql: &str) {
    for (host, port) in workers(admin).await {
        execute(&on_node(maintenance, &host, port), sql).await;
    }
}

/// Drops `name` from every worker (the coordinator's copy is the caller's).
pub(crate) async fn leave(admin: &Client, maintenance: &str, name: &str) {
    for (host, port) in workers(admin).await {
        if let Ok((client, connection)) =
            tokio_postgres::connect(&on_node(maintenance, &host, port), NoTls).await
        {
            tokio::spawn(connection);
            let _ = client
                .batch_execute(&format!("DROP DATABASE IF EXISTS \"{name}\" WITH (FORCE)"))
                .await;
        }
    }
}

/// A worker's PostgreSQL server on this machine (the cluster of
/// `scripts/citus.sh`), to crash and start again.
#[derive(Debug, Clone)]
pub struct Worker {
    pub host: String,
    pub port: u16,
    /// Its group in the cluster's catalog: the first number of the name of
    /// every two-phase commit it coordinates (`citus_<group>_<pid>_…`).
    pub group: i32,
    /// The URL of the test's database on it.
    pub url: String,
    data: PathBuf,
}

impl Worker {
    /// Every worker of the cluster `admin` (connected to `url`, a database
    /// of the cluster on the coordinator) is the coordinator of, with its
    /// data directory as the server reports it.
    pub async fn all(admin: &Client, url: &str) -> Vec<Worker> {
        let mut all = Vec::new();
        for (host, port) in workers(admin).await {
            let url = on_node(url, &host, port);
            let row = crate::db::connect(&url)
                .await
                .query_one(
                    "SELECT current_setting('data_directory'), groupid FROM pg_dist_local_group",
                    &[],
                )
                .await
                .unwrap_or_else(|e| panic!("{url}: its data directory and group: {e}"));
            let data: String = row.get(0);
            all.push(Worker {
                host,
                port,
                group: row.get(1),
                url,
                data: data.into(),
            });
        }
        all
    }

    /// SIGKILL to the postmaster and every process it started, as a power
    /// cut does to a machine: no shutdown checkpoint, transactions cut
    /// wherever they were (a prepared one stays prepared). Returns once
    /// every one of them is gone.
    pub fn crash(&self) -> Result<(), String> {
        let postmaster = self.postmaster()?;
        // The children are listed while they are still the postmaster's;
        // the postmaster is killed first, so that it cannot start a new
        // one, then they are. Only the postmaster's kill must succeed: a
        // child may end by itself in between, and its kill then fails.
        let children = children(postmaster);
        let status = kill(&[postmaster])?;
        if !status.success() && alive(postmaster) {
            return Err(format!("kill -KILL {postmaster}: {status}"));
        }
        kill(&children)?;
        // The postmaster must be reaped too, not just dead: a new one
        // refuses to start while the pid in `postmaster.pid` names any
        // process, a zombie included (here init reaps within seconds).
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::path::Path::new(&format!("/proc/{postmaster}")).exists()
            || children.iter().any(|pid| alive(*pid))
        {
            if Instant::now() > deadline {
                return Err(format!("processes of port {} outlived SIGKILL", self.port));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }

    /// The pid of its running postmaster, from `postmaster.pid`.
    pub fn postmaster(&self) -> Result<u32, String> {
        let pid_file = self.data.join("postmaster.pid");
        std::fs::read_to_string(&pid_file)
            .map_err(|e| format!("{}: {e}", pid_file.display()))?
            .lines()
            .next()
            .and_then(|line| line.trim().parse().ok())
            .ok_or_else(|| format!("{}: no pid on its first line", pid_file.display()))
    }

    /// `pg_ctl start`, waiting until it accepts connections (after its
    /// crash recovery). The settings are its `postgresql.conf`'s; the log
    /// goes where `scripts/citus.sh` puts it, beside the data directory.
    pub fn start(&self) -> Result<(), String> {
        let bin = crate::postgres::bindir().ok_or("no pg_ctl found")?;
        let log = format!("{}.log", self.data.display());
        let out = crate::postgres::pg_command(crate::postgres::running_as_root(), &bin, "pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-l", &log, "-w", "-t", "120", "start"])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("pg_ctl: {e}"))?;
        if out.status.success() {
            Ok(())
        } else {
            Err(format!(
                "pg_ctl start on port {} ({}): {}{}",
                self.port,
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }
}

/// The prepared transactions of the test's database on every node of the
/// cluster (`coordinator` is its URL on the coordinator): one line per
/// transaction, naming the node. Empty when every two-phase commit was
/// finished, one way or the other.
pub async fn dangling_prepared(admin: &Client, coordinator: &str) -> Vec<String> {
    let config: Config = coordinator.parse().expect("a PostgreSQL URL");
    let (host, port) = crate::db::host_and_port(&config);
    let mut nodes = vec![(host, port)];
    nodes.extend(workers(admin).await);
    let mut dangling = Vec::new();
    for (host, port) in nodes {
        let client = crate::db::connect(&on_node(coordinator, &host, port)).await;
        for row in client
            .query(
                "SELECT gid, prepared::text FROM pg_prepared_xacts WHERE database = current_database()",
                &[],
            )
            .await
            .unwrap_or_else(|e| panic!("{host}:{port}: pg_prepared_xacts: {e}"))
        {
            let (gid, prepared): (String, String) = (row.get(0), row.get(1));
            dangling.push(format!("{host}:{port}: prepared transaction {gid} (since {prepared})"));
        }
    }
    dangling
}
