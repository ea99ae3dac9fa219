//! A click on "pay", once its key is claimed, read top to bottom: make the
//! order (or resume the one an earlier holder of the key made), charge it,
//! settle it, answer. The click's SQL is two calls of
//! `migrations/functions/checkout.sql`: the order is the claim's opening
//! step (`checkout_place_order`, `idempotency::Opening`: one call and one
//! commit for the key, the holds, the order and its link), and the
//! settlement stores the answer with it (`checkout_settle_claimed`,
//! `idempotency::Storing`). Payrail is called between them, with no
//! transaction and no connection held. The answer is made here, from the
//! order (`answer`), so that it is stored in the settlement's own call. On
//! Citus both calls go to the buyer's worker, and the holds' statements on
//! to the event's, with each commit on those two workers alone.

use idempotency::{Claim, Done, Fence, Opening, StoredResponse, Storing};
use time::OffsetDateTime;
use uuid::Uuid;

use super::outcome::{counted, decision};
use super::{load, NewOrder, Order, OrderStatus, Orders, CURRENCY};
use crate::checkout::CheckoutError;
use crate::payrail::{ChargeOutcome, PaymentError};
use crate::problem::Problem;

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
    /// The click of `request`, with Payrail's readiness as of now.
    pub fn new(orders: &Orders, request: NewOrder) -> Self {
        // The claim's $1-$6, then $7 order_id, $8 hold_ids, $9 currency,
        // $10 payment_method; the claim's columns, then the order's (the
        // claim is not sent twice: a lost claim's row carries its answer).
        const PLACE: &str = "SELECT (step.claim).*, step.all_held, step.created_at,
                                    step.amount_cents, step.seats
            FROM checkout_place_order($1, $2, $3, $4, $5, $6, $7, $8, $9, $10) AS step";
        let order_id = Uuid::new_v4();
        let opening = Opening::new(
            PLACE,
            vec![
                Box::new(order_id),
                Box::new(request.hold_ids.clone()),
                Box::new(CURRENCY),
                Box::new(request.payment_method.as_str().to_owned()),
            ],
        );
        Self {
            order_id,
            request,
            opening,
            ready: orders.payrail.ready(),
        }
    }

    /// The step the claim of this click opens with: none while Payrail is
    /// not ready.
    pub fn opening(&self) -> Option<&Opening> {
        self.ready.is_ok().then_some(&self.opening)
    }
}

/// Does the work of a claimed `POST /orders`. A refusal (holds
/// unavailable) comes back as an error that wrote nothing but the key; so
/// does a failure to reach Payrail before the order exists.
#[tracing::instrument(skip_all, fields(user_id = %claim.user_id, key = %claim.key))]
pub async fn place(orders: &Orders, claim: &Claim, click: &Click) -> Result<Done, CheckoutError> {
    let order = match &claim.effect {
        Some(effect) => resume(orders, &claim.user_id, effect).await?,
        None => match make(orders, claim, click).await? {
            Some(order) => order,
            None => return Ok(Done::Fenced),
        },
    };
    if order.status != OrderStatus::PaymentPending {
        // Settled already (by reconciliation, or by the holder this claim
        // took the key from): nothing left to make, and the order keeps the
        // reason of a decline.
        return Ok(Done::Answer(answer(&order)));
    }
    let outcome = orders
        .payrail
        .charge(&order.user_id, order.order_id, &order.charge())
        .await?;
    settle(orders, order, &outcome, claim).await
}

/// The order of the claim's opening step: the buyer's live holds locked in
/// id order and claimed, the order written and linked to the key (so that
/// a takeover resumes it), all or nothing, and nothing at all once the
/// claim is lost. `None` when it was lost.
#[tracing::instrument(name = "create order", skip_all)]
async fn make(
    orders: &Orders,
    claim: &Claim,
    click: &Click,
) -> Result<Option<Order>, CheckoutError> {
    let opened = match claim.opened() {
        Some(row) => row,
        None => {
            // Payrail was not ready for the click, or the claim was won
            // another way: fail before writing anything while Payrail is
            // known to be down. The key is then released and a retry
            // starts afresh.
            click.ready.clone()?;
            let client = orders.pool(&claim.user_id).get().await?;
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
        created_at: crate::checkout::rfc3339(opened.try_get::<_, OffsetDateTime>("created_at")?),
        payment_method: request.payment_method.clone(),
        user_id: claim.user_id.clone(),
        idempotency_key: claim.key.as_str().to_owned(),
    }))
}

/// The order a takeover inherits.
async fn resume(orders: &Orders, user_id: &str, effect: &str) -> Result<Order, CheckoutError> {
    let order_id = Uuid::parse_str(effect).map_err(|_| {
        CheckoutError::Inconsistent(format!("a claimed key links {effect:?}, not an order"))
    })?;
    let client = orders.pool(user_id).get().await?;
    load(&client, user_id, order_id).await?.ok_or_else(|| {
        CheckoutError::Inconsistent(format!("order {order_id} of a claimed key is missing"))
    })
}

/// The usual end of a click, in one call (one round trip, one commit): the
/// settlement, and the answer, made from the order in hand, stored on the
/// claimed key while the claim holds. The order row is locked first and
/// the key row last. A claim lost meanwhile stores nothing but leaves the
/// order settled with Payrail's answer, as reconciliation would; whoever
/// holds the key now answers from it. An order someone else settled first
/// is answered from the order as it stands (which keeps the decline's
/// reason), the same bytes whoever makes them: when its answer was stored
/// on this key while this claim held it (Payrail's event, often ahead of
/// Payrail's own answer, or reconciliation), that is still this request's
/// first answer, not a replay; otherwise (a holder this claim took the key
/// from, or a taker that took it from this one, settled it) it is stored
/// like any answer, fenced by the claim, and a request that lost the key
/// gets the taker's answer as a replay: one click, one first answer.
#[tracing::instrument(name = "settle order", skip_all)]
async fn settle(
    orders: &Orders,
    mut order: Order,
    outcome: &ChargeOutcome,
    claim: &Claim,
) -> Result<Done, CheckoutError> {
    // $1-$7 are the engine's, then the order's id, its new status,
    // Payrail's charge id and decline code.
    const SETTLE: Storing = Storing::new(
        "SELECT * FROM checkout_settle_claimed($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
    );
    let (status, charge_id, decline_code) = decision(outcome);
    order.status = status;
    order.charge_id = charge_id.cloned();
    order.decline_code = decline_code;
    let answered = answer(&order);
    let client = orders.pool(&claim.user_id).get().await?;
    let (fence, row) = claim
        .store_with(
            &client,
            &SETTLE,
            &answered,
            &[&order.order_id, &status, &charge_id, &order.decline_code],
        )
        .await?;
    if !row.try_get::<_, bool>("settled")? {
        let settled = load(&client, &claim.user_id, order.order_id)
            .await?
            .ok_or_else(|| {
                CheckoutError::Inconsistent(format!(
                    "order {} vanished while settling",
                    order.order_id
                ))
            })?;
        if settled.status == OrderStatus::PaymentPending {
            // Being canceled: its answer is stored when Payrail confirms.
            return Err(CheckoutError::Canceling);
        }
        let answered = answer(&settled);
        return Ok(match fence {
            Fence::Held => Done::Stored(answered),
            Fence::Lost => Done::Answer(answered),
        });
    }
    counted(&order);
    Ok(match fence {
        Fence::Held => Done::Stored(answered),
        Fence::Lost => Done::Fenced,
    })
}

/// How an order is answered to the click that made it, once it has an
/// outcome: 201 with the order and its `Location`, 402 `payment-declined`
/// (with Payrail's reason when it was heard), or 402 `payment-failed` for
/// an order Payrail never decided. Made from the order alone, so that
/// whoever makes it again (a takeover, reconciliation, Payrail's event)
/// makes the same bytes.
pub fn answer(order: &Order) -> StoredResponse {
    let order_id = order.order_id;
    match order.status {
        OrderStatus::Declined => {
            return Problem::PaymentDeclined {
                order_id,
                decline_code: order.decline_code,
            }
            .to_response();
        }
        OrderStatus::Failed => return Problem::PaymentFailed { order_id }.to_response(),
        OrderStatus::PaymentPending | OrderStatus::Paid => {}
    }
    // Serializing an order (numbers, strings, a uuid) cannot fail.
    StoredResponse::new(
        201,
        "application/json",
        serde_json::to_vec(order).unwrap_or_default(),
    )
    .with_location(format!("/orders/{}", order.order_id))
}
