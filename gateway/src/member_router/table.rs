//! The routing table, built by one pure function from the member's HTTPRoutes, Services and
//! EndpointSlices: each header value (`<namespace>/<ModelDeployment>`) maps to the model its
//! route serves, the LoRA adapters it may load (`flotilla.dev/adapters`, at most
//! `flotilla.dev/max-adapters` at once per endpoint) and the ready endpoints (`http://IP:port`,
//! weighted) behind it. Trust rules: a
//! route only claims values in its own namespace and only sends to Services there; when two
//! routes claim one value the oldest wins (Gateway API precedence). Whatever is not served is
//! said once per build in `notes`, for the watch loop to log when it changes.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;

use flotilla_apis::constants::annotations::{ADAPTERS, MAX_ADAPTERS, MODEL};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use super::config::GatewayName;
use super::route::{BackendRef, GATEWAY_GROUP, HttpRoute, Match, Rule};

/// Label by which an EndpointSlice names its Service.
pub const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// One ready endpoint of a route.
#[derive(Clone, Debug, PartialEq)]
pub struct Endpoint {
    /// `http://IP:port` (an IPv6 address in brackets).
    pub url: String,
    /// Share of the route's traffic: its backend's weight split evenly over the backend's ready
    /// endpoints (always above zero).
    pub weight: f64,
}

/// Where one header value goes.
#[derive(Clone, Debug, PartialEq)]
pub struct Route {
    /// The model (`flotilla.dev/model`), listed at `GET /v1/models`; empty when unannotated.
    pub model: String,
    /// The HTTPRoute (`namespace/name`), for messages.
    pub source: String,
    /// Ready endpoints, by URL; empty: known but not ready (503).
    pub endpoints: Vec<Endpoint>,
    /// LoRA adapters the router may load on these endpoints (`flotilla.dev/adapters`): name →
    /// directory in the engine container. Empty: none (a request for any other `model` is
    /// forwarded as it is, never loaded).
    pub adapters: BTreeMap<String, String>,
    /// Adapters one endpoint holds loaded at once (`flotilla.dev/max-adapters`, the engine's
    /// `--max-loras`); at least 1 whenever `adapters` is not empty.
    pub max_adapters: usize,
}

impl Route {
    /// A route of `model` to `endpoints` (`(url, weight)`), as tests and embedders build one.
    pub fn new(model: &str, source: &str, endpoints: &[(&str, f64)]) -> Self {
        Route {
            model: model.into(),
            source: source.into(),
            endpoints: endpoints.iter().map(|(u, w)| Endpoint { url: (*u).into(), weight: *w }).collect(),
            adapters: BTreeMap::new(),
            max_adapters: 0,
        }
    }

    /// `self` allowed to load `adapters` (`(name, path)`), at most `max` at once per endpoint.
    pub fn with_adapters(mut self, adapters: &[(&str, &str)], max: usize) -> Self {
        self.adapters = adapters.iter().map(|(n, p)| ((*n).to_string(), (*p).to_string())).collect();
        self.max_adapters = max;
        self
    }
}

/// Header value → route.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Table {
    /// The routes, by the header value they serve.
    pub routes: BTreeMap<String, Route>,
}

impl Table {
    /// `self` with `value` routed to `route`.
    pub fn with(mut self, value: &str, route: Route) -> Self {
        self.routes.insert(value.into(), route);
        self
    }

    /// The adapters loadable on routes with at least one ready endpoint, as `(adapter, the
    /// route's model)`, sorted, each pair once.
    pub fn ready_adapters(&self) -> Vec<(&str, &str)> {
        let mut m: Vec<(&str, &str)> = self
            .routes
            .values()
            .filter(|r| !r.endpoints.is_empty())
            .flat_map(|r| r.adapters.keys().map(|a| (a.as_str(), r.model.as_str())))
            .collect();
        m.sort_unstable();
        m.dedup();
        m
    }

    /// The models of routes with at least one ready endpoint, sorted, each once.
    pub fn ready_models(&self) -> Vec<&str> {
        let mut m: Vec<&str> = self
            .routes
            .values()
            .filter(|r| !r.endpoints.is_empty() && !r.model.is_empty())
            .map(|r| r.model.as_str())
            .collect();
        m.sort_unstable();
        m.dedup();
        m
    }
}

/// The table and what was left out of it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Built {
    /// The table.
    pub table: Table,
    /// One line per thing not served, with what to change.
    pub notes: Vec<String>,
}

/// What the table is built from.
#[derive(Clone, Copy, Debug)]
pub struct Inputs<'a> {
    /// Only routes parented to this Gateway are served.
    pub gateway: &'a GatewayName,
    /// The routing header (lower case).
    pub header: &'a str,
    /// Every HTTPRoute.
    pub routes: &'a [HttpRoute],
    /// Every Service.
    pub services: &'a [Service],
    /// Every EndpointSlice.
    pub slices: &'a [EndpointSlice],
}

/// A route's claim on a header value, before conflicts are resolved.
struct Claim {
    age: (bool, Option<Time>, String),
    route: Route,
}

/// Build the table.
pub fn build(inp: Inputs<'_>) -> Built {
    let mut notes = Vec::new();
    let services: HashMap<(&str, &str), &Service> = inp
        .services
        .iter()
        .filter_map(|s| Some(((s.metadata.namespace.as_deref()?, s.metadata.name.as_deref()?), s)))
        .collect();
    let mut slices: HashMap<(&str, &str), Vec<&EndpointSlice>> = HashMap::new();
    for s in inp.slices {
        let svc = s.metadata.labels.as_ref().and_then(|l| l.get(SERVICE_NAME_LABEL));
        if let (Some(ns), Some(svc)) = (s.metadata.namespace.as_deref(), svc) {
            slices.entry((ns, svc.as_str())).or_default().push(s);
        }
    }
    let mut claims: BTreeMap<String, Vec<Claim>> = BTreeMap::new();
    for r in inp.routes.iter().filter(|r| parented(r, inp.gateway)) {
        let key = r.key();
        let ns = r.namespace();
        let model = r.metadata.annotations.as_ref().and_then(|a| a.get(MODEL)).cloned().unwrap_or_default();
        if model.is_empty() {
            notes.push(format!("HTTPRoute {key} has no `{MODEL}` annotation: served, but not listed in /v1/models"));
        }
        let (adapters, max_adapters) = adapters(r, &key, &model, &mut notes);
        let mut mine: Vec<String> = Vec::new();
        for (i, rule) in r.spec.rules.iter().enumerate() {
            let Some(value) = rule_value(rule, inp.header) else {
                notes.push(format!(
                    "HTTPRoute {key} rule {i} is not served: this router serves only rules with one match, that match being one Exact `{}` header (path absent or PathPrefix /), and no filters",
                    inp.header
                ));
                continue;
            };
            if !own_value(&value, ns) {
                notes.push(format!(
                    "HTTPRoute {key} rule {i} claims `{}: {value}`, outside its own namespace: ignored (a route may only claim `{ns}/<name>`)",
                    inp.header
                ));
                continue;
            }
            if mine.contains(&value) {
                notes.push(format!("HTTPRoute {key} rule {i} repeats `{value}`: only its first rule serves it"));
                continue;
            }
            mine.push(value.clone());
            let endpoints = backends(&key, ns, i, &rule.backend_refs, &services, &slices, &mut notes);
            let age = (r.metadata.creation_timestamp.is_none(), r.metadata.creation_timestamp.clone(), key.clone());
            let route = Route {
                model: model.clone(),
                source: key.clone(),
                endpoints,
                adapters: adapters.clone(),
                max_adapters,
            };
            claims.entry(value).or_default().push(Claim { age, route });
        }
    }
    let mut table = Table::default();
    for (value, mut cs) in claims {
        cs.sort_by(|a, b| a.age.cmp(&b.age));
        let mut cs = cs.into_iter();
        let Some(winner) = cs.next() else { continue };
        for lost in cs {
            notes.push(format!(
                "HTTPRoute {} also claims `{value}`, which the older HTTPRoute {} holds: ignored (delete one of them)",
                lost.route.source, winner.route.source
            ));
        }
        table.routes.insert(value, winner.route);
    }
    notes.sort();
    notes.dedup();
    Built { table, notes }
}

/// The adapters a route may load and how many at once, from its `flotilla.dev/adapters` and
/// `flotilla.dev/max-adapters` annotations. Anything malformed is said in `notes` and gives no
/// adapters: the route still serves its base model.
fn adapters(r: &HttpRoute, key: &str, model: &str, notes: &mut Vec<String>) -> (BTreeMap<String, String>, usize) {
    let ann = r.metadata.annotations.as_ref();
    let (listed, max) = (ann.and_then(|a| a.get(ADAPTERS)), ann.and_then(|a| a.get(MAX_ADAPTERS)));
    let Some(listed) = listed else { return (BTreeMap::new(), 0) };
    let mut bad = |why: String| {
        notes.push(format!("HTTPRoute {key}: {why}: no adapters are loaded for it (its base model is served)"));
        (BTreeMap::new(), 0)
    };
    let map: BTreeMap<String, String> = match serde_json::from_str(listed) {
        Ok(m) => m,
        Err(e) => {
            return bad(format!(
                "annotation `{ADAPTERS}` is not a JSON object of adapter name → path ({e}), e.g. {{\"support-fr\": \"/adapters/support-fr\"}}"
            ));
        }
    };
    if let Some((name, path)) = map.iter().find(|(n, p)| n.trim().is_empty() || p.trim().is_empty()) {
        return bad(format!("annotation `{ADAPTERS}` has an empty adapter name or path (`{name}`: `{path}`)"));
    }
    if !model.is_empty() && map.contains_key(model) {
        return bad(format!("annotation `{ADAPTERS}` names the base model `{model}` as an adapter"));
    }
    if map.is_empty() {
        return (BTreeMap::new(), 0);
    }
    let max = match max.map(|m| m.trim().parse::<usize>()) {
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            return bad(format!(
                "annotation `{MAX_ADAPTERS}` must be a whole number above 0 (the engine's --max-loras), not `{}`",
                max.map(String::as_str).unwrap_or_default()
            ));
        }
        None => return bad(format!("annotation `{ADAPTERS}` is set without `{MAX_ADAPTERS}`")),
    };
    (map, max)
}

/// The routes of `objects` parented to `gw`, and a note for each one that cannot be read (left
/// out on its own: the others are served).
pub fn readable<'a>(
    objects: impl IntoIterator<Item = &'a kube::core::DynamicObject>,
    gw: &GatewayName,
) -> (Vec<HttpRoute>, Vec<String>) {
    let (mut routes, mut notes) = (Vec::new(), Vec::new());
    for o in objects {
        match HttpRoute::from_dynamic(o) {
            Ok(r) if parented(&r, gw) => routes.push(r),
            Ok(_) => {}
            Err(e) => notes.push(format!(
                "HTTPRoute {}/{} cannot be read ({e}): not served",
                o.metadata.namespace.as_deref().unwrap_or_default(),
                o.metadata.name.as_deref().unwrap_or_default()
            )),
        }
    }
    (routes, notes)
}

/// Whether one of `r`'s parentRefs names `gw` (defaults: group `gateway.networking.k8s.io`,
/// kind `Gateway`, the route's namespace).
pub fn parented(r: &HttpRoute, gw: &GatewayName) -> bool {
    r.spec.parent_refs.iter().any(|p| {
        p.group.as_deref().unwrap_or(GATEWAY_GROUP) == GATEWAY_GROUP
            && p.kind.as_deref().unwrap_or("Gateway") == "Gateway"
            && p.namespace.as_deref().unwrap_or(r.namespace()) == gw.namespace
            && p.name == gw.name
    })
}

/// The header value a rule matches, if the rule is of the one shape served.
fn rule_value(rule: &Rule, header: &str) -> Option<String> {
    let [m] = rule.matches.as_slice() else { return None };
    if !rule.filters.is_empty() || !whole_path(m) || !m.query_params.is_empty() || m.method.is_some() {
        return None;
    }
    let [h] = m.headers.as_slice() else { return None };
    let exact = h.kind.as_deref().unwrap_or("Exact") == "Exact";
    (exact && h.name.eq_ignore_ascii_case(header)).then(|| h.value.clone())
}

fn whole_path(m: &Match) -> bool {
    m.path.as_ref().is_none_or(|p| {
        p.kind.as_deref().unwrap_or("PathPrefix") == "PathPrefix" && p.value.as_deref().unwrap_or("/") == "/"
    })
}

/// `<ns>/<name>` with a non-empty name and no further `/`.
fn own_value(value: &str, ns: &str) -> bool {
    value.split_once('/').is_some_and(|(v, rest)| v == ns && !rest.is_empty() && !rest.contains('/'))
}

/// The ready endpoints of a rule's backends, weighted.
fn backends(
    key: &str,
    ns: &str,
    rule: usize,
    refs: &[BackendRef],
    services: &HashMap<(&str, &str), &Service>,
    slices: &HashMap<(&str, &str), Vec<&EndpointSlice>>,
    notes: &mut Vec<String>,
) -> Vec<Endpoint> {
    let mut out: BTreeMap<String, f64> = BTreeMap::new();
    for b in refs {
        let what = format!("HTTPRoute {key} rule {rule} backend {}", b.name);
        let core = b.group.as_deref().unwrap_or_default().is_empty();
        if !core || b.kind.as_deref().unwrap_or("Service") != "Service" {
            notes.push(format!("{what}: only Services (group \"\", kind Service) are served"));
            continue;
        }
        if b.namespace.as_deref().is_some_and(|n| n != ns) {
            notes.push(format!(
                "{what}: a Service in another namespace is not served (no ReferenceGrant support): use a Service in {ns}"
            ));
            continue;
        }
        if !b.filters.is_empty() {
            notes.push(format!("{what}: backend filters are not supported: the backend is not served"));
            continue;
        }
        let weight = b.weight.unwrap_or(1);
        if weight <= 0 {
            continue;
        }
        let Some(port) = b.port else {
            notes.push(format!("{what}: no port: name the Service port"));
            continue;
        };
        let Some(svc) = services.get(&(ns, b.name.as_str())) else {
            notes.push(format!("{what}: Service {ns}/{} not found: no endpoints", b.name));
            continue;
        };
        let ports = svc.spec.as_ref().and_then(|s| s.ports.as_ref());
        let Some(sp) = ports.and_then(|ps| ps.iter().find(|p| p.port == port)) else {
            notes.push(format!("{what}: Service {ns}/{} has no port {port}: no endpoints", b.name));
            continue;
        };
        let port_name = sp.name.as_deref().unwrap_or_default();
        let urls = ready_urls(slices.get(&(ns, b.name.as_str())).map(Vec::as_slice).unwrap_or_default(), port_name);
        let n = urls.len() as f64;
        for u in urls {
            *out.entry(u).or_default() += f64::from(weight) / n;
        }
    }
    out.into_iter().map(|(url, weight)| Endpoint { url, weight }).collect()
}

/// The URLs of the ready endpoints in `slices` on the port named `port_name` (or a slice's
/// only port), each once.
fn ready_urls(slices: &[&EndpointSlice], port_name: &str) -> BTreeSet<String> {
    let mut urls = BTreeSet::new();
    for s in slices {
        if s.address_type != "IPv4" && s.address_type != "IPv6" {
            continue;
        }
        let ports = s.ports.as_deref().unwrap_or_default();
        let named = ports.iter().find(|p| p.name.as_deref().unwrap_or_default() == port_name);
        let port = match (named, ports) {
            (Some(p), _) | (None, [p]) => p.port,
            _ => None,
        };
        let Some(port) = port.and_then(|p| u16::try_from(p).ok()).filter(|p| *p != 0) else { continue };
        for e in &s.endpoints {
            let ready = e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true);
            let Some(ip) = e.addresses.first().and_then(|a| a.parse::<IpAddr>().ok()) else { continue };
            if !ready {
                continue;
            }
            let url = match ip {
                IpAddr::V4(v4) => format!("http://{v4}:{port}"),
                IpAddr::V6(v6) => format!("http://[{v6}]:{port}"),
            };
            urls.insert(url);
        }
    }
    urls
}

#[cfg(test)]
#[path = "table_tests.rs"]
mod tests;
