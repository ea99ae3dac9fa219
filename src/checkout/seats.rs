//! Events and their seat maps, and the idempotent seeding of both.

use deadpool_postgres::GenericClient;
use serde::Serialize;

use crate::auth::BuyerId;
use crate::db::DbError;

#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Seat {
    pub seat_id: i64,
    #[schema(example = "A1")]
    pub label: String,
    pub price_cents: i64,
    /// `available`, `held` (a live hold or a pending order) or `sold`.
    #[schema(schema_with = status_schema)]
    pub status: &'static str,
    /// The caller's own live hold of this seat, not yet in an order (one it
    /// may pay for or release); `null` for every other seat, so that a page
    /// loaded after the holds were made still knows which are the buyer's.
    pub your_hold: Option<YourHold>,
}

/// A hold of the caller's, as the seat map shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct YourHold {
    pub hold_id: i64,
    /// RFC 3339, UTC.
    #[schema(format = DateTime)]
    pub expires_at: String,
}

/// The seat statuses `seat_map` gives, for the OpenAPI document.
fn status_schema() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::Type::String)
        .enum_values(Some(["available", "held", "sold"]))
        .build()
}

/// The body of `GET /events/{event_id}/seats`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct SeatMap {
    pub event_id: String,
    pub seats: Vec<Seat>,
}

#[derive(Debug, Serialize)]
pub struct SeedSummary {
    pub event_id: String,
    pub seats: i64,
    pub created: u64,
    pub price_cents: i64,
}

/// The statement of an event's snapshot (src/checkout/seat_maps/mod.rs): `$1`
/// the event, `$2` its slot. Public for the test that reads its plan.
///
/// The exclusion constraint on holds leaves at most one live or ordered
/// hold per seat, which each seat looks up on its own (`LATERAL`) through
/// the holds' index on the seat (migrations/V13): a plain join was planned
/// as one scan of every hold of every event whenever the table looked
/// small next to the map, and the table only grows. A hold knows whether
/// its order is paid (`sold`): the seat map reads no order, which on a
/// distributed database would mean asking every shard. `expires_in` is the
/// life left of an unordered hold, in seconds of the database's clock: the
/// snapshot is not kept past the first expiry, which changes the map with
/// no statement. `holder`, `hold_id` and `expires_at` name such a hold's
/// buyer and the hold, so that its holder's view needs no statement. Every
/// table's slot is the parameter itself, the lateral one's too: on Citus
/// that is what prunes the statement to the slot's one shard (compared with
/// the seat's column, every shard of the holds was asked).
pub const SEAT_MAP_STATEMENT: &str = "SELECT s.seat_id, s.label, s.price_cents,
        CASE WHEN h.sold THEN 'sold'
             WHEN h.hold_id IS NOT NULL THEN 'held'
             ELSE 'available' END AS status,
        CASE WHEN h.hold_id IS NOT NULL AND h.order_id IS NULL
             THEN extract(epoch FROM h.expires_at - now())::float8 END AS expires_in,
        CASE WHEN h.order_id IS NULL THEN h.user_id END AS holder,
        CASE WHEN h.order_id IS NULL THEN h.hold_id END AS hold_id,
        CASE WHEN h.order_id IS NULL THEN h.expires_at END AS expires_at
 FROM seats s
 LEFT JOIN LATERAL (SELECT hold_id, user_id, order_id, sold, expires_at FROM holds
                    WHERE holds.slot = $2 AND holds.seat_id = s.seat_id
                      AND (holds.order_id IS NOT NULL OR holds.expires_at > now())
                    LIMIT 1) h ON true
 WHERE s.slot = $2 AND s.event_id = $1
 ORDER BY s.seat_id";

/// The caller's live unordered holds of one event: `$1` the buyer, `$2`
/// the event, `$3` its slot. Through the holds' index of a buyer's live holds
/// (migrations/V8), so that a view of a map from memory costs one probe of
/// the buyer's own few rows. Public for the test that reads its plan.
pub const OWN_HOLDS_STATEMENT: &str = "SELECT h.seat_id, h.hold_id, h.expires_at
 FROM holds h
 JOIN seats s ON s.slot = h.slot AND s.seat_id = h.seat_id
 WHERE h.slot = $3 AND s.slot = $3 AND h.user_id = $1 AND h.order_id IS NULL AND h.expires_at > now()
   AND s.event_id = $2";

/// A seat as the snapshot has it, and its unordered hold (if any): when it
/// expires, in seconds from the read, and whose it is.
pub(crate) struct ReadSeat {
    pub seat: Seat,
    pub expires_in: Option<f64>,
    pub holder: Option<String>,
    pub hold: Option<YourHold>,
}

/// The slots the event `event_id` may be in, the likelier first: on a
/// seat side spread by slot (Citus), 12 bits of the hash of its id, as
/// `checkout_event_slot` gives a new event; then 0, every event's slot on
/// one PostgreSQL and that of an event made before the spread.
pub(crate) fn slots_of_event(spread: bool, event_id: &str) -> impl Iterator<Item = i32> {
    let hashed = idempotency::hashtext(event_id) & 4095;
    std::iter::once(hashed)
        .filter(move |&slot| spread && slot != 0)
        .chain(std::iter::once(0))
}

/// Every seat of the event of slot `slot` as everyone sees it (`your_hold`
/// empty), or `None` when there is no such event there.
pub(crate) async fn read_map(
    client: &impl GenericClient,
    slot: i32,
    event_id: &str,
) -> Result<Option<Vec<ReadSeat>>, DbError> {
    let statement = client.prepare_cached(SEAT_MAP_STATEMENT).await?;
    let rows = client.query(&statement, &[&event_id, &slot]).await?;
    if rows.is_empty() && !event_exists(client, slot, event_id).await? {
        return Ok(None);
    }
    let mut seats = Vec::with_capacity(rows.len());
    for row in rows {
        let status: &str = row.try_get("status")?;
        seats.push(ReadSeat {
            seat: Seat {
                seat_id: row.try_get("seat_id")?,
                label: row.try_get("label")?,
                price_cents: row.try_get("price_cents")?,
                status: match status {
                    "sold" => "sold",
                    "held" => "held",
                    _ => "available",
                },
                your_hold: None,
            },
            expires_in: row.try_get("expires_in")?,
            holder: row.try_get("holder")?,
            hold: your_hold(&row)?,
        });
    }
    Ok(Some(seats))
}

/// The buyer's live unordered holds of the event (of slot `slot`), by seat.
pub(crate) async fn own_holds(
    client: &impl GenericClient,
    slot: i32,
    event_id: &str,
    buyer: &BuyerId,
) -> Result<Vec<(i64, YourHold)>, DbError> {
    let statement = client.prepare_cached(OWN_HOLDS_STATEMENT).await?;
    let rows = client
        .query(&statement, &[&buyer.as_str(), &event_id, &slot])
        .await?;
    let mut holds = Vec::with_capacity(rows.len());
    for row in rows {
        if let Some(hold) = your_hold(&row)? {
            holds.push((row.try_get("seat_id")?, hold));
        }
    }
    Ok(holds)
}

/// The row's `hold_id` and `expires_at` as a hold of its buyer's, if it
/// names one.
fn your_hold(row: &tokio_postgres::Row) -> Result<Option<YourHold>, DbError> {
    let hold_id: Option<i64> = row.try_get("hold_id")?;
    let expires_at: Option<time::OffsetDateTime> = row.try_get("expires_at")?;
    Ok(hold_id
        .zip(expires_at)
        .map(|(hold_id, expires_at)| YourHold {
            hold_id,
            expires_at: super::rfc3339(expires_at),
        }))
}

async fn event_exists(
    client: &impl GenericClient,
    slot: i32,
    event_id: &str,
) -> Result<bool, DbError> {
    let statement = client
        .prepare_cached("SELECT 1 FROM events WHERE slot = $1 AND event_id = $2")
        .await?;
    Ok(client
        .query_opt(&statement, &[&slot, &event_id])
        .await?
        .is_some())
}

/// Creates the event and its seats `A1`…`A20`, `B1`…; running it again adds
/// only what is missing and changes no price. A new event gets its slot
/// from the database (`checkout_event_slot`); an existing one keeps its
/// own, which its seats' ids carry.
pub async fn seed(
    client: &impl GenericClient,
    event_id: &str,
    seats: u32,
    price_cents: i64,
) -> Result<SeedSummary, DbError> {
    let slot = match event_slot(client, event_id).await? {
        Some(slot) => slot,
        None => {
            client
                .execute(
                    "INSERT INTO events (slot, event_id) VALUES (checkout_event_slot($1), $1)
                     ON CONFLICT DO NOTHING",
                    &[&event_id],
                )
                .await?;
            client
                .query_one("SELECT slot FROM events WHERE event_id = $1", &[&event_id])
                .await?
                .try_get(0)?
        }
    };
    let labels: Vec<String> = (0..seats).map(label).collect();
    // Counted from what the insert returns: Citus reports the rows an
    // INSERT … SELECT read, not the ones it wrote.
    let created: i64 = client
        .query_one(
            "WITH created AS (
                 INSERT INTO seats (slot, seat_id, event_id, label, price_cents)
                 OVERRIDING SYSTEM VALUE
                 SELECT $1, checkout_seat_side_id($1, nextval('seats_seat_id_seq')), $2, label, $4
                 FROM unnest($3::text[]) WITH ORDINALITY AS l (label, n)
                 ORDER BY n
                 ON CONFLICT DO NOTHING
                 RETURNING 1
             )
             SELECT count(*) FROM created",
            &[&slot, &event_id, &labels, &price_cents],
        )
        .await?
        .try_get(0)?;
    let total: i64 = client
        .query_one(
            "SELECT count(*) FROM seats WHERE slot = $1 AND event_id = $2",
            &[&slot, &event_id],
        )
        .await?
        .try_get(0)?;
    Ok(SeedSummary {
        event_id: event_id.to_owned(),
        seats: total,
        created: created.unsigned_abs(),
        price_cents,
    })
}

/// The slot of the event, if there is one: by its id alone, read from
/// every slot on a distributed database (seeding is not a buyer's path).
async fn event_slot(client: &impl GenericClient, event_id: &str) -> Result<Option<i32>, DbError> {
    Ok(client
        .query_opt("SELECT slot FROM events WHERE event_id = $1", &[&event_id])
        .await?
        .map(|row| row.try_get(0))
        .transpose()?)
}

/// Rows of 20: seat 0 is `A1`, seat 20 is `B1`, seat 520 is `AA1`.
fn label(index: u32) -> String {
    let mut row = index / 20;
    let mut letters = Vec::new();
    loop {
        letters.push(b'A' + (row % 26) as u8);
        if row < 26 {
            break;
        }
        row = row / 26 - 1;
    }
    letters.reverse();
    format!("{}{}", String::from_utf8_lossy(&letters), index % 20 + 1)
}

#[cfg(test)]
mod tests {
    use super::label;

    #[test]
    fn labels_run_in_rows_of_twenty() {
        assert_eq!(label(0), "A1");
        assert_eq!(label(19), "A20");
        assert_eq!(label(20), "B1");
        assert_eq!(label(25 * 20), "Z1");
        assert_eq!(label(26 * 20), "AA1");
        assert_eq!(label(27 * 20 + 4), "AB5");
    }
}

/// An event's seats by status, as its seat map would show them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeatCounts {
    pub event_id: String,
    pub available: i64,
    pub held: i64,
    pub sold: i64,
}

impl SeatCounts {
    /// Whether the event has nothing left to sell: every seat sold. A sold
    /// seat stays sold, so such an event's counts no longer change.
    pub fn sold_out(&self) -> bool {
        self.available == 0 && self.held == 0
    }
}

/// Every event: its slot and its id, by id.
pub async fn events(client: &impl GenericClient) -> Result<Vec<(i32, String)>, DbError> {
    let statement = client
        .prepare_cached("SELECT slot, event_id FROM events ORDER BY event_id")
        .await?;
    client
        .query(&statement, &[])
        .await?
        .iter()
        .map(|row| Ok((row.try_get(0)?, row.try_get(1)?)))
        .collect()
}

/// One event's seats by status: one aggregate over its seats (their
/// `(event_id, label)` index), each seat's live or ordered hold found by
/// the seat (at most one, as the exclusion constraint keeps it), the way
/// the seat map finds it; never a read of every hold.
pub async fn counts(
    client: &impl GenericClient,
    slot: i32,
    event_id: &str,
) -> Result<SeatCounts, DbError> {
    let statement = client
        .prepare_cached(
            "SELECT count(*) FILTER (WHERE h.seat_id IS NULL) AS available,
                    count(*) FILTER (WHERE h.seat_id IS NOT NULL AND NOT h.sold) AS held,
                    count(*) FILTER (WHERE h.sold) AS sold
             FROM seats s
             LEFT JOIN LATERAL (SELECT seat_id, sold FROM holds
                                WHERE holds.slot = $1 AND holds.seat_id = s.seat_id
                                  AND (holds.order_id IS NOT NULL OR holds.expires_at > now())
                                LIMIT 1) h ON true
             WHERE s.slot = $1 AND s.event_id = $2",
        )
        .await?;
    let row = client.query_one(&statement, &[&slot, &event_id]).await?;
    Ok(SeatCounts {
        event_id: event_id.to_owned(),
        available: row.try_get("available")?,
        held: row.try_get("held")?,
        sold: row.try_get("sold")?,
    })
}
