//! Seat maps served from memory: a snapshot per event in each instance,
//! read again from the database when it is older than [`MAX_AGE`] or an
//! unordered hold in it has expired (but not before [`MIN_AGE`]), so that
//! another buyer's hold, order, settlement, release or expiry shows on
//! every instance within a second, with no message between instances to
//! miss. One view refreshes a stale snapshot while the views that meet it
//! wait for that read, never a read of their own: a crowd costs one map
//! statement per event and instance each [`MAX_AGE`], whatever its size.
//!
//! The caller's own holds are exact on every view. The snapshot knows
//! every live hold's holder, and a view takes the caller's from it, with
//! no statement, unless the caller's holds changed since the snapshot was
//! read, as far as this instance knows (`notices.rs`): then it reads them
//! (one probe of the buyer's index of live holds). A buyer with none of
//! the event's holds, the crowd, gets the snapshot's own bytes,
//! serialized, hashed and compressed once per snapshot.

mod notices;

pub use notices::{CHANNEL, TRUSTED_AFTER};

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use deadpool_postgres::Pool;
use flate2::write::GzEncoder;
use flate2::Compression;
use idempotency::Route;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

use self::notices::Notices;
use super::seats::{self, SeatMap, YourHold};
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

/// The seat maps of this instance; see the module documentation. Without
/// [`SeatMaps::listen`] every view reads the caller's own holds.
pub struct SeatMaps {
    events: Mutex<HashMap<String, Arc<Entry>>>,
    notices: Arc<Notices>,
}

impl Default for SeatMaps {
    fn default() -> Self {
        Self {
            events: Mutex::default(),
            notices: Arc::new(Notices::new(MAX_AGE)),
        }
    }
}

#[derive(Default)]
struct Entry {
    current: Mutex<Option<Arc<Snapshot>>>,
    /// Held by the one view that reads the map again.
    refresh: tokio::sync::Mutex<()>,
}

struct Snapshot {
    /// The event's slot: where its holds are read.
    slot: i32,
    seats: Vec<seats::Seat>,
    /// The map of a buyer with no hold of the event.
    shared: Arc<MapBody>,
    /// Each holder's live unordered holds, by seat, and when each expires.
    holds: HashMap<String, Vec<(i64, YourHold, Instant)>>,
    /// When its statement was sent: every change committed before is in it.
    sent: Instant,
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
    /// Listens on [`CHANNEL`] over a connection of its own to `config`'s
    /// database, for as long as these maps live.
    pub fn listen<T>(&self, config: tokio_postgres::Config, tls: T)
    where
        T: tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket> + Clone + Send + 'static,
        T::Stream: Send + 'static,
        T::TlsConnect: Send,
        <T::TlsConnect as tokio_postgres::tls::TlsConnect<tokio_postgres::Socket>>::Future: Send,
    {
        Notices::listen(&self.notices, config, tls);
    }

    /// The buyer's holds just changed (a hold made or released, an order
    /// placed), committed: this instance's next views of any map read
    /// them, and so do every other instance's once it hears the notice
    /// that names the buyer, which this waits for (`notices.rs`).
    pub async fn changed(&self, pool: &Pool, buyer: &BuyerId) {
        Notices::changed(&self.notices, pool, buyer.as_str()).await;
    }

    /// The map of `event_id` as `buyer` sees it, or `None` when there is
    /// no such event.
    pub async fn view(
        &self,
        route: &Route,
        event_id: &str,
        buyer: &BuyerId,
    ) -> Result<Option<Arc<MapBody>>, DbError> {
        // PostgreSQL text cannot hold NUL, so no event has such an id; asking
        // would be an encoding error (a 500) instead of a 404.
        if event_id.contains('\0') {
            return Ok(None);
        }
        let Some(snapshot) = self.snapshot(route, event_id).await? else {
            return Ok(None);
        };
        let own = if self.notices.knows(buyer.as_str(), snapshot.sent) {
            let now = Instant::now();
            snapshot
                .holds
                .get(buyer.as_str())
                .map(|holds| {
                    holds
                        .iter()
                        .filter(|(_, _, expires)| *expires > now)
                        .map(|(seat_id, hold, _)| (*seat_id, hold.clone()))
                        .collect()
                })
                .unwrap_or_default()
        } else {
            let client = route.slot_pool(snapshot.slot).get().await?;
            seats::own_holds(&client, snapshot.slot, event_id, buyer).await?
        };
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
    /// none is, on the worker of the event's slot.
    async fn snapshot(
        &self,
        route: &Route,
        event_id: &str,
    ) -> Result<Option<Arc<Snapshot>>, DbError> {
        let entry = self.entry(event_id);
        if let Some(fresh) = entry.fresh() {
            return Ok(Some(fresh));
        }
        let _reading = entry.refresh.lock().await;
        // Another view may have read it while this one waited.
        if let Some(fresh) = entry.fresh() {
            return Ok(Some(fresh));
        }
        let sent = Instant::now();
        let mut found = None;
        for slot in seats::slots_of_event(route.slots_spread(), event_id) {
            let client = route.slot_pool(slot).get().await?;
            if let Some(read) = seats::read_map(&client, slot, event_id).await? {
                found = Some((slot, read));
                break;
            }
        }
        let Some((slot, read)) = found else {
            self.events().remove(event_id);
            return Ok(None);
        };
        let first_expiry = read
            .iter()
            .filter_map(|s| s.expires_in)
            .map(|secs| Duration::try_from_secs_f64(secs).unwrap_or_default())
            .min()
            .map_or(MAX_AGE, |life| life.clamp(MIN_AGE, MAX_AGE));
        let mut holds: HashMap<String, Vec<(i64, YourHold, Instant)>> = HashMap::new();
        let mut seats = Vec::with_capacity(read.len());
        for read in read {
            if let (Some(holder), Some(hold), Some(life)) =
                (read.holder, read.hold, read.expires_in)
            {
                let life = Duration::try_from_secs_f64(life).unwrap_or_default();
                holds
                    .entry(holder)
                    .or_default()
                    .push((read.seat.seat_id, hold, sent + life));
            }
            seats.push(read.seat);
        }
        let shared = Arc::new(MapBody::of(&SeatMap {
            event_id: event_id.to_owned(),
            seats: seats.clone(),
        }));
        let snapshot = Arc::new(Snapshot {
            slot,
            seats,
            shared,
            holds,
            sent,
            valid_until: sent + first_expiry,
        });
        *entry.lock() = Some(snapshot.clone());
        Ok(Some(snapshot))
    }

    fn events(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Entry>>> {
        // Each map stays whole whatever panicked while holding it.
        self.events.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn entry(&self, event_id: &str) -> Arc<Entry> {
        let mut events = self.events();
        if let Some(entry) = events.get(event_id) {
            return entry.clone();
        }
        if events.len() >= KEPT {
            let now = Instant::now();
            events.retain(|_, entry| {
                entry
                    .lock()
                    .as_ref()
                    .is_some_and(|s| s.valid_until + FORGOTTEN > now)
            });
        }
        let entry = Arc::new(Entry::default());
        events.insert(event_id.to_owned(), entry.clone());
        entry
    }
}

impl Entry {
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
