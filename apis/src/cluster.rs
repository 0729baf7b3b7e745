//! `InferenceCluster`: a member cluster of the fleet. Where it is (provider, region, zones),
//! which law it is under (jurisdiction, country), how to reach it (a kubeconfig Secret or a SIG
//! Multicluster `ClusterProfile`, and the entry URL), which node pools it has, and — in status —
//! what capacity was observed there.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{CapacityType, ClusterTaint, Conditions, JurisdictionCode, SecretRef};
pub use crate::node_devices::{NODE_DEVICES_MAX, NodeDevices, node_devices, node_devices_problems};

/// A member cluster that runs model replicas.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "flotilla.dev",
    version = "v1alpha1",
    kind = "InferenceCluster",
    shortname = "icl",
    category = "flotilla",
    status = "InferenceClusterStatus",
    printcolumn(name = "Region", type_ = "string", json_path = ".spec.region"),
    printcolumn(name = "Jurisdiction", type_ = "string", json_path = ".spec.jurisdiction"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Devices", type_ = "integer", json_path = ".status.devicesTotal"),
    printcolumn(name = "Free", type_ = "integer", json_path = ".status.devicesFree"),
    printcolumn(name = "Version", type_ = "string", json_path = ".status.kubernetesVersion", priority = 1),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(validation = Rule::new("self.region == oldSelf.region").message("spec.region is immutable: register the cluster under a new name"))]
#[x_kube(validation = Rule::new("self.jurisdiction == oldSelf.jurisdiction").message("spec.jurisdiction is immutable: register the cluster under a new name"))]
#[x_kube(validation = Rule::new("!has(self.credentials) || !has(self.clusterProfileRef)").field_path(".clusterProfileRef").message("set at most one of spec.credentials and spec.clusterProfileRef: the member is reached either through a kubeconfig Secret or through a ClusterProfile"))]
#[serde(rename_all = "camelCase")]
pub struct InferenceClusterSpec {
    /// The provider that runs the cluster and provisions its nodes.
    pub provider: ClusterProvider,
    /// Cloud region (`eu-central-1`) or a site name.
    #[schemars(length(min = 1, max = 63))]
    pub region: String,
    /// Availability zones the cluster's nodes are in.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub zones: Vec<String>,
    /// Jurisdiction code the cluster is under (`EU`, `US`, `APAC`).
    pub jurisdiction: JurisdictionCode,
    /// ISO 3166-1 alpha-2 country code (`DE`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[A-Z]{2}$"))]
    pub country: Option<String>,
    /// Where the member's kubeconfig is kept (key defaults to `kubeconfig`). Not together with
    /// `clusterProfileRef`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<ClusterCredentials>,
    /// Reach the member through a SIG Multicluster `ClusterProfile`
    /// (`multicluster.x-k8s.io/v1alpha1`, the Cluster Inventory API) instead of a kubeconfig
    /// Secret: its `status.accessProviders` give the API server and CA, and the controller's
    /// provider file (`--cluster-profile-providers`, KEP-5339) the exec credential plugin.
    /// Not together with `credentials`. See docs/operations.md, "Members from ClusterProfiles".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_profile_ref: Option<ClusterProfileRef>,
    /// The in-cluster entry URL the fleet gateway sends requests to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^https?://[^\s/]+(/.*)?$"))]
    pub endpoint: Option<String>,
    /// Accelerator node pools.
    #[serde(default)]
    #[schemars(length(max = 64))]
    pub pools: Vec<NodePool>,
    /// Taints: only deployments that tolerate them are placed here.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub taints: Vec<ClusterTaint>,
    /// Set to stop new placements here (existing replicas stay).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cordoned: bool,
    /// Storage class of ModelCache volumes here, when the cache names none (else the member's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_storage_class_name: Option<String>,
    /// What deleting this InferenceCluster does to the workloads Flotilla runs in the member:
    /// `Cleanup` (the default) removes every object with Flotilla's labels from the member before
    /// the InferenceCluster goes; `Orphan` leaves them running there, unmanaged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deletion_policy: Option<DeletionPolicy>,
    /// How the fleet gateway authenticates to `endpoint` and verifies it: an upstream bearer
    /// token, and for an `https://` endpoint the CA bundle and an optional client certificate.
    /// The Secrets are read by the gateway from its own namespace (docs/gateway.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_auth: Option<EndpointAuth>,
    /// The Gateway API `Gateway` in the member that serves `endpoint`. Set: for every
    /// ModelDeployment placed here Flotilla renders an `HTTPRoute` (`gateway.networking.k8s.io/v1`)
    /// in the deployment's namespace, parented to this Gateway, that sends the requests carrying
    /// `x-flotilla-deployment: <namespace>/<name>` (the header the fleet gateway sets) to the
    /// deployment's Service. Any Gateway API implementation serves it, or `flotilla-member-router`
    /// (docs/member-router.md). Unset: no route is rendered, and `endpoint` must reach each model's
    /// pods by itself (docs/operations.md, "What each member needs").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway_ref: Option<GatewayRef>,
}

/// A Gateway (`gateway.networking.k8s.io`) in a member cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GatewayRef {
    /// The Gateway's namespace. Its listener must admit routes from the tenants' namespaces
    /// (`allowedRoutes.namespaces`).
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub namespace: String,
    /// The Gateway's name.
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"))]
    pub name: String,
    /// One listener of the Gateway (`parentRefs[].sectionName`); absent: every listener that
    /// admits the route.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"))]
    pub section_name: Option<String>,
}

/// How the fleet gateway authenticates to a member's entry point and verifies it.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EndpointAuth {
    /// A Secret whose key (default `token`) holds the bearer token the serving engine expects
    /// (vLLM's `--api-key`), sent as `Authorization: Bearer` on every request to the endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token_secret_ref: Option<SecretRef>,
    /// For an `https://` endpoint: a Secret whose key (default `ca.crt`) holds the PEM CA bundle
    /// that verifies the endpoint's certificate (absent: the system's roots). Hostnames are
    /// always verified; there is no insecure mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret_ref: Option<SecretRef>,
    /// For an `https://` endpoint: a `kubernetes.io/tls` Secret (`tls.crt`, `tls.key`) whose
    /// certificate the gateway presents (mutual TLS). Its `key` is ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_cert_secret_ref: Option<SecretRef>,
}

/// What deleting an InferenceCluster does to Flotilla's workloads in the member.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum DeletionPolicy {
    /// Remove Flotilla's objects (by its labels) from the member first; while the member cannot
    /// be reached the InferenceCluster waits (`Ready=False`, `CleanupBlocked`) up to a bound,
    /// then orphans them (docs/operations.md, "Deletion").
    #[default]
    Cleanup,
    /// Leave Flotilla's objects running in the member, unmanaged.
    Orphan,
}

/// Which provider runs the cluster. Exactly one is set.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[x_kube(validation = Rule::new("(has(self.aws) ? 1 : 0) + (has(self.static) ? 1 : 0) + (has(self.sim) ? 1 : 0) == 1").message("set exactly one of aws, static or sim"))]
#[serde(rename_all = "camelCase")]
pub struct ClusterProvider {
    /// An EKS cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aws: Option<AwsCluster>,
    /// A cluster whose nodes are declared, not provisioned (on-premises, colocation).
    #[serde(default, rename = "static", skip_serializing_if = "Option::is_none")]
    pub static_: Option<StaticCluster>,
    /// A simulated cloud, for tests and demos.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sim: Option<SimCluster>,
}

/// Identity of an EKS cluster.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AwsCluster {
    /// EKS cluster name.
    #[schemars(length(min = 1, max = 100))]
    pub eks_cluster: String,
    /// AWS region of the EKS cluster.
    #[schemars(regex(pattern = r"^[a-z]{2}(-[a-z]+)+-[0-9]$"))]
    pub region: String,
    /// IAM role to assume for this cluster, if not the controller's own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role_arn: Option<String>,
}

/// A cluster with a fixed, declared inventory.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StaticCluster {
    /// Free-form site description.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site: Option<String>,
}

/// A simulated cloud.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SimCluster {
    /// Name of the simulated cloud.
    #[schemars(length(min = 1, max = 63))]
    pub cloud: String,
}

/// Where the member's credentials live in the control cluster.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterCredentials {
    /// The Secret holding a kubeconfig.
    pub secret_ref: SecretRef,
}

/// A `ClusterProfile` (`multicluster.x-k8s.io/v1alpha1`) in the control cluster.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterProfileRef {
    /// Namespace of the ClusterProfile (the cluster inventory's namespace, e.g. `fleet-system`).
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub namespace: String,
    /// Name of the ClusterProfile.
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$"))]
    pub name: String,
}

/// A pool of accelerator nodes of one InferenceClass.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[x_kube(validation = Rule::new("self.minNodes <= self.maxNodes").message("minNodes must be at most maxNodes"))]
#[x_kube(validation = Rule::new("!has(self.nodes) || self.nodes <= self.maxNodes").message("nodes must be at most maxNodes"))]
#[serde(rename_all = "camelCase")]
pub struct NodePool {
    /// Pool name, unique in the cluster; nodes carry it as label `flotilla.dev/pool`.
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
    /// The InferenceClass of the pool's nodes.
    #[schemars(length(min = 1, max = 253))]
    pub class: String,
    /// Nodes the provider keeps at least.
    #[serde(default)]
    #[schemars(range(min = 0, max = 10000))]
    pub min_nodes: i32,
    /// Nodes the provider may grow the pool to.
    #[schemars(range(min = 0, max = 10000))]
    pub max_nodes: i32,
    /// Nodes that exist now. Declared for `static` pools and for offline planning;
    /// the controller's observation in status takes precedence.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 10000))]
    pub nodes: Option<i32>,
    /// Capacity types the pool offers, in order of preference.
    #[schemars(length(min = 1, max = 3))]
    pub capacity_types: Vec<CapacityType>,
    /// Capacity reservations backing the `reserved` type (`cr-0abc…`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reservation_ids: Vec<String>,
}

/// Observed state of a member cluster.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InferenceClusterStatus {
    /// The generation last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Reachable`, `CapacityKnown`, `Ready`.
    #[serde(default)]
    pub conditions: Conditions,
    /// Observed capacity per pool.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub pools: Vec<PoolStatus>,
    /// Devices over all pools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices_total: Option<i64>,
    /// Free devices over all pools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices_free: Option<i64>,
    /// Whether the member publishes its devices through DRA (`resource.k8s.io/v1`
    /// ResourceSlices); then replicas request devices with ResourceClaims carrying the
    /// deployment's CEL selectors, otherwise with `nvidia.com/gpu`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dra: Option<bool>,
    /// The member's Kubernetes version (`v1.34.2`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubernetes_version: Option<String>,
    /// When the member answered with a status change (first contact included), or, with the
    /// controller's `--heartbeat-seconds`, at least that often. A member that stops answering is
    /// marked `Reachable=False` by the leader within a poll, so a `Ready` status is current while
    /// the controller's leader Lease is renewed, however old this time is.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_heartbeat: Option<Time>,
}

/// Observed capacity of one pool.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PoolStatus {
    /// Pool name.
    pub name: String,
    /// The class its devices were matched to.
    pub class: String,
    /// Ready nodes in the pool.
    pub nodes: i32,
    /// Devices on those nodes.
    pub devices_total: i64,
    /// Devices allocated to pods or claims.
    pub devices_allocated: i64,
    /// Devices free.
    pub devices_free: i64,
    /// Of the allocated devices, those held by replicas Flotilla manages (the solver places
    /// those replicas again, so it counts their devices as available to them).
    #[serde(default)]
    pub devices_managed: i64,
    /// The figures above node by node: the pool's ready nodes grouped by the devices free on
    /// each and the devices Flotilla's replicas hold on each (see `NodeDevices`). When given,
    /// its `nodes` add up to `nodes`, its `free × nodes` to `devicesFree` and its
    /// `managed × nodes` to `devicesManaged`. Absent (an older controller, a hand-written status,
    /// or more distinct node shapes than the list holds), the solver assumes the allocated
    /// devices fill whole nodes first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128))]
    pub node_devices: Vec<NodeDevices>,
    /// Nodes of the pool set aside for one CapacityClaim (tainted
    /// `flotilla.dev/claim=<namespace>.<name>:NoSchedule`): only the deployment owning that
    /// claim is placed on them. Not counted in the figures above.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub reserved: Vec<ReservedCapacity>,
}

/// Capacity of a pool that a CapacityClaim obtained for its owner.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ReservedCapacity {
    /// The claim, `<namespace>.<name>`.
    pub claim: String,
    /// Ready nodes.
    pub nodes: i32,
    /// Devices on those nodes.
    pub devices_total: i64,
    /// Devices allocated to pods or claims.
    pub devices_allocated: i64,
    /// Of those, held by replicas Flotilla manages.
    #[serde(default)]
    pub devices_managed: i64,
    /// These nodes one by one, as `PoolStatus.nodeDevices`: its `nodes` add up to `nodes`, its
    /// `free × nodes` to `devicesTotal - devicesAllocated`, its `managed × nodes` to
    /// `devicesManaged`. Absent, allocated devices are assumed to fill whole nodes first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 128))]
    pub node_devices: Vec<NodeDevices>,
}
