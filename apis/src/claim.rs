//! `CapacityClaim`: capacity intent declared before pods go Pending. Pod sets and their
//! devices, latency, topology, an ordered capacity policy and a disruption policy go in;
//! status says what was obtained, where, and every provider attempt with its reason.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{CapacityType, Conditions, Sovereignty};
use crate::deployment::CelExpression;

/// Capacity a team needs, declared ahead.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "flotilla.dev",
    version = "v1alpha1",
    kind = "CapacityClaim",
    namespaced,
    shortname = "cc",
    shortname = "claim",
    category = "flotilla",
    status = "CapacityClaimStatus",
    printcolumn(name = "Devices", type_ = "integer", json_path = ".status.devicesRequested"),
    printcolumn(name = "Obtained", type_ = "integer", json_path = ".status.devicesObtained"),
    printcolumn(
        name = "Fulfilled",
        type_ = "string",
        json_path = ".status.conditions[?(@.type==\"Fulfilled\")].status"
    ),
    printcolumn(name = "Reason", type_ = "string", json_path = ".status.conditions[?(@.type==\"Fulfilled\")].reason"),
    printcolumn(name = "Surplus", type_ = "string", json_path = ".status.conditions[?(@.type==\"Surplus\")].reason"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[serde(rename_all = "camelCase")]
pub struct CapacityClaimSpec {
    /// Groups of identical pods and the devices each needs.
    #[schemars(length(min = 1, max = 8))]
    pub pod_sets: Vec<PodSet>,
    /// How fast capacity must come, and whether to keep it warm.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency: Option<ClaimLatency>,
    /// Co-location wishes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topology: Option<ClaimTopology>,
    /// Where and how capacity may be obtained, in order of preference.
    pub capacity: CapacityPolicy,
    /// What may take capacity away, and when.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disruption: Option<DisruptionPolicy>,
}

/// Identical pods with the same device needs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodSet {
    /// Name, unique in the claim.
    #[schemars(length(min = 1, max = 63), regex(pattern = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"))]
    pub name: String,
    /// Pods.
    #[schemars(range(min = 1, max = 10000))]
    pub count: i32,
    /// Devices per pod, all on one node.
    #[schemars(range(min = 1, max = 64))]
    pub devices_per_pod: i32,
}

/// Latency requirements.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimLatency {
    /// Give up (`Expired`) if unfulfilled after this (`15m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"))]
    pub max_provisioning_latency: Option<String>,
    /// Keep the capacity running even while no pod uses it.
    #[serde(default)]
    pub warm: bool,
}

/// Whether a placement group is wanted.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum PlacementGroupMode {
    /// No placement group.
    #[default]
    None,
    /// Use one when the provider can; otherwise go without.
    Preferred,
    /// Fail rather than go without.
    Required,
}

/// Co-location wishes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimTopology {
    /// Every pod set in one availability zone.
    #[serde(default)]
    pub same_zone: bool,
    /// Cluster placement group for low-latency interconnect.
    #[serde(default)]
    pub placement_group: PlacementGroupMode,
}

/// One device-class alternative of a claim.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[x_kube(validation = Rule::new("has(self.class) || (has(self.selectors) && size(self.selectors) > 0)").message("name a class, give selectors, or both"))]
#[serde(rename_all = "camelCase")]
pub struct ClaimDeviceClass {
    /// An InferenceClass.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// CEL selectors over `device`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub selectors: Vec<CelExpression>,
}

/// Where and how capacity may be obtained.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CapacityPolicy {
    /// Capacity types in order of preference.
    #[schemars(length(min = 1, max = 3))]
    pub capacity_types: Vec<CapacityType>,
    /// Device classes in order of preference.
    #[schemars(length(min = 1, max = 8))]
    pub device_classes: Vec<ClaimDeviceClass>,
    /// Allowed jurisdictions and regions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sovereignty: Option<Sovereignty>,
    /// Reservation ids to use for `reserved` capacity.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub reservation_ids: Vec<String>,
}

/// How capacity may be consolidated.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum Consolidation {
    /// Never consolidate.
    Disabled,
    /// Remove nodes only when empty.
    #[default]
    WhenEmpty,
    /// Repack pods to free nodes.
    WhenUnderutilized,
}

/// How capacity may be scaled down.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ScaleDown {
    /// Whenever consolidation allows.
    #[default]
    Any,
    /// Only after the application drained (condition `DrainRequired` until then).
    ApplicationDrainOnly,
}

/// What may take capacity away.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DisruptionPolicy {
    /// Keep nodes at least this long (`1h`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"))]
    pub min_lifetime: Option<String>,
    /// Consolidation policy.
    #[serde(default)]
    pub consolidation: Consolidation,
    /// Scale-down policy.
    #[serde(default)]
    pub scale_down: ScaleDown,
}

/// Observed state of a CapacityClaim.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CapacityClaimStatus {
    /// The generation last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Provisioning`, `Fulfilled`, `Ready`.
    #[serde(default)]
    pub conditions: Conditions,
    /// Devices over all pod sets.
    #[serde(default)]
    pub devices_requested: i64,
    /// Devices obtained.
    #[serde(default)]
    pub devices_obtained: i64,
    /// What was obtained, where.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allocations: Vec<ClaimAllocation>,
    /// Provider attempts, newest last (bounded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub attempts: Vec<ClaimAttempt>,
}

/// Capacity obtained for a claim.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimAllocation {
    /// The pod set.
    pub pod_set: String,
    /// The InferenceCluster.
    pub cluster: String,
    /// The pool.
    pub pool: String,
    /// The InferenceClass.
    pub class: String,
    /// How it is paid for.
    pub capacity_type: Option<CapacityType>,
    /// Nodes obtained.
    pub nodes: i32,
    /// Pods those nodes hold.
    pub pods: i32,
    /// When the capacity was obtained (`disruption.minLifetime` counts from here).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<Time>,
}

/// One request to a provider.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClaimAttempt {
    /// When.
    pub time: Option<Time>,
    /// Provider (`aws`, `sim`).
    pub provider: String,
    /// Region.
    pub region: String,
    /// InferenceClass tried.
    pub class: String,
    /// Capacity type tried.
    pub capacity_type: Option<CapacityType>,
    /// `Fulfilled`, `InsufficientCapacity`, `QuotaExceeded`, ...
    pub result: String,
    /// The provider's own code and message.
    pub message: String,
}
