//! Payrail's events, applied: a verified `charge.succeeded` /
//! `charge.declined` settles the order it names exactly as reconciliation
//! would (`settle_unclaimed`: the order, its holds, its click's answer, in
//! one transaction), so an event and the service's own answer can race
//! without double-settling: whichever comes second finds the order settled.
//! Deduplication by event id is the caller's (the idempotency engine).

use uuid::Uuid;

use super::settle::{self, Settlement};
use super::{by_id, load, Order, OrderStatus, Orders};
use crate::checkout::CheckoutError;
use crate::observe::labels;
use crate::payrail::{ChargeOutcome, Event};

labels! {
    /// What became of one event: the answer to Payrail, and what the events
    /// metric counts.
    #[label = "result"]
    pub enum EventResult {
        /// It settled its order.
        Applied = "applied",
        /// Its order was settled already, in agreement with it.
        AlreadySettled = "already_settled",
        /// The same event again (the engine's replay); nothing changed.
        Duplicate = "duplicate",
        /// No order of ours, or a type we do not act on.
        Unknown = "unknown",
        /// Its charge contradicts how the order was settled; nothing changed.
        Contradicting = "contradicting",
        /// Its charge's amount or currency is not the order's; nothing changed.
        Mismatched = "mismatched",
        /// Not believed: missing, wrong or stale signature; nothing written.
        BadSignature = "bad_signature",
    }
}

/// Applies a verified event once it is known to be new.
pub async fn apply(orders: &Orders, event: &Event) -> Result<EventResult, CheckoutError> {
    let (Some(order_id), Some(outcome)) = (event.order_id(), event.outcome()) else {
        return Ok(EventResult::Unknown);
    };
    let Some(order) = order_of(orders, order_id).await? else {
        return Ok(EventResult::Unknown);
    };
    if !event.charges(order.amount_cents, &order.currency) {
        // A signed event for another sum is Payrail's error or a leaked
        // secret, never a reason to sell seats. It is answered 200 and
        // stored under its id like any other event: the event will not
        // change, so a 4xx/5xx would only have Payrail retry it for
        // days. The order stays pending, and reconciliation settles it
        // by Payrail's answer to the order's own charge.
        tracing::error!(
            %order_id,
            event_id = %event.id,
            order_amount_cents = order.amount_cents,
            order_currency = %order.currency,
            event_amount_cents = event.data.charge.amount_cents,
            event_currency = %event.data.charge.currency,
            "a Payrail event's amount or currency is not its order's; nothing changed"
        );
        return Ok(EventResult::Mismatched);
    }
    Ok(
        match settle::unclaimed(orders, &order.user_id, order_id, &outcome).await? {
            Settlement::Applied(_) => EventResult::Applied,
            Settlement::Already(order) if agrees(&order, &outcome) => EventResult::AlreadySettled,
            Settlement::Already(order) => {
                tracing::error!(
                    %order_id,
                    event_id = %event.id,
                    status = order.status.as_str(),
                    charge_id = ?order.charge_id,
                    ?outcome,
                    "a Payrail event contradicts how its order was settled; nothing changed"
                );
                EventResult::Contradicting
            }
            // Being canceled: Payrail's confirmation of the cancel ends it.
            Settlement::Unsettled => EventResult::AlreadySettled,
        },
    )
}

/// An order known by its id alone, as events name it: by its buyer as
/// the order's holds name them (until the order is declined or failed),
/// else by its id. On Citus either lookup asks every shard (the holds are
/// split by event, the orders by buyer): a Payrail event's cost, never a
/// click's.
async fn order_of(orders: &Orders, order_id: Uuid) -> Result<Option<Order>, CheckoutError> {
    let client = orders.route.home().get().await?;
    let held_by = client
        .prepare_cached("SELECT user_id FROM holds WHERE order_id = $1 LIMIT 1")
        .await?;
    if let Some(row) = client.query_opt(&held_by, &[&order_id]).await? {
        let user_id: String = row.try_get(0)?;
        return Ok(load(&client, &user_id, order_id).await?);
    }
    Ok(by_id(&client, order_id).await?)
}

/// Whether a settled order says what the event says: paid by this charge;
/// declined; or failed with this very charge refunded (or any decline).
fn agrees(order: &Order, outcome: &ChargeOutcome) -> bool {
    match (order.status, outcome) {
        (OrderStatus::Paid | OrderStatus::Failed, ChargeOutcome::Succeeded { charge_id }) => {
            order.charge_id.as_ref() == Some(charge_id)
        }
        (OrderStatus::Declined | OrderStatus::Failed, ChargeOutcome::Declined { .. }) => true,
        _ => false,
    }
}
