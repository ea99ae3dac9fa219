//! Deletes keys older than the TTL, in bounded batches so that no statement
//! holds traffic up. One instance at a time: a run holds a session advisory
//! lock, released at the end, or with its connection, which is closed rather
//! than pooled when the run fails midway.

use std::time::{Duration, Instant, SystemTime};

use deadpool_postgres::{GenericClient, Object, Pool};

use crate::{Error, Settling};

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
    settling: Settling,
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
        Self {
            pool,
            ttl,
            settling: Settling::NEVER,
        }
    }

    /// Keeps an expired key whose linked effect is still `settling` until it
    /// settles: its answer is still to be stored on it, and a retry of its
    /// click must find it, not start a second effect.
    pub fn with_settling(mut self, settling: Settling) -> Self {
        self.settling = settling;
        self
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
        let mut after = None;
        loop {
            let started = Instant::now();
            let end = slice_end(client, self.ttl, after, BATCH).await?;
            deleted += delete_slice(client, self.ttl, self.settling, after, end).await?;
            let Some(end) = end else {
                return Ok(deleted);
            };
            after = Some(end);
            // Rest as long as the slice took, so that a backlog never takes
            // more than half of the database's time from the traffic.
            tokio::time::sleep(started.elapsed()).await;
        }
    }
}

/// Where the next slice of expired keys after `after` ends: the
/// `created_at` of its `batch`-th oldest row, found in the `created_at`
/// index; `None` when fewer are left (the last slice takes them all).
async fn slice_end(
    client: &impl GenericClient,
    ttl: Duration,
    after: Option<SystemTime>,
    batch: i64,
) -> Result<Option<SystemTime>, Error> {
    let statement = client
        .prepare_cached(
            "SELECT created_at FROM idempotency_keys
             WHERE created_at > COALESCE($2, '-infinity'::timestamptz)
               AND created_at < now() - make_interval(secs => $1)
             ORDER BY created_at
             OFFSET $3::bigint - 1 LIMIT 1",
        )
        .await?;
    let row = client
        .query_opt(&statement, &[&ttl.as_secs_f64(), &after, &batch])
        .await?;
    Ok(row.map(|row| row.try_get(0)).transpose()?)
}

/// Deletes the expired keys of one slice of `created_at`, `(after, end]`,
/// except those whose linked effect is `settling`.
///
/// One range of the `created_at` index, no per-row lookup: each row is
/// deleted where the index scan finds it. It names no physical address
/// (`ctid`), locks nothing beforehand and reads no other shard's rows, so
/// on a table distributed by `user_id` (Citus) the same statement runs on
/// every shard, each through its own index; the settling guard joins the
/// caller's tables on `k.user_id`, which keeps it on the shard. A row that a
/// request restarts meanwhile (an expired-key takeover sets `created_at` to
/// now) survives because the expiry is part of the statement's condition,
/// which PostgreSQL rechecks on the row's latest version. Rows that share
/// the slice's last `created_at` all go in this slice.
async fn delete_slice(
    client: &impl GenericClient,
    ttl: Duration,
    settling: Settling,
    after: Option<SystemTime>,
    end: Option<SystemTime>,
) -> Result<u64, Error> {
    let guard = settling.of_key();
    let statement = client
        .prepare_cached(&format!(
            "DELETE FROM idempotency_keys AS k
             WHERE k.created_at > COALESCE($2, '-infinity'::timestamptz)
               AND k.created_at <= COALESCE($3, 'infinity'::timestamptz)
               AND k.created_at < now() - make_interval(secs => $1)
               AND NOT {guard}"
        ))
        .await?;
    Ok(client
        .execute(&statement, &[&ttl.as_secs_f64(), &after, &end])
        .await?)
}

/// Deletes up to about `batch` rows older than the TTL, oldest first (a
/// slice of `created_at`, see `delete_slice`); returns how many went.
pub async fn delete_expired(
    client: &impl GenericClient,
    ttl: Duration,
    batch: i64,
) -> Result<u64, Error> {
    let end = slice_end(client, ttl, None, batch).await?;
    delete_slice(client, ttl, Settling::NEVER, None, end).await
}
