//! The `idempotency_keys` table: claim, complete, release, take over, expire.
//!
//! `PRIMARY KEY (user_id, key)` decides every race; nothing here reads and
//! then writes without a condition that the database re-checks. A claim
//! carries a token, and every write after the claim is conditional on still
//! holding it, so a request that lost its lease writes nothing.

use std::time::Duration;

use deadpool_postgres::GenericClient;
use tokio_postgres::types::ToSql;
use uuid::Uuid;

use super::{IdempotencyKey, RequestHash};
use crate::db::DbError;

/// An answer as it was first given, replayed byte for byte: the status, the
/// body, and the headers a client acts on, `Content-Type` and `Location`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredResponse {
    pub status: u16,
    pub body: Vec<u8>,
    pub media: Media,
    /// The order this answer made, which its `Location` names. The key row
    /// holds it already (`order_id`), so only that it is named is stored.
    pub created_order: Option<Uuid>,
}

/// The two kinds of body this service answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Media {
    Json,
    /// RFC 9457 Problem Details.
    Problem,
}

impl Media {
    pub fn content_type(self) -> &'static str {
        match self {
            Media::Json => "application/json",
            Media::Problem => crate::problem::CONTENT_TYPE,
        }
    }
}

impl StoredResponse {
    /// A JSON answer that names no created resource.
    pub fn json(status: u16, body: Vec<u8>) -> Self {
        StoredResponse {
            status,
            body,
            media: Media::Json,
            created_order: None,
        }
    }

    pub fn location(&self) -> Option<String> {
        self.created_order
            .map(|order_id| format!("/orders/{order_id}"))
    }

    /// The answer as a key row keeps it: `response_status`, `response_body`,
    /// `response_is_problem` and `response_locates_order`, in that order.
    pub(crate) fn row_values(&self) -> (i16, &[u8], bool, bool) {
        (
            self.status as i16,
            &self.body,
            self.media == Media::Problem,
            self.created_order.is_some(),
        )
    }
}

/// The right to do the work of one intent, until the lease runs out.
#[derive(Debug, Clone)]
pub struct Claim {
    pub user_id: String,
    pub key: IdempotencyKey,
    /// Fences every write after the claim: 62 random bits, new per claim.
    pub token: i64,
    /// The order an earlier holder of this key made, when this claim is a
    /// takeover: resume it instead of making another.
    pub order_id: Option<Uuid>,
    pub kind: ClaimKind,
}

/// How a claim was won.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ClaimKind {
    /// The key was new.
    First,
    /// The key was past its TTL: a new intent under an old key.
    Expired,
    /// The key was in progress past its lease: this claim finishes the intent.
    Abandoned,
}

/// What the key row says about a request.
#[derive(Debug)]
pub enum Begin {
    /// This request does the work.
    Claimed(Claim),
    /// The intent has an answer: give it again.
    Replay(StoredResponse),
    /// Another request holds the intent right now.
    InProgress,
    /// The key was first used for a different request.
    KeyReused,
}

/// How a piece of work ended, as the idempotency glue needs to know it.
#[derive(Debug)]
pub enum Finished {
    /// An answer for the glue to store and send.
    Answer(StoredResponse),
    /// An answer the work already stored, atomically with its own writes.
    Stored(StoredResponse),
    /// The claim was lost to a takeover before the answer could be stored.
    Fenced,
}

/// Lifetimes of a key: how long it means the same intent, and how long an
/// in-progress claim belongs to its request.
#[derive(Debug, Clone, Copy)]
pub struct KeyPolicy {
    pub ttl: Duration,
    pub lease: Duration,
}

/// Claims the key for this request, or says why not. The first statement is
/// the insert, and the same statement reads the row a lost insert met, so
/// that a replay costs one round trip, not two. Call it outside any
/// transaction: it turns off the synchronous commit of the one it runs in.
#[tracing::instrument(skip_all, fields(user_id, key = %key))]
pub async fn begin(
    client: &impl GenericClient,
    policy: KeyPolicy,
    user_id: &str,
    key: &IdempotencyKey,
    hash: &RequestHash,
) -> Result<Begin, DbError> {
    let mut claim = Claim {
        user_id: user_id.to_owned(),
        key: key.clone(),
        token: new_token(),
        order_id: None,
        kind: ClaimKind::First,
    };
    // A row can vanish (cleanup) or change (a takeover) between statements;
    // each pass re-reads it, and a few passes settle any interleaving.
    for _ in 0..3 {
        // The outer SELECT sees the table as it was when the statement began:
        // never the row this insert made, and not a row that a concurrent
        // request committed a moment later (the insert waits for it and
        // loses; the next pass reads it).
        //
        // The insert commits without waiting for its WAL flush
        // (`synchronous_commit` off for this transaction only): nothing
        // outside the database acts on a claim until the order statement
        // commits, and that commit waits for a flush that covers this
        // insert's record too. A crash in between loses a claim that left
        // nothing behind, so the retry starts afresh, as after a release.
        let insert = client
            .prepare_cached(
                "WITH inserted AS (
                     INSERT INTO idempotency_keys (user_id, key, request_hash, claim_token, lease_expires_at)
                     VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5))
                     ON CONFLICT (user_id, key) DO NOTHING
                     RETURNING 1
                 )
                 SELECT set_config('synchronous_commit', 'off', true) AS async_commit,
                        EXISTS (SELECT 1 FROM inserted) AS won,
                        k.request_hash, k.claim_token, k.response_status, k.response_body,
                        k.response_is_problem, k.response_locates_order, k.order_id,
                        k.created_at <= now() - make_interval(secs => $6) AS expired,
                        k.lease_expires_at <= now() AS lease_over
                 FROM (VALUES (1)) AS one (x)
                 LEFT JOIN idempotency_keys k ON k.user_id = $1 AND k.key = $2",
            )
            .await?;
        let row = client
            .query_one(
                &insert,
                &[
                    &user_id,
                    &key.as_str(),
                    &hash.as_bytes(),
                    &claim.token,
                    &policy.lease.as_secs_f64(),
                    &policy.ttl.as_secs_f64(),
                ],
            )
            .await?;
        if row.try_get("won")? {
            return Ok(Begin::Claimed(claim));
        }
        let Some(row) = key_row(&row)? else {
            continue;
        };
        if row.expired {
            // Older than the TTL: a new intent, as if the row were absent.
            if take_expired(client, policy, &claim, hash, row.token).await? {
                claim.kind = ClaimKind::Expired;
                return Ok(Begin::Claimed(claim));
            }
            continue;
        }
        if row.hash != hash.as_bytes() {
            return Ok(Begin::KeyReused);
        }
        if let Some(response) = row.response {
            return Ok(Begin::Replay(response));
        }
        if !row.lease_over {
            return Ok(Begin::InProgress);
        }
        // The holder's lease ran out (it crashed or stalled): finish its intent.
        if let Some(order_id) = take_abandoned(client, policy, &claim, row.token).await? {
            claim.order_id = order_id;
            claim.kind = ClaimKind::Abandoned;
            return Ok(Begin::Claimed(claim));
        }
    }
    Ok(Begin::InProgress)
}

/// What the key row says now, without claiming anything: for a request
/// whose claim was fenced off, or that the Redis gate turned away. A row that
/// is missing, expired or abandoned belongs to whoever holds the intent now.
pub async fn current(
    client: &impl GenericClient,
    policy: KeyPolicy,
    user_id: &str,
    key: &IdempotencyKey,
    hash: &RequestHash,
) -> Result<Begin, DbError> {
    Ok(match read(client, policy, user_id, key).await? {
        Some(row) if !row.expired && row.hash != hash.as_bytes() => Begin::KeyReused,
        Some(KeyRow {
            response: Some(response),
            expired: false,
            ..
        }) => Begin::Replay(response),
        _ => Begin::InProgress,
    })
}

/// Stores the answer as the last act of the work, if the claim still holds.
/// Returns false when it was fenced off (another request took the key over).
pub async fn complete(
    client: &impl GenericClient,
    claim: &Claim,
    response: &StoredResponse,
) -> Result<bool, DbError> {
    store_response(
        client,
        "UPDATE idempotency_keys
         SET response_status = $4, response_body = $5, response_is_problem = $6,
             response_locates_order = $7
         WHERE user_id = $1 AND key = $2 AND claim_token = $3 AND response_status IS NULL",
        &claim.user_id,
        claim.key.as_str(),
        &claim.token,
        response,
    )
    .await
}

/// Stores the outcome that reconciliation found for an order on the key that
/// made it, if that key still belongs to the same intent and has no answer.
pub async fn complete_for_order(
    client: &impl GenericClient,
    user_id: &str,
    key: &str,
    order_id: Uuid,
    response: &StoredResponse,
) -> Result<bool, DbError> {
    store_response(
        client,
        "UPDATE idempotency_keys
         SET response_status = $4, response_body = $5, response_is_problem = $6,
             response_locates_order = $7
         WHERE user_id = $1 AND key = $2 AND order_id = $3 AND response_status IS NULL",
        user_id,
        key,
        &order_id,
        response,
    )
    .await
}

/// Runs one of the two conditional stores above; `fence` is the claim
/// token or the order id its condition names.
async fn store_response(
    client: &impl GenericClient,
    sql: &str,
    user_id: &str,
    key: &str,
    fence: &(dyn ToSql + Sync),
    response: &StoredResponse,
) -> Result<bool, DbError> {
    let statement = client.prepare_cached(sql).await?;
    let (status, body, is_problem, locates_order) = response.row_values();
    let stored = client
        .execute(
            &statement,
            &[
                &user_id,
                &key,
                fence,
                &status,
                &body,
                &is_problem,
                &locates_order,
            ],
        )
        .await?;
    Ok(stored == 1)
}

/// Gives the key back after a failure that left nothing durable behind (no
/// order linked), so that a retry starts afresh. Once an order exists the row
/// stays in progress until that order has an outcome.
pub async fn release(client: &impl GenericClient, claim: &Claim) -> Result<bool, DbError> {
    let statement = client
        .prepare_cached(
            "DELETE FROM idempotency_keys
             WHERE user_id = $1 AND key = $2 AND claim_token = $3
               AND response_status IS NULL AND order_id IS NULL",
        )
        .await?;
    let released = client
        .execute(
            &statement,
            &[&claim.user_id, &claim.key.as_str(), &claim.token],
        )
        .await?;
    Ok(released == 1)
}

/// Deletes up to `batch` rows older than the TTL, oldest first; returns how
/// many went. Small batches keep each statement short, so traffic never
/// waits on it. No row locks are taken before the delete (they would write
/// every row twice). A row that a request restarts meanwhile
/// (`take_expired`, which sets `created_at`) survives because the expiry is
/// part of the delete's own condition, which PostgreSQL rechecks on the
/// row's latest version (not every release rechecks a `ctid` match).
pub async fn delete_expired(
    client: &impl GenericClient,
    ttl: Duration,
    batch: i64,
) -> Result<u64, DbError> {
    let statement = client
        .prepare_cached(
            "DELETE FROM idempotency_keys
             WHERE ctid = ANY (ARRAY(
                 SELECT ctid FROM idempotency_keys
                 WHERE created_at < now() - make_interval(secs => $1)
                 ORDER BY created_at
                 LIMIT $2))
               AND created_at < now() - make_interval(secs => $1)",
        )
        .await?;
    Ok(client
        .execute(&statement, &[&ttl.as_secs_f64(), &batch])
        .await?)
}

struct KeyRow {
    hash: Vec<u8>,
    token: i64,
    response: Option<StoredResponse>,
    expired: bool,
    lease_over: bool,
}

async fn read(
    client: &impl GenericClient,
    policy: KeyPolicy,
    user_id: &str,
    key: &IdempotencyKey,
) -> Result<Option<KeyRow>, DbError> {
    let statement = client
        .prepare_cached(
            "SELECT request_hash, claim_token, response_status, response_body,
                    response_is_problem, response_locates_order, order_id,
                    created_at <= now() - make_interval(secs => $3) AS expired,
                    lease_expires_at <= now() AS lease_over
             FROM idempotency_keys
             WHERE user_id = $1 AND key = $2",
        )
        .await?;
    match client
        .query_opt(
            &statement,
            &[&user_id, &key.as_str(), &policy.ttl.as_secs_f64()],
        )
        .await?
    {
        Some(row) => key_row(&row),
        None => Ok(None),
    }
}

/// A claim token: 62 random bits (a v4 UUID's lower half), enough that two
/// claims of one key never share one.
fn new_token() -> i64 {
    Uuid::new_v4().as_u64_pair().1 as i64
}

/// A key row as `read` and `begin` select it; `None` when the columns are
/// NULL (`begin` found no row it could see).
fn key_row(row: &tokio_postgres::Row) -> Result<Option<KeyRow>, DbError> {
    let Some(hash) = row.try_get::<_, Option<Vec<u8>>>("request_hash")? else {
        return Ok(None);
    };
    let status: Option<i16> = row.try_get("response_status")?;
    let flag = |column: &str| -> Result<bool, DbError> {
        Ok(row.try_get::<_, Option<bool>>(column)? == Some(true))
    };
    let response = match status {
        Some(status) => Some(StoredResponse {
            status: u16::try_from(status).unwrap_or(500),
            body: row
                .try_get::<_, Option<Vec<u8>>>("response_body")?
                .unwrap_or_default(),
            media: if flag("response_is_problem")? {
                Media::Problem
            } else {
                Media::Json
            },
            created_order: if flag("response_locates_order")? {
                row.try_get("order_id")?
            } else {
                None
            },
        }),
        None => None,
    };
    Ok(Some(KeyRow {
        hash,
        token: row.try_get("claim_token")?,
        response,
        expired: row.try_get("expired")?,
        lease_over: row.try_get("lease_over")?,
    }))
}

/// Restarts a row past its TTL as a new intent. One conditional update
/// decides between racing requests: it matches only the row as it was read.
async fn take_expired(
    client: &impl GenericClient,
    policy: KeyPolicy,
    claim: &Claim,
    hash: &RequestHash,
    seen_token: i64,
) -> Result<bool, DbError> {
    let statement = client
        .prepare_cached(
            "UPDATE idempotency_keys
             SET request_hash = $5, claim_token = $3,
                 lease_expires_at = now() + make_interval(secs => $6),
                 order_id = NULL, response_status = NULL, response_body = NULL,
                 response_is_problem = NULL, response_locates_order = NULL, created_at = now()
             WHERE user_id = $1 AND key = $2 AND claim_token = $4
               AND created_at <= now() - make_interval(secs => $7)",
        )
        .await?;
    let taken = client
        .execute(
            &statement,
            &[
                &claim.user_id,
                &claim.key.as_str(),
                &claim.token,
                &seen_token,
                &hash.as_bytes(),
                &policy.lease.as_secs_f64(),
                &policy.ttl.as_secs_f64(),
            ],
        )
        .await?;
    Ok(taken == 1)
}

/// Takes over an in-progress row whose lease ran out; the new claim inherits
/// the intent. Returns `Some(order_id)` when taken: the order is read in the
/// same statement, so a link the old holder made a moment ago is not missed.
async fn take_abandoned(
    client: &impl GenericClient,
    policy: KeyPolicy,
    claim: &Claim,
    seen_token: i64,
) -> Result<Option<Option<Uuid>>, DbError> {
    let statement = client
        .prepare_cached(
            "UPDATE idempotency_keys
             SET claim_token = $3, lease_expires_at = now() + make_interval(secs => $5)
             WHERE user_id = $1 AND key = $2 AND claim_token = $4
               AND response_status IS NULL AND lease_expires_at <= now()
             RETURNING order_id",
        )
        .await?;
    let taken = client
        .query_opt(
            &statement,
            &[
                &claim.user_id,
                &claim.key.as_str(),
                &claim.token,
                &seen_token,
                &policy.lease.as_secs_f64(),
            ],
        )
        .await?;
    Ok(match taken {
        Some(row) => Some(row.try_get("order_id")?),
        None => None,
    })
}
