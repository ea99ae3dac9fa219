//! `stagedoor-checkout orders`: support's answer to "was I charged?" from
//! what a buyer knows. `show` starts from an order id alone (a receipt, a
//! 402's `order_id`, a `Location`) and prints, on one page, the order, what
//! Payrail knows it by, the click's key and the order's event for the
//! shop; `list` gives a buyer's orders, newest first. The SQL is the
//! orders', the key engine's and the outbox's; this prints pretty JSON.

use std::process::ExitCode;

use anyhow::Context;
use clap::Subcommand;
use idempotency::IdempotencyKey;
use serde::Serialize;
use uuid::Uuid;

use super::keys::{self, print, Click, FOUND, NOT_FOUND};
use crate::auth::BuyerId;
use crate::checkout::orders::outbox::{self, Record};
use crate::checkout::orders::{self, Order, OrderStatus};
use crate::config::Settings;
use crate::db;
use crate::payrail;

/// The most orders `list` prints.
const MAX_LIST: u8 = 100;

#[derive(Debug, Subcommand)]
pub enum OrdersCommand {
    /// Print an order found by its id alone, whoever's it is, with its
    /// Payrail key and charge, its click's key and its event for the shop,
    /// as one JSON document.
    ///
    /// Exit status: 0 found, 1 no such order, 3 failed.
    Show {
        /// The order's id.
        #[arg(long)]
        order: Uuid,
    },
    /// Print a buyer's orders, newest first, as one JSON document.
    ///
    /// Exit status: 0 listed (none is an empty list), 3 failed.
    List {
        /// The buyer: the token's `sub`.
        #[arg(long, value_parser = BuyerId::parse)]
        user: BuyerId,
        /// How many orders, the newest, at most.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(u8).range(1..=i64::from(MAX_LIST)))]
        limit: u8,
    },
}

/// What `show` prints of an order that exists.
#[derive(Debug, Serialize)]
struct Shown {
    user_id: String,
    /// As `GET /orders/{order_id}` shows it to its buyer.
    order: Order,
    payment: Payment,
    /// The click that made the order, as `keys show` prints it.
    key: keys::Document,
    /// The order's event for the shop; null until the order is settled.
    event: Option<Record>,
}

/// What `show` prints when there is no such order.
#[derive(Debug, Serialize)]
struct Absent {
    order_id: Uuid,
    /// Always null.
    order: Option<Order>,
}

/// The order's payment as Payrail knows it. Payrail's API has no read of
/// a charge, and sending the charge again to learn its state is
/// reconciliation's act, not a support command's: this says what to ask
/// Payrail by, and what the order's state means for the buyer's card.
#[derive(Debug, Serialize)]
struct Payment {
    /// `yes` (paid), `no` (declined, or failed with nothing charged),
    /// `refunded` (failed after a charge, which the cancel refunded) or
    /// `not_known_yet` (still waiting for Payrail's answer).
    charged: &'static str,
    /// The `Idempotency-Key` of every charge attempt and the cancel of this
    /// order at Payrail.
    payrail_key: String,
    /// Payrail's charge id, once Payrail answered with one.
    charge_id: Option<String>,
}

impl Payment {
    fn of(order: &Order) -> Self {
        let charged = match (order.status, &order.charge_id) {
            (OrderStatus::Paid, _) => "yes",
            (OrderStatus::Declined, _) | (OrderStatus::Failed, None) => "no",
            (OrderStatus::Failed, Some(_)) => "refunded",
            (OrderStatus::PaymentPending, _) => "not_known_yet",
        };
        Self {
            charged,
            payrail_key: payrail::charge_key(order.order_id),
            charge_id: order.charge_id.clone(),
        }
    }
}

/// What `list` prints.
#[derive(Debug, Serialize)]
struct Listed {
    user_id: String,
    /// Newest first, each as `GET /orders/{order_id}` shows it.
    orders: Vec<Order>,
    /// Whether the buyer has older orders than these.
    more: bool,
}

pub async fn run(command: OrdersCommand, settings: &Settings) -> anyhow::Result<ExitCode> {
    let pool = db::pool(&settings.database)?;
    let client = pool.get().await.context("connecting to the database")?;
    let status = match command {
        OrdersCommand::Show { order } => {
            // On Citus the orders are split by buyer, so an order found by
            // its id alone is looked for on every shard: a fan-out that a
            // support command, run by hand, can afford.
            let found = orders::by_id(&client, order)
                .await
                .with_context(|| format!("loading order {order}"))?;
            match found {
                Some(found) => {
                    print(&show(&client, settings, found).await?)?;
                    FOUND
                }
                None => {
                    print(&Absent {
                        order_id: order,
                        order: None,
                    })?;
                    NOT_FOUND
                }
            }
        }
        OrdersCommand::List { user, limit } => {
            let page = orders::list(&client, user.as_str(), None, limit)
                .await
                .context("listing the buyer's orders")?;
            print(&Listed {
                user_id: user.as_str().to_owned(),
                orders: page.orders,
                more: page.next.is_some(),
            })?;
            FOUND
        }
    };
    Ok(ExitCode::from(status))
}

/// Everything `show` prints of an order that exists: its buyer's rows are
/// read by the buyer, on the buyer's shard.
async fn show(
    client: &deadpool_postgres::Client,
    settings: &Settings,
    order: Order,
) -> anyhow::Result<Shown> {
    let user = BuyerId::parse(&order.user_id)
        .with_context(|| format!("the buyer of order {}", order.order_id))?;
    let key = IdempotencyKey::parse(order.idempotency_key.as_bytes())
        .with_context(|| format!("the key of order {}", order.order_id))?;
    let click = Click::new(user, key);
    let (_, key) = keys::show(client, keys::policy(settings), &click, false).await?;
    let event = outbox::of_order(client, &order.user_id, order.order_id)
        .await
        .context("loading the order's event")?;
    Ok(Shown {
        user_id: order.user_id.clone(),
        payment: Payment::of(&order),
        key,
        event,
        order,
    })
}
