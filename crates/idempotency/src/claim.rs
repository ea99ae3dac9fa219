//! The right to do one intent's work (a [`Claim`], won under a key's
//! [`Policy`]), its steps of one call ([`Claim::open`],
//! [`Claim::store_with`]) with the proof that it still held ([`Fence`]),
//! and how the work reports its end ([`Done`]).

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::GenericClient;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use crate::error::Error;
use crate::fingerprint::RequestHash;
use crate::key::IdempotencyKey;
use crate::response::StoredResponse;
use crate::statement::{Opening, Storing, ANSWER_PARAMS};

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
    /// ([`store_for_effect`](crate::store_for_effect)) while the work waited
    /// and this claim held the key.
    Stored(StoredResponse),
    /// An answer the engine stores while the claim holds: one that no
    /// durable effect stands behind (a refusal made before anything was
    /// written), or that of an effect someone else settled, made from it as
    /// it stands. A claim lost meanwhile gets what the key says now.
    Answer(StoredResponse),
    /// The claim was lost to a takeover before the answer could be stored.
    Fenced,
}

/// Whether the claim still held when the key was written: the proof that
/// [`Unit::finish`] needs. Dropping it unused rolls the unit back on drop.
#[must_use = "a unit commits only through Unit::finish"]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fence {
    Held,
    /// Another request took the key over; nothing of this unit may commit.
    Lost,
}

impl Fence {
    /// What a fenced write of the key row that `held` (or not) proves.
    pub(crate) fn of(held: bool) -> Self {
        if held {
            Fence::Held
        } else {
            Fence::Lost
        }
    }
}

impl Claim {
    /// The row of the [`Opening`] that the claim's own call ran, if it did.
    pub fn opened(&self) -> Option<Arc<Row>> {
        self.opened.clone()
    }

    /// Runs `opening` for a claim whose own call did not (a key past its
    /// TTL, a takeover before any link, no opening at the claim):
    /// `Fence::Lost` when the claim was lost, and nothing was written.
    pub async fn open(
        &self,
        client: &impl GenericClient,
        opening: &Opening,
    ) -> Result<(Fence, Arc<Row>), Error> {
        let row = opening
            .run(
                client,
                [
                    &self.user_id,
                    &self.key.as_str(),
                    &self.hash.as_bytes(),
                    &self.token,
                    &self.policy.lease.as_secs_f64(),
                    &self.policy.ttl.as_secs_f64(),
                ],
            )
            .await?;
        Ok((Fence::of(row.try_get("won")?), Arc::new(row)))
    }

    /// Runs a [`Storing`] step outside any transaction: the outcome and the
    /// answer commit together (the answer only while the claim holds).
    pub async fn store_with(
        &self,
        client: &impl GenericClient,
        step: &Storing,
        answer: &StoredResponse,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<(Fence, Row), Error> {
        let status = answer.status as i16;
        let ours: [&(dyn ToSql + Sync); ANSWER_PARAMS] = [
            &self.user_id,
            &self.key.as_str(),
            &self.token,
            &status,
            &answer.content_type,
            &answer.location,
            &answer.body,
        ];
        let statement = client.prepare_cached(step.0).await?;
        let params: Vec<&(dyn ToSql + Sync)> = ours.iter().chain(params).copied().collect();
        let row = client.query_one(&statement, &params).await?;
        Ok((Fence::of(row.try_get("held")?), row))
    }
}
