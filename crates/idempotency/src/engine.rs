//! The engine and the whole flow of one keyed request, in the order it
//! runs: [`Engine::run`] answers from the cache or [`decide`](Engine::decide)s
//! (claims the key, or reads what it holds), waits while another request
//! holds the intent (a wait of zero does not), does the [`work`](Engine::work)
//! of a claim at most once and stores its answer, and says what to answer.
//! Knows SQL, not HTTP.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::cache::{Asked, Cached};
use crate::claim::{Claim, Done, Fence, Policy};
use crate::claiming::{Claiming, Join};
use crate::reply::{Outcome, Ran, Reply, RunError};
use crate::route::Route;
use crate::store::{self, Begin};
use crate::unit;
use crate::wait::{WaitOutcome, Waiters, FIRST_POLL, POLL_CAP};
use crate::cache::AnswerCache;
use crate::error::Error;
use crate::fingerprint::RequestHash;
use crate::gate::Gate;
use crate::key::IdempotencyKey;
use crate::limit::Limit;
use crate::response::StoredResponse;
use crate::statement::Opening;

/// The engine: the pools on the database that holds `idempotency_keys`
/// ([`migrate`](crate::migrate) makes it; a [`Route`] to each buyer's
/// server, or one pool), the key policy, the optional
/// Redis gate, and a hook that sees every [`Outcome`].
#[derive(Clone)]
pub struct Engine {
    pub(crate) route: Route,
    pub(crate) policy: Policy,
    pub(crate) gate: Gate,
    limit: Option<Limit>,
    observe: Arc<dyn Fn(Outcome) + Send + Sync>,
    pub(crate) observe_wait: Arc<dyn Fn(WaitOutcome, Duration) + Send + Sync>,
    pub(crate) waiters: Waiters,
    claiming: Claiming,
    cache: Option<AnswerCache>,
}

impl Engine {
    pub fn new(route: impl Into<Route>, policy: Policy) -> Self {
        Self {
            route: route.into(),
            policy,
            gate: Gate::Table,
            limit: None,
            observe: Arc::new(|_| {}),
            observe_wait: Arc::new(|_, _| {}),
            waiters: Waiters::default(),
            claiming: Claiming::default(),
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
    /// [`Unit`](crate::Unit) of the claim, or in steps of one call
    /// (`opening` first, run with the claim: see [`Opening`]), and reports
    /// how it ended. A request that finds its key in progress waits up to
    /// `wait` for the holder's answer (zero: it does not) before it gives up
    /// with [`Reply::InProgress`].
    pub async fn run<W, Fut, E>(
        &self,
        user_id: &str,
        key: &IdempotencyKey,
        hash: &RequestHash,
        opening: Option<&Opening>,
        wait: Duration,
        work: W,
    ) -> Result<Ran, RunError<E>>
    where
        W: FnOnce(Claim) -> Fut,
        Fut: Future<Output = Result<Done, E>>,
    {
        let started = Instant::now();
        let deadline = started + wait;
        let mut waited = false;
        // How soon a poller this waiter starts reads first. A waiter woken
        // (the lease ran out, the row went) but then turned away again (the
        // Redis lock of the request that took over) finds the row as it
        // left it, so the next poll would wake it at once: each such round
        // waits twice as long, and a wait costs a few reads, not hundreds.
        let mut first_poll = FIRST_POLL;
        loop {
            let Decision { begun, gate, life } = self.decide(user_id, key, hash, opening).await?;
            let outcome = match begun {
                Begin::InProgress if Instant::now() < deadline => {
                    if let Some(token) = gate {
                        self.gate.leave(user_id, key, token).await;
                    }
                    if waited {
                        first_poll = (first_poll * 2).min(POLL_CAP);
                    }
                    waited = true;
                    self.waiters
                        .wait(&self.route, self.policy, user_id, key, deadline, first_poll)
                        .await;
                    continue;
                }
                Begin::Claimed(claim) => {
                    let reply = self.work(claim, hash, life, work).await?;
                    (reply, WaitOutcome::TookOver)
                }
                Begin::InProgress | Begin::Limited(_) => (
                    self.decided(begun, gate, user_id, key).await,
                    WaitOutcome::TimedOut,
                ),
                other => (
                    self.decided(other, gate, user_id, key).await,
                    WaitOutcome::Answered,
                ),
            };
            let (reply, outcome) = outcome;
            let waited = waited.then(|| (outcome, started.elapsed()));
            if let Some((outcome, took)) = waited {
                (self.observe_wait)(outcome, took);
            }
            return Ok(Ran { reply, waited });
        }
    }

    /// Answers from the cache, or claims the key, or reads what it holds:
    /// through the gate when there is one.
    async fn decide(
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
        // A copy of a request whose statement this process is running
        // takes what that statement learns (see `claiming`).
        let lead = match self.claiming.join(user_id, key, hash).await {
            Join::Lead(lead) => Some(lead),
            Join::Follow(Some(begun)) => return Ok(Decision::of(begun)),
            Join::Follow(None) => None,
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
        // statement for the limit. Past the limit the refusal costs nothing
        // but this check: no statement, so that a buyer flooding new keys
        // cannot spend the database's time. A retry past it that neither
        // the answer cache nor a copy in flight (above) could answer is
        // refused too, and answered once its `Retry-After` has passed.
        let spent = match &self.limit {
            Some(limit) => match limit.take(user_id) {
                Ok(()) => Some(limit),
                Err(wait) => return Ok(Decision::of(Begin::Limited(wait))),
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
        if let (Some(lead), Ok((begun, _))) = (&lead, &begun) {
            lead.tell(begun);
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
        let client = self.route.pool(user_id).get().await?;
        if admitted {
            let asked = store::Ask {
                user_id,
                key,
                hash,
                token,
            };
            store::claim(&client, self.policy, asked, opening).await
        } else {
            store::look(&client, self.policy, user_id, key, hash).await
        }
    }

    /// What the key decided for a request that does not get to do the work;
    /// the gate, if this request took it, is given back.
    async fn decided(
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
        match Reply::from(begun) {
            Reply::InProgress { .. } => Reply::InProgress {
                effect: self.linked_effect(user_id, key).await,
            },
            reply => reply,
        }
    }

    /// The effect an in-progress key links, read for its 409 alone (a
    /// retry that found its intent still running), so that no other
    /// answer pays for it. `None` when there is none, or it cannot be read:
    /// the 409 is right without it.
    async fn linked_effect(&self, user_id: &str, key: &IdempotencyKey) -> Option<String> {
        let read = async {
            let client = self.route.pool(user_id).get().await?;
            store::linked_effect(&client, user_id, key).await
        };
        read.await.unwrap_or_else(|error: Error| {
            tracing::warn!(%error, "could not read the effect of a key in progress");
            None
        })
    }

    /// Does the work of a claim and stores its answer; the answer cache
    /// keeps it for the `life` its key had when claimed, and the waiters of
    /// the key in this process are woken to it.
    async fn work<W, Fut, E>(
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
        (self.observe)(claim.kind.into());
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

    async fn store<E>(
        &self,
        claim: &Claim,
        hash: &RequestHash,
        response: StoredResponse,
    ) -> Result<Reply, RunError<E>> {
        let client = self.route.pool(&claim.user_id).get().await.map_err(Error::from)?;
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
        let client = self.route.pool(&claim.user_id).get().await.map_err(Error::from)?;
        let (now, _) = store::look(&client, self.policy, &claim.user_id, &claim.key, hash).await?;
        Ok(Reply::from(now))
    }

    /// Gives the key back if nothing durable was made, so that a retry starts
    /// afresh; a key with a linked effect stays in progress.
    async fn release(&self, claim: &Claim) {
        let released = match self.route.pool(&claim.user_id).get().await {
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
struct Decision {
    begun: Begin,
    gate: Option<i64>,
    life: Option<(Asked, Duration)>,
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
