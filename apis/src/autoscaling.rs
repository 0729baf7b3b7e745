//! `spec.autoscaling` and `status.autoscaling` of a ModelDeployment: the replica range, the
//! per-replica targets on the engines' own signals (queued and running requests, KV-cache
//! use), the HPA's `behavior` vocabulary (stabilisation windows, step policies), and the idle
//! window after which a `minReplicas: 0` deployment scales to zero. The elected gateway replica
//! reads demand fleet-wide, decides, and writes the count through the scale subresource; what
//! it decided and why comes back in `status.autoscaling`. Defaults are the HPA's.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Replicas follow fleet-wide demand between `minReplicas` and `maxReplicas`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, KubeSchema)]
#[x_kube(validation = Rule::new("self.minReplicas <= self.maxReplicas").message("minReplicas must be at most maxReplicas"))]
#[serde(rename_all = "camelCase")]
pub struct Autoscaling {
    /// Fewest replicas; `0` lets an idle deployment scale to zero (its first request is then
    /// held by the gateway while a replica starts).
    #[schemars(range(min = 0, max = 100000))]
    pub min_replicas: i32,
    /// Most replicas (at least 1).
    #[schemars(range(min = 1, max = 100000))]
    pub max_replicas: i32,
    /// What one replica should carry; the count is the largest any target asks for.
    pub target: AutoscalingTarget,
    /// With `minReplicas: 0`: seconds without a queued or running request anywhere in the
    /// fleet before the deployment scales to zero. Default 300.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 86400))]
    pub idle_window_seconds: Option<i32>,
    /// How fast the count may move each way (the HPA's `behavior`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub behavior: Option<ScalingBehavior>,
}

/// Per-replica targets on the signals vLLM engines export; give at least one.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, KubeSchema)]
#[x_kube(validation = Rule::new("has(self.queuedPerReplica) || has(self.runningPerReplica) || has(self.kvCachePercent)").message("give at least one target: queuedPerReplica, runningPerReplica or kvCachePercent"))]
#[serde(rename_all = "camelCase")]
pub struct AutoscalingTarget {
    /// Requests waiting per replica (`vllm:num_requests_waiting`, summed over the fleet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub queued_per_replica: Option<i32>,
    /// Requests being served per replica (`vllm:num_requests_running`, summed over the fleet).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100000))]
    pub running_per_replica: Option<i32>,
    /// Mean KV-cache use of the engines, in percent (`vllm:kv_cache_usage_perc`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 100))]
    pub kv_cache_percent: Option<i32>,
}

/// Scale-up and scale-down rules, as `HorizontalPodAutoscaler.spec.behavior`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScalingBehavior {
    /// Default: no window; at most +100 % or +4 replicas per 15 s, whichever is more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_up: Option<ScalingRules>,
    /// Default: a 300 s window; at most −100 % per 15 s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_down: Option<ScalingRules>,
}

/// One direction's rules.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScalingRules {
    /// Seconds of past recommendations considered: scaling up takes the lowest of them,
    /// scaling down the highest, so a brief spike or dip does not move the count.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 3600))]
    pub stabilization_window_seconds: Option<i32>,
    /// Which policy wins: `Max` (default, the largest change), `Min`, or `Disabled`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub select_policy: Option<SelectPolicy>,
    /// Step limits; absent: the direction's default.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 10))]
    pub policies: Vec<ScalingPolicy>,
}

/// Which of several policies limits a step.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum SelectPolicy {
    /// The policy allowing the largest change.
    #[default]
    Max,
    /// The policy allowing the smallest change.
    Min,
    /// No change in this direction.
    Disabled,
}

/// What a policy's value counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ScalingPolicyType {
    /// A number of replicas.
    Replicas,
    /// A percentage of the replicas at the start of the period.
    Percent,
}

/// At most `value` replicas (or percent) of change per `periodSeconds`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ScalingPolicy {
    /// `Replicas` or `Percent`.
    #[serde(rename = "type")]
    pub type_: ScalingPolicyType,
    /// How many replicas, or what percentage.
    #[schemars(range(min = 1, max = 100000))]
    pub value: i32,
    /// The period the change is counted over, 1 to 1800 seconds.
    #[schemars(range(min = 1, max = 1800))]
    pub period_seconds: i32,
}

/// Why the autoscaler chose the count it did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum AutoscalingReason {
    /// Demand is within 10 % of the targets: the count stays.
    Steady,
    /// Demand asked for more replicas and got them.
    ScaledUp,
    /// Demand asked for fewer replicas and got them.
    ScaledDown,
    /// No request for the idle window: the deployment is at zero replicas.
    ScaledToZero,
    /// A request arrived at zero replicas: the gateway asked for one and holds requests meanwhile.
    Activated,
    /// A stabilisation window holds the count where recent recommendations were.
    Stabilizing,
    /// A step policy limits how far the count moves now; it moves further later.
    ScalingLimited,
    /// Demand asks for more than `maxReplicas`.
    AtMaximum,
    /// Demand asks for fewer than `minReplicas`.
    AtMinimum,
    /// No engine of the deployment reported metrics: the count stays.
    NoMetrics,
}

impl AutoscalingReason {
    /// The name as written in status and events.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Steady => "Steady",
            Self::ScaledUp => "ScaledUp",
            Self::ScaledDown => "ScaledDown",
            Self::ScaledToZero => "ScaledToZero",
            Self::Activated => "Activated",
            Self::Stabilizing => "Stabilizing",
            Self::ScalingLimited => "ScalingLimited",
            Self::AtMaximum => "AtMaximum",
            Self::AtMinimum => "AtMinimum",
            Self::NoMetrics => "NoMetrics",
        }
    }
}

/// Fleet-wide demand as the gateway last read it from the engines.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Demand {
    /// Requests waiting, summed over the clusters serving the model.
    pub queued: i64,
    /// Requests being served, summed likewise.
    pub running: i64,
    /// Mean KV-cache use of the reporting engines, in percent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_percent: Option<i32>,
    /// Clusters whose engines reported.
    pub clusters: i32,
}

/// What the autoscaler (the elected gateway replica) decided last, and why.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AutoscalingStatus {
    /// Demand at the last decision (rewritten at most once per gateway feedback interval
    /// while only the numbers move).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub demand: Option<Demand>,
    /// The replica count the autoscaler wants now.
    pub recommendation: i32,
    /// Why.
    pub reason: Option<AutoscalingReason>,
    /// The numbers behind the reason.
    #[serde(default)]
    pub message: String,
    /// When the autoscaler last changed `spec.replicas`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_scale_time: Option<Time>,
    /// How long the last start from zero took: from the activation to the first Ready
    /// replica in the gateway's routing table, in milliseconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_cold_start_millis: Option<i64>,
}
