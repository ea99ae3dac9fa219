//! `stagedoor-checkout keys`: what happened to a click (`show`), forgetting
//! its key once that cannot cost a second charge (`purge`), and the key
//! table's numbers (`stats`). The idempotency engine reads and decides
//! (`idempotency::inspect`); this adds the order a key links and prints
//! pretty JSON on stdout, and a refusal's reason on stderr.

use std::process::ExitCode;
use std::time::SystemTime;

use anyhow::Context;
use base64::Engine as _;
use clap::{Args, Subcommand};
use deadpool_postgres::GenericClient;
use idempotency::inspect::{self, KeyReport, Purge, PurgeRefusal, Stats};
use idempotency::{IdempotencyKey, KeyError, Policy};
use serde::Serialize;
use time::OffsetDateTime;
use uuid::Uuid;

use crate::auth::BuyerId;
use crate::checkout::orders::{self, OrderStatus};
use crate::checkout::rfc3339;
use crate::config::Settings;
use crate::db;

/// The key was found, or the purge was done.
pub(super) const FOUND: u8 = 0;
/// There is no such key (never sent, purged, or deleted by the cleanup).
pub(super) const NOT_FOUND: u8 = 1;
/// The purge was refused: the key stays. (clap's bad arguments are 2 too.)
const REFUSED: u8 = 2;
/// The command could not answer (the database, the settings).
pub const FAILED: u8 = 3;

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Print what happened to one click, as one JSON document.
    ///
    /// Exit status: 0 found, 1 no such key, 3 failed.
    Show {
        #[command(flatten)]
        click: Click,
        /// Print the stored body too: as text when it is UTF-8, else base64.
        #[arg(long)]
        body: bool,
    },
    /// Delete an answered or expired key and print what it held; the next
    /// request with it is a new click.
    ///
    /// Refuses a key in progress, or whose order is still payment_pending:
    /// forgotten then, a retry of the click could charge a second time. Also
    /// refuses, until the key expires, one whose order was declined or
    /// failed: its answer is what keeps a retry from charging again.
    ///
    /// Exit status: 0 deleted, 1 no such key, 2 refused (the key stays), 3 failed.
    Purge {
        #[command(flatten)]
        click: Click,
    },
    /// Count the keys by state, with the table's size and what the next
    /// cleanup would delete. Reads the whole table.
    Stats,
}

/// One click's key.
#[derive(Debug, Args)]
pub struct Click {
    /// The buyer: the token's `sub`.
    #[arg(long, value_parser = BuyerId::parse)]
    user: BuyerId,
    /// The Idempotency-Key as the client sent it (the quoted form "…" too).
    #[arg(long, value_parser = parse_key, allow_hyphen_values = true)]
    key: IdempotencyKey,
}

fn parse_key(raw: &str) -> Result<IdempotencyKey, KeyError> {
    IdempotencyKey::parse(raw.as_bytes())
}

impl Click {
    pub(super) fn new(user: BuyerId, key: IdempotencyKey) -> Self {
        Self { user, key }
    }
}

/// The key policy the service runs with: its TTL and lease decide which
/// keys are expired.
pub(super) fn policy(settings: &Settings) -> Policy {
    Policy {
        ttl: settings.idempotency.ttl(),
        lease: settings.idempotency.lease(),
    }
}

/// What `keys show` prints of one click, and whether its key was found.
pub(super) async fn show(
    client: &impl GenericClient,
    policy: Policy,
    click: &Click,
    with_body: bool,
) -> anyhow::Result<(bool, Document)> {
    let report = inspect::inspect(client, policy, click.user.as_str(), &click.key).await?;
    let document = Document::of(client, click, report.as_ref(), with_body).await?;
    Ok((report.is_some(), document))
}

/// Runs one `keys` command with the service's settings (its TTL and lease
/// decide what is expired) and says how it ended.
pub async fn run(command: KeysCommand, settings: &Settings) -> anyhow::Result<ExitCode> {
    let pool = db::pool(&settings.database)?;
    let mut client = pool.get().await.context("connecting to the database")?;
    let policy = policy(settings);
    let status = match command {
        KeysCommand::Show { click, body } => {
            let (found, document) = show(&client, policy, &click, body).await?;
            print(&document)?;
            if found {
                FOUND
            } else {
                NOT_FOUND
            }
        }
        KeysCommand::Purge { click } => {
            let (user, key) = (click.user.as_str(), &click.key);
            match inspect::purge(&mut client, policy, user, key).await? {
                Purge::Purged(report) => {
                    print(&Document::of(&client, &click, Some(&report), false).await?)?;
                    FOUND
                }
                Purge::Refused(refusal, report) => {
                    let document = Document::of(&client, &click, Some(&report), false).await?;
                    print(&document)?;
                    eprintln!("refused: {}", why(refusal, &document));
                    REFUSED
                }
                Purge::Absent => {
                    print(&Document::of(&client, &click, None, false).await?)?;
                    NOT_FOUND
                }
            }
        }
        KeysCommand::Stats => {
            let stats = inspect::stats(&client, policy).await?;
            print(&StatsDocument::new(&stats, policy))?;
            FOUND
        }
    };
    Ok(ExitCode::from(status))
}

pub(super) fn print(document: &impl Serialize) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(document)?);
    Ok(())
}

/// The one line a refusal explains itself with.
fn why(refusal: PurgeRefusal, document: &Document) -> String {
    let order = document
        .row
        .as_ref()
        .and_then(|row| row.effect.as_ref())
        .map(|effect| effect.id.as_str())
        .unwrap_or("?");
    match refusal {
        PurgeRefusal::InProgress => {
            format!("{refusal}; forgotten now, a retry of the click could make a second order")
        }
        PurgeRefusal::Settling => format!(
            "its order {order} is still payment_pending (Payrail's answer is not in yet); \
             forgotten now, a retry of the click could charge a second time"
        ),
        PurgeRefusal::Rearms => {
            let (status, expires_at) = document.row.as_ref().map_or(("?", "?"), |row| {
                let status = row
                    .effect
                    .as_ref()
                    .and_then(|effect| effect.order.as_ref())
                    .map_or("?", |order| order.status.as_str());
                (status, row.expires_at.as_str())
            });
            format!(
                "its order {order} was {status}, and its answer is what tells a retry of the \
                 click so; forgotten now, the retry would make a new order and charge again. \
                 It can be purged once it expires at {expires_at}"
            )
        }
    }
}

/// What a click's key says, for `show` and `purge` (and `orders show`).
#[derive(Debug, Serialize)]
pub(super) struct Document {
    user_id: String,
    key: String,
    /// `absent`, `in_progress`, `answered` or `expired`.
    state: &'static str,
    /// Nothing more when the key is absent.
    #[serde(flatten)]
    row: Option<KeyRow>,
}

#[derive(Debug, Serialize)]
struct KeyRow {
    created_at: String,
    expires_at: String,
    /// Null once answered: an answered key keeps no claim.
    lease_expires_at: Option<String>,
    lease_expired: bool,
    effect: Option<Effect>,
    response: Option<Response>,
}

/// The effect the click made: here always an order. The key links it
/// while it settles; once the key is answered, the order is the one made
/// with the click's key.
#[derive(Debug, Serialize)]
struct Effect {
    /// As the key links it, or the order's id.
    id: String,
    /// The order it names; null if there is none.
    order: Option<OrderSummary>,
}

#[derive(Debug, Serialize)]
struct OrderSummary {
    order_id: Uuid,
    status: OrderStatus,
    charge_id: Option<String>,
    amount_cents: i64,
    currency: String,
    created_at: String,
}

/// The stored answer, replayed to every retry of the click.
#[derive(Debug, Serialize)]
struct Response {
    status: u16,
    content_type: String,
    location: Option<String>,
    body_bytes: usize,
    /// Only with `--body`.
    #[serde(skip_serializing_if = "Option::is_none")]
    body: Option<Body>,
}

#[derive(Debug, Serialize)]
#[serde(tag = "encoding", content = "data")]
enum Body {
    #[serde(rename = "utf-8")]
    Text(String),
    #[serde(rename = "base64")]
    Base64(String),
}

impl Document {
    async fn of(
        client: &impl GenericClient,
        click: &Click,
        report: Option<&KeyReport>,
        with_body: bool,
    ) -> anyhow::Result<Self> {
        let row = match report {
            Some(report) => Some(KeyRow {
                created_at: timestamp(report.created_at),
                expires_at: timestamp(report.expires_at),
                lease_expires_at: report.lease_expires_at.map(timestamp),
                lease_expired: report.lease_expired,
                effect: Effect::of_click(client, click, report).await?,
                response: report.response.as_ref().map(|response| Response {
                    status: response.status,
                    content_type: response.content_type.clone(),
                    location: response.location.clone(),
                    body_bytes: response.body.len(),
                    body: with_body.then(|| Body::of(&response.body)),
                }),
            }),
            None => None,
        };
        Ok(Self {
            user_id: click.user.as_str().to_owned(),
            key: click.key.as_str().to_owned(),
            state: report.map_or("absent", |report| report.state.as_str()),
            row,
        })
    }
}

impl Effect {
    async fn of_click(
        client: &impl GenericClient,
        click: &Click,
        report: &KeyReport,
    ) -> anyhow::Result<Option<Self>> {
        let user_id = click.user.as_str();
        if let Some(id) = &report.effect {
            let order = match Uuid::parse_str(id) {
                Ok(order_id) => orders::load(client, user_id, order_id)
                    .await
                    .with_context(|| format!("loading order {order_id}"))?,
                Err(_) => None,
            };
            return Ok(Some(Self::new(id.clone(), order)));
        }
        if report.response.is_none() {
            return Ok(None);
        }
        let order = orders::made_by_click(client, user_id, click.key.as_str(), report.created_at)
            .await
            .context("loading the click's order")?;
        Ok(order.map(|order| Self::new(order.order_id.to_string(), Some(order))))
    }

    fn new(id: String, order: Option<orders::Order>) -> Self {
        Self {
            id,
            order: order.map(|order| OrderSummary {
                order_id: order.order_id,
                status: order.status,
                charge_id: order.charge_id,
                amount_cents: order.amount_cents,
                currency: order.currency,
                created_at: order.created_at,
            }),
        }
    }
}

impl Body {
    fn of(bytes: &[u8]) -> Self {
        match std::str::from_utf8(bytes) {
            Ok(text) => Body::Text(text.to_owned()),
            Err(_) => Body::Base64(base64::engine::general_purpose::STANDARD.encode(bytes)),
        }
    }
}

fn timestamp(at: SystemTime) -> String {
    rfc3339(OffsetDateTime::from(at))
}

/// `keys stats`.
#[derive(Debug, Serialize)]
struct StatsDocument {
    rows: Rows,
    /// Seconds; null when the table is empty.
    oldest_row_age_secs: Option<f64>,
    table_bytes: u64,
    index_bytes: u64,
    /// Rows the cleanup would delete if it ran now (every expired one).
    cleanup_would_delete: u64,
    /// The TTL these numbers were counted with (`idempotency.ttl_secs`).
    ttl_secs: u64,
}

#[derive(Debug, Serialize)]
struct Rows {
    in_progress: u64,
    answered: u64,
    expired: u64,
    total: u64,
}

impl StatsDocument {
    fn new(stats: &Stats, policy: Policy) -> Self {
        Self {
            rows: Rows {
                in_progress: stats.in_progress,
                answered: stats.answered,
                expired: stats.expired,
                total: stats.rows(),
            },
            oldest_row_age_secs: stats
                .oldest_age
                .map(|age| (age.as_secs_f64() * 1000.0).round() / 1000.0),
            table_bytes: stats.table_bytes,
            index_bytes: stats.index_bytes,
            cleanup_would_delete: stats.cleanup_due,
            ttl_secs: policy.ttl.as_secs(),
        }
    }
}
