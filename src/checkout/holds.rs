//! Holds: a buyer's claim on a seat until it expires or is ordered. The
//! exclusion constraint `holds_one_per_seat` decides who gets a seat, and
//! `checkout_place_hold` (migrations/functions/checkout.sql) how many a
//! buyer may hold.

use std::time::{Duration, SystemTime};

use deadpool_postgres::{GenericClient, Pool};
use idempotency::{Claim, Done, StoredResponse, Unit};
use serde::Serialize;
use time::OffsetDateTime;
use tokio_postgres::error::SqlState;

use super::CheckoutError;
use crate::config::HoldSettings;
use crate::db::DbError;
use crate::observe::{labels, Counter, Metric};

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Hold {
    pub hold_id: i64,
    pub seat_id: i64,
    /// RFC 3339, UTC.
    #[schema(format = DateTime)]
    pub expires_at: String,
}

/// How holds are given.
#[derive(Debug, Clone, Copy)]
pub struct HoldPolicy {
    /// How long a hold keeps its seat.
    pub ttl: Duration,
    /// A buyer's seats of one event, at most: live holds no order has taken
    /// yet and seats in orders still waiting for their payment, so that one
    /// buyer can hold a whole event neither by holds nor by orders whose
    /// payment never comes.
    pub max_per_buyer: u32,
}

impl From<&HoldSettings> for HoldPolicy {
    fn from(settings: &HoldSettings) -> Self {
        Self {
            ttl: Duration::from_secs(settings.ttl_secs),
            max_per_buyer: settings.max_per_buyer,
        }
    }
}

/// How a hold is answered to the request that made it: the HTTP layer's to
/// say, handed in so that the answer commits together with the hold.
pub type Answer = fn(&Hold) -> StoredResponse;

/// A keyed `POST /holds`: the hold and its answer commit together in one
/// unit of the claim, so a crash leaves either both or neither, and a retry
/// never meets its own hold as someone else's.
pub async fn place_claimed(
    pool: &Pool,
    claim: &Claim,
    seat_id: i64,
    policy: HoldPolicy,
    answer: Answer,
) -> Result<Done, CheckoutError> {
    let mut client = pool.get().await?;
    let unit = Unit::begin(claim, &mut client).await?;
    let hold = match place(unit.tx(), &claim.user_id, seat_id, policy).await {
        Ok(hold) => hold,
        Err(refused) => {
            unit.rollback().await?;
            return Err(refused);
        }
    };
    let response = answer(&hold);
    let fence = unit.store(&response).await?;
    Ok(unit.finish(fence).await?.answered(response))
}

/// Holds a seat for `policy.ttl`: `SeatUnavailable` when a live hold or an
/// order has it, `NoSuchSeat` when there is no such seat,
/// `HoldLimitReached` (nothing written) when the buyer already has
/// `policy.max_per_buyer` seats of its event in live unordered holds and
/// pending orders, counted in the database across instances. Runs on whatever client it is given: a
/// keyed request's unit, so that the hold commits together with its stored
/// answer, or a plain connection. One call either way.
///
/// Buyers racing for one seat queue on the seat's row lock first: the first
/// inserts its hold, and each next one finds it committed and is refused at
/// once. Without the queue every racer's exclusion check would wait for the
/// others, and PostgreSQL's deadlock detector would untangle them one per
/// `deadlock_timeout` (1 s): k racers, up to k-1 seconds. One buyer's holds
/// on one event then queue on a lock of their own, so that two racing at
/// the limit cannot both pass.
pub async fn place(
    client: &impl GenericClient,
    buyer: &str,
    seat_id: i64,
    policy: HoldPolicy,
) -> Result<Hold, CheckoutError> {
    let statement = client
        .prepare_cached(
            "SELECT new_hold_id, new_expires_at, over_limit
             FROM checkout_place_hold($1, $2, $3, $4, $5)",
        )
        .await?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 5] = [
        &super::slot_of(seat_id),
        &seat_id,
        &buyer,
        &policy.ttl.as_secs_f64(),
        &i64::from(policy.max_per_buyer),
    ];
    match client.query_opt(&statement, &params).await {
        Ok(None) => Err(CheckoutError::NoSuchSeat),
        Ok(Some(row)) if row.try_get("over_limit")? => Err(CheckoutError::HoldLimitReached),
        Ok(Some(row)) => {
            let expires_at: OffsetDateTime = row.try_get("new_expires_at")?;
            Ok(Hold {
                hold_id: row.try_get("new_hold_id")?,
                seat_id,
                expires_at: super::rfc3339(expires_at),
            })
        }
        Err(e) if e.code() == Some(&SqlState::EXCLUSION_VIOLATION) => {
            Err(CheckoutError::SeatUnavailable)
        }
        // Should racers ever meet in the exclusion check after all (it runs
        // after the row is in the index), PostgreSQL aborts one of them as a
        // deadlock; another one got the seat.
        Err(e) if e.code() == Some(&SqlState::T_R_DEADLOCK_DETECTED) => {
            Err(CheckoutError::SeatUnavailable)
        }
        Err(e) if e.code() == Some(&SqlState::FOREIGN_KEY_VIOLATION) => {
            Err(CheckoutError::NoSuchSeat)
        }
        Err(e) => Err(e.into()),
    }
}

/// Gives a seat back. Only the buyer's own holds that are in no order.
pub async fn release(
    client: &impl GenericClient,
    buyer: &str,
    hold_id: i64,
) -> Result<bool, CheckoutError> {
    let statement = client
        .prepare_cached(
            "DELETE FROM holds
             WHERE slot = $1 AND hold_id = $2 AND user_id = $3 AND order_id IS NULL
             RETURNING expires_at",
        )
        .await?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
        [&super::slot_of(hold_id), &hold_id, &buyer];
    let Some(row) = client.query_opt(&statement, &params).await? else {
        return Ok(false);
    };
    // A hold that had expired already ended then, and was counted so. (The
    // clock compared with is this instance's: Citus runs no `now()` in a
    // modification's RETURNING.)
    let expires_at: SystemTime = row.try_get("expires_at")?;
    if expires_at > SystemTime::now() {
        ended(HowEnded::Released, 1);
    }
    Ok(true)
}

/// How many holds that no order took expired in [`from`, `to`): holds
/// ended by their expiry. A hold's expiry is fixed when it is made, always
/// after that moment, so once `to` has passed the count of a span never
/// changes (but for a hold given back by an order declined after its
/// expiry, which ended in that order). Through the index of unordered
/// holds by expiry (migrations/V12), a window reads its own holds.
pub async fn expired_between(
    client: &impl GenericClient,
    from: SystemTime,
    to: SystemTime,
) -> Result<i64, DbError> {
    let statement = client
        .prepare_cached(
            "SELECT count(*) FROM holds
             WHERE order_id IS NULL AND expires_at >= $1 AND expires_at < $2",
        )
        .await?;
    Ok(client
        .query_one(&statement, &[&from, &to])
        .await?
        .try_get(0)?)
}

labels! {
    /// How a hold ended.
    #[label = "how"]
    pub enum HowEnded {
        /// Sold: its order was paid.
        Ordered = "ordered",
        /// Its time ran out with no order (`jobs::sale` counts them).
        Expired = "expired",
        /// Its buyer gave it back (`DELETE /holds/{hold_id}`) while it lived.
        Released = "released",
    }
}

const HOLDS_ENDED: Counter<HowEnded> = Counter::new(
    "holds_ended_total",
    "Holds ended, each once, by how: ordered (paid), expired, released",
);
/// What the holds report, for the recorder (`observe::install`).
pub const METRICS: &[&dyn Metric] = &[&HOLDS_ENDED];

/// Counts `count` holds that ended `how`.
pub fn ended(how: HowEnded, count: usize) {
    HOLDS_ENDED.of(how).increment(count as u64);
}

/// Deletes at most `batch` holds that expired before `before` and that no
/// order took, oldest first; returns how many went. A hold that a declined
/// or failed order gave back is one of them: the order keeps its seats'
/// labels and its amount, not its holds.
///
/// The batch's ids are read first, through the index of unordered holds by
/// expiry (migrations/V12), and each row is then found by its key: a join
/// of the two, planned for any `before`, read every due hold (150 ms for
/// 400,000 due, against 12 ms so). The condition is checked again on each
/// row, in case it changed since.
pub async fn delete_expired(
    client: &impl GenericClient,
    before: SystemTime,
    batch: i64,
) -> Result<u64, DbError> {
    let statement = client
        .prepare_cached(
            "DELETE FROM holds
             WHERE hold_id = ANY (ARRAY(SELECT hold_id FROM holds
                                        WHERE order_id IS NULL AND expires_at < $1
                                        ORDER BY expires_at
                                        LIMIT $2))
               AND order_id IS NULL AND expires_at < $1",
        )
        .await?;
    Ok(client.execute(&statement, &[&before, &batch]).await?)
}
