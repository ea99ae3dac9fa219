//! The domain: events and their seats, holds on seats, and orders that pay
//! for holds. Knows SQL, Payrail and the idempotency engine, not actix: it
//! answers with its own types and [`CheckoutError`], each of which is a
//! problem of the API's catalogue (`crate::problem`), and a click's stored
//! answer is made from its order (`orders::click::answer`). The database
//! decides every race (constraints and conditional updates), never a read
//! in Rust.

pub mod holds;
pub mod orders;
pub mod seat_maps;
pub mod seats;

use std::time::Duration;

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

use crate::db::DbError;
use crate::payrail::PaymentError;
use crate::problem::Problem;

/// Why the checkout could not do what was asked.
#[derive(Debug, thiserror::Error)]
pub enum CheckoutError {
    /// The seat asked for does not exist.
    #[error("there is no seat with this seat_id")]
    NoSuchSeat,
    /// A live hold or an order has the seat.
    #[error("this seat is held by someone else or already sold")]
    SeatUnavailable,
    /// The buyer has `holds.max_per_buyer` seats of the seat's event already,
    /// in live unordered holds and pending orders; nothing was written.
    #[error("you already hold as many seats of this event as one buyer may")]
    HoldLimitReached,
    /// A hold is unknown, not the buyer's, expired, or in another order.
    #[error("a hold is unknown, not yours, expired or already in another order")]
    HoldUnavailable,
    /// The order is well-formed but asks for the impossible.
    #[error("{0}")]
    InvalidOrder(&'static str),
    /// Payrail could not be asked, or did not answer: not an outcome.
    #[error(transparent)]
    Payment(#[from] PaymentError),
    /// The order is being canceled at Payrail (it was undecided too long):
    /// no charge answer settles it any more, only the cancel's confirmation.
    #[error("the payment is being canceled")]
    Canceling,
    #[error(transparent)]
    Db(#[from] DbError),
    /// The store contradicts itself (a linked order that is missing).
    #[error("{0}")]
    Inconsistent(String),
}

impl From<tokio_postgres::Error> for CheckoutError {
    fn from(error: tokio_postgres::Error) -> Self {
        DbError::from(error).into()
    }
}

impl From<deadpool_postgres::PoolError> for CheckoutError {
    fn from(error: deadpool_postgres::PoolError) -> Self {
        DbError::from(error).into()
    }
}

impl From<idempotency::Error> for CheckoutError {
    fn from(error: idempotency::Error) -> Self {
        DbError::from(error).into()
    }
}

/// The problem each refusal or failure of the checkout is.
impl From<CheckoutError> for Problem {
    fn from(error: CheckoutError) -> Self {
        match error {
            CheckoutError::NoSuchSeat => Problem::NotFound("there is no seat with this seat_id"),
            CheckoutError::SeatUnavailable => Problem::SeatUnavailable,
            CheckoutError::HoldLimitReached => Problem::HoldLimitReached,
            CheckoutError::HoldUnavailable => Problem::HoldUnavailable,
            CheckoutError::InvalidOrder(why) => Problem::InvalidOrder(why),
            CheckoutError::Payment(error) => error.into(),
            // Its answer comes with the cancel's confirmation: retry shortly.
            CheckoutError::Canceling => Problem::PaymentUnavailable {
                retry_after: Duration::from_secs(1),
            },
            CheckoutError::Db(error) => error.into(),
            error @ CheckoutError::Inconsistent(_) => Problem::Internal(error.into()),
        }
    }
}

/// The slot of a seat's or a hold's id: its bits 40-51, where the
/// database puts the slot of the seat's event (`checkout_seat_side_id`,
/// migrations/functions/checkout.sql). Every statement on a seat or a hold
/// names it, so that on Citus it runs on the slot's shard alone.
pub fn slot_of(id: i64) -> i32 {
    (id >> 40) as i32
}

/// Timestamps go out as RFC 3339 in UTC.
pub(crate) fn rfc3339(at: OffsetDateTime) -> String {
    at.format(&Rfc3339).unwrap_or_default()
}
