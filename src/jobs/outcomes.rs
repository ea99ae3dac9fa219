//! Delivers the order events (`checkout::orders::outbox`) to the shop's
//! `outcomes.webhook_url`, at least once each, under the event's own id.
//!
//! Each run reads the due events, a batch at a time, and for each, just
//! before sending it, leases it with one conditional update (so that of
//! several instances one sends it, and no two at once: the lease outlasts
//! the delivery's timeout), then `POST`s it signed with
//! `Stagedoor-Signature` (the scheme of `crate::signature`, Payrail's).
//! No connection is held while the shop is being called.
//! A 2xx marks it delivered. Anything else (another status, a refused
//! connection, the timeout) schedules the next attempt, the wait doubling
//! from a second to `outcomes.max_backoff_secs`, until the event has been
//! retried for `outcomes.retry_for_secs`: then it is given up, counted and
//! left for `outcomes resend`. All of that is in the table, so a restart,
//! a crash or another instance carries on where the last attempt left it.
//!
//! The answer's body is never read (its status says everything), and
//! redirects are not followed: a 3xx is a failed delivery.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use deadpool_postgres::Pool;
use futures_util::StreamExt;
use reqwest::header::{HeaderValue, CONTENT_TYPE};
use secrecy::{ExposeSecret, SecretString};
use tokio_util::sync::CancellationToken;

use crate::checkout::orders::outbox::{self, Due, Leased, SIGNATURE_HEADER};
use crate::config::OutcomesSettings;
use crate::db::DbError;
use crate::observe::{labels, Counter, Gauge, Histogram, Metric};

/// Due events read at once (a run reads batches until one is not full),
/// and deliveries in flight at once.
const BATCH: i64 = 100;
const CONCURRENCY: usize = 16;
/// The first retry's wait; each failure doubles it.
const FIRST_RETRY: Duration = Duration::from_secs(1);
/// How much longer than one delivery's timeout a lease lasts: the time to
/// write the result, so that nobody else sends the event meanwhile.
const LEASE_MARGIN: Duration = Duration::from_secs(5);

labels! {
    /// How one delivery ended.
    #[label = "result"]
    enum Delivery {
        /// A 2xx: delivered.
        Delivered = "delivered",
        /// Another status: retried.
        Rejected = "rejected",
        /// No answer within `outcomes.timeout_ms`: retried.
        Timeout = "timeout",
        /// No connection, or it broke: retried.
        Unreachable = "unreachable",
    }
}

const DELIVERIES: Counter<Delivery> = Counter::new(
    "order_event_deliveries_total",
    "Deliveries of order events to the shop, by result",
);
const GIVEN_UP: Counter = Counter::new(
    "order_events_given_up_total",
    "Order events given up after outcomes.retry_for_secs of failed deliveries",
);
const PENDING: Gauge = Gauge::new(
    "order_events_pending",
    "Order events not delivered yet (nor given up), whether or not a URL is set, at this \
     instance's last count",
);
const OLDEST: Gauge = Gauge::new(
    "order_events_oldest_pending_age_seconds",
    "Age of the oldest order event not delivered yet, at this instance's last count",
);
const DURATION: Histogram = Histogram::new(
    "order_event_delivery_duration_seconds",
    "Time from sending an order event to the shop's answer (or the timeout)",
);
/// What the delivery reports, for the recorder (`observe::install`).
pub const METRICS: &[&dyn Metric] = &[&DELIVERIES, &GIVEN_UP, &PENDING, &OLDEST, &DURATION];

#[derive(Clone)]
pub struct Outcomes {
    pool: Pool,
    http: reqwest::Client,
    url: String,
    secret: SecretString,
    lease: Duration,
    max_backoff: Duration,
    retry_for: Duration,
}

/// How one leased event's delivery ended, as written.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ended {
    /// Another instance leased it first (or its order is gone).
    Skipped,
    Delivered,
    /// Failed, and due again later.
    Failed,
    GaveUp,
}

/// What one run did.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub delivered: usize,
    pub failed: usize,
    pub given_up: usize,
}

impl Outcomes {
    /// `None` when `outcomes.webhook_url` is empty: nothing is delivered.
    pub fn new(pool: Pool, settings: &OutcomesSettings) -> Result<Option<Self>, reqwest::Error> {
        if !settings.enabled() {
            return Ok(None);
        }
        let http = reqwest::Client::builder()
            .timeout(settings.timeout())
            .connect_timeout(settings.timeout())
            .redirect(reqwest::redirect::Policy::none())
            .build()?;
        Ok(Some(Self {
            pool,
            http,
            url: settings.webhook_url.clone(),
            secret: settings.webhook_secret.clone(),
            lease: settings.timeout() + LEASE_MARGIN,
            max_backoff: settings.max_backoff(),
            retry_for: settings.retry_for(),
        }))
    }

    /// Delivers the due events, at most [`CONCURRENCY`] at a time, a batch
    /// after another until one is not full (a backlog drains at the pace
    /// the shop takes it) or `stop` is cancelled (a shutdown waits for one
    /// batch, not for the backlog).
    pub async fn run(&self, stop: &CancellationToken) -> Result<Report, DbError> {
        let mut report = Report::default();
        loop {
            let due = {
                let client = self.pool.get().await?;
                outbox::due(&client, BATCH).await?
            };
            let full = due.len() as i64 == BATCH;
            let results: Vec<Ended> = futures_util::stream::iter(due)
                .map(|due| self.deliver_due(due))
                .buffer_unordered(CONCURRENCY)
                .collect()
                .await;
            let count = |wanted| results.iter().filter(|r| **r == wanted).count();
            report.delivered += count(Ended::Delivered);
            report.failed += count(Ended::Failed);
            report.given_up += count(Ended::GaveUp);
            if !full || stop.is_cancelled() {
                break;
            }
        }
        measure_backlog(&self.pool).await?;
        Ok(report)
    }

    pub async fn run_logged(&self, stop: &CancellationToken) {
        match self.run(stop).await {
            Ok(report) if report == Report::default() => {}
            Ok(report) => tracing::info!(
                delivered = report.delivered,
                failed = report.failed,
                given_up = report.given_up,
                "delivered order events"
            ),
            Err(error) => {
                tracing::warn!(error = %anyhow::Error::from(error), "order event delivery failed")
            }
        }
    }

    /// Leases one due event, then delivers it: the lease starts when its
    /// delivery does, so it outlasts it whatever came before in the batch.
    async fn deliver_due(&self, due: Due) -> Ended {
        let leased = async {
            let client = self.pool.get().await?;
            outbox::lease(&client, &due, self.lease).await
        };
        match leased.await {
            Ok(Some(leased)) => self.deliver(leased).await,
            Ok(None) => Ended::Skipped,
            Err(error) => {
                tracing::warn!(order_id = %due.order_id, error = %anyhow::Error::from(error),
                               "an order event could not be leased");
                Ended::Failed
            }
        }
    }

    /// Sends one event and writes what came of it. A result that cannot be
    /// written leaves the lease to run out, and the event is sent again
    /// (same id).
    async fn deliver(&self, leased: Leased) -> Ended {
        let started = std::time::Instant::now();
        let outcome = self.send(&leased).await;
        DURATION.get().record(started.elapsed().as_secs_f64());
        let result = match outcome {
            Ok(status) if status.is_success() => Delivery::Delivered,
            Ok(_) => Delivery::Rejected,
            Err(ref error) if error.is_timeout() => Delivery::Timeout,
            Err(_) => Delivery::Unreachable,
        };
        DELIVERIES.of(result).increment(1);
        let written = async {
            let client = self.pool.get().await?;
            if result == Delivery::Delivered {
                outbox::delivered(&client, &leased).await?;
                return Ok::<_, DbError>(Ended::Delivered);
            }
            let give_up = leased.retrying_for >= self.retry_for;
            let error = match &outcome {
                Ok(status) => format!("answered {status}"),
                Err(error) => failure(error),
            };
            let held = if give_up {
                outbox::given_up(&client, &leased, &error).await?
            } else {
                let retry_in = delay(leased.attempts, self.max_backoff);
                outbox::failed(&client, &leased, retry_in, &error).await?
            };
            if held && give_up {
                GIVEN_UP.get().increment(1);
                tracing::warn!(
                    event_id = %leased.event_id,
                    order_id = %leased.order_id,
                    attempts = leased.attempts,
                    %error,
                    "gave up an order event"
                );
            }
            Ok(if held && give_up {
                Ended::GaveUp
            } else {
                Ended::Failed
            })
        }
        .await;
        written.unwrap_or_else(|error| {
            tracing::warn!(event_id = %leased.event_id, error = %anyhow::Error::from(error),
                           "an order event's delivery could not be recorded");
            Ended::Failed
        })
    }

    async fn send(&self, leased: &Leased) -> Result<reqwest::StatusCode, reqwest::Error> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        let signature =
            crate::signature::header(self.secret.expose_secret().as_bytes(), now, &leased.body);
        let response = self
            .http
            .post(&self.url)
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .header(SIGNATURE_HEADER, signature)
            .body(leased.body.clone())
            .send()
            .await?;
        Ok(response.status())
    }
}

/// Counts the events not delivered yet (nor given up) into the backlog's
/// gauges: after each delivery run, and on its own where no
/// `outcomes.webhook_url` is set, so that a forgotten URL shows as a
/// backlog that grows rather than as none.
pub async fn measure_backlog(pool: &Pool) -> Result<(), DbError> {
    let client = pool.get().await?;
    let (pending, oldest) = outbox::backlog(&client).await?;
    PENDING.get().set(pending as f64);
    OLDEST.get().set(oldest);
    Ok(())
}

/// [`measure_backlog`], its failure logged.
pub async fn measure_backlog_logged(pool: &Pool) {
    if let Err(error) = measure_backlog(pool).await {
        tracing::warn!(error = %anyhow::Error::from(error), "the order events' backlog could not be counted");
    }
}

/// What went wrong with a delivery that got no answer, for the log and
/// `outcomes show`: what happened and its innermost cause, without the
/// URL (a shop's URL may carry a token).
fn failure(error: &reqwest::Error) -> String {
    let what = if error.is_timeout() {
        "no answer within outcomes.timeout_ms"
    } else if error.is_connect() {
        "could not connect"
    } else {
        "the connection failed before an answer"
    };
    let mut cause: Option<&dyn std::error::Error> = std::error::Error::source(error);
    let mut innermost = None;
    while let Some(source) = cause {
        innermost = Some(source);
        cause = source.source();
    }
    match innermost {
        Some(source) => format!("{what}: {source}"),
        None => what.to_owned(),
    }
}

/// The wait after the `attempts`-th failed attempt: a second, doubled with
/// every attempt, at most `ceiling` (`outcomes.max_backoff_secs`).
fn delay(attempts: i32, ceiling: Duration) -> Duration {
    let doublings = attempts.saturating_sub(1).clamp(0, 20) as u32;
    (FIRST_RETRY * 2u32.pow(doublings)).min(ceiling)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_wait_doubles_from_a_second_to_the_ceiling() {
        let waits: Vec<u64> = [1, 2, 3, 4, 10, 11, 50]
            .into_iter()
            .map(|attempts| delay(attempts, Duration::from_secs(600)).as_secs())
            .collect();
        assert_eq!(waits, [1, 2, 4, 8, 512, 600, 600]);
    }

    #[tokio::test]
    async fn a_failure_is_told_without_the_shops_url() {
        // Nothing listens on port 1 of the loopback.
        let url = "http://127.0.0.1:1/events?token=shop-token";
        let Err(error) = reqwest::Client::new().post(url).send().await else {
            panic!("nothing listens there");
        };
        let told = failure(&error);
        assert!(told.starts_with("could not connect"), "{told}");
        assert!(
            !told.contains("shop-token") && !told.contains("127.0.0.1"),
            "{told}"
        );
    }
}
