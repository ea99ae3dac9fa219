//! The bench's own PostgreSQL: a throwaway server (`test_support::postgres`)
//! with `pg_stat_statements` preloaded, stopped and removed at the end.
//! When none can be had (no `initdb`, no `postgres` user) the bench falls
//! back to the machine's server (`DATABASE_URL` or
//! `postgres://postgres@127.0.0.1:5432/postgres`), in a database of its own
//! dropped at the end, counting commits from `pg_stat_database` only, and
//! says so.
//!
//! `--citus`: the cluster of `scripts/citus.sh`, whose coordinator
//! `DATABASE_URL` names (else `postgres://postgres@127.0.0.1:9700/postgres`),
//! in a cluster database of its own; commits are counted on every node.

use std::sync::Arc;
use std::time::Duration;

use test_support::db::{maintenance_url, TestDatabase};
use test_support::postgres::Postgres;

/// A plain connection (fixtures, counters); dropped by the caller.
pub use test_support::db::connect;

/// Server settings of the throwaway instance (besides listening on
/// 127.0.0.1): durable (fsync and synchronous commit stay on, as in
/// production), sized like a small dedicated server.
const SERVER_OPTIONS: &[&str] = &[
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
    throwaway: Option<Postgres>,
    /// The bench's database on the machine's server, when it runs there.
    _own_database: Option<Arc<TestDatabase>>,
    /// The database the bench works in.
    pub database: String,
    /// On a Citus cluster: each worker's `postgres://user@host:port`.
    pub workers: Vec<String>,
}

impl Server {
    /// A throwaway server if one can be had, else the machine's.
    pub async fn start() -> (Self, Option<String>) {
        match Postgres::start(SERVER_OPTIONS) {
            Ok(throwaway) => (
                Self {
                    base: format!("postgres://postgres@127.0.0.1:{}", throwaway.port()),
                    throwaway: Some(throwaway),
                    _own_database: None,
                    database: "bench".to_owned(),
                    workers: Vec::new(),
                },
                None,
            ),
            Err(error) => {
                let url = maintenance_url();
                let base = url
                    .rsplit_once('/')
                    .map_or(url.clone(), |(base, _)| base.to_owned());
                let note = format!(
                    "no throwaway PostgreSQL ({error}); using the machine's server at {base}: \
                     commits from pg_stat_database only, statements not counted"
                );
                let database = TestDatabase::create().await;
                (
                    Self {
                        base,
                        throwaway: None,
                        database: database.name.clone(),
                        _own_database: Some(database),
                        workers: Vec::new(),
                    },
                    Some(note),
                )
            }
        }
    }

    /// The Citus cluster's coordinator and a database of the bench's own
    /// on every node (the tables are distributed once migrated:
    /// [`Self::lay_out`]).
    pub async fn citus() -> Self {
        let url = std::env::var("DATABASE_URL")
            .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:9700/postgres".to_owned());
        let base = url
            .rsplit_once('/')
            .map_or(url.clone(), |(base, _)| base.to_owned());
        let admin = connect(&url).await;
        let workers = test_support::citus::workers(&admin)
            .await
            .iter()
            .map(|(host, port)| format!("postgres://postgres@{host}:{port}"))
            .collect();
        let database = TestDatabase::create_on_cluster(&url).await;
        Self {
            base,
            throwaway: None,
            database: database.name.clone(),
            _own_database: Some(database),
            workers,
        }
    }

    pub fn is_citus(&self) -> bool {
        !self.workers.is_empty()
    }

    /// Distributes the migrated tables, on a cluster.
    pub async fn lay_out(&self) {
        if self.is_citus() {
            test_support::citus::distribute(&connect(&self.bench_url()).await).await;
        }
    }

    /// Commits in the bench database on the workers, all together, once
    /// the backends the coordinator had opened there are gone (a backend's
    /// counters are reported when it exits), as [`commits`] counts them.
    pub async fn worker_commits(&self) -> i64 {
        let mut sum = 0;
        for worker in &self.workers {
            let client = connect(&format!("{worker}/postgres")).await;
            wait_quiet(&client, &self.database).await;
            sum += commits(&client, &self.database).await;
        }
        sum
    }

    pub fn url(&self, database: &str) -> String {
        format!("{}/{database}", self.base)
    }

    pub fn bench_url(&self) -> String {
        self.url(&self.database)
    }

    /// The bench database on each worker of the cluster (none on one
    /// PostgreSQL).
    pub fn worker_bench_urls(&self) -> impl Iterator<Item = String> + '_ {
        self.workers
            .iter()
            .map(|worker| format!("{worker}/{}", self.database))
    }

    pub fn is_throwaway(&self) -> bool {
        self.throwaway.is_some()
    }

    pub fn settings_note(&self) -> String {
        match &self.throwaway {
            Some(t) => format!(
                "throwaway server ({}), {}",
                t.bindir().display(),
                t.settings().join(" ")
            ),
            None if self.is_citus() => format!(
                "a Citus cluster: coordinator {}, workers {}",
                self.base,
                self.workers.join(", ")
            ),
            None => "the machine's server, as configured".to_owned(),
        }
    }
}

/// Waits until every backend of `database` has been idle for 1.5 s (or is
/// gone): a backend sends its counters to pg_stat_database within a second
/// of its last transaction, or when it exits. Idle ones may stay: on a
/// Citus worker, the coordinator keeps its connections open.
pub async fn wait_quiet(monitor: &tokio_postgres::Client, database: &str) {
    for _ in 0..200 {
        let busy: i64 = monitor
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                 WHERE datname = $1 AND backend_type = 'client backend'
                   AND (state IS DISTINCT FROM 'idle'
                        OR state_change > now() - interval '1.5 s')",
                &[&database],
            )
            .await
            .expect("pg_stat_activity")
            .get(0);
        if busy == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("  (backends of {database} still busy after 10 s)");
}

pub async fn commits(monitor: &tokio_postgres::Client, database: &str) -> i64 {
    monitor
        .execute("SELECT pg_stat_clear_snapshot()", &[])
        .await
        .expect("clear the stats snapshot");
    monitor
        .query_one(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = $1",
            &[&database],
        )
        .await
        .expect("pg_stat_database")
        .get(0)
}
