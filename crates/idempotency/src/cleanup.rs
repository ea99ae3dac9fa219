//! Deletes keys older than the TTL, in bounded batches so that no statement
//! holds traffic up. One instance at a time: a run holds a session advisory
//! lock, released at the end, or with its connection, which is closed rather
//! than pooled when the run fails midway.

use std::time::{Duration, Instant, SystemTime};

use deadpool_postgres::{GenericClient, Object, Pool};

use crate::error::Error;
use crate::layout::Layout;

/// Rows per statement on one PostgreSQL: large enough to go fast, small
/// enough to stay brief (a few milliseconds). Each slice of the run is a
/// range of `created_at` sized for about that many rows by the slices
/// before it; no statement counts rows ahead (on Citus, a query for the
/// batch's last row fetches a batch from every shard).
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
pub enum Swept {
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
    pub async fn run(&self) -> Result<Swept, Error> {
        let client = self.pool.get().await?;
        let locked: bool = client
            .query_one("SELECT pg_try_advisory_lock($1)", &[&CLEANUP_LOCK])
            .await?
            .try_get(0)?;
        if !locked {
            return Ok(Swept::Skipped);
        }
        match self.delete_in_batches(&client).await {
            Ok(deleted) => {
                client
                    .execute("SELECT pg_advisory_unlock($1)", &[&CLEANUP_LOCK])
                    .await?;
                Ok(Swept::Deleted(deleted))
            }
            Err(error) => {
                // Close this connection instead of pooling it: the lock goes with it.
                drop(Object::take(client));
                Err(error)
            }
        }
    }

    async fn delete_in_batches(&self, client: &Object) -> Result<u64, Error> {
        let shards = shards(client).await?;
        if shards == 1 {
            return self.delete_slices(client, BATCH).await;
        }
        // On Citus, each worker runs its shards' parts of a slice one after
        // the other on one connection, instead of on as many connections
        // as it has shards: the traffic's backends then share a worker's
        // cores with one of the cleanup's, not dozens.
        client
            .batch_execute("SET citus.max_adaptive_executor_pool_size = 1")
            .await?;
        let deleted = self
            .delete_slices(client, BATCH * (shards / 8).max(1))
            .await?;
        client
            .batch_execute("RESET citus.max_adaptive_executor_pool_size")
            .await?;
        Ok(deleted)
    }

    /// Deletes the expired keys by slices of about `target` rows.
    async fn delete_slices(&self, client: &Object, target: i64) -> Result<u64, Error> {
        let mut deleted = 0;
        let Some(oldest) = oldest_expired(client, self.ttl, None).await? else {
            return Ok(0);
        };
        let mut after = just_before(oldest);
        let mut width = FIRST_WIDTH;
        loop {
            let started = Instant::now();
            let end = after + width;
            let rows = delete_slice(client, self.ttl, after, end).await?;
            deleted += rows;
            after = end;
            if rows == 0 {
                // A gap in `created_at`: go on from the next expired row.
                match oldest_expired(client, self.ttl, Some(after)).await? {
                    Some(next) => after = just_before(next),
                    None => return Ok(deleted),
                }
            }
            width = next_width(width, rows, target);
            // Rest as long as the slice took, so that a backlog never takes
            // more than half of the database's time from the traffic.
            tokio::time::sleep(started.elapsed()).await;
        }
    }
}

/// A moment before `at`, so that a slice that starts there takes the rows
/// made at `at` (the database keeps microseconds).
fn just_before(at: SystemTime) -> SystemTime {
    at.checked_sub(Duration::from_micros(1)).unwrap_or(at)
}

/// The first slice's width of `created_at`; the next ones are sized by how
/// many rows each one held.
const FIRST_WIDTH: Duration = Duration::from_secs(1);

/// The width of the next slice, for about `target` rows where the last one,
/// `width` wide, held `rows`. At most eight times as wide: a slice that held
/// a few rows says little about the next, where keys may be made faster;
/// from a dozen rows on, a backlog reaches full slices in a few steps.
/// Where keys were made at a steady rate a slice holds about `target`; a
/// burst of keys denser than the slice before it all goes in one statement.
fn next_width(width: Duration, rows: u64, target: i64) -> Duration {
    let scale = if rows == 0 {
        8.0
    } else {
        (target as f64 / rows as f64).min(8.0)
    };
    width.mul_f64(scale).max(Duration::from_micros(1))
}

/// How many pieces (Citus shards) the key table is split into; 1 on a
/// table that is not split. A slice's statement pays a task for each shard
/// and a two-phase commit on each worker, so on a split table a slice takes
/// `BATCH` rows for every eight shards (8,000 on 32): of 4,000, 8,000 and
/// 16,000 on a three-node cluster, that deleted fastest under traffic
/// (docs/decisions/0005-cleanup-slices.md of stagedoor-checkout).
async fn shards(client: &impl GenericClient) -> Result<i64, Error> {
    if Layout::of(client).await? == Layout::Single {
        return Ok(1);
    }
    let count: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_catalog.pg_dist_shard
             WHERE logicalrelid = 'idempotency_keys'::regclass",
            &[],
        )
        .await?
        .try_get(0)?;
    Ok(count.max(1))
}

/// The `created_at` of the oldest expired key after `after`, if any: one
/// row from the top of the `created_at` index (of each shard, on Citus,
/// which then takes the least).
async fn oldest_expired(
    client: &impl GenericClient,
    ttl: Duration,
    after: Option<SystemTime>,
) -> Result<Option<SystemTime>, Error> {
    let statement = client
        .prepare_cached(
            "SELECT min(created_at) FROM idempotency_keys
             WHERE created_at > COALESCE($2, '-infinity'::timestamptz)
               AND created_at < now() - make_interval(secs => $1)",
        )
        .await?;
    let row = client
        .query_one(&statement, &[&ttl.as_secs_f64(), &after])
        .await?;
    Ok(row.try_get(0)?)
}

/// Deletes the expired keys of one slice of `created_at`, `(after, end]`,
/// except those whose linked effect is still settling; returns how many
/// went.
///
/// One range of the `created_at` index, no per-row lookup: each row is
/// deleted where the index scan finds it. It names no physical address
/// (`ctid`), locks nothing beforehand and reads no other row or table, so
/// on a table distributed by `user_id` (Citus) the same statement runs on
/// every shard, each through its own index. A row that a request restarts
/// meanwhile (an expired-key takeover sets `created_at` to now) survives
/// because the expiry is part of the statement's condition, which
/// PostgreSQL rechecks on the row's latest version.
async fn delete_slice(
    client: &impl GenericClient,
    ttl: Duration,
    after: SystemTime,
    end: SystemTime,
) -> Result<u64, Error> {
    const DELETE: &str = concat!(
        "DELETE FROM idempotency_keys AS k
         WHERE k.created_at > $2 AND k.created_at <= $3
           AND k.created_at < now() - make_interval(secs => $1)
           AND NOT ",
        settling!()
    );
    let statement = client.prepare_cached(DELETE).await?;
    Ok(client
        .execute(&statement, &[&ttl.as_secs_f64(), &after, &end])
        .await?)
}
