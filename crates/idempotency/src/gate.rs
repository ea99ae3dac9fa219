//! The optional Redis gate in front of the key table:
//! `SET idem:{user_id}:{key} <claim token> NX EX <lease_secs>` lets one
//! request at a time try to claim a key, so duplicates of a click in flight
//! are turned away with a read instead of a write to PostgreSQL. The lock
//! lives while its claim is in flight and is deleted when it ends, by the
//! claim that set it only: the delete compares the token first (one Lua
//! script), so a request that lost its claim never opens the gate of the
//! request that took the key over. The table still
//! decides and still stores every answer, so a lock that expires early can never cause a
//! finished request to run again. If Redis is unreachable the gate opens and
//! the table alone decides.

use std::time::Duration;

use redis::aio::ConnectionManager;

use crate::error::Error;
use crate::key::IdempotencyKey;

#[derive(Clone)]
pub enum Gate {
    /// The table alone (the default).
    Table,
    Redis(ConnectionManager),
}

impl Gate {
    /// A gate on the Redis server at `url` (`redis://host:port`).
    pub async fn redis(url: &str) -> Result<Self, Error> {
        let client = redis::Client::open(url)?;
        Ok(Gate::Redis(ConnectionManager::new(client).await?))
    }

    /// True when this request may try to claim the key in the table; false
    /// when another request holds the gate and this one should only read.
    /// The lock, if taken, holds `token`, the claim's.
    pub async fn enter(
        &self,
        user_id: &str,
        key: &IdempotencyKey,
        token: i64,
        lease: Duration,
    ) -> bool {
        let Gate::Redis(connection) = self else {
            return true;
        };
        let set: Result<Option<String>, _> = redis::cmd("SET")
            .arg(lock_name(user_id, key))
            .arg(token)
            .arg("NX")
            .arg("EX")
            .arg(lease.as_secs().max(1))
            .query_async(&mut connection.clone())
            .await;
        match set {
            Ok(reply) => reply.is_some(),
            Err(error) => {
                tracing::warn!(%error, "redis gate unavailable; the table decides alone");
                true
            }
        }
    }

    /// Opens the gate once the claim behind it is over (answered, stored or
    /// given back), so that retries need not wait for the lock to expire;
    /// only while the lock still holds `token`, the claim's.
    pub async fn leave(&self, user_id: &str, key: &IdempotencyKey, token: i64) {
        if let Gate::Redis(connection) = self {
            let deleted: Result<i64, _> = redis::cmd("EVAL")
                .arg(DELETE_IF_HELD)
                .arg(1)
                .arg(lock_name(user_id, key))
                .arg(token)
                .query_async(&mut connection.clone())
                .await;
            if let Err(error) = deleted {
                tracing::warn!(%error, "could not open the redis gate");
            }
        }
    }
}

/// Compare-and-delete: one script, so nothing runs between the read and the
/// delete. Redis caches it by its hash after the first call.
const DELETE_IF_HELD: &str = "if redis.call('GET', KEYS[1]) == ARGV[1] then \
                              return redis.call('DEL', KEYS[1]) else return 0 end";

/// `idem:{user_id}:{key}`, with `%` and `:` of the buyer's id escaped: a
/// buyer id may hold a `:` (an identity provider's subject), and `a:b` +
/// `c` must not share a lock with `a` + `b:c`.
fn lock_name(user_id: &str, key: &IdempotencyKey) -> String {
    let user_id = user_id.replace('%', "%25").replace(':', "%3A");
    format!("idem:{user_id}:{key}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(raw: &str) -> IdempotencyKey {
        IdempotencyKey::parse(raw.as_bytes()).unwrap()
    }

    #[test]
    fn two_buyers_never_share_a_lock() {
        assert_eq!(lock_name("alice", &key("k-1")), "idem:alice:k-1");
        assert_ne!(lock_name("a:b", &key("c")), lock_name("a", &key("b:c")));
        assert_ne!(lock_name("a%3Ab", &key("c")), lock_name("a:b", &key("c")));
    }
}
