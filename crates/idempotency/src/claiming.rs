//! The keys this process is claiming right now. A claim that opens its
//! step ([`Opening`](crate::Opening)) commits with the step's writes, so
//! until then a copy of the request that tries the same insert waits on the
//! key's unique index, holding a connection and a backend for the whole
//! step. A copy that finds its key here instead is answered as in progress
//! at once, without a statement: which it is (nobody has answered yet), and
//! what the database would have told it had the claim committed first. A
//! copy that waits (`Prefer: wait`) waits as for any claim in progress.
//!
//! Only the same request counts: a different request with the key is
//! asked of the database, which answers it `KeyReused` once the claim is in.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use crate::{IdempotencyKey, RequestHash};

#[derive(Clone, Default)]
pub(crate) struct Claiming(Arc<Mutex<HashMap<(String, String), RequestHash>>>);

impl Claiming {
    /// Whether a request of this process is claiming the key for `hash`.
    pub(crate) fn holds(&self, user_id: &str, key: &IdempotencyKey, hash: &RequestHash) -> bool {
        let keys = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        keys.get(&(user_id.to_owned(), key.as_str().to_owned())) == Some(hash)
    }

    /// Marks the key as being claimed for `hash` until the guard drops
    /// (also when the request is cancelled mid-statement). A key already
    /// marked stays its first claimant's.
    pub(crate) fn mark(&self, user_id: &str, key: &IdempotencyKey, hash: &RequestHash) -> Mark {
        let id = (user_id.to_owned(), key.as_str().to_owned());
        let mut keys = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let ours = !keys.contains_key(&id);
        if ours {
            keys.insert(id.clone(), *hash);
        }
        Mark {
            claiming: self.clone(),
            id: ours.then_some(id),
        }
    }
}

/// A key marked as being claimed; unmarked on drop.
pub(crate) struct Mark {
    claiming: Claiming,
    id: Option<(String, String)>,
}

impl Drop for Mark {
    fn drop(&mut self) {
        if let Some(id) = self.id.take() {
            let mut keys = self
                .claiming
                .0
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            keys.remove(&id);
        }
    }
}
