//! Controller metrics in Prometheus text format. Labels are closed enums (kind, outcome):
//! never an object name or an error's text.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The kind a reconcile was for.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Kind {
    /// InferenceCluster.
    InferenceCluster,
    /// ModelDeployment.
    ModelDeployment,
    /// CapacityClaim.
    CapacityClaim,
    /// ModelCache.
    ModelCache,
}

/// How a reconcile ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Outcome {
    /// Status written.
    Changed,
    /// Nothing to write.
    Unchanged,
    /// Failed; retried with backoff.
    Error,
}

/// Why a ModelDeployment was woken by a change of the fleet (`deployment::wake`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
pub enum Wake {
    /// Its plan entry changed.
    PlanChanged,
    /// Its ModelCache changed.
    CacheChanged,
    /// A cluster it is placed on changed reachability, readiness or deletion.
    ClusterChanged,
    /// A class it uses changed.
    ClassChanged,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WakeLabels {
    reason: Wake,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReconcileLabels {
    kind: Kind,
    outcome: Outcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: Kind,
}

/// The controller's metrics.
#[derive(Clone)]
pub struct Metrics {
    registry: Arc<Registry>,
    reconciles: Family<ReconcileLabels, Counter>,
    durations: Family<KindLabels, Histogram>,
    status_writes: Family<KindLabels, Counter>,
    wakes: Family<WakeLabels, Counter>,
    fleet_passes: Counter,
    leader: Gauge,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("flotilla_controller");
        let reconciles = Family::<ReconcileLabels, Counter>::default();
        let durations = Family::<KindLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(exponential_buckets(0.001, 2.0, 14))
        });
        let status_writes = Family::<KindLabels, Counter>::default();
        let wakes = Family::<WakeLabels, Counter>::default();
        let fleet_passes = Counter::default();
        let leader = Gauge::default();
        registry.register("reconciles", "Reconciles by kind and outcome", reconciles.clone());
        registry.register("reconcile_duration_seconds", "Reconcile duration", durations.clone());
        registry.register("status_writes", "Status patches sent to the control cluster", status_writes.clone());
        registry.register(
            "deployment_wakes",
            "ModelDeployments woken by a change of the fleet, by reason",
            wakes.clone(),
        );
        registry.register(
            "fleet_passes",
            "Passes of the fleet trigger (one solve and one wake computation each)",
            fleet_passes.clone(),
        );
        registry.register("leader", "1 while this replica holds the leader lease", leader.clone());
        Self { registry: Arc::new(registry), reconciles, durations, status_writes, wakes, fleet_passes, leader }
    }
}

impl Metrics {
    /// Counts one reconcile.
    pub fn reconciled(&self, kind: Kind, outcome: Outcome, took: Duration) {
        self.reconciles.get_or_create(&ReconcileLabels { kind, outcome }).inc();
        self.durations.get_or_create(&KindLabels { kind }).observe(took.as_secs_f64());
    }

    /// Counts one status write.
    pub fn status_write(&self, kind: Kind) {
        self.status_writes.get_or_create(&KindLabels { kind }).inc();
    }

    /// Status writes so far.
    pub fn status_writes(&self, kind: Kind) -> u64 {
        self.status_writes.get_or_create(&KindLabels { kind }).get()
    }

    /// Counts one ModelDeployment woken by a fleet change.
    pub fn woken(&self, reason: Wake) {
        self.wakes.get_or_create(&WakeLabels { reason }).inc();
    }

    /// Counts one pass of the fleet trigger.
    pub fn fleet_pass(&self) {
        self.fleet_passes.inc();
    }

    /// Sets the leader gauge.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }

    /// Text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}
