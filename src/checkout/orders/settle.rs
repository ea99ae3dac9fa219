//! Payrail's decision, recorded: the order moves to `paid` or `declined`
//! (a paid order's holds are sold, a declined order gives them back) and
//! its answer is stored on the key that made it, in one transaction, for
//! everyone but the click's own request (`click` settles in one call):
//! reconciliation, Payrail's events, the give-up's `failed`. The order row is locked first and the key
//! row last, as every writer of both does, so none of them deadlock.
//!
//! An order being canceled (`cancel_requested_at`, see `give_up`) is
//! settled by the cancel's confirmation alone (`failed`): no charge answer,
//! however late, makes it `paid` while its charge is being refunded.

use deadpool_postgres::GenericClient;
use uuid::Uuid;

use super::click::answer;
use super::outcome::{counted, decision};
use super::{load, Order, OrderStatus, Orders, COLUMNS};
use crate::checkout::CheckoutError;
use crate::payrail::ChargeOutcome;

/// What a settlement outside a claim found.
#[derive(Debug)]
pub enum Settlement {
    /// It settled the order, and answered the order's key.
    Applied(Order),
    /// The order was settled before: as it stands.
    Already(Order),
    /// Still pending: a charge answer for an order being canceled, or a
    /// `failed` for one that is not.
    Unsettled,
}

/// Settles a pending order outside any claim (reconciliation, an
/// event), storing its answer on the order's key if that key still
/// belongs to the same intent and has no answer yet.
pub async fn unclaimed(
    orders: &Orders,
    user_id: &str,
    order_id: Uuid,
    outcome: &ChargeOutcome,
) -> Result<Settlement, CheckoutError> {
    let (status, charge_id, code) = decision(outcome);
    unclaimed_as(orders, user_id, order_id, status, charge_id, code).await
}

/// The end of an order Payrail confirmed canceled (with the refunded
/// charge, if one was made): `failed`, holds given back, the click
/// answered 402 `payment-failed`.
pub(super) async fn failed(
    orders: &Orders,
    user_id: &str,
    order_id: Uuid,
    charge_id: Option<&String>,
) -> Result<Settlement, CheckoutError> {
    unclaimed_as(
        orders,
        user_id,
        order_id,
        OrderStatus::Failed,
        charge_id,
        None,
    )
    .await
}

async fn unclaimed_as(
    orders: &Orders,
    user_id: &str,
    order_id: Uuid,
    status: OrderStatus,
    charge_id: Option<&String>,
    decline_code: Option<&str>,
) -> Result<Settlement, CheckoutError> {
    let mut client = orders.pool(user_id).get().await?;
    let tx = client.transaction().await?;
    let settled = settle(&tx, user_id, order_id, status, charge_id, decline_code).await?;
    let (order, applied) = match settled {
        Some(order) => (order, true),
        None => match load(&tx, user_id, order_id).await? {
            None => {
                return Err(CheckoutError::Inconsistent(format!(
                    "order {order_id} vanished while settling"
                )))
            }
            Some(order) if order.status == OrderStatus::PaymentPending => {
                return Ok(Settlement::Unsettled)
            }
            // Someone else settled it first.
            Some(order) => (order, false),
        },
    };
    idempotency::store_for_effect(
        &tx,
        &order.user_id,
        &order.idempotency_key,
        &order_id.to_string(),
        &answer(&order),
    )
    .await?;
    tx.commit().await?;
    if applied {
        counted(&order);
    }
    Ok(if applied {
        Settlement::Applied(order)
    } else {
        Settlement::Already(order)
    })
}

/// Asks Payrail again about a pending order, with the order's own key
/// (so never a second charge): the order and Payrail's decision, or
/// `None` when the order is no longer pending.
pub async fn charge_again(
    orders: &Orders,
    user_id: &str,
    order_id: Uuid,
) -> Result<Option<(Order, ChargeOutcome)>, CheckoutError> {
    let order = {
        let client = orders.pool(user_id).get().await?;
        load(&client, user_id, order_id).await?
    };
    let Some(order) = order.filter(|o| o.status == OrderStatus::PaymentPending) else {
        return Ok(None);
    };
    let outcome = orders
        .payrail
        .charge_again(order_id, &order.charge())
        .await?;
    Ok(Some((order, outcome)))
}

/// Records Payrail's decision on a pending order (a declined one gives its
/// holds back) and returns the settled order; `None` when it was settled
/// already. Stores no answer: that is the caller's, in the same
/// transaction when there is a key to answer.
pub async fn record_decision(
    client: &impl GenericClient,
    user_id: &str,
    order_id: Uuid,
    outcome: &ChargeOutcome,
) -> Result<Option<Order>, crate::db::DbError> {
    let (status, charge_id, code) = decision(outcome);
    let settled = settle(client, user_id, order_id, status, charge_id, code).await?;
    if let Some(order) = &settled {
        counted(order);
    }
    Ok(settled)
}

/// Settles a pending order (giving the holds of an order not paid back,
/// recording a decline's reason) and returns it; `None` when it was
/// settled already, or is being canceled and this is a charge answer, or
/// is not and this is `failed`.
async fn settle(
    client: &impl GenericClient,
    user_id: &str,
    order_id: Uuid,
    status: OrderStatus,
    charge_id: Option<&String>,
    decline_code: Option<&str>,
) -> Result<Option<Order>, crate::db::DbError> {
    let statement = client
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM checkout_settle_order($1, $2, $3, $4, $5)"
        ))
        .await?;
    client
        .query_opt(
            &statement,
            &[&user_id, &order_id, &status, &charge_id, &decline_code],
        )
        .await?
        .map(|row| Order::from_row(&row))
        .transpose()
}
