//! The sale's figures that no request counts, every [`TICK`]: the holds
//! ended by their expiry (`holds_ended_total{how="expired"}`) and the
//! seats of each event still on sale (`event_seats`).
//!
//! An expiry happens without a request, and every instance could see it.
//! Time is cut into windows of [`WINDOW`]; once one has passed, the first
//! instance to claim it counts the holds whose expiry fell in it, and the
//! others find it answered: the claim is the idempotency engine's, a key
//! per window in a scope of its own (as Payrail's event ids are), so the
//! primary key of the key table decides, across instances and restarts.
//! The counter moves only once the count is stored under its window: an
//! expiry is counted at most once, and is missed only in a window that no
//! instance was running for within [`LOOKBACK`] of it.
//!
//! `event_seats` is each instance's own view, refreshed whole each tick:
//! one aggregate per event (`checkout::seats::counts`), for events with a
//! seat left to sell, each on its event's worker on Citus (the list of
//! events, and a window's expired holds, span the shards and go through
//! the coordinator). A sold-out event is not read again by the instance
//! (a sold seat stays sold), and its series leave the page. An aggregate
//! reads every seat of its event, so a refresh costs as much as the seats
//! on sale: the next one rests [`REST_PER_COUNT`] times as long as the
//! last took, so that the figures never take more than a fiftieth of a
//! connection's time, however large the events on sale (a refresh of
//! 2,000 seats takes about 20 ms: every tick).

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use deadpool_postgres::Pool;
use idempotency::{
    Done, Engine, IdempotencyKey, Policy, Reply, RequestHash, Route, StoredResponse,
};

use crate::checkout::holds::{self, HowEnded};
use crate::checkout::seats;
use crate::db::DbError;
use crate::observe::{GaugeSet, Metric};

/// How often the figures are taken.
pub const TICK: Duration = Duration::from_secs(5);
/// The span of time one claim counts the expiries of.
const WINDOW: Duration = Duration::from_secs(15);
/// How long after a window's end it is counted: a hold's expiry is set by
/// the database's clock, which may run a little ahead of this one's.
const SETTLED_AFTER: Duration = Duration::from_secs(2);
/// How far back an instance that starts looks for windows nobody counted
/// (a restart, a deploy).
const LOOKBACK: Duration = Duration::from_secs(60);
/// The idempotency scope of the windows' keys: it starts with a control
/// character, which no buyer id has.
const SCOPE: &str = "\u{1}holds-expired";
/// How many times its own duration a refresh of `event_seats` rests
/// before the next.
const REST_PER_COUNT: u32 = 49;

static EVENT_SEATS: GaugeSet = GaugeSet::new(
    "event_seats",
    "Seats of each event still on sale, by status (available, held, sold), at this instance's \
     last refresh",
);
/// What the job reports, for the recorder (`observe::install`).
pub static METRICS: &[&dyn Metric] = &[&EVENT_SEATS];

#[derive(Clone)]
pub struct Sale {
    pool: Pool,
    /// Where each event's count goes: its slot's worker, on Citus.
    route: Route,
    engine: Engine,
    /// The start of the next window to count.
    next_window: Arc<Mutex<SystemTime>>,
    /// Events seen sold out: never read again.
    sold_out: Arc<Mutex<HashSet<String>>>,
    /// No refresh of `event_seats` before then.
    seats_rest_until: Arc<Mutex<Instant>>,
}

impl Sale {
    /// `policy`: the key table's, so that a window's key lives as long as
    /// a click's (`idempotency.ttl_secs`) and the cleanup deletes it then.
    pub fn new(route: Route, policy: Policy) -> Self {
        let start = SystemTime::now()
            .checked_sub(LOOKBACK)
            .unwrap_or(UNIX_EPOCH);
        Self {
            pool: route.home().clone(),
            route: route.clone(),
            engine: Engine::new(route, policy),
            next_window: Arc::new(Mutex::new(window_of(start))),
            sold_out: Arc::default(),
            seats_rest_until: Arc::new(Mutex::new(Instant::now())),
        }
    }

    pub async fn run_logged(&self) {
        if let Err(error) = self.count_expiries().await {
            tracing::warn!(%error, "the holds that expired could not be counted");
        }
        let started = Instant::now();
        if started < *locked(&self.seats_rest_until) {
            return;
        }
        if let Err(error) = self.refresh_seats().await {
            tracing::warn!(error = %anyhow::Error::from(error), "the seats by event could not be counted");
        }
        *locked(&self.seats_rest_until) = Instant::now() + started.elapsed() * REST_PER_COUNT;
    }

    /// Claims each window that has passed since the last, in order; stops
    /// at the first that fails, to try it again next time.
    async fn count_expiries(&self) -> Result<(), idempotency::RunError<DbError>> {
        let hash = RequestHash::of("COUNT", "/holds/expired", b"");
        loop {
            let from = *locked(&self.next_window);
            let to = from + WINDOW;
            if to + SETTLED_AFTER > SystemTime::now() {
                return Ok(());
            }
            let key = unix_secs(from).to_string();
            // Digits are a valid key.
            let Ok(key) = IdempotencyKey::parse(key.as_bytes()) else {
                return Ok(());
            };
            let pool = &self.pool;
            let ran = self
                .engine
                .run(
                    SCOPE,
                    &key,
                    &hash,
                    None,
                    Duration::ZERO,
                    |_claim| async move {
                        let client = pool.get().await.map_err(DbError::from)?;
                        let expired = holds::expired_between(&client, from, to).await?;
                        let count = expired.to_string().into_bytes();
                        Ok::<_, DbError>(Done::Answer(StoredResponse::new(
                            200,
                            "text/plain",
                            count,
                        )))
                    },
                )
                .await?;
            // Only the claim that stored the count counts it; another
            // instance's (a replay, or one in progress) is that one's.
            if let Reply::First(answer) = &ran.reply {
                let expired = std::str::from_utf8(&answer.body)
                    .ok()
                    .and_then(|count| count.parse::<usize>().ok())
                    .unwrap_or(0);
                holds::ended(HowEnded::Expired, expired);
            }
            *locked(&self.next_window) = to;
        }
    }

    /// Replaces `event_seats` with the counts of the events still on sale.
    async fn refresh_seats(&self) -> Result<(), DbError> {
        let events = seats::events(&self.pool.get().await?).await?;
        let mut on_sale = Vec::new();
        for (slot, event_id) in events {
            if self.is_sold_out(&event_id) {
                continue;
            }
            let client = self.route.slot_pool(slot).get().await?;
            let counts = seats::counts(&client, slot, &event_id).await?;
            if counts.sold_out() && counts.sold > 0 {
                locked(&self.sold_out).insert(event_id);
            } else {
                on_sale.push(counts);
            }
        }
        let (available, held, sold) = ("available", "held", "sold");
        EVENT_SEATS.replace(on_sale.iter().flat_map(|counts| {
            let event = counts.event_id.as_str();
            [
                (
                    vec![("event_id", event), ("status", available)],
                    counts.available,
                ),
                (vec![("event_id", event), ("status", held)], counts.held),
                (vec![("event_id", event), ("status", sold)], counts.sold),
            ]
            .map(|(labels, count)| (labels, count as f64))
        }));
        Ok(())
    }

    fn is_sold_out(&self, event_id: &str) -> bool {
        locked(&self.sold_out).contains(event_id)
    }
}

/// A lock of the job's state; a panic while it was held left nothing half
/// written (each holder writes one value).
fn locked<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|e| e.into_inner())
}

/// The start of the window `at` falls in.
fn window_of(at: SystemTime) -> SystemTime {
    let secs = unix_secs(at);
    UNIX_EPOCH + Duration::from_secs(secs - secs % WINDOW.as_secs())
}

fn unix_secs(at: SystemTime) -> u64 {
    at.duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_secs())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_aligned_on_the_clock_so_every_instance_cuts_time_alike() {
        let at = UNIX_EPOCH + Duration::from_secs(1_764_845_999);
        let start = window_of(at);
        assert_eq!(unix_secs(start) % WINDOW.as_secs(), 0);
        assert!(start <= at && at < start + WINDOW);
        assert_eq!(window_of(start), start);
    }
}
