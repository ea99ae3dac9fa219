//! A claimed click on "pay": make the order (or resume the one an earlier
//! holder of the key made), charge it, settle it. Two one-call units of
//! the claim (`idempotency::Linking`, then `Storing`), and Payrail between
//! them with no transaction and no connection held. Each unit is one
//! statement on one PostgreSQL, and a call of a function of
//! `migrations/V7` on Citus (`idempotency::Layout`): there the holds stay
//! on the coordinator and the order and its key go to the buyer's worker,
//! with the commit on those two nodes alone.

use std::sync::LazyLock;

use idempotency::{Claim, Done, Fence, Linking};
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
            Some(effect) => self.resume(&claim.user_id, effect).await?,
            None => {
                // Fail before writing anything while Payrail is known to be
                // down: the key is then released and a retry starts afresh.
                self.payrail.ready(&claim.user_id)?;
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
        let outcome = self
            .payrail
            .charge(&order.user_id, order.order_id, &order.charge())
            .await?;
        settle::claimed(self, order, &outcome, claim).await
    }

    /// The order a takeover inherits.
    async fn resume(&self, user_id: &str, effect: &str) -> Result<Order, CheckoutError> {
        let order_id = Uuid::parse_str(effect).map_err(|_| {
            CheckoutError::Inconsistent(format!("a claimed key links {effect:?}, not an order"))
        })?;
        let client = self.pool.get().await?;
        super::load(&client, user_id, order_id)
            .await?
            .ok_or_else(|| {
                CheckoutError::Inconsistent(format!("order {order_id} of a claimed key is missing"))
            })
    }

    /// Makes the order in one call that also links it to the claimed
    /// key (so that a takeover resumes it): the buyer's live holds locked in
    /// id order and claimed, the order written, all or nothing, and nothing
    /// at all once the claim is lost. `None` when it was lost.
    #[tracing::instrument(name = "create order", skip_all)]
    async fn create(
        &self,
        claim: &Claim,
        request: &NewOrder,
    ) -> Result<Option<Order>, CheckoutError> {
        // $1 user_id and $2 key are the engine's (Linking); ours start at $5:
        // $5 order_id, $6 hold_ids, $7 currency, $8 payment_method.
        static CREATE: LazyLock<Linking> = LazyLock::new(|| {
            Linking::new(
                "held AS (
                     SELECT h.hold_id, s.label, s.price_cents
                     FROM holds h JOIN seats s ON s.seat_id = h.seat_id
                     WHERE h.hold_id = ANY ($6) AND h.user_id = $1
                       AND h.order_id IS NULL AND h.expires_at > now()
                     ORDER BY h.hold_id
                     FOR UPDATE OF h
                 ), decision AS (
                     SELECT EXISTS (SELECT 1 FROM claim)
                            AND (SELECT count(*) FROM held) = cardinality($6::bigint[]) AS go,
                            (SELECT count(*) FROM held) = cardinality($6::bigint[]) AS all_held
                 ), claimed AS (
                     UPDATE holds SET order_id = $5
                     WHERE hold_id IN (SELECT hold_id FROM held) AND (SELECT go FROM decision)
                 ), inserted AS (
                     INSERT INTO orders (order_id, user_id, status, amount_cents, currency,
                                         payment_method, hold_ids, seats, idempotency_key)
                     SELECT $5, $1, 'payment_pending', sum(price_cents)::bigint, $7, $8, $6,
                            array_agg(label ORDER BY array_position($6, hold_id)), $2
                     FROM held
                     HAVING (SELECT go FROM decision)
                     RETURNING created_at, amount_cents, seats
                 )",
                "(SELECT all_held FROM decision)",
                "d.all_held, i.created_at, i.amount_cents, i.seats
                 FROM decision d LEFT JOIN inserted i ON true",
            )
            .distributed_as("checkout_place_order", 4)
        });
        let order_id = Uuid::new_v4();
        let client = self.pool.get().await?;
        let (fence, row) = claim
            .link_with(
                &client,
                &CREATE,
                &order_id.to_string(),
                &[
                    &order_id,
                    &request.hold_ids,
                    &CURRENCY,
                    &request.payment_method.as_str(),
                ],
            )
            .await?;
        if fence == Fence::Lost {
            return Ok(None);
        }
        if !row.try_get::<_, bool>("all_held")? {
            return Err(CheckoutError::HoldUnavailable);
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
            user_id: claim.user_id.clone(),
            idempotency_key: claim.key.as_str().to_owned(),
        }))
    }
}
