//! Settles orders left in `payment_pending` (a lost answer, a crash, a
//! timeout): asks Payrail again with the order's own key, which never
//! charges twice, then settles the order and stores the outcome on its key.
//!
//! Several instances share the work: each run claims due orders by pushing
//! their next attempt into the future, one conditional update per order
//! that only one run can win, and only then calls Payrail, holding no
//! connection meanwhile.
//! An order whose charge keeps failing is retried with a growing delay.

use std::time::Duration;

use deadpool_postgres::Pool;
use futures_util::StreamExt;
use uuid::Uuid;

use crate::checkout::orders::Orders;
use crate::checkout::CheckoutError;
use crate::config::ReconcileSettings;
use crate::observe;

/// Orders claimed per run, and Payrail calls in flight at once.
const BATCH: i64 = 100;
const CONCURRENCY: usize = 16;
/// The longest wait between two attempts on one order.
const MAX_DELAY_SECS: f64 = 3600.0;

/// How a run ended, as `reconcile_runs_total` counts it: `failed` when it
/// could not even claim its batch (the database), whatever its orders did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunResult {
    Done,
    Failed,
}

impl RunResult {
    /// Every value, for the metric's series at zero (`observe`).
    pub const ALL: [RunResult; 2] = [RunResult::Done, RunResult::Failed];

    pub fn as_str(self) -> &'static str {
        match self {
            RunResult::Done => "done",
            RunResult::Failed => "failed",
        }
    }
}

/// What became of one claimed order, as `reconcile_orders_total` counts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OrderResult {
    Settled,
    /// Still no answer from Payrail: tried again later.
    Failed,
}

impl OrderResult {
    /// Every value, for the metric's series at zero (`observe`).
    pub const ALL: [OrderResult; 2] = [OrderResult::Settled, OrderResult::Failed];

    pub fn as_str(self) -> &'static str {
        match self {
            OrderResult::Settled => "settled",
            OrderResult::Failed => "failed",
        }
    }
}

#[derive(Clone)]
pub struct Reconcile {
    pool: Pool,
    orders: Orders,
    grace: Duration,
    base_delay: Duration,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub settled: usize,
    pub failed: usize,
}

impl Reconcile {
    pub fn new(pool: Pool, orders: Orders, settings: &ReconcileSettings) -> Self {
        Self {
            pool,
            orders,
            grace: settings.grace(),
            base_delay: settings.interval(),
        }
    }

    pub async fn run(&self) -> Result<Report, CheckoutError> {
        let (due, pending) = match self.claim_due().await {
            Ok(claimed) => claimed,
            Err(error) => {
                observe::reconcile_run(RunResult::Failed, 0, 0);
                return Err(error);
            }
        };
        observe::orders_pending(pending);
        let results: Vec<bool> = futures_util::stream::iter(due)
            .map(|(user_id, order_id, attempts)| self.settle_one(user_id, order_id, attempts))
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        let settled = results.iter().filter(|ok| **ok).count();
        let failed = results.len() - settled;
        observe::reconcile_run(RunResult::Done, settled, failed);
        Ok(Report { settled, failed })
    }

    pub async fn run_logged(&self) {
        match self.run().await {
            Ok(report) if report == Report::default() => {}
            Ok(report) => tracing::info!(
                settled = report.settled,
                failed = report.failed,
                "reconciled pending orders"
            ),
            Err(error) => tracing::warn!(%error, "reconciliation failed"),
        }
    }

    /// Claims due orders: each is hidden from other runs until its next
    /// attempt time, which doubles with every attempt.
    /// Also counts the orders still pending, for the `orders_pending` gauge.
    ///
    /// Due orders are found by a plain read, then claimed one by one, each
    /// by an update of that order alone (by its key, so on one shard of a
    /// distributed database) that only succeeds if nobody has claimed it
    /// since it was read: of several instances that read the same order,
    /// one claims it, the others skip it. A lock on the whole batch (`FOR
    /// UPDATE SKIP LOCKED`) is something a distributed database cannot
    /// take across its shards.
    async fn claim_due(&self) -> Result<(Vec<(String, Uuid, i32)>, i64), CheckoutError> {
        let client = self.pool.get().await?;
        let due = client
            .prepare_cached(
                "SELECT user_id, order_id, reconcile_attempts FROM orders
                 WHERE status = 'payment_pending'
                   AND created_at <= now() - make_interval(secs => $1)
                   AND reconcile_after <= now()
                 ORDER BY reconcile_after
                 LIMIT $2",
            )
            .await?;
        let rows = client
            .query(&due, &[&self.grace.as_secs_f64(), &BATCH])
            .await?;
        // The delay is worked out here, not in the statement: a distributed
        // database evaluates `now()` once, before it routes an update, and
        // cannot do that for an expression that reads the row.
        let claim = client
            .prepare_cached(
                "UPDATE orders
                 SET reconcile_attempts = reconcile_attempts + 1,
                     reconcile_after = now() + make_interval(secs => $4)
                 WHERE user_id = $1 AND order_id = $2 AND reconcile_attempts = $3
                   AND status = 'payment_pending'",
            )
            .await?;
        let mut claimed = Vec::with_capacity(rows.len());
        for row in rows {
            let (user_id, order_id, attempts): (String, Uuid, i32) =
                (row.try_get(0)?, row.try_get(1)?, row.try_get(2)?);
            let delay = self.delay(attempts);
            if client
                .execute(&claim, &[&user_id, &order_id, &attempts, &delay])
                .await?
                == 1
            {
                claimed.push((user_id, order_id, attempts + 1));
            }
        }
        let pending: i64 = client
            .query_one(
                "SELECT count(*) FROM orders WHERE status = 'payment_pending'",
                &[],
            )
            .await?
            .try_get(0)?;
        Ok((claimed, pending))
    }

    /// Seconds until the next attempt after `attempts` earlier ones: the
    /// interval, doubled with every attempt, at most an hour.
    fn delay(&self, attempts: i32) -> f64 {
        let doublings = attempts.clamp(0, 20);
        (self.base_delay.as_secs_f64() * 2f64.powi(doublings)).min(MAX_DELAY_SECS)
    }

    async fn settle_one(&self, user_id: String, order_id: Uuid, attempts: i32) -> bool {
        match self.try_settle(&user_id, order_id).await {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(%order_id, attempts, %error, "pending order still unsettled");
                false
            }
        }
    }

    async fn try_settle(&self, user_id: &str, order_id: Uuid) -> Result<(), CheckoutError> {
        let Some((_, outcome)) = self.orders.charge_again(user_id, order_id).await? else {
            return Ok(());
        };
        self.orders
            .settle_unclaimed(user_id, order_id, &outcome)
            .await?;
        tracing::info!(%order_id, ?outcome, "settled a pending order");
        Ok(())
    }
}
