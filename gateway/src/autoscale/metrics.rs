//! The autoscaler's and the activation's metrics, registered with the gateway's others:
//! requests held per model now and their body bytes, how held requests ended (and which cap
//! refused one), how long they waited, cold starts
//! (first held request to first Ready route, on the replica that held it; the elected
//! replica reports its own figure in `status.autoscaling`) and scale writes by result.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::autoscale::queue::HoldCap;
use crate::metrics::WriteResult;

/// How a held request left the hold.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum HeldResult {
    /// A replica became Ready; the request was sent.
    served,
    /// `--activation-timeout-ms` passed first: 503.
    expired,
    /// A cap on held requests or their bytes was reached (`held_requests_refused_total{cap}`
    /// says which): 503 at once.
    queue_full,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabel {
    model: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HeldLabels {
    result: HeldResult,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct CapLabels {
    cap: HoldCap,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WriteLabels {
    result: WriteResult,
}

fn wait_histogram() -> Histogram {
    // 50 ms to about 27 minutes.
    Histogram::new(exponential_buckets(0.05, 2.0, 16))
}

/// The metrics.
#[derive(Debug)]
pub struct AutoscaleMetrics {
    held_now: Family<ModelLabel, Gauge>,
    held: Family<HeldLabels, Counter>,
    held_refused: Family<CapLabels, Counter>,
    held_bytes: Gauge,
    held_seconds: Histogram,
    cold_start_seconds: Histogram,
    scale_writes: Family<WriteLabels, Counter>,
}

impl Default for AutoscaleMetrics {
    fn default() -> Self {
        AutoscaleMetrics {
            held_now: Family::default(),
            held: Family::default(),
            held_refused: Family::default(),
            held_bytes: Gauge::default(),
            held_seconds: wait_histogram(),
            cold_start_seconds: wait_histogram(),
            scale_writes: Family::default(),
        }
    }
}

impl AutoscaleMetrics {
    /// Register every metric in `r`.
    pub fn register(&self, r: &mut Registry) {
        r.register("held_requests", "Requests held now while their model starts from zero", self.held_now.clone());
        r.register("held_requests_ended", "Held requests by how they left the hold", self.held.clone());
        r.register(
            "held_requests_refused",
            "Requests refused a hold by the cap they would have crossed",
            self.held_refused.clone(),
        );
        r.register("held_request_bytes", "Body bytes of the requests held now, every model", self.held_bytes.clone());
        r.register("held_wait_seconds", "How long held requests waited", self.held_seconds.clone());
        r.register(
            "cold_start_seconds",
            "From the first request held here for a model at zero replicas to its first Ready route",
            self.cold_start_seconds.clone(),
        );
        r.register("scale_writes", "Replica counts written through the scale subresource", self.scale_writes.clone());
    }
    /// One more (`1`) or one fewer (`-1`) request held for `model`.
    pub fn held(&self, model: &str, by: i64) {
        self.held_now.get_or_create(&ModelLabel { model: model.to_string() }).inc_by(by);
    }
    /// Count how a held request ended.
    pub fn held_result(&self, result: HeldResult) {
        self.held.get_or_create(&HeldLabels { result }).inc();
    }
    /// A request refused a hold by `cap`.
    pub fn held_refused(&self, cap: HoldCap) {
        self.held_refused.get_or_create(&CapLabels { cap }).inc();
    }
    /// Body bytes held now.
    pub fn held_bytes(&self, bytes: usize) {
        self.held_bytes.set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }
    /// A held request's wait.
    pub fn held_wait(&self, secs: f64) {
        self.held_seconds.observe(secs);
    }
    /// A cold start.
    pub fn cold_start(&self, secs: f64) {
        self.cold_start_seconds.observe(secs);
    }
    /// Count a scale write.
    pub fn scale_write(&self, result: WriteResult) {
        self.scale_writes.get_or_create(&WriteLabels { result }).inc();
    }
}
