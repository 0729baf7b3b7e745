//! The member router's Prometheus metrics: requests by result (a closed enum, never a route or
//! model name from a request), the number of routes in the table in force, and per LoRA adapter
//! its loads, load failures, evictions and affinity hits and misses. An adapter label is only
//! ever a name from a route's `flotilla.dev/adapters` annotation (the caller checks the name
//! against it first), never a `model` a request made up: a closed set the cluster's routes
//! define.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// How a request ended.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum RequestResult {
    /// An endpoint answered (whatever its status); its answer was relayed.
    proxied,
    /// No routing header, or a value no route serves (404).
    no_route,
    /// The route has no ready endpoint, or the router has not read the cluster yet (503).
    no_endpoint,
    /// No endpoint could be reached, or the connection failed after the request was sent (502).
    unreachable,
    /// The request body is above `--max-body-bytes` (413).
    too_large,
    /// A request for an adapter found no endpoint that had it or could load it (502, 503, 504).
    adapter_unavailable,
}

/// What happened to an adapter.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdapterEvent {
    /// A load succeeded (or the engine said it was loaded already).
    Load,
    /// A load failed, timed out or was refused.
    LoadFailure,
    /// It was unloaded to make room for another.
    Eviction,
    /// A request went to an endpoint that had it loaded already.
    Hit,
    /// A request went to an endpoint that had to load it first (or was loading it).
    Miss,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AdapterLabels {
    adapter: String,
}

/// The per-adapter counters (cheap to clone: load tasks keep one).
#[derive(Clone, Debug, Default)]
pub struct AdapterCounters {
    loads: Family<AdapterLabels, Counter>,
    load_failures: Family<AdapterLabels, Counter>,
    evictions: Family<AdapterLabels, Counter>,
    hits: Family<AdapterLabels, Counter>,
    misses: Family<AdapterLabels, Counter>,
}

impl AdapterCounters {
    fn family(&self, e: AdapterEvent) -> &Family<AdapterLabels, Counter> {
        match e {
            AdapterEvent::Load => &self.loads,
            AdapterEvent::LoadFailure => &self.load_failures,
            AdapterEvent::Eviction => &self.evictions,
            AdapterEvent::Hit => &self.hits,
            AdapterEvent::Miss => &self.misses,
        }
    }

    /// Count `e` for `adapter`, a name from a route's adapter annotation.
    pub fn count(&self, adapter: &str, e: AdapterEvent) {
        self.family(e).get_or_create(&AdapterLabels { adapter: adapter.to_string() }).inc();
    }

    /// `e` counted for `adapter` so far.
    pub fn get(&self, adapter: &str, e: AdapterEvent) -> u64 {
        self.family(e).get_or_create(&AdapterLabels { adapter: adapter.to_string() }).get()
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResultLabels {
    result: RequestResult,
}

/// The registry and its metrics.
#[derive(Debug)]
pub struct RouterMetrics {
    registry: Registry,
    requests: Family<ResultLabels, Counter>,
    routes: Gauge,
    /// Per-adapter counters.
    pub adapters: AdapterCounters,
}

impl Default for RouterMetrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("flotilla_member_router");
        let requests = Family::<ResultLabels, Counter>::default();
        registry.register("requests", "Requests by how they ended", requests.clone());
        let routes = Gauge::default();
        registry.register(
            "routes",
            "Header values (ModelDeployments) with a route in the table in force",
            routes.clone(),
        );
        let adapters = AdapterCounters::default();
        for (name, help, e) in [
            ("adapter_loads", "LoRA adapter loads that succeeded, by adapter", AdapterEvent::Load),
            (
                "adapter_load_failures",
                "LoRA adapter loads that failed, timed out or were refused, by adapter",
                AdapterEvent::LoadFailure,
            ),
            (
                "adapter_evictions",
                "LoRA adapters unloaded to make room for another, by adapter",
                AdapterEvent::Eviction,
            ),
            (
                "adapter_affinity_hits",
                "Requests for an adapter sent to an endpoint that had it loaded, by adapter",
                AdapterEvent::Hit,
            ),
            (
                "adapter_affinity_misses",
                "Requests for an adapter that had to wait for a load first, by adapter",
                AdapterEvent::Miss,
            ),
        ] {
            registry.register(name, help, adapters.family(e).clone());
        }
        RouterMetrics { registry, requests, routes, adapters }
    }
}

impl RouterMetrics {
    /// Count one request.
    pub fn request(&self, result: RequestResult) {
        self.requests.get_or_create(&ResultLabels { result }).inc();
    }

    /// Requests counted with `result` so far.
    pub fn requests(&self, result: RequestResult) -> u64 {
        self.requests.get_or_create(&ResultLabels { result }).get()
    }

    /// Set the routes gauge.
    pub fn set_routes(&self, n: usize) {
        self.routes.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    /// The OpenMetrics text.
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
    fn metrics_render_with_their_names() {
        let m = RouterMetrics::default();
        m.request(RequestResult::no_route);
        m.set_routes(3);
        let text = m.render();
        assert!(text.contains("flotilla_member_router_requests_total{result=\"no_route\"} 1"), "{text}");
        assert!(text.contains("flotilla_member_router_routes 3"), "{text}");
        m.adapters.count("support-fr", AdapterEvent::Hit);
        m.adapters.count("support-fr", AdapterEvent::Eviction);
        let text = m.render();
        assert!(
            text.contains("flotilla_member_router_adapter_affinity_hits_total{adapter=\"support-fr\"} 1"),
            "{text}"
        );
        assert!(text.contains("flotilla_member_router_adapter_evictions_total{adapter=\"support-fr\"} 1"), "{text}");
        assert_eq!(m.adapters.get("support-fr", AdapterEvent::Load), 0);
    }
}
