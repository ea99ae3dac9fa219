//! A claimed click on "pay": make the order (or resume the one an earlier
//! holder of the key made), charge it, settle it. The order is the claim's
//! opening step (`idempotency::Opening`, `checkout_place_order` of
//! `migrations/functions/checkout.sql`): one call and one commit for the
//! key, the holds, the order and its link. Then Payrail, with no transaction and no connection
//! held, and the settlement, one call (`idempotency::Storing`). On Citus
//! the holds stay on the coordinator and the order and its key go to the
//! buyer's worker, with each commit on those two nodes alone.

use std::sync::LazyLock;

use idempotency::{Claim, Done, Fence, Opening, OpeningStep};
use time::OffsetDateTime;
use uuid::Uuid;

use super::{settle, NewOrder, Order, OrderStatus, Orders, CURRENCY};
use crate::checkout::CheckoutError;
use crate::payrail::PaymentError;

/// A click's order as asked, before its key is claimed: the order's id and
/// the call that makes it are chosen once, so that the claim's own call can
/// make the order, and so is whether Payrail is ready for it.
pub struct Click {
    order_id: Uuid,
    request: NewOrder,
    opening: Opening,
    /// Payrail's breaker, read once for the click: while it is open, no
    /// step writes anything (the key is released), and a retry of an
    /// answered click is still answered.
    ready: Result<(), PaymentError>,
}

impl Click {
    /// The step the claim of this click opens with: none while Payrail is
    /// not ready.
    pub fn opening(&self) -> Option<&Opening> {
        self.ready.is_ok().then_some(&self.opening)
    }
}

impl Orders {
    /// The click of `request`, with Payrail's readiness as of now.
    pub fn click(&self, request: NewOrder) -> Click {
        // $7 order_id, $8 hold_ids, $9 currency, $10 payment_method.
        static PLACE: LazyLock<OpeningStep> =
            LazyLock::new(|| OpeningStep::new("checkout_place_order", 4));
        let order_id = Uuid::new_v4();
        let opening = PLACE.with(vec![
            Box::new(order_id),
            Box::new(request.hold_ids.clone()),
            Box::new(CURRENCY),
            Box::new(request.payment_method.as_str().to_owned()),
        ]);
        Click {
            order_id,
            request,
            opening,
            ready: self.payrail.ready(),
        }
    }

    /// Does the work of a claimed `POST /orders`. A refusal (holds
    /// unavailable) comes back as an error that wrote nothing but the key;
    /// so does a failure to reach Payrail before the order exists.
    #[tracing::instrument(skip_all, fields(user_id = %claim.user_id, key = %claim.key))]
    pub async fn place(&self, claim: &Claim, click: &Click) -> Result<Done, CheckoutError> {
        let order = match &claim.effect {
            Some(effect) => self.resume(&claim.user_id, effect).await?,
            None => match self.create(claim, click).await? {
                Some(order) => order,
                None => return Ok(Done::Fenced),
            },
        };
        if order.status != OrderStatus::PaymentPending {
            // Settled already (by reconciliation, or by the holder this
            // claim took the key from): nothing left to make, and the order
            // keeps the reason of a decline.
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

    /// The order of the claim's opening step: the buyer's live holds locked
    /// in id order and claimed, the order written and linked to the key
    /// (so that a takeover resumes it), all or nothing, and nothing at all
    /// once the claim is lost. `None` when it was lost.
    #[tracing::instrument(name = "create order", skip_all)]
    async fn create(&self, claim: &Claim, click: &Click) -> Result<Option<Order>, CheckoutError> {
        let opened = match claim.opened() {
            Some(row) => row,
            None => {
                // Payrail was not ready for the click, or the claim was won
                // another way: fail before writing anything while Payrail
                // is known to be down. The key is then released and a
                // retry starts afresh.
                click.ready.clone()?;
                let client = self.pool.get().await?;
                match claim.open(&client, &click.opening).await? {
                    (Fence::Held, row) => row,
                    (Fence::Lost, _) => return Ok(None),
                }
            }
        };
        if !opened.try_get::<_, bool>("all_held")? {
            return Err(CheckoutError::HoldUnavailable);
        }
        let request = &click.request;
        Ok(Some(Order {
            order_id: click.order_id,
            status: OrderStatus::PaymentPending,
            amount_cents: opened.try_get("amount_cents")?,
            currency: CURRENCY.to_owned(),
            hold_ids: request.hold_ids.clone(),
            seats: opened.try_get("seats")?,
            charge_id: None,
            decline_code: None,
            created_at: crate::checkout::rfc3339(
                opened.try_get::<_, OffsetDateTime>("created_at")?,
            ),
            payment_method: request.payment_method.clone(),
            user_id: claim.user_id.clone(),
            idempotency_key: claim.key.as_str().to_owned(),
        }))
    }
}
