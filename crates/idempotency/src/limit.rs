//! A per-scope limit on new intents: a token bucket for each `user_id`, in
//! this process. The engine takes a token before it claims a key and gives
//! it back when the claim finds the key taken (a replay, a 409, a 422, the
//! takeover of an abandoned claim), so a retry never spends one and a
//! request under the limit pays one in-memory check and no statement.
//! Giving a token back is what a rate-limiting crate such as `governor`
//! does not offer, hence these few lines.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

/// New intents per scope: `per_sec` on average, `burst` at once.
#[derive(Clone)]
pub struct Limit {
    per_sec: f64,
    burst: f64,
    buckets: Arc<Mutex<HashMap<String, Bucket>>>,
}

/// A scope's tokens as of `at`.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Limit {
    pub fn new(per_sec: NonZeroU32, burst: NonZeroU32) -> Self {
        Self {
            per_sec: f64::from(per_sec.get()),
            burst: f64::from(burst.get()),
            buckets: Arc::default(),
        }
    }

    /// Takes a token of `user_id`'s bucket, or says how long until one is
    /// there.
    pub fn take(&self, user_id: &str) -> Result<(), Duration> {
        let now = Instant::now();
        let mut buckets = self.buckets();
        let bucket = match buckets.get_mut(user_id) {
            Some(bucket) => bucket,
            None => buckets.entry(user_id.to_owned()).or_insert(Bucket {
                tokens: self.burst,
                at: now,
            }),
        };
        self.refill(bucket, now);
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64(
                (1.0 - bucket.tokens) / self.per_sec,
            ))
        }
    }

    /// Gives back a token taken for a request that turned out not to start
    /// an intent.
    pub fn give_back(&self, user_id: &str) {
        if let Some(bucket) = self.buckets().get_mut(user_id) {
            bucket.tokens = (bucket.tokens + 1.0).min(self.burst);
        }
    }

    /// Forgets the buckets that are full again, so that the map holds only
    /// the scopes seen lately.
    pub fn shrink(&self) {
        let now = Instant::now();
        self.buckets().retain(|_, bucket| {
            self.refill(bucket, now);
            bucket.tokens < self.burst
        });
    }

    fn refill(&self, bucket: &mut Bucket, now: Instant) {
        let earned = now.saturating_duration_since(bucket.at).as_secs_f64() * self.per_sec;
        bucket.tokens = (bucket.tokens + earned).min(self.burst);
        bucket.at = now;
    }

    /// No code panics while holding the map, and its buckets are valid at
    /// every step anyway: a poisoned lock is taken as it is.
    fn buckets(&self) -> MutexGuard<'_, HashMap<String, Bucket>> {
        self.buckets.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limit(per_sec: u32, burst: u32) -> Limit {
        Limit::new(
            NonZeroU32::new(per_sec).unwrap(),
            NonZeroU32::new(burst).unwrap(),
        )
    }

    #[test]
    fn a_burst_then_the_wait_for_the_next_token() {
        let limit = limit(2, 3);
        for _ in 0..3 {
            assert_eq!(limit.take("alice"), Ok(()));
        }
        let wait = limit.take("alice").unwrap_err();
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_millis(500),
            "one token every 500 ms: {wait:?}"
        );
        assert_eq!(limit.take("bob"), Ok(()), "each scope has its own bucket");
    }

    #[test]
    fn a_token_given_back_is_there_again_but_never_past_the_burst() {
        let limit = limit(1, 1);
        assert_eq!(limit.take("alice"), Ok(()));
        limit.give_back("alice");
        assert_eq!(limit.take("alice"), Ok(()));
        assert!(limit.take("alice").is_err());
        limit.give_back("alice");
        limit.give_back("alice");
        assert_eq!(limit.take("alice"), Ok(()));
        assert!(limit.take("alice").is_err(), "the burst is 1");
    }

    #[test]
    fn shrink_forgets_full_buckets_only() {
        let limit = limit(1, 2);
        limit.take("alice").unwrap();
        limit.take("bob").unwrap();
        limit.give_back("bob");
        limit.shrink();
        let kept: Vec<String> = limit.buckets().keys().cloned().collect();
        assert_eq!(kept, ["alice"]);
    }
}
