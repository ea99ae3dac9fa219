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

use std::sync::LazyLock;

use deadpool_postgres::{GenericClient, Object, Transaction};
use tokio_postgres::types::ToSql;

use crate::claim::{Claim, Done};
use crate::{Error, Settling, StoredResponse};

/// One transaction of a claim's work; see the module documentation.
pub struct Unit<'a> {
    tx: Transaction<'a>,
    claim: &'a Claim,
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

impl Claim {
    /// Opens a unit of this claim's work on `client`.
    pub async fn unit<'a>(&'a self, client: &'a mut Object) -> Result<Unit<'a>, Error> {
        Ok(Unit {
            tx: client.transaction().await?,
            claim: self,
        })
    }
}

impl<'a> Unit<'a> {
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
            .prepare_cached(
                "UPDATE idempotency_keys SET effect = $4
                 WHERE user_id = $1 AND key = $2 AND claim_token = $3
                   AND response_status IS NULL AND effect IS NULL",
            )
            .await?;
        let linked = self
            .tx
            .execute(
                &statement,
                &[
                    &self.claim.user_id,
                    &self.claim.key.as_str(),
                    &self.claim.token,
                    &effect,
                ],
            )
            .await?;
        Ok(if linked == 1 {
            Fence::Held
        } else {
            Fence::Lost
        })
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
/// key still belongs to the same intent and has no answer yet: for whoever
/// settles an effect outside any claim (a reconciliation job), in its own
/// transaction with the settlement. False when there was nothing to store on.
///
/// The key forgets its link with the answer, unless `settling` (evaluated
/// in the statement, so after the settlement written before it in the same
/// transaction) says the effect is still settling: an answer given before
/// its effect settled (a 202) keeps the key from a purge until it has.
pub async fn store_for_effect(
    client: &impl GenericClient,
    settling: Settling,
    user_id: &str,
    key: &str,
    effect: &str,
    response: &StoredResponse,
) -> Result<bool, Error> {
    let sql = format!(
        "UPDATE idempotency_keys AS k
         SET {SET_ANSWER}, effect = CASE WHEN {} THEN k.effect END
         WHERE k.user_id = $1 AND k.key = $2 AND k.effect = $3 AND k.response_status IS NULL",
        settling.of_one_key()
    );
    let stored = write_answer(client, &sql, user_id, key, &effect, response).await?;
    Ok(stored == 1)
}

/// The answer's write, fenced by the claim token: in a unit, or on its own
/// for an answer that no effect stands behind (a refusal).
pub(crate) async fn store_answer(
    client: &impl GenericClient,
    claim: &Claim,
    response: &StoredResponse,
) -> Result<Fence, Error> {
    static SQL: LazyLock<String> = LazyLock::new(|| {
        format!(
            "UPDATE idempotency_keys SET {SET_ANSWER}, effect = NULL
             WHERE user_id = $1 AND key = $2 AND claim_token = $3 AND response_status IS NULL"
        )
    });
    let stored = write_answer(
        client,
        &SQL,
        &claim.user_id,
        claim.key.as_str(),
        &claim.token,
        response,
    )
    .await?;
    Ok(if stored == 1 {
        Fence::Held
    } else {
        Fence::Lost
    })
}

/// How every write of an answer sets the key row's columns: $4 status, $5
/// content type, $6 location, $7 body (`write_answer` binds them).
/// An answered key is never taken over, fenced or resumed again, so its
/// claim (the token and the lease) goes with the write, and so does the
/// link to an effect that has settled (each write says when it has): with
/// them goes a tenth of the row.
const SET_ANSWER: &str = "response_status = $4, response_content_type = $5, \
                                     response_location = $6, response_body = $7, \
                                     claim_token = NULL, lease_expires_at = NULL";

/// Runs one of the two answer writes above; `fence` is what its condition
/// names besides the key (the claim token, or the effect).
async fn write_answer(
    client: &impl GenericClient,
    sql: &str,
    user_id: &str,
    key: &str,
    fence: &(dyn ToSql + Sync),
    response: &StoredResponse,
) -> Result<u64, Error> {
    let statement = client.prepare_cached(sql).await?;
    Ok(client
        .execute(
            &statement,
            &[
                &user_id,
                &key,
                fence,
                &(response.status as i16),
                &response.content_type,
                &response.location,
                &response.body,
            ],
        )
        .await?)
}
