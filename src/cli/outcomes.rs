//! `stagedoor-checkout outcomes`: the event an order made for the shop and
//! how its delivery stands (`show`), and sending it again (`resend`), for
//! a shop that lost it or was down past `outcomes.retry_for_secs`. The SQL
//! is the outbox's (`checkout::orders::outbox`); this prints pretty JSON.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Args, Subcommand};
use serde::Serialize;
use uuid::Uuid;

use super::keys::{print, FOUND, NOT_FOUND};
use crate::auth::BuyerId;
use crate::checkout::orders::outbox::{self, Record};
use crate::config::Settings;
use crate::db;

#[derive(Debug, Subcommand)]
pub enum OutcomesCommand {
    /// Print an order's event and its delivery, as one JSON document.
    ///
    /// Exit status: 0 found, 1 no event (no such order, or not settled yet), 3 failed.
    Show {
        #[command(flatten)]
        order: Order,
    },
    /// Send an order's event again, delivered or given up alike: the same
    /// event under the same id, due now and retried afresh. Prints it.
    ///
    /// Exit status: 0 done, 1 no event (no such order, or not settled yet), 3 failed.
    Resend {
        #[command(flatten)]
        order: Order,
    },
}

/// One order of one buyer.
#[derive(Debug, Args)]
pub struct Order {
    /// The buyer: the token's `sub`.
    #[arg(long, value_parser = BuyerId::parse)]
    user: BuyerId,
    /// The order's id.
    #[arg(long)]
    order: Uuid,
}

/// What `show` and `resend` print.
#[derive(Debug, Serialize)]
struct Document<'a> {
    user_id: &'a str,
    order_id: Uuid,
    /// Null when the order has no event.
    event: Option<Record>,
}

pub async fn run(command: OutcomesCommand, settings: &Settings) -> anyhow::Result<ExitCode> {
    let pool = db::pool(&settings.database)?;
    let client = pool.get().await.context("connecting to the database")?;
    let order = match command {
        OutcomesCommand::Show { order } => order,
        OutcomesCommand::Resend { order } => {
            outbox::resend(&client, order.user.as_str(), order.order).await?;
            order
        }
    };
    let event = outbox::of_order(&client, order.user.as_str(), order.order).await?;
    let status = if event.is_some() { FOUND } else { NOT_FOUND };
    print(&Document {
        user_id: order.user.as_str(),
        order_id: order.order,
        event,
    })?;
    Ok(ExitCode::from(status))
}
