//! One-statement units: an effect that is one SQL statement gets the key's
//! new state written by the same statement, in one round trip and one
//! commit, instead of a [`Unit`](crate::Unit)'s transaction around two.
//!
//! The endpoint writes its effect as data-modifying CTEs and a boolean
//! `made` that says whether the effect was made; the engine wraps them with
//! its own CTEs on `idempotency_keys` and adds a first column, `held`: did
//! the claim still hold when the key was written. The engine's parameters
//! come first ($1 `user_id`, $2 `key`, $3 the claim token, then the link or
//! the answer); the endpoint's start at [`Linking::FIRST_PARAM`] or
//! [`Storing::FIRST_PARAM`]. Build each statement once (a `LazyLock`).
//!
//! An effect whose tables live on different nodes (Citus: the key's
//! co-located rows on a worker, a table every scope shares on the
//! coordinator) is written as a PL/pgSQL function instead
//! ([`Linking::function`], [`Storing::function`]): one CTE over both would
//! be planned as subplans whose results go to every node of the step, while
//! each statement of a function goes whole to the node of its rows. The
//! function makes the same writes in the same order through the engine's
//! own functions (migration V4). On one PostgreSQL it is one call too, but
//! each of its statements is an executor run of its own, where the CTEs are
//! one: an effect that runs on both writes both forms
//! ([`Linking::distributed_as`], [`Storing::distributed_as`]), and the
//! claim runs the one of its [`Layout`].

use std::sync::Arc;

use deadpool_postgres::GenericClient;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use crate::unit::SET_ANSWER;
use crate::{Claim, Error, Fence, Layout, StoredResponse};

/// Makes an effect and links it to the key, only while the claim holds.
///
/// The engine's `claim` CTE locks the key row first, and only while the
/// claim holds and has no effect yet; every write of the endpoint's CTEs
/// must be guarded by `EXISTS (SELECT 1 FROM claim)`, so that a request
/// that lost its claim makes nothing. A takeover then finds the link and
/// resumes the effect.
pub struct Linking(Forms);

impl Linking {
    /// The endpoint's first parameter.
    pub const FIRST_PARAM: usize = 5;

    pub fn new(effect: &str, made: &str, select: &str) -> Self {
        Self(Forms::both(format!(
            "WITH claim AS (
                 SELECT 1 FROM idempotency_keys
                 WHERE user_id = $1 AND key = $2 AND claim_token = $3
                   AND response_status IS NULL AND effect IS NULL
                 FOR UPDATE
             ), {effect},
             linked AS (
                 UPDATE idempotency_keys SET effect = $4
                 WHERE user_id = $1 AND key = $2 AND claim_token = $3
                   AND EXISTS (SELECT 1 FROM claim) AND ({made})
             )
             SELECT EXISTS (SELECT 1 FROM claim) AS held, {select}"
        )))
    }

    /// A linking step written as the PL/pgSQL function `name`, which takes
    /// the engine's four parameters ($1 `user_id`, $2 `key`, $3 the claim
    /// token, $4 the link) and then `params` of its own, and returns
    /// `held` first. Before any write it calls
    /// `idempotency_lock_claim($1, $2, $3)` and writes nothing when that is
    /// false; after its writes, and only if it made the effect, it calls
    /// `idempotency_link($1, $2, $3, $4)`.
    pub fn function(name: &str, params: usize) -> Self {
        Self(Forms::both(call(name, Self::FIRST_PARAM - 1 + params)))
    }

    /// The same step as the function `name` (see [`Linking::function`]),
    /// run instead where the key table is distributed.
    pub fn distributed_as(self, name: &str, params: usize) -> Self {
        Self(self.0.distributed_as(name, Self::FIRST_PARAM - 1 + params))
    }
}

/// Records an outcome and stores the intent's answer, the answer only while
/// the claim holds (and only if `made`). The outcome settles the effect, so
/// the key forgets its link with the answer.
///
/// For an effect that is true whoever holds the claim (recording a
/// decision that another system made, such as a payment's): its writes run
/// even when the claim was lost, and the request that holds the key now
/// finds them. The key row is written last, after the endpoint's rows, the
/// order every writer of both keeps.
pub struct Storing(Forms);

impl Storing {
    /// The endpoint's first parameter.
    pub const FIRST_PARAM: usize = 8;

    pub fn new(effect: &str, made: &str, select: &str) -> Self {
        Self(Forms::both(format!(
            "WITH {effect},
             stored AS (
                 UPDATE idempotency_keys SET {SET_ANSWER}, effect = NULL
                 WHERE user_id = $1 AND key = $2 AND claim_token = $3
                   AND response_status IS NULL AND ({made})
                 RETURNING 1
             )
             SELECT EXISTS (SELECT 1 FROM stored) AS held, {select}"
        )))
    }

    /// A storing step written as the PL/pgSQL function `name`, which takes
    /// the engine's seven parameters ($1 `user_id`, $2 `key`, $3 the claim
    /// token, $4-$7 the answer's status, content type, location and body)
    /// and then `params` of its own, and returns `held` first. It records
    /// the outcome whoever holds the claim, then, only if it made the
    /// outcome, calls `idempotency_store($1, ..., $7)` last and returns what
    /// that returned as `held` (false otherwise).
    pub fn function(name: &str, params: usize) -> Self {
        Self(Forms::both(call(name, Self::FIRST_PARAM - 1 + params)))
    }

    /// The same step as the function `name` (see [`Storing::function`]),
    /// run instead where the key table is distributed.
    pub fn distributed_as(self, name: &str, params: usize) -> Self {
        Self(self.0.distributed_as(name, Self::FIRST_PARAM - 1 + params))
    }
}

/// The work's first writing step, run as the claim itself: a PL/pgSQL
/// function that takes the claim's six arguments ($1 `user_id`, $2 `key`,
/// $3 the request hash, $4 the claim token, $5 the lease and $6 the TTL in
/// seconds) and then `params` of its own, starts with
/// `idempotency_open($1, ..., $6)` into its first ten columns (`won` and
/// the key's row) and writes nothing unless `won`; after its writes it
/// calls `idempotency_link` for an effect that settles later.
///
/// Handed to [`Engine::run`](crate::Engine::run), it replaces the claim's
/// own statement: a first click is then one call and one commit for its
/// key and its first step together. A lost insert comes back as the key's
/// row, as the plain claim's would, having touched nothing else. A claim
/// won another way (a key past its TTL, a takeover before any link) runs
/// the same call from the work ([`Claim::open`]), where `idempotency_open`
/// finds the row already its token's.
pub struct Opening {
    call: String,
    params: Vec<Box<dyn ToSql + Sync + Send>>,
}

impl Opening {
    /// The claim's arguments, before the step's own.
    const CLAIM_PARAMS: usize = 6;

    pub fn new(function: &str, params: Vec<Box<dyn ToSql + Sync + Send>>) -> Self {
        Self {
            call: call(function, Self::CLAIM_PARAMS + params.len()),
            params,
        }
    }

    /// The call, with the claim's arguments first.
    pub(crate) async fn run(
        &self,
        client: &impl GenericClient,
        claim: [&(dyn ToSql + Sync); Self::CLAIM_PARAMS],
    ) -> Result<Row, Error> {
        let statement = client.prepare_cached(&self.call).await?;
        let params: Vec<&(dyn ToSql + Sync)> = claim
            .into_iter()
            .chain(
                self.params
                    .iter()
                    .map(|param| &**param as &(dyn ToSql + Sync)),
            )
            .collect();
        Ok(client.query_one(&statement, &params).await?)
    }
}

/// A step's statement for each [`Layout`].
struct Forms {
    single: String,
    distributed: String,
}

impl Forms {
    fn both(sql: String) -> Self {
        Self {
            distributed: sql.clone(),
            single: sql,
        }
    }

    fn distributed_as(self, name: &str, params: usize) -> Self {
        Self {
            distributed: call(name, params),
            ..self
        }
    }

    fn of(&self, layout: Layout) -> &str {
        match layout {
            Layout::Single => &self.single,
            Layout::Distributed => &self.distributed,
        }
    }
}

/// `SELECT * FROM name($1, ..., $params)`.
fn call(name: &str, params: usize) -> String {
    let args: Vec<String> = (1..=params).map(|n| format!("${n}")).collect();
    format!("SELECT * FROM {name}({})", args.join(", "))
}

impl Claim {
    /// The row of the [`Opening`] that the claim's own call ran, if it did.
    pub fn opened(&self) -> Option<Arc<Row>> {
        self.opened.clone()
    }

    /// Runs `opening` for a claim whose own call did not (a key past its
    /// TTL, a takeover before any link, no opening at the claim):
    /// `Fence::Lost` when the claim was lost, and nothing was written.
    pub async fn open(
        &self,
        client: &impl GenericClient,
        opening: &Opening,
    ) -> Result<(Fence, Arc<Row>), Error> {
        let row = opening
            .run(
                client,
                [
                    &self.user_id,
                    &self.key.as_str(),
                    &self.hash.as_bytes(),
                    &self.token,
                    &self.policy.lease.as_secs_f64(),
                    &self.policy.ttl.as_secs_f64(),
                ],
            )
            .await?;
        let fence = if row.try_get("won")? {
            Fence::Held
        } else {
            Fence::Lost
        };
        Ok((fence, Arc::new(row)))
    }

    /// Runs a [`Linking`] statement outside any transaction: the effect
    /// and its link commit together, or nothing does.
    pub async fn link_with(
        &self,
        client: &impl GenericClient,
        statement: &Linking,
        effect: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<(Fence, Row), Error> {
        let ours: [&(dyn ToSql + Sync); 4] =
            [&self.user_id, &self.key.as_str(), &self.token, &effect];
        let sql = statement.0.of(self.policy.layout);
        self.query(client, sql, &ours, params).await
    }

    /// Runs a [`Storing`] statement outside any transaction: the outcome
    /// and the answer commit together (the answer only while the claim holds).
    pub async fn store_with(
        &self,
        client: &impl GenericClient,
        statement: &Storing,
        answer: &StoredResponse,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<(Fence, Row), Error> {
        let status = answer.status as i16;
        let ours: [&(dyn ToSql + Sync); 7] = [
            &self.user_id,
            &self.key.as_str(),
            &self.token,
            &status,
            &answer.content_type,
            &answer.location,
            &answer.body,
        ];
        let sql = statement.0.of(self.policy.layout);
        self.query(client, sql, &ours, params).await
    }

    async fn query(
        &self,
        client: &impl GenericClient,
        sql: &str,
        ours: &[&(dyn ToSql + Sync)],
        theirs: &[&(dyn ToSql + Sync)],
    ) -> Result<(Fence, Row), Error> {
        let statement = client.prepare_cached(sql).await?;
        let params: Vec<&(dyn ToSql + Sync)> = ours.iter().chain(theirs).copied().collect();
        let row = client.query_one(&statement, &params).await?;
        let fence = if row.try_get("held")? {
            Fence::Held
        } else {
            Fence::Lost
        };
        Ok((fence, row))
    }
}
