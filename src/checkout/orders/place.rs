//! A claimed click on "pay": make the order (or resume the one an earlier
//! holder of the key made), charge it, settle it. Two units of the claim
//! (see `idempotency::Unit`), and Payrail between them with no transaction
//! and no connection held.

use deadpool_postgres::GenericClient;
use idempotency::{Claim, Committed, Done, Fence};
use time::OffsetDateTime;
use uuid::Uuid;

use super::{settle, NewOrder, Order, OrderStatus, Orders, CURRENCY};
use crate::checkout::CheckoutError;

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

    /// Makes the order in one unit of the claim, linked to its key (so that
    /// a takeover resumes it), all or nothing. `None` when the claim was
    /// lost meanwhile.
    async fn create(
        &self,
        claim: &Claim,
        request: &NewOrder,
    ) -> Result<Option<Order>, CheckoutError> {
        let order_id = Uuid::new_v4();
        let effect = order_id.to_string();
        let mut client = self.pool.get().await?;
        let unit = claim.unit(&mut client).await?;
        // The link goes first and the order right behind it, in one round
        // trip; the unit commits only if both stand.
        let (fence, order) = tokio::try_join!(
            async { unit.link(&effect).await.map_err(CheckoutError::from) },
            insert_pending(
                unit.tx(),
                order_id,
                &claim.user_id,
                claim.key.as_str(),
                request
            ),
        )?;
        let order = match (fence, order) {
            (Fence::Held, None) => {
                unit.rollback().await?;
                return Err(CheckoutError::HoldUnavailable);
            }
            (_, order) => order,
        };
        Ok(match unit.finish(fence).await? {
            Committed::Done => order,
            Committed::Fenced => None,
        })
    }
}

/// Claims the buyer's live holds (locked in id order) and writes the
/// `payment_pending` order for them, in one statement, all or nothing:
/// `None` when a hold is unknown, not the buyer's, expired or in another
/// order. `idempotency_key` is the click's, for reconciliation to find.
pub async fn insert_pending(
    client: &impl GenericClient,
    order_id: Uuid,
    user_id: &str,
    idempotency_key: &str,
    request: &NewOrder,
) -> Result<Option<Order>, CheckoutError> {
    let statement = client
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
    let row = client
        .query_one(
            &statement,
            &[
                &order_id,
                &request.hold_ids,
                &user_id,
                &idempotency_key,
                &CURRENCY,
                &request.payment_method.as_str(),
            ],
        )
        .await?;
    if !row.try_get::<_, bool>("all_held")? {
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
        created_at: crate::checkout::rfc3339(row.try_get::<_, OffsetDateTime>("created_at")?),
        payment_method: request.payment_method.clone(),
        user_id: user_id.to_owned(),
        idempotency_key: idempotency_key.to_owned(),
    }))
}
