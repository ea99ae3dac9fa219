//! A circuit breaker that follows Payrail's health, not a few buyers' cards.
//!
//! It decides by buyers, not by calls: it remembers the last `2 × failures`
//! distinct buyers whose clicks reached Payrail, each with the outcome of
//! their latest attempt, and opens when more than half of them (one more
//! than `failures` at least) failed. A buyer counts once however often they click, so
//! up to `failures` accounts whose cards make Payrail fail (on purpose,
//! over and over) can never open it, whether or not anyone else is
//! clicking; a real outage, in which every buyer's attempt fails, opens it
//! after the clicks of one buyer more than `failures`. Open, it refuses every call for
//! `open_for`; then it closes with nothing remembered, and the next buyers'
//! clicks decide afresh. There is no single probe for an attacker to take:
//! as many buyers as opened it must fail again to reopen it
//! (docs/decisions/0013-breaker-counts-buyers.md).
//!
//! Per instance, in memory: it guards this process's view of Payrail and
//! needs no shared state. It holds at most `2 × failures` buyers.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::observe::Gauge;

pub(super) const OPEN: Gauge = Gauge::new(
    "payrail_breaker_open",
    "1 while the Payrail circuit breaker is open, else 0",
);

#[derive(Debug)]
pub struct Breaker {
    /// Failing buyers past which the breaker opens: `failures + 1`.
    to_open: usize,
    /// How many buyers it remembers: `2 × failures`.
    window: usize,
    open_for: Duration,
    state: Mutex<State>,
}

#[derive(Debug)]
enum State {
    Closed {
        /// The latest buyers to reach Payrail, oldest first, each once,
        /// with whether their latest attempt failed.
        buyers: VecDeque<(String, bool)>,
    },
    /// Refusing every call until then.
    Open { until: Instant },
}

impl Breaker {
    pub fn new(failures: u32, open_for: Duration) -> Self {
        let failures = usize::try_from(failures.max(1)).unwrap_or(usize::MAX / 2);
        Self {
            to_open: failures + 1,
            window: failures * 2,
            open_for,
            state: Mutex::new(State::Closed {
                buyers: VecDeque::new(),
            }),
        }
    }

    /// `None` while calls may go out; else how long until they may.
    pub fn open(&self) -> Option<Duration> {
        let mut state = self.lock();
        let State::Open { until } = *state else {
            return None;
        };
        let left = until.checked_duration_since(Instant::now());
        if left.is_none() {
            tracing::info!("payrail circuit breaker closed");
            OPEN.get().set(0.0);
            *state = State::Closed {
                buyers: VecDeque::new(),
            };
        }
        left
    }

    pub fn record_success(&self, buyer: &str) {
        self.record(buyer, false);
    }

    pub fn record_failure(&self, buyer: &str) {
        self.record(buyer, true);
    }

    fn record(&self, buyer: &str, failed: bool) {
        let mut state = self.lock();
        // A call let through before it opened: nothing new.
        let State::Closed { buyers } = &mut *state else {
            return;
        };
        if let Some(at) = buyers.iter().position(|(who, _)| who == buyer) {
            buyers.remove(at);
        }
        buyers.push_back((buyer.to_owned(), failed));
        if buyers.len() > self.window {
            buyers.pop_front();
        }
        let failing = buyers.iter().filter(|(_, failed)| *failed).count();
        if failing < self.to_open {
            return;
        }
        tracing::warn!(
            failing_buyers = failing,
            buyers = buyers.len(),
            "payrail circuit breaker opened"
        );
        OPEN.get().set(1.0);
        *state = State::Open {
            until: Instant::now() + self.open_for,
        };
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // The state is plain data, valid even if a holder panicked.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Duration = Duration::from_secs(3_600);

    fn buyer(i: usize) -> String {
        format!("buyer-{i}")
    }

    #[test]
    fn an_outage_opens_it_after_one_more_buyer_than_failures() {
        for failures in [1, 2, 5] {
            let breaker = Breaker::new(failures, HOUR);
            for i in 0..failures as usize {
                breaker.record_failure(&buyer(i));
                assert!(breaker.open().is_none(), "{failures}: {i}");
            }
            breaker.record_failure(&buyer(failures as usize));
            assert!(breaker.open().is_some(), "{failures}");
        }
    }

    #[test]
    fn one_buyer_failing_alone_never_opens_it() {
        for failures in [1, 2, 5] {
            let breaker = Breaker::new(failures, HOUR);
            for _ in 0..100 {
                assert!(breaker.open().is_none());
                breaker.record_failure("mallory");
            }
            assert!(breaker.open().is_none(), "{failures}");
        }
    }

    #[test]
    fn as_many_attackers_as_failures_never_open_it_alone_or_among_honest_buyers() {
        let breaker = Breaker::new(5, HOUR);
        for round in 0..100 {
            for attacker in 0..5 {
                breaker.record_failure(&format!("mallory-{attacker}"));
            }
            if round % 3 == 0 {
                breaker.record_success(&buyer(round));
            }
            assert!(breaker.open().is_none(), "{round}");
        }
        // One more buyer failing is more than half of the ten remembered.
        breaker.record_failure("an honest buyer whose card failed");
        assert!(breaker.open().is_some());
    }

    #[test]
    fn a_buyer_counts_by_their_latest_attempt() {
        let breaker = Breaker::new(2, HOUR);
        breaker.record_failure("alice");
        breaker.record_failure("bob");
        breaker.record_success("alice");
        breaker.record_failure("carol");
        assert!(breaker.open().is_none(), "alice's retry succeeded");
        breaker.record_failure("alice");
        assert!(breaker.open().is_some());
    }

    #[test]
    fn the_oldest_buyer_is_forgotten_beyond_the_window() {
        let breaker = Breaker::new(2, HOUR);
        for who in ["a", "b"] {
            breaker.record_failure(who);
        }
        for who in ["c", "d", "e"] {
            breaker.record_success(who);
        }
        // a and b are forgotten as f and g come: f and g of d..g failed.
        breaker.record_failure("f");
        breaker.record_failure("g");
        assert!(breaker.open().is_none());
        breaker.record_failure("h");
        assert!(breaker.open().is_some(), "f, g and h of e..h");
    }

    #[test]
    fn it_closes_after_its_time_with_nothing_remembered() {
        let breaker = Breaker::new(1, Duration::from_millis(30));
        breaker.record_failure("alice");
        breaker.record_failure("bob");
        assert!(breaker.open().is_some());
        // A late answer of a call let through before it opened changes nothing.
        breaker.record_success("carol");
        assert!(breaker.open().is_some());
        std::thread::sleep(Duration::from_millis(40));
        assert!(breaker.open().is_none());
        breaker.record_failure("alice");
        assert!(
            breaker.open().is_none(),
            "one failing buyer of a fresh window"
        );
        breaker.record_failure("bob");
        assert!(breaker.open().is_some(), "an outage reopens it as fast");
    }
}
