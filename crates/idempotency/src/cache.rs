//! The answer cache: final answers of keys, in this process, so that a
//! retry of an answered click is answered from memory, with no pooled
//! connection and no token of the new-click limit.
//!
//! An answered key is immutable until it expires or is purged, which is
//! what makes this safe. Expiry: an entry lives no longer than its key's
//! TTL, measured by the database's clock (the life left that the row's own
//! statement computed, counted from before the statement was sent, so that
//! an entry always goes a little before its key). Purge: whatever deletes or
//! rewrites an answered row notifies [`CHANNEL`] in its transaction, and
//! every instance listens on one connection of its own, outside the pool,
//! and drops the entry. While that connection is down (not yet up, lost,
//! reconnecting) a missed notice could leave a purged answer in memory, so
//! the cache is emptied and neither answers nor learns until it listens
//! again. A read that raced with a notice is not kept either: each entry
//! learned from the database is kept only if no notice (and no loss of the
//! listener) came between the moment its read was sent and its arrival.
//!
//! Only final answers are kept: an answer stored (or read) for the key, a
//! 2xx or a 4xx; never an in-progress row, a 5xx, or a key whose effect is
//! still settling (such a key has no answer).

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use quick_cache::sync::Cache;
use quick_cache::{DefaultHashBuilder, Equivalent, Lifecycle, Weighter};
use tokio::time::Instant;
use tokio_postgres::tls::{MakeTlsConnect, TlsConnect};
use tokio_postgres::{AsyncMessage, Socket};

use crate::{IdempotencyKey, RequestHash, StoredResponse};

/// The channel that invalidations are sent on; its payload names one key
/// (see [`payload`]).
pub const CHANNEL: &str = "idempotency_answers";

/// How long the listener waits before it connects again.
const RECONNECT: Duration = Duration::from_secs(1);
/// What an entry weighs besides its bytes (the map's slot, the `Arc`).
const OVERHEAD: u64 = 96;

/// What the cache did, for metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheEvent {
    /// A request answered from memory.
    Hit,
    /// A keyed request the cache could not answer.
    Miss,
    /// An entry dropped for room or because its key expired.
    Eviction,
    /// An entry dropped (or the whole cache, when the listener was lost)
    /// because its row may have changed.
    Invalidation,
}

impl CacheEvent {
    pub const ALL: [CacheEvent; 4] = [
        CacheEvent::Hit,
        CacheEvent::Miss,
        CacheEvent::Eviction,
        CacheEvent::Invalidation,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            CacheEvent::Hit => "hit",
            CacheEvent::Miss => "miss",
            CacheEvent::Eviction => "eviction",
            CacheEvent::Invalidation => "invalidation",
        }
    }
}

type Observe = Arc<dyn Fn(CacheEvent) + Send + Sync>;

/// A bounded, shared answer cache; see the module documentation.
#[derive(Clone)]
pub struct AnswerCache(Arc<Inner>);

struct Inner {
    entries: Cache<KeyId, Arc<Entry>, ByBytes, DefaultHashBuilder, Evictions>,
    /// True while the listener listens.
    trusted: AtomicBool,
    /// Moves on every notice and every loss or gain of the listener.
    epoch: AtomicU64,
    observe: Observe,
}

/// A key as the tuple `(scope, key)`: never a joined string, so that no
/// scope and key can pass for another pair.
type KeyId = (String, String);

/// A borrowed [`KeyId`], to look an entry up without allocating.
struct KeyRef<'a>(&'a str, &'a str);

impl Hash for KeyRef<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        // As the tuple hashes: each field in turn.
        self.0.hash(state);
        self.1.hash(state);
    }
}

impl Equivalent<KeyId> for KeyRef<'_> {
    fn equivalent(&self, key: &KeyId) -> bool {
        self.0 == key.0 && self.1 == key.1
    }
}

struct Entry {
    hash: RequestHash,
    response: StoredResponse,
    expires: Instant,
}

#[derive(Clone)]
struct ByBytes;

impl Weighter<KeyId, Arc<Entry>> for ByBytes {
    fn weight(&self, (scope, key): &KeyId, entry: &Arc<Entry>) -> u64 {
        let response = &entry.response;
        let bytes = scope.len()
            + key.len()
            + response.body.len()
            + response.content_type.len()
            + response.location.as_ref().map_or(0, String::len)
            + entry.hash.as_bytes().len();
        bytes as u64 + OVERHEAD
    }
}

#[derive(Clone)]
struct Evictions(Observe);

impl Lifecycle<KeyId, Arc<Entry>> for Evictions {
    type RequestState = ();

    fn on_evict(&self, _: &mut Self::RequestState, _: KeyId, _: Arc<Entry>) {
        (self.0)(CacheEvent::Eviction);
    }
}

/// What the cache says about a request.
pub(crate) enum Cached {
    /// The key's answer, for a request with the same hash.
    Replay(StoredResponse),
    /// The key was answered for another request.
    KeyReused,
}

/// When a read of the database was sent, for [`AnswerCache::learn`].
#[derive(Clone, Copy)]
pub(crate) struct Asked {
    at: Instant,
    epoch: u64,
}

impl AnswerCache {
    /// A cache of at most `max_bytes`, which listens for invalidations on
    /// its own connection to the database of `listen` (driven by a task of
    /// its own, reconnecting when lost), and tells `observe` what it does.
    /// It answers nothing until that connection listens. `tls` secures that
    /// connection as the caller's other connections are.
    pub fn start<T>(
        max_bytes: u64,
        mut listen: tokio_postgres::Config,
        tls: T,
        observe: impl Fn(CacheEvent) + Send + Sync + 'static,
    ) -> Self
    where
        T: MakeTlsConnect<Socket> + Clone + Send + 'static,
        T::Stream: Send + 'static,
        T::TlsConnect: Send,
        <T::TlsConnect as TlsConnect<Socket>>::Future: Send,
    {
        let observe: Observe = Arc::new(observe);
        let estimated_items = usize::try_from(max_bytes / 1_024)
            .unwrap_or(usize::MAX)
            .max(16);
        let entries = Cache::with(
            estimated_items,
            max_bytes,
            ByBytes,
            DefaultHashBuilder::default(),
            Evictions(observe.clone()),
        );
        let cache = Self(Arc::new(Inner {
            entries,
            trusted: AtomicBool::new(false),
            epoch: AtomicU64::new(0),
            observe,
        }));
        // A connection whose peer vanished without a word is found out in
        // seconds, not hours: until then a purge could go unheard.
        listen
            .application_name("idempotency-listener")
            .keepalives(true)
            .keepalives_idle(Duration::from_secs(5))
            .keepalives_interval(Duration::from_secs(1))
            .keepalives_retries(3);
        tokio::spawn(listener(Arc::downgrade(&cache.0), listen, tls));
        cache
    }

    /// True while the cache answers (its listener listens).
    pub fn is_trusted(&self) -> bool {
        self.0.trusted.load(Ordering::Acquire)
    }

    /// The cached answer of the key for this request, if any.
    pub(crate) fn answer(
        &self,
        user_id: &str,
        key: &IdempotencyKey,
        hash: &RequestHash,
    ) -> Option<Cached> {
        let inner = &self.0;
        let found = if self.is_trusted() {
            inner.entries.get(&KeyRef(user_id, key.as_str()))
        } else {
            None
        };
        let Some(entry) = found else {
            (inner.observe)(CacheEvent::Miss);
            return None;
        };
        if entry.expires <= Instant::now() {
            let gone = inner.entries.remove(&KeyRef(user_id, key.as_str()));
            if gone.is_some() {
                (inner.observe)(CacheEvent::Eviction);
            }
            (inner.observe)(CacheEvent::Miss);
            return None;
        }
        (inner.observe)(CacheEvent::Hit);
        Some(if entry.hash == *hash {
            Cached::Replay(entry.response.clone())
        } else {
            Cached::KeyReused
        })
    }

    /// Marks the moment a read or a claim is sent to the database.
    pub(crate) fn ask(&self) -> Asked {
        Asked {
            at: Instant::now(),
            epoch: self.0.epoch.load(Ordering::Acquire),
        }
    }

    /// Keeps the final answer of a key that has `life` left as of `asked`,
    /// unless a notice (or a loss of the listener) came meanwhile.
    pub(crate) fn learn(
        &self,
        asked: Asked,
        user_id: &str,
        key: &IdempotencyKey,
        hash: &RequestHash,
        response: &StoredResponse,
        life: Duration,
    ) {
        let inner = &self.0;
        if response.status >= 500 || !self.is_trusted() || life.is_zero() {
            return;
        }
        let entry = Arc::new(Entry {
            hash: *hash,
            response: response.clone(),
            expires: asked.at + life,
        });
        if inner.epoch.load(Ordering::Acquire) != asked.epoch {
            return;
        }
        inner
            .entries
            .insert((user_id.to_owned(), key.as_str().to_owned()), entry);
        // A notice that came during the insert: drop what it may have missed.
        if inner.epoch.load(Ordering::Acquire) != asked.epoch {
            inner.entries.remove(&KeyRef(user_id, key.as_str()));
        }
    }
}

impl Inner {
    fn invalidate(&self, user_id: &str, key: &str) {
        self.epoch.fetch_add(1, Ordering::AcqRel);
        if self.entries.remove(&KeyRef(user_id, key)).is_some() {
            (self.observe)(CacheEvent::Invalidation);
        }
    }

    /// The listener listens (`true`) or was lost (`false`): either way
    /// nothing learned before may be trusted.
    fn listening(&self, now: bool) {
        if !now {
            self.trusted.store(false, Ordering::Release);
        }
        self.epoch.fetch_add(1, Ordering::AcqRel);
        if !self.entries.is_empty() {
            self.entries.clear();
            (self.observe)(CacheEvent::Invalidation);
        }
        if now {
            self.trusted.store(true, Ordering::Release);
        }
    }
}

/// The payload of a notice on [`CHANNEL`] for a key: the scope's length in
/// bytes, a colon, the scope, the key. Unambiguous for any scope.
pub fn payload(user_id: &str, key: &str) -> String {
    format!("{}:{user_id}{key}", user_id.len())
}

fn parse(payload: &str) -> Option<(&str, &str)> {
    let (len, rest) = payload.split_once(':')?;
    let len: usize = len.parse().ok()?;
    Some((rest.get(..len)?, rest.get(len..)?))
}

/// Listens on [`CHANNEL`] for as long as the cache lives, connecting again
/// after each loss.
async fn listener<T>(cache: std::sync::Weak<Inner>, config: tokio_postgres::Config, tls: T)
where
    T: MakeTlsConnect<Socket> + Clone,
    T::Stream: Send + 'static,
{
    loop {
        if cache.strong_count() == 0 {
            return;
        }
        if let Err(error) = listen_once(&cache, &config, tls.clone()).await {
            tracing::warn!(%error, "answer cache: invalidation listener lost; serving from the database");
        }
        if let Some(inner) = cache.upgrade() {
            inner.listening(false);
        }
        tokio::time::sleep(RECONNECT).await;
    }
}

/// One listening connection, until it is lost.
async fn listen_once<T>(
    cache: &std::sync::Weak<Inner>,
    config: &tokio_postgres::Config,
    tls: T,
) -> Result<(), tokio_postgres::Error>
where
    T: MakeTlsConnect<Socket>,
    T::Stream: Send + 'static,
{
    let (client, mut connection) = config.connect(tls).await?;
    let (notices, mut received) = tokio::sync::mpsc::unbounded_channel();
    let driver = tokio::spawn(async move {
        loop {
            match std::future::poll_fn(|cx| connection.poll_message(cx)).await {
                Some(Ok(AsyncMessage::Notification(notice))) => {
                    if notices.send(notice).is_err() {
                        return Ok(());
                    }
                }
                Some(Ok(_)) => {}
                Some(Err(error)) => return Err(error),
                None => return Ok(()),
            }
        }
    });
    client.batch_execute(&format!("LISTEN {CHANNEL}")).await?;
    if let Some(inner) = cache.upgrade() {
        inner.listening(true);
    }
    while let Some(notice) = received.recv().await {
        let Some(inner) = cache.upgrade() else {
            return Ok(());
        };
        match parse(notice.payload()) {
            Some((user_id, key)) => inner.invalidate(user_id, key),
            // A notice this version cannot read: drop everything to be safe.
            None => inner.listening(true),
        }
    }
    drop(client);
    match driver.await {
        Ok(result) => result,
        Err(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::{parse, payload};

    #[test]
    fn a_payload_names_one_scope_and_key_whatever_they_hold() {
        for (user, key) in [
            ("alice", "k"),
            ("auth0|a:b", "1:x"),
            ("", "k"),
            ("ü:1", "::"),
        ] {
            assert_eq!(parse(&payload(user, key)), Some((user, key)));
        }
        assert_eq!(parse("x:abc"), None);
        assert_eq!(parse("9:abc"), None);
    }
}
