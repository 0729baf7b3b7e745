//! `InferenceClass`: a hardware recipe. One device as a DRA driver publishes it, how many a
//! node carries, how each provider provisions such nodes, and what a node costs per hour.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{Conditions, DeviceSpec, PricePerCapacityType};

/// A kind of accelerator node the fleet can run replicas on.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "flotilla.dev",
    version = "v1alpha1",
    kind = "InferenceClass",
    shortname = "icls",
    category = "flotilla",
    status = "InferenceClassStatus",
    printcolumn(name = "Driver", type_ = "string", json_path = ".spec.device.driver"),
    printcolumn(name = "Devices/Node", type_ = "integer", json_path = ".spec.devicesPerNode"),
    printcolumn(name = "OnDemand $/h", type_ = "string", json_path = ".spec.pricePerNodeHour.onDemand"),
    printcolumn(name = "Ready", type_ = "string", json_path = ".status.conditions[?(@.type==\"Ready\")].status"),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(validation = Rule::new("self.device.driver == oldSelf.device.driver").message("spec.device.driver is immutable: create a new InferenceClass instead"))]
#[serde(rename_all = "camelCase")]
pub struct InferenceClassSpec {
    /// One device of this class, described like a DRA `ResourceSlice` device.
    pub device: DeviceSpec,
    /// How many such devices one node carries.
    #[schemars(range(min = 1, max = 64))]
    pub devices_per_node: u32,
    /// How nodes of this class are provisioned, per provider.
    #[serde(default)]
    pub provisioning: Provisioning,
    /// Price per node-hour by capacity type, in USD.
    #[serde(default)]
    pub price_per_node_hour: PricePerCapacityType,
}

/// Per-provider provisioning recipes.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Provisioning {
    /// AWS: EC2 instance types that carry this class, in order of preference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aws: Option<AwsProvisioning>,
}

/// How AWS provides nodes of a class.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AwsProvisioning {
    /// EC2 instance types, in order of preference (`p5.48xlarge`).
    #[schemars(length(min = 1, max = 16))]
    pub instance_types: Vec<String>,
}

/// Observed state of an InferenceClass.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct InferenceClassStatus {
    /// The generation last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Ready` once the class is valid and referenced pools can use it.
    #[serde(default)]
    pub conditions: Conditions,
    /// How many devices of this class the fleet has, summed over member clusters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet_devices: Option<i64>,
}
