//! Per-cluster runtime health: in-flight count, scraped queue depth, latency EWMA, a
//! `Retry-After` cool-down and the circuit breaker. Attempts report into it through an
//! [`AttemptGuard`]; the chooser reads it. It outlives table reloads (keyed by cluster name).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use prometheus_client::metrics::gauge::Gauge;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

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

    /// Whether the circuit is open or probing.
    pub fn is_open(&self) -> bool {
        !matches!(self.state, BreakerState::Closed { .. })
    }
}

/// What the gateway knows about one cluster right now.
#[derive(Debug)]
pub struct ClusterHealth {
    inflight: AtomicU64,
    queue_depth: AtomicU64,
    kv_milli: AtomicU64,
    ewma_us: AtomicU64,
    cooling_until: Mutex<Option<Instant>>,
    breaker: Mutex<Breaker>,
    inflight_gauge: Gauge,
    open_gauge: Gauge,
}

impl ClusterHealth {
    /// Requests this gateway has in flight to the cluster.
    pub fn inflight(&self) -> u64 {
        self.inflight.load(Ordering::Relaxed)
    }
    /// Waiting requests last scraped from the cluster.
    pub fn queue_depth(&self) -> u64 {
        self.queue_depth.load(Ordering::Relaxed)
    }
    /// Record a scraped queue depth.
    pub fn set_queue_depth(&self, v: u64) {
        self.queue_depth.store(v, Ordering::Relaxed);
    }
    /// KV-cache use (0 to 1) last scraped from the cluster.
    pub fn kv_cache(&self) -> f64 {
        self.kv_milli.load(Ordering::Relaxed) as f64 / 1000.0
    }
    /// Record a scraped KV-cache use (0 to 1).
    pub fn set_kv_cache(&self, v: f64) {
        self.kv_milli.store((v.clamp(0.0, 1.0) * 1000.0) as u64, Ordering::Relaxed);
    }
    /// Scraped load as queue length: waiting requests plus `kv_weight` for a full KV cache.
    pub fn scraped_load(&self, kv_weight: f64) -> u64 {
        self.queue_depth() + (self.kv_cache() * kv_weight.max(0.0)).round() as u64
    }
    /// Latency EWMA in milliseconds (0 before the first success).
    pub fn ewma_ms(&self) -> f64 {
        self.ewma_us.load(Ordering::Relaxed) as f64 / 1000.0
    }
    fn observe_latency(&self, d: Duration) {
        let new = d.as_micros() as f64;
        let old = self.ewma_us.load(Ordering::Relaxed) as f64;
        let v = if old == 0.0 { new } else { 0.7 * old + 0.3 * new };
        self.ewma_us.store(v as u64, Ordering::Relaxed);
    }
    /// Whether requests may be sent now: breaker available and not cooling down after a 429.
    pub fn available(&self, now: Instant) -> bool {
        lock(&self.breaker).available(now) && self.cooling_until().is_none_or(|t| now >= t)
    }
    /// Whether the breaker lets a request through now (ignoring cool-down).
    pub fn breaker_available(&self, now: Instant) -> bool {
        lock(&self.breaker).available(now)
    }
    /// End of the current 429 cool-down, if any.
    pub fn cooling_until(&self) -> Option<Instant> {
        *lock(&self.cooling_until)
    }
    /// Avoid the cluster until `until` (its `Retry-After`).
    pub fn cool_down(&self, until: Instant) {
        let mut c = lock(&self.cooling_until);
        *c = Some(c.map_or(until, |old| old.max(until)));
    }
    /// Whether the circuit is open or probing.
    pub fn circuit_open(&self) -> bool {
        lock(&self.breaker).is_open()
    }
    /// Record a failure outside an attempt (mid-stream).
    pub fn record_failure(&self, now: Instant) {
        let mut b = lock(&self.breaker);
        b.failure(now);
        self.open_gauge.set(i64::from(b.is_open()));
    }
}

/// Health of every cluster seen so far.
#[derive(Debug)]
pub struct HealthRegistry {
    cfg: BreakerConfig,
    clusters: RwLock<HashMap<String, Arc<ClusterHealth>>>,
    metrics: Arc<crate::metrics::Metrics>,
}

impl HealthRegistry {
    /// An empty registry.
    pub fn new(cfg: BreakerConfig, metrics: Arc<crate::metrics::Metrics>) -> Self {
        HealthRegistry { cfg, clusters: RwLock::new(HashMap::new()), metrics }
    }

    /// The health of `cluster` (created on first use).
    pub fn get(&self, cluster: &str) -> Arc<ClusterHealth> {
        if let Some(h) = self.clusters.read().unwrap_or_else(|p| p.into_inner()).get(cluster) {
            return h.clone();
        }
        let mut w = self.clusters.write().unwrap_or_else(|p| p.into_inner());
        w.entry(cluster.to_string())
            .or_insert_with(|| {
                Arc::new(ClusterHealth {
                    inflight: AtomicU64::new(0),
                    queue_depth: AtomicU64::new(0),
                    kv_milli: AtomicU64::new(0),
                    ewma_us: AtomicU64::new(0),
                    cooling_until: Mutex::new(None),
                    breaker: Mutex::new(Breaker::new(self.cfg)),
                    inflight_gauge: self.metrics.inflight(cluster),
                    open_gauge: self.metrics.circuit_open(cluster),
                })
            })
            .clone()
    }
}

/// One attempt in flight to a cluster: counted in its load until dropped, and the verdict
/// feeds its breaker and latency.
#[derive(Debug)]
pub struct AttemptGuard {
    health: Arc<ClusterHealth>,
    started: Instant,
    settled: bool,
}

impl AttemptGuard {
    /// Start an attempt now.
    pub fn begin(health: Arc<ClusterHealth>) -> Self {
        let now = Instant::now();
        health.inflight.fetch_add(1, Ordering::Relaxed);
        health.inflight_gauge.inc();
        lock(&health.breaker).admit(now);
        AttemptGuard { health, started: now, settled: false }
    }

    /// The cluster answered well (latency measured from the start).
    pub fn success(&mut self) {
        self.health.observe_latency(self.started.elapsed());
        lock(&self.health.breaker).success();
        self.health.open_gauge.set(0);
        self.settled = true;
    }

    /// The cluster failed.
    pub fn failure(&mut self) {
        self.health.record_failure(Instant::now());
        self.settled = true;
    }

    /// The cluster answered, but neither well nor badly (e.g. 429, a client error).
    pub fn neutral(&mut self) {
        let mut b = lock(&self.health.breaker);
        if matches!(b.state, BreakerState::HalfOpen { .. }) {
            b.success();
            self.health.open_gauge.set(0);
        }
        self.settled = true;
    }

    /// The cluster's health.
    pub fn health(&self) -> &Arc<ClusterHealth> {
        &self.health
    }
}

impl Drop for AttemptGuard {
    fn drop(&mut self) {
        self.health.inflight.fetch_sub(1, Ordering::Relaxed);
        self.health.inflight_gauge.dec();
        if !self.settled {
            lock(&self.health.breaker).abandon(Instant::now());
        }
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
}
