//! The key table's claim side: the insert that decides a race, the reads,
//! and the two takeovers (a key past its TTL, a claim past its lease).
//!
//! `PRIMARY KEY (user_id, key)` decides every race; nothing here reads and
//! then writes without a condition that the database re-checks. A claim
//! carries a token, and every write after the claim is conditional on still
//! holding it (see `unit`), so a request that lost its lease writes nothing.
//! Every statement names `user_id`, so each one touches one shard of a table
//! distributed by it.

use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::GenericClient;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;
use uuid::Uuid;

use crate::claim::{Claim, ClaimKind, Policy};
use crate::error::Error;
use crate::fingerprint::RequestHash;
use crate::key::IdempotencyKey;
use crate::response::StoredResponse;
use crate::statement::Opening;

/// What the key row says about a request.
#[derive(Debug)]
pub(crate) enum Begin {
    /// This request does the work.
    Claimed(Claim),
    /// The intent has an answer: give it again.
    Replay(StoredResponse),
    /// Another request holds the intent right now.
    InProgress,
    /// The key was first used for a different request.
    KeyReused,
    /// A new intent past the caller's limit: nothing was written; come back
    /// after this long.
    Limited(std::time::Duration),
}

/// The claim: the key's insert, and the read of the row it lost to, in one
/// call (`idempotency_claim`, `migrations/functions/idempotency.sql`): one
/// round trip whether it wins or not. The insert commits without waiting
/// for its WAL flush (the function says why it may).
/// With an [`Opening`], the call is the opening step's, which also makes
/// the step's effect when the insert won, and commits as usual.
const CLAIM: &str = "SELECT * FROM idempotency_claim($1, $2, $3, $4, $5, $6)";

/// What a claim asks for: the key of a scope for one request, with the
/// claim's token chosen by the caller (the Redis gate's lock holds it too).
pub(crate) struct Ask<'a> {
    pub user_id: &'a str,
    pub key: &'a IdempotencyKey,
    pub hash: &'a RequestHash,
    pub token: i64,
}

/// Claims the key for this request, or says why not, keeping a key past
/// its TTL whose linked effect is still settling. Also says how long the key has to
/// live, by the database's clock, at the latest as of when the statement
/// was sent: a new or restarted key the whole TTL, a replayed or
/// taken-over one what its row has left.
#[tracing::instrument(name = "begin", skip_all, fields(user_id = asked.user_id, key = %asked.key))]
pub(crate) async fn claim(
    client: &impl GenericClient,
    policy: Policy,
    asked: Ask<'_>,
    opening: Option<&Opening>,
) -> Result<(Begin, Duration), Error> {
    let Ask {
        user_id,
        key,
        hash,
        token,
    } = asked;
    let mut claim = Claim {
        user_id: user_id.to_owned(),
        key: key.clone(),
        token,
        effect: None,
        kind: ClaimKind::First,
        policy,
        hash: *hash,
        opened: None,
    };
    let ours: [&(dyn ToSql + Sync); 6] = [
        &user_id,
        &key.as_str(),
        &hash.as_bytes(),
        &token,
        &policy.lease.as_secs_f64(),
        &policy.ttl.as_secs_f64(),
    ];
    // A row can vanish (cleanup) or change (a takeover) between statements;
    // each pass re-reads it, and a few passes settle any interleaving.
    for _ in 0..3 {
        let row = match opening {
            Some(opening) => opening.run(client, ours).await?,
            None => {
                let statement = client.prepare_cached(CLAIM).await?;
                client.query_one(&statement, &ours).await?
            }
        };
        if row.try_get("won")? {
            claim.opened = opening.map(|_| Arc::new(row));
            return Ok((Begin::Claimed(claim), policy.ttl));
        }
        let Some(row) = KeyRow::from_row(&row)? else {
            continue;
        };
        if row.expired {
            // Older than the TTL: a new intent, as if the row were absent;
            // unless the effect it links is still settling, which keeps the
            // row its old intent's (answered, in progress or abandoned, as
            // below) until it settles.
            match take_expired(client, policy, &claim, hash, row.token).await? {
                Expired::Taken => {
                    claim.kind = ClaimKind::Expired;
                    return Ok((Begin::Claimed(claim), policy.ttl));
                }
                Expired::Changed => continue,
                Expired::Settling => {}
            }
        }
        let life = row.life;
        let seen_token = match row.found(hash) {
            Found::Decided(begun) => return Ok((begun, life)),
            // The holder's lease ran out (it crashed or stalled): finish its intent.
            Found::Abandoned(seen_token) => seen_token,
            Found::New => continue,
        };
        if let Some(effect) = take_abandoned(client, policy, &claim, seen_token).await? {
            claim.effect = effect;
            claim.kind = ClaimKind::Abandoned;
            return Ok((Begin::Claimed(claim), life));
        }
    }
    Ok((Begin::InProgress, Duration::ZERO))
}

/// What a key row says to a request, before any claim.
pub(crate) enum Found {
    /// No live row (none, or one past its TTL): the request would be a new
    /// intent.
    New,
    /// An in-progress row past its lease, held by this token: the request
    /// would finish its intent, not start one.
    Abandoned(i64),
    /// The row answers the request without a claim (a replay, a 409, a 422).
    Decided(Begin),
}

/// Reads the key row and says what the request would find, writing
/// nothing; and how long the key has left to live.
pub(crate) async fn find(
    client: &impl GenericClient,
    policy: Policy,
    user_id: &str,
    key: &IdempotencyKey,
    hash: &RequestHash,
) -> Result<(Found, Duration), Error> {
    Ok(match read(client, policy, user_id, key.as_str()).await? {
        None => (Found::New, Duration::ZERO),
        Some(row) if row.expired => (Found::New, row.life),
        Some(row) => {
            let life = row.life;
            (row.found(hash), life)
        }
    })
}

/// What the key row says to a request that does not claim it (turned away
/// by the gate, or fenced off by a takeover): a row that is missing,
/// expired or abandoned belongs to whoever holds the intent now.
pub(crate) async fn look(
    client: &impl GenericClient,
    policy: Policy,
    user_id: &str,
    key: &IdempotencyKey,
    hash: &RequestHash,
) -> Result<(Begin, Duration), Error> {
    let (found, life) = find(client, policy, user_id, key, hash).await?;
    let begun = match found {
        Found::Decided(begun) => begun,
        Found::New | Found::Abandoned(_) => Begin::InProgress,
    };
    Ok((begun, life))
}

/// Gives the key back after a failure that left nothing durable behind (no
/// effect linked), so that a retry starts afresh. Once an effect is linked
/// the row stays in progress until that effect has an outcome.
pub(crate) async fn release(client: &impl GenericClient, claim: &Claim) -> Result<bool, Error> {
    let statement = client
        .prepare_cached(
            "DELETE FROM idempotency_keys
             WHERE user_id = $1 AND key = $2 AND claim_token = $3
               AND response_status IS NULL AND effect IS NULL",
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

/// The effect an unanswered key row links, if any.
pub(crate) async fn linked_effect(
    client: &impl GenericClient,
    user_id: &str,
    key: &IdempotencyKey,
) -> Result<Option<String>, Error> {
    let statement = client
        .prepare_cached(
            "SELECT effect FROM idempotency_keys
             WHERE user_id = $1 AND key = $2 AND response_status IS NULL",
        )
        .await?;
    Ok(client
        .query_opt(&statement, &[&user_id, &key.as_str()])
        .await?
        .map(|row| row.try_get::<_, Option<String>>(0))
        .transpose()?
        .flatten())
}

/// A key row as `read` and the claim select it.
pub(crate) struct KeyRow {
    pub hash: Vec<u8>,
    /// `None` once answered: an answered row keeps no claim.
    pub token: Option<i64>,
    pub response: Option<StoredResponse>,
    pub expired: bool,
    pub lease_over: bool,
    /// How long until it expires (zero once it has).
    pub life: Duration,
}

impl KeyRow {
    /// The one classification of a live row (not past its TTL, or kept
    /// past it while its effect settles) for a request with `hash`.
    fn found(self, hash: &RequestHash) -> Found {
        if self.hash != hash.as_bytes() {
            return Found::Decided(Begin::KeyReused);
        }
        if let Some(response) = self.response {
            return Found::Decided(Begin::Replay(response));
        }
        match self.token {
            Some(token) if self.lease_over => Found::Abandoned(token),
            // An unanswered row has a token; one without is read mid-change.
            None if self.lease_over => Found::New,
            _ => Found::Decided(Begin::InProgress),
        }
    }

    /// `None` when the columns are NULL (the claim found no row it could see).
    fn from_row(row: &Row) -> Result<Option<Self>, Error> {
        let Some(hash) = row.try_get::<_, Option<Vec<u8>>>("request_hash")? else {
            return Ok(None);
        };
        Ok(Some(KeyRow {
            hash,
            token: row.try_get("claim_token")?,
            response: StoredResponse::of_row(row)?,
            expired: row.try_get("expired")?,
            lease_over: row.try_get("lease_over")?,
            life: Duration::try_from_secs_f64(row.try_get("life_secs")?).unwrap_or_default(),
        }))
    }
}

/// The key row of (user_id, key) as it is now, if there is one.
pub(crate) async fn read(
    client: &impl GenericClient,
    policy: Policy,
    user_id: &str,
    key: &str,
) -> Result<Option<KeyRow>, Error> {
    let statement = client
        .prepare_cached(
            "SELECT request_hash, claim_token, response_status,
                    response_content_type, response_location, response_body,
                    created_at <= now() - make_interval(secs => $3) AS expired,
                    COALESCE(lease_expires_at <= now(), false) AS lease_over,
                    extract(epoch FROM created_at + make_interval(secs => $3) - now())::float8
                        AS life_secs
             FROM idempotency_keys
             WHERE user_id = $1 AND key = $2",
        )
        .await?;
    match client
        .query_opt(&statement, &[&user_id, &key, &policy.ttl.as_secs_f64()])
        .await?
    {
        Some(row) => KeyRow::from_row(&row),
        None => Ok(None),
    }
}

/// A claim token: 62 random bits (a v4 UUID's lower half), enough that two
/// claims of one key never share one.
pub(crate) fn new_token() -> i64 {
    Uuid::new_v4().as_u64_pair().1 as i64
}

/// How a takeover of a row past its TTL ended.
enum Expired {
    Taken,
    /// Another request changed the row since it was read: read it again.
    Changed,
    /// The effect the row links is still settling: it stays its intent's.
    Settling,
}

/// Restarts a row past its TTL as a new intent, unless the effect it links
/// is still settling. One conditional update decides between racing
/// requests: it matches only the row as it was read.
async fn take_expired(
    client: &impl GenericClient,
    policy: Policy,
    claim: &Claim,
    hash: &RequestHash,
    seen_token: Option<i64>,
) -> Result<Expired, Error> {
    // When the update matched nothing, `settling` says whether the guard
    // was why. An answered row has no token: `IS NOT DISTINCT FROM`
    // matches it as read.
    const TAKE: &str = concat!(
        "WITH taken AS (
             UPDATE idempotency_keys AS k
             SET request_hash = $5, claim_token = $3,
                 lease_expires_at = now() + make_interval(secs => $6),
                 effect = NULL, effect_settled = false, keep_answer = false,
                 response_status = NULL, response_content_type = NULL,
                 response_location = NULL, response_body = NULL, created_at = now()
             WHERE k.user_id = $1 AND k.key = $2 AND k.claim_token IS NOT DISTINCT FROM $4
               AND k.created_at <= now() - make_interval(secs => $7)
               AND NOT ",
        settling!(),
        "
             RETURNING 1
         )
         SELECT EXISTS (SELECT 1 FROM taken) AS taken,
                COALESCE((SELECT ",
        settling!(),
        " FROM idempotency_keys AS k
                          WHERE k.user_id = $1 AND k.key = $2
                            AND k.claim_token IS NOT DISTINCT FROM $4),
                         false) AS settling"
    );
    let statement = client.prepare_cached(TAKE).await?;
    let row = client
        .query_one(
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
    Ok(if row.try_get("taken")? {
        Expired::Taken
    } else if row.try_get("settling")? {
        Expired::Settling
    } else {
        Expired::Changed
    })
}

/// Takes over an in-progress row whose lease ran out; the new claim inherits
/// the intent. Returns `Some(effect)` when taken: the effect is read in the
/// same statement, so a link the old holder made a moment ago is not missed.
async fn take_abandoned(
    client: &impl GenericClient,
    policy: Policy,
    claim: &Claim,
    seen_token: i64,
) -> Result<Option<Option<String>>, Error> {
    let statement = client
        .prepare_cached(
            "UPDATE idempotency_keys
             SET claim_token = $3, lease_expires_at = now() + make_interval(secs => $5)
             WHERE user_id = $1 AND key = $2 AND claim_token = $4
               AND response_status IS NULL AND lease_expires_at <= now()
             RETURNING effect",
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
        Some(row) => Some(row.try_get("effect")?),
        None => None,
    })
}
