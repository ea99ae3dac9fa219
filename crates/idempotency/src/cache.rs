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
use tokio_postgres::Socket;

use crate::fingerprint::RequestHash;
use crate::key::IdempotencyKey;
use crate::response::StoredResponse;

/// The channel that invalidations are sent on; its payload names one key
/// (see [`payload`]).
pub const CHANNEL: &str = "idempotency_answers";

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
        listen: tokio_postgres::Config,
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
        crate::listen::spawn(
            &cache.0,
            CHANNEL,
            listen,
            tls,
            "idempotency-listener",
            "answer cache: invalidation listener lost; serving from the database",
        );
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

impl crate::listen::Listener for Inner {
    fn listening(&self, now: bool) {
        Inner::listening(self, now);
    }

    fn notice(&self, payload: &str) {
        match parse(payload) {
            Some((user_id, key)) => self.invalidate(user_id, key),
            // A notice this version cannot read: drop everything to be safe.
            None => Inner::listening(self, true),
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
