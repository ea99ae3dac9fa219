//! What a keyed request is answered ([`Reply`], or a [`RunError`]), how
//! long it waited for it ([`Ran`]), and what its key decided, for metrics
//! ([`Outcome`]).

use std::time::Duration;

use crate::claim::ClaimKind;
use crate::store::Begin;
use crate::wait::WaitOutcome;
use crate::error::Error;
use crate::response::StoredResponse;

/// What to answer the request.
#[derive(Debug)]
pub enum Reply {
    /// This request did the work; its answer, as stored.
    First(StoredResponse),
    /// The intent's stored answer, again.
    Replay(StoredResponse),
    /// Another request holds the intent right now: come back shortly. The
    /// effect the intent has linked already, if any (an order waiting for
    /// its payment), so that the answer can point at it.
    InProgress { effect: Option<String> },
    /// The key was first used for a different request; never its answer.
    KeyReused,
    /// A new intent past the scope's limit: nothing was written; come back
    /// after this long.
    Limited(Duration),
}

impl From<Begin> for Reply {
    /// The reply of a request that does not get to do the work.
    fn from(begun: Begin) -> Self {
        match begun {
            Begin::Replay(response) => Reply::Replay(response),
            Begin::KeyReused => Reply::KeyReused,
            Begin::Limited(wait) => Reply::Limited(wait),
            Begin::InProgress | Begin::Claimed(_) => Reply::InProgress { effect: None },
        }
    }
}

/// A reply, and how long the request waited for it, if it did.
#[derive(Debug)]
pub struct Ran {
    pub reply: Reply,
    pub waited: Option<(WaitOutcome, Duration)>,
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

    pub(crate) fn of(begun: &Begin) -> Self {
        match begun {
            Begin::Claimed(claim) => claim.kind.into(),
            Begin::Replay(_) => Outcome::Replay,
            Begin::InProgress => Outcome::InProgress,
            Begin::KeyReused => Outcome::KeyReused,
            Begin::Limited(_) => Outcome::RateLimited,
        }
    }
}

impl From<ClaimKind> for Outcome {
    fn from(kind: ClaimKind) -> Self {
        match kind {
            ClaimKind::First => Outcome::First,
            ClaimKind::Expired => Outcome::ExpiredTakeover,
            ClaimKind::Abandoned => Outcome::LeaseTakeover,
        }
    }
}
