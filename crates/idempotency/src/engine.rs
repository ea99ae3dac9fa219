//! The flow of one keyed request: claim or read the key, run the work at most
//! once, store its answer, and say what to answer. Knows SQL, not HTTP.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use deadpool_postgres::Pool;
use tokio_postgres::Row;

use crate::cache::{Asked, Cached};
use crate::store::{self, Begin, Found};
use crate::unit::{self, Committed, Fence};
use crate::wait::{WaitOutcome, Waiters};
use crate::{
    AnswerCache, Error, Gate, IdempotencyKey, Layout, Limit, Opening, RequestHash, Settling,
    StoredResponse,
};

/// Lifetimes of a key: how long it means the same intent, and how long an
/// in-progress claim belongs to its request before another may take it over.
#[derive(Debug, Clone, Copy)]
pub struct Policy {
    pub ttl: Duration,
    pub lease: Duration,
    /// The form of the claim ([`Layout::of`]).
    pub layout: Layout,
}

/// The right to do the work of one intent, until the lease runs out.
#[derive(Debug, Clone)]
pub struct Claim {
    /// The scope the key belongs to (the buyer, the tenant): two scopes never
    /// share a key.
    pub user_id: String,
    pub key: IdempotencyKey,
    /// Fences every write after the claim: 62 random bits, new per claim.
    pub token: i64,
    /// The effect an earlier holder of this key linked and that is still
    /// settling, when this claim is a takeover: resume it, never make another.
    pub effect: Option<String>,
    pub kind: ClaimKind,
    /// The engine's policy: the layout says which form of a
    /// [`Linking`](crate::Linking) or [`Storing`](crate::Storing) step the
    /// claim runs; the lease and TTL are its [`Opening`]'s arguments.
    pub(crate) policy: Policy,
    pub(crate) hash: RequestHash,
    /// The row of the [`Opening`] that the claim's own call ran, when it
    /// did (see [`Claim::open`]).
    pub(crate) opened: Option<Arc<Row>>,
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

impl ClaimKind {
    /// A new intent, which the scope's limit counts; a takeover of an
    /// abandoned claim finishes one.
    fn starts_intent(self) -> bool {
        self != ClaimKind::Abandoned
    }

    fn outcome(self) -> Outcome {
        match self {
            ClaimKind::First => Outcome::First,
            ClaimKind::Expired => Outcome::ExpiredTakeover,
            ClaimKind::Abandoned => Outcome::LeaseTakeover,
        }
    }
}

/// How the work of a claim ended, as the work reports it.
#[derive(Debug)]
pub enum Done {
    /// The work's effect and this answer are durable together: committed by
    /// the work ([`Unit::store`](crate::Unit::store), then `finish`), or by
    /// whoever settled the effect the claim linked
    /// ([`store_for_effect`](crate::store_for_effect)) while the work waited.
    Stored(StoredResponse),
    /// An answer that no durable effect stands behind (a refusal made before
    /// anything was written): the engine stores it.
    Answer(StoredResponse),
    /// The claim was lost to a takeover before the answer could be stored.
    Fenced,
}

impl Done {
    /// How a unit that stored `answer` ended, as the work reports it.
    pub fn stored(committed: Committed, answer: StoredResponse) -> Self {
        match committed {
            Committed::Done => Done::Stored(answer),
            Committed::Fenced => Done::Fenced,
        }
    }
}

/// What to answer the request.
#[derive(Debug)]
pub enum Reply {
    /// This request did the work; its answer, as stored.
    First(StoredResponse),
    /// The intent's stored answer, again.
    Replay(StoredResponse),
    /// Another request holds the intent right now: come back shortly.
    InProgress,
    /// The key was first used for a different request; never its answer.
    KeyReused,
    /// A new intent past the scope's limit: nothing was written; come back
    /// after this long.
    Limited(Duration),
}

/// A failure of a keyed request: the engine's, or the work's own. A work
/// error is not an answer and is never stored: the key is given back when no
/// effect was linked, and stays in progress (for a takeover or a settling
/// job to finish) when one was.
#[derive(Debug, thiserror::Error)]
pub enum RunError<E> {
    #[error(transparent)]
    Store(#[from] Error),
    #[error(transparent)]
    Work(E),
}

/// What the key decided, for metrics: every request ends in one of these.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    First,
    Replay,
    InProgress,
    KeyReused,
    ExpiredTakeover,
    LeaseTakeover,
    /// A new intent refused by the scope's [`Limit`](crate::Limit).
    RateLimited,
}

impl Outcome {
    pub const ALL: [Outcome; 7] = [
        Outcome::First,
        Outcome::Replay,
        Outcome::InProgress,
        Outcome::KeyReused,
        Outcome::ExpiredTakeover,
        Outcome::LeaseTakeover,
        Outcome::RateLimited,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::First => "first",
            Outcome::Replay => "replay",
            Outcome::InProgress => "in_progress",
            Outcome::KeyReused => "key_reused",
            Outcome::ExpiredTakeover => "expired_takeover",
            Outcome::LeaseTakeover => "lease_takeover",
            Outcome::RateLimited => "rate_limited",
        }
    }

    fn of(begun: &Begin) -> Self {
        match begun {
            Begin::Claimed(claim) => claim.kind.outcome(),
            Begin::Replay(_) => Outcome::Replay,
            Begin::InProgress => Outcome::InProgress,
            Begin::KeyReused => Outcome::KeyReused,
            Begin::Limited(_) => Outcome::RateLimited,
        }
    }
}

/// The engine: a pool on the database that holds `idempotency_keys`
/// ([`migrate`](crate::migrate) makes it), the key policy, the optional
/// Redis gate, and a hook that sees every [`Outcome`].
#[derive(Clone)]
pub struct Engine {
    pub(crate) pool: Pool,
    pub(crate) policy: Policy,
    pub(crate) gate: Gate,
    limit: Option<Limit>,
    pub(crate) settling: Settling,
    observe: Arc<dyn Fn(Outcome) + Send + Sync>,
    pub(crate) observe_wait: Arc<dyn Fn(WaitOutcome, Duration) + Send + Sync>,
    pub(crate) waiters: Waiters,
    cache: Option<AnswerCache>,
}

impl Engine {
    pub fn new(pool: Pool, policy: Policy) -> Self {
        Self {
            pool,
            policy,
            gate: Gate::Table,
            limit: None,
            settling: Settling::NEVER,
            observe: Arc::new(|_| {}),
            observe_wait: Arc::new(|_, _| {}),
            waiters: Waiters::default(),
            cache: None,
        }
    }

    /// Puts a gate in front of the table (see [`Gate`]).
    pub fn with_gate(mut self, gate: Gate) -> Self {
        self.gate = gate;
        self
    }

    /// Limits the new intents of each scope (see [`Limit`]).
    pub fn with_limit(mut self, limit: Limit) -> Self {
        self.limit = Some(limit);
        self
    }

    /// Answers retries of answered keys from `cache` (see [`AnswerCache`]).
    pub fn with_answer_cache(mut self, cache: AnswerCache) -> Self {
        self.cache = Some(cache);
        self
    }

    /// Says when the effect a key links is still settling (see
    /// [`Settling`]): such a key outlives its TTL, neither taken over as a
    /// new intent nor deleted by the cleanup, until the effect settles.
    pub fn with_settling(mut self, settling: Settling) -> Self {
        self.settling = settling;
        self
    }

    /// Calls `observe` with what the key decided, once per request.
    pub fn on_outcome(mut self, observe: impl Fn(Outcome) + Send + Sync + 'static) -> Self {
        self.observe = Arc::new(observe);
        self
    }

    /// Calls `observe` with how each wait ended and how long it took.
    pub fn on_wait(
        mut self,
        observe: impl Fn(WaitOutcome, Duration) + Send + Sync + 'static,
    ) -> Self {
        self.observe_wait = Arc::new(observe);
        self
    }

    pub fn policy(&self) -> Policy {
        self.policy
    }

    /// Runs `work` at most once for this (scope, key, request) and says what
    /// to answer. The work gets the claim; it makes its effect in a
    /// [`Unit`](crate::Unit) of the claim, or in one-call steps of it
    /// (`opening` first, see [`Opening`]), and reports how it ended.
    pub async fn run<W, Fut, E>(
        &self,
        user_id: &str,
        key: &IdempotencyKey,
        hash: &RequestHash,
        opening: Option<&Opening>,
        work: W,
    ) -> Result<Reply, RunError<E>>
    where
        W: FnOnce(Claim) -> Fut,
        Fut: Future<Output = Result<Done, E>>,
    {
        let ran = self
            .run_waiting(user_id, key, hash, opening, Duration::ZERO, work)
            .await?;
        Ok(ran.reply)
    }

    /// Answers from the cache, or claims the key, or reads what it holds:
    /// through the gate when there is one.
    pub(crate) async fn decide(
        &self,
        user_id: &str,
        key: &IdempotencyKey,
        hash: &RequestHash,
        opening: Option<&Opening>,
    ) -> Result<Decision, Error> {
        let asked = match &self.cache {
            Some(cache) => match cache.answer(user_id, key, hash) {
                Some(Cached::Replay(response)) => return Ok(Decision::of(Begin::Replay(response))),
                Some(Cached::KeyReused) => return Ok(Decision::of(Begin::KeyReused)),
                None => Some(cache.ask()),
            },
            None => None,
        };
        let learned = |begun: Begin, gate: Option<i64>, life: Duration| {
            if let (Some(cache), Some(asked), Begin::Replay(response)) =
                (&self.cache, asked, &begun)
            {
                cache.learn(asked, user_id, key, hash, response, life);
            }
            Decision {
                begun,
                gate,
                life: asked.map(|asked| (asked, life)),
            }
        };
        // A token is taken before the claim and given back unless the claim
        // starts an intent, so that a retry (a replay, a 409, a 422, the
        // takeover of an abandoned claim, which finishes an intent rather
        // than starting one) never spends one, and a first click pays no
        // statement for the limit. Past the limit the row is read first: a
        // retry is still answered, and a new intent writes nothing.
        let spent = match &self.limit {
            Some(limit) => match limit.take(user_id) {
                Ok(()) => Some(limit),
                Err(wait) => {
                    let client = self.pool.get().await?;
                    match store::find(&client, self.policy, user_id, key, hash).await? {
                        (Found::Decided(begun), life) => return Ok(learned(begun, None, life)),
                        (Found::Abandoned, _) => None,
                        (Found::New, _) => return Ok(Decision::of(Begin::Limited(wait))),
                    }
                }
            },
            None => None,
        };
        let token = store::new_token();
        let admitted = self
            .gate
            .enter(user_id, key, token, self.policy.lease)
            .await;
        let begun = self
            .claim_or_read(admitted, user_id, key, hash, token, opening)
            .await;
        if let Some(limit) = spent {
            if !matches!(&begun, Ok((Begin::Claimed(claim), _)) if claim.kind.starts_intent()) {
                limit.give_back(user_id);
            }
        }
        match (begun, admitted) {
            (Ok((begun, life)), admitted) => Ok(learned(begun, admitted.then_some(token), life)),
            (Err(error), true) => {
                // Nobody works on the key: a lock left behind would turn its
                // retries away for the lease, where the table would let them claim.
                self.gate.leave(user_id, key, token).await;
                Err(error)
            }
            (Err(error), false) => Err(error),
        }
    }

    /// Claims the key with `token` when the gate let this request in, else
    /// only reads what it holds; and how long the key has to live.
    async fn claim_or_read(
        &self,
        admitted: bool,
        user_id: &str,
        key: &IdempotencyKey,
        hash: &RequestHash,
        token: i64,
        opening: Option<&Opening>,
    ) -> Result<(Begin, Duration), Error> {
        let client = self.pool.get().await?;
        if admitted {
            let asked = store::Ask {
                user_id,
                key,
                hash,
                token,
            };
            store::claim(&client, self.policy, self.settling, asked, opening).await
        } else {
            let (begun, life) = store::look(&client, self.policy, user_id, key, hash).await?;
            Ok((begun.unwrap_or(Begin::InProgress), life))
        }
    }

    /// What the key decided for a request that does not get to do the work;
    /// the gate, if this request took it, is given back.
    pub(crate) async fn decided(
        &self,
        begun: Begin,
        gate: Option<i64>,
        user_id: &str,
        key: &IdempotencyKey,
    ) -> Reply {
        (self.observe)(Outcome::of(&begun));
        if let Some(token) = gate {
            self.gate.leave(user_id, key, token).await;
        }
        reply(begun)
    }

    /// Does the work of a claim and stores its answer; the answer cache
    /// keeps it for the `life` its key had when claimed, and the waiters of
    /// the key in this process are woken to it.
    pub(crate) async fn work<W, Fut, E>(
        &self,
        claim: Claim,
        hash: &RequestHash,
        life: Option<(Asked, Duration)>,
        work: W,
    ) -> Result<Reply, RunError<E>>
    where
        W: FnOnce(Claim) -> Fut,
        Fut: Future<Output = Result<Done, E>>,
    {
        (self.observe)(claim.kind.outcome());
        let finished = work(claim.clone()).await;
        let answer = match finished {
            Ok(Done::Stored(response)) => Ok(Reply::First(response)),
            Ok(Done::Answer(response)) => self.store(&claim, hash, response).await,
            Ok(Done::Fenced) => self.current(&claim, hash).await,
            Err(error) => {
                self.release(&claim).await;
                Err(RunError::Work(error))
            }
        };
        // The gate marks a claim in flight, and this one is over. Its lock
        // holds this claim's token: when the claim was lost (fenced off, or
        // its answer refused), the lock, if any, is the taker's, and stays.
        self.gate
            .leave(&claim.user_id, &claim.key, claim.token)
            .await;
        if let Ok(Reply::First(response)) = &answer {
            if let (Some(cache), Some((asked, life))) = (&self.cache, life) {
                cache.learn(asked, &claim.user_id, &claim.key, hash, response, life);
            }
            self.waiters.wake(&claim.user_id, &claim.key);
        }
        answer
    }

    /// Claims or reads the key, without any work: what `run` starts with.
    pub async fn begin(
        &self,
        user_id: &str,
        key: &IdempotencyKey,
        hash: &RequestHash,
    ) -> Result<Begin, Error> {
        let client = self.pool.get().await?;
        let asked = store::Ask {
            user_id,
            key,
            hash,
            token: store::new_token(),
        };
        let (begun, _) = store::claim(&client, self.policy, self.settling, asked, None).await?;
        Ok(begun)
    }

    async fn store<E>(
        &self,
        claim: &Claim,
        hash: &RequestHash,
        response: StoredResponse,
    ) -> Result<Reply, RunError<E>> {
        let client = self.pool.get().await.map_err(Error::from)?;
        match unit::store_answer(&client, claim, &response).await? {
            Fence::Held => Ok(Reply::First(response)),
            Fence::Lost => {
                drop(client);
                self.current(claim, hash).await
            }
        }
    }

    /// For a request fenced off by a takeover: whatever the key says now.
    async fn current<E>(&self, claim: &Claim, hash: &RequestHash) -> Result<Reply, RunError<E>> {
        let client = self.pool.get().await.map_err(Error::from)?;
        let now = store::current(&client, self.policy, &claim.user_id, &claim.key, hash).await?;
        Ok(reply(now))
    }

    /// Gives the key back if nothing durable was made, so that a retry starts
    /// afresh; a key with a linked effect stays in progress.
    async fn release(&self, claim: &Claim) {
        let released = match self.pool.get().await {
            Ok(client) => store::release(&client, claim).await,
            Err(error) => Err(error.into()),
        };
        if let Err(error) = released {
            tracing::warn!(%error, "could not release an idempotency key");
        }
    }
}

/// What `decide` found: the key's answer or claim, the claim token of the
/// gate's lock when this request holds it, and, for the answer cache, when
/// the statement was sent and how long the key then had left at most.
pub(crate) struct Decision {
    pub begun: Begin,
    pub gate: Option<i64>,
    pub life: Option<(Asked, Duration)>,
}

impl Decision {
    fn of(begun: Begin) -> Self {
        Self {
            begun,
            gate: None,
            life: None,
        }
    }
}

fn reply(begun: Begin) -> Reply {
    match begun {
        Begin::Replay(response) => Reply::Replay(response),
        Begin::KeyReused => Reply::KeyReused,
        Begin::Limited(wait) => Reply::Limited(wait),
        Begin::InProgress | Begin::Claimed(_) => Reply::InProgress,
    }
}
