//! The right to do one intent's work (a [`Claim`], won under a key's
//! [`Policy`]), and how the work reports its end ([`Done`]).

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::Row;

use crate::fingerprint::RequestHash;
use crate::key::IdempotencyKey;
use crate::response::StoredResponse;

/// Lifetimes of a key: how long it means the same intent, and how long an
/// in-progress claim belongs to its request before another may take it over.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    pub ttl: Duration,
    pub lease: Duration,
}

/// The right to do the work of one intent, until the lease runs out.
#[derive(Debug, Clone)]
pub struct Claim {
    /// The scope the key belongs to (the buyer, the tenant): two scopes never
    /// share a key.
    pub user_id: String,
    pub key: IdempotencyKey,
    /// Fences every write after the claim: 62 random bits, new per claim.
    pub token: i64,
    /// The effect an earlier holder of this key linked and that is still
    /// settling, when this claim is a takeover: resume it, never make another.
    pub effect: Option<String>,
    pub kind: ClaimKind,
    /// The engine's policy: its lease and TTL are the arguments of the
    /// claim's [`Opening`].
    pub(crate) policy: Policy,
    pub(crate) hash: RequestHash,
    /// The row of the [`Opening`] that the claim's own call ran, when it
    /// did (see [`Claim::open`]).
    pub(crate) opened: Option<Arc<Row>>,
}

/// How a claim was won.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimKind {
    /// The key was new.
    First,
    /// The key was past its TTL: a new intent under an old key.
    Expired,
    /// The key was in progress past its lease: this claim finishes the intent.
    Abandoned,
}

impl ClaimKind {
    /// A new intent, which the scope's limit counts; a takeover of an
    /// abandoned claim finishes one.
    pub(crate) fn starts_intent(self) -> bool {
        self != ClaimKind::Abandoned
    }
}

/// How the work of a claim ended, as the work reports it.
#[derive(Debug)]
pub enum Done {
    /// The work's effect and this answer are durable together: committed by
    /// the work ([`Unit::store`](crate::Unit::store), then `finish`), or by
    /// whoever settled the effect the claim linked
    /// ([`store_for_effect`](crate::store_for_effect)) while the work waited.
    Stored(StoredResponse),
    /// An answer that no durable effect stands behind (a refusal made before
    /// anything was written): the engine stores it.
    Answer(StoredResponse),
    /// The claim was lost to a takeover before the answer could be stored.
    Fenced,
}
