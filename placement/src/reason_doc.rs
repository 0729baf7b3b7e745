//! What each solver [`Reason`] means and what to do about it, for `docs/api.md` (the values
//! of `ModelDeployment` `status.unplaced.reasons[].reason`) and for anyone printing a
//! rejection. [`Reason::ALL`] lists every variant once, in declaration order.

use crate::plan::Reason;

impl Reason {
    /// Every reason, in declaration order.
    pub const ALL: [Reason; 21] = [
        Self::ClusterSelectorMismatch,
        Self::JurisdictionNotAllowed,
        Self::RegionNotAllowed,
        Self::RegionDenied,
        Self::ClusterNotReady,
        Self::ClusterCordoned,
        Self::TaintNotTolerated,
        Self::NoMatchingDevices,
        Self::SelectorError,
        Self::DoesNotFitNode,
        Self::CapacityTypeNotAllowed,
        Self::NoPrice,
        Self::InsufficientDevices,
        Self::CostCeilingExceeded,
        Self::SpreadConstraint,
        Self::AlternativeMaxReached,
        Self::BudgetExhausted,
        Self::ReplicasUnschedulable,
        Self::Preempted,
        Self::SolverFailed,
        Self::QuotaExceeded,
    ];

    /// What the reason means, in one sentence.
    pub fn meaning(self) -> &'static str {
        match self {
            Self::ClusterSelectorMismatch => "The cluster's labels do not match `spec.placement.clusterSelector`.",
            Self::JurisdictionNotAllowed => {
                "The cluster's `spec.jurisdiction` is not in `spec.placement.sovereignty.allowedJurisdictions`."
            }
            Self::RegionNotAllowed => {
                "The cluster's `spec.region` is not in `spec.placement.sovereignty.allowedRegions`."
            }
            Self::RegionDenied => "The cluster's `spec.region` is in `spec.placement.sovereignty.deniedRegions`.",
            Self::ClusterNotReady => "The InferenceCluster is not Ready; the message carries its reason.",
            Self::ClusterCordoned => {
                "The InferenceCluster has `spec.cordoned: true`: replicas already there stay, no new ones come."
            }
            Self::TaintNotTolerated => {
                "A `NoSchedule` or `NoExecute` cluster taint is not tolerated by `spec.placement.tolerations`."
            }
            Self::NoMatchingDevices => {
                "No pool's class satisfies any device alternative (the class name differs, a CEL selector is false, or an attribute it reads is missing), or the cluster has no pools, or a pool's class does not exist."
            }
            Self::SelectorError => "A CEL selector failed to evaluate on the pool's device, or returned a non-bool.",
            Self::DoesNotFitNode => "A pod of a replica needs more devices on one node than the class has per node.",
            Self::CapacityTypeNotAllowed => {
                "The pool's capacity type (its first `capacityTypes` entry) is not in `spec.placement.capacityTypes` (default `reserved`, `on-demand`), or the pool declares none."
            }
            Self::NoPrice => "`maxCostPerHour` is set and the pool's class has no price for its capacity type.",
            Self::InsufficientDevices => {
                "Not enough free devices on few enough nodes, or fewer nodes than a `MultiNode` replica spans, or the member's scheduler recently found no node with room for a pod this large (another deployment's `devicesShort` refusal, until its `retryAfter`); the message gives the numbers."
            }
            Self::CostCeilingExceeded => {
                "One more replica here would take the deployment above `spec.placement.maxCostPerHour`."
            }
            Self::SpreadConstraint => "One more replica here would exceed `spec.placement.spread.maxSkew`.",
            Self::AlternativeMaxReached => "The device alternative's `maxReplicas` is reached.",
            Self::BudgetExhausted => {
                "The solver's evaluation budget ran out before this deployment; its current placements are kept."
            }
            Self::ReplicasUnschedulable => {
                "The member's scheduler refused this deployment's pods in the pool for longer than the controller's `--unschedulable-seconds` (status `placements[].unschedulable`; devices split across nodes, a taint or a quota Flotilla does not see): those replicas are placed elsewhere and no more come to the pool while any are refused, nor until the pool's back-off in `status.refusedPools` ends (`--unschedulable-backoff-seconds`); replicas running there stay."
            }
            Self::SolverFailed => {
                "The placement solver failed (a bug) on this deployment: it is left out of planning until its spec changes, what already runs is kept, and every other deployment is planned without it (`InvalidSpec` on `Placed`, naming the failure)."
            }
            Self::QuotaExceeded => {
                "One more replica here would take the namespace past a limit of one of its FleetQuotas (devices of a class or capacity type, or cost per hour, over every cluster together); the message names the quota, the limit and the usage. A quota never moves or preempts another namespace's replicas."
            }
            Self::Preempted => {
                "A replica the plan had here, not running yet, was preempted by a deployment of strictly higher `spec.placement.priority` that could place more with the room (the message names it), and no other allowed pool had room for it. Running replicas and equal priorities are never preempted."
            }
        }
    }

    /// What to do about it, in one or two sentences.
    pub fn action(self) -> &'static str {
        match self {
            Self::ClusterSelectorMismatch => "Label the cluster (`metadata.labels`), or widen the selector.",
            Self::JurisdictionNotAllowed | Self::RegionNotAllowed | Self::RegionDenied => {
                "Nothing if the policy is right: sovereignty is never bent. Otherwise change `spec.placement.sovereignty`, or add capacity in an allowed cluster."
            }
            Self::ClusterNotReady => "Fix the cluster's `Ready` condition (see the InferenceCluster reasons above).",
            Self::ClusterCordoned => {
                "Set `spec.cordoned: false` on the InferenceCluster when it may take replicas again."
            }
            Self::TaintNotTolerated => {
                "Add a matching entry to `spec.placement.tolerations`, or remove the taint from the InferenceCluster."
            }
            Self::NoMatchingDevices => {
                "Check the alternative's `class` and selectors against the InferenceClass's `spec.device` (`fleetctl explain` shows each verdict); add an alternative the fleet has."
            }
            Self::SelectorError => {
                "Fix the selector (`fleetctl validate` compiles it); guard optional attributes with `has(...)`."
            }
            Self::DoesNotFitNode => {
                "Lower `topology.devicesPerReplica` (or a role's `devicesPerPod`), use `MultiNode`, or add an alternative with larger nodes."
            }
            Self::CapacityTypeNotAllowed => {
                "Add the pool's capacity type to `spec.placement.capacityTypes`, or add pools of an allowed type."
            }
            Self::NoPrice => {
                "Set `spec.pricePerNodeHour` for that capacity type on the InferenceClass, or drop `maxCostPerHour`."
            }
            Self::InsufficientDevices => {
                "Add nodes to the pool, free devices, lower `replicas`, raise `placement.priority`, or ask for capacity with a CapacityClaim."
            }
            Self::CostCeilingExceeded => {
                "Raise `maxCostPerHour` or lower `replicas`: the solver already places as many replicas as the ceiling pays for, using the cheapest allowed capacity where the preferred one would not fit the budget. Allowing a capacity type or alternative the deployment does not allow yet helps only if it is cheaper."
            }
            Self::SpreadConstraint => {
                "Add capacity in the emptier domains, raise `maxSkew`, or spread `by` a coarser domain."
            }
            Self::AlternativeMaxReached => "Raise the alternative's `maxReplicas`, or add another alternative.",
            Self::BudgetExhausted => {
                "Nothing: the next solve tries again. If it repeats, the fleet is larger than the solver's budget (`SolveOptions::max_evaluations`, 200,000,000 evaluations): report it."
            }
            Self::ReplicasUnschedulable => {
                "Nothing for the replica: it moves by itself. To use the pool again, find why the member's scheduler refuses (`kubectl describe pod` there; the controller's `ReplicasUnschedulable` event quotes it); the pool takes new replicas again once the refused ones are gone and its back-off (`status.refusedPools[].retryAfter`) has ended."
            }
            Self::SolverFailed => {
                "Report it with the deployment's spec (`kubectl get modeldeployment -o yaml`) and the controller's log. Any change to the spec makes the solver try it again."
            }
            Self::QuotaExceeded => {
                "Raise the FleetQuota's limit, lower `replicas` of this or another deployment of the namespace, or give this deployment an alternative the quota does not limit; higher `placement.priority` takes the quota first within the namespace."
            }
            Self::Preempted => {
                "Add capacity the deployment may use, or raise its `placement.priority` if it matters as much as the one named; otherwise nothing: it takes room again when some frees."
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn all_is_every_variant_once_in_order() {
        for (i, r) in Reason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i, "{r}");
            assert!(!r.meaning().is_empty() && !r.action().is_empty());
            assert!(!r.meaning().contains('|') && !r.action().contains('|'));
        }
        // A variant added after the last one must be added to ALL too.
        assert_eq!(Reason::QuotaExceeded as usize + 1, Reason::ALL.len());
    }
}
