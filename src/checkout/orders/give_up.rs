//! The end of a payment Payrail never decides (a card that only ever gets
//! a 500, answers lost for good): the order is marked as being canceled,
//! its key is canceled at Payrail, and only once Payrail confirms (nothing
//! charged, or the charge refunded) is it `failed`. Never failed without
//! that confirmation: until then a charge may still exist.

use uuid::Uuid;

use super::settle::{self, Settlement};
use super::Orders;
use crate::checkout::CheckoutError;
use crate::payrail::Canceled;

/// Gives up on a pending order. The mark comes first, in one
/// conditional update that a concurrent settlement cannot both lose
/// and win: either the order was settled before (nothing to cancel,
/// `None`), or no charge answer settles it from now on. A failed or
/// unconfirmed cancel leaves it marked, for the next attempt to cancel
/// again (Payrail answers a repeated cancel the same).
pub async fn give_up(
    orders: &Orders,
    user_id: &str,
    order_id: Uuid,
) -> Result<Option<Settlement>, CheckoutError> {
    if !mark_canceling(orders, user_id, order_id).await? {
        return Ok(None);
    }
    let canceled = orders.payrail.cancel(order_id).await?;
    let refunded = match &canceled {
        Canceled::Nothing => None,
        Canceled::Refunded { charge_id } => Some(charge_id),
    };
    tracing::warn!(%order_id, ?canceled, "gave up on a payment Payrail never decided");
    Ok(Some(
        settle::failed(orders, user_id, order_id, refunded).await?,
    ))
}

/// Marks a pending order as being canceled (again, if it already was):
/// false when it is settled.
async fn mark_canceling(
    orders: &Orders,
    user_id: &str,
    order_id: Uuid,
) -> Result<bool, CheckoutError> {
    let client = orders.pool(user_id).get().await?;
    // The time comes from here, not `now()`: a distributed database
    // (Citus) refuses a STABLE function beside a column reference in an
    // UPDATE. The mark's time is only ever read as "is it set".
    let statement = client
        .prepare_cached(
            "UPDATE orders SET cancel_requested_at = coalesce(cancel_requested_at, $3)
             WHERE user_id = $1 AND order_id = $2 AND status = 'payment_pending'",
        )
        .await?;
    let now = time::OffsetDateTime::now_utc();
    Ok(client
        .execute(&statement, &[&user_id, &order_id, &now])
        .await?
        == 1)
}
