//! Runtime health in two scopes. A cluster ([`ClusterHealth`]) carries what every model on it
//! shares: in-flight count, scraped queue depth, latency EWMA and a circuit breaker fed by
//! transport failures (connect error, reset, timeout). A route, one model on one cluster
//! ([`RouteHealth`]), carries what the model's engine answers: its own breaker fed by 5xx and
//! malformed answers, and its `Retry-After` cool-down. So one model's trouble never blocks
//! another model on the same cluster, and a model's breaker counts its own failures whatever
//! the others do. Routes get their health when a table is put in force
//! ([`HealthRegistry::bind`]), so the hot path follows an `Arc` instead of looking names up;
//! the registry keeps health across table reloads (keyed by cluster and model name).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use prometheus_client::metrics::gauge::Gauge;

pub use crate::breaker::{Breaker, BreakerConfig, BreakerState};
use crate::member::ConfigReason;
use crate::metrics::Metrics;
use crate::table::RoutingTable;

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What the gateway knows about one cluster right now.
#[derive(Debug)]
pub struct ClusterHealth {
    inflight: AtomicU64,
    queue_depth: AtomicU64,
    kv_milli: AtomicU64,
    ewma_us: AtomicU64,
    breaker: Mutex<Breaker>,
    inflight_gauge: Gauge,
    open_gauge: Gauge,
    fault: Mutex<Option<(ConfigReason, String)>>,
    /// Name and metrics, for the `cluster_misconfigured` gauge (absent for detached health).
    metrics: Option<(String, Arc<Metrics>)>,
}

impl ClusterHealth {
    fn new(
        cfg: BreakerConfig,
        inflight_gauge: Gauge,
        open_gauge: Gauge,
        metrics: Option<(String, Arc<Metrics>)>,
    ) -> Self {
        ClusterHealth {
            inflight: AtomicU64::new(0),
            queue_depth: AtomicU64::new(0),
            kv_milli: AtomicU64::new(0),
            ewma_us: AtomicU64::new(0),
            breaker: Mutex::new(Breaker::new(cfg)),
            inflight_gauge,
            open_gauge,
            fault: Mutex::new(None),
            metrics,
        }
    }
    /// The configuration fault the cluster's entry point showed last, if any, and what it said.
    pub fn fault(&self) -> Option<(ConfigReason, String)> {
        lock(&self.fault).clone()
    }
    /// Whether the entry point is misconfigured: no request goes there until a probe finds it
    /// answering (or a new table changes its URL or credential).
    pub fn misconfigured(&self) -> bool {
        lock(&self.fault).is_some()
    }
    /// Record a configuration fault; `true` when it is news (for logging once).
    pub fn set_fault(&self, reason: ConfigReason, message: String) -> bool {
        let mut f = lock(&self.fault);
        let news = f.as_ref().map(|(r, _)| *r) != Some(reason);
        if let (Some((old, _)), Some((name, m))) = (f.as_ref(), &self.metrics) {
            m.set_misconfigured(name, *old, false);
        }
        if let Some((name, m)) = &self.metrics {
            m.set_misconfigured(name, reason, true);
        }
        *f = Some((reason, message));
        news
    }
    /// Forget the configuration fault; the reason it had, if any.
    pub fn clear_fault(&self) -> Option<ConfigReason> {
        let old = lock(&self.fault).take().map(|(r, _)| r);
        if let (Some(r), Some((name, m))) = (old, &self.metrics) {
            m.set_misconfigured(name, r, false);
        }
        old
    }
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
    /// Whether the cluster's (transport) breaker lets a request through now.
    pub fn breaker_available(&self, now: Instant) -> bool {
        lock(&self.breaker).available(now)
    }
    /// Whether the cluster's circuit is open or probing, or its entry point misconfigured.
    pub fn circuit_open(&self) -> bool {
        lock(&self.breaker).is_open() || self.misconfigured()
    }
    /// Record a transport failure (connect, reset, timeout, a stream cut or stalled).
    pub fn record_failure(&self, now: Instant) {
        let mut b = lock(&self.breaker);
        b.failure(now);
        self.open_gauge.set(i64::from(b.is_open()));
    }
    /// What a background probe found: `Some(true)` the cluster answered, `Some(false)` it did not.
    pub fn probed(&self, answered: bool, now: Instant) {
        let mut b = lock(&self.breaker);
        if answered { b.probe_ok(now) } else { b.probe_failed(now) }
    }
}

#[derive(Debug)]
struct ModelState {
    breaker: Breaker,
    cooling_until: Option<Instant>,
}

/// One model on one cluster: the cluster's shared health plus the model's own breaker and
/// `Retry-After` cool-down.
#[derive(Debug)]
pub struct RouteHealth {
    cluster: Arc<ClusterHealth>,
    model: Mutex<ModelState>,
    refuses_prefill: AtomicBool,
}

impl RouteHealth {
    fn new(cluster: Arc<ClusterHealth>, cfg: BreakerConfig) -> Self {
        RouteHealth {
            cluster,
            model: Mutex::new(ModelState { breaker: Breaker::new(cfg), cooling_until: None }),
            refuses_prefill: AtomicBool::new(false),
        }
    }

    /// Health not tied to a registry (a table not yet put in force).
    pub fn detached() -> Arc<Self> {
        let cfg = BreakerConfig { failures: 5, open: Duration::from_secs(5), max_open: Duration::from_secs(60) };
        Arc::new(RouteHealth::new(Arc::new(ClusterHealth::new(cfg, Gauge::default(), Gauge::default(), None)), cfg))
    }

    /// The cluster's shared health.
    pub fn cluster(&self) -> &Arc<ClusterHealth> {
        &self.cluster
    }
    /// Whether both breakers (the cluster's and the model's) let a request through now and the
    /// cluster's entry point is not known to be misconfigured.
    pub fn available(&self, now: Instant) -> bool {
        self.cluster.breaker_available(now) && !self.cluster.misconfigured() && lock(&self.model).breaker.available(now)
    }
    /// End of the model's current 429 cool-down on this cluster, if any.
    pub fn cooling_until(&self) -> Option<Instant> {
        lock(&self.model).cooling_until
    }
    /// Avoid the model on this cluster until `until` (its `Retry-After`).
    pub fn cool_down(&self, until: Instant) {
        let mut m = lock(&self.model);
        m.cooling_until = Some(m.cooling_until.map_or(until, |old| old.max(until)));
    }
    /// Whether the model's own circuit on this cluster is open or probing.
    pub fn model_circuit_open(&self) -> bool {
        lock(&self.model).breaker.is_open()
    }
    /// Whether the route is ejected: the cluster's circuit or the model's is open.
    pub fn ejected(&self) -> bool {
        self.cluster.circuit_open() || self.model_circuit_open()
    }
    /// Record a failure of the model's engine (5xx, malformed answer or stream).
    pub fn record_model_failure(&self, now: Instant) {
        lock(&self.model).breaker.failure(now);
    }
    /// Whether the engine answered a prefill continuation with a client error (learnt; the
    /// route then continues by regenerating).
    pub fn refuses_prefill(&self) -> bool {
        self.refuses_prefill.load(Ordering::Relaxed)
    }
    /// Remember that the engine refused a prefill continuation.
    pub fn learn_refuses_prefill(&self) {
        self.refuses_prefill.store(true, Ordering::Relaxed);
    }
    /// What a background probe found about the model: listed by the cluster or answering a
    /// one-token request, or not.
    pub fn probed(&self, answered: bool, now: Instant) {
        let b = &mut lock(&self.model).breaker;
        if answered { b.probe_ok(now) } else { b.probe_failed(now) }
    }
}

/// Health of every cluster and route seen so far.
#[derive(Debug)]
pub struct HealthRegistry {
    cfg: BreakerConfig,
    clusters: RwLock<HashMap<String, Arc<ClusterHealth>>>,
    routes: Mutex<HashMap<(String, String), Arc<RouteHealth>>>,
    metrics: Arc<Metrics>,
}

impl HealthRegistry {
    /// An empty registry.
    pub fn new(cfg: BreakerConfig, metrics: Arc<Metrics>) -> Self {
        HealthRegistry { cfg, clusters: RwLock::new(HashMap::new()), routes: Mutex::new(HashMap::new()), metrics }
    }

    /// The health of `cluster` (created on first use).
    pub fn get(&self, cluster: &str) -> Arc<ClusterHealth> {
        if let Some(h) = self.clusters.read().unwrap_or_else(|p| p.into_inner()).get(cluster) {
            return h.clone();
        }
        let mut w = self.clusters.write().unwrap_or_else(|p| p.into_inner());
        w.entry(cluster.to_string())
            .or_insert_with(|| {
                Arc::new(ClusterHealth::new(
                    self.cfg,
                    self.metrics.inflight(cluster),
                    self.metrics.circuit_open(cluster),
                    Some((cluster.to_string(), self.metrics.clone())),
                ))
            })
            .clone()
    }

    /// Give every route of `table` its health (kept from earlier tables for the same cluster
    /// and model); routes no longer in any table are forgotten.
    pub fn bind(&self, table: &mut RoutingTable) {
        let mut routes = lock(&self.routes);
        let mut kept = HashMap::with_capacity(routes.len());
        table.bind_health(|cluster, model| {
            let key = (cluster.to_string(), model.to_string());
            let h = routes
                .remove(&key)
                .or_else(|| kept.get(&key).cloned())
                .unwrap_or_else(|| Arc::new(RouteHealth::new(self.get(cluster), self.cfg)));
            kept.insert(key, h.clone());
            h
        });
        *routes = kept;
    }
}

/// One attempt in flight on a route: counted in its cluster's load until dropped, and the
/// verdict feeds the breaker of the scope it belongs to.
#[derive(Debug)]
pub struct AttemptGuard {
    route: Arc<RouteHealth>,
    started: Instant,
    settled: bool,
}

impl AttemptGuard {
    /// Start an attempt now if both breakers admit it; an expired open circuit turns half-open
    /// and this request is its one probe, so a second request is refused until it settles.
    pub fn begin(route: &Arc<RouteHealth>, now: Instant) -> Option<Self> {
        let mut cluster = lock(&route.cluster.breaker);
        let mut model = lock(&route.model);
        if !(cluster.available(now) && model.breaker.available(now)) {
            return None;
        }
        cluster.admit(now);
        model.breaker.admit(now);
        drop((cluster, model));
        route.cluster.inflight.fetch_add(1, Ordering::Relaxed);
        route.cluster.inflight_gauge.inc();
        Some(AttemptGuard { route: route.clone(), started: now, settled: false })
    }

    /// The model answered well (latency measured from the start): both circuits close.
    pub fn success(&mut self) {
        let c = &self.route.cluster;
        c.observe_latency(self.started.elapsed());
        lock(&c.breaker).success();
        c.open_gauge.set(0);
        lock(&self.route.model).breaker.success();
        self.settled = true;
    }

    /// The cluster could not be reached or went silent; the model's half-open slot (if it
    /// held one) is given back, its verdict unknown.
    pub fn transport_failure(&mut self) {
        let now = Instant::now();
        self.route.cluster.record_failure(now);
        lock(&self.route.model).breaker.abandon(now);
        self.settled = true;
    }

    /// The model's engine failed (5xx, malformed answer); the cluster itself answered.
    pub fn model_failure(&mut self) {
        self.route.record_model_failure(Instant::now());
        self.close_half_open_cluster();
        self.settled = true;
    }

    /// The engine answered, neither well nor badly (e.g. 429, a client error): a half-open
    /// circuit closes, since the route is evidently answering.
    pub fn neutral(&mut self) {
        self.close_half_open_cluster();
        let b = &mut lock(&self.route.model).breaker;
        if matches!(b.state, BreakerState::HalfOpen { .. }) {
            b.success();
        }
        self.settled = true;
    }

    fn close_half_open_cluster(&self) {
        let mut b = lock(&self.route.cluster.breaker);
        if matches!(b.state, BreakerState::HalfOpen { .. }) {
            b.success();
            self.route.cluster.open_gauge.set(0);
        }
    }

    /// The route's health.
    pub fn route(&self) -> &Arc<RouteHealth> {
        &self.route
    }
}

impl Drop for AttemptGuard {
    fn drop(&mut self) {
        let c = &self.route.cluster;
        c.inflight.fetch_sub(1, Ordering::Relaxed);
        c.inflight_gauge.dec();
        if !self.settled {
            let now = Instant::now();
            lock(&c.breaker).abandon(now);
            lock(&self.route.model).breaker.abandon(now);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn registry(failures: u32) -> HealthRegistry {
        let cfg = BreakerConfig { failures, open: Duration::from_secs(5), max_open: Duration::from_secs(60) };
        HealthRegistry::new(cfg, Arc::default())
    }

    const TABLE: &str = "clusters:\n  - {name: c, url: \"http://127.0.0.1:1\", jurisdiction: EU}\nmodels:\n  - {name: a, routes: [{cluster: c}]}\n  - {name: b, routes: [{cluster: c}]}\n";

    fn routes(reg: &HealthRegistry) -> (Arc<RouteHealth>, Arc<RouteHealth>) {
        let mut t = RoutingTable::from_yaml("t", TABLE).unwrap();
        reg.bind(&mut t);
        let r = |m: &str| t.resolve(m).unwrap().routes[0].health.clone();
        (r("a"), r("b"))
    }

    #[test]
    fn a_models_failures_open_its_breaker_whatever_the_other_model_does() {
        let reg = registry(2);
        let (a, b) = routes(&reg);
        assert!(Arc::ptr_eq(a.cluster(), b.cluster()), "one cluster, shared");
        let now = Instant::now();
        for _ in 0..2 {
            AttemptGuard::begin(&a, now).unwrap().model_failure();
            AttemptGuard::begin(&b, now).unwrap().success();
        }
        assert!(a.model_circuit_open() && !a.available(now), "a's own failures opened a's breaker");
        assert!(b.available(now) && !b.ejected(), "b is untouched");
        assert!(!a.cluster().circuit_open(), "model failures do not count against the cluster");
        a.cool_down(now + Duration::from_secs(30));
        assert!(b.cooling_until().is_none(), "a 429 cools only its model");
        let (a2, _) = routes(&reg);
        assert!(Arc::ptr_eq(&a, &a2), "health survives a table reload");
    }

    #[test]
    fn transport_failures_eject_every_model_of_the_cluster() {
        let reg = registry(2);
        let (a, b) = routes(&reg);
        let now = Instant::now();
        AttemptGuard::begin(&a, now).unwrap().transport_failure();
        AttemptGuard::begin(&b, now).unwrap().transport_failure();
        assert!(a.ejected() && b.ejected() && !b.available(now));
        assert!(!a.model_circuit_open() && !b.model_circuit_open());
    }

    #[test]
    fn half_open_admits_one_real_request_at_a_time() {
        let reg = registry(1);
        let (a, _) = routes(&reg);
        let t0 = Instant::now();
        AttemptGuard::begin(&a, t0).unwrap().model_failure();
        assert!(AttemptGuard::begin(&a, t0).is_none(), "open");
        let t1 = Instant::now() + Duration::from_secs(6);
        let probe = AttemptGuard::begin(&a, t1).expect("the period is over: one request may go");
        assert!(AttemptGuard::begin(&a, t1).is_none(), "a second one waits for the first's verdict");
        drop(probe);
        assert!(AttemptGuard::begin(&a, t1).is_some(), "an abandoned probe frees the slot");
    }
}
