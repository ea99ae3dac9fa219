//! Waiting for another request's answer (`Prefer: wait`), wherever that
//! request runs. A waiter holds no connection and no thread: it sleeps on a
//! channel. One poller per key and process reads the key row with a growing
//! delay and wakes every waiter of that key at once when the row has an
//! answer, its holder's lease ran out, or it is gone; each waiter then asks
//! the key again (a replay, or a takeover that finishes the intent). A
//! database that cannot be reached only makes the poller try again later:
//! the waiters time out into the 409 they would have had without waiting.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::route::Route;
use tokio::sync::watch;
use tokio::time::Instant;

use crate::claim::Policy;
use crate::store;
use crate::key::IdempotencyKey;

/// The first poll comes this soon; each next one later, up to the cap.
pub(crate) const FIRST_POLL: Duration = Duration::from_millis(10);
pub(crate) const POLL_CAP: Duration = Duration::from_millis(200);

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitOutcome {
    /// The holder answered, and the waiter replays that answer.
    Answered,
    /// The time ran out first: the waiter answers 409 as without waiting.
    TimedOut,
    /// The holder's lease ran out (it crashed): the waiter took the key over
    /// and finished the intent itself.
    TookOver,
}

impl WaitOutcome {
    pub const ALL: [WaitOutcome; 3] = [
        WaitOutcome::Answered,
        WaitOutcome::TimedOut,
        WaitOutcome::TookOver,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WaitOutcome::Answered => "answered",
            WaitOutcome::TimedOut => "timed_out",
            WaitOutcome::TookOver => "took_over",
        }
    }
}

/// The keys waited on in this process, each with the channel its poller
/// wakes the waiters on.
#[derive(Clone, Default)]
pub(crate) struct Waiters(Arc<Mutex<HashMap<KeyId, watch::Sender<()>>>>);

/// A key as `(user_id, key)`.
type KeyId = (String, String);

impl Waiters {
    /// Sleeps until the key's row changes in a way that may end the wait,
    /// or until `deadline`; a poller this starts reads first after `first_poll`.
    pub(crate) async fn wait(
        &self,
        route: &Route,
        policy: Policy,
        user_id: &str,
        key: &IdempotencyKey,
        deadline: Instant,
        first_poll: Duration,
    ) {
        let id = (user_id.to_owned(), key.as_str().to_owned());
        let mut woken = {
            let mut keys = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            match keys.get(&id) {
                Some(sender) => sender.subscribe(),
                None => {
                    let (sender, receiver) = watch::channel(());
                    keys.insert(id.clone(), sender.clone());
                    let poll = self
                        .clone()
                        .poll(route.pool(user_id), policy, id, sender, first_poll);
                    tokio::spawn(poll);
                    receiver
                }
            }
        };
        let _ = tokio::time::timeout_at(deadline, woken.changed()).await;
    }

    /// Wakes the waiters of a key at once: its answer was stored here.
    pub(crate) fn wake(&self, user_id: &str, key: &IdempotencyKey) {
        let keys = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(sender) = keys.get(&(user_id.to_owned(), key.as_str().to_owned())) {
            sender.send_replace(());
        }
    }

    /// The one poller of a key in this process: ends when the row is
    /// settled (and wakes the waiters) or when nobody waits any more.
    async fn poll(
        self,
        pool: deadpool_postgres::Pool,
        policy: Policy,
        id: (String, String),
        sender: watch::Sender<()>,
        first_poll: Duration,
    ) {
        let mut delay = first_poll;
        loop {
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(POLL_CAP);
            let settled = sender.receiver_count() == 0 || settled(&pool, policy, &id).await;
            if settled {
                let mut keys = self.0.lock().unwrap_or_else(PoisonError::into_inner);
                if keys.get(&id).is_some_and(|s| s.same_channel(&sender)) {
                    keys.remove(&id);
                }
                drop(keys);
                sender.send_replace(());
                return;
            }
        }
    }
}

/// Whether the key's row has an answer, a lapsed lease, an expired TTL or
/// is gone: anything a waiter should ask the key again about. An error
/// (the database out of reach) is "not yet".
async fn settled(pool: &deadpool_postgres::Pool, policy: Policy, (user_id, key): &KeyId) -> bool {
    let Ok(client) = pool.get().await else {
        return false;
    };
    match store::read(&client, policy, user_id, key).await {
        Ok(Some(row)) => row.response.is_some() || row.lease_over || row.expired,
        Ok(None) => true,
        Err(_) => false,
    }
}
