//! Deletes keys older than the TTL, in bounded batches so that no statement
//! holds traffic up. One instance at a time: a run holds a session advisory
//! lock, released at the end, or with its connection, which is closed rather
//! than pooled when the run fails midway.

use std::time::{Duration, Instant};

use deadpool_postgres::{GenericClient, Object, Pool};

use crate::Error;

/// Rows per statement: large enough to go fast, small enough to stay brief
/// (a few milliseconds).
pub const BATCH: i64 = 2_000;
/// The advisory lock that lets one instance at a time clean up.
pub const CLEANUP_LOCK: i64 = 0x4944_454d_434c_4e55; // "IDEMCLNU"

/// The cleanup of one key table.
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

    /// Deletes every expired key, batch by batch, unless another instance is
    /// at it already.
    pub async fn run(&self) -> Result<Outcome, Error> {
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

    async fn delete_in_batches(&self, client: &Object) -> Result<u64, Error> {
        let mut deleted = 0;
        loop {
            let started = Instant::now();
            let batch = delete_expired(client, self.ttl, BATCH).await?;
            deleted += batch;
            if batch < BATCH as u64 {
                return Ok(deleted);
            }
            // Rest as long as the batch took, so that a backlog never takes
            // more than half of the database's time from the traffic; it
            // still goes at well over 100,000 rows a second.
            tokio::time::sleep(started.elapsed()).await;
        }
    }
}

/// Deletes up to `batch` rows older than the TTL, oldest first; returns how
/// many went. Rows are named by their key (`user_id`, `key`), which a table
/// distributed by `user_id` can route, not by their physical address. The
/// batch's keys go through arrays (`unnest`) so that the delete finds each
/// row by the primary key: a plain `(user_id, key) IN (SELECT …)` is planned
/// (generic plans) as a hash join over every expired row, 4-5 times slower
/// per batch. No row locks are taken before the delete (they would write
/// every row twice). A row that a request restarts meanwhile (a takeover of
/// an expired key sets `created_at`) survives because the expiry is part of
/// the delete's own condition, which PostgreSQL rechecks on the row's latest
/// version.
pub async fn delete_expired(
    client: &impl GenericClient,
    ttl: Duration,
    batch: i64,
) -> Result<u64, Error> {
    let statement = client
        .prepare_cached(
            "WITH oldest AS (
                 SELECT array_agg(user_id) AS users, array_agg(key) AS keys
                 FROM (SELECT user_id, key FROM idempotency_keys
                       WHERE created_at < now() - make_interval(secs => $1)
                       ORDER BY created_at
                       LIMIT $2) batch
             )
             DELETE FROM idempotency_keys
             WHERE (user_id, key) IN (
                     SELECT * FROM unnest((SELECT users FROM oldest), (SELECT keys FROM oldest)))
               AND created_at < now() - make_interval(secs => $1)",
        )
        .await?;
    Ok(client
        .execute(&statement, &[&ttl.as_secs_f64(), &batch])
        .await?)
}
