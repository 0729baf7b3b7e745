//! A consecutive-failure circuit breaker with half-open probes, as a pure state machine: time
//! is passed in. Closed lets traffic through and counts consecutive failures; at the limit it
//! opens for a period; then it admits exactly one real request (half-open), whose success
//! closes it and whose failure re-opens it for twice as long. Background probes move an open
//! circuit: a probe that finds the route answering lets the half-open request through now, a
//! failed one keeps the circuit open for another period, so no user request is spent on a
//! route that is still down.

use std::time::{Duration, Instant};

/// Circuit breaker settings.
#[derive(Clone, Copy, Debug)]
pub struct BreakerConfig {
    /// Consecutive failures that open the circuit.
    pub failures: u32,
    /// First open period.
    pub open: Duration,
    /// Longest open period.
    pub max_open: Duration,
}

/// The breaker's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum BreakerState {
    /// Traffic flows; `failures` consecutive failures so far.
    Closed {
        /// Consecutive failures.
        failures: u32,
    },
    /// No traffic until `until`; then one probe.
    Open {
        /// End of the open period.
        until: Instant,
        /// Its length (doubles on a failed probe).
        period: Duration,
    },
    /// One probe request is in flight.
    HalfOpen {
        /// The open period that preceded it.
        period: Duration,
    },
}

/// A consecutive-failure circuit breaker with half-open probes. Pure: time is passed in.
#[derive(Clone, Debug)]
pub struct Breaker {
    cfg: BreakerConfig,
    /// Current state.
    pub state: BreakerState,
}

impl Breaker {
    /// A closed breaker.
    pub fn new(cfg: BreakerConfig) -> Self {
        Breaker { cfg, state: BreakerState::Closed { failures: 0 } }
    }

    /// Whether a request may be sent now (closed, or open long enough for a probe).
    pub fn available(&self, now: Instant) -> bool {
        match self.state {
            BreakerState::Closed { .. } => true,
            BreakerState::Open { until, .. } => now >= until,
            BreakerState::HalfOpen { .. } => false,
        }
    }

    /// A request is being sent: an expired open circuit turns half-open (this request is the probe).
    pub fn admit(&mut self, now: Instant) {
        if let BreakerState::Open { until, period } = self.state
            && now >= until
        {
            self.state = BreakerState::HalfOpen { period };
        }
    }

    /// The request succeeded: the circuit closes.
    pub fn success(&mut self) {
        self.state = BreakerState::Closed { failures: 0 };
    }

    /// The request failed.
    pub fn failure(&mut self, now: Instant) {
        self.state = match self.state {
            BreakerState::Closed { failures } if failures + 1 >= self.cfg.failures => {
                BreakerState::Open { until: now + self.cfg.open, period: self.cfg.open }
            }
            BreakerState::Closed { failures } => BreakerState::Closed { failures: failures + 1 },
            BreakerState::HalfOpen { period } | BreakerState::Open { period, .. } => {
                let period = (period * 2).min(self.cfg.max_open);
                BreakerState::Open { until: now + period, period }
            }
        };
    }

    /// The request ended without a verdict (client gone): a probe slot is given back.
    pub fn abandon(&mut self, now: Instant) {
        if let BreakerState::HalfOpen { period } = self.state {
            self.state = BreakerState::Open { until: now, period };
        }
    }

    /// A background probe found the route answering: an open circuit admits its one half-open
    /// request now instead of at the end of its period.
    pub fn probe_ok(&mut self, now: Instant) {
        if let BreakerState::Open { until, period } = self.state {
            self.state = BreakerState::Open { until: until.min(now), period };
        }
    }

    /// A background probe failed: an open circuit stays open for at least another period.
    pub fn probe_failed(&mut self, now: Instant) {
        if let BreakerState::Open { until, period } = self.state {
            self.state = BreakerState::Open { until: until.max(now + period), period };
        }
    }

    /// Whether the circuit is open or probing.
    pub fn is_open(&self) -> bool {
        !matches!(self.state, BreakerState::Closed { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn breaker_opens_probes_and_closes() {
        let cfg = BreakerConfig { failures: 2, open: Duration::from_secs(1), max_open: Duration::from_secs(3) };
        let mut b = Breaker::new(cfg);
        let t0 = Instant::now();
        b.failure(t0);
        assert!(b.available(t0));
        b.failure(t0);
        assert!(!b.available(t0), "two failures open it");
        let t1 = t0 + Duration::from_secs(1);
        assert!(b.available(t1), "open period over: a probe may go");
        b.admit(t1);
        assert!(!b.available(t1), "only one probe at a time");
        b.failure(t1);
        assert_eq!(b.state, BreakerState::Open { until: t1 + Duration::from_secs(2), period: Duration::from_secs(2) });
        let t2 = t1 + Duration::from_secs(2);
        b.admit(t2);
        b.abandon(t2);
        assert!(b.available(t2), "an abandoned probe frees the slot");
        b.admit(t2);
        b.success();
        assert_eq!(b.state, BreakerState::Closed { failures: 0 });
    }

    #[test]
    fn probes_hold_a_dead_route_open_and_release_a_live_one_at_once() {
        let cfg = BreakerConfig { failures: 1, open: Duration::from_secs(5), max_open: Duration::from_secs(60) };
        let mut b = Breaker::new(cfg);
        let t0 = Instant::now();
        b.probe_ok(t0);
        assert_eq!(b.state, BreakerState::Closed { failures: 0 }, "probes do not touch a closed circuit");
        b.failure(t0);
        let t4 = t0 + Duration::from_secs(4);
        b.probe_failed(t4);
        assert!(!b.available(t0 + Duration::from_secs(6)), "a failed probe pushed the end of the period");
        assert!(b.available(t4 + Duration::from_secs(5)));
        let t5 = t4 + Duration::from_secs(1);
        b.probe_ok(t5);
        assert!(b.available(t5), "a good probe lets the half-open request through now");
        b.admit(t5);
        assert!(!b.available(t5), "one real request at a time");
        b.success();
        assert!(!b.is_open());
    }
}
