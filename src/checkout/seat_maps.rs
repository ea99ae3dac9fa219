//! Seat maps served from memory: a snapshot per event in each instance,
//! read again from the database when it is older than [`MAX_AGE`] or an
//! unordered hold in it has expired (but not before [`MIN_AGE`]), so that another buyer's hold, order,
//! settlement, release or expiry shows on every instance within a second,
//! with no message between instances to miss. One view refreshes a stale
//! snapshot while the views that meet it wait for that read, never a read
//! of their own: a crowd costs one map statement per event and instance
//! each [`MAX_AGE`], whatever its size.
//!
//! The caller's own holds are exact on every view, on any instance: each
//! view reads them (one probe of the buyer's index of live holds, a few
//! rows) and lays them over the snapshot. A buyer with none of the event's
//! holds, the crowd, gets the snapshot's own bytes, serialized, hashed and
//! compressed once per snapshot.

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use deadpool_postgres::Pool;
use flate2::write::GzEncoder;
use flate2::Compression;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use super::seats::{self, SeatMap};
use crate::auth::BuyerId;
use crate::db::DbError;

/// The oldest a snapshot is served, counted from when its statement was
/// sent: with the read's own time, a change committed elsewhere shows on
/// every instance within a second (docs/API.md).
pub const MAX_AGE: Duration = Duration::from_millis(900);

/// The youngest a snapshot is read again, though a hold in it expires
/// sooner: an on-sale's holds expire one after another, and reading the
/// map at each expiry would keep the database at it. An expiry still
/// shows within this and the read's own time.
const MIN_AGE: Duration = Duration::from_millis(100);

/// Snapshots kept before those no view has refreshed for [`FORGOTTEN`] are
/// dropped: past events' maps need not stay in memory.
const KEPT: usize = 64;
const FORGOTTEN: Duration = Duration::from_secs(60);

/// The seat maps of this instance; see the module documentation.
#[derive(Default)]
pub struct SeatMaps {
    events: Mutex<HashMap<String, Arc<Slot>>>,
}

#[derive(Default)]
struct Slot {
    current: Mutex<Option<Arc<Snapshot>>>,
    /// Held by the one view that reads the map again.
    refresh: tokio::sync::Mutex<()>,
}

struct Snapshot {
    seats: Vec<seats::Seat>,
    /// The map of a buyer with no hold of the event.
    shared: Arc<MapBody>,
    valid_until: Instant,
}

/// A map as sent: its JSON, a digest of it for the `ETag`, and its gzip,
/// made on first use.
pub struct MapBody {
    pub json: Bytes,
    pub digest: [u8; 16],
    gzipped: OnceLock<Option<Bytes>>,
}

impl MapBody {
    fn of(map: &SeatMap) -> Self {
        // Strings and numbers: serializing cannot fail.
        let json = Bytes::from(serde_json::to_vec(map).unwrap_or_default());
        let mut digest = [0; 16];
        digest.copy_from_slice(&Sha256::digest(&json)[..16]);
        Self {
            json,
            digest,
            gzipped: OnceLock::new(),
        }
    }

    /// The JSON gzipped (`None` if compressing failed: send it as it is).
    /// The fast level: most of the size goes at a fraction of the default's
    /// time.
    pub fn gzipped(&self) -> Option<Bytes> {
        self.gzipped
            .get_or_init(|| {
                let mut encoder =
                    GzEncoder::new(Vec::with_capacity(self.json.len() / 8), Compression::fast());
                encoder.write_all(&self.json).ok()?;
                encoder.finish().ok().map(Bytes::from)
            })
            .clone()
    }
}

impl SeatMaps {
    /// The map of `event_id` as `buyer` sees it, or `None` when there is
    /// no such event.
    pub async fn view(
        &self,
        pool: &Pool,
        event_id: &str,
        buyer: &BuyerId,
    ) -> Result<Option<Arc<MapBody>>, DbError> {
        // PostgreSQL text cannot hold NUL, so no event has such an id; asking
        // would be an encoding error (a 500) instead of a 404.
        if event_id.contains('\0') {
            return Ok(None);
        }
        let Some(snapshot) = self.snapshot(pool, event_id).await? else {
            return Ok(None);
        };
        let client = pool.get().await?;
        let own = seats::own_holds(&client, event_id, buyer).await?;
        drop(client);
        if own.is_empty() {
            return Ok(Some(snapshot.shared.clone()));
        }
        let mut seats = snapshot.seats.clone();
        for (seat_id, hold) in own {
            if let Ok(at) = seats.binary_search_by_key(&seat_id, |s| s.seat_id) {
                seats[at].status = "held";
                seats[at].your_hold = Some(hold);
            }
        }
        Ok(Some(Arc::new(MapBody::of(&SeatMap {
            event_id: event_id.to_owned(),
            seats,
        }))))
    }

    /// A snapshot of the event still within its bounds, read again if
    /// none is.
    async fn snapshot(
        &self,
        pool: &Pool,
        event_id: &str,
    ) -> Result<Option<Arc<Snapshot>>, DbError> {
        let slot = self.slot(event_id);
        if let Some(fresh) = slot.fresh() {
            return Ok(Some(fresh));
        }
        let _reading = slot.refresh.lock().await;
        // Another view may have read it while this one waited.
        if let Some(fresh) = slot.fresh() {
            return Ok(Some(fresh));
        }
        let sent = Instant::now();
        let client = pool.get().await?;
        let Some(read) = seats::read_map(&client, event_id).await? else {
            drop(client);
            self.lock().remove(event_id);
            return Ok(None);
        };
        drop(client);
        let first_expiry = read
            .iter()
            .filter_map(|s| s.expires_in)
            .map(|secs| Duration::try_from_secs_f64(secs).unwrap_or_default())
            .min()
            .map_or(MAX_AGE, |life| life.clamp(MIN_AGE, MAX_AGE));
        let seats: Vec<seats::Seat> = read.into_iter().map(|s| s.seat).collect();
        let shared = Arc::new(MapBody::of(&SeatMap {
            event_id: event_id.to_owned(),
            seats: seats.clone(),
        }));
        let snapshot = Arc::new(Snapshot {
            seats,
            shared,
            valid_until: sent + first_expiry,
        });
        *slot.lock() = Some(snapshot.clone());
        Ok(Some(snapshot))
    }

    fn slot(&self, event_id: &str) -> Arc<Slot> {
        let mut events = self.lock();
        if let Some(slot) = events.get(event_id) {
            return slot.clone();
        }
        if events.len() >= KEPT {
            let now = Instant::now();
            events.retain(|_, slot| {
                slot.lock()
                    .as_ref()
                    .is_some_and(|s| s.valid_until + FORGOTTEN > now)
            });
        }
        let slot = Arc::new(Slot::default());
        events.insert(event_id.to_owned(), slot.clone());
        slot
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Slot>>> {
        // The map stays whole whatever panicked while holding it.
        self.events.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

impl Slot {
    fn fresh(&self) -> Option<Arc<Snapshot>> {
        self.lock()
            .as_ref()
            .filter(|s| Instant::now() < s.valid_until)
            .cloned()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Arc<Snapshot>>> {
        self.current.lock().unwrap_or_else(PoisonError::into_inner)
    }
}
