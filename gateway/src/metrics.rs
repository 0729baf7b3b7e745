//! The gateway's Prometheus metrics. Every label value is a closed enum or a name from the
//! routing table (never text from a request): requests by model and outcome, attempts by
//! cluster and result, in-flight and circuit state per cluster, stream endings, fallbacks,
//! table reloads, probes, bodies in transit, tokens and latency, the shared limits store.

use std::sync::OnceLock;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

use crate::limits::{StoreFault, StoreKind, StoreOutcome};
use crate::member::ConfigReason;

/// The API a request used.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
#[repr(usize)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    chat_completions,
    /// `/v1/completions`.
    completions,
    /// `/v1/embeddings`.
    embeddings,
}

impl Endpoint {
    /// The upstream path.
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::chat_completions => "/v1/chat/completions",
            Endpoint::completions => "/v1/completions",
            Endpoint::embeddings => "/v1/embeddings",
        }
    }
}

/// How a request ended for the client.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Outcome {
    /// 2xx.
    ok,
    /// A 4xx the client caused.
    client_error,
    /// 429.
    rate_limited,
    /// 503.
    unavailable,
    /// 502.
    upstream_error,
    /// 504.
    timeout,
}

/// What one upstream attempt got.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum AttemptResult {
    /// A usable answer.
    ok,
    /// TCP connect failed.
    connect_error,
    /// The TLS handshake failed (untrusted certificate, wrong hostname, refused client certificate).
    tls_error,
    /// The connection closed before an answer.
    reset,
    /// No first token in time.
    timeout,
    /// 5xx.
    server_error,
    /// 429.
    rate_limited,
    /// 4xx.
    client_error,
    /// Garbage instead of an answer.
    malformed,
}

/// How a relayed stream ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum StreamEnd {
    /// With `[DONE]`.
    complete,
    /// Cleanly but without `[DONE]`; the gateway added it.
    finalised,
    /// The upstream connection broke.
    cut,
    /// No chunk within the idle timeout.
    stalled,
    /// A chunk that does not parse.
    malformed,
    /// Ended before the answer was finished.
    truncated,
    /// The upstream sent an error event.
    upstream_error,
    /// An event longer than `--max-event-bytes` (or one that never ended).
    oversized,
    /// The client went away.
    client_gone,
    /// A regenerated continuation did not begin with the text already sent.
    diverged,
}

/// What became of a stream's continuation (`continuations_total{result}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ContinuationResult {
    /// A broken stream is being continued on another route.
    attempted,
    /// A continued stream reached its end (the client got the whole answer).
    succeeded,
    /// A broken stream could not be continued; it was ended with an error event.
    abandoned,
}

/// Why a broken stream was not continued (`continuations_abandoned_total{reason}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum AbandonReason {
    /// `--max-continuations` were spent.
    limit,
    /// No allowed route could take it over (none left, none capable, every attempt failed).
    no_route,
    /// An engine rejected the continuation request (a client error other than a prefill refusal).
    rejected,
    /// A regenerated answer did not begin with the text already sent.
    diverged,
    /// The stream cannot be continued (tool calls, several choices, no tokens left, a prompt
    /// that is not one string for a prefill, a request body over the limit).
    unsupported,
}

/// What a background probe asked (`probe.rs`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ProbeKind {
    /// `GET /v1/models` on the cluster.
    list,
    /// One token asked of a model the list could not vouch for.
    request,
}

/// What a background probe of an ejected route's cluster found.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ProbeResult {
    /// The cluster answered with its model list.
    ok,
    /// No answer, or a 5xx.
    failed,
    /// Another answer (a 4xx, an unreadable list): circuits are left to their own periods.
    inconclusive,
    /// A wrong path or a refused credential: the cluster is marked misconfigured.
    misconfigured,
}

impl StreamEnd {
    /// Whether the stream broke (it was ended with an error event by the gateway).
    pub fn broken(self) -> bool {
        matches!(
            self,
            StreamEnd::cut | StreamEnd::stalled | StreamEnd::malformed | StreamEnd::truncated | StreamEnd::oversized
        )
    }
}

/// Result of a routing-table reload.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum ReloadResult {
    /// A new table is in force.
    applied,
    /// The file did not parse or validate; the old table stays.
    invalid,
}

/// Why a request was refused on account of its API key.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum KeyRefusal {
    /// No key, or an unknown one (401).
    unauthorized,
    /// The key may not use the model (403).
    model,
    /// The key's jurisdictions exclude the model's (403).
    jurisdiction,
    /// Requests per minute (429).
    requests,
    /// Tokens per minute (429).
    tokens,
}

/// Result of a `Serving` status write.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum WriteResult {
    /// Written.
    ok,
    /// Someone else wrote first (409); retried with fresh data.
    conflict,
    /// Any other failure.
    error,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ContinuationLabels {
    result: ContinuationResult,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AbandonLabels {
    reason: AbandonReason,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusalLabels {
    reason: KeyRefusal,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreFaultLabels {
    reason: StoreFault,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreOutcomeLabels {
    outcome: StoreOutcome,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StoreLabels {
    store: StoreKind,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct WriteLabels {
    result: WriteResult,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    model: String,
    endpoint: Endpoint,
    outcome: Outcome,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AttemptLabels {
    cluster: String,
    result: AttemptResult,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProbeLabels {
    cluster: String,
    kind: ProbeKind,
    result: ProbeResult,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct MisconfiguredLabels {
    cluster: String,
    reason: ConfigReason,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterLabel {
    cluster: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StreamLabels {
    cluster: String,
    end: StreamEnd,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ModelLabel {
    model: String,
}
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReloadLabels {
    result: ReloadResult,
}

type HistFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn latency_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

/// All gateway metrics and their registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    requests: Family<RequestLabels, Counter>,
    attempts: Family<AttemptLabels, Counter>,
    inflight: Family<ClusterLabel, Gauge>,
    circuit_open: Family<ClusterLabel, Gauge>,
    streams: Family<StreamLabels, Counter>,
    fallbacks: Family<ModelLabel, Counter>,
    reloads: Family<ReloadLabels, Counter>,
    duration: HistFamily<ModelLabel>,
    refusals: Family<RefusalLabels, Counter>,
    status_writes: Family<WriteLabels, Counter>,
    feed_stale: Gauge,
    leader: Gauge,
    body_reads: Gauge,
    probes: Family<ProbeLabels, Counter>,
    continuations: Family<ContinuationLabels, Counter>,
    abandoned: Family<AbandonLabels, Counter>,
    skipped: Family<ClusterLabel, Counter>,
    misconfigured: Family<MisconfiguredLabels, Gauge>,
    scrape_quiet: Family<ClusterLabel, Gauge>,
    store_errors: Family<StoreFaultLabels, Counter>,
    store_unavailable: Family<StoreOutcomeLabels, Counter>,
    store_up: Family<StoreLabels, Gauge>,
    /// Held requests, cold starts and scale writes (`autoscale::metrics`).
    pub autoscale: crate::autoscale::metrics::AutoscaleMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("flotilla_gateway");
        let m = Metrics {
            requests: Family::default(),
            attempts: Family::default(),
            inflight: Family::default(),
            circuit_open: Family::default(),
            streams: Family::default(),
            fallbacks: Family::default(),
            reloads: Family::default(),
            duration: Family::new_with_constructor(latency_histogram),
            refusals: Family::default(),
            status_writes: Family::default(),
            feed_stale: Gauge::default(),
            leader: Gauge::default(),
            body_reads: Gauge::default(),
            probes: Family::default(),
            continuations: Family::default(),
            abandoned: Family::default(),
            skipped: Family::default(),
            misconfigured: Family::default(),
            scrape_quiet: Family::default(),
            store_errors: Family::default(),
            store_unavailable: Family::default(),
            store_up: Family::default(),
            autoscale: Default::default(),
            registry: Registry::default(),
        };
        registry.register("requests", "Client requests by model, endpoint and outcome", m.requests.clone());
        registry.register("upstream_attempts", "Upstream attempts by cluster and result", m.attempts.clone());
        registry.register("upstream_inflight", "Requests in flight per cluster", m.inflight.clone());
        registry.register("circuit_open", "1 while a cluster's circuit is open or probing", m.circuit_open.clone());
        registry.register("streams", "Relayed streams by cluster and how they ended", m.streams.clone());
        registry.register("fallbacks", "Requests served by a fallback model, by requested model", m.fallbacks.clone());
        registry.register("table_reloads", "Routing table reloads by result", m.reloads.clone());
        registry.register(
            "request_duration_seconds",
            "Time to the response head (first token for streams) by model",
            m.duration.clone(),
        );
        registry.register("key_refusals", "Requests refused for their API key, by reason", m.refusals.clone());
        registry.register(
            "status_writes",
            "Serving-condition writes to ModelDeployment status",
            m.status_writes.clone(),
        );
        registry.register(
            "feed_stale",
            "1 while the control-cluster watch is failing and the last good table is in use",
            m.feed_stale.clone(),
        );
        registry.register(
            "body_reads",
            "Requests whose body is still arriving (they hold no concurrency slot)",
            m.body_reads.clone(),
        );
        registry.register("probes", "Background probes of ejected routes' clusters (their model list, or one token asked of a model), by result", m.probes.clone());
        registry.register(
            "continuations",
            "Mid-stream continuations on another route, by result",
            m.continuations.clone(),
        );
        registry.register(
            "continuations_abandoned",
            "Broken streams that could not be continued, by reason",
            m.abandoned.clone(),
        );
        registry.register(
            "stream_events_skipped",
            "Malformed upstream stream events skipped, by cluster",
            m.skipped.clone(),
        );
        registry.register("feedback_leader", "1 while this replica writes the Serving conditions", m.leader.clone());
        registry.register(
            "cluster_misconfigured",
            "1 while a cluster's entry point shows a configuration fault (wrong URL, refused credential), by reason",
            m.misconfigured.clone(),
        );
        registry.register(
            "scrape_quiet",
            "1 while a cluster's /metrics shows no vLLM metrics and is scraped rarely",
            m.scrape_quiet.clone(),
        );
        registry.register(
            "limits_store_errors",
            "Failed calls to the shared limits store, by reason",
            m.store_errors.clone(),
        );
        registry.register(
            "limits_store_unavailable",
            "Requests admitted or refused, and answers left uncharged, while the shared limits store was unreachable",
            m.store_unavailable.clone(),
        );
        registry.register(
            "limits_store_up",
            "1 while the shared limits store answers within its timeout, 0 while it does not (no sample without one)",
            m.store_up.clone(),
        );
        m.autoscale.register(&mut registry);
        Metrics { registry, ..m }
    }
}

/// One model's series that every answered request counts (`requests` with outcome `ok`, by
/// endpoint, and `request_duration_seconds`), taken from their families the first time and kept
/// on the model (`table::Meters`), so that an answered request builds no label and looks none up.
#[derive(Debug, Default)]
pub struct ModelMeters {
    ok: [OnceLock<Counter>; 3],
    duration: OnceLock<Histogram>,
}

/// One route's series that every answered attempt counts (`attempts` with result `ok` on its
/// cluster), kept on the route (`table::Meters`) as [`ModelMeters`] are on the model.
#[derive(Debug, Default)]
pub struct RouteMeters {
    ok: OnceLock<Counter>,
}

impl Metrics {
    /// Count a finished request. `model` must come from the routing table (or be `unknown`);
    /// `meters`, the model's own handles when the request named a model of the table.
    pub fn request(&self, model: &str, meters: Option<&ModelMeters>, endpoint: Endpoint, outcome: Outcome, secs: f64) {
        let labels = || RequestLabels { model: model.to_string(), endpoint, outcome };
        let duration = || self.duration.get_or_create(&ModelLabel { model: model.to_string() }).clone();
        match meters {
            Some(m) => {
                if outcome == Outcome::ok {
                    let i = endpoint as usize;
                    m.ok[i].get_or_init(|| self.requests.get_or_create(&labels()).clone()).inc();
                } else {
                    self.requests.get_or_create(&labels()).inc();
                }
                m.duration.get_or_init(duration).observe(secs);
            }
            None => {
                self.requests.get_or_create(&labels()).inc();
                duration().observe(secs);
            }
        }
    }
    /// Count an attempt that got a usable answer on `cluster`, through the route's handle.
    pub fn attempt_ok(&self, cluster: &str, meters: &RouteMeters) {
        let labels = || AttemptLabels { cluster: cluster.to_string(), result: AttemptResult::ok };
        meters.ok.get_or_init(|| self.attempts.get_or_create(&labels()).clone()).inc();
    }
    /// Count an attempt.
    pub fn attempt(&self, cluster: &str, result: AttemptResult) {
        self.attempts.get_or_create(&AttemptLabels { cluster: cluster.to_string(), result }).inc();
    }
    /// Count a probe.
    pub fn probe(&self, cluster: &str, kind: ProbeKind, result: ProbeResult) {
        self.probes.get_or_create(&ProbeLabels { cluster: cluster.to_string(), kind, result }).inc();
    }
    /// Count a stream ending.
    pub fn stream(&self, cluster: &str, end: StreamEnd) {
        self.streams.get_or_create(&StreamLabels { cluster: cluster.to_string(), end }).inc();
    }
    /// Count a continuation step.
    pub fn continuation(&self, result: ContinuationResult) {
        self.continuations.get_or_create(&ContinuationLabels { result }).inc();
    }
    /// Count an abandoned continuation (also counted as `abandoned`).
    pub fn abandoned(&self, reason: AbandonReason) {
        self.continuation(ContinuationResult::abandoned);
        self.abandoned.get_or_create(&AbandonLabels { reason }).inc();
    }
    /// Count malformed events skipped on a cluster's stream.
    pub fn skipped(&self, cluster: &str, n: u32) {
        if n > 0 {
            self.skipped.get_or_create(&ClusterLabel { cluster: cluster.to_string() }).inc_by(u64::from(n));
        }
    }
    /// Count a fallback.
    pub fn fallback(&self, model: &str) {
        self.fallbacks.get_or_create(&ModelLabel { model: model.to_string() }).inc();
    }
    /// Count a reload.
    pub fn reload(&self, result: ReloadResult) {
        self.reloads.get_or_create(&ReloadLabels { result }).inc();
    }
    /// The in-flight gauge of a cluster.
    pub fn inflight(&self, cluster: &str) -> Gauge {
        self.inflight.get_or_create(&ClusterLabel { cluster: cluster.to_string() }).clone()
    }
    /// The circuit gauge of a cluster.
    pub fn circuit_open(&self, cluster: &str) -> Gauge {
        self.circuit_open.get_or_create(&ClusterLabel { cluster: cluster.to_string() }).clone()
    }
    /// Count a refusal.
    pub fn refusal(&self, reason: KeyRefusal) {
        self.refusals.get_or_create(&RefusalLabels { reason }).inc();
    }
    /// Count a status write.
    pub fn status_write(&self, result: WriteResult) {
        self.status_writes.get_or_create(&WriteLabels { result }).inc();
    }
    /// Set the feed's staleness.
    pub fn set_feed_stale(&self, stale: bool) {
        self.feed_stale.set(i64::from(stale));
    }
    /// The gauge of requests whose body is still arriving.
    pub fn body_reads(&self) -> &Gauge {
        &self.body_reads
    }
    /// Set whether this replica leads the status feedback.
    pub fn set_leader(&self, leader: bool) {
        self.leader.set(i64::from(leader));
    }
    /// Set whether `cluster` shows the configuration fault `reason`.
    pub fn set_misconfigured(&self, cluster: &str, reason: ConfigReason, on: bool) {
        self.misconfigured
            .get_or_create(&MisconfiguredLabels { cluster: cluster.to_string(), reason })
            .set(i64::from(on));
    }
    /// Set whether `cluster` is scraped rarely for want of vLLM metrics.
    pub fn set_scrape_quiet(&self, cluster: &str, quiet: bool) {
        self.scrape_quiet.get_or_create(&ClusterLabel { cluster: cluster.to_string() }).set(i64::from(quiet));
    }
    /// Count a failed call to the shared limits store.
    pub fn store_fault(&self, reason: StoreFault) {
        self.store_errors.get_or_create(&StoreFaultLabels { reason }).inc();
    }
    /// Count what a request or charge got while the shared limits store was unreachable.
    pub fn store_unavailable(&self, outcome: StoreOutcome) {
        self.store_unavailable.get_or_create(&StoreOutcomeLabels { outcome }).inc();
    }
    /// Set whether the shared limits store answers.
    pub fn set_store_up(&self, store: StoreKind, up: bool) {
        self.store_up.get_or_create(&StoreLabels { store }).set(i64::from(up));
    }
    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_models_handles_count_in_the_same_series_as_the_labels() {
        let m = Metrics::default();
        let meters = ModelMeters::default();
        m.request("llama", Some(&meters), Endpoint::chat_completions, Outcome::ok, 0.01);
        m.request("llama", Some(&meters), Endpoint::chat_completions, Outcome::ok, 0.02);
        m.request("llama", None, Endpoint::chat_completions, Outcome::ok, 0.03);
        m.request("llama", Some(&meters), Endpoint::embeddings, Outcome::ok, 0.01);
        m.request("llama", Some(&meters), Endpoint::chat_completions, Outcome::timeout, 1.0);
        let text = m.render();
        let line = |s: &str| {
            text.lines().find(|l| l.starts_with(s)).unwrap_or_else(|| panic!("no {s} in\n{text}")).to_string()
        };
        let ok = "flotilla_gateway_requests_total{model=\"llama\",endpoint=\"chat_completions\",outcome=\"ok\"}";
        assert!(line(ok).ends_with(" 3"), "{}", line(ok));
        assert!(
            line("flotilla_gateway_requests_total{model=\"llama\",endpoint=\"embeddings\",outcome=\"ok\"}")
                .ends_with(" 1")
        );
        assert!(
            line("flotilla_gateway_requests_total{model=\"llama\",endpoint=\"chat_completions\",outcome=\"timeout\"}")
                .ends_with(" 1")
        );
        assert!(line("flotilla_gateway_request_duration_seconds_count{model=\"llama\"}").ends_with(" 5"));
        // Handles taken from one gateway's metrics never count in another's.
        let other = Metrics::default();
        let fresh = ModelMeters::default();
        other.request("llama", Some(&fresh), Endpoint::chat_completions, Outcome::ok, 0.01);
        assert!(line(ok).ends_with(" 3"), "the first gateway's series is unchanged");

        let route = RouteMeters::default();
        m.attempt_ok("eu1", &route);
        m.attempt_ok("eu1", &route);
        m.attempt("eu1", AttemptResult::ok);
        let text = m.render();
        let attempts = "flotilla_gateway_upstream_attempts_total{cluster=\"eu1\",result=\"ok\"}";
        let line = text.lines().find(|l| l.starts_with(attempts)).unwrap_or_else(|| panic!("{text}"));
        assert!(line.ends_with(" 3"), "{line}");
    }
}
