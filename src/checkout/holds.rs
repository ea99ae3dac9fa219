//! Holds: a buyer's claim on a seat until it expires or is ordered. The
//! exclusion constraint `holds_one_per_seat` decides who gets a seat.

use std::time::Duration;

use deadpool_postgres::GenericClient;
use serde::Serialize;
use time::OffsetDateTime;
use tokio_postgres::error::SqlState;

use crate::problem::Problem;

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Hold {
    pub hold_id: i64,
    pub seat_id: i64,
    /// RFC 3339, UTC.
    #[schema(format = DateTime)]
    pub expires_at: String,
}

/// Holds a seat for `ttl`: 409 `seat-unavailable` when a live hold or an
/// order has it, 404 when there is no such seat.
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
) -> Result<Hold, Problem> {
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
        Ok(None) => Err(Problem::NotFound("there is no seat with this seat_id")),
        Ok(Some(row)) => {
            let expires_at: OffsetDateTime = row.try_get("expires_at")?;
            Ok(Hold {
                hold_id: row.try_get("hold_id")?,
                seat_id,
                expires_at: super::rfc3339(expires_at),
            })
        }
        Err(e) if e.code() == Some(&SqlState::EXCLUSION_VIOLATION) => Err(Problem::SeatUnavailable),
        // Should racers ever meet in the exclusion check after all (it runs
        // after the row is in the index), PostgreSQL aborts one of them as a
        // deadlock; another one got the seat.
        Err(e) if e.code() == Some(&SqlState::T_R_DEADLOCK_DETECTED) => {
            Err(Problem::SeatUnavailable)
        }
        Err(e) if e.code() == Some(&SqlState::FOREIGN_KEY_VIOLATION) => {
            Err(Problem::NotFound("there is no seat with this seat_id"))
        }
        Err(e) => Err(e.into()),
    }
}

/// Gives a seat back. Only the buyer's own holds that are in no order.
pub async fn release(
    client: &impl GenericClient,
    buyer: &str,
    hold_id: i64,
) -> Result<bool, Problem> {
    let statement = client
        .prepare_cached(
            "DELETE FROM holds WHERE hold_id = $1 AND user_id = $2 AND order_id IS NULL",
        )
        .await?;
    let deleted = client.execute(&statement, &[&hold_id, &buyer]).await?;
    Ok(deleted == 1)
}
