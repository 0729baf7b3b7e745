//! Giving surplus capacity back, as `spec.disruption` allows. A claim holds surplus when its
//! pod counts went down (the owning deployment scaled in, or someone edited the claim) or when
//! it is being deleted. Per allocation (the oldest are kept, the newest given back first):
//! `consolidation: Disabled` keeps everything; `minLifetime` keeps nodes younger than it;
//! `WhenEmpty` and `scaleDown: ApplicationDrainOnly` give back only nodes the member shows
//! without pods (`ConsolidationBlocked` resp. `DrainRequired` until the rest are empty);
//! `WhenUnderutilized` with `scaleDown: Any` gives back what is surplus, empty nodes first.
//! The same policy goes onto the nodes, as labels and as the annotations cluster-autoscaler and
//! Karpenter honour, so a node autoscaler does not take away what the claim keeps.

use std::collections::BTreeSet;
use std::time::Duration;

use flotilla_apis::claim::{
    CapacityClaimSpec, CapacityClaimStatus, ClaimAllocation, Consolidation, DisruptionPolicy, ScaleDown,
};
use flotilla_apis::constants::reason;
use k8s_openapi::jiff::Timestamp;

use super::run::Run;
use super::{ClaimInput, duration};
use crate::clock::add;
use crate::error::ErrorKind;
use crate::provider::CapacityProvider;
use crate::types::{NamedNode, NodeRemoval, RegionInfo};

/// Node annotation cluster-autoscaler honours: never scale this node down.
pub const CLUSTER_AUTOSCALER_SCALE_DOWN_DISABLED: &str = "cluster-autoscaler.kubernetes.io/scale-down-disabled";
/// Node annotation Karpenter honours: never disrupt (consolidate, drift, expire) this node.
pub const KARPENTER_DO_NOT_DISRUPT: &str = "karpenter.sh/do-not-disrupt";

/// A node of a claim as its member cluster shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeUse {
    /// Node name.
    pub name: String,
    /// The acquisition it came from (label `flotilla.dev/acquisition`).
    pub acquisition: String,
    /// Pods running there that are not DaemonSet or mirror pods and have not finished.
    pub pods: u32,
    /// The node's `spec.providerID` (`aws:///eu-central-1a/i-0abc…`): how a provider that
    /// removes particular nodes finds the instance.
    pub provider_id: Option<String>,
}

/// What the controller saw of a claim's nodes in the members.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClaimUsage {
    /// Clusters whose nodes and pods were listed; pods in any other cluster are unknown.
    pub clusters: BTreeSet<String>,
    /// Every node labelled for the claim in those clusters.
    pub nodes: Vec<NodeUse>,
}

impl ClaimUsage {
    fn of<'a>(&'a self, acquisition: &'a str) -> impl Iterator<Item = &'a NodeUse> + 'a {
        self.nodes.iter().filter(move |n| n.acquisition == acquisition)
    }

    fn busy(&self, acquisition: &str) -> Vec<String> {
        let mut busy: Vec<String> =
            self.of(acquisition).filter(|n| n.pods > 0).map(|n| format!("{} ({} pod(s))", n.name, n.pods)).collect();
        busy.sort();
        busy
    }
}

fn policy(spec: &CapacityClaimSpec) -> DisruptionPolicy {
    spec.disruption.clone().unwrap_or_default()
}

/// Whether a node autoscaler may remove the claim's nodes obtained at `since` (at `now`): only
/// when the claim lets anything go (`WhenUnderutilized`, `scaleDown: Any`), `minLifetime` has
/// passed, and the claim is not `latency.warm` (kept running while no pod uses it, which an
/// autoscaler would otherwise take for idle). Otherwise the nodes carry the autoscalers'
/// do-not-disrupt annotations.
pub fn autoscaler_may_remove(spec: &CapacityClaimSpec, since: Option<Timestamp>, now: Timestamp) -> bool {
    if spec.latency.as_ref().is_some_and(|l| l.warm) {
        return false;
    }
    let p = policy(spec);
    let young = match (p.min_lifetime.as_deref().and_then(duration::parse), since) {
        (Some(life), Some(since)) => now < add(since, life),
        (Some(_), None) => true,
        (None, _) => false,
    };
    p.consolidation == Consolidation::WhenUnderutilized && p.scale_down == ScaleDown::Any && !young
}

/// When the claim is being deleted: why its capacity may not be released yet (the message of
/// `DrainRequired`), or `None` when it may. Only `scaleDown: ApplicationDrainOnly` waits, and
/// it waits for pods it cannot see as well as for pods it sees.
pub fn drain_pending(spec: &CapacityClaimSpec, status: &CapacityClaimStatus, usage: &ClaimUsage) -> Option<String> {
    if policy(spec).scale_down != ScaleDown::ApplicationDrainOnly {
        return None;
    }
    let mut waits = Vec::new();
    for a in &status.allocations {
        if !usage.clusters.contains(&a.cluster) {
            waits.push(format!("{} in {}: its pods cannot be seen (member unreachable)", a.pool, a.cluster));
            continue;
        }
        let busy = usage.busy(&a.pool);
        if !busy.is_empty() {
            waits.push(format!("{} in {}: {}", a.pool, a.cluster, busy.join(", ")));
        }
    }
    (!waits.is_empty()).then(|| {
        format!(
            "Deleting: spec.disruption.scaleDown is ApplicationDrainOnly, so nothing is released while the application \
             runs on the claim's nodes: {}. Scale the workload down or move it; the capacity is released once they are \
             empty",
            waits.join("; ")
        )
    })
}

/// What holds surplus back, or what is being given back: `(reason, text)`.
pub(super) type Held = (&'static str, String);

/// Gives back what `run.allocations` hold beyond the pod sets' counts, as the policy allows.
/// Blocks are recorded in `run.surplus`; the earliest time a `minLifetime` block lifts in
/// `run.wake`.
pub(super) async fn scale_down(
    input: &ClaimInput<'_>,
    provider: &dyn CapacityProvider,
    regions: &[RegionInfo],
    run: &mut Run,
) {
    let p = policy(input.spec);
    let life = p.min_lifetime.as_deref().and_then(duration::parse);
    let free_any = p.consolidation == Consolidation::WhenUnderutilized && p.scale_down == ScaleDown::Any;
    let mut gone: Vec<usize> = Vec::new();
    for pod_set in &input.spec.pod_sets {
        let mut keep = pod_set.count.max(0);
        let mine: Vec<usize> =
            (0..run.allocations.len()).filter(|&i| run.allocations[i].pod_set == pod_set.name).collect();
        for i in mine {
            let a = run.allocations[i].clone();
            let kept_pods = a.pods.clamp(0, keep);
            keep -= kept_pods;
            let per_node = if a.nodes > 0 { ((a.pods + a.nodes - 1) / a.nodes).max(1) } else { 1 };
            let surplus = a.nodes - (kept_pods + per_node - 1) / per_node;
            if surplus <= 0 {
                continue;
            }
            let Some(region) = regions.iter().find(|r| r.cluster == a.cluster) else { continue };
            let what = format!("{surplus} surplus node(s) of {} ({} in {})", a.pool, a.class, a.cluster);
            let Some((named, count)) = choose(input, &p, life, free_any, &a, surplus, &what, run) else { continue };
            run.recheck = true;
            let left = u32::try_from(a.nodes - count).unwrap_or(0);
            let names: Vec<String> = named.iter().map(|n| n.name.clone()).collect();
            let result = if left == 0 {
                provider.release(&region.name, &a.pool).await.map(|()| None)
            } else {
                let removal = NodeRemoval { named, nodes: left, provider_may_choose: free_any };
                provider.remove_nodes(&region.name, &a.pool, &removal).await.map(Some)
            };
            match result {
                Ok(None) => {
                    run.surplus.push((reason::SCALING_DOWN, format!("released {} ({count} node(s)): {what}", a.pool)));
                    run.acquisitions.retain(|acq| acq.id != a.pool);
                    gone.push(i);
                }
                Ok(Some(acq)) => {
                    let named = if names.is_empty() { String::new() } else { format!(" ({})", names.join(", ")) };
                    // A provider that removes only named nodes keeps those it could not name.
                    let removed = a.nodes - i32::try_from(acq.nodes_granted).unwrap_or(a.nodes).min(a.nodes);
                    run.surplus.push((
                        reason::SCALING_DOWN,
                        format!("removed {removed} node(s){named} from {}: {what}", a.pool),
                    ));
                    if removed < count {
                        run.surplus.push((
                            reason::CONSOLIDATION_BLOCKED,
                            format!(
                                "{} of the {what} kept: not in {} yet, so they cannot be named, and {} removes only \
                                 the empty nodes it is given; each goes once it has joined and shows empty",
                                count - removed,
                                a.cluster,
                                run.provider
                            ),
                        ));
                    }
                    let alloc = &mut run.allocations[i];
                    alloc.nodes = i32::try_from(acq.nodes_granted).unwrap_or(alloc.nodes);
                    alloc.pods = alloc.pods.min(alloc.nodes * per_node);
                    if let Some(slot) = run.acquisitions.iter_mut().find(|x| x.id == acq.id) {
                        *slot = acq;
                    }
                }
                Err(e) if e.kind().is_transient() => {
                    run.surplus.push((reason::SCALING_DOWN, format!("giving back {what}: {e}; retrying")));
                    run.transient.get_or_insert(e);
                }
                Err(e) if e.kind() == ErrorKind::InvalidRequest => run.surplus.push((
                    reason::CONSOLIDATION_BLOCKED,
                    format!(
                        "{what} kept: {} cannot give back part of it ({e}); it is released whole once all its nodes \
                         are surplus",
                        run.provider
                    ),
                )),
                Err(e) => run.surplus.push((reason::SCALING_DOWN, format!("giving back {what}: {e}"))),
            }
        }
    }
    let mut i = 0;
    run.allocations.retain(|_| {
        i += 1;
        !gone.contains(&(i - 1))
    });
}

/// Which nodes of `a` to give back now (the empty ones by name, and how many in all), or `None`
/// when the policy keeps them all (recorded in `run`). A busy node is never named.
#[allow(clippy::too_many_arguments)]
fn choose(
    input: &ClaimInput<'_>,
    p: &DisruptionPolicy,
    life: Option<Duration>,
    free_any: bool,
    a: &ClaimAllocation,
    surplus: i32,
    what: &str,
    run: &mut Run,
) -> Option<(Vec<NamedNode>, i32)> {
    if p.consolidation == Consolidation::Disabled {
        run.surplus.push((
            reason::CONSOLIDATION_BLOCKED,
            format!(
                "{what} kept: spec.disruption.consolidation is Disabled; set WhenEmpty or WhenUnderutilized to give \
                 them back, or delete the claim"
            ),
        ));
        return None;
    }
    if let Some(life) = life {
        let until = add(a.since.as_ref().map_or(input.now, |t| t.0), life);
        if input.now < until {
            run.surplus.push((
                reason::CONSOLIDATION_BLOCKED,
                format!(
                    "{what} kept until {until} (spec.disruption.minLifetime {})",
                    p.min_lifetime.as_deref().unwrap_or("")
                ),
            ));
            run.wake = Some(run.wake.map_or(until, |w| w.min(until)));
            return None;
        }
    }
    run.recheck = true;
    if !input.usage.clusters.contains(&a.cluster) {
        if free_any {
            return Some((Vec::new(), surplus));
        }
        run.surplus.push((
            reason::CONSOLIDATION_BLOCKED,
            format!(
                "{what} kept: the pods on {}'s nodes cannot be seen (member unreachable) and spec.disruption gives back \
                 only empty nodes",
                a.cluster
            ),
        ));
        return None;
    }
    let seen: Vec<&NodeUse> = input.usage.of(&a.pool).collect();
    let mut empty: Vec<NamedNode> = seen
        .iter()
        .filter(|n| n.pods == 0)
        .map(|n| NamedNode { name: n.name.clone(), provider_id: n.provider_id.clone() })
        .collect();
    empty.sort_by(|x, y| x.name.cmp(&y.name));
    // Nodes that have not joined yet run nothing either.
    let unseen = usize::try_from(a.nodes).unwrap_or(0).saturating_sub(seen.len());
    let surplus_n = usize::try_from(surplus).unwrap_or(0);
    let count = if free_any { surplus_n } else { surplus_n.min(empty.len() + unseen) };
    empty.truncate(count);
    if count < surplus_n {
        let busy = input.usage.busy(&a.pool);
        let n = surplus_n - count;
        if p.scale_down == ScaleDown::ApplicationDrainOnly {
            run.surplus.push((
                reason::DRAIN_REQUIRED,
                format!(
                    "{n} of the {what} still run pods (spec.disruption.scaleDown: ApplicationDrainOnly): drain {} to \
                     release them",
                    busy.join(", ")
                ),
            ));
        } else {
            run.surplus.push((
                reason::CONSOLIDATION_BLOCKED,
                format!(
                    "{n} of the {what} still run pods ({}) and spec.disruption.consolidation is WhenEmpty; each is \
                     given back once empty",
                    busy.join(", ")
                ),
            ));
        }
    }
    (count > 0).then(|| (empty, i32::try_from(count).unwrap_or(0)))
}
