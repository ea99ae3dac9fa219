//! Steps of one call: an effect written as a PL/pgSQL function of the
//! caller's, which calls the engine's own functions
//! (`migrations/functions/idempotency.sql`) for the key's writes, so that
//! the effect and the key's new state commit together in one round trip
//! and one commit, where a [`Unit`](crate::Unit)'s transaction around them
//! costs four round trips. The caller writes each call whole; the engine
//! adds its own arguments before the caller's and builds no statement.
//!
//! Two kinds: the work's first step opens the claim ([`Opening`]: the key's
//! insert, then the effect only if it won, and its link), and a later one
//! stores the answer ([`Storing`]: the outcome, then the answer). Each
//! statement of a function goes whole to the node of its rows on Citus, and
//! its commit spans only those nodes, so the same function serves one
//! PostgreSQL and a cluster.

use deadpool_postgres::GenericClient;
use tokio_postgres::types::ToSql;
use tokio_postgres::Row;

use crate::error::Error;

/// The work's first writing step, run as the claim itself: a PL/pgSQL
/// function that takes the claim's six arguments ($1 `user_id`, $2 `key`,
/// $3 the request hash, $4 the claim token, $5 the lease and $6 the TTL in
/// seconds) and then arguments of its own, returns a column `claim` of
/// type `idempotency_claim_row` beside at least one of its own (a function
/// with one column returns that column's type, whose fields PostgreSQL
/// would then give as its columns), starts with
/// `claim := idempotency_open($1, ..., $6)` and writes nothing unless
/// `claim.won`; after its writes it calls `idempotency_link` for an effect
/// that settles later.
///
/// The caller writes its call once, whole, as a constant: the claim's
/// columns first (`won` and the key's row), then its own, as in
/// `SELECT (step.claim).*, step.* FROM checkout_place_order($1, ..., $10) AS step`;
/// each request gives it its own arguments ([`Opening::new`]).
///
/// Handed to [`Engine::run`](crate::Engine::run), it replaces the claim's
/// own statement: a first click is then one call and one commit for its
/// key and its first step together. A lost insert comes back as the key's
/// row, as the plain claim's would, having touched nothing else. A claim
/// won another way (a key past its TTL, a takeover before any link) runs
/// the same call from the work ([`Claim::open`]), where `idempotency_open`
/// finds the row already its token's.
pub struct Opening {
    call: &'static str,
    params: Vec<Box<dyn ToSql + Sync + Send>>,
}

impl Opening {
    /// The step `call` with one request's own arguments, as many as it
    /// takes after the claim's six.
    pub fn new(call: &'static str, params: Vec<Box<dyn ToSql + Sync + Send>>) -> Self {
        Self { call, params }
    }

    /// The call, with the claim's arguments first.
    pub(crate) async fn run(
        &self,
        client: &impl GenericClient,
        claim: [&(dyn ToSql + Sync); CLAIM_PARAMS],
    ) -> Result<Row, Error> {
        let statement = client.prepare_cached(self.call).await?;
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

/// The claim's arguments, before an opening step's own.
const CLAIM_PARAMS: usize = 6;

/// Records an outcome and stores the intent's answer, the answer only while
/// the claim holds (and only if the outcome was made): a PL/pgSQL function
/// that takes the engine's seven arguments ($1 `user_id`, $2 `key`, $3 the
/// claim token, $4-$7 the answer's status, content type, location and
/// body) and then arguments of its own, and returns `held` first. It
/// records the outcome whoever holds the claim, then, only if it made the
/// outcome, calls `idempotency_store($1, ..., $7)` last and returns what
/// that returned as `held`. When someone else made the outcome first, it
/// returns `idempotency_answered_while_held($1, $2, $3)` as `held`: whether
/// the key was answered from outside ([`store_for_effect`](crate::store_for_effect))
/// while this claim held it, so that this request still gives the first
/// answer; when not, the caller answers from the outcome as it stands
/// ([`Done::Answer`](crate::Done::Answer)), stored only while the claim
/// holds. The outcome settles the effect, so the key forgets its link with
/// the answer. The caller writes its call whole, as a constant:
/// `SELECT * FROM name($1, ..., $n)`.
///
/// For an effect that is true whoever holds the claim (recording a
/// decision that another system made, such as a payment's): the request
/// that holds the key now finds it. The key row is written last, after the
/// endpoint's rows, the order every writer of both keeps.
pub struct Storing(pub(crate) &'static str);

impl Storing {
    pub const fn new(call: &'static str) -> Self {
        Self(call)
    }
}

/// The answer's arguments, before a storing step's own.
pub(crate) const ANSWER_PARAMS: usize = 7;
