//! The `next` cursor of `GET /orders`: where a page of a buyer's orders
//! ended, opaque to clients. It is the last order's position (creation
//! time in microseconds, id) and a check value made from the position and
//! the buyer, in URL-safe base64: a cursor that was changed, cut, or made
//! for another buyer is refused (400) rather than read as some other
//! place. It is not a secret and needs none: whatever it says, the query
//! it leads to reads only the caller's own orders.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine as _;
use sha2::{Digest, Sha256};
use time::OffsetDateTime;
use uuid::Uuid;

use crate::checkout::orders::Position;

/// The layout's version, first, so that another layout can be told apart.
const VERSION: u8 = 1;
/// Version, microseconds, id.
const POSITION_LEN: usize = 1 + 8 + 16;
const CHECK_LEN: usize = 8;

/// A cursor that is not one this service made for this buyer.
#[derive(Debug, thiserror::Error)]
#[error("`after` is not a cursor of this list: pass `next` from the page before, as it came")]
pub struct BadCursor;

/// The cursor of `position` in `buyer`'s list.
pub fn encode(buyer: &str, position: Position) -> String {
    let micros = (position.created_at.unix_timestamp_nanos() / 1_000) as i64;
    let mut bytes = Vec::with_capacity(POSITION_LEN + CHECK_LEN);
    bytes.push(VERSION);
    bytes.extend_from_slice(&micros.to_be_bytes());
    bytes.extend_from_slice(position.order_id.as_bytes());
    let check = check(buyer, &bytes);
    bytes.extend_from_slice(&check);
    URL_SAFE_NO_PAD.encode(bytes)
}

/// The position a cursor of `buyer`'s list names.
pub fn decode(buyer: &str, cursor: &str) -> Result<Position, BadCursor> {
    let bytes = URL_SAFE_NO_PAD.decode(cursor).map_err(|_| BadCursor)?;
    if bytes.len() != POSITION_LEN + CHECK_LEN || bytes[0] != VERSION {
        return Err(BadCursor);
    }
    let (position, given) = bytes.split_at(POSITION_LEN);
    if check(buyer, position) != given {
        return Err(BadCursor);
    }
    let micros = i64::from_be_bytes(position[1..9].try_into().map_err(|_| BadCursor)?);
    let created_at = OffsetDateTime::from_unix_timestamp_nanos(i128::from(micros) * 1_000)
        .map_err(|_| BadCursor)?;
    let order_id = Uuid::from_slice(&position[9..]).map_err(|_| BadCursor)?;
    Ok(Position {
        created_at,
        order_id,
    })
}

/// The first bytes of SHA-256 over the buyer and the position, framed so
/// that no two (buyer, position) pairs share an input.
fn check(buyer: &str, position: &[u8]) -> [u8; CHECK_LEN] {
    let mut hash = Sha256::new();
    hash.update(b"stagedoor orders cursor\0");
    hash.update((buyer.len() as u64).to_be_bytes());
    hash.update(buyer.as_bytes());
    hash.update(position);
    let digest = hash.finalize();
    let mut check = [0; CHECK_LEN];
    check.copy_from_slice(&digest[..CHECK_LEN]);
    check
}

#[cfg(test)]
mod tests {
    use super::*;

    fn position() -> Position {
        Position {
            created_at: OffsetDateTime::from_unix_timestamp_nanos(1_764_845_999_123_456_000)
                .unwrap(),
            order_id: Uuid::new_v4(),
        }
    }

    #[test]
    fn a_cursor_names_its_position_for_its_buyer_only() {
        let position = position();
        let cursor = encode("alice", position);
        assert_eq!(decode("alice", &cursor).unwrap(), position);
        assert!(decode("bob", &cursor).is_err());
    }

    #[test]
    fn a_changed_or_cut_cursor_is_refused() {
        let cursor = encode("alice", position());
        let mut bytes = URL_SAFE_NO_PAD.decode(&cursor).unwrap();
        for at in 0..bytes.len() {
            bytes[at] ^= 1;
            assert!(
                decode("alice", &URL_SAFE_NO_PAD.encode(&bytes)).is_err(),
                "byte {at}"
            );
            bytes[at] ^= 1;
        }
        for bad in [&cursor[..cursor.len() - 1], "", "not base64!", "AAAA"] {
            assert!(decode("alice", bad).is_err(), "{bad}");
        }
    }
}
