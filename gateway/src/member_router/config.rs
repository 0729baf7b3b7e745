//! The member router's knobs: command-line flags with `FLOTILLA_MEMBER_ROUTER_*` environment
//! fallbacks. `--gateway` names the one Gateway whose HTTPRoutes this router serves; the rest
//! bound what one request may cost (body size, connect timeout, attempts) and how long a
//! shutdown waits for requests in flight; the `--adapter-*` ones say how requests for LoRA
//! adapters are placed and how long a load may take.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use clap::Parser;
use flotilla_apis::constants::DEPLOYMENT_HEADER;
use http::HeaderName;

/// A Gateway (`gateway.networking.k8s.io`) named `<namespace>/<name>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct GatewayName {
    /// The Gateway's namespace.
    pub namespace: String,
    /// The Gateway's name.
    pub name: String,
}

impl GatewayName {
    /// `namespace/name`.
    pub fn new(namespace: &str, name: &str) -> Self {
        GatewayName { namespace: namespace.into(), name: name.into() }
    }
}

impl FromStr for GatewayName {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.split_once('/') {
            Some((ns, name)) if !ns.is_empty() && !name.is_empty() && !name.contains('/') => {
                Ok(GatewayName::new(ns, name))
            }
            _ => Err(format!("`{s}` is not `<namespace>/<name>` of a Gateway, e.g. `flotilla-router/flotilla`")),
        }
    }
}

impl fmt::Display for GatewayName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

fn header_name(s: &str) -> Result<HeaderName, String> {
    HeaderName::from_str(s).map_err(|_| format!("`{s}` is not a valid HTTP header name"))
}

/// `flotilla-member-router`: serves the HTTPRoutes Flotilla renders in a member cluster.
#[derive(Parser, Clone, Debug)]
#[command(
    name = "flotilla-member-router",
    version,
    about = "Serves the HTTPRoutes Flotilla renders in a member cluster: each request goes to the pods of the ModelDeployment its x-flotilla-deployment header names",
    after_help = "Examples:\n  flotilla-member-router --gateway flotilla-router/flotilla\n  flotilla-member-router --gateway flotilla-router/flotilla --listen 127.0.0.1:8080 --attempts 2"
)]
pub struct RouterConfig {
    /// The Gateway (`<namespace>/<name>`) whose HTTPRoutes are served; routes parented to any
    /// other Gateway are left alone.
    #[arg(long, env = "FLOTILLA_MEMBER_ROUTER_GATEWAY", value_name = "NAMESPACE/NAME")]
    pub gateway: GatewayName,
    /// Address to listen on (requests, `/healthz`, `/readyz`, `/metrics`).
    #[arg(long, env = "FLOTILLA_MEMBER_ROUTER_LISTEN", default_value = "0.0.0.0:8080")]
    pub listen: String,
    /// The request header that names the ModelDeployment (`<namespace>/<name>`); the HTTPRoutes
    /// served must match on exactly this header.
    #[arg(long, env = "FLOTILLA_MEMBER_ROUTER_HEADER", default_value = DEPLOYMENT_HEADER, value_parser = header_name)]
    pub header: HeaderName,
    /// Time allowed to connect to an endpoint, in milliseconds.
    #[arg(long, env = "FLOTILLA_MEMBER_ROUTER_CONNECT_TIMEOUT_MS", default_value_t = 2000)]
    pub connect_timeout_ms: u64,
    /// Largest request body accepted, in bytes; a larger one is refused with 413.
    #[arg(long, env = "FLOTILLA_MEMBER_ROUTER_MAX_BODY_BYTES", default_value_t = 16 << 20)]
    pub max_body_bytes: usize,
    /// Endpoints tried per request: one that cannot be connected to is replaced by another
    /// ready endpoint of the same route. A request already sent is never retried.
    #[arg(long, env = "FLOTILLA_MEMBER_ROUTER_ATTEMPTS", default_value_t = 3,
          value_parser = clap::value_parser!(u32).range(1..=16))]
    pub attempts: u32,
    /// On SIGTERM/SIGINT, how long requests in flight (streams included) may take to finish,
    /// in milliseconds, before their connections are closed.
    #[arg(long, env = "FLOTILLA_MEMBER_ROUTER_DRAIN_MS", default_value_t = 25_000)]
    pub drain_ms: u64,
    /// Send a request for a LoRA adapter to an endpoint that has it loaded (`true`), or where a
    /// base-model request would go, loading it there when needed (`false`: no affinity).
    #[arg(long, env = "FLOTILLA_MEMBER_ROUTER_ADAPTER_AFFINITY", default_value_t = true,
          action = clap::ArgAction::Set, value_name = "BOOL")]
    pub adapter_affinity: bool,
    /// An endpoint that has the adapter loaded is saturated, and the adapter is loaded on the
    /// least-loaded endpoint instead, when it has this many requests outstanding (per unit of
    /// weight) more than the least-loaded endpoint of the route.
    #[arg(long, env = "FLOTILLA_MEMBER_ROUTER_ADAPTER_SATURATION", default_value_t = 4,
          value_parser = clap::value_parser!(u32).range(1..=100_000))]
    pub adapter_saturation: u32,
    /// Time allowed to load an adapter on an endpoint (unloading the ones it evicts included),
    /// in milliseconds; a load that takes longer has failed.
    #[arg(long, env = "FLOTILLA_MEMBER_ROUTER_ADAPTER_LOAD_TIMEOUT_MS", default_value_t = 30_000)]
    pub adapter_load_timeout_ms: u64,
    /// After a load of an adapter on an endpoint failed, how long that endpoint is not asked to
    /// load it again, in milliseconds.
    #[arg(long, env = "FLOTILLA_MEMBER_ROUTER_ADAPTER_BACKOFF_MS", default_value_t = 5_000)]
    pub adapter_backoff_ms: u64,
}

impl RouterConfig {
    /// The defaults, serving `gateway`'s routes on `127.0.0.1:0` (for tests and embedding).
    pub fn new(gateway: GatewayName) -> Self {
        RouterConfig {
            gateway,
            listen: "127.0.0.1:0".into(),
            header: HeaderName::from_static(DEPLOYMENT_HEADER),
            connect_timeout_ms: 2000,
            max_body_bytes: 16 << 20,
            attempts: 3,
            drain_ms: 25_000,
            adapter_affinity: true,
            adapter_saturation: 4,
            adapter_load_timeout_ms: 30_000,
            adapter_backoff_ms: 5_000,
        }
    }

    /// `--adapter-load-timeout-ms` as a duration (at least a millisecond).
    pub fn adapter_load_timeout(&self) -> Duration {
        Duration::from_millis(self.adapter_load_timeout_ms.max(1))
    }

    /// `--adapter-backoff-ms` as a duration.
    pub fn adapter_backoff(&self) -> Duration {
        Duration::from_millis(self.adapter_backoff_ms)
    }

    /// `--connect-timeout-ms` as a duration (at least a millisecond).
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms.max(1))
    }

    /// `--drain-ms` as a duration.
    pub fn drain(&self) -> Duration {
        Duration::from_millis(self.drain_ms)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_consistent() {
        RouterConfig::command().debug_assert();
    }

    #[test]
    fn flags_parse_and_defaults_match_the_constructor() {
        let c = RouterConfig::try_parse_from(["r", "--gateway", "gw-ns/gw", "--header", "X-Route"]).unwrap();
        assert_eq!(c.gateway, GatewayName::new("gw-ns", "gw"));
        assert_eq!(c.header.as_str(), "x-route");
        let d = RouterConfig::new(c.gateway.clone());
        assert_eq!(
            (c.connect_timeout_ms, c.max_body_bytes, c.attempts, c.drain_ms),
            (d.connect_timeout_ms, d.max_body_bytes, d.attempts, d.drain_ms)
        );
        assert_eq!(d.header.as_str(), DEPLOYMENT_HEADER);
        assert_eq!(
            (c.adapter_affinity, c.adapter_saturation, c.adapter_load_timeout_ms, c.adapter_backoff_ms),
            (d.adapter_affinity, d.adapter_saturation, d.adapter_load_timeout_ms, d.adapter_backoff_ms)
        );
        let off = RouterConfig::try_parse_from(["r", "--gateway", "a/b", "--adapter-affinity", "false"]).unwrap();
        assert!(!off.adapter_affinity);
        assert!(RouterConfig::try_parse_from(["r", "--gateway", "a/b", "--adapter-saturation", "0"]).is_err());
    }

    #[test]
    fn gateway_names_need_a_namespace_and_a_name() {
        for bad in ["gw", "/gw", "ns/", "a/b/c", ""] {
            assert!(bad.parse::<GatewayName>().is_err(), "{bad}");
        }
        assert!(RouterConfig::try_parse_from(["r"]).is_err(), "--gateway is required");
        assert!(RouterConfig::try_parse_from(["r", "--gateway", "a/b", "--attempts", "0"]).is_err());
    }
}
