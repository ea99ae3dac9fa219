//! A circuit breaker: after `failures` consecutive failed attempts it opens
//! and refuses calls for `open_for`; then it lets one probe through, which
//! closes it on success or opens it again on failure. Per instance: it guards
//! this process's view of Payrail, so it needs no shared state.

use std::sync::Mutex;
use std::time::{Duration, Instant};

#[derive(Debug)]
pub struct Breaker {
    failures_to_open: u32,
    open_for: Duration,
    state: Mutex<State>,
}

#[derive(Debug, Clone, Copy)]
enum State {
    Closed {
        failures: u32,
    },
    /// Refusing until `until`; the first call after it is the probe.
    Open {
        until: Instant,
    },
}

impl Breaker {
    pub fn new(failures_to_open: u32, open_for: Duration) -> Self {
        Self {
            failures_to_open: failures_to_open.max(1),
            open_for,
            state: Mutex::new(State::Closed { failures: 0 }),
        }
    }

    /// `Ok` when a call may go out; else how long until the breaker half-opens.
    pub fn allow(&self) -> Result<(), Duration> {
        let mut state = self.lock();
        match *state {
            State::Closed { .. } => Ok(()),
            State::Open { until } => {
                let now = Instant::now();
                if now < until {
                    return Err(until - now);
                }
                // Half-open: this call is the probe; everyone else keeps
                // waiting until it reports (or until another `open_for` passes,
                // should the probe never report).
                *state = State::Open {
                    until: now + self.open_for,
                };
                Ok(())
            }
        }
    }

    /// Like `allow`, without taking the probe.
    pub fn is_open(&self) -> Option<Duration> {
        match *self.lock() {
            State::Open { until } => until.checked_duration_since(Instant::now()),
            State::Closed { .. } => None,
        }
    }

    pub fn record_success(&self) {
        let mut state = self.lock();
        if matches!(*state, State::Open { .. }) {
            tracing::info!("payrail circuit breaker closed");
            crate::observe::breaker_open(false);
        }
        *state = State::Closed { failures: 0 };
    }

    pub fn record_failure(&self) {
        let mut state = self.lock();
        let failures = match *state {
            State::Closed { failures } => failures + 1,
            State::Open { .. } => self.failures_to_open,
        };
        *state = if failures >= self.failures_to_open {
            if !matches!(*state, State::Open { .. }) {
                tracing::warn!(failures, "payrail circuit breaker opened");
                crate::observe::breaker_open(true);
            }
            State::Open {
                until: Instant::now() + self.open_for,
            }
        } else {
            State::Closed { failures }
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

    #[test]
    fn opens_after_consecutive_failures_and_a_success_resets_the_count() {
        let breaker = Breaker::new(3, Duration::from_secs(60));
        breaker.record_failure();
        breaker.record_failure();
        breaker.record_success();
        breaker.record_failure();
        breaker.record_failure();
        assert!(breaker.allow().is_ok());
        breaker.record_failure();
        assert!(breaker.allow().is_err());
    }

    #[test]
    fn half_opens_for_one_probe_that_closes_or_reopens_it() {
        let breaker = Breaker::new(1, Duration::from_millis(20));
        breaker.record_failure();
        assert!(breaker.allow().is_err());
        std::thread::sleep(Duration::from_millis(25));
        assert!(breaker.allow().is_ok(), "the probe");
        assert!(breaker.allow().is_err(), "only one probe at a time");
        breaker.record_failure();
        assert!(breaker.allow().is_err(), "a failed probe reopens it");
        std::thread::sleep(Duration::from_millis(25));
        assert!(breaker.allow().is_ok());
        breaker.record_success();
        assert!(breaker.allow().is_ok());
        assert!(breaker.allow().is_ok(), "closed again");
    }
}
