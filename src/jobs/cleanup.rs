//! The expired-key cleanup of `serve` and `stagedoor-checkout cleanup`: the
//! engine's batched deletion, with this service's logs and metrics.

use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
pub use idempotency::cleanup::Swept;

use crate::observe::{labels, Counter, Metric};

labels! {
    /// How a run ended.
    #[label = "result"]
    enum RunResult {
        /// It ran (and deleted zero or more rows).
        Done = "done",
        /// Another instance was already cleaning.
        Skipped = "skipped",
        Failed = "failed",
    }
}

const RUNS: Counter<RunResult> =
    Counter::new("cleanup_runs_total", "Expired-key cleanup runs by result");
const ROWS_DELETED: Counter = Counter::new(
    "cleanup_rows_deleted_total",
    "Expired idempotency keys deleted",
);
/// What the cleanup reports, for the recorder (`observe::install`).
pub const METRICS: &[&dyn Metric] = &[&RUNS, &ROWS_DELETED];

fn ran(result: RunResult, rows: u64) {
    RUNS.of(result).increment(1);
    ROWS_DELETED.get().increment(rows);
}

#[derive(Clone)]
pub struct Cleanup(idempotency::Cleanup);

impl Cleanup {
    /// A key whose order is still waiting for its payment outlives its TTL
    /// until the order settles (the settlement says so on the key, as
    /// `keys purge` finds it).
    pub fn new(pool: Pool, ttl: Duration) -> Self {
        Self(idempotency::Cleanup::new(pool, ttl))
    }

    pub async fn run(&self) -> Result<Swept, idempotency::Error> {
        self.0.run().await
    }

    pub async fn run_logged(&self) {
        let started = Instant::now();
        match self.run().await {
            Ok(Swept::Deleted(rows)) => {
                ran(RunResult::Done, rows);
                tracing::info!(
                    rows,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "deleted expired idempotency keys"
                )
            }
            Ok(Swept::Skipped) => {
                ran(RunResult::Skipped, 0);
                tracing::debug!("key cleanup already running elsewhere")
            }
            Err(error) => {
                ran(RunResult::Failed, 0);
                tracing::warn!(error = %anyhow::Error::from(error), "key cleanup failed")
            }
        }
    }
}
