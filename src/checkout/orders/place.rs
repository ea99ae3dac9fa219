//! A claimed click on "pay": make the order (or resume the one an earlier
//! holder of the key made), charge it, settle it. Two units of the claim
//! (see `idempotency::Unit`), and Payrail between them with no transaction
//! and no connection held.

use idempotency::{Claim, Committed, Done};
use time::OffsetDateTime;
use uuid::Uuid;

use super::{settle, NewOrder, Order, OrderStatus, Orders, CURRENCY};
use crate::checkout::CheckoutError;
use crate::db::DbError;

impl Orders {
    /// Does the work of a claimed `POST /orders`. A refusal (holds
    /// unavailable, an invalid order) comes back as an error that wrote
    /// nothing; so does a failure to reach Payrail before the order exists.
    #[tracing::instrument(skip_all, fields(user_id = %claim.user_id, key = %claim.key))]
    pub async fn place(&self, claim: &Claim, request: &NewOrder) -> Result<Done, CheckoutError> {
        let order = match &claim.effect {
            Some(effect) => self.resume(effect).await?,
            None => {
                // Fail before writing anything while Payrail is known to be
                // down: the key is then released and a retry starts afresh.
                self.payrail.ready()?;
                match self.create(claim, request).await? {
                    Some(order) => order,
                    None => return Ok(Done::Fenced),
                }
            }
        };
        if order.status != OrderStatus::PaymentPending {
            // Settled already (by reconciliation): nothing left to make.
            return Ok(Done::Answer((self.answer)(&order)));
        }
        let outcome = self.payrail.charge(order.order_id, &order.charge()).await?;
        settle::claimed(self, order, &outcome, claim).await
    }

    /// The order a takeover inherits.
    async fn resume(&self, effect: &str) -> Result<Order, CheckoutError> {
        let order_id = Uuid::parse_str(effect).map_err(|_| {
            CheckoutError::Inconsistent(format!("a claimed key links {effect:?}, not an order"))
        })?;
        let client = self.pool.get().await?;
        super::load(&client, order_id).await?.ok_or_else(|| {
            CheckoutError::Inconsistent(format!("order {order_id} of a claimed key is missing"))
        })
    }

    /// Makes the order in one unit of the claim: the buyer's live holds are
    /// locked in id order and claimed, the order is written, and the key is
    /// linked to it (so that a takeover resumes it), all or nothing. `None`
    /// when the claim was lost meanwhile.
    async fn create(
        &self,
        claim: &Claim,
        request: &NewOrder,
    ) -> Result<Option<Order>, CheckoutError> {
        let order_id = Uuid::new_v4();
        let mut client = self.pool.get().await?;
        let unit = claim.unit(&mut client).await?;
        let statement = unit
            .tx()
            .prepare_cached(
                "WITH held AS (
                     SELECT h.hold_id, s.label, s.price_cents
                     FROM holds h JOIN seats s ON s.seat_id = h.seat_id
                     WHERE h.hold_id = ANY ($2) AND h.user_id = $3
                       AND h.order_id IS NULL AND h.expires_at > now()
                     ORDER BY h.hold_id
                     FOR UPDATE OF h
                 ), decision AS (
                     SELECT (SELECT count(*) FROM held) = cardinality($2::bigint[]) AS all_held
                 ), claimed AS (
                     UPDATE holds SET order_id = $1
                     WHERE hold_id IN (SELECT hold_id FROM held)
                       AND (SELECT all_held FROM decision)
                 ), inserted AS (
                     INSERT INTO orders (order_id, user_id, status, amount_cents, currency,
                                         payment_method, hold_ids, seats, idempotency_key)
                     SELECT $1, $3, 'payment_pending', sum(price_cents)::bigint, $5, $6, $2,
                            array_agg(label ORDER BY array_position($2, hold_id)), $4
                     FROM held
                     HAVING (SELECT all_held FROM decision)
                     RETURNING created_at, amount_cents, seats
                 )
                 SELECT d.all_held, i.created_at, i.amount_cents, i.seats
                 FROM decision d LEFT JOIN inserted i ON true",
            )
            .await?;
        let effect = order_id.to_string();
        // The link goes first and the order right behind it, in one round
        // trip; the unit commits only if both stand.
        let (fence, row) = tokio::try_join!(
            async { unit.link(&effect).await.map_err(CheckoutError::from) },
            async {
                unit.tx()
                    .query_one(
                        &statement,
                        &[
                            &order_id,
                            &request.hold_ids,
                            &claim.user_id,
                            &claim.key.as_str(),
                            &CURRENCY,
                            &request.payment_method.as_str(),
                        ],
                    )
                    .await
                    .map_err(CheckoutError::from)
            },
        )?;
        if fence == idempotency::Fence::Held && !row.try_get::<_, bool>("all_held")? {
            unit.rollback().await?;
            return Err(CheckoutError::HoldUnavailable);
        }
        if unit.finish(fence).await? == Committed::Fenced {
            return Ok(None);
        }
        Ok(Some(Order {
            order_id,
            status: OrderStatus::PaymentPending,
            amount_cents: row.try_get("amount_cents")?,
            currency: CURRENCY.to_owned(),
            hold_ids: request.hold_ids.clone(),
            seats: row.try_get("seats")?,
            charge_id: None,
            created_at: crate::checkout::rfc3339(
                row.try_get::<_, OffsetDateTime>("created_at")
                    .map_err(DbError::from)?,
            ),
            payment_method: request.payment_method.clone(),
            user_id: claim.user_id.clone(),
            idempotency_key: claim.key.as_str().to_owned(),
        }))
    }
}
