//! A circuit breaker that follows Payrail's health, not one buyer's card.
//!
//! Closed, it counts failed attempts since the last success, by buyer: each
//! buyer counts for at most half of `failures` (rounded up), and it opens
//! only once the count reaches `failures` with at least two buyers in it. One
//! buyer whose card makes Payrail fail (or who makes it fail on purpose, over
//! and over) can thus never open it alone; failures of several buyers still
//! do, as before. Open, it refuses calls for `open_for`; then it lets one
//! probe through at a time. A probe that succeeds closes it. A probe that
//! fails hands the next probe to another buyer, and reopens it only when the
//! probes of two buyers in a row have failed: a buyer who keeps failing can
//! neither take every probe nor keep it open by failing them.
//!
//! Per instance, in memory: it guards this process's view of Payrail and
//! needs no shared state. The closed count holds at most `failures` buyers
//! (each adds one at least), so it stays small.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::observe::Gauge;

pub(super) const OPEN: Gauge = Gauge::new(
    "payrail_breaker_open",
    "1 while the Payrail circuit breaker is open, else 0",
);

#[derive(Debug)]
pub struct Breaker {
    failures_to_open: u32,
    per_buyer: u32,
    open_for: Duration,
    state: Mutex<State>,
}

#[derive(Debug)]
enum State {
    Closed {
        /// Each failing buyer and the failures counted for them (at most
        /// `per_buyer`), since the last success.
        failed: Vec<(String, u32)>,
    },
    /// Refusing until `until`; the first call after it is the probe.
    Open {
        until: Instant,
        /// The buyer whose call is the probe now.
        prober: Option<String>,
        /// The buyer whose probe failed last: the next probe is another's.
        failed_prober: Option<String>,
    },
}

impl Breaker {
    pub fn new(failures_to_open: u32, open_for: Duration) -> Self {
        let failures_to_open = failures_to_open.max(1);
        Self {
            failures_to_open,
            per_buyer: failures_to_open.div_ceil(2),
            open_for,
            state: Mutex::new(State::Closed { failed: Vec::new() }),
        }
    }

    /// `Ok` when `buyer`'s call may go out; else how long until it may try.
    pub fn allow(&self, buyer: &str) -> Result<(), Duration> {
        let mut state = self.lock();
        let State::Open {
            until,
            prober,
            failed_prober,
        } = &mut *state
        else {
            return Ok(());
        };
        let now = Instant::now();
        if now < *until {
            return Err(*until - now);
        }
        if failed_prober.as_deref() == Some(buyer) {
            return Err(self.open_for);
        }
        // Half-open: this call is the probe; everyone else keeps waiting
        // until it reports (or until another `open_for` passes, should the
        // probe never report).
        *until = now + self.open_for;
        *prober = Some(buyer.to_owned());
        Ok(())
    }

    /// Like `allow`, without taking the probe.
    pub fn is_open(&self, buyer: &str) -> Option<Duration> {
        match &*self.lock() {
            State::Closed { .. } => None,
            State::Open { failed_prober, .. } if failed_prober.as_deref() == Some(buyer) => {
                Some(self.open_for)
            }
            State::Open { until, .. } => until.checked_duration_since(Instant::now()),
        }
    }

    pub fn record_success(&self) {
        let mut state = self.lock();
        if matches!(*state, State::Open { .. }) {
            tracing::info!("payrail circuit breaker closed");
            OPEN.get().set(0.0);
        }
        *state = State::Closed { failed: Vec::new() };
    }

    pub fn record_failure(&self, buyer: &str) {
        let mut state = self.lock();
        let next = match &mut *state {
            State::Closed { failed } => {
                match failed.iter_mut().find(|(who, _)| who == buyer) {
                    Some((_, counted)) => *counted = (*counted + 1).min(self.per_buyer),
                    None => failed.push((buyer.to_owned(), 1)),
                }
                let counted: u32 = failed.iter().map(|(_, counted)| counted).sum();
                if failed.len() < 2 || counted < self.failures_to_open {
                    return;
                }
                tracing::warn!(
                    failures = counted,
                    buyers = failed.len(),
                    "payrail circuit breaker opened"
                );
                OPEN.get().set(1.0);
                None
            }
            // A call let through before it opened: nothing new.
            State::Open { prober, .. } if prober.as_deref() != Some(buyer) => return,
            State::Open { failed_prober, .. } => match failed_prober.take() {
                Some(earlier) if earlier != buyer => None,
                // The first failed probe, or the same buyer's again: the next
                // call of another buyer probes at once.
                _ => Some(buyer.to_owned()),
            },
        };
        *state = match next {
            None => State::Open {
                until: Instant::now() + self.open_for,
                prober: None,
                failed_prober: None,
            },
            Some(failed_prober) => State::Open {
                until: Instant::now(),
                prober: None,
                failed_prober: Some(failed_prober),
            },
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

    #[test]
    fn opens_after_failures_of_several_buyers_and_a_success_resets_the_count() {
        let breaker = Breaker::new(3, HOUR);
        breaker.record_failure("alice");
        breaker.record_failure("bob");
        breaker.record_success();
        breaker.record_failure("alice");
        breaker.record_failure("bob");
        assert!(breaker.allow("carol").is_ok());
        breaker.record_failure("carol");
        assert!(breaker.allow("carol").is_err());
        assert!(breaker.is_open("dave").is_some());
    }

    #[test]
    fn one_buyer_failing_alone_never_opens_it() {
        for failures in [1, 2, 5] {
            let breaker = Breaker::new(failures, HOUR);
            for _ in 0..100 {
                assert!(breaker.allow("mallory").is_ok());
                breaker.record_failure("mallory");
            }
            assert!(breaker.allow("alice").is_ok(), "{failures}");
            assert!(breaker.is_open("alice").is_none(), "{failures}");
        }
    }

    #[test]
    fn each_buyer_counts_for_at_most_half_of_the_failures() {
        let breaker = Breaker::new(5, HOUR);
        for _ in 0..10 {
            breaker.record_failure("mallory");
        }
        // Mallory's ten count for three: one more buyer's one failure is 4.
        breaker.record_failure("alice");
        assert!(breaker.allow("bob").is_ok(), "4 of 5");
        breaker.record_failure("bob");
        assert!(breaker.allow("bob").is_err(), "5 of 5, three buyers");
    }

    #[test]
    fn half_opens_for_one_probe_that_closes_it_on_success() {
        let breaker = Breaker::new(1, Duration::from_millis(20));
        breaker.record_failure("alice");
        breaker.record_failure("bob");
        assert!(breaker.allow("alice").is_err());
        std::thread::sleep(Duration::from_millis(25));
        assert!(breaker.allow("alice").is_ok(), "the probe");
        assert!(breaker.allow("bob").is_err(), "only one probe at a time");
        breaker.record_success();
        assert!(breaker.allow("bob").is_ok());
        assert!(breaker.allow("carol").is_ok(), "closed again");
    }

    #[test]
    fn failed_probes_of_two_buyers_reopen_it() {
        let breaker = Breaker::new(1, Duration::from_millis(20));
        breaker.record_failure("alice");
        breaker.record_failure("bob");
        std::thread::sleep(Duration::from_millis(25));
        assert!(breaker.allow("alice").is_ok());
        breaker.record_failure("alice");
        assert!(breaker.allow("bob").is_ok(), "another buyer probes at once");
        breaker.record_failure("bob");
        assert!(breaker.allow("carol").is_err(), "two buyers' probes failed");
    }

    #[test]
    fn a_buyer_whose_probes_keep_failing_cannot_keep_it_open() {
        let breaker = Breaker::new(1, Duration::from_millis(20));
        breaker.record_failure("alice");
        breaker.record_failure("bob");
        std::thread::sleep(Duration::from_millis(25));
        assert!(breaker.allow("mallory").is_ok(), "mallory takes the probe");
        breaker.record_failure("mallory");
        assert!(breaker.allow("mallory").is_err(), "but not the next one");
        assert!(breaker.is_open("mallory").is_some());
        assert!(breaker.is_open("alice").is_none(), "alice may probe");
        assert!(breaker.allow("alice").is_ok());
        breaker.record_success();
        assert!(breaker.allow("mallory").is_ok(), "closed for everyone");
    }

    #[test]
    fn a_late_failure_of_a_call_from_before_it_opened_changes_nothing() {
        let breaker = Breaker::new(1, HOUR);
        breaker.record_failure("alice");
        breaker.record_failure("bob");
        breaker.record_failure("carol");
        let left = breaker.is_open("dave").expect("open");
        assert!(left > HOUR - Duration::from_secs(1));
        assert!(breaker.allow("dave").is_err());
    }
}
