//! The expired-key cleanup of `serve` and `stagedoor-checkout cleanup`: the
//! engine's batched deletion, with this service's logs and metrics.

use std::time::{Duration, Instant};

use deadpool_postgres::Pool;
pub use idempotency::cleanup::Swept;

use crate::checkout::orders;
use crate::observe;

/// How a run ended, as `cleanup_runs_total` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunResult {
    /// It ran (and deleted zero or more rows).
    Done,
    /// Another instance was already cleaning.
    Skipped,
    Failed,
}

impl RunResult {
    /// Every value, for the metric's series at zero (`observe`).
    pub const ALL: [RunResult; 3] = [RunResult::Done, RunResult::Skipped, RunResult::Failed];

    pub fn as_str(self) -> &'static str {
        match self {
            RunResult::Done => "done",
            RunResult::Skipped => "skipped",
            RunResult::Failed => "failed",
        }
    }
}

#[derive(Clone)]
pub struct Cleanup(idempotency::Cleanup);

impl Cleanup {
    /// A key whose order is still waiting for its payment outlives its TTL
    /// until the order settles (`orders::SETTLING`, as `keys purge` decides).
    pub fn new(pool: Pool, ttl: Duration) -> Self {
        Self(idempotency::Cleanup::new(pool, ttl).with_settling(orders::SETTLING))
    }

    pub async fn run(&self) -> Result<Swept, idempotency::Error> {
        self.0.run().await
    }

    pub async fn run_logged(&self) {
        let started = Instant::now();
        match self.run().await {
            Ok(Swept::Deleted(rows)) => {
                observe::cleanup_run(RunResult::Done, rows);
                tracing::info!(
                    rows,
                    elapsed_ms = started.elapsed().as_millis() as u64,
                    "deleted expired idempotency keys"
                )
            }
            Ok(Swept::Skipped) => {
                observe::cleanup_run(RunResult::Skipped, 0);
                tracing::debug!("key cleanup already running elsewhere")
            }
            Err(error) => {
                observe::cleanup_run(RunResult::Failed, 0);
                tracing::warn!(error = %anyhow::Error::from(error), "key cleanup failed")
            }
        }
    }
}
