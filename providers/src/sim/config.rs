//! What a simulated cloud is made of: regions with their jurisdiction, zones and quota, the
//! offerings in each (instance type, class, device, capacity type, price, how many nodes the
//! zone has), and scripted failures. Tests and demos build one of these and hand it to
//! `SimProvider::new`.

use std::time::Duration;

use flotilla_apis::common::{CapacityType, DeviceSpec};
use k8s_openapi::jiff::Timestamp;

use crate::error::ProviderError;

/// A simulated cloud.
#[derive(Clone, Debug, PartialEq)]
pub struct SimCloud {
    /// Provider name recorded in attempts (`sim`).
    pub name: String,
    /// Seed for everything pseudo-random (node names, provisioning jitter).
    pub seed: u64,
    /// Time from acquisition to ready nodes.
    pub provisioning_delay: Duration,
    /// Extra random delay of up to this much, drawn from the seed.
    pub provisioning_jitter: Duration,
    /// Regions.
    pub regions: Vec<SimRegion>,
}

/// A simulated region.
#[derive(Clone, Debug, PartialEq)]
pub struct SimRegion {
    /// Name (`eu-central-1`).
    pub name: String,
    /// Jurisdiction (`EU`).
    pub jurisdiction: String,
    /// The InferenceCluster whose nodes this region's capacity joins.
    pub cluster: String,
    /// Zones.
    pub zones: Vec<String>,
    /// Most nodes held at once in this region, over all offerings; `None` is unlimited.
    pub quota_nodes: Option<u32>,
    /// Offerings.
    pub offerings: Vec<SimOffering>,
}

/// One instance type offered in some zones of a region, paid one way.
#[derive(Clone, Debug, PartialEq)]
pub struct SimOffering {
    /// Instance type.
    pub instance_type: String,
    /// InferenceClass the nodes are.
    pub class: String,
    /// One device.
    pub device: DeviceSpec,
    /// Devices per node.
    pub devices_per_node: u32,
    /// Capacity type.
    pub capacity_type: CapacityType,
    /// Zones; empty means every zone of the region.
    pub zones: Vec<String>,
    /// USD per node-hour in millionths.
    pub price_micros: u64,
    /// Nodes each zone can give of this offering at once.
    pub nodes_per_zone: u32,
    /// Reservation id for `reserved` offerings.
    pub reservation_id: Option<String>,
    /// When reserved capacity ends (a capacity block).
    pub ends_at: Option<Timestamp>,
}

/// A scripted failure: the next `times` acquisitions matching the filters fail with `error`.
#[derive(Clone, Debug, PartialEq)]
pub struct FailureRule {
    /// Only in this region.
    pub region: Option<String>,
    /// Only for this capacity type.
    pub capacity_type: Option<CapacityType>,
    /// Only for this instance type.
    pub instance_type: Option<String>,
    /// How many times; `None` is forever.
    pub times: Option<u32>,
    /// What to answer.
    pub error: ProviderError,
}

impl FailureRule {
    /// A rule failing every matching acquisition with `error`, forever.
    pub fn always(error: ProviderError) -> Self {
        Self { region: None, capacity_type: None, instance_type: None, times: None, error }
    }

    /// Only in `region`.
    pub fn in_region(mut self, region: &str) -> Self {
        self.region = Some(region.to_string());
        self
    }

    /// Only for `capacity_type`.
    pub fn for_capacity_type(mut self, capacity_type: CapacityType) -> Self {
        self.capacity_type = Some(capacity_type);
        self
    }

    /// Only for `instance_type`.
    pub fn for_instance_type(mut self, instance_type: &str) -> Self {
        self.instance_type = Some(instance_type.to_string());
        self
    }

    /// Only `times` times.
    pub fn times(mut self, times: u32) -> Self {
        self.times = Some(times);
        self
    }
}
