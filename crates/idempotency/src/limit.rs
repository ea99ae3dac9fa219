//! A per-scope limit on new intents: a token bucket (GCRA, `governor`) for
//! each `user_id`, in this process. Only a request that would claim a new
//! key is refused past it, and it writes nothing; one whose key exists
//! (a replay, a 409, a 422) is answered from the row, so a retry always
//! reaches its answer. A request under the limit pays one in-memory check.

use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};

/// New intents per scope: `per_sec` on average, `burst` at once.
#[derive(Clone)]
pub struct Limit {
    buckets: Arc<DefaultKeyedRateLimiter<String>>,
    clock: DefaultClock,
}

impl Limit {
    pub fn new(per_sec: NonZeroU32, burst: NonZeroU32) -> Self {
        let quota = Quota::per_second(per_sec).allow_burst(burst);
        Self {
            buckets: Arc::new(RateLimiter::keyed(quota)),
            clock: DefaultClock::default(),
        }
    }

    /// Takes a token of `user_id`'s bucket, or says how long until one is
    /// there.
    pub fn take(&self, user_id: &str) -> Result<(), Duration> {
        self.buckets
            .check_key(&user_id.to_owned())
            .map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }

    /// Forgets the buckets that are full again, so that the map holds only
    /// the scopes seen lately.
    pub fn shrink(&self) {
        self.buckets.retain_recent();
    }
}
