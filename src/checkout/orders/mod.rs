//! Orders: one per intent, written (`payment_pending`) and linked to its key
//! before Payrail is called, settled to `paid` or `declined` by the request
//! that made it, by a request that took its key over, by Payrail's event,
//! or by reconciliation; `failed` when Payrail never decides and the charge
//! is canceled. No database connection is held while Payrail is being called.
//!
//! `click` runs a claimed click (make or resume, charge, settle, answer),
//! `settle` settles an order outside a claim, `outcome` says what Payrail's
//! decision means and counts it, `event` applies Payrail's events,
//! `give_up` ends an undecided order, `outbox` holds the events a settlement
//! writes for the shop, and this module the order itself: its
//! types, its parsing, and how it is read back.

pub mod click;
pub mod event;
pub mod give_up;
pub mod outbox;
mod outcome;
pub mod settle;
mod status;

use std::sync::Arc;

use deadpool_postgres::{GenericClient, Pool};
use idempotency::Route;
use serde::Serialize;
use time::OffsetDateTime;
use tokio_postgres::Row;
use uuid::Uuid;

use super::CheckoutError;
use crate::db::DbError;
use crate::observe;
use crate::payrail::{self, Charge};

pub use outcome::{Reason, METRICS};
pub use settle::{record_decision, Settlement};
pub use status::{OrderStatus, PaymentMethod};

/// Every order is charged in this currency.
pub const CURRENCY: &str = "USD";
/// More holds than this in one order is not a checkout a person makes.
const MAX_HOLDS: usize = 50;

/// An order as asked for, checked: at least one hold, none twice, a payment
/// method of the right form.
#[derive(Debug, Clone)]
pub struct NewOrder {
    hold_ids: Vec<i64>,
    payment_method: PaymentMethod,
}

/// A well-formed order request that asks for the impossible: answered
/// `invalid-order`, and stored on the click's key like any answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidOrder(pub &'static str);

impl From<InvalidOrder> for CheckoutError {
    fn from(InvalidOrder(why): InvalidOrder) -> Self {
        CheckoutError::InvalidOrder(why)
    }
}

impl NewOrder {
    pub fn parse(hold_ids: Vec<i64>, payment_method: &str) -> Result<Self, InvalidOrder> {
        if hold_ids.is_empty() {
            return Err(InvalidOrder("hold_ids must name at least one hold"));
        }
        if hold_ids.len() > MAX_HOLDS {
            return Err(InvalidOrder("hold_ids may name at most 50 holds"));
        }
        let mut sorted = hold_ids.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != hold_ids.len() {
            return Err(InvalidOrder("hold_ids names a hold more than once"));
        }
        Ok(Self {
            hold_ids,
            payment_method: PaymentMethod::parse(payment_method)?,
        })
    }
}

/// An order as the buyer sees it (the 201 body and `GET /orders/{id}`).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Order {
    pub order_id: Uuid,
    pub status: OrderStatus,
    pub amount_cents: i64,
    #[schema(example = "USD")]
    pub currency: String,
    pub hold_ids: Vec<i64>,
    /// The seat labels, in the order of `hold_ids`.
    pub seats: Vec<String>,
    /// Payrail's charge id; null until Payrail has answered.
    #[schema(required = true)]
    pub charge_id: Option<String>,
    /// Why Payrail declined the order, when it said (as in the click's
    /// 402): `card_declined`, `insufficient_funds`, `expired_card`,
    /// `incorrect_cvc`, `lost_card`, `stolen_card`, or `other`. Absent
    /// otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, example = "card_declined")]
    pub decline_code: Option<&'static str>,
    /// RFC 3339, UTC.
    #[schema(format = DateTime)]
    pub created_at: String,
    #[serde(skip)]
    payment_method: PaymentMethod,
    #[serde(skip)]
    pub user_id: String,
    #[serde(skip)]
    pub idempotency_key: String,
}

const COLUMNS: &str = "order_id, user_id, status, amount_cents, currency, payment_method, \
                       hold_ids, seats, charge_id, decline_code, idempotency_key, created_at";

impl Order {
    fn from_row(row: &Row) -> Result<Self, DbError> {
        Ok(Self {
            order_id: row.try_get("order_id")?,
            status: row.try_get("status")?,
            amount_cents: row.try_get("amount_cents")?,
            currency: row.try_get("currency")?,
            hold_ids: row.try_get("hold_ids")?,
            seats: row.try_get("seats")?,
            charge_id: row.try_get("charge_id")?,
            decline_code: row
                .try_get::<_, Option<&str>>("decline_code")?
                .map(|code| observe::Label::as_str(Reason::named(code))),
            created_at: super::rfc3339(row.try_get::<_, OffsetDateTime>("created_at")?),
            payment_method: PaymentMethod::trusted(row.try_get("payment_method")?),
            user_id: row.try_get("user_id")?,
            idempotency_key: row.try_get("idempotency_key")?,
        })
    }

    /// What Payrail is asked: the same bytes on every attempt and every
    /// restart, since all of it comes from the order row.
    pub fn charge(&self) -> Charge {
        Charge {
            amount_cents: self.amount_cents,
            currency: self.currency.clone(),
            payment_method: self.payment_method.as_str().to_owned(),
            reference: self.order_id,
        }
    }
}

/// The orders of one instance: the route to each buyer's rows (the
/// orders are the buyer's, beside the buyer's keys) and its Payrail client.
#[derive(Clone)]
pub struct Orders {
    route: Route,
    payrail: Arc<payrail::Client>,
}

impl Orders {
    pub fn new(route: impl Into<Route>, payrail: Arc<payrail::Client>) -> Self {
        Self {
            route: route.into(),
            payrail,
        }
    }

    /// The pool for `buyer`'s rows.
    fn pool(&self, buyer: &str) -> Pool {
        self.route.pool(buyer)
    }

    /// A buyer's own order; another buyer's is as good as absent.
    pub async fn find(&self, buyer: &str, order_id: Uuid) -> Result<Option<Order>, CheckoutError> {
        let client = self.pool(buyer).get().await?;
        Ok(load(&client, buyer, order_id).await?)
    }

    /// A page of a buyer's own orders, newest first.
    pub async fn list(
        &self,
        buyer: &str,
        after: Option<Position>,
        limit: u8,
    ) -> Result<Page, CheckoutError> {
        let client = self.pool(buyer).get().await?;
        Ok(list(&client, buyer, after, limit).await?)
    }
}

/// Where an order stands in its buyer's list, newest first: its creation
/// time, then its id for orders made in the same microsecond. A page goes
/// on after the last position of the one before, so an order made meanwhile
/// neither shifts the pages nor shows up twice.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Position {
    pub created_at: OffsetDateTime,
    pub order_id: Uuid,
}

/// Some of a buyer's orders, newest first, and where the next page starts
/// (`None`: there is none).
#[derive(Debug)]
pub struct Page {
    pub orders: Vec<Order>,
    pub next: Option<Position>,
}

/// Up to `limit` of a buyer's orders, newest first, after `after` (from
/// the newest when `None`), through the index on (user_id, created_at,
/// order_id) of migrations/V14: a page reads its own rows and one more,
/// which says whether another page follows.
pub async fn list(
    client: &impl GenericClient,
    user_id: &str,
    after: Option<Position>,
    limit: u8,
) -> Result<Page, DbError> {
    const ORDER: &str = "ORDER BY created_at DESC, order_id DESC LIMIT";
    let one_more = i64::from(limit) + 1;
    let rows = match after {
        None => {
            let statement = client
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM orders WHERE user_id = $1 {ORDER} $2"
                ))
                .await?;
            client.query(&statement, &[&user_id, &one_more]).await?
        }
        Some(after) => {
            let statement = client
                .prepare_cached(&format!(
                    "SELECT {COLUMNS} FROM orders
                     WHERE user_id = $1 AND (created_at, order_id) < ($2, $3) {ORDER} $4"
                ))
                .await?;
            client
                .query(
                    &statement,
                    &[&user_id, &after.created_at, &after.order_id, &one_more],
                )
                .await?
        }
    };
    let more = rows.len() > usize::from(limit);
    let kept = &rows[..rows.len().min(usize::from(limit))];
    let next = match kept.last() {
        Some(last) if more => Some(Position {
            created_at: last.try_get("created_at")?,
            order_id: last.try_get("order_id")?,
        }),
        _ => None,
    };
    let orders = kept.iter().map(Order::from_row).collect::<Result<_, _>>()?;
    Ok(Page { orders, next })
}

/// An order by its id alone, whoever's it is: for those who know only the
/// id (Payrail's events, support). The orders are keyed and, on Citus,
/// split by buyer, so this asks every shard (through the index on the id
/// alone of migrations/V6): never on a buyer's request.
pub async fn by_id(client: &impl GenericClient, order_id: Uuid) -> Result<Option<Order>, DbError> {
    let statement = client
        .prepare_cached(&format!("SELECT {COLUMNS} FROM orders WHERE order_id = $1"))
        .await?;
    client
        .query_opt(&statement, &[&order_id])
        .await?
        .map(|row| Order::from_row(&row))
        .transpose()
}

/// A buyer's order by id. The buyer comes first in the orders' key: the
/// order is then found on the buyer's own shard (docs/decisions/0003-step-functions.md).
pub async fn load(
    client: &impl GenericClient,
    user_id: &str,
    order_id: Uuid,
) -> Result<Option<Order>, DbError> {
    let statement = client
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM orders WHERE user_id = $1 AND order_id = $2"
        ))
        .await?;
    client
        .query_opt(&statement, &[&user_id, &order_id])
        .await?
        .map(|row| Order::from_row(&row))
        .transpose()
}

/// The order a buyer's click made, found by the click's key: for a key
/// that no longer links its order (an answered key keeps no link). An order
/// made before the key row's `created_at` belongs to an earlier intent of
/// the same key, one that ran past its TTL and was restarted.
pub async fn made_by_click(
    client: &impl GenericClient,
    user_id: &str,
    key: &str,
    since: std::time::SystemTime,
) -> Result<Option<Order>, DbError> {
    let statement = client
        .prepare_cached(&format!(
            "SELECT {COLUMNS} FROM orders
             WHERE user_id = $1 AND idempotency_key = $2 AND created_at >= $3
             ORDER BY created_at DESC LIMIT 1"
        ))
        .await?;
    client
        .query_opt(&statement, &[&user_id, &key, &since])
        .await?
        .map(|row| Order::from_row(&row))
        .transpose()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn semantic_mistakes_are_invalid_orders() {
        let cases = [
            (vec![], "pm_card_visa", "no holds"),
            (vec![1, 1], "pm_card_visa", "duplicate holds"),
            ((1..=51).collect(), "pm_card_visa", "too many holds"),
            (vec![1], "card_visa", "no pm_ prefix"),
        ];
        for (holds, method, why) in cases {
            assert!(
                matches!(NewOrder::parse(holds, method), Err(InvalidOrder(_))),
                "{why}"
            );
        }
        assert!(NewOrder::parse(vec![3, 1, 2], "pm_card_visa").is_ok());
    }
}
