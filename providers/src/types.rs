//! The values that cross the `CapacityProvider` boundary: regions with their jurisdiction,
//! offerings (what a provider could give, where, at what price), acquisition requests, and
//! acquisitions with the nodes they provisioned and the events (spot interruption, capacity
//! block end) that take them away. Plain data, no SDK types.

use std::collections::BTreeMap;

use flotilla_apis::common::{CapacityType, DeviceSpec, TaintEffect};
use k8s_openapi::jiff::Timestamp;

/// A region a provider can obtain capacity in.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RegionInfo {
    /// The provider serving the region (`aws`, `sim`, `static`), as recorded in attempts.
    pub provider: String,
    /// Region name (`eu-central-1`).
    pub name: String,
    /// Jurisdiction code the region is under (`EU`).
    pub jurisdiction: String,
    /// The InferenceCluster whose nodes capacity in this region joins.
    pub cluster: String,
    /// Availability zones.
    pub zones: Vec<String>,
}

/// Something a provider could give: one instance type, in one zone, paid one way.
#[derive(Clone, Debug, PartialEq)]
pub struct Offering {
    /// Region.
    pub region: String,
    /// Availability zone.
    pub zone: String,
    /// Provider instance type (`p5.48xlarge`).
    pub instance_type: String,
    /// How it is paid for.
    pub capacity_type: CapacityType,
    /// One device of the node, in the DRA shape InferenceClasses use.
    pub device: DeviceSpec,
    /// Devices per node.
    pub devices_per_node: u32,
    /// USD per node-hour in millionths, when known.
    pub price_micros: Option<u64>,
    /// The reservation (capacity reservation or capacity block) behind a `reserved` offering.
    pub reservation_id: Option<String>,
    /// Nodes the provider says are available, when it says (reservations, static pools).
    pub available_nodes: Option<u32>,
    /// When the capacity ends (capacity blocks).
    pub ends_at: Option<Timestamp>,
    /// The InferenceClass the provider knows this offering as, if any (sim, static).
    pub class: Option<String>,
    /// The InferenceCluster the nodes would join, when the provider serves several clusters
    /// in one region (static sites); `None`: the region's one cluster ([`RegionInfo::cluster`]).
    pub cluster: Option<String>,
}

/// A taint put on provisioned nodes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeTaint {
    /// Key.
    pub key: String,
    /// Value.
    pub value: String,
    /// Effect.
    pub effect: TaintEffect,
}

/// A request for nodes.
#[derive(Clone, Debug, PartialEq)]
pub struct AcquireRequest {
    /// A name unique per claim, pod set and attempt; providers use it as the id of what they
    /// create (node group name), so a repeated request finds the earlier result.
    pub name: String,
    /// Region.
    pub region: String,
    /// Zones the nodes may be in (one zone when the claim wants `sameZone`).
    pub zones: Vec<String>,
    /// Instance types, in order of preference.
    pub instance_types: Vec<String>,
    /// How the nodes are paid for.
    pub capacity_type: CapacityType,
    /// Nodes wanted.
    pub nodes: u32,
    /// Fewest nodes worth having; the provider fails rather than give fewer.
    pub min_nodes: u32,
    /// Ask for a cluster placement group.
    pub placement_group: bool,
    /// The reservation to draw from (`reserved`).
    pub reservation_id: Option<String>,
    /// The InferenceClass the nodes are for.
    pub class: String,
    /// The InferenceCluster the offering named ([`Offering::cluster`]), when it named one.
    pub cluster: Option<String>,
    /// Labels every node gets (class, claim, pool).
    pub labels: BTreeMap<String, String>,
    /// Taints every node gets.
    pub taints: Vec<NodeTaint>,
}

/// Where an acquisition stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AcquisitionState {
    /// Nodes are being created.
    Provisioning,
    /// Nodes are up.
    Active,
    /// The provider took the capacity back (see `events`).
    Interrupted,
    /// Released, or gone.
    Released,
    /// The provider gave up creating it (see `message`).
    Failed,
}

/// What took capacity away.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CapacityEventKind {
    /// A spot node was reclaimed.
    SpotInterruption,
    /// A capacity block (or reservation) reached its end.
    CapacityBlockEnd,
}

impl CapacityEventKind {
    /// As written in messages.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SpotInterruption => "spot interruption",
            Self::CapacityBlockEnd => "capacity block end",
        }
    }
}

/// An event on an acquisition.
#[derive(Clone, Debug, PartialEq)]
pub struct CapacityEvent {
    /// What happened.
    pub kind: CapacityEventKind,
    /// When.
    pub at: Timestamp,
    /// Nodes affected.
    pub nodes: Vec<String>,
}

/// A node a provider provisioned, as the controller should materialise it (a kwok fake node
/// for `sim`, nothing for `aws`, whose nodes join by themselves).
#[derive(Clone, Debug, PartialEq)]
pub struct ProvisionedNode {
    /// Node name.
    pub name: String,
    /// Zone.
    pub zone: String,
    /// Instance type.
    pub instance_type: String,
    /// How it is paid for.
    pub capacity_type: CapacityType,
    /// InferenceClass.
    pub class: String,
    /// Labels (the request's, plus zone, instance type and capacity type).
    pub labels: BTreeMap<String, String>,
    /// Taints.
    pub taints: Vec<NodeTaint>,
    /// One device.
    pub device: DeviceSpec,
    /// Devices on the node.
    pub devices: u32,
    /// Whether the node is up.
    pub ready: bool,
}

/// What a provider obtained for one request.
#[derive(Clone, Debug, PartialEq)]
pub struct Acquisition {
    /// Provider id (node group name for AWS).
    pub id: String,
    /// Region.
    pub region: String,
    /// Zone, when all nodes are in one.
    pub zone: Option<String>,
    /// Instance type.
    pub instance_type: String,
    /// How it is paid for.
    pub capacity_type: CapacityType,
    /// InferenceClass.
    pub class: String,
    /// Nodes granted (what the provider is bringing up, ready or not).
    pub nodes_granted: u32,
    /// Where it stands.
    pub state: AcquisitionState,
    /// Nodes provisioned so far.
    pub nodes: Vec<ProvisionedNode>,
    /// Interruptions and ends.
    pub events: Vec<CapacityEvent>,
    /// The provider's words on the state.
    pub message: String,
    /// Why it failed, when `state` is `Failed`.
    pub failure: Option<crate::error::ProviderError>,
}

/// A node a claim gives back: its Kubernetes name and, where the member reported one, its
/// `spec.providerID` (`aws:///eu-central-1a/i-0abc…`), which names the cloud's instance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedNode {
    /// Node name in the member cluster.
    pub name: String,
    /// The node's `spec.providerID`, if it has one.
    pub provider_id: Option<String>,
}

/// How a claim shrinks an acquisition (`CapacityProvider::remove_nodes`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NodeRemoval {
    /// The empty nodes the claim chose, removed first (may be fewer than the reduction: nodes
    /// that have not joined the member yet have no name).
    pub named: Vec<NamedNode>,
    /// How many nodes the acquisition should hold afterwards.
    pub nodes: u32,
    /// Whether the provider may pick nodes itself beyond `named` (the claim lets anything go:
    /// `consolidation: WhenUnderutilized` with `scaleDown: Any`). When false, a provider that
    /// can name nodes removes only `named`, and one that cannot refuses.
    pub provider_may_choose: bool,
}

/// One EKS cluster the AWS adapter may add node groups to. Plain data, here rather than in
/// `aws` so that a `--capacity-provider` file can be read and checked by a build without the
/// `aws` feature.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct AwsTarget {
    /// The InferenceCluster name the nodes join.
    pub cluster: String,
    /// EKS cluster name.
    pub eks_cluster: String,
    /// AWS region.
    pub region: String,
    /// Jurisdiction code of the region (`EU`).
    pub jurisdiction: String,
    /// Subnet per availability zone for node groups.
    pub subnets: BTreeMap<String, String>,
    /// IAM role ARN nodes run as.
    pub node_role_arn: String,
    /// Instance types to consider (from the InferenceClasses' `provisioning.aws`).
    pub instance_types: Vec<String>,
    /// Look up capacity reservations and capacity blocks (off when the account has none or
    /// the endpoint does not implement them).
    pub reservations: bool,
}
