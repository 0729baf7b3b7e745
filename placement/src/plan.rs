//! What the solver returns: per deployment, the replicas on each (cluster, pool) with class,
//! capacity type, fallback rank and cost; the replicas it could not place; and, for every
//! cluster that took nothing, the first filter that refused it with the numbers behind it.

use flotilla_apis::CapacityType;
use serde::Serialize;

/// Why a cluster (or one of its pools) cannot take a replica. Closed set; documented in
/// `docs/placement.md` so users can alert on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub enum Reason {
    /// The deployment's cluster selector does not match the cluster's labels.
    ClusterSelectorMismatch,
    /// The cluster's jurisdiction is not in `allowedJurisdictions`.
    JurisdictionNotAllowed,
    /// The cluster's region is not in `allowedRegions`.
    RegionNotAllowed,
    /// The cluster's region is in `deniedRegions`.
    RegionDenied,
    /// The cluster is not Ready.
    ClusterNotReady,
    /// The cluster is cordoned: no new replicas.
    ClusterCordoned,
    /// A `NoSchedule`/`NoExecute` taint is not tolerated.
    TaintNotTolerated,
    /// No pool's devices match any device alternative.
    NoMatchingDevices,
    /// A selector failed to evaluate on the pool's devices.
    SelectorError,
    /// A replica's pod needs more devices on one node than a node has.
    DoesNotFitNode,
    /// The pool's capacity type is not allowed by the deployment.
    CapacityTypeNotAllowed,
    /// The pool's class has no price for its capacity type while a cost ceiling is set.
    NoPrice,
    /// Not enough free devices (on few enough nodes).
    InsufficientDevices,
    /// Placing here would exceed `maxCostPerHour`.
    CostCeilingExceeded,
    /// Placing here would exceed the spread's `maxSkew`.
    SpreadConstraint,
    /// The alternative's `maxReplicas` is reached.
    AlternativeMaxReached,
    /// The solver's evaluation budget ran out before this deployment was solved.
    BudgetExhausted,
    /// The member's scheduler refused this deployment's pods in the pool (status
    /// `placements[].unschedulable`): those replicas go elsewhere, no more come here.
    ReplicasUnschedulable,
    /// A replica placed here was preempted by a higher-priority deployment that needed the
    /// room (the improvement phase; never a replica that runs).
    Preempted,
    /// The solver failed (panicked) on this deployment: it is left out of planning until its
    /// spec changes, and the rest of the fleet is planned without it (`isolate`).
    SolverFailed,
    /// One more replica here would take the namespace past a limit of its FleetQuota.
    QuotaExceeded,
}

impl Reason {
    /// The reason as written in status and output.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ClusterSelectorMismatch => "ClusterSelectorMismatch",
            Self::JurisdictionNotAllowed => "JurisdictionNotAllowed",
            Self::RegionNotAllowed => "RegionNotAllowed",
            Self::RegionDenied => "RegionDenied",
            Self::ClusterNotReady => "ClusterNotReady",
            Self::ClusterCordoned => "ClusterCordoned",
            Self::TaintNotTolerated => "TaintNotTolerated",
            Self::NoMatchingDevices => "NoMatchingDevices",
            Self::SelectorError => "SelectorError",
            Self::DoesNotFitNode => "DoesNotFitNode",
            Self::CapacityTypeNotAllowed => "CapacityTypeNotAllowed",
            Self::NoPrice => "NoPrice",
            Self::InsufficientDevices => "InsufficientDevices",
            Self::CostCeilingExceeded => "CostCeilingExceeded",
            Self::SpreadConstraint => "SpreadConstraint",
            Self::AlternativeMaxReached => "AlternativeMaxReached",
            Self::BudgetExhausted => "BudgetExhausted",
            Self::ReplicasUnschedulable => "ReplicasUnschedulable",
            Self::Preempted => "Preempted",
            Self::SolverFailed => "SolverFailed",
            Self::QuotaExceeded => "QuotaExceeded",
        }
    }
}

impl Reason {
    /// Whether the reason is a cluster-level rule (selector, sovereignty, readiness, cordon,
    /// taints) rather than a lack of devices, capacity or budget.
    pub fn is_static(self) -> bool {
        matches!(
            self,
            Self::ClusterSelectorMismatch
                | Self::JurisdictionNotAllowed
                | Self::RegionNotAllowed
                | Self::RegionDenied
                | Self::ClusterNotReady
                | Self::ClusterCordoned
                | Self::TaintNotTolerated
        )
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The whole plan, deployments in solve order.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    /// One entry per deployment.
    pub deployments: Vec<DeploymentPlan>,
    /// What the exact mode did, when it was asked for (`SolveOptions::exact`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exact: Option<crate::solve::exact::ExactReport>,
    /// Usage of every FleetQuota in the plan, in (namespace, name) order.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub quotas: Vec<crate::solve::quota::QuotaUsage>,
    /// Priority tiers solved in another order than the usual one because that placed strictly
    /// more of the tier (same-tier trades, highest priority first). Not serialised: each
    /// deployment a trade concerns carries it (`DeploymentPlan::trade`).
    #[serde(skip)]
    pub trades: Vec<Trade>,
}

/// A priority tier whose deployments were solved in another order than creation order, because
/// that placed strictly more replicas of the tier without costing a higher tier anything, a
/// replica that runs, or a met `minReplicas` of the tier (`placement/src/trade.rs`).
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Trade {
    /// The tier's priority.
    pub priority: i32,
    /// The order its deployments were solved in (`namespace/name`), running replicas of every
    /// one of them kept first as always.
    pub order: Vec<String>,
    /// Replicas of the tier placed in the usual order (after the trades of higher tiers).
    pub placed_before: u32,
    /// Replicas of the tier placed in this order (strictly more).
    pub placed_after: u32,
    /// Deployments of this tier or below that ended with fewer replicas than in the usual order,
    /// and how many fewer: the trade's price.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gave_up: Vec<GaveUp>,
}

/// Replicas one deployment has fewer of because of a [`Trade`].
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct GaveUp {
    /// The deployment (`namespace/name`).
    pub deployment: String,
    /// Replicas fewer than in the usual order.
    pub replicas: u32,
}

impl Plan {
    /// Whether every replica of every deployment was placed.
    pub fn fully_placed(&self) -> bool {
        self.deployments.iter().all(|d| d.unplaced == 0 && d.unmet_minimums.is_empty())
    }

    /// The plan of one deployment: found by binary search in a plan [`Plan::sort_by_name`]
    /// sorted (the controller's), by a scan otherwise.
    pub fn get(&self, namespace: &str, name: &str) -> Option<&DeploymentPlan> {
        let key = (namespace, name);
        match self.deployments.binary_search_by(|d| (d.namespace.as_str(), d.name.as_str()).cmp(&key)) {
            Ok(i) => Some(&self.deployments[i]),
            Err(_) => self.deployments.iter().find(|d| d.namespace == namespace && d.name == name),
        }
    }

    /// Orders the entries by namespace and name, so that [`Plan::get`] does not scan.
    pub fn sort_by_name(&mut self) {
        self.deployments.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    }
}

/// Where one deployment's replicas go.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct DeploymentPlan {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The served model name.
    pub model: String,
    /// Desired replicas.
    pub desired: u32,
    /// Replicas placed, per (cluster, pool), in cluster order.
    pub assignments: Vec<Assignment>,
    /// Replicas with no place.
    pub unplaced: u32,
    /// Alternatives whose `minReplicas` could not be met: (rank, wanted, placed).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub unmet_minimums: Vec<UnmetMinimum>,
    /// Total cost of the placed replicas, millionths of a dollar per hour.
    pub cost_micros_per_hour: u64,
    /// While replicas stay unplaced: every cluster that refused one, with its first reason
    /// (including clusters that took some). In explain mode: every cluster that took none.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rejections: Vec<Rejection>,
    /// Filter verdicts and scores per cluster, only when explain was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub explanation: Option<Vec<ClusterExplanation>>,
    /// Set when the spec itself is invalid (a selector that does not compile, nests too
    /// deep or costs too much): nothing was placed and a controller reports `InvalidSpec`
    /// and keeps what runs. The rest of the fleet is solved as if it were absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub invalid: Option<InvalidSpec>,
    /// Replicas the improvement phase moved to make room for another deployment, and those
    /// this deployment got thanks to such a move (what `fleetctl explain` says about them).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub moves: Vec<Move>,
    /// Replicas of this deployment the improvement phase preempted (unplaced) for a
    /// higher-priority one, and those this deployment preempted.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub preemptions: Vec<Preemption>,
    /// Its tier was solved in another order than creation order because that placed more of
    /// the tier (a same-tier trade, [`Trade`]), or a trade of a higher tier cost it replicas.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub trade: Option<TierTrade>,
}

/// What a same-tier trade ([`Trade`]) means for one deployment.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TierTrade {
    /// The priority of the tier traded: this deployment's, or a higher one whose trade cost it
    /// replicas.
    pub priority: i32,
    /// This deployment's place (from 0) in the order its tier was solved in; absent for a
    /// deployment of a lower tier.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub position: Option<u32>,
    /// Replicas of the traded tier placed in creation order (after the trades of higher tiers).
    pub tier_placed_before: u32,
    /// Replicas of the traded tier placed in the traded order (strictly more).
    pub tier_placed_after: u32,
    /// Replicas this deployment has fewer than in creation order (left out when none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub gave_up: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// Replicas of a lower-priority deployment that did not run yet, unplaced by the improvement
/// phase so that a strictly higher-priority deployment could place more: `replicas` of
/// `preempted` lost their place on `from` to `by`. The preempted deployment was then solved
/// again on what was left (it may have got them back elsewhere: see its `moves`).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Preemption {
    /// The deployment that lost replicas (`namespace/name`).
    pub preempted: String,
    /// Where they were in the plan before: `cluster/pool`.
    pub from: String,
    /// The higher-priority deployment (`namespace/name`) that placed more because of it.
    pub by: String,
    /// Replicas lost.
    pub replicas: u32,
}

/// Replicas moved by the improvement phase after the greedy pass: `replicas` of `moved` went
/// from `from` to `to`, and `madeRoomFor` got replicas on `from` in their place (or, for a
/// lower-priority deployment solved again after a preemption, the room it left).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Move {
    /// The deployment whose replica moved (`namespace/name`).
    pub moved: String,
    /// Where it was before this step (the greedy plan, or an earlier step): `cluster/pool`.
    pub from: String,
    /// Where this step put it: `cluster/pool`.
    pub to: String,
    /// The deployment (`namespace/name`) that got replicas on `from` because of the move.
    pub made_room_for: String,
    /// Replicas of `moved` that went this way.
    pub replicas: u32,
    /// The move filled `to` so that its spread domain can take no further replica of
    /// `madeRoomFor`, which could then grow in another domain (`madeRoomFor` got nothing on
    /// `from`). Left out of the JSON when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub closes_spread_domain: bool,
    /// `moved` has a higher priority than `madeRoomFor`: its replica, not running yet, went to
    /// a pool it ranks as high on every key but price (same device alternative and capacity
    /// type), keeping its count, its ceiling and its spread. Left out of the JSON when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub higher_priority: bool,
    /// The move only lowered `moved`'s cost (`madeRoomFor` is `moved` itself): once the other
    /// moves were made, a pool it ranks before the one it was on, cheaper, had room. Left out
    /// of the JSON when false.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub lowers_cost: bool,
}

/// What makes a deployment's spec invalid: the field and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InvalidSpec {
    /// The field path, e.g. `spec.devices.alternatives[0].selectors[1]`.
    pub field: String,
    /// What is wrong with it and what to change.
    pub message: String,
}

/// A minimum that was not met.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UnmetMinimum {
    /// 1-based rank of the alternative.
    pub rank: u32,
    /// Its `minReplicas`.
    pub wanted: u32,
    /// How many it got.
    pub placed: u32,
}

/// Replicas on one pool of one cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Assignment {
    /// The InferenceCluster.
    pub cluster: String,
    /// The pool.
    pub pool: String,
    /// The InferenceClass.
    pub class: String,
    /// How the nodes are paid for.
    pub capacity_type: CapacityType,
    /// 1-based rank of the device alternative used.
    pub fallback_rank: u32,
    /// Replicas.
    pub replicas: u32,
    /// Cost of these replicas, millionths of a dollar per hour.
    pub cost_micros_per_hour: u64,
}

impl Assignment {
    /// The assignment as a status placement, with `ready` replicas observed.
    pub fn to_placement(&self, ready: i32) -> flotilla_apis::deployment::ClusterPlacement {
        flotilla_apis::deployment::ClusterPlacement {
            cluster: self.cluster.clone(),
            pool: self.pool.clone(),
            class: self.class.clone(),
            capacity_type: self.capacity_type,
            fallback_rank: self.fallback_rank as i32,
            desired: self.replicas as i32,
            ready,
            serving: ready,
            unschedulable: 0,
        }
    }
}

/// Why a cluster took no replica.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Rejection {
    /// The InferenceCluster.
    pub cluster: String,
    /// The reason code.
    pub reason: Reason,
    /// The numbers behind it.
    pub message: String,
}

/// One filter's verdict, for `fleetctl explain`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Verdict {
    /// Filter name (`selector`, `sovereignty`, `readiness`, `taints`, `devices`, ...).
    pub filter: &'static str,
    /// Passed?
    pub pass: bool,
    /// The reason when it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reason: Option<Reason>,
    /// Detail.
    pub detail: String,
}

/// A (pool, alternative) candidate and how it scored, for `fleetctl explain`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CandidateScore {
    /// Pool.
    pub pool: String,
    /// Class.
    pub class: String,
    /// Alternative rank (1-based).
    pub fallback_rank: u32,
    /// Capacity type.
    pub capacity_type: CapacityType,
    /// Index of the capacity type in the deployment's preference (0 best).
    pub capacity_type_rank: u32,
    /// Price of one replica, micro-USD per hour.
    pub replica_price_micros: u64,
    /// Whether the deployment already runs here (stickiness).
    pub sticky: bool,
    /// Whether the deployment's ModelCache is Ready here (ranked before a cheaper cold cluster).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub cache_ready: bool,
    /// Replicas that fit in free capacity before this deployment was solved.
    pub free_replica_slots: u32,
}

/// Everything the solver considered for one cluster.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterExplanation {
    /// The cluster.
    pub cluster: String,
    /// Each filter, in the order applied.
    pub verdicts: Vec<Verdict>,
    /// Candidates that passed every filter.
    pub candidates: Vec<CandidateScore>,
    /// Replicas placed here.
    pub placed: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(ns: &str, name: &str) -> DeploymentPlan {
        DeploymentPlan { namespace: ns.into(), name: name.into(), ..Default::default() }
    }

    #[test]
    fn an_entry_is_found_sorted_or_not_and_a_missing_one_is_not() {
        let mut plan = Plan {
            deployments: vec![entry("ml", "z"), entry("a", "b"), entry("ml", "a"), entry("b", "a")],
            ..Plan::default()
        };
        for sorted in [false, true] {
            for (ns, name) in [("ml", "z"), ("a", "b"), ("ml", "a"), ("b", "a")] {
                let got = plan.get(ns, name).map(|d| (d.namespace.as_str(), d.name.as_str()));
                assert_eq!(got, Some((ns, name)), "sorted: {sorted}");
            }
            assert!(plan.get("ml", "b").is_none());
            assert!(plan.get("b", "z").is_none());
            plan.sort_by_name();
        }
        let names: Vec<_> = plan.deployments.iter().map(|d| format!("{}/{}", d.namespace, d.name)).collect();
        assert_eq!(names, ["a/b", "b/a", "ml/a", "ml/z"]);
    }
}
