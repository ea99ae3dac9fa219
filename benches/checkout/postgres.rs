//! The bench's own PostgreSQL: a throwaway server (`test_support::postgres`)
//! with `pg_stat_statements` preloaded, stopped and removed at the end.
//! When none can be had (no `initdb`, no `postgres` user) the bench falls
//! back to the machine's server (`DATABASE_URL` or
//! `postgres://postgres@127.0.0.1:5432/postgres`), in a database of its own
//! dropped at the end, counting commits from `pg_stat_database` only, and
//! says so.

use std::sync::Arc;

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
                t.bindir().display(),
                t.settings().join(" ")
            ),
            None => "the machine's server, as configured".to_owned(),
        }
    }
}
