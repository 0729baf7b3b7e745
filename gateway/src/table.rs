//! The routing table: model names and aliases → the clusters that serve them, with each
//! cluster's entry URL, jurisdiction and region, a weight and readiness. Read from YAML
//! (`--config`), validated as a whole, and swapped atomically by the server.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use flotilla_apis::common::Sovereignty;
use http::HeaderValue;
use serde::Deserialize;

use crate::GatewayError;
use crate::health::RouteHealth;
use crate::member::{Material, SCHEMES, UpstreamToken, normalise_url};
use crate::tls::Tls;

/// The file as written.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TableFile {
    /// Member clusters and their entry URLs.
    pub clusters: Vec<ClusterSpec>,
    /// Served models.
    pub models: Vec<ModelSpec>,
}

/// A member cluster's entry point.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ClusterSpec {
    /// Cluster name (also the metric label).
    pub name: String,
    /// Base URL of the cluster's inference entry (`http://host:port`).
    pub url: String,
    /// Jurisdiction code (`EU`, `US`).
    pub jurisdiction: String,
    /// Region (`eu-central-1`).
    #[serde(default)]
    pub region: String,
    /// A file holding the bearer token the engine expects (vLLM's `--api-key`), sent as
    /// `Authorization: Bearer` on every request to this cluster; read when the table is loaded.
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// `https://` only: a PEM CA bundle verifying the cluster's certificate (absent: the
    /// system's roots). Hostnames are always verified.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// `https://` only: a PEM client certificate (chain) the gateway presents (mutual TLS).
    #[serde(default)]
    pub client_cert_file: Option<PathBuf>,
    /// `https://` only: the client certificate's PEM private key.
    #[serde(default)]
    pub client_key_file: Option<PathBuf>,
    /// What the control cluster's Secrets hold for this cluster (never written in a file).
    #[serde(skip)]
    pub material: Material,
}

/// A served model.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ModelSpec {
    /// The model name sent upstream.
    pub name: String,
    /// Other names clients may use.
    #[serde(default)]
    pub aliases: Vec<String>,
    /// Where the model may be served.
    #[serde(default)]
    pub sovereignty: Sovereignty,
    /// Models to use, in order, on a context-length error or when no cluster of this one can serve.
    #[serde(default)]
    pub fallbacks: Vec<String>,
    /// Clusters serving the model.
    pub routes: Vec<RouteSpec>,
    /// Deployments the model's traffic is split between by weight (empty: no split); each route
    /// then names its deployment (`docs/gateway.md`, weighted traffic).
    #[serde(default)]
    pub deployments: Vec<Deployment>,
    /// The model may be scaled to zero: a request finding no Ready route is held while a
    /// replica starts (`--activation-timeout-ms`), not refused.
    #[serde(default)]
    pub scale_to_zero: bool,
    /// This name is a LoRA adapter of the model named here (a canonical name in `models`): its
    /// requests are served by that model's engines, which load the adapter (`docs/gateway.md`,
    /// adapters). Its policy may only narrow the parent's (an absent list is the parent's); it
    /// has no fallbacks, no `deployments`, and routes only to clusters the parent has routes to.
    #[serde(default)]
    pub parent: Option<String>,
}

/// One deployment of a model whose traffic is split by weight.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Deployment {
    /// Its name (in the fleet, the ModelDeployment's `namespace/name`).
    pub name: String,
    /// Its share relative to the model's other deployments; 0 takes no traffic.
    pub weight: u32,
    /// Where this deployment may serve, on top of the model's own policy.
    #[serde(default)]
    pub sovereignty: Sovereignty,
}

/// One cluster serving a model.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct RouteSpec {
    /// A cluster name from `clusters`.
    pub cluster: String,
    /// Relative share (prefix affinity weights by it; least-load divides by it).
    #[serde(default = "one")]
    pub weight: u32,
    /// Whether the cluster has Ready replicas of the model.
    #[serde(default = "yes")]
    pub ready: bool,
    /// How a stream broken elsewhere may be continued here (absent: `--continuation-default`).
    #[serde(default)]
    pub continuation: Option<Continuation>,
    /// The model's deployment this route belongs to (required when it lists `deployments`).
    #[serde(default)]
    pub deployment: Option<String>,
    /// Sent as `x-flotilla-deployment` with every request of this route, so that the member's
    /// routing (the HTTPRoute Flotilla renders there, `docs/operations.md`, "What each member
    /// needs") finds the deployment's pods: the ModelDeployment's `namespace/name`. The fleet
    /// feed sets it on every route; absent, the header is not sent.
    #[serde(default)]
    pub member_route: Option<String>,
}

/// How a route continues a stream that broke on another route (`docs/gateway.md`, continuation).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Continuation {
    /// The engine continues the partial answer (vLLM's `continue_final_message` on chat, the
    /// partial answer appended to the prompt on completions); a reproducible request
    /// (`temperature` 0 or a `seed`) regenerates instead.
    Prefill,
    /// The engine answers from the start; only what follows the text already sent is relayed,
    /// and only when the new answer begins with exactly that text.
    Regenerate,
    /// Streams on this route are neither continued nor used to continue others.
    None,
}

/// The token in `path` (`Err` names the file and the problem, never the content).
fn read_token(path: &Path) -> Result<UpstreamToken, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("`{}`: {e}", path.display()))?;
    UpstreamToken::parse(&text).map_err(|e| format!("`{}`: {e}", path.display()))
}

/// The cluster's material: the files the table names, else what the control cluster gave.
fn read_material(c: &ClusterSpec) -> Result<Material, String> {
    let mut m = c.material.clone();
    if let Some(f) = &c.token_file {
        m.token = Some(read_token(f).map_err(|e| format!("tokenFile: {e}"))?);
    }
    let read = |f: &PathBuf, field: &str| std::fs::read(f).map_err(|e| format!("{field} `{}`: {e}", f.display()));
    if let Some(f) = &c.ca_file {
        m.ca_pem = Some(read(f, "caFile")?);
    }
    if let Some(f) = &c.client_cert_file {
        m.client_cert_pem = Some(read(f, "clientCertFile")?);
    }
    if let Some(f) = &c.client_key_file {
        m.client_key_pem = Some(read(f, "clientKeyFile")?);
    }
    Ok(m)
}

/// TLS for an `https://` URL; TLS settings on an `http://` URL are refused, never ignored.
pub fn cluster_tls(url: &str, m: &Material) -> Result<Option<Tls>, String> {
    if url.starts_with("https://") {
        return Tls::new(m).map(Some);
    }
    if m.has_tls() {
        return Err(format!(
            "url `{url}` is plain http but a CA bundle or client certificate is given: use https:// (TLS settings are never ignored)"
        ));
    }
    Ok(None)
}

fn one() -> u32 {
    1
}
fn yes() -> bool {
    true
}

/// A member cluster, resolved.
#[derive(Clone, Debug, PartialEq)]
pub struct Cluster {
    /// Name.
    pub name: String,
    /// Base URL without a trailing slash.
    pub url: String,
    /// Jurisdiction code.
    pub jurisdiction: String,
    /// Region.
    pub region: String,
    /// `Authorization` sent to the cluster's engine (marked sensitive).
    pub auth: Option<HeaderValue>,
    /// TLS settings and client of an `https://` cluster.
    pub tls: Option<Tls>,
    /// Its request targets, worked out from `url` once.
    pub target: Option<crate::upstream::Target>,
}

/// A model's route to one cluster.
#[derive(Clone, Debug)]
pub struct Route {
    /// The cluster.
    pub cluster: Arc<Cluster>,
    /// Weight (≥ 1).
    pub weight: u32,
    /// Readiness.
    pub ready: bool,
    /// Declared continuation capability (`None`: the gateway's default).
    pub continuation: Option<Continuation>,
    /// The route's health (shared with earlier tables once the table is put in force).
    pub health: Arc<RouteHealth>,
    /// Index of its deployment in the model's `deployments` (0 when there are none).
    pub deployment: usize,
    /// The `x-flotilla-deployment` value its requests carry (`RouteSpec::member_route`).
    pub member_route: Option<HeaderValue>,
    /// Its attempt metrics' handles, taken on first use.
    pub meters: Meters<crate::metrics::RouteMeters>,
}

/// A model, resolved.
#[derive(Clone, Debug)]
pub struct Model {
    /// Canonical name.
    pub name: String,
    /// Aliases.
    pub aliases: Vec<String>,
    /// Sovereignty policy.
    pub sovereignty: Sovereignty,
    /// Fallback model names (validated to exist).
    pub fallbacks: Vec<String>,
    /// Routes.
    pub routes: Vec<Route>,
    /// Deployments the traffic is split between by weight (empty: no split).
    pub deployments: Vec<Deployment>,
    /// Requests wait for a Ready route when there is none (`ModelSpec::scale_to_zero`).
    pub scale_to_zero: bool,
    /// The base model when this is a LoRA adapter (`ModelSpec::parent`).
    pub parent: Option<String>,
    /// Its request metrics' handles, taken on first use.
    pub meters: Meters<crate::metrics::ModelMeters>,
}

/// A model's or a route's handles on its metrics (`metrics::ModelMeters`, `RouteMeters`),
/// shared by the requests that resolved it in this table. A copy starts its own, empty:
/// handles belong to the gateway whose metrics first filled them, and a copy may go to another.
#[derive(Debug, Default)]
pub struct Meters<T>(Arc<T>);

impl<T: Default> Clone for Meters<T> {
    fn clone(&self) -> Self {
        Meters(Arc::default())
    }
}

impl<T> Meters<T> {
    /// The handles (shared, not copied).
    pub fn get(&self) -> Arc<T> {
        self.0.clone()
    }
}

impl<T> std::ops::Deref for Meters<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0
    }
}

/// The validated table the gateway routes by.
#[derive(Clone, Debug, Default)]
pub struct RoutingTable {
    clusters: BTreeMap<String, Arc<Cluster>>,
    models: BTreeMap<String, Model>,
    names: HashMap<String, String>,
    notes: Vec<String>,
}

impl RoutingTable {
    /// Parse and validate `yaml`; `path` names the file in errors.
    pub fn from_yaml(path: &str, yaml: &str) -> Result<Self, GatewayError> {
        let file: TableFile = serde_yaml_ng::from_str(yaml)
            .map_err(|e| GatewayError::Table { path: path.to_string(), message: e.to_string() })?;
        Self::from_file(path, file)
    }

    /// Validate `file`; `path` names its source in errors.
    pub fn from_file(path: &str, file: TableFile) -> Result<Self, GatewayError> {
        let err = |message: String| GatewayError::Table { path: path.to_string(), message };
        let mut t = RoutingTable::default();
        for c in file.clusters {
            let (url, note) = normalise_url(&c.url, SCHEMES).map_err(|e| err(format!("cluster `{}`: {e}", c.name)))?;
            t.notes.extend(note.map(|n| format!("cluster `{}`: {n}", c.name)));
            let named = |e: String| err(format!("cluster `{}`: {e}", c.name));
            let material = read_material(&c).map_err(named)?;
            let auth = match &material.token {
                Some(t) => Some(t.header().ok_or_else(|| named("the token is not a header value".into()))?),
                None => None,
            };
            let tls = cluster_tls(&url, &material).map_err(named)?;
            let cluster = Cluster {
                name: c.name.clone(),
                target: crate::upstream::Target::new(&url),
                url,
                jurisdiction: c.jurisdiction,
                region: c.region,
                auth,
                tls,
            };
            if t.clusters.insert(c.name.clone(), Arc::new(cluster)).is_some() {
                return Err(err(format!("cluster `{}` is listed twice", c.name)));
            }
        }
        for m in &file.models {
            for n in std::iter::once(&m.name).chain(&m.aliases) {
                if t.names.insert(n.clone(), m.name.clone()).is_some() {
                    return Err(err(format!("model name or alias `{n}` is used twice")));
                }
            }
        }
        let bases = crate::adapters::bases(&file.models);
        for mut m in file.models {
            crate::split::check_deployments(&m).map_err(err)?;
            if let Some(parent) = &m.parent {
                m.sovereignty = crate::adapters::check(&m, &bases, parent).map_err(err)?;
            }
            let mut seen = HashSet::new();
            let mut routes = Vec::new();
            for r in &m.routes {
                let Some(cluster) = t.clusters.get(&r.cluster) else {
                    return Err(err(format!("model `{}`: route to unknown cluster `{}`", m.name, r.cluster)));
                };
                let deployment = crate::split::route_deployment(&m, r).map_err(err)?;
                if !seen.insert((deployment, r.cluster.clone())) {
                    return Err(err(format!("model `{}`: cluster `{}` routed twice", m.name, r.cluster)));
                }
                let member_route = match &r.member_route {
                    None => None,
                    Some(v) => Some(HeaderValue::from_str(v).map_err(|_| {
                        err(format!(
                            "model `{}`: route to `{}`: memberRoute `{v}` is not a valid header value (visible ASCII)",
                            m.name, r.cluster
                        ))
                    })?),
                };
                routes.push(Route {
                    cluster: cluster.clone(),
                    weight: r.weight.max(1),
                    ready: r.ready,
                    continuation: r.continuation,
                    health: RouteHealth::detached(),
                    deployment,
                    member_route,
                    meters: Meters::default(),
                });
            }
            let mut fallbacks = Vec::new();
            for f in &m.fallbacks {
                match t.names.get(f) {
                    Some(canonical) if bases.adapters.contains(canonical) => {
                        return Err(err(format!(
                            "model `{}`: fallback `{f}` is a LoRA adapter: a fallback is a model, never an adapter (it would answer with another fine-tuning)",
                            m.name
                        )));
                    }
                    Some(canonical) if canonical != &m.name => fallbacks.push(canonical.clone()),
                    Some(_) => return Err(err(format!("model `{}` names itself as a fallback", m.name))),
                    None => return Err(err(format!("model `{}`: unknown fallback `{f}`", m.name))),
                }
            }
            let model = Model {
                name: m.name.clone(),
                aliases: m.aliases,
                sovereignty: m.sovereignty,
                fallbacks,
                routes,
                deployments: m.deployments,
                scale_to_zero: m.scale_to_zero,
                parent: m.parent,
                meters: Meters::default(),
            };
            t.models.insert(m.name, model);
        }
        Ok(t)
    }

    /// What loading changed and the operator should know (e.g. a `/v1` suffix dropped).
    pub fn notes(&self) -> &[String] {
        &self.notes
    }

    /// Give every route its health: `health(cluster, model)`.
    pub(crate) fn bind_health(&mut self, mut health: impl FnMut(&str, &str) -> Arc<RouteHealth>) {
        for m in self.models.values_mut() {
            for r in &mut m.routes {
                r.health = health(&r.cluster.name, &m.name);
            }
        }
    }

    /// The model a name or alias refers to.
    pub fn resolve(&self, name: &str) -> Option<&Model> {
        self.names.get(name).and_then(|n| self.models.get(n))
    }

    /// Every model, by canonical name.
    pub fn models(&self) -> impl Iterator<Item = &Model> {
        self.models.values()
    }

    /// Every cluster.
    pub fn clusters(&self) -> impl Iterator<Item = &Arc<Cluster>> {
        self.clusters.values()
    }

    /// The model's ready routes to clusters that every one of `policies` allows, and the
    /// route's deployment allows too (a deployment of weight 0 has none).
    pub fn allowed_routes<'a>(&self, model: &'a Model, policies: &[&Sovereignty]) -> Vec<&'a Route> {
        model
            .routes
            .iter()
            .filter(|r| r.ready && policies.iter().all(|p| p.allows(&r.cluster.jurisdiction, &r.cluster.region)))
            .filter(|r| crate::split::route_open(model, r))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const YAML: &str = r#"
clusters:
  - {name: eu-1, url: "http://127.0.0.1:1/", jurisdiction: EU, region: eu-central-1}
  - {name: us-1, url: "http://127.0.0.1:2", jurisdiction: US, region: us-east-1}
models:
  - name: small
    aliases: [s]
    sovereignty: {allowedJurisdictions: [EU]}
    fallbacks: [big]
    routes: [{cluster: eu-1}, {cluster: us-1}]
  - name: big
    routes: [{cluster: us-1, weight: 3, continuation: regenerate}, {cluster: eu-1, ready: false}]
"#;

    #[test]
    fn resolves_aliases_and_filters_by_policy_and_readiness() {
        let t = RoutingTable::from_yaml("t", YAML).unwrap();
        let m = t.resolve("s").unwrap();
        assert_eq!(m.name, "small");
        let allowed: Vec<_> = t.allowed_routes(m, &[&m.sovereignty]).iter().map(|r| r.cluster.name.clone()).collect();
        assert_eq!(allowed, ["eu-1"]);
        let big = t.resolve("big").unwrap();
        // The fallback keeps the original model's policy: no EU route of `big` is ready, and US is not allowed.
        assert!(t.allowed_routes(big, &[&m.sovereignty, &big.sovereignty]).is_empty());
        assert_eq!(t.allowed_routes(big, &[&big.sovereignty]).len(), 1);
        assert_eq!(big.routes[0].continuation, Some(Continuation::Regenerate));
        assert_eq!(big.routes[1].continuation, None, "absent: the gateway's default");
        assert_eq!(t.clusters().next().unwrap().url, "http://127.0.0.1:1");
    }

    #[test]
    fn the_example_table_is_valid() {
        let t = RoutingTable::from_yaml("example", include_str!("../examples/routing.yaml")).unwrap();
        let m = t.resolve("llama-70b").unwrap();
        assert_eq!(t.allowed_routes(m, &[&m.sovereignty]).len(), 2);
    }

    #[test]
    fn a_v1_suffix_is_dropped_with_a_note_and_an_api_path_refused() {
        let v1 = YAML.replace("http://127.0.0.1:2\"", "http://127.0.0.1:2/v1/\"");
        let t = RoutingTable::from_yaml("t", &v1).unwrap();
        assert_eq!(
            t.clusters().map(|c| c.url.as_str()).collect::<Vec<_>>(),
            ["http://127.0.0.1:1", "http://127.0.0.1:2"]
        );
        assert_eq!(t.notes().len(), 1);
        assert!(t.notes()[0].contains("cluster `us-1`") && t.notes()[0].contains("ends in /v1"), "{:?}", t.notes());
        assert!(RoutingTable::from_yaml("t", YAML).unwrap().notes().is_empty(), "nothing to say about clean URLs");
        let path = YAML.replace("http://127.0.0.1:2\"", "http://127.0.0.1:2/v1/chat/completions\"");
        let e = RoutingTable::from_yaml("t", &path).unwrap_err().to_string();
        assert!(e.contains("cluster `us-1`") && e.contains("API path"), "{e}");
    }

    #[test]
    fn a_token_file_becomes_a_sensitive_authorization_header() {
        let dir = std::env::temp_dir().join(format!("flotilla-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "s3cret\n").unwrap();
        let with = YAML.replace("region: us-east-1}", &format!("region: us-east-1, tokenFile: {}}}", file.display()));
        let t = RoutingTable::from_yaml("t", &with).unwrap();
        let us = t.clusters().find(|c| c.name == "us-1").unwrap();
        let auth = us.auth.as_ref().unwrap();
        assert!(auth.is_sensitive() && auth == "Bearer s3cret");
        assert!(!format!("{t:?}").contains("s3cret"), "never printed");
        assert!(t.clusters().find(|c| c.name == "eu-1").unwrap().auth.is_none());
        std::fs::write(&file, "").unwrap();
        let e = RoutingTable::from_yaml("t", &with).unwrap_err().to_string();
        assert!(e.contains("tokenFile") && e.contains("empty"), "{e}");
        let gone = with.replace(&file.display().to_string(), "/nonexistent/token");
        let e = RoutingTable::from_yaml("t", &gone).unwrap_err().to_string();
        assert!(e.contains("tokenFile") && e.contains("/nonexistent/token"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rejects_invalid_tables_with_the_field_named() {
        let bad = YAML.replace("cluster: us-1, weight", "cluster: nowhere, weight");
        let e = RoutingTable::from_yaml("t", &bad).unwrap_err().to_string();
        assert!(e.contains("unknown cluster `nowhere`"), "{e}");
        let dup = YAML.replace("aliases: [s]", "aliases: [big]");
        assert!(RoutingTable::from_yaml("t", &dup).unwrap_err().to_string().contains("used twice"));
        let unknown = YAML.replace("fallbacks: [big]", "fallbacks: [huge]");
        assert!(RoutingTable::from_yaml("t", &unknown).unwrap_err().to_string().contains("unknown fallback"));
        let cap = YAML.replace("continuation: regenerate", "continuation: sometimes");
        assert!(RoutingTable::from_yaml("t", &cap).unwrap_err().to_string().contains("continuation"));
        let field = YAML.replace("aliases: [s]", "alias: [s]");
        assert!(RoutingTable::from_yaml("t", &field).unwrap_err().to_string().contains("alias"));
    }
}
