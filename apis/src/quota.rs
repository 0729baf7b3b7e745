//! `FleetQuota`: a team's budget across the whole fleet. It caps what the ModelDeployments of
//! its namespace may hold placed at once, over every member cluster together: devices (of one
//! class, of one capacity type, or of any), and cost per hour. The solver treats each limit as
//! a hard constraint: a replica that would take the namespace past one is not placed there
//! (reason `QuotaExceeded`), its next alternative is tried, and another team's replicas are
//! never moved or preempted for it. Several FleetQuotas in a namespace all apply.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{CapacityType, Conditions};

/// A namespace's budget across the fleet.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "flotilla.dev",
    version = "v1alpha1",
    kind = "FleetQuota",
    namespaced,
    shortname = "fq",
    category = "flotilla",
    status = "FleetQuotaStatus",
    printcolumn(name = "Devices", type_ = "string", json_path = ".status.summary"),
    printcolumn(name = "Cost $/h", type_ = "string", json_path = ".status.costPerHour"),
    printcolumn(name = "Max $/h", type_ = "string", json_path = ".spec.maxCostPerHour"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(validation = Rule::new("size(self.devices) > 0 || has(self.maxCostPerHour)").message("a FleetQuota limits something: give spec.devices, spec.maxCostPerHour, or both"))]
#[serde(rename_all = "camelCase")]
pub struct FleetQuotaSpec {
    /// Device limits. Each counts the devices of the namespace's placed replicas that match
    /// it (its class and capacity type; an absent one matches every class or type).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub devices: Vec<DeviceLimit>,
    /// Most the namespace's placed replicas may cost per hour together, in USD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,9}(\.[0-9]{1,6})?$"))]
    pub max_cost_per_hour: Option<String>,
}

/// A cap on devices.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceLimit {
    /// Only devices of this InferenceClass; absent: every class.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub class: Option<String>,
    /// Only devices bought as this capacity type; absent: every type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_type: Option<CapacityType>,
    /// Most devices the namespace's placed replicas may hold that match.
    #[schemars(range(min = 0, max = 1_000_000))]
    pub max: u32,
}

impl FleetQuotaSpec {
    /// The limits that count the same devices as an earlier one: (this one, the earlier one),
    /// by index in `devices`.
    pub fn counted_twice(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.devices.iter().enumerate().filter_map(|(i, l)| {
            let key = (&l.class, l.capacity_type);
            self.devices[..i].iter().position(|o| (&o.class, o.capacity_type) == key).map(|j| (i, j))
        })
    }
}

impl DeviceLimit {
    /// What the limit is about, as said in messages: `h100 spot devices`, `devices`.
    pub fn subject(&self) -> String {
        let mut words = Vec::new();
        if let Some(c) = &self.class {
            words.push(c.clone());
        }
        if let Some(t) = self.capacity_type {
            words.push(t.as_str().to_string());
        }
        words.push("devices".into());
        words.join(" ")
    }

    /// Whether a device of `class` bought as `capacity_type` counts against the limit.
    pub fn counts(&self, class: &str, capacity_type: CapacityType) -> bool {
        self.class.as_deref().is_none_or(|c| c == class) && self.capacity_type.is_none_or(|t| t == capacity_type)
    }
}

/// Observed usage against the quota.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FleetQuotaStatus {
    /// The generation last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready`: the quota is valid and enforced. `Exhausted`: a limit binds (replicas of the
    /// namespace are unplaced because of it, or usage is at the limit).
    #[serde(default)]
    pub conditions: Conditions,
    /// Per device limit, in `spec.devices` order: devices the namespace's plan holds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<DeviceUsage>,
    /// What the namespace's plan costs per hour, in USD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_per_hour: Option<String>,
    /// Usage against every device limit in one line, for `kubectl get` (`h100 12/16`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub summary: Option<String>,
    /// Replicas of the namespace the quota leaves unplaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unplaced_replicas: Option<u32>,
}

/// Usage against one device limit.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceUsage {
    /// The limit's class, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// The limit's capacity type, when it has one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_type: Option<CapacityType>,
    /// Devices held.
    pub used: u32,
    /// The limit.
    pub max: u32,
}
