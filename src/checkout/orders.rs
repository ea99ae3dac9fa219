//! Orders: one per intent, written (`payment_pending`) before Payrail is
//! called, settled to `paid` or `declined` by the request that made it, by a
//! request that took its key over, or by reconciliation. No database
//! connection is held while Payrail is being called.

use deadpool_postgres::{GenericClient, Pool};
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use tokio_postgres::Row;
use uuid::Uuid;

use crate::db::DbError;
use crate::idempotency::{store, Claim, Finished, StoredResponse};
use crate::payrail::{self, Charge, ChargeOutcome};
use crate::problem::Problem;

/// Every order is charged in this currency.
pub const CURRENCY: &str = "USD";
/// More holds than this in one order is not a checkout a person makes.
const MAX_HOLDS: usize = 50;

/// The body of `POST /orders`, as parsed before the key is touched.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct OrderRequest {
    /// The buyer's live holds to pay for, each once.
    #[schema(min_items = 1, max_items = 50)]
    pub hold_ids: Vec<i64>,
    /// `pm_card_visa`, `pm_card_declined`, … (letters, digits, `_`).
    #[schema(
        pattern = "^pm_[A-Za-z0-9_]+$",
        max_length = 64,
        example = "pm_card_visa"
    )]
    pub payment_method: String,
}

/// An order as the buyer sees it (the 201 body and `GET /orders/{id}`).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Order {
    pub order_id: Uuid,
    /// `paid`, `declined` or `payment_pending`.
    #[schema(schema_with = status_schema)]
    pub status: String,
    pub amount_cents: i64,
    #[schema(example = "USD")]
    pub currency: String,
    pub hold_ids: Vec<i64>,
    /// The seat labels, in the order of `hold_ids`.
    pub seats: Vec<String>,
    /// Payrail's charge id; null until Payrail has answered.
    #[schema(required = true)]
    pub charge_id: Option<String>,
    /// RFC 3339, UTC.
    #[schema(format = DateTime)]
    pub created_at: String,
    #[serde(skip)]
    payment_method: String,
    #[serde(skip)]
    pub user_id: String,
    #[serde(skip)]
    pub idempotency_key: String,
}

/// The order statuses, for the OpenAPI document.
fn status_schema() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::Type::String)
        .enum_values(Some(["paid", "declined", "payment_pending"]))
        .build()
}

const COLUMNS: &str = "order_id, user_id, status, amount_cents, currency, payment_method, \
                       hold_ids, seats, charge_id, idempotency_key, created_at";

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
            created_at: super::rfc3339(row.try_get::<_, OffsetDateTime>("created_at")?),
            payment_method: row.try_get("payment_method")?,
            user_id: row.try_get("user_id")?,
            idempotency_key: row.try_get("idempotency_key")?,
        })
    }

    pub fn is_pending(&self) -> bool {
        self.status == "payment_pending"
    }

    /// What Payrail is asked: the same bytes on every attempt and every
    /// restart, since all of it comes from the order row.
    pub fn charge(&self) -> Charge {
        Charge {
            amount_cents: self.amount_cents,
            currency: self.currency.clone(),
            payment_method: self.payment_method.clone(),
            reference: self.order_id,
        }
    }

    /// The answer to the click that made this order, once it has an outcome:
    /// 201 with the order, or 402 `payment-declined`.
    pub fn answer(&self) -> StoredResponse {
        if self.status == "declined" {
            return Problem::PaymentDeclined {
                order_id: self.order_id,
            }
            .to_response();
        }
        StoredResponse {
            created_order: Some(self.order_id),
            ..StoredResponse::json(201, serde_json::to_vec(self).unwrap_or_default())
        }
    }
}

/// Does the work of a claimed `POST /orders`: makes the order (or resumes
/// the one an earlier holder of the key made), charges it, settles it.
#[tracing::instrument(skip_all, fields(user_id = %claim.user_id, key = %claim.key))]
pub async fn place(
    pool: &Pool,
    payrail: &payrail::Client,
    claim: &Claim,
    request: &OrderRequest,
) -> Result<Finished, Problem> {
    let order = match claim.order_id {
        Some(order_id) => {
            let client = pool.get().await?;
            load(&client, order_id).await?.ok_or_else(|| {
                Problem::Internal(anyhow::anyhow!(
                    "order {order_id} of a claimed key is missing"
                ))
            })?
        }
        None => {
            validate(request)?;
            // Fail before writing anything while Payrail is known to be down:
            // the key is then released and a retry starts afresh.
            payrail.ready()?;
            let client = pool.get().await?;
            match create(&client, claim, request).await? {
                Created::Order(order) => *order,
                Created::HoldsUnavailable => return Err(Problem::HoldUnavailable),
                Created::Fenced => return Ok(Finished::Fenced),
            }
        }
    };
    if !order.is_pending() {
        return Ok(Finished::Answer(order.answer()));
    }
    let outcome = payrail.charge(order.order_id, &order.charge()).await?;
    settle_claimed(pool, order, &outcome, claim).await
}

/// The usual end of a click, in one statement (one round trip, one commit):
/// settles the order and stores its answer on the claimed key, the answer
/// only while the claim holds. The order row is locked first, as `settle`
/// and reconciliation do, so whoever comes second waits there holding
/// nothing: no deadlock. The answer is made from the order in hand, exactly
/// as `settle` would make it from the settled row. A claim lost meanwhile
/// leaves the order settled with Payrail's answer, as reconciliation would,
/// and stores nothing. An order someone else settled first goes the long
/// way, through `settle`.
async fn settle_claimed(
    pool: &Pool,
    mut order: Order,
    outcome: &ChargeOutcome,
    claim: &Claim,
) -> Result<Finished, Problem> {
    let (status, charge_id) = decision(outcome);
    order.status = status.to_owned();
    order.charge_id = charge_id.cloned();
    let answer = order.answer();
    let (answer_status, answer_body, is_problem, locates_order) = answer.row_values();
    let client = pool.get().await?;
    let statement = client
        .prepare_cached(
            "WITH settled AS (
                 UPDATE orders SET status = $2, charge_id = $3, updated_at = now()
                 WHERE order_id = $1 AND status = 'payment_pending'
                 RETURNING 1
             ), released AS (
                 UPDATE holds SET order_id = NULL
                 WHERE order_id = $1 AND $2 = 'declined' AND EXISTS (SELECT 1 FROM settled)
             ), stored AS (
                 UPDATE idempotency_keys
                 SET response_status = $7, response_body = $8, response_is_problem = $9,
                     response_locates_order = $10
                 WHERE user_id = $4 AND key = $5 AND claim_token = $6
                   AND response_status IS NULL AND EXISTS (SELECT 1 FROM settled)
                 RETURNING 1
             )
             SELECT EXISTS (SELECT 1 FROM settled) AS settled,
                    EXISTS (SELECT 1 FROM stored) AS stored",
        )
        .await?;
    let row = client
        .query_one(
            &statement,
            &[
                &order.order_id,
                &status,
                &charge_id,
                &claim.user_id,
                &claim.key.as_str(),
                &claim.token,
                &answer_status,
                &answer_body,
                &is_problem,
                &locates_order,
            ],
        )
        .await?;
    drop(client);
    if !row.try_get::<_, bool>("settled")? {
        return settle(pool, order.order_id, outcome, Some(claim)).await;
    }
    if row.try_get::<_, bool>("stored")? {
        Ok(Finished::Stored(answer))
    } else {
        Ok(Finished::Fenced)
    }
}

/// Records Payrail's decision on the order (giving a declined order's holds
/// back) and stores the answer on the order's key, in one transaction. With
/// a claim, the answer is stored only while the claim holds; without one
/// (reconciliation), only on a key row that still belongs to this order.
pub async fn settle(
    pool: &Pool,
    order_id: Uuid,
    outcome: &ChargeOutcome,
    claim: Option<&Claim>,
) -> Result<Finished, Problem> {
    let (status, charge_id) = decision(outcome);
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let statement = tx.prepare_cached(&settle_sql()).await?;
    let order = match tx
        .query_opt(&statement, &[&order_id, &status, &charge_id])
        .await?
    {
        Some(row) => Order::from_row(&row)?,
        // Someone else settled it first, with the same answer from Payrail.
        None => load(&tx, order_id).await?.ok_or_else(|| {
            Problem::Internal(anyhow::anyhow!("order {order_id} vanished while settling"))
        })?,
    };
    let answer = order.answer();
    let stored = match claim {
        Some(claim) => store::complete(&tx, claim, &answer).await?,
        None => {
            store::complete_for_order(
                &tx,
                &order.user_id,
                &order.idempotency_key,
                order_id,
                &answer,
            )
            .await?
        }
    };
    if claim.is_some() && !stored {
        // Fenced off: this request no longer owns the key, so it writes nothing.
        tx.rollback().await?;
        return Ok(Finished::Fenced);
    }
    tx.commit().await?;
    Ok(Finished::Stored(answer))
}

/// The order status and charge id that Payrail's decision means.
fn decision(outcome: &ChargeOutcome) -> (&'static str, Option<&String>) {
    match outcome {
        ChargeOutcome::Succeeded { charge_id } => ("paid", Some(charge_id)),
        ChargeOutcome::Declined { charge_id } => ("declined", charge_id.as_ref()),
    }
}

/// Settles a pending order (giving a declined order's holds back) and
/// returns it; no row when it was settled already.
fn settle_sql() -> String {
    format!(
        "WITH settled AS (
             UPDATE orders SET status = $2, charge_id = $3, updated_at = now()
             WHERE order_id = $1 AND status = 'payment_pending'
             RETURNING {COLUMNS}
         ), released AS (
             UPDATE holds SET order_id = NULL
             WHERE order_id = $1 AND $2 = 'declined' AND EXISTS (SELECT 1 FROM settled)
         )
         SELECT {COLUMNS} FROM settled"
    )
}

/// An order by id, whoever owns it.
pub async fn load(client: &impl GenericClient, order_id: Uuid) -> Result<Option<Order>, DbError> {
    let statement = client
        .prepare_cached(&format!("SELECT {COLUMNS} FROM orders WHERE order_id = $1"))
        .await?;
    client
        .query_opt(&statement, &[&order_id])
        .await?
        .map(|row| Order::from_row(&row))
        .transpose()
}

/// A buyer's own order; another buyer's is as good as absent.
pub async fn find(
    client: &impl GenericClient,
    buyer: &str,
    order_id: Uuid,
) -> Result<Option<Order>, DbError> {
    Ok(load(client, order_id)
        .await?
        .filter(|order| order.user_id == buyer))
}

/// 422 `invalid-order` for a well-formed body that asks for the impossible.
fn validate(request: &OrderRequest) -> Result<(), Problem> {
    let holds = &request.hold_ids;
    if holds.is_empty() {
        return Err(Problem::InvalidOrder(
            "hold_ids must name at least one hold",
        ));
    }
    if holds.len() > MAX_HOLDS {
        return Err(Problem::InvalidOrder("hold_ids may name at most 50 holds"));
    }
    let mut sorted = holds.clone();
    sorted.sort_unstable();
    sorted.dedup();
    if sorted.len() != holds.len() {
        return Err(Problem::InvalidOrder(
            "hold_ids names a hold more than once",
        ));
    }
    let method = &request.payment_method;
    let valid_method = method.len() <= 64
        && method.strip_prefix("pm_").is_some_and(|rest| {
            !rest.is_empty() && rest.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'_')
        });
    if !valid_method {
        return Err(Problem::InvalidOrder(
            "payment_method must look like pm_… (letters, digits, '_'; at most 64)",
        ));
    }
    Ok(())
}

enum Created {
    Order(Box<Order>),
    HoldsUnavailable,
    /// The claim on the key was lost before the order could be made.
    Fenced,
}

/// Makes the order in one statement: the key row is locked and linked to the
/// order (so a takeover resumes it and a fenced-off request cannot make a
/// second one), the buyer's live holds are locked in id order and claimed,
/// and the order is written, all or nothing.
async fn create(
    client: &impl GenericClient,
    claim: &Claim,
    request: &OrderRequest,
) -> Result<Created, DbError> {
    let order_id = Uuid::new_v4();
    let statement = client
        .prepare_cached(
            "WITH fence AS (
                 SELECT 1 FROM idempotency_keys
                 WHERE user_id = $3 AND key = $4 AND claim_token = $5 AND order_id IS NULL
                 FOR UPDATE
             ), held AS (
                 SELECT h.hold_id, s.label, s.price_cents
                 FROM holds h JOIN seats s ON s.seat_id = h.seat_id
                 WHERE h.hold_id = ANY ($2) AND h.user_id = $3
                   AND h.order_id IS NULL AND h.expires_at > now()
                 ORDER BY h.hold_id
                 FOR UPDATE OF h
             ), decision AS (
                 SELECT EXISTS (SELECT 1 FROM fence) AS fenced_in,
                        (SELECT count(*) FROM held) = cardinality($2::bigint[]) AS all_held
             ), claimed AS (
                 UPDATE holds SET order_id = $1
                 WHERE hold_id IN (SELECT hold_id FROM held)
                   AND (SELECT fenced_in AND all_held FROM decision)
             ), linked AS (
                 UPDATE idempotency_keys SET order_id = $1
                 WHERE user_id = $3 AND key = $4 AND claim_token = $5
                   AND (SELECT fenced_in AND all_held FROM decision)
             ), inserted AS (
                 INSERT INTO orders (order_id, user_id, status, amount_cents, currency,
                                     payment_method, hold_ids, seats, idempotency_key)
                 SELECT $1, $3, 'payment_pending', sum(price_cents)::bigint, $6, $7, $2,
                        array_agg(label ORDER BY array_position($2, hold_id)), $4
                 FROM held
                 HAVING (SELECT fenced_in AND all_held FROM decision)
                 RETURNING created_at, amount_cents, seats
             )
             SELECT d.fenced_in, d.all_held, i.created_at, i.amount_cents, i.seats
             FROM decision d LEFT JOIN inserted i ON true",
        )
        .await?;
    let row = client
        .query_one(
            &statement,
            &[
                &order_id,
                &request.hold_ids,
                &claim.user_id,
                &claim.key.as_str(),
                &claim.token,
                &CURRENCY,
                &request.payment_method,
            ],
        )
        .await?;
    if !row.try_get::<_, bool>("fenced_in")? {
        return Ok(Created::Fenced);
    }
    if !row.try_get::<_, bool>("all_held")? {
        return Ok(Created::HoldsUnavailable);
    }
    Ok(Created::Order(Box::new(Order {
        order_id,
        status: "payment_pending".to_owned(),
        amount_cents: row.try_get("amount_cents")?,
        currency: CURRENCY.to_owned(),
        hold_ids: request.hold_ids.clone(),
        seats: row.try_get("seats")?,
        charge_id: None,
        created_at: super::rfc3339(row.try_get::<_, OffsetDateTime>("created_at")?),
        payment_method: request.payment_method.clone(),
        user_id: claim.user_id.clone(),
        idempotency_key: claim.key.as_str().to_owned(),
    })))
}

/// The order flow with the idempotency key left out, for the checkout
/// benchmark only (`benches/checkout.rs` serves it on a route of its own;
/// the service has no such route). It runs what [`place`] runs for a first
/// click (validation, the holds claim and order insert of [`create`], the
/// Payrail call, the settlement of [`settle`]) minus every statement and
/// clause that touches `idempotency_keys`: no key insert, no fence, no link,
/// no stored answer, so no transaction around the settlement. The
/// difference in throughput is what the key costs.
#[doc(hidden)]
pub mod without_key {
    use super::*;

    /// `create`'s statement without the `fence` and `linked` CTEs.
    const CREATE: &str = "WITH held AS (
             SELECT h.hold_id, s.label, s.price_cents
             FROM holds h JOIN seats s ON s.seat_id = h.seat_id
             WHERE h.hold_id = ANY ($2) AND h.user_id = $3
               AND h.order_id IS NULL AND h.expires_at > now()
             ORDER BY h.hold_id
             FOR UPDATE OF h
         ), decision AS (
             SELECT (SELECT count(*) FROM held) = cardinality($2::bigint[]) AS all_held
         ), claimed AS (
             UPDATE holds SET order_id = $1
             WHERE hold_id IN (SELECT hold_id FROM held)
               AND (SELECT all_held FROM decision)
         ), inserted AS (
             INSERT INTO orders (order_id, user_id, status, amount_cents, currency,
                                 payment_method, hold_ids, seats, idempotency_key)
             SELECT $1, $3, 'payment_pending', sum(price_cents)::bigint, $4, $5, $2,
                    array_agg(label ORDER BY array_position($2, hold_id)), ''
             FROM held
             HAVING (SELECT all_held FROM decision)
             RETURNING created_at, amount_cents, seats
         )
         SELECT d.all_held, i.created_at, i.amount_cents, i.seats
         FROM decision d LEFT JOIN inserted i ON true";

    /// Makes, charges and settles an order for `user_id`'s holds; the answer
    /// a first click would get (201 or 402), or the problem.
    pub async fn place(
        pool: &Pool,
        payrail: &payrail::Client,
        user_id: &str,
        request: &OrderRequest,
    ) -> Result<StoredResponse, Problem> {
        validate(request)?;
        payrail.ready()?;
        let order_id = Uuid::new_v4();
        let row = {
            let client = pool.get().await?;
            let statement = client.prepare_cached(CREATE).await?;
            client
                .query_one(
                    &statement,
                    &[
                        &order_id,
                        &request.hold_ids,
                        &user_id,
                        &CURRENCY,
                        &request.payment_method,
                    ],
                )
                .await?
        };
        if !row.try_get::<_, bool>("all_held")? {
            return Err(Problem::HoldUnavailable);
        }
        let charge = Charge {
            amount_cents: row.try_get("amount_cents")?,
            currency: CURRENCY.to_owned(),
            payment_method: request.payment_method.clone(),
            reference: order_id,
        };
        let outcome = payrail.charge(order_id, &charge).await?;
        let (status, charge_id) = decision(&outcome);
        let client = pool.get().await?;
        let statement = client.prepare_cached(&settle_sql()).await?;
        let row = client
            .query_one(&statement, &[&order_id, &status, &charge_id])
            .await?;
        Ok(Order::from_row(&row)?.answer())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(hold_ids: Vec<i64>, payment_method: &str) -> OrderRequest {
        OrderRequest {
            hold_ids,
            payment_method: payment_method.to_owned(),
        }
    }

    #[test]
    fn semantic_mistakes_are_invalid_orders() {
        let cases = [
            (request(vec![], "pm_card_visa"), "no holds"),
            (request(vec![1, 1], "pm_card_visa"), "duplicate holds"),
            (
                request((1..=51).collect(), "pm_card_visa"),
                "too many holds",
            ),
            (request(vec![1], "card_visa"), "no pm_ prefix"),
            (request(vec![1], "pm_"), "nothing after pm_"),
            (request(vec![1], "pm_card visa"), "space in the method"),
            (
                request(vec![1], &format!("pm_{}", "x".repeat(62))),
                "too long",
            ),
        ];
        for (request, why) in cases {
            assert!(
                matches!(validate(&request), Err(Problem::InvalidOrder(_))),
                "{why}"
            );
        }
        assert!(validate(&request(vec![3, 1, 2], "pm_card_visa")).is_ok());
    }
}
