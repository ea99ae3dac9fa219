//! Retention of `serve`: holds that expired `holds.retention_secs` ago and
//! that no order took, and order events delivered more than
//! `outcomes.keep_days` ago, are deleted, so that neither table grows with
//! every on-sale for ever. Orders are never deleted: they are the shop's
//! records.
//!
//! As the key cleanup does: batches of at most [`BATCH`] rows, oldest due
//! first, each through an index bounded by its due time, with a rest as
//! long as the batch took after each, so that a backlog never takes more
//! than half of the database's time from the traffic; one instance at a
//! time, by a session advisory lock on the connection the run holds (on
//! Citus, the coordinator's, which every instance talks to), released at
//! the end, or with the connection, which is closed rather than pooled when
//! the run fails midway.

use std::future::Future;
use std::time::{Duration, Instant, SystemTime};

use deadpool_postgres::{Object, Pool};
use tokio_util::sync::CancellationToken;

use crate::checkout::holds;
use crate::checkout::orders::outbox;
use crate::config::{HoldSettings, OutcomesSettings};
use crate::db::DbError;
use crate::observe::{labels, Counter, Metric};

/// Rows per statement: a few milliseconds each, as the key cleanup's.
pub const BATCH: i64 = 2_000;
/// The advisory lock that lets one instance at a time delete.
pub const RETENTION_LOCK: i64 = 0x5354_4452_5245_544e; // "STDRRETN"

labels! {
    /// How a run ended.
    #[label = "result"]
    enum RunResult {
        /// It ran to its end (and deleted zero or more rows).
        Done = "done",
        /// Another instance was already deleting.
        Skipped = "skipped",
        /// The database failed it; what it deleted before that is counted.
        Failed = "failed",
    }
}

const RUNS: Counter<RunResult> = Counter::new("retention_runs_total", "Retention runs by result");
const HOLDS_DELETED: Counter = Counter::new(
    "retention_holds_deleted_total",
    "Holds deleted holds.retention_secs after they expired, no order having taken them",
);
const ORDER_EVENTS_DELETED: Counter = Counter::new(
    "retention_order_events_deleted_total",
    "Order events deleted outcomes.keep_days after their delivery",
);
/// What the retention reports, for the recorder (`observe::install`).
pub const METRICS: &[&dyn Metric] = &[&RUNS, &HOLDS_DELETED, &ORDER_EVENTS_DELETED];

/// What a run did.
#[derive(Debug, PartialEq, Eq)]
pub enum Swept {
    Deleted {
        holds: u64,
        order_events: u64,
    },
    /// Another instance was already deleting.
    Skipped,
}

#[derive(Clone)]
pub struct Retention {
    pool: Pool,
    holds: Duration,
    order_events: Duration,
}

impl Retention {
    pub fn new(pool: Pool, holds: &HoldSettings, outcomes: &OutcomesSettings) -> Self {
        Self {
            pool,
            holds: holds.retention(),
            order_events: outcomes.keep(),
        }
    }

    /// Deletes every row past its retention, unless another instance is at
    /// it already; stops between two batches once `stop` is cancelled (the
    /// next run carries on). Each batch is counted as it goes.
    pub async fn run(&self, stop: &CancellationToken) -> Result<Swept, DbError> {
        let client = self.pool.get().await?;
        let locked: bool = client
            .query_one("SELECT pg_try_advisory_lock($1)", &[&RETENTION_LOCK])
            .await?
            .try_get(0)?;
        if !locked {
            return Ok(Swept::Skipped);
        }
        match self.delete(&client, stop).await {
            Ok(swept) => {
                client
                    .execute("SELECT pg_advisory_unlock($1)", &[&RETENTION_LOCK])
                    .await?;
                Ok(swept)
            }
            Err(error) => {
                // Close this connection instead of pooling it: the lock goes with it.
                drop(Object::take(client));
                Err(error)
            }
        }
    }

    async fn delete(&self, client: &Object, stop: &CancellationToken) -> Result<Swept, DbError> {
        let holds_before = before(client, self.holds).await?;
        let events_before = before(client, self.order_events).await?;
        let holds = in_batches(stop, &HOLDS_DELETED, || {
            holds::delete_expired(client, holds_before, BATCH)
        })
        .await?;
        let order_events = in_batches(stop, &ORDER_EVENTS_DELETED, || {
            outbox::delete_delivered(client, events_before, BATCH)
        })
        .await?;
        Ok(Swept::Deleted {
            holds,
            order_events,
        })
    }

    pub async fn run_logged(&self, stop: &CancellationToken) {
        let started = Instant::now();
        match self.run(stop).await {
            Ok(Swept::Deleted {
                holds,
                order_events,
            }) => {
                RUNS.of(RunResult::Done).increment(1);
                tracing::info!(
                    holds,
                    order_events,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "deleted holds and order events past their retention"
                )
            }
            Ok(Swept::Skipped) => {
                RUNS.of(RunResult::Skipped).increment(1);
                tracing::debug!("retention already running elsewhere")
            }
            Err(error) => {
                RUNS.of(RunResult::Failed).increment(1);
                tracing::warn!(error = %anyhow::Error::from(error), "retention failed")
            }
        }
    }
}

/// The database's now less `retention`: one moment for the whole run, read
/// once, so that no distributed statement evaluates `now()` itself.
async fn before(client: &Object, retention: Duration) -> Result<SystemTime, DbError> {
    Ok(client
        .query_one(
            "SELECT now() - make_interval(secs => $1)",
            &[&retention.as_secs_f64()],
        )
        .await?
        .try_get(0)?)
}

/// Runs `batch` until it deletes fewer than [`BATCH`] rows or `stop` is
/// cancelled, resting as long as each batch took; counts each in `deleted`.
async fn in_batches<F, Fut>(
    stop: &CancellationToken,
    deleted: &Counter,
    mut batch: F,
) -> Result<u64, DbError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<u64, DbError>>,
{
    let mut total = 0;
    loop {
        let started = Instant::now();
        let rows = batch().await?;
        deleted.get().increment(rows);
        total += rows;
        if rows < BATCH as u64 || stop.is_cancelled() {
            return Ok(total);
        }
        tokio::select! {
            _ = stop.cancelled() => return Ok(total),
            _ = tokio::time::sleep(started.elapsed()) => {}
        }
    }
}
