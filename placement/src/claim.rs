//! From a ModelDeployment's plan to the CapacityClaim it should own, as a pure function. A
//! deployment that fits owns no claim. One that does not, and has a `capacityClaimTemplate`,
//! owns one claim (same name and namespace) asking for the replicas it cannot place plus the
//! ones already running on what the claim obtained — so the claim neither grows while its
//! nodes are still coming nor shrinks once the replicas moved onto them. Replicas a FleetQuota
//! holds back are never claimed for: the quota would refuse them on the new nodes too. Used by the
//! controller (which applies the decision) and by `fleetctl plan` (which previews it).

use std::collections::BTreeMap;

use crate::plan::{DeploymentPlan, Reason};
use flotilla_apis::claim::{CapacityClaimSpec, CapacityPolicy, ClaimDeviceClass, ClaimLatency, PodSet};
use flotilla_apis::constants::labels;
use flotilla_apis::deployment::TopologyType;
use flotilla_apis::{CapacityClaim, ModelDeployment};
use kube::{Resource, ResourceExt};

/// What to do about a deployment's claim.
#[derive(Clone, Debug)]
pub enum ClaimDecision {
    /// Nothing: no claim is wanted and none exists.
    None,
    /// Create or update the claim to this.
    Apply(Box<CapacityClaim>),
    /// Delete the claim the deployment owns (its capacity is released).
    Delete,
}

/// Replicas already placed on what `existing` obtained: per allocation, the replicas the plan
/// puts on that cluster and class, up to the pods the allocation holds.
fn replicas_on_claim(plan: &DeploymentPlan, existing: Option<&CapacityClaim>) -> u32 {
    let Some(status) = existing.and_then(|c| c.status.as_ref()) else { return 0 };
    let mut placed: BTreeMap<(&str, &str), u32> = BTreeMap::new();
    for a in &plan.assignments {
        *placed.entry((a.cluster.as_str(), a.class.as_str())).or_default() += a.replicas;
    }
    let mut used = 0;
    for alloc in &status.allocations {
        let left = placed.entry((alloc.cluster.as_str(), alloc.class.as_str())).or_default();
        let take = (*left).min(u32::try_from(alloc.pods.max(0)).unwrap_or(0));
        *left -= take;
        used += take;
    }
    used
}

/// Whether the plan leaves replicas unplaced because a FleetQuota of the namespace binds:
/// capacity bought for them could not be used, so no claim asks for them.
pub fn held_by_quota(plan: &DeploymentPlan) -> bool {
    plan.unplaced > 0 && plan.rejections.iter().any(|r| r.reason == Reason::QuotaExceeded)
}

/// The claim `md` should own given its `plan` and the claim it owns now. Replicas a FleetQuota
/// holds back are not asked for ([`held_by_quota`]); those already on the claim's capacity stay.
pub fn decide(md: &ModelDeployment, plan: &DeploymentPlan, existing: Option<&CapacityClaim>) -> ClaimDecision {
    let template = md.spec.placement.capacity_claim_template.as_ref();
    let short = if held_by_quota(plan) { 0 } else { plan.unplaced };
    let needed = short + replicas_on_claim(plan, existing);
    let (Some(template), true) = (template, needed > 0) else {
        return if existing.is_some() { ClaimDecision::Delete } else { ClaimDecision::None };
    };
    let needed = i32::try_from(needed.min(plan.desired)).unwrap_or(i32::MAX);
    let topo = &md.spec.topology;
    let per_replica = i32::try_from(topo.devices_per_replica).unwrap_or(i32::MAX).max(1);
    let pod_sets = match topo.type_ {
        TopologyType::Disaggregated => topo
            .roles
            .iter()
            .map(|r| PodSet {
                name: format!("{:?}", r.name).to_lowercase(),
                count: needed.saturating_mul(i32::try_from(r.pods).unwrap_or(1)),
                devices_per_pod: i32::try_from(r.devices_per_pod).unwrap_or(1).max(1),
            })
            .collect(),
        TopologyType::MultiNode => {
            let nodes = i32::try_from(topo.nodes_per_replica.unwrap_or(1)).unwrap_or(1).max(1);
            vec![PodSet {
                name: "replicas".into(),
                count: needed.saturating_mul(nodes),
                devices_per_pod: (per_replica + nodes - 1) / nodes,
            }]
        }
        _ => vec![PodSet { name: "replicas".into(), count: needed, devices_per_pod: per_replica }],
    };
    let capacity_types = if template.capacity_types.is_empty() {
        md.spec.placement.capacity_types_or_default()
    } else {
        template.capacity_types.clone()
    };
    let spec = CapacityClaimSpec {
        pod_sets,
        latency: template
            .max_provisioning_latency
            .clone()
            .map(|l| ClaimLatency { max_provisioning_latency: Some(l), warm: false }),
        topology: None,
        capacity: CapacityPolicy {
            capacity_types,
            device_classes: md
                .spec
                .devices
                .alternatives
                .iter()
                .map(|a| ClaimDeviceClass { class: a.class.clone(), selectors: a.selectors.clone() })
                .collect(),
            sovereignty: md.spec.placement.sovereignty.clone(),
            reservation_ids: Vec::new(),
        },
        disruption: template.disruption.clone(),
    };
    if existing.is_some_and(|c| c.spec == spec) {
        return ClaimDecision::None;
    }
    let ns = md.namespace().unwrap_or_else(|| "default".into());
    let mut claim = CapacityClaim::new(&md.name_any(), spec);
    claim.metadata.namespace = Some(ns.clone());
    claim.metadata.labels = Some(BTreeMap::from([
        (labels::DEPLOYMENT.to_string(), flotilla_apis::names::owner_key(&ns, &md.name_any())),
        (labels::MANAGED_BY.to_string(), "flotilla".to_string()),
    ]));
    claim.metadata.owner_references = md.controller_owner_ref(&()).map(|r| vec![r]);
    ClaimDecision::Apply(Box::new(claim))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Assignment;

    fn md(template: bool) -> ModelDeployment {
        let mut v = serde_json::json!({
            "apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": "llama", "namespace": "ml", "uid": "u-1"},
            "spec": {"model": {"name": "llama", "source": "hf://o/m"}, "replicas": 4,
                     "engine": {"image": "vllm"}, "topology": {"type": "TensorParallel", "devicesPerReplica": 4},
                     "devices": {"alternatives": [{"class": "h200"}, {"class": "h100"}]},
                     "placement": {"sovereignty": {"allowedJurisdictions": ["EU"]}}}
        });
        if template {
            v["spec"]["placement"]["capacityClaimTemplate"] =
                serde_json::json!({"capacityTypes": ["on-demand"], "maxProvisioningLatency": "15m"});
        }
        serde_json::from_value(v).unwrap()
    }

    fn plan(placed: &[(&str, &str, u32)], unplaced: u32) -> DeploymentPlan {
        DeploymentPlan {
            namespace: "ml".into(),
            name: "llama".into(),
            model: "llama".into(),
            desired: 4,
            assignments: placed
                .iter()
                .map(|(c, class, r)| Assignment {
                    cluster: (*c).into(),
                    pool: "p".into(),
                    class: (*class).into(),
                    capacity_type: flotilla_apis::CapacityType::OnDemand,
                    fallback_rank: 1,
                    replicas: *r,
                    cost_micros_per_hour: 0,
                })
                .collect(),
            unplaced,
            unmet_minimums: vec![],
            cost_micros_per_hour: 0,
            rejections: vec![],
            explanation: None,
            invalid: None,
            moves: Vec::new(),
            preemptions: Vec::new(),
            trade: None,
        }
    }

    fn with_allocation(mut c: CapacityClaim, cluster: &str, class: &str, pods: i32) -> CapacityClaim {
        let alloc: flotilla_apis::claim::ClaimAllocation = serde_json::from_value(serde_json::json!({
            "podSet": "replicas", "cluster": cluster, "pool": "acq-1", "class": class, "nodes": 1, "pods": pods}))
        .unwrap();
        c.status = Some(flotilla_apis::claim::CapacityClaimStatus { allocations: vec![alloc], ..Default::default() });
        c
    }

    #[test]
    fn a_deployment_that_fits_owns_no_claim() {
        assert!(matches!(decide(&md(true), &plan(&[("eu1", "h100", 4)], 0), None), ClaimDecision::None));
        assert!(
            matches!(decide(&md(false), &plan(&[("eu1", "h100", 2)], 2), None), ClaimDecision::None),
            "no template"
        );
    }

    #[test]
    fn unplaced_replicas_become_a_claim_that_holds_steady_as_nodes_arrive() {
        let d = md(true);
        let ClaimDecision::Apply(claim) = decide(&d, &plan(&[("eu1", "h100", 2)], 2), None) else { panic!() };
        assert_eq!(claim.metadata.name.as_deref(), Some("llama"));
        assert_eq!(claim.metadata.owner_references.as_ref().unwrap()[0].uid, "u-1");
        let ps = &claim.spec.pod_sets[0];
        assert_eq!((ps.count, ps.devices_per_pod), (2, 4));
        assert_eq!(claim.spec.capacity.device_classes.len(), 2);
        assert_eq!(claim.spec.capacity.sovereignty.as_ref().unwrap().allowed_jurisdictions[0].0, "EU");
        // Still provisioning: the same two are unplaced, nothing changes.
        assert!(matches!(decide(&d, &plan(&[("eu1", "h100", 2)], 2), Some(&claim)), ClaimDecision::None));
        // The nodes arrived in eu2 and the two replicas moved there: still two, nothing changes.
        let fulfilled = with_allocation(*claim.clone(), "eu2", "h100", 2);
        assert!(matches!(
            decide(&d, &plan(&[("eu1", "h100", 2), ("eu2", "h100", 2)], 0), Some(&fulfilled)),
            ClaimDecision::None
        ));
        // Two more replicas that do not fit: the claim grows to four.
        let ClaimDecision::Apply(grown) =
            decide(&d, &plan(&[("eu1", "h100", 2), ("eu2", "h100", 2)], 2), Some(&fulfilled))
        else {
            panic!()
        };
        assert_eq!(grown.spec.pod_sets[0].count, 4);
        // The fleet has room elsewhere and nothing runs on the claim: it is deleted.
        assert!(matches!(decide(&d, &plan(&[("eu1", "h100", 4)], 0), Some(&fulfilled)), ClaimDecision::Delete));
        // The template removed: the claim goes.
        assert!(matches!(decide(&md(false), &plan(&[("eu1", "h100", 2)], 2), Some(&claim)), ClaimDecision::Delete));
    }

    #[test]
    fn replicas_a_quota_holds_back_are_not_claimed_for_and_those_on_the_claim_stay() {
        let d = md(true);
        let quota = |mut p: DeploymentPlan| {
            p.rejections.push(crate::plan::Rejection {
                cluster: "eu1".into(),
                reason: Reason::QuotaExceeded,
                message: "FleetQuota ml/gpus: devices 8 of 8 used in the namespace; one more replica here needs 4"
                    .into(),
            });
            p
        };
        let held = quota(plan(&[("eu1", "h100", 2)], 2));
        assert!(held_by_quota(&held));
        assert!(matches!(decide(&d, &held, None), ClaimDecision::None), "nothing bought for the quota to refuse");
        // A claim already holding two of its replicas keeps them; it does not grow for the rest.
        let ClaimDecision::Apply(claim) = decide(&d, &plan(&[("eu1", "h100", 2)], 2), None) else { panic!() };
        let fulfilled = with_allocation(*claim, "eu2", "h100", 2);
        let on_claim = quota(plan(&[("eu1", "h100", 2), ("eu2", "h100", 2)], 1));
        assert!(matches!(decide(&d, &on_claim, Some(&fulfilled)), ClaimDecision::None), "the claim as it is");
        // Twin without the quota's refusal: the claim grows to three.
        let ClaimDecision::Apply(grown) =
            decide(&d, &plan(&[("eu1", "h100", 2), ("eu2", "h100", 2)], 1), Some(&fulfilled))
        else {
            panic!()
        };
        assert_eq!(grown.spec.pod_sets[0].count, 3);
    }
}
