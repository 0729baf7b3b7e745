//! The member router's Prometheus metrics: requests by result (a closed enum, never a route or
//! model name from a request) and the number of routes in the table in force.

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
        RouterMetrics { registry, requests, routes }
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
    }
}
