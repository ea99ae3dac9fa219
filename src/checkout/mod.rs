//! The domain: events and their seats, holds on seats, and orders that pay
//! for holds. Knows SQL and Payrail, not HTTP. The database decides every
//! race (constraints and conditional updates), never a read in Rust.

pub mod holds;
pub mod orders;
pub mod seats;

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// Timestamps go out as RFC 3339 in UTC.
pub(crate) fn rfc3339(at: OffsetDateTime) -> String {
    at.format(&Rfc3339).unwrap_or_default()
}
