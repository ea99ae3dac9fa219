//! Copies of one request in one process share the key's statement. The
//! first copy to ask leads: it runs the claim (or, turned away by the gate,
//! the read) as any request would. A copy that arrives while it runs
//! follows: it sends no statement and takes what the leader learned, a
//! replay of the stored answer, or, when the leader found the key in
//! progress or claimed it, in progress. What the leader could not settle
//! for its copies (a limit, an error, a cancelled request) sends each
//! follower to the database on its own.
//!
//! A claim that opens its step ([`Opening`](crate::Opening)) commits with
//! the step's writes, so a copy that sent the same insert meanwhile would
//! wait on the key's unique index, holding a pooled connection and a
//! backend for the whole step: a storm of copies holds the pool. Replays of
//! one key without the answer cache share a statement the same way.
//!
//! Only the same request counts (same scope, key and request hash): a
//! different request with the key asks the database, which answers it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use tokio::sync::watch;

use crate::store::Begin;
use crate::fingerprint::RequestHash;
use crate::key::IdempotencyKey;
use crate::response::StoredResponse;

/// A key as `(user_id, key)`.
type KeyId = (String, String);

/// The keys whose statement a request of this process is running, each
/// with its request hash and the channel its leader tells its followers on.
#[derive(Clone, Default)]
pub(crate) struct Claiming(Arc<Mutex<HashMap<KeyId, Flight>>>);

type Flight = (RequestHash, watch::Receiver<Told>);

/// What a leader tells the copies that followed it.
#[derive(Clone)]
enum Told {
    Nothing,
    Replay(StoredResponse),
    InProgress,
}

/// How a request takes part in its key's statement.
pub(crate) enum Join {
    /// It runs the statement, and tells its followers what it learned.
    Lead(Lead),
    /// A copy runs it: what that copy learned, when it settles this one.
    Follow(Option<Begin>),
}

impl Claiming {
    pub(crate) async fn join(
        &self,
        user_id: &str,
        key: &IdempotencyKey,
        hash: &RequestHash,
    ) -> Join {
        let id = (user_id.to_owned(), key.as_str().to_owned());
        let mut told = {
            let mut keys = self.0.lock().unwrap_or_else(PoisonError::into_inner);
            match keys.get(&id) {
                Some((led, told)) if led == hash => told.clone(),
                // Another request with the key: it asks the database itself.
                Some(_) => return Join::Follow(None),
                None => {
                    let (sender, told) = watch::channel(Told::Nothing);
                    keys.insert(id.clone(), (*hash, told));
                    return Join::Lead(Lead {
                        claiming: self.clone(),
                        id,
                        sender,
                    });
                }
            }
        };
        // Ends when the leader tells, or drops its sender untold.
        let _ = told.changed().await;
        let begun = match &*told.borrow() {
            Told::Nothing => None,
            Told::Replay(response) => Some(Begin::Replay(response.clone())),
            Told::InProgress => Some(Begin::InProgress),
        };
        Join::Follow(begun)
    }
}

/// The request that runs its key's statement for its copies; the key is
/// free again when it drops.
pub(crate) struct Lead {
    claiming: Claiming,
    id: KeyId,
    sender: watch::Sender<Told>,
}

impl Lead {
    /// Tells the followers what the statement said: a replay, or in
    /// progress for a key in progress or claimed by this leader. A limit
    /// or a refusal says nothing for them.
    pub(crate) fn tell(&self, begun: &Begin) {
        let told = match begun {
            Begin::Replay(response) => Told::Replay(response.clone()),
            Begin::InProgress | Begin::Claimed(_) => Told::InProgress,
            Begin::KeyReused | Begin::Limited(_) => return,
        };
        self.sender.send_replace(told);
    }
}

impl Drop for Lead {
    fn drop(&mut self) {
        // Only the leader that put the key there takes it out.
        let mut keys = self
            .claiming
            .0
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        keys.remove(&self.id);
    }
}
