//! Time as the simulated providers and tests see it: a `Clock` trait, the system clock, and
//! a manual clock tests advance by hand. The claim engine takes `now` as an argument instead.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::jiff::{SignedDuration, Timestamp};

/// A source of the current time.
pub trait Clock: Send + Sync {
    /// Now.
    fn now(&self) -> Timestamp;
}

/// The system clock.
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// A clock that moves only when told to.
#[derive(Clone, Debug)]
pub struct ManualClock {
    now: Arc<Mutex<Timestamp>>,
}

impl ManualClock {
    /// A clock standing at `start`.
    pub fn new(start: Timestamp) -> Self {
        Self { now: Arc::new(Mutex::new(start)) }
    }

    /// Moves the clock forward.
    pub fn advance(&self, by: Duration) {
        if let Ok(mut now) = self.now.lock() {
            *now = add(*now, by);
        }
    }

    /// Sets the clock.
    pub fn set(&self, to: Timestamp) {
        if let Ok(mut now) = self.now.lock() {
            *now = to;
        }
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        self.now.lock().map(|n| *n).unwrap_or(Timestamp::UNIX_EPOCH)
    }
}

/// `at + by`, saturating.
pub fn add(at: Timestamp, by: Duration) -> Timestamp {
    let by = SignedDuration::try_from(by).unwrap_or(SignedDuration::MAX);
    at.checked_add(by).unwrap_or(Timestamp::MAX)
}

/// `to - from`, zero when `to` is earlier.
pub fn elapsed(from: Timestamp, to: Timestamp) -> Duration {
    Duration::try_from(to.duration_since(from)).unwrap_or(Duration::ZERO)
}
