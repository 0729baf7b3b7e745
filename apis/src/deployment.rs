//! `ModelDeployment`: a model to serve. Its source and engine, its topology and the devices
//! each replica needs (an ordered list of alternatives with CEL selectors), and its placement
//! policy: selector, sovereignty, spread, capacity types, cost ceiling. Status reports where
//! replicas are, how many are ready, and why the rest are not placed.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, Time};
use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::common::{CapacityType, ClusterToleration, Conditions, Sovereignty};

/// A model served by the fleet.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[kube(
    group = "flotilla.dev",
    version = "v1alpha1",
    kind = "ModelDeployment",
    namespaced,
    shortname = "md",
    category = "flotilla",
    status = "ModelDeploymentStatus",
    scale(spec_replicas_path = ".spec.replicas", status_replicas_path = ".status.replicas"),
    printcolumn(name = "Model", type_ = "string", json_path = ".spec.model.name"),
    printcolumn(name = "Desired", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(name = "Placed", type_ = "string", json_path = ".status.conditions[?(@.type==\"Placed\")].status"),
    printcolumn(name = "Serving", type_ = "string", json_path = ".status.conditions[?(@.type==\"Serving\")].status"),
    printcolumn(name = "Clusters", type_ = "string", json_path = ".status.clusters", priority = 1),
    printcolumn(name = "Age", type_ = "date", json_path = ".metadata.creationTimestamp")
)]
#[x_kube(validation = Rule::new("self.model.name == oldSelf.model.name").message("spec.model.name is immutable: clients route by it; create a new ModelDeployment"))]
#[serde(rename_all = "camelCase")]
pub struct ModelDeploymentSpec {
    /// What to serve.
    pub model: ModelSource,
    /// Desired replicas over the whole fleet.
    #[schemars(range(min = 0, max = 100000))]
    pub replicas: i32,
    /// The serving engine container.
    pub engine: Engine,
    /// How a replica spans devices and nodes.
    pub topology: Topology,
    /// Which devices a replica may use, as ordered alternatives.
    pub devices: DeviceRequest,
    /// Where replicas may go.
    #[serde(default)]
    pub placement: PlacementPolicy,
    /// How the gateway routes requests for this model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<RoutingPolicy>,
    /// How many of a cluster's replicas a voluntary disruption (a node drain, a node group
    /// upgrade) may take at once: one PodDisruptionBudget per pool in each member. Absent:
    /// `maxUnavailable: 1`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disruption_budget: Option<DisruptionBudget>,
    /// Replicas follow fleet-wide demand (the gateway writes `replicas` through the scale
    /// subresource); absent: `replicas` is only what you, an HPA or KEDA set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<crate::autoscaling::Autoscaling>,
    /// LoRA adapters served on top of the model: a client names one in `"model"` and the gateway
    /// sends it to a replica that has it loaded, or loads it there (docs/gateway.md, adapters).
    /// Each is staged like weights, by a ModelCache that gives a digest, and is served only
    /// where its own policy, the deployment's and its cache allow.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub adapters: Vec<Adapter>,
}

/// A LoRA adapter of the deployment's model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Adapter {
    /// The name clients put in `"model"`; unique in the fleet like a model name, and not the
    /// model's name or one of its aliases.
    #[schemars(length(min = 1, max = 128), regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$"))]
    pub name: String,
    /// A ModelCache in the same namespace that stages the adapter's files. It must give
    /// `spec.digest`: an adapter is loaded only from files verified against it.
    #[schemars(length(min = 1, max = 253))]
    pub cache_ref: String,
    /// Where the adapter may be served, within the deployment's own `spec.placement.sovereignty`:
    /// each list may only narrow the deployment's (an adapter trained on EU data: `EU`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sovereignty: Option<Sovereignty>,
    /// Only the deployment's clusters whose labels match serve it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_selector: Option<LabelSelector>,
}

/// Adapters one replica holds loaded at once when `engine.maxLoadedAdapters` is unset.
pub const DEFAULT_MAX_LOADED_ADAPTERS: i32 = 4;

impl Adapter {
    /// Where the adapter may be served: the deployment's `base` policy narrowed by the
    /// adapter's own (each allow list the adapter gives replaces the base's, which
    /// [`Adapter::wider_than`] checks it stays within; denied regions add up).
    pub fn sovereignty(&self, base: &Sovereignty) -> Sovereignty {
        let Some(own) = &self.sovereignty else { return base.clone() };
        let narrow = |own: &[String], base: &[String]| if own.is_empty() { base.to_vec() } else { own.to_vec() };
        let mut denied = base.denied_regions.clone();
        denied.extend(own.denied_regions.iter().filter(|r| !base.denied_regions.contains(r)).cloned());
        Sovereignty {
            allowed_jurisdictions: if own.allowed_jurisdictions.is_empty() {
                base.allowed_jurisdictions.clone()
            } else {
                own.allowed_jurisdictions.clone()
            },
            allowed_regions: narrow(&own.allowed_regions, &base.allowed_regions),
            denied_regions: denied,
        }
    }

    /// Why the adapter's policy (its sovereignty narrowing the deployment's `base`, then its
    /// cluster selector) leaves out a cluster in `jurisdiction` and `region` whose selectable
    /// labels are `labels` (`crate::selector::cluster_labels`); `None` when it allows it. A
    /// selector that cannot be evaluated, or a policy wider than the deployment's
    /// ([`Adapter::wider_than`]), leaves the cluster out.
    pub fn outside_policy(
        &self,
        base: &Sovereignty,
        jurisdiction: &str,
        region: &str,
        labels: &std::collections::BTreeMap<String, String>,
    ) -> Option<String> {
        // A policy wider than the deployment's is refused as a whole (fail closed), as the
        // gateway leaves such an adapter out: served nowhere until it only narrows.
        if let Some((field, why)) = self.wider_than(base) {
            return Some(format!("spec.adapters[].{field}: {why}"));
        }
        let s = self.sovereignty(base);
        if !s.allowed_jurisdictions.is_empty() && !s.allowed_jurisdictions.iter().any(|a| a.0 == jurisdiction) {
            let allowed: Vec<&str> = s.allowed_jurisdictions.iter().map(|a| a.0.as_str()).collect();
            return Some(format!(
                "jurisdiction {jurisdiction} is not among the adapter's allowed [{}]",
                allowed.join(", ")
            ));
        }
        if !s.allowed_regions.is_empty() && !s.allowed_regions.iter().any(|a| a == region) {
            return Some(format!(
                "region {region} is not among the adapter's allowed [{}]",
                s.allowed_regions.join(", ")
            ));
        }
        if s.denied_regions.iter().any(|d| d == region) {
            return Some(format!("region {region} is denied to the adapter"));
        }
        if let Some(sel) = &self.cluster_selector
            && let Err(why) = crate::selector::selector_matches(sel, labels)
        {
            return Some(format!("the cluster does not match the adapter's clusterSelector ({why})"));
        }
        None
    }

    /// What in the adapter's policy is wider than the deployment's `base`, as a field path and a
    /// message; `None` when it only narrows.
    pub fn wider_than(&self, base: &Sovereignty) -> Option<(&'static str, String)> {
        let own = self.sovereignty.as_ref()?;
        if !base.allowed_jurisdictions.is_empty()
            && let Some(j) = own.allowed_jurisdictions.iter().find(|j| !base.allowed_jurisdictions.contains(j))
        {
            return Some((
                "sovereignty.allowedJurisdictions",
                format!(
                    "`{}` is not among the deployment's spec.placement.sovereignty.allowedJurisdictions: an adapter may only narrow where the model is served",
                    j.0
                ),
            ));
        }
        if !base.allowed_regions.is_empty()
            && let Some(r) = own.allowed_regions.iter().find(|r| !base.allowed_regions.contains(r))
        {
            return Some((
                "sovereignty.allowedRegions",
                format!(
                    "`{r}` is not among the deployment's spec.placement.sovereignty.allowedRegions: an adapter may only narrow where the model is served"
                ),
            ));
        }
        None
    }
}

impl Engine {
    /// `max_loaded_adapters`, or its default.
    pub fn max_loaded_adapters_or_default(&self) -> i32 {
        self.max_loaded_adapters.unwrap_or(DEFAULT_MAX_LOADED_ADAPTERS)
    }
}

/// The model and where its weights come from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelSource {
    /// The name clients put in `"model"`.
    #[schemars(length(min = 1, max = 253), regex(pattern = r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$"))]
    pub name: String,
    /// Other names that route to this model.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub aliases: Vec<String>,
    /// Weights source: `hf://org/name@revision`, `s3://bucket/prefix` or `oci://registry/repo:tag`.
    #[schemars(regex(pattern = r"^(hf|s3|oci)://.+$"))]
    pub source: String,
    /// A ModelCache in the same namespace that stages the weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache_ref: Option<String>,
}

/// The engine container.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Engine {
    /// Container image (`vllm/vllm-openai:v0.11.0`).
    #[schemars(length(min = 1))]
    pub image: String,
    /// Arguments.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<String>,
    /// Environment variables.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<EnvVar>,
    /// Port the OpenAI-compatible API listens on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 65535))]
    pub port: Option<i32>,
    /// Adapters one replica holds loaded at once when `spec.adapters` is given (vLLM's
    /// `--max-loras`, which the rendered engine is started with); the gateway unloads the least
    /// recently used to load another. 4 when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 256))]
    pub max_loaded_adapters: Option<i32>,
}

/// An environment variable of the engine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EnvVar {
    /// Name.
    #[schemars(length(min = 1))]
    pub name: String,
    /// Value.
    #[serde(default)]
    pub value: String,
}

/// How replicas are built from devices and nodes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum TopologyType {
    /// One device per replica.
    Standalone,
    /// Several devices of one node per replica.
    TensorParallel,
    /// A replica spans several nodes (a LeaderWorkerSet).
    MultiNode,
    /// Prefill and decode run as separate roles.
    Disaggregated,
}

/// The shape of one replica.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[x_kube(validation = Rule::new("self.type != 'Standalone' || self.devicesPerReplica == 1").message("Standalone replicas use exactly 1 device; use TensorParallel for more"))]
#[x_kube(validation = Rule::new("self.type == 'MultiNode' || !has(self.nodesPerReplica) || self.nodesPerReplica == 1").message("nodesPerReplica above 1 needs type MultiNode"))]
#[x_kube(validation = Rule::new("(self.type == 'Disaggregated') == (has(self.roles) && size(self.roles) > 0)").message("roles are required for, and only for, type Disaggregated"))]
#[serde(rename_all = "camelCase")]
pub struct Topology {
    /// `Standalone`, `TensorParallel`, `MultiNode` or `Disaggregated`.
    #[serde(rename = "type")]
    pub type_: TopologyType,
    /// Devices per replica (per node for MultiNode; ignored for Disaggregated, whose roles say).
    #[schemars(range(min = 1, max = 64))]
    pub devices_per_replica: u32,
    /// Nodes per replica (MultiNode).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 64))]
    pub nodes_per_replica: Option<u32>,
    /// Prefill/decode roles (Disaggregated): one replica is one of each role's pods.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 4))]
    pub roles: Vec<TopologyRole>,
}

impl Topology {
    /// Devices one whole replica uses.
    pub fn devices_per_replica_total(&self) -> u32 {
        match self.type_ {
            TopologyType::Disaggregated => self.roles.iter().map(|r| r.devices_per_pod * r.pods).sum(),
            TopologyType::MultiNode => self.devices_per_replica * self.nodes_per_replica.unwrap_or(1),
            _ => self.devices_per_replica,
        }
    }
}

/// The role of a pod in a disaggregated replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum RoleName {
    /// Computes the prompt's KV cache.
    Prefill,
    /// Generates tokens.
    Decode,
}

/// One role of a disaggregated replica.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopologyRole {
    /// `prefill` or `decode`.
    pub name: RoleName,
    /// Pods of this role per replica.
    #[schemars(range(min = 1, max = 64))]
    pub pods: u32,
    /// Devices per pod of this role, all on one node.
    #[schemars(range(min = 1, max = 64))]
    pub devices_per_pod: u32,
}

/// Devices a replica may use: ordered alternatives, the first preferred.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeviceRequest {
    /// Alternatives in order of preference (at most 8, as DRA's `firstAvailable`).
    #[schemars(length(min = 1, max = 8))]
    pub alternatives: Vec<DeviceAlternative>,
}

/// One device alternative: a class, CEL selectors, or both.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[x_kube(validation = Rule::new("has(self.class) || (has(self.selectors) && size(self.selectors) > 0)").message("name a class, give selectors, or both"))]
#[x_kube(validation = Rule::new("!has(self.minReplicas) || !has(self.maxReplicas) || self.minReplicas <= self.maxReplicas").message("minReplicas must be at most maxReplicas"))]
#[serde(rename_all = "camelCase")]
pub struct DeviceAlternative {
    /// An InferenceClass the devices must be of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub class: Option<String>,
    /// CEL expressions over `device` (DRA dialect); all must be true.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub selectors: Vec<CelExpression>,
    /// Place at least this many replicas on this alternative, or report it unmet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100000))]
    pub min_replicas: Option<i32>,
    /// Place at most this many replicas on this alternative.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 100000))]
    pub max_replicas: Option<i32>,
}

/// A CEL expression, at most 10 KiB as in DRA.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(transparent)]
pub struct CelExpression(#[schemars(length(min = 1, max = 10240))] pub String);

/// What spread is measured over.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub enum SpreadDomain {
    /// Member clusters.
    Cluster,
    /// Availability zones.
    Zone,
    /// Regions.
    Region,
}

/// Spread of replicas over a domain.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Spread {
    /// The domain.
    pub by: SpreadDomain,
    /// Largest allowed difference in replicas between a domain and the emptiest domain that
    /// can still take a replica of this deployment (a pool it may use with room, through an
    /// alternative under its `maxReplicas`, within `maxCostPerHour`).
    #[schemars(range(min = 1, max = 1000))]
    pub max_skew: i32,
}

/// How replicas are divided among eligible clusters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum SplitStrategy {
    /// Fill the best-scoring cluster first.
    #[default]
    Packed,
    /// Divide in proportion to free capacity.
    Proportional,
}

/// Where replicas may go and what is preferred.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PlacementPolicy {
    /// Only clusters whose labels match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_selector: Option<LabelSelector>,
    /// Jurisdictions and regions allowed; applies to routing too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sovereignty: Option<Sovereignty>,
    /// Spread over clusters, zones or regions.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spread: Option<Spread>,
    /// `Packed` (default) or `Proportional`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub split: Option<SplitStrategy>,
    /// Allowed capacity types, in order of preference. Empty: reserved, on-demand.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 3))]
    pub capacity_types: Vec<CapacityType>,
    /// Most the whole deployment may cost per hour, in USD.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9]{1,9}(\.[0-9]{1,6})?$"))]
    pub max_cost_per_hour: Option<String>,
    /// Cluster taints this deployment tolerates.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32))]
    pub tolerations: Vec<ClusterToleration>,
    /// Higher goes first when capacity is short.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = -1000, max = 1000))]
    pub priority: Option<i32>,
    /// Capacity to ask for when the fleet has no room.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_claim_template: Option<CapacityClaimTemplate>,
}

impl PlacementPolicy {
    /// Capacity types allowed, in order, with the default applied.
    pub fn capacity_types_or_default(&self) -> Vec<CapacityType> {
        if self.capacity_types.is_empty() {
            vec![CapacityType::Reserved, CapacityType::OnDemand]
        } else {
            self.capacity_types.clone()
        }
    }
}

/// What a generated CapacityClaim asks for.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct CapacityClaimTemplate {
    /// Capacity types to ask for, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capacity_types: Vec<CapacityType>,
    /// Give up (condition `Expired`) if not fulfilled within this (`15m`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$"))]
    pub max_provisioning_latency: Option<String>,
    /// What may take the claim's capacity away, and when (copied to the claim).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disruption: Option<crate::claim::DisruptionPolicy>,
}

/// The PodDisruptionBudget Flotilla renders for each pool of a deployment in each member.
/// Counts and percentages are of that pool's replicas in that member (a replica may be
/// several pods: a LeaderWorkerSet group or a disaggregated prefill/decode set). At most one
/// of the two fields; neither means `maxUnavailable: 1`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, KubeSchema)]
#[x_kube(validation = Rule::new("!has(self.maxUnavailable) || !has(self.minAvailable)").message("give maxUnavailable or minAvailable, not both"))]
#[serde(rename_all = "camelCase")]
pub struct DisruptionBudget {
    /// Replicas a drain may take down at once (`1`, `"25%"`). `0` blocks every voluntary
    /// eviction of the pool's pods (node drains then wait for you).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_unavailable: Option<ReplicaCount>,
    /// Replicas that must stay up during a drain (`2`, `"50%"`). Equal to the replicas on a
    /// cluster (`1` with one replica there, or `"100%"`) blocks every drain of their nodes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_available: Option<ReplicaCount>,
}

/// Which side of a disruption budget is given, and its value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Budget {
    /// At most this many (or this share of) replicas down.
    MaxUnavailable(ReplicaCount),
    /// At least this many (or this share of) replicas up.
    MinAvailable(ReplicaCount),
}

impl DisruptionBudget {
    /// The budget with the default applied (`maxUnavailable: 1`).
    pub fn budget(this: Option<&Self>) -> Budget {
        match this {
            Some(Self { min_available: Some(m), max_unavailable: None }) => Budget::MinAvailable(m.clone()),
            Some(Self { max_unavailable: Some(m), .. }) => Budget::MaxUnavailable(m.clone()),
            _ => Budget::MaxUnavailable(ReplicaCount::Count(1)),
        }
    }
}

/// A number of replicas (`2`) or a whole percentage of them (`"25%"`), as a
/// PodDisruptionBudget's int-or-string fields take it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ReplicaCount {
    /// This many replicas.
    Count(i32),
    /// This percentage (`"0%"` to `"100%"`).
    Percent(String),
}

/// A percentage from 0% to 100%, whole numbers only.
pub const PERCENT_PATTERN: &str = r"^(100|[1-9]?[0-9])%$";

impl ReplicaCount {
    /// The percentage, if this is one and well-formed (0..=100).
    pub fn percent(&self) -> Option<u32> {
        match self {
            Self::Percent(p) => p.strip_suffix('%').and_then(|n| n.parse::<u32>().ok()).filter(|n| *n <= 100),
            Self::Count(_) => None,
        }
    }
}

impl JsonSchema for ReplicaCount {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ReplicaCount".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        // An int-or-string whose string form is a percentage (the `pattern` applies to strings
        // only, the `minimum` to integers only), as PodDisruptionBudget's own fields are.
        schemars::json_schema!({
            "x-kubernetes-int-or-string": true,
            "pattern": PERCENT_PATTERN,
            "minimum": 0,
        })
    }
}

/// Routing hints for the gateway.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RoutingPolicy {
    /// Models to serve instead when this one has no healthy allowed cluster.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fallback_models: Vec<String>,
    /// This deployment's share of the traffic for its `spec.model.name`, relative to the other
    /// ModelDeployments serving the same name (a canary or a version roll): each gets
    /// weight / sum of weights of the requests, sticky per prompt prefix. `0` takes no traffic.
    /// The oldest deployment of a name decides: without a weight it serves the name alone; with
    /// one, the deployments of the name that give a weight share it and those without are left
    /// out (docs/gateway.md, weighted traffic).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 1000))]
    pub weight: Option<i32>,
}

/// Observed state of a ModelDeployment.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModelDeploymentStatus {
    /// The generation last acted on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Placed`, `CapacityAvailable`, `Ready`, `Serving`, `Degraded`, `WaitingForCache`.
    #[serde(default)]
    pub conditions: Conditions,
    /// Desired replicas placed (the scale subresource's status).
    #[serde(default)]
    pub replicas: i32,
    /// Replicas observed ready in member clusters.
    #[serde(default)]
    pub ready_replicas: i32,
    /// Human summary such as `eu-fra-1:4/4,eu-par-1:2/2`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clusters: Option<String>,
    /// Where replicas are meant to run.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub placements: Vec<ClusterPlacement>,
    /// Replicas with no place, and why each cluster refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unplaced: Option<Unplaced>,
    /// What the autoscaler decided last and why (written by the elected gateway replica).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub autoscaling: Option<crate::autoscaling::AutoscalingStatus>,
    /// Pools whose member scheduler refused this deployment's pods past the grace, backed off:
    /// until `retryAfter` no new replica of this deployment goes there (replicas running there
    /// stay), so a replica moved away does not come straight back to a pool that refused it.
    /// Written by the controller, dropped when the back-off ends (`--unschedulable-backoff-seconds`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    pub refused_pools: Vec<RefusedPool>,
    /// Set when this deployment's workload names would equal an older deployment's of the same
    /// namespace (`qwen` on pool `h100-spot` and `qwen-h100` on pool `spot` both render
    /// `qwen-h100-spot`): every name of its Deployments, claim templates and budgets then ends in
    /// `-<workloadSuffix>`, a hash of its namespace and name. Written by the controller before the
    /// first object carries it, and kept for the deployment's life, so its workloads are not
    /// renamed when the other deployment goes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 8))]
    pub workload_suffix: Option<String>,
    /// Per adapter of `spec.adapters`: the clusters it is served from, and the deployment's
    /// clusters it waits for and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 256))]
    pub adapters: Vec<AdapterStatus>,
}

/// Where one adapter is served.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdapterStatus {
    /// The adapter (`spec.adapters[].name`).
    pub name: String,
    /// Clusters of the deployment where the adapter is allowed and its files are staged and
    /// verified: replicas there may load it, and the gateway routes its requests only there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<String>,
    /// Clusters of the deployment where it is not served, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting: Vec<AdapterWaiting>,
}

/// Why an adapter is not served in one of the deployment's clusters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
pub enum AdapterWaitReason {
    /// The adapter's `sovereignty` or `clusterSelector` leaves the cluster out: never served there.
    OutsidePolicy,
    /// No ModelCache of the adapter's `cacheRef` in the namespace.
    CacheNotFound,
    /// The ModelCache gives no `spec.digest`: its files cannot be verified, so they are never loaded.
    CacheUnverified,
    /// The ModelCache is not Ready in the cluster (staging, failed, or not a target there).
    CacheNotReady,
}

/// One cluster an adapter is not served in.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AdapterWaiting {
    /// The InferenceCluster.
    pub cluster: String,
    /// Why.
    pub reason: AdapterWaitReason,
    /// What to change.
    pub message: String,
}

/// A pool backed off after its member's scheduler refused a deployment's pods.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RefusedPool {
    /// The InferenceCluster.
    pub cluster: String,
    /// The pool.
    pub pool: String,
    /// When the pool may take new replicas of this deployment again.
    pub retry_after: Time,
    /// The scheduler said devices were short (`Insufficient nvidia.com/gpu` or another device
    /// resource, claims that cannot be allocated): no node of the pool had room for one of this
    /// deployment's pods. Until `retryAfter`, no new replica of any deployment whose pods need as
    /// many devices on one node goes to the pool either; replicas running there stay. False for
    /// refusals of other kinds (a taint, a node selector, CPU or memory the pods ask for), which
    /// concern this deployment only.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub devices_short: bool,
    /// The scheduler's message.
    #[serde(default)]
    pub message: String,
}

/// Replicas on one cluster.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterPlacement {
    /// The InferenceCluster.
    pub cluster: String,
    /// The pool.
    pub pool: String,
    /// The InferenceClass.
    pub class: String,
    /// How the nodes are paid for.
    pub capacity_type: CapacityType,
    /// 1 for the first device alternative, 2 for the second, ...
    pub fallback_rank: i32,
    /// Replicas meant to run here.
    pub desired: i32,
    /// Replicas observed ready here on the current spec (a rollout's old replicas are not).
    #[serde(default)]
    pub ready: i32,
    /// Replicas observed ready here on any spec: during a rollout the old ones still serve, so
    /// the gateway routes to them and a ModelCache they mount stays.
    #[serde(default)]
    pub serving: i32,
    /// Replicas here whose pods the member's scheduler has refused (`PodScheduled=False`,
    /// `Unschedulable`) for longer than the controller's `--unschedulable-seconds`: the solver
    /// places them elsewhere and sends no more replicas to this pool while any are refused
    /// (reason `ReplicasUnschedulable`). Counts a replica once however many of its pods wait.
    #[serde(default, skip_serializing_if = "crate::common::is_zero_i32")]
    pub unschedulable: i32,
}

/// Replicas that could not be placed.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Unplaced {
    /// How many.
    pub replicas: i32,
    /// The first reason each cluster gave.
    #[serde(default)]
    pub reasons: Vec<ClusterRejection>,
}

/// Why one cluster could not take a replica.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterRejection {
    /// The InferenceCluster.
    pub cluster: String,
    /// A machine-readable reason (`JurisdictionNotAllowed`, `InsufficientDevices`, ...).
    pub reason: String,
    /// The numbers behind it.
    pub message: String,
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::common::JurisdictionCode;

    fn policy(jurisdictions: &[&str]) -> Sovereignty {
        Sovereignty {
            allowed_jurisdictions: jurisdictions.iter().map(|j| JurisdictionCode((*j).into())).collect(),
            ..Sovereignty::default()
        }
    }

    fn adapter(jurisdictions: Option<&[&str]>) -> Adapter {
        Adapter {
            name: "support".into(),
            cache_ref: "support".into(),
            sovereignty: jurisdictions.map(policy),
            cluster_selector: None,
        }
    }

    #[test]
    fn an_adapter_policy_only_narrows_and_a_wider_one_is_served_nowhere() {
        let (base, labels) = (policy(&["EU", "US"]), BTreeMap::new());
        let outside = |a: &Adapter, j: &str| a.outside_policy(&base, j, "r-1", &labels);
        // Without a policy of its own: the deployment's.
        assert_eq!((outside(&adapter(None), "EU"), outside(&adapter(None), "US")), (None, None));
        assert!(outside(&adapter(None), "APAC").is_some());
        // Narrowed to the EU: never the US.
        let eu = adapter(Some(&["EU"]));
        assert_eq!(outside(&eu, "EU"), None);
        assert!(outside(&eu, "US").unwrap().contains("jurisdiction US"));
        // Wider than the deployment (APAC): refused everywhere, even in the jurisdictions both allow.
        let wide = adapter(Some(&["EU", "APAC"]));
        assert!(wide.wider_than(&base).is_some());
        for j in ["EU", "US", "APAC"] {
            assert!(outside(&wide, j).unwrap().contains("allowedJurisdictions"), "{j}");
        }
    }
}
