//! The atomic step of a claim: the work's writes and the key's new state
//! commit in one transaction, fenced by the claim token, or none of it does.
//!
//! A [`Unit`] is a transaction on the caller's connection. The caller makes
//! its effect through [`Unit::tx`], then records on the key either the answer
//! ([`Unit::store`]) or a link to an effect that is still settling
//! ([`Unit::link`]), and hands the resulting [`Fence`] to [`Unit::finish`]:
//! it commits while the claim holds and rolls everything back when another
//! request took the key over meanwhile. There is no other way to commit a
//! unit, so an effect never commits without its answer or its link.
//!
//! The key row is written last in each unit (the caller's rows first), the
//! order every other writer of these rows keeps too, so units never deadlock
//! with each other or with a takeover.

use deadpool_postgres::{GenericClient, Object, Transaction};

use crate::claim::{Claim, Done, Fence};
use crate::error::Error;
use crate::response::StoredResponse;

/// One transaction of a claim's work; see the module documentation.
pub struct Unit<'a> {
    tx: Transaction<'a>,
    claim: &'a Claim,
}

/// How a unit ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Committed {
    /// The effect and the key's new state are durable together.
    Done,
    /// The claim was lost; everything was rolled back.
    Fenced,
}

impl Committed {
    /// How the work of a claim whose unit stored `answer` ended, as it
    /// reports it to the engine.
    pub fn answered(self, answer: StoredResponse) -> Done {
        match self {
            Committed::Done => Done::Stored(answer),
            Committed::Fenced => Done::Fenced,
        }
    }
}

impl<'a> Unit<'a> {
    /// Opens a unit of `claim`'s work on `client`.
    pub async fn begin(claim: &'a Claim, client: &'a mut Object) -> Result<Self, Error> {
        Ok(Unit {
            tx: client.transaction().await?,
            claim,
        })
    }

    /// The transaction to make the effect in.
    pub fn tx(&self) -> &Transaction<'a> {
        &self.tx
    }

    /// Stores the intent's answer, if the claim still holds. It may be sent
    /// while the effect's statements are in flight on the same connection
    /// (`tokio::try_join!`): statements run in the order they were sent.
    pub async fn store(&self, response: &StoredResponse) -> Result<Fence, Error> {
        store_answer(&self.tx, self.claim, response).await
    }

    /// Links the effect this unit makes and that settles later (an order
    /// waiting for its payment), if the claim still holds and has none yet:
    /// a takeover then resumes this effect instead of making a second one.
    pub async fn link(&self, effect: &str) -> Result<Fence, Error> {
        let statement = self
            .tx
            .prepare_cached("SELECT idempotency_link($1, $2, $3, $4)")
            .await?;
        let row = self
            .tx
            .query_one(
                &statement,
                &[
                    &self.claim.user_id,
                    &self.claim.key.as_str(),
                    &self.claim.token,
                    &effect,
                ],
            )
            .await?;
        Ok(Fence::of(row.try_get(0)?))
    }

    /// Commits the unit while the claim holds; rolls it back otherwise.
    pub async fn finish(self, fence: Fence) -> Result<Committed, Error> {
        match fence {
            Fence::Held => {
                self.tx.commit().await?;
                Ok(Committed::Done)
            }
            Fence::Lost => {
                self.tx.rollback().await?;
                Ok(Committed::Fenced)
            }
        }
    }

    /// Abandons the unit: its effect could not be made (a refusal), so
    /// nothing of it is kept.
    pub async fn rollback(self) -> Result<(), Error> {
        Ok(self.tx.rollback().await?)
    }
}

/// Stores the outcome of a settled effect on the key that made it, if that
/// key still links the effect and has no answer yet: for whoever settles
/// an effect outside any claim (a reconciliation job), in its own
/// transaction with the settlement. False when there was nothing to store
/// on. The key forgets its link with the answer.
pub async fn store_for_effect(
    client: &impl GenericClient,
    user_id: &str,
    key: &str,
    effect: &str,
    response: &StoredResponse,
) -> Result<bool, Error> {
    write_answer(client, user_id, key, None, Some(effect), response).await
}

/// The answer's write, fenced by the claim token: in a unit, or on its own
/// for an answer that no effect stands behind (a refusal).
pub(crate) async fn store_answer(
    client: &impl GenericClient,
    claim: &Claim,
    response: &StoredResponse,
) -> Result<Fence, Error> {
    let stored = write_answer(
        client,
        &claim.user_id,
        claim.key.as_str(),
        Some(claim.token),
        None,
        response,
    )
    .await?;
    Ok(Fence::of(stored))
}

/// The one write of an answer, `idempotency_store`: fenced by the claim
/// token, or with none by the effect the key still links.
async fn write_answer(
    client: &impl GenericClient,
    user_id: &str,
    key: &str,
    token: Option<i64>,
    effect: Option<&str>,
    response: &StoredResponse,
) -> Result<bool, Error> {
    let statement = client
        .prepare_cached("SELECT idempotency_store($1, $2, $3, $4, $5, $6, $7, $8)")
        .await?;
    let row = client
        .query_one(
            &statement,
            &[
                &user_id,
                &key,
                &token,
                &(response.status as i16),
                &response.content_type,
                &response.location,
                &response.body,
                &effect,
            ],
        )
        .await?;
    Ok(row.try_get(0)?)
}
