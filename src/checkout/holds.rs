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
pub async fn place(
    client: &impl GenericClient,
    buyer: &str,
    seat_id: i64,
    ttl: Duration,
) -> Result<Hold, Problem> {
    let statement = client
        .prepare_cached(
            "INSERT INTO holds (seat_id, user_id, expires_at)
             VALUES ($1, $2, now() + make_interval(secs => $3))
             RETURNING hold_id, expires_at",
        )
        .await?;
    match client
        .query_one(&statement, &[&seat_id, &buyer, &ttl.as_secs_f64()])
        .await
    {
        Ok(row) => {
            let expires_at: OffsetDateTime = row.try_get("expires_at")?;
            Ok(Hold {
                hold_id: row.try_get("hold_id")?,
                seat_id,
                expires_at: super::rfc3339(expires_at),
            })
        }
        Err(e) if e.code() == Some(&SqlState::EXCLUSION_VIOLATION) => Err(Problem::SeatUnavailable),
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
