//! Seat maps served from memory: a snapshot per event in each instance,
//! read again from the database when it is older than [`MAX_AGE`] or an
//! unordered hold in it has expired (but not before [`MIN_AGE`]), so that another buyer's hold, order,
//! settlement, release or expiry shows on every instance within a second,
//! with no message between instances to miss. One view refreshes a stale
//! snapshot while the views that meet it wait for that read, never a read
//! of their own: a crowd costs one map statement per event and instance
//! each [`MAX_AGE`], whatever its size.
//!
//! The caller's own holds are exact on every view. The snapshot knows
//! every live hold's holder, and a view takes the caller's from it, with
//! no statement, unless the caller's holds changed since the snapshot was
//! read: then it reads them (one probe of the buyer's index of live holds).
//! A change made through this instance is known at once; one made through
//! another is heard on [`CHANNEL`], which each instance listens on (its own
//! connection) and whoever changes a buyer's holds notifies, unless it
//! counted no other listener in the last second. While that connection is
//! not listening, and for its first [`TRUSTED_AFTER`] (until every other
//! instance has counted it), every view reads the caller's holds. A buyer with none of the event's
//! holds, the crowd, gets the snapshot's own bytes, serialized, hashed and
//! compressed once per snapshot.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::Duration;

use bytes::Bytes;
use deadpool_postgres::Pool;
use flate2::write::GzEncoder;
use flate2::Compression;
use sha2::{Digest, Sha256};
use tokio::time::Instant;

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

/// The channel on which a change of buyers' holds is told to every
/// instance; its payload is a token of the notice, a space, and the
/// buyers' ids, one per line (a buyer's id has no control character).
/// An instance of a version that knew one buyer per notice reads a notice
/// of several as one buyer it does not know: during a rolling deploy,
/// those buyers' own holds show on it with the next snapshot.
pub const CHANNEL: &str = "stagedoor_holds";

/// The most of a notice's payload (PostgreSQL takes less than 8,000
/// bytes); the buyers past it go in the next notice.
const PAYLOAD_BYTES: usize = 7_900;

/// The `application_name` of each instance's listening connection, by
/// which the instances count each other.
const LISTENER: &str = "stagedoor-holds-listener";

/// The longest a change waits for this instance to hear its own notice.
const HEARD_WITHIN: Duration = Duration::from_millis(100);

/// How long an instance listens before it trusts a snapshot with anyone's
/// own holds: the others count the listeners each second, and notify only
/// while there is another, so by then they all know of this one.
pub const TRUSTED_AFTER: Duration = Duration::from_secs(2);

/// The seat maps of this instance; see the module documentation. Without
/// [`SeatMaps::listen`] every view reads the caller's own holds.
#[derive(Default)]
pub struct SeatMaps(Arc<Inner>);

struct Inner {
    events: Mutex<HashMap<String, Arc<Slot>>>,
    changes: Mutex<Changes>,
    /// Since when [`CHANNEL`] has been listened on without a break; `None`
    /// while it is not.
    listening_since: Mutex<Option<Instant>>,
    /// This instance's notices not yet heard back, by token.
    waiting: Mutex<HashMap<String, tokio::sync::oneshot::Sender<()>>>,
    outbox: Mutex<Outbox>,
    /// How many other instances listen, as last counted; -1 until then.
    others: AtomicI64,
    /// What this instance's tokens start with: its own, among all.
    instance: uuid::Uuid,
    sent: AtomicU64,
}

impl Default for Inner {
    fn default() -> Self {
        Self {
            events: Mutex::default(),
            changes: Mutex::default(),
            listening_since: Mutex::default(),
            waiting: Mutex::default(),
            outbox: Mutex::default(),
            others: AtomicI64::new(-1),
            instance: uuid::Uuid::new_v4(),
            sent: AtomicU64::new(0),
        }
    }
}

/// The changes not yet told to the other instances, each with the request
/// that waits for it to be told, and whether a task is telling them.
#[derive(Default)]
struct Outbox {
    changes: Vec<(String, tokio::sync::oneshot::Sender<()>)>,
    sending: bool,
}

impl Outbox {
    /// The next notice's buyers, each once, within [`PAYLOAD_BYTES`], and
    /// the requests that wait for it.
    fn next_notice(&mut self) -> (Vec<String>, Vec<tokio::sync::oneshot::Sender<()>>) {
        let mut buyers = Vec::new();
        let mut named = HashSet::new();
        let mut bytes = 0;
        let mut taken = 0;
        for (buyer, _) in &self.changes {
            if !named.contains(buyer) {
                if !named.is_empty() && bytes + buyer.len() + 1 > PAYLOAD_BYTES {
                    break;
                }
                bytes += buyer.len() + 1;
                named.insert(buyer);
                buyers.push(buyer.clone());
            }
            taken += 1;
        }
        let waiters = self.changes.drain(..taken).map(|(_, done)| done).collect();
        (buyers, waiters)
    }
}

/// The buyers whose holds changed lately, with when this instance learned
/// it, in two generations of [`MAX_AGE`]: a change learned longer ago than
/// that is older than every snapshot still served, so it is forgotten.
#[derive(Default)]
struct Changes {
    current: HashMap<String, Instant>,
    previous: HashMap<String, Instant>,
    current_since: Option<Instant>,
}

impl Changes {
    fn note(&mut self, buyer: &str, at: Instant) {
        if self
            .current_since
            .is_none_or(|since| at.saturating_duration_since(since) >= MAX_AGE)
        {
            self.previous = std::mem::take(&mut self.current);
            self.current_since = Some(at);
        }
        self.current.insert(buyer.to_owned(), at);
    }

    fn last(&self, buyer: &str) -> Option<Instant> {
        self.current
            .get(buyer)
            .or_else(|| self.previous.get(buyer))
            .copied()
    }
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
        idempotency::listen::spawn(
            &self.0,
            CHANNEL,
            config,
            tls,
            LISTENER,
            "seat maps: the holds listener lost; reading each caller's holds on every view",
        );
    }

    /// The buyer's holds just changed (a hold made or released, an order
    /// placed), committed: this instance's next views of any map read
    /// them, and so do every other instance's once it hears the notice
    /// that names the buyer. PostgreSQL hands a notice to every listener at
    /// once, so this returns once this instance's own listener heard it (or
    /// [`HEARD_WITHIN`] after it was sent): by the time the buyer has the
    /// answer and asks another instance for the map, that one has heard it
    /// too.
    ///
    /// One notice at a time is on its way from an instance, and it names
    /// every buyer whose change came while the one before was: each
    /// notice wakes every listener's backend, which beside another
    /// instance made it the dearest statement of a click.
    pub async fn changed(&self, pool: &Pool, buyer: &BuyerId) {
        self.0.changed(buyer.as_str());
        if self.0.others.load(Ordering::Acquire) == 0 {
            // Alone: nobody to tell (a new instance trusts nothing for
            // its first seconds, until this one has counted it).
            return;
        }
        let (done, told) = tokio::sync::oneshot::channel();
        let start = {
            let mut outbox = self.0.outbox();
            outbox.changes.push((buyer.as_str().to_owned(), done));
            !std::mem::replace(&mut outbox.sending, true)
        };
        if start {
            let sending = Sending {
                inner: self.0.clone(),
                emptied: false,
            };
            tokio::spawn(tell(sending, pool.clone()));
        }
        // Told, or the task that was telling it is gone.
        let _ = told.await;
    }

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
        let own = if self.0.knows(buyer.as_str(), snapshot.sent) {
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
            let client = pool.get().await?;
            seats::own_holds(&client, event_id, buyer).await?
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
            self.0.events().remove(event_id);
            return Ok(None);
        };
        drop(client);
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
            seats,
            shared,
            holds,
            sent,
            valid_until: sent + first_expiry,
        });
        *slot.lock() = Some(snapshot.clone());
        Ok(Some(snapshot))
    }

    fn slot(&self, event_id: &str) -> Arc<Slot> {
        let mut events = self.0.events();
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
}

/// The task that tells the outbox's changes, one notice after another,
/// until it is empty.
struct Sending {
    inner: Arc<Inner>,
    emptied: bool,
}

impl Drop for Sending {
    /// A task that ended before the outbox was empty (a panic, the
    /// runtime's end) lets the requests it left answer, and the next
    /// change start another.
    fn drop(&mut self) {
        if !self.emptied {
            let mut outbox = self.inner.outbox();
            outbox.changes.clear();
            outbox.sending = false;
        }
    }
}

async fn tell(mut sending: Sending, pool: Pool) {
    loop {
        let (buyers, waiters) = {
            let mut outbox = sending.inner.outbox();
            if outbox.changes.is_empty() {
                outbox.sending = false;
                sending.emptied = true;
                return;
            }
            outbox.next_notice()
        };
        sending.inner.notify(&pool, &buyers).await;
        for done in waiters {
            let _ = done.send(());
        }
    }
}

impl Inner {
    fn events(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Slot>>> {
        // Each map stays whole whatever panicked while holding it.
        self.events.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn changes(&self) -> std::sync::MutexGuard<'_, Changes> {
        self.changes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn listening_since(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        self.listening_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn waiting(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<String, tokio::sync::oneshot::Sender<()>>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn changed(&self, buyer: &str) {
        self.changes().note(buyer, Instant::now());
    }

    fn outbox(&self) -> std::sync::MutexGuard<'_, Outbox> {
        self.outbox.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends one notice of `buyers`' changes and waits until this
    /// instance's listener heard it, or [`HEARD_WITHIN`]; not heard in
    /// time or not sent, the other instances still show the changes with
    /// their next snapshot, within a second.
    async fn notify(&self, pool: &Pool, buyers: &[String]) {
        let (token, heard) = self.expect_notice();
        let sent = async {
            let client = pool.get().await?;
            let statement = client.prepare_cached("SELECT pg_notify($1, $2)").await?;
            let payload = format!("{token} {}", buyers.join("\n"));
            client.execute(&statement, &[&CHANNEL, &payload]).await?;
            Ok::<_, DbError>(())
        };
        if let Err(error) = sent.await {
            tracing::warn!(%error, "seat maps: a change of buyers' holds could not be told to the other instances");
        } else if let Some(heard) = heard {
            let _ = tokio::time::timeout(HEARD_WITHIN, heard).await;
        }
        self.waiting().remove(&token);
    }

    /// A token for a notice about to be sent, and what tells when this
    /// instance heard it back: `None` while nothing listens here.
    fn expect_notice(&self) -> (String, Option<tokio::sync::oneshot::Receiver<()>>) {
        let token = format!(
            "{}.{}",
            self.instance.simple(),
            self.sent.fetch_add(1, Ordering::Relaxed)
        );
        if self.listening_since().is_none() {
            return (token, None);
        }
        let (heard, hearing) = tokio::sync::oneshot::channel();
        self.waiting().insert(token.clone(), heard);
        (token, Some(hearing))
    }

    /// Whether a snapshot read at `sent` has every live hold of `buyer`:
    /// nothing of theirs changed since, as far as this instance can know.
    fn knows(&self, buyer: &str, sent: Instant) -> bool {
        self.listening_since()
            .is_some_and(|since| since + TRUSTED_AFTER <= sent)
            && self.changes().last(buyer).is_none_or(|at| at < sent)
    }
}

impl idempotency::listen::Listener for Inner {
    const EVERY_SECOND: Option<&'static str> = Some(
        "SELECT count(*) FROM pg_stat_activity
         WHERE application_name = current_setting('application_name')
           AND datname = current_database() AND pid <> pg_backend_pid()",
    );

    fn listening(&self, now: bool) {
        *self.listening_since() = now.then(Instant::now);
    }

    fn counted(&self, others: i64) {
        self.others.store(others, Ordering::Release);
    }

    fn notice(&self, payload: &str) {
        let Some((token, buyers)) = payload.split_once(' ') else {
            return;
        };
        for buyer in buyers.lines() {
            self.changed(buyer);
        }
        if let Some(heard) = self.waiting().remove(token) {
            let _ = heard.send(());
        }
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

#[cfg(test)]
mod tests {
    use super::{Outbox, PAYLOAD_BYTES};

    fn outbox(buyers: &[String]) -> (Outbox, Vec<tokio::sync::oneshot::Receiver<()>>) {
        let mut outbox = Outbox::default();
        let mut told = Vec::new();
        for buyer in buyers {
            let (done, waiting) = tokio::sync::oneshot::channel();
            outbox.changes.push((buyer.clone(), done));
            told.push(waiting);
        }
        (outbox, told)
    }

    /// A notice names each buyer once, and takes every change of the
    /// buyers it names, in the order they came.
    #[test]
    fn a_notice_names_each_buyer_once_with_all_their_changes() {
        let buyers = ["alice", "bob", "alice", "carol", "bob"].map(str::to_owned);
        let (mut outbox, _told) = outbox(&buyers);
        let (named, waiters) = outbox.next_notice();
        assert_eq!(named, ["alice", "bob", "carol"]);
        assert_eq!(waiters.len(), 5);
        assert!(outbox.changes.is_empty());
    }

    /// Buyers past the payload's bound wait for the next notice, with
    /// their changes: 40 ids of the longest go in two notices.
    #[test]
    fn buyers_past_the_payload_go_in_the_next_notice() {
        let buyers: Vec<String> = (0..40).map(|i| format!("{i:0>255}")).collect();
        let (mut outbox, _told) = outbox(&buyers);
        let (first, waiters) = outbox.next_notice();
        assert_eq!(first.len(), PAYLOAD_BYTES / 256);
        assert_eq!(waiters.len(), first.len());
        let (second, _) = outbox.next_notice();
        assert_eq!(first.len() + second.len(), 40);
        assert_eq!([first, second].concat(), buyers);
        assert!(outbox.changes.is_empty());
    }
}
