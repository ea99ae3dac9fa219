//! Deletes idempotency keys older than the TTL, in bounded batches so that
//! no statement holds traffic up. One instance at a time: the run holds a
//! session advisory lock, released at the end, or with its connection,
//! which is closed rather than pooled when the run fails midway.

use std::time::{Duration, Instant};

use deadpool_postgres::{Object, Pool};

use crate::db::DbError;
use crate::idempotency::store;

/// Rows per statement: large enough to go fast, small enough to stay brief
/// (a few milliseconds).
const BATCH: i64 = 2_000;
/// The advisory lock that lets one instance at a time clean up.
pub const CLEANUP_LOCK: i64 = 0x5354_4147_434c_4e55; // "STAGCLNU"

#[derive(Clone)]
pub struct Cleanup {
    pool: Pool,
    ttl: Duration,
}

/// What a run did.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    Deleted(u64),
    /// Another instance was already cleaning.
    Skipped,
}

impl Cleanup {
    pub fn new(pool: Pool, ttl: Duration) -> Self {
        Self { pool, ttl }
    }

    pub async fn run(&self) -> Result<Outcome, DbError> {
        let client = self.pool.get().await?;
        let locked: bool = client
            .query_one("SELECT pg_try_advisory_lock($1)", &[&CLEANUP_LOCK])
            .await?
            .try_get(0)?;
        if !locked {
            return Ok(Outcome::Skipped);
        }
        match self.delete_in_batches(&client).await {
            Ok(deleted) => {
                client
                    .execute("SELECT pg_advisory_unlock($1)", &[&CLEANUP_LOCK])
                    .await?;
                Ok(Outcome::Deleted(deleted))
            }
            Err(error) => {
                // Close this connection instead of pooling it: the lock goes with it.
                drop(Object::take(client));
                Err(error)
            }
        }
    }

    async fn delete_in_batches(&self, client: &Object) -> Result<u64, DbError> {
        let mut deleted = 0;
        loop {
            let started = Instant::now();
            let batch = store::delete_expired(client, self.ttl, BATCH).await?;
            deleted += batch;
            if batch < BATCH as u64 {
                return Ok(deleted);
            }
            // Rest as long as the batch took, so that a backlog never takes
            // more than half of the database's time from the clicks; it
            // still goes at well over 100,000 rows a second.
            tokio::time::sleep(started.elapsed()).await;
        }
    }

    pub async fn run_logged(&self) {
        let started = std::time::Instant::now();
        match self.run().await {
            Ok(Outcome::Deleted(rows)) => {
                crate::observe::cleanup_run("done", rows);
                tracing::info!(
                    rows,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "deleted expired idempotency keys"
                )
            }
            Ok(Outcome::Skipped) => {
                crate::observe::cleanup_run("skipped", 0);
                tracing::debug!("key cleanup already running elsewhere")
            }
            Err(error) => {
                crate::observe::cleanup_run("failed", 0);
                tracing::warn!(error = %anyhow::Error::from(error), "key cleanup failed")
            }
        }
    }
}
