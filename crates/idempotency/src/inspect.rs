//! Key tooling for support and operations: what one key holds
//! ([`inspect`]), forgetting a key that is safe to forget ([`purge`]), and
//! the table's numbers ([`stats`]).
//!
//! A key is safe to forget once its intent is over: it has an answer, or it
//! is past its TTL (the engine already treats it as absent), and the effect
//! it links, if any, is not still settling. Forgetting it makes the next
//! request with it a new intent. Forgetting a key in progress, or one whose
//! effect is still settling (a payment without an answer yet), would let a
//! retry of the same click make a second effect: [`purge`] refuses both, and
//! the database decides it, not the caller: the `DELETE` re-checks all of it.
//! So, until it expires, does an answered key whose answer is all that stops
//! its retry from acting again (a declined payment). The caller's
//! settlement says both on the key row (`idempotency_settled`), so every
//! condition is the row's own.
//!
//! Every statement that touches one key names `user_id` and `key`. A purge
//! notifies every instance's answer cache in its transaction.

use std::time::{Duration, SystemTime};

use deadpool_postgres::GenericClient;
use tokio_postgres::Row;

use crate::cache::{payload, CHANNEL};
use crate::claim::Policy;
use crate::error::Error;
use crate::key::IdempotencyKey;
use crate::response::StoredResponse;

/// Where a key that has a row is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyState {
    /// No answer yet: a request holds it, or held it and a retry (or the
    /// job that settles its effect) will finish it.
    InProgress,
    /// The intent's answer is stored; a retry gets it replayed.
    Answered,
    /// Older than the TTL: the next request with it is a new intent, answered
    /// or not, even before the cleanup deletes the row.
    Expired,
}

impl KeyState {
    pub fn as_str(self) -> &'static str {
        match self {
            KeyState::InProgress => "in_progress",
            KeyState::Answered => "answered",
            KeyState::Expired => "expired",
        }
    }
}

/// What the row of one key holds, as the database saw it (its clock decides
/// expiry and the lease).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyReport {
    pub state: KeyState,
    pub created_at: SystemTime,
    /// `created_at` + the TTL.
    pub expires_at: SystemTime,
    /// Until when the request that claimed it may finish it alone; `None`
    /// once answered (the answer's write clears the claim).
    pub lease_expires_at: Option<SystemTime>,
    /// The lease ran out (false once answered).
    pub lease_expired: bool,
    /// The id of the effect the intent made that settles later, while it is
    /// linked (until the answer is stored).
    pub effect: Option<String>,
    /// The stored answer (status, headers, body), once there is one.
    pub response: Option<StoredResponse>,
}

/// The report's columns, for a `SELECT` or a `RETURNING` on the key table
/// named `k`; `$3` is the TTL in seconds.
const REPORT: &str = "k.created_at,
    k.created_at + make_interval(secs => $3) AS expires_at,
    k.lease_expires_at,
    COALESCE(k.lease_expires_at <= now(), false) AS lease_expired,
    k.created_at <= now() - make_interval(secs => $3) AS expired,
    k.effect, k.response_status, k.response_content_type,
    k.response_location, k.response_body";

impl KeyReport {
    fn from_row(row: &Row) -> Result<Self, Error> {
        let response = StoredResponse::of_row(row)?;
        let state = if row.try_get("expired")? {
            KeyState::Expired
        } else if response.is_some() {
            KeyState::Answered
        } else {
            KeyState::InProgress
        };
        Ok(Self {
            state,
            created_at: row.try_get("created_at")?,
            expires_at: row.try_get("expires_at")?,
            lease_expires_at: row.try_get("lease_expires_at")?,
            lease_expired: row.try_get("lease_expired")?,
            effect: row.try_get("effect")?,
            response,
        })
    }
}

/// What the key of `user_id` holds now; `None` when it has no row (never
/// used, purged, or deleted by the cleanup).
pub async fn inspect(
    client: &impl GenericClient,
    policy: Policy,
    user_id: &str,
    key: &IdempotencyKey,
) -> Result<Option<KeyReport>, Error> {
    let sql = format!(
        "SELECT {REPORT} FROM idempotency_keys AS k
         WHERE k.user_id = $1 AND k.key = $2"
    );
    client
        .query_opt(&sql, &[&user_id, &key.as_str(), &ttl_secs(policy)])
        .await?
        .map(|row| KeyReport::from_row(&row))
        .transpose()
}

/// The one key of a statement (`k`) is answered, and its answer is all that
/// stops a retry of its click from acting again (`keep_answer`, from the
/// caller's settlement): until it expires, a purge keeps it.
macro_rules! keeps_answer {
    () => {
        "(k.response_status IS NOT NULL AND k.keep_answer)"
    };
}

/// Why a key was not purged.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PurgeRefusal {
    /// No answer yet and within its TTL: a request holds it, or a retry will
    /// take it over and finish its intent.
    #[error("the key is in progress: its intent has no answer yet, and a retry would finish it")]
    InProgress,
    /// The effect it links is still settling: forgotten now, a retry of the
    /// same click would make a second effect next to the first.
    #[error("the effect the key links is still settling")]
    Settling,
    /// Answered, within its TTL, and its answer is what stops a retry of
    /// the click from acting again (a declined payment, as its settlement
    /// said).
    #[error("the key's answer is what keeps a retry of its click from acting again")]
    Rearms,
}

/// How a purge ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Purge {
    /// The row is gone; what it held.
    Purged(KeyReport),
    /// The row stays; why, and what it holds.
    Refused(PurgeRefusal, KeyReport),
    /// There was no row to purge.
    Absent,
}

/// Deletes the key of `user_id` if it is answered or expired, the effect
/// it links is not still settling, and (while it is live) its answer is not
/// all that stops its click from acting again; else says why not.
///
/// One transaction. It first locks the key row and reads it, so that no
/// request can change it meanwhile (link an effect, take it over, store an
/// answer), and so that the `DELETE` that follows starts after any such
/// change has committed. The `DELETE` then decides, re-checking every
/// condition in the database; when it deletes nothing, a read of the
/// still-locked row says why.
pub async fn purge(
    client: &mut impl GenericClient,
    policy: Policy,
    user_id: &str,
    key: &IdempotencyKey,
) -> Result<Purge, Error> {
    const DELETE: &str = concat!(
        "DELETE FROM idempotency_keys AS k
         WHERE k.user_id = $1 AND k.key = $2
           AND (k.response_status IS NOT NULL
                OR k.created_at <= now() - make_interval(secs => $3))
           AND NOT ",
        settling!(),
        "
           AND (k.created_at <= now() - make_interval(secs => $3) OR NOT ",
        keeps_answer!(),
        ")"
    );
    const WHY: &str = concat!(
        "SELECT ",
        settling!(),
        ", ",
        keeps_answer!(),
        " FROM idempotency_keys AS k WHERE k.user_id = $1 AND k.key = $2"
    );
    let tx = client.transaction().await?;
    let params: [&(dyn tokio_postgres::types::ToSql + Sync); 3] =
        [&user_id, &key.as_str(), &ttl_secs(policy)];
    let locked = format!(
        "SELECT {REPORT} FROM idempotency_keys AS k
         WHERE k.user_id = $1 AND k.key = $2
         FOR UPDATE"
    );
    let Some(row) = tx.query_opt(&locked, &params).await? else {
        tx.rollback().await?;
        return Ok(Purge::Absent);
    };
    // The report was read under the lock, in this transaction (one `now()`):
    // it is what the row holds when the `DELETE` decides. The `DELETE` does
    // not return it: a distributed database refuses a `RETURNING` that reads
    // the clock.
    let report = KeyReport::from_row(&row)?;
    if tx.execute(DELETE, &params).await? == 1 {
        // Every instance's answer cache drops the key when this commits.
        tx.execute(
            "SELECT pg_notify($1, $2)",
            &[&CHANNEL, &payload(user_id, key.as_str())],
        )
        .await?;
        tx.commit().await?;
        return Ok(Purge::Purged(report));
    }
    let why = tx.query_one(WHY, &params[..2]).await?;
    let (settling, keeps_answer): (bool, bool) = (why.try_get(0)?, why.try_get(1)?);
    tx.rollback().await?;
    let refusal = if settling {
        PurgeRefusal::Settling
    } else if keeps_answer {
        PurgeRefusal::Rearms
    } else {
        PurgeRefusal::InProgress
    };
    Ok(Purge::Refused(refusal, report))
}

/// The key table's numbers, from one statement (one snapshot).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stats {
    pub in_progress: u64,
    pub answered: u64,
    pub expired: u64,
    /// How old the oldest row is; `None` when the table is empty.
    pub oldest_age: Option<Duration>,
    /// The table's bytes (heap and TOAST) and those of its indexes.
    pub table_bytes: u64,
    pub index_bytes: u64,
    /// The rows a cleanup run ([`Cleanup`](crate::Cleanup)) would delete if
    /// it started now: every expired row, batch after batch.
    pub cleanup_due: u64,
}

impl Stats {
    pub fn rows(&self) -> u64 {
        self.in_progress + self.answered + self.expired
    }
}

/// Counts the rows by state, and what the table weighs. It reads the whole
/// table: a tool's query, not one to run on every request.
pub async fn stats(client: &impl GenericClient, policy: Policy) -> Result<Stats, Error> {
    // `cleanup_due` is the cleanup's own condition (`cleanup::delete_slice`).
    const STATS: &str = concat!(
        "SELECT
             count(*) FILTER (WHERE created_at > now() - make_interval(secs => $1)
                                AND response_status IS NULL) AS in_progress,
             count(*) FILTER (WHERE created_at > now() - make_interval(secs => $1)
                                AND response_status IS NOT NULL) AS answered,
             count(*) FILTER (WHERE created_at <= now() - make_interval(secs => $1)) AS expired,
             count(*) FILTER (WHERE created_at < now() - make_interval(secs => $1)
                                AND NOT ",
        settling!(),
        ") AS cleanup_due,
             extract(epoch FROM now() - min(created_at))::float8 AS oldest_age_secs,
             pg_table_size('idempotency_keys'::regclass) AS table_bytes,
             pg_indexes_size('idempotency_keys'::regclass) AS index_bytes
         FROM idempotency_keys AS k"
    );
    let row = client.query_one(STATS, &[&ttl_secs(policy)]).await?;
    let count = |name: &str| -> Result<u64, Error> {
        Ok(u64::try_from(row.try_get::<_, i64>(name)?).unwrap_or(0))
    };
    Ok(Stats {
        in_progress: count("in_progress")?,
        answered: count("answered")?,
        expired: count("expired")?,
        cleanup_due: count("cleanup_due")?,
        oldest_age: row
            .try_get::<_, Option<f64>>("oldest_age_secs")?
            .map(|secs| Duration::from_secs_f64(secs.max(0.0))),
        table_bytes: count("table_bytes")?,
        index_bytes: count("index_bytes")?,
    })
}

fn ttl_secs(policy: Policy) -> f64 {
    policy.ttl.as_secs_f64()
}
