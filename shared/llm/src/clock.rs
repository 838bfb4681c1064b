//! Time for the breakers and caches, injectable so tests drive it without sleeping.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Source of the current time.
pub trait Clock: Send + Sync + std::fmt::Debug {
    fn now(&self) -> Instant;
}

/// The real clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
}

/// A clock that moves only when told to (tests).
#[derive(Debug)]
pub struct ManualClock {
    start: Instant,
    offset: Mutex<Duration>,
}

impl Default for ManualClock {
    fn default() -> Self {
        Self { start: Instant::now(), offset: Mutex::new(Duration::ZERO) }
    }
}

impl ManualClock {
    pub fn new() -> Self {
        Self::default()
    }

    /// Move the clock forward.
    pub fn advance(&self, by: Duration) {
        *lock(&self.offset) += by;
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Instant {
        self.start + *lock(&self.offset)
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}
