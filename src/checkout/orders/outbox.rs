//! The order events (`order_events`, migrations/V10): one per order that
//! became `paid`, `declined` or `failed`, inserted by the settlement's own
//! statement (`checkout_settle_order`), so an event exists exactly when its
//! order is settled. Here they are read, leased for a delivery, marked with
//! its result, listed and sent again; `jobs::outcomes` delivers them.
//!
//! What an event says is rendered at each delivery from two rows that no
//! longer change once the order is settled: the event's (its id, type and
//! time) and the order's, serialized as `GET /orders/{id}` shows it (the
//! one [`Order`] type). Every delivery of an event is the same bytes.
//!
//! Every statement names the buyer and the order, so on Citus each goes to
//! the buyer's shard; only the read of due events, the backlog's count and
//! the retention's deletion span shards, as reconciliation's read does.

use std::time::{Duration, SystemTime};

use deadpool_postgres::GenericClient;
use serde::Serialize;
use tokio_postgres::types::{FromSql, Type};
use tokio_postgres::Row;
use uuid::Uuid;

use super::{load, Order};
use crate::db::DbError;

/// An event's type: how its order ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub enum EventType {
    #[serde(rename = "order.paid")]
    Paid,
    #[serde(rename = "order.declined")]
    Declined,
    #[serde(rename = "order.failed")]
    Failed,
}

impl<'a> FromSql<'a> for EventType {
    fn from_sql(
        ty: &Type,
        raw: &'a [u8],
    ) -> Result<Self, Box<dyn std::error::Error + Sync + Send>> {
        match <&str as FromSql>::from_sql(ty, raw)? {
            "order.paid" => Ok(Self::Paid),
            "order.declined" => Ok(Self::Declined),
            "order.failed" => Ok(Self::Failed),
            other => Err(format!("unknown order event type {other:?}").into()),
        }
    }

    fn accepts(ty: &Type) -> bool {
        <&str as FromSql>::accepts(ty)
    }
}

/// The header that signs an event (`crate::signature`'s scheme), which
/// the shop checks.
pub const SIGNATURE_HEADER: &str = "Stagedoor-Signature";

/// An order event, as the shop receives it: `POST`ed to
/// `outcomes.webhook_url`, signed in `Stagedoor-Signature`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OrderEvent {
    /// `evt_…`: the same on every delivery of the event, so that the shop
    /// can drop a duplicate.
    #[schema(example = "evt_3f6c1b8e0d2a4c5fb6a7e8d9c0b1a2f3")]
    pub id: String,
    #[serde(rename = "type")]
    pub kind: EventType,
    /// Unix seconds: when the order was settled.
    pub created: i64,
    pub data: OrderEventData,
}

#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OrderEventData {
    /// The order, as `GET /orders/{order_id}` shows it.
    pub order: Order,
    /// The buyer (the token's `sub`).
    pub user_id: String,
}

/// An event due for a delivery, as the due read saw it: whose, the lease
/// token a claim must find unchanged, and how long its retries have run.
#[derive(Debug)]
pub struct Due {
    pub user_id: String,
    pub order_id: Uuid,
    lease_token: i64,
    retrying_for: Duration,
}

/// An event leased for one delivery: its body, the attempts so far (this
/// one included), how long its retries have run, and the lease's token,
/// without which no result is written.
#[derive(Debug)]
pub struct Leased {
    pub user_id: String,
    pub order_id: Uuid,
    pub event_id: String,
    pub attempts: i32,
    pub retrying_for: Duration,
    pub body: Vec<u8>,
    token: i64,
}

/// An order's event, for the operator (`outcomes show`).
#[derive(Debug, Serialize)]
pub struct Record {
    pub event_id: String,
    #[serde(rename = "type")]
    pub kind: EventType,
    pub created_at: String,
    pub state: &'static str,
    pub attempts: i32,
    pub next_attempt_at: Option<String>,
    pub delivered_at: Option<String>,
    pub given_up_at: Option<String>,
    pub last_error: Option<String>,
}

/// Due events (not delivered, not given up, their next attempt reached),
/// oldest due first, at most `limit`. A plain read: the claim decides.
pub async fn due(client: &impl GenericClient, limit: i64) -> Result<Vec<Due>, DbError> {
    let statement = client
        .prepare_cached(
            "SELECT user_id, order_id, lease_token,
                    extract(epoch FROM now() - retry_from)::float8 AS retrying_for
             FROM order_events
             WHERE delivered_at IS NULL AND given_up_at IS NULL AND next_attempt_at <= now()
             ORDER BY next_attempt_at
             LIMIT $1",
        )
        .await?;
    client
        .query(&statement, &[&limit])
        .await?
        .iter()
        .map(|row| {
            Ok(Due {
                user_id: row.try_get(0)?,
                order_id: row.try_get(1)?,
                lease_token: row.try_get(2)?,
                retrying_for: Duration::try_from_secs_f64(row.try_get(3)?).unwrap_or_default(),
            })
        })
        .collect()
}

/// Leases a due event for `lease` (one delivery's time and a margin): one
/// conditional update of that event, won only if nobody has leased it since
/// it was read, so of several instances that read it one sends it. `None`
/// when another won, or its order is gone. (It returns columns only: a
/// distributed table's `RETURNING` takes no `now()`.)
pub async fn lease(
    client: &impl GenericClient,
    due: &Due,
    lease: Duration,
) -> Result<Option<Leased>, DbError> {
    let statement = client
        .prepare_cached(
            "UPDATE order_events
             SET attempts = attempts + 1, lease_token = $4,
                 next_attempt_at = now() + make_interval(secs => $5)
             WHERE user_id = $1 AND order_id = $2 AND lease_token = $3
               AND delivered_at IS NULL AND given_up_at IS NULL
             RETURNING event_id, type, created_at, attempts",
        )
        .await?;
    let token = new_token(due.lease_token);
    let Some(row) = client
        .query_opt(
            &statement,
            &[
                &due.user_id,
                &due.order_id,
                &due.lease_token,
                &token,
                &lease.as_secs_f64(),
            ],
        )
        .await?
    else {
        return Ok(None);
    };
    let Some(order) = load(client, &due.user_id, due.order_id).await? else {
        return Ok(None);
    };
    let event = event(&row, order, &due.user_id)?;
    Ok(Some(Leased {
        user_id: due.user_id.clone(),
        order_id: due.order_id,
        event_id: event.id.clone(),
        attempts: row.try_get("attempts")?,
        retrying_for: due.retrying_for,
        body: body(&event),
        token,
    }))
}

/// A token unlike the one it replaces, so that a lease's results are
/// written by its holder alone.
fn new_token(previous: i64) -> i64 {
    let token = Uuid::new_v4().as_u64_pair().0 as i64;
    if token == previous {
        token.wrapping_add(1)
    } else {
        token
    }
}

/// The event of a leased row and its order. Its time is the row's, in
/// whole seconds: the same on every delivery.
fn event(row: &Row, order: Order, user_id: &str) -> Result<OrderEvent, DbError> {
    let created: SystemTime = row.try_get("created_at")?;
    let created = created
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |since| since.as_secs() as i64);
    Ok(OrderEvent {
        id: row.try_get("event_id")?,
        kind: row.try_get("type")?,
        created,
        data: OrderEventData {
            order,
            user_id: user_id.to_owned(),
        },
    })
}

/// The bytes sent (and signed): the event as JSON.
pub fn body(event: &OrderEvent) -> Vec<u8> {
    // Strings, numbers and an order: serializing cannot fail.
    serde_json::to_vec(event).unwrap_or_default()
}

/// A 2xx answered the event: it is delivered, whoever leases it now (a
/// delivery that outlived its lease still reached the shop).
pub async fn delivered(client: &impl GenericClient, leased: &Leased) -> Result<(), DbError> {
    let statement = client
        .prepare_cached(
            "UPDATE order_events SET delivered_at = now(), last_error = NULL
             WHERE user_id = $1 AND order_id = $2 AND delivered_at IS NULL",
        )
        .await?;
    client
        .execute(&statement, &[&leased.user_id, &leased.order_id])
        .await?;
    Ok(())
}

/// The delivery failed: the next attempt in `retry_in`. Written only
/// while the lease is still this one's; false when it is not.
pub async fn failed(
    client: &impl GenericClient,
    leased: &Leased,
    retry_in: Duration,
    error: &str,
) -> Result<bool, DbError> {
    // The next attempt's delay is worked out in Rust: on Citus `now()` is
    // evaluated before the update is routed, which an expression reading
    // the row would not allow.
    let statement = client
        .prepare_cached(
            "UPDATE order_events
             SET next_attempt_at = now() + make_interval(secs => $4), last_error = left($5, 200)
             WHERE user_id = $1 AND order_id = $2 AND lease_token = $3
               AND delivered_at IS NULL",
        )
        .await?;
    let updated = client
        .execute(
            &statement,
            &[
                &leased.user_id,
                &leased.order_id,
                &leased.token,
                &retry_in.as_secs_f64(),
                &error,
            ],
        )
        .await?;
    Ok(updated == 1)
}

/// The delivery failed, and the event has been retried for as long as it
/// may be: no attempt follows (until `resend`). Written only while the
/// lease is still this one's; false when it is not.
pub async fn given_up(
    client: &impl GenericClient,
    leased: &Leased,
    error: &str,
) -> Result<bool, DbError> {
    let statement = client
        .prepare_cached(
            "UPDATE order_events SET given_up_at = now(), last_error = left($4, 200)
             WHERE user_id = $1 AND order_id = $2 AND lease_token = $3
               AND delivered_at IS NULL",
        )
        .await?;
    let updated = client
        .execute(
            &statement,
            &[&leased.user_id, &leased.order_id, &leased.token, &error],
        )
        .await?;
    Ok(updated == 1)
}

/// The events still to deliver, and the age of the oldest in seconds (0
/// when there is none).
pub async fn backlog(client: &impl GenericClient) -> Result<(i64, f64), DbError> {
    let statement = client
        .prepare_cached(
            "SELECT count(*),
                    coalesce(extract(epoch FROM now() - min(created_at))::float8, 0)
             FROM order_events
             WHERE delivered_at IS NULL AND given_up_at IS NULL",
        )
        .await?;
    let row = client.query_one(&statement, &[]).await?;
    Ok((row.try_get(0)?, row.try_get(1)?))
}

/// An order's event, if it has one (only a settled order has).
pub async fn of_order(
    client: &impl GenericClient,
    user_id: &str,
    order_id: Uuid,
) -> Result<Option<Record>, DbError> {
    let statement = client
        .prepare_cached(
            "SELECT event_id, type, created_at, attempts, next_attempt_at, delivered_at,
                    given_up_at, last_error
             FROM order_events WHERE user_id = $1 AND order_id = $2",
        )
        .await?;
    let Some(row) = client.query_opt(&statement, &[&user_id, &order_id]).await? else {
        return Ok(None);
    };
    let at = |column: &str| -> Result<Option<String>, DbError> {
        Ok(row
            .try_get::<_, Option<SystemTime>>(column)?
            .map(|at| super::super::rfc3339(at.into())))
    };
    let (delivered_at, given_up_at) = (at("delivered_at")?, at("given_up_at")?);
    let state = match (&delivered_at, &given_up_at) {
        (Some(_), _) => "delivered",
        (None, Some(_)) => "given_up",
        (None, None) => "pending",
    };
    Ok(Some(Record {
        event_id: row.try_get("event_id")?,
        kind: row.try_get("type")?,
        created_at: at("created_at")?.unwrap_or_default(),
        state,
        attempts: row.try_get("attempts")?,
        next_attempt_at: (state == "pending")
            .then(|| at("next_attempt_at"))
            .transpose()?
            .flatten(),
        delivered_at,
        given_up_at,
        last_error: row.try_get("last_error")?,
    }))
}

/// Makes an order's event due again now, delivered or given up alike,
/// with its retries counted afresh; the same event, under the same id.
/// An attempt in progress keeps going, but writes no failure over this.
/// An order without an event is left as it is.
pub async fn resend(
    client: &impl GenericClient,
    user_id: &str,
    order_id: Uuid,
) -> Result<(), DbError> {
    let statement = client
        .prepare_cached(
            "UPDATE order_events
             SET delivered_at = NULL, given_up_at = NULL, attempts = 0, retry_from = now(),
                 next_attempt_at = now(), lease_token = lease_token + 1
             WHERE user_id = $1 AND order_id = $2",
        )
        .await?;
    client.execute(&statement, &[&user_id, &order_id]).await?;
    Ok(())
}

/// Deletes about `batch` events delivered before `before`, oldest first
/// (more only where many were delivered at the same microsecond); returns
/// how many went. Events not delivered yet, or given up, stay: they are
/// still the shop's to receive (`outcomes resend`).
///
/// Two statements, each a range of the index of delivered events
/// (migrations/V12): the delivery time of the batch's last event, then the
/// deletion up to it. The deletion names no row and reads no other table,
/// so on Citus each shard runs it through its own index.
pub async fn delete_delivered(
    client: &impl GenericClient,
    before: SystemTime,
    batch: i64,
) -> Result<u64, DbError> {
    let last = client
        .prepare_cached(
            "SELECT max(delivered_at) FROM (SELECT delivered_at FROM order_events
                                            WHERE delivered_at < $1
                                            ORDER BY delivered_at
                                            LIMIT $2) AS batch",
        )
        .await?;
    let last: Option<SystemTime> = client
        .query_one(&last, &[&before, &batch])
        .await?
        .try_get(0)?;
    let Some(last) = last else {
        return Ok(0);
    };
    let statement = client
        .prepare_cached("DELETE FROM order_events WHERE delivered_at <= $2 AND delivered_at < $1")
        .await?;
    Ok(client.execute(&statement, &[&before, &last]).await?)
}
