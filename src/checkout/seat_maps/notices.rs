//! What this instance knows of changes to buyers' holds, and the telling
//! of them between instances. A change made through this instance is
//! known at once; one made through another is heard on [`CHANNEL`], which
//! each instance listens on (its own connection) and whoever changes a
//! buyer's holds notifies, unless it counted no other listener in the last
//! second. While that connection is not listening, and for its first
//! [`TRUSTED_AFTER`] (until every other instance has counted it), no
//! snapshot is trusted with anyone's own holds.
//!
//! One notice at a time is on its way from an instance, and it names every
//! buyer whose change came while the one before was: each notice wakes
//! every listener's backend, which beside another instance made it the
//! dearest statement of a click.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio::sync::oneshot;
use tokio::time::Instant;

use crate::db::DbError;

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

/// This instance's side of the notices; see the module documentation.
pub(super) struct Notices {
    changes: Mutex<Changes>,
    /// Since when [`CHANNEL`] has been listened on without a break; `None`
    /// while it is not.
    listening_since: Mutex<Option<Instant>>,
    /// This instance's notices not yet heard back, by token.
    waiting: Mutex<HashMap<String, oneshot::Sender<()>>>,
    outbox: Mutex<Outbox>,
    /// How many other instances listen, as last counted; -1 until then.
    others: AtomicI64,
    /// What this instance's tokens start with: its own, among all.
    instance: uuid::Uuid,
    sent: AtomicU64,
}

impl Notices {
    /// `remembered`: how long a snapshot is served; a change learned
    /// longer ago than that is older than every snapshot, so it is
    /// forgotten.
    pub(super) fn new(remembered: Duration) -> Self {
        Self {
            changes: Mutex::new(Changes {
                generation: remembered,
                current: HashMap::new(),
                previous: HashMap::new(),
                current_since: None,
            }),
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
    changes: Vec<(String, oneshot::Sender<()>)>,
    sending: bool,
}

impl Outbox {
    /// The next notice's buyers, each once, within [`PAYLOAD_BYTES`], and
    /// the requests that wait for it.
    fn next_notice(&mut self) -> (Vec<String>, Vec<oneshot::Sender<()>>) {
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
/// it, in two generations as long as a snapshot is served.
struct Changes {
    generation: Duration,
    current: HashMap<String, Instant>,
    previous: HashMap<String, Instant>,
    current_since: Option<Instant>,
}

impl Changes {
    fn note(&mut self, buyer: &str, at: Instant) {
        if self
            .current_since
            .is_none_or(|since| at.saturating_duration_since(since) >= self.generation)
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

impl Notices {
    /// Listens on [`CHANNEL`] over a connection of its own to `config`'s
    /// database, for as long as `notices` live.
    pub(super) fn listen<T>(notices: &Arc<Self>, config: tokio_postgres::Config, tls: T)
    where
        T: tokio_postgres::tls::MakeTlsConnect<tokio_postgres::Socket> + Clone + Send + 'static,
        T::Stream: Send + 'static,
        T::TlsConnect: Send,
        <T::TlsConnect as tokio_postgres::tls::TlsConnect<tokio_postgres::Socket>>::Future: Send,
    {
        idempotency::listen::spawn(
            notices,
            CHANNEL,
            config,
            tls,
            LISTENER,
            "seat maps: the holds listener lost; reading each caller's holds on every view",
        );
    }

    /// `buyer`'s holds just changed, committed: known here at once, and
    /// told to the other instances, returning once this instance's own
    /// listener heard the notice that names the buyer (or [`HEARD_WITHIN`]
    /// after it was sent). PostgreSQL hands a notice to every listener at
    /// once, so by the time the buyer has the answer and asks another
    /// instance for the map, that one has heard it too.
    pub(super) async fn changed(notices: &Arc<Self>, pool: &Pool, buyer: &str) {
        notices.note(buyer);
        if notices.others.load(Ordering::Acquire) == 0 {
            // Alone: nobody to tell (a new instance trusts nothing for
            // its first seconds, until this one has counted it).
            return;
        }
        let (done, told) = oneshot::channel();
        let start = {
            let mut outbox = notices.outbox();
            outbox.changes.push((buyer.to_owned(), done));
            !std::mem::replace(&mut outbox.sending, true)
        };
        if start {
            let sending = Sending {
                notices: notices.clone(),
                emptied: false,
            };
            tokio::spawn(tell(sending, pool.clone()));
        }
        // Told, or the task that was telling it is gone.
        let _ = told.await;
    }

    /// Whether a snapshot read at `sent` has every live hold of `buyer`:
    /// nothing of theirs changed since, as far as this instance can know.
    pub(super) fn knows(&self, buyer: &str, sent: Instant) -> bool {
        self.listening_since()
            .is_some_and(|since| since + TRUSTED_AFTER <= sent)
            && self.changes().last(buyer).is_none_or(|at| at < sent)
    }

    fn note(&self, buyer: &str) {
        self.changes().note(buyer, Instant::now());
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
    fn expect_notice(&self) -> (String, Option<oneshot::Receiver<()>>) {
        let token = format!(
            "{}.{}",
            self.instance.simple(),
            self.sent.fetch_add(1, Ordering::Relaxed)
        );
        if self.listening_since().is_none() {
            return (token, None);
        }
        let (heard, hearing) = oneshot::channel();
        self.waiting().insert(token.clone(), heard);
        (token, Some(hearing))
    }

    // Each lock's value stays whole whatever panicked while holding it.
    fn changes(&self) -> MutexGuard<'_, Changes> {
        self.changes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn listening_since(&self) -> MutexGuard<'_, Option<Instant>> {
        self.listening_since
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn waiting(&self) -> MutexGuard<'_, HashMap<String, oneshot::Sender<()>>> {
        self.waiting.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn outbox(&self) -> MutexGuard<'_, Outbox> {
        self.outbox.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// The task that tells the outbox's changes, one notice after another,
/// until it is empty.
struct Sending {
    notices: Arc<Notices>,
    emptied: bool,
}

impl Drop for Sending {
    /// A task that ended before the outbox was empty (a panic, the
    /// runtime's end) lets the requests it left answer, and the next
    /// change start another.
    fn drop(&mut self) {
        if !self.emptied {
            let mut outbox = self.notices.outbox();
            outbox.changes.clear();
            outbox.sending = false;
        }
    }
}

async fn tell(mut sending: Sending, pool: Pool) {
    loop {
        let (buyers, waiters) = {
            let mut outbox = sending.notices.outbox();
            if outbox.changes.is_empty() {
                outbox.sending = false;
                sending.emptied = true;
                return;
            }
            outbox.next_notice()
        };
        sending.notices.notify(&pool, &buyers).await;
        for done in waiters {
            let _ = done.send(());
        }
    }
}

impl idempotency::listen::Listener for Notices {
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
            self.note(buyer);
        }
        if let Some(heard) = self.waiting().remove(token) {
            let _ = heard.send(());
        }
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
