//! Settles orders left in `payment_pending` (a lost answer, a crash, a
//! timeout): asks Payrail again with the order's own key, which never
//! charges twice, then settles the order and stores the outcome on its key.
//!
//! Several instances share the work: each run claims due orders by pushing
//! their next attempt into the future, one conditional update per order
//! that only one run can win, and only then calls Payrail, holding no
//! connection meanwhile.
//! An order whose charge keeps failing is retried with a growing delay; one
//! still undecided `reconcile.give_up_secs` after it was made is canceled
//! at Payrail instead, until Payrail confirms, and then `failed`.
//!
//! Its Payrail calls neither feed the circuit breaker nor are refused by
//! it: the breaker guards buyers' clicks, and one stuck order, retried here
//! for as long as it takes, must not keep it open for everybody else.

use std::time::Duration;

use deadpool_postgres::Pool;
use futures_util::StreamExt;
use uuid::Uuid;

use crate::checkout::orders::{give_up, settle, Orders};
use crate::checkout::CheckoutError;
use crate::config::ReconcileSettings;
use crate::observe::{labels, Counter, Gauge, Metric};

/// Orders claimed per run, and Payrail calls in flight at once.
const BATCH: i64 = 100;
const CONCURRENCY: usize = 16;
/// The longest wait between two attempts on one order.
const MAX_DELAY_SECS: f64 = 3600.0;

/// A claimed order: whose, which, its attempts so far, and whether to give
/// up on it (cancel) rather than ask for its charge again.
struct Due {
    user_id: String,
    order_id: Uuid,
    attempts: i32,
    give_up: bool,
}

labels! {
    /// How a run ended: `failed` when it could not even claim its batch
    /// (the database), whatever its orders did.
    #[label = "result"]
    enum RunResult {
        Done = "done",
        Failed = "failed",
    }
}

labels! {
    /// What became of one claimed order.
    #[label = "result"]
    enum OrderResult {
        Settled = "settled",
        /// Still no answer from Payrail (or no confirmation of its cancel):
        /// tried again later.
        Failed = "failed",
        /// Canceled at Payrail and `failed`: Payrail never decided.
        GaveUp = "gave_up",
    }
}

const RUNS: Counter<RunResult> = Counter::new(
    "reconcile_runs_total",
    "Reconciliation runs by result (failed: the run could not claim its batch)",
);
const ORDERS: Counter<OrderResult> = Counter::new(
    "reconcile_orders_total",
    "Pending orders reconciliation tried, by result",
);
const PENDING: Gauge = Gauge::new(
    "orders_pending",
    "Orders in payment_pending at the last reconciliation run",
);
/// What reconciliation reports, for the recorder (`observe::install`).
pub const METRICS: &[&dyn Metric] = &[&RUNS, &ORDERS, &PENDING];

fn ran(result: RunResult, orders: &[OrderResult]) {
    RUNS.of(result).increment(1);
    for order in orders {
        ORDERS.of(*order).increment(1);
    }
}

#[derive(Clone)]
pub struct Reconcile {
    pool: Pool,
    orders: Orders,
    grace: Duration,
    give_up: Duration,
    base_delay: Duration,
}

#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub settled: usize,
    pub failed: usize,
    pub gave_up: usize,
}

impl Reconcile {
    pub fn new(pool: Pool, orders: Orders, settings: &ReconcileSettings) -> Self {
        Self {
            pool,
            orders,
            grace: settings.grace(),
            give_up: settings.give_up(),
            base_delay: settings.interval(),
        }
    }

    pub async fn run(&self) -> Result<Report, CheckoutError> {
        let (due, pending) = match self.claim_due().await {
            Ok(claimed) => claimed,
            Err(error) => {
                ran(RunResult::Failed, &[]);
                return Err(error);
            }
        };
        PENDING.get().set(pending as f64);
        let results: Vec<OrderResult> = futures_util::stream::iter(due)
            .map(|due| self.settle_one(due))
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        let count = |wanted| results.iter().filter(|r| **r == wanted).count();
        let report = Report {
            settled: count(OrderResult::Settled),
            failed: count(OrderResult::Failed),
            gave_up: count(OrderResult::GaveUp),
        };
        ran(RunResult::Done, &results);
        Ok(report)
    }

    pub async fn run_logged(&self) {
        match self.run().await {
            Ok(report) if report == Report::default() => {}
            Ok(report) => tracing::info!(
                settled = report.settled,
                failed = report.failed,
                gave_up = report.gave_up,
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
    ///
    /// An order nearing its give-up time is claimed no later than then,
    /// whatever its doubling delay says.
    async fn claim_due(&self) -> Result<(Vec<Due>, i64), CheckoutError> {
        let client = self.pool.get().await?;
        let due = client
            .prepare_cached(
                "SELECT user_id, order_id, reconcile_attempts,
                        extract(epoch FROM now() - created_at)::float8 AS age,
                        cancel_requested_at IS NOT NULL AS canceling
                 FROM orders
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
            let (age, canceling): (f64, bool) = (row.try_get(3)?, row.try_get(4)?);
            let give_up_in = self.give_up.as_secs_f64() - age;
            let delay = if give_up_in > 0.0 {
                self.delay(attempts).min(give_up_in)
            } else {
                self.delay(attempts)
            };
            if client
                .execute(&claim, &[&user_id, &order_id, &attempts, &delay])
                .await?
                == 1
            {
                claimed.push(Due {
                    user_id,
                    order_id,
                    attempts: attempts + 1,
                    give_up: canceling || give_up_in <= 0.0,
                });
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

    async fn settle_one(&self, due: Due) -> OrderResult {
        let tried = if due.give_up {
            give_up::give_up(&self.orders, &due.user_id, due.order_id)
                .await
                .map(|_| OrderResult::GaveUp)
        } else {
            self.try_settle(&due.user_id, due.order_id)
                .await
                .map(|()| OrderResult::Settled)
        };
        tried.unwrap_or_else(|error| {
            let (order_id, attempts) = (due.order_id, due.attempts);
            tracing::warn!(%order_id, attempts, %error, "pending order still unsettled");
            OrderResult::Failed
        })
    }

    async fn try_settle(&self, user_id: &str, order_id: Uuid) -> Result<(), CheckoutError> {
        let Some((_, outcome)) = settle::charge_again(&self.orders, user_id, order_id).await?
        else {
            return Ok(());
        };
        let settlement = settle::unclaimed(&self.orders, user_id, order_id, &outcome).await?;
        tracing::info!(%order_id, ?outcome, ?settlement, "settled a pending order");
        Ok(())
    }
}
