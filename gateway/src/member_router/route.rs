//! The part of a Gateway API `HTTPRoute` (`gateway.networking.k8s.io/v1`) the member router
//! reads, as plain serde structs: parent references, and per rule its matches, filters and
//! backend references. Routes arrive as `DynamicObject`s so that one route the structs cannot
//! read is left out on its own instead of failing the whole watch.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use serde::Deserialize;
use serde_json::Value;

/// The Gateway API group.
pub const GATEWAY_GROUP: &str = "gateway.networking.k8s.io";

/// The `ApiResource` of `HTTPRoute` v1.
pub fn api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(GATEWAY_GROUP, "v1", "HTTPRoute"), "httproutes")
}

/// An `HTTPRoute`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct HttpRoute {
    /// Name, namespace, creation time and the `flotilla.dev/model` annotation.
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// What the route matches and where it sends it.
    #[serde(default)]
    pub spec: HttpRouteSpec,
}

impl HttpRoute {
    /// Read the route out of a watched object.
    pub fn from_dynamic(o: &DynamicObject) -> Result<Self, String> {
        let spec = match o.data.get("spec") {
            Some(s) => serde_json::from_value(s.clone()).map_err(|e| e.to_string())?,
            None => HttpRouteSpec::default(),
        };
        Ok(HttpRoute { metadata: o.metadata.clone(), spec })
    }

    /// `namespace/name`.
    pub fn key(&self) -> String {
        format!("{}/{}", self.namespace(), self.metadata.name.as_deref().unwrap_or_default())
    }

    /// The route's namespace.
    pub fn namespace(&self) -> &str {
        self.metadata.namespace.as_deref().unwrap_or_default()
    }
}

/// `spec` of an `HTTPRoute`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HttpRouteSpec {
    /// The Gateways the route attaches to.
    #[serde(default)]
    pub parent_refs: Vec<ParentRef>,
    /// The rules.
    #[serde(default)]
    pub rules: Vec<Rule>,
}

/// `spec.parentRefs[]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ParentRef {
    /// Default `gateway.networking.k8s.io`.
    pub group: Option<String>,
    /// Default `Gateway`.
    pub kind: Option<String>,
    /// Default: the route's namespace.
    pub namespace: Option<String>,
    /// The Gateway's name.
    #[serde(default)]
    pub name: String,
    /// One listener (not checked: the router is one listener).
    pub section_name: Option<String>,
}

/// `spec.rules[]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    /// Absent or empty: everything (which this router does not serve).
    #[serde(default)]
    pub matches: Vec<Match>,
    /// Request filters (none are supported: a rule with any is not served).
    #[serde(default)]
    pub filters: Vec<Value>,
    /// Where matching requests go.
    #[serde(default)]
    pub backend_refs: Vec<BackendRef>,
}

/// `spec.rules[].matches[]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Match {
    /// The path match (the API server defaults it to `PathPrefix /`).
    pub path: Option<PathMatch>,
    /// Header matches.
    #[serde(default)]
    pub headers: Vec<HeaderMatch>,
    /// Query-parameter matches (not supported).
    #[serde(default)]
    pub query_params: Vec<Value>,
    /// Method match (not supported).
    pub method: Option<String>,
}

/// `matches[].path`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct PathMatch {
    /// Default `PathPrefix`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// Default `/`.
    pub value: Option<String>,
}

/// `matches[].headers[]`.
#[derive(Clone, Debug, Default, Deserialize)]
pub struct HeaderMatch {
    /// Default `Exact`.
    #[serde(rename = "type")]
    pub kind: Option<String>,
    /// Header name (case-insensitive).
    #[serde(default)]
    pub name: String,
    /// The value to match.
    #[serde(default)]
    pub value: String,
}

/// `spec.rules[].backendRefs[]`.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendRef {
    /// Default `""` (core).
    pub group: Option<String>,
    /// Default `Service`.
    pub kind: Option<String>,
    /// The Service's name.
    #[serde(default)]
    pub name: String,
    /// Default: the route's namespace (another one is not served: no ReferenceGrant support).
    pub namespace: Option<String>,
    /// The Service port.
    pub port: Option<i32>,
    /// Share of the rule's traffic; default 1, 0 sends none.
    pub weight: Option<i32>,
    /// Per-backend filters (none are supported: a backend with any is not served).
    #[serde(default)]
    pub filters: Vec<Value>,
}
