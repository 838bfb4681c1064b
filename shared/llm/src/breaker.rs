//! A small consecutive-failure circuit breaker.
//!
//! Closed: calls pass; `failure_threshold` consecutive transient failures (counted after retries)
//! open it. Open: calls fail fast until `cooldown` has passed. Half-open: exactly one probe call
//! passes (others fail fast); its success closes the breaker, its transient failure reopens it, and
//! an outcome that says nothing about the backend (deadline, cancellation) lets the next call probe.
//! Time comes from a [`Clock`] (the system clock unless one is injected, as tests do).

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::clock::{Clock, SystemClock};

/// Observable breaker state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Inner {
    Closed { failures: u32 },
    Open { until: Instant },
    HalfOpen { probing: bool },
}

/// What a finished call tells the breaker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The backend answered (including deterministic errors such as HTTP 400).
    Healthy,
    /// The backend failed transiently (5xx, 429, connect errors) after retries.
    Failed,
    /// Says nothing about the backend (deadline passed, call abandoned).
    Neutral,
}

#[derive(Debug)]
pub struct CircuitBreaker {
    clock: Arc<dyn Clock>,
    failure_threshold: u32,
    cooldown: Duration,
    inner: Mutex<Inner>,
}

impl CircuitBreaker {
    /// A closed breaker on the system clock.
    pub fn new(failure_threshold: u32, cooldown: Duration) -> Self {
        Self::with_clock(failure_threshold, cooldown, Arc::new(SystemClock))
    }

    /// A closed breaker on `clock`.
    pub fn with_clock(failure_threshold: u32, cooldown: Duration, clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            failure_threshold: failure_threshold.max(1),
            cooldown,
            inner: Mutex::new(Inner::Closed { failures: 0 }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn state(&self) -> BreakerState {
        match *self.lock() {
            Inner::Closed { .. } => BreakerState::Closed,
            Inner::Open { until } if self.clock.now() >= until => BreakerState::HalfOpen,
            Inner::Open { .. } => BreakerState::Open,
            Inner::HalfOpen { .. } => BreakerState::HalfOpen,
        }
    }

    /// Ask to make a call. `None` means fail fast (open, or a half-open probe is in flight).
    pub fn try_acquire(self: &Arc<Self>) -> Option<BreakerPermit> {
        let mut inner = self.lock();
        let probe = match *inner {
            Inner::Closed { .. } => false,
            Inner::Open { until } if self.clock.now() >= until => {
                *inner = Inner::HalfOpen { probing: true };
                true
            }
            Inner::Open { .. } | Inner::HalfOpen { probing: true } => return None,
            Inner::HalfOpen { probing: false } => {
                *inner = Inner::HalfOpen { probing: true };
                true
            }
        };
        Some(BreakerPermit { breaker: self.clone(), probe, recorded: false })
    }

    fn record(&self, probe: bool, outcome: Outcome) -> Option<BreakerState> {
        let mut inner = self.lock();
        let before = *inner;
        *inner = match (before, outcome) {
            (_, Outcome::Healthy) => Inner::Closed { failures: 0 },
            (Inner::Closed { failures }, Outcome::Failed) => {
                let failures = failures.saturating_add(1);
                if failures >= self.failure_threshold {
                    Inner::Open { until: self.clock.now() + self.cooldown }
                } else {
                    Inner::Closed { failures }
                }
            }
            (Inner::HalfOpen { .. }, Outcome::Failed) if probe => {
                Inner::Open { until: self.clock.now() + self.cooldown }
            }
            (Inner::HalfOpen { .. }, Outcome::Neutral) if probe => Inner::HalfOpen { probing: false },
            // A non-probe call that started while closed and ends after the breaker moved on
            // does not change the state.
            (
                state @ (Inner::Closed { .. } | Inner::Open { .. } | Inner::HalfOpen { .. }),
                Outcome::Failed | Outcome::Neutral,
            ) => state,
        };
        let changed = std::mem::discriminant(&before) != std::mem::discriminant(&*inner);
        drop(inner);
        changed.then(|| self.state())
    }
}

/// Permission for one call; report its outcome with [`BreakerPermit::record`]. Dropping it
/// unrecorded (the caller went away) counts as [`Outcome::Neutral`].
#[derive(Debug)]
pub struct BreakerPermit {
    breaker: Arc<CircuitBreaker>,
    probe: bool,
    recorded: bool,
}

impl BreakerPermit {
    /// Record the outcome; returns the new state when it changed.
    pub fn record(mut self, outcome: Outcome) -> Option<BreakerState> {
        self.recorded = true;
        self.breaker.record(self.probe, outcome)
    }
}

impl Drop for BreakerPermit {
    fn drop(&mut self) {
        if !self.recorded {
            self.breaker.record(self.probe, Outcome::Neutral);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn opens_after_threshold_and_probes_after_cooldown() {
        let b = Arc::new(CircuitBreaker::new(2, Duration::from_millis(50)));
        b.try_acquire().unwrap().record(Outcome::Failed);
        assert_eq!(b.state(), BreakerState::Closed);
        assert_eq!(b.try_acquire().unwrap().record(Outcome::Failed), Some(BreakerState::Open));
        assert!(b.try_acquire().is_none());
        std::thread::sleep(Duration::from_millis(60));
        assert_eq!(b.state(), BreakerState::HalfOpen);
        let probe = b.try_acquire().unwrap();
        assert!(b.try_acquire().is_none(), "only one probe");
        probe.record(Outcome::Healthy);
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn failed_probe_reopens_and_dropped_probe_frees_the_slot() {
        let b = Arc::new(CircuitBreaker::new(1, Duration::from_millis(20)));
        b.try_acquire().unwrap().record(Outcome::Failed);
        std::thread::sleep(Duration::from_millis(30));
        drop(b.try_acquire().unwrap());
        let probe = b.try_acquire().expect("a dropped probe lets the next call probe");
        probe.record(Outcome::Failed);
        assert_eq!(b.state(), BreakerState::Open);
    }

    #[test]
    fn healthy_resets_the_count() {
        let b = Arc::new(CircuitBreaker::new(2, Duration::from_secs(30)));
        b.try_acquire().unwrap().record(Outcome::Failed);
        b.try_acquire().unwrap().record(Outcome::Healthy);
        b.try_acquire().unwrap().record(Outcome::Failed);
        assert_eq!(b.state(), BreakerState::Closed);
    }

    #[test]
    fn breaker_opens_after_three_failures_then_half_opens_on_the_clock() {
        let clock = Arc::new(crate::clock::ManualClock::new());
        const COOLDOWN: Duration = Duration::from_secs(30);
        let b = Arc::new(CircuitBreaker::with_clock(3, COOLDOWN, clock.clone()));
        for _ in 0..2 {
            b.try_acquire().unwrap().record(Outcome::Failed);
            assert_eq!(b.state(), BreakerState::Closed);
        }
        b.try_acquire().unwrap().record(Outcome::Healthy);
        for _ in 0..3 {
            b.try_acquire().unwrap().record(Outcome::Failed);
        }
        assert_eq!(b.state(), BreakerState::Open);
        assert!(b.try_acquire().is_none());
        clock.advance(COOLDOWN - Duration::from_millis(1));
        assert!(b.try_acquire().is_none(), "still open 1 ms before the cooldown ends");
        clock.advance(Duration::from_millis(1));
        assert_eq!(b.state(), BreakerState::HalfOpen);
        let trial = b.try_acquire().expect("one trial call");
        assert!(b.try_acquire().is_none(), "only one trial at a time");
        trial.record(Outcome::Failed);
        assert_eq!(b.state(), BreakerState::Open, "a failed trial reopens");
        clock.advance(COOLDOWN);
        let trial = b.try_acquire().unwrap();
        drop(trial);
        let trial = b.try_acquire().expect("an abandoned trial lets the next call try");
        trial.record(Outcome::Healthy);
        assert_eq!(b.state(), BreakerState::Closed);
    }
}
