//! Holds: a buyer's claim on a seat until it expires or is ordered. The
//! exclusion constraint `holds_one_per_seat` decides who gets a seat.

use std::time::Duration;

use deadpool_postgres::{GenericClient, Pool};
use idempotency::{Claim, Done, StoredResponse};
use serde::Serialize;
use time::OffsetDateTime;
use tokio_postgres::error::SqlState;

use super::CheckoutError;

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Hold {
    pub hold_id: i64,
    pub seat_id: i64,
    /// RFC 3339, UTC.
    #[schema(format = DateTime)]
    pub expires_at: String,
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
    ttl: Duration,
    answer: Answer,
) -> Result<Done, CheckoutError> {
    let mut client = pool.get().await?;
    let unit = claim.unit(&mut client).await?;
    let hold = match place(unit.tx(), &claim.user_id, seat_id, ttl).await {
        Ok(hold) => hold,
        Err(refused) => {
            unit.rollback().await?;
            return Err(refused);
        }
    };
    let response = answer(&hold);
    let fence = unit.store(&response).await?;
    Ok(Done::stored(unit.finish(fence).await?, response))
}

/// Holds a seat for `ttl`: `SeatUnavailable` when a live hold or an order
/// has it, `NoSuchSeat` when there is no such seat. Runs on whatever client
/// it is given: a keyed request's unit, so that the hold commits together
/// with its stored answer, or a plain connection.
///
/// Buyers racing for one seat queue on the seat's row lock first: the first
/// inserts its hold, and each next one finds it committed and is refused at
/// once. Without the queue every racer's exclusion check would wait for the
/// others, and PostgreSQL's deadlock detector would untangle them one per
/// `deadlock_timeout` (1 s): k racers, up to k-1 seconds.
pub async fn place(
    client: &impl GenericClient,
    buyer: &str,
    seat_id: i64,
    ttl: Duration,
) -> Result<Hold, CheckoutError> {
    let statement = client
        .prepare_cached(
            "WITH seat AS (
                 SELECT seat_id FROM seats WHERE seat_id = $1 FOR NO KEY UPDATE
             )
             INSERT INTO holds (seat_id, user_id, expires_at)
             SELECT seat_id, $2, now() + make_interval(secs => $3) FROM seat
             RETURNING hold_id, expires_at",
        )
        .await?;
    match client
        .query_opt(&statement, &[&seat_id, &buyer, &ttl.as_secs_f64()])
        .await
    {
        Ok(None) => Err(CheckoutError::NoSuchSeat),
        Ok(Some(row)) => {
            let expires_at: OffsetDateTime = row.try_get("expires_at")?;
            Ok(Hold {
                hold_id: row.try_get("hold_id")?,
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
            "DELETE FROM holds WHERE hold_id = $1 AND user_id = $2 AND order_id IS NULL",
        )
        .await?;
    let deleted = client.execute(&statement, &[&hold_id, &buyer]).await?;
    Ok(deleted == 1)
}
