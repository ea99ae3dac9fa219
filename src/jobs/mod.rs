//! Background tasks of `serve`: expired-key cleanup, pending-order
//! reconciliation, the delivery of order events to the shop, the retention
//! of holds and delivered events, the sale's figures (expired holds,
//! seats by event), and on a cluster the buyers' routes to their workers.
//! Each runs on a tokio interval, is safe with several instances on one
//! database, and stops when told to.

pub mod cleanup;
pub mod outcomes;
pub mod reconcile;
pub mod retention;
pub mod sale;
pub mod shards;

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use idempotency::{Limit, Policy, Route};

use crate::checkout::orders::Orders;
use crate::config::Settings;

/// How often the order events are counted where none is delivered (no
/// `outcomes.webhook_url`), at most.
const UNSENT_COUNT_EVERY: Duration = Duration::from_secs(10);

/// The running tasks; `stop` cancels them and waits for them to finish.
pub struct Jobs {
    cancel: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
}

impl Jobs {
    pub fn spawn(
        route: Route,
        orders: Orders,
        limit: Limit,
        outcomes: Option<outcomes::Outcomes>,
        settings: &Settings,
    ) -> Self {
        let cancel = CancellationToken::new();
        let pool = route.home().clone();
        let cleanup = cleanup::Cleanup::new(pool.clone(), settings.idempotency.ttl());
        let retention =
            retention::Retention::new(pool.clone(), &settings.holds, &settings.outcomes);
        let reconcile = reconcile::Reconcile::new(pool.clone(), orders, &settings.reconcile);
        let sale = sale::Sale::new(
            route.clone(),
            Policy {
                ttl: settings.idempotency.ttl(),
                lease: settings.idempotency.lease(),
            },
        );
        let mut tasks = vec![
            every(
                settings.idempotency.cleanup_interval(),
                cancel.clone(),
                move || {
                    let cleanup = cleanup.clone();
                    async move { cleanup.run_logged().await }
                },
            ),
            // The key cleanup's cadence: both delete what a day of sales
            // left behind.
            every(settings.idempotency.cleanup_interval(), cancel.clone(), {
                let stop = cancel.clone();
                move || {
                    let (retention, stop) = (retention.clone(), stop.clone());
                    async move { retention.run_logged(&stop).await }
                }
            }),
            every(settings.reconcile.interval(), cancel.clone(), move || {
                let reconcile = reconcile.clone();
                async move { reconcile.run_logged().await }
            }),
            every(sale::TICK, cancel.clone(), move || {
                let sale = sale.clone();
                async move { sale.run_logged().await }
            }),
            every(shards::EVERY, cancel.clone(), move || {
                let route = route.clone();
                async move {
                    shards::refresh_logged(&route).await;
                }
            }),
            // The limit's buckets of buyers not seen lately are full again:
            // forget them, so that its memory holds only recent buyers.
            every(Duration::from_secs(60), cancel.clone(), move || {
                let limit = limit.clone();
                async move { limit.shrink() }
            }),
        ];
        if let Some(outcomes) = outcomes {
            let stop = cancel.clone();
            tasks.push(every(settings.outcomes.poll(), cancel.clone(), move || {
                let (outcomes, stop) = (outcomes.clone(), stop.clone());
                async move { outcomes.run_logged(&stop).await }
            }));
        } else {
            // Nothing is delivered, but events are still written: counted,
            // a forgotten URL is a backlog the alert sees. Not as often as a
            // delivery looks: nothing drains it, and the alert reads ages of
            // minutes.
            let every_so_often = settings.outcomes.poll().max(UNSENT_COUNT_EVERY);
            tasks.push(every(every_so_often, cancel.clone(), move || {
                let pool = pool.clone();
                async move { outcomes::measure_backlog_logged(&pool).await }
            }));
        }
        Self { cancel, tasks }
    }

    pub async fn stop(self) {
        self.cancel.cancel();
        for task in self.tasks {
            let _ = task.await;
        }
    }
}

/// Runs `job` every `period` (the first run after one period) until
/// cancelled. A run in progress is finished, not cut off.
fn every<F, Fut>(period: Duration, cancel: CancellationToken, job: F) -> JoinHandle<()>
where
    F: Fn() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + Send,
{
    tokio::spawn(async move {
        let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = ticks.tick() => job().await,
            }
        }
    })
}
