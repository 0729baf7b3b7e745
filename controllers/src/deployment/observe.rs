//! The observe step of a ModelDeployment reconcile: for each involved member (where the plan
//! wants replicas or the status says some may be), what runs there of the deployment
//! (`members::observe`), or why it could not be seen — no InferenceCluster any more, being
//! deleted (its deletion policy decides), no client, an error or no answer in time. Members
//! that answered keep their handle (client and caches) and state for the apply step.

use std::collections::{BTreeMap, BTreeSet};

use kube::runtime::reflector::ObjectRef;

use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;

use super::decide::{Refusal, Seen};
use super::members::{self, MemberState};
use super::{DeploymentContext, ModelDeployment};
use crate::member::Handle;

/// What the involved members showed.
#[derive(Default)]
pub struct Members {
    /// The decision's view.
    pub seen: Seen,
    /// The members that answered: their client and what runs there.
    pub answered: BTreeMap<String, (Handle, MemberState)>,
}

/// How many members one reconcile observes (and writes) at the same time: one slow member
/// delays the reconcile by its own timeout, not by the sum over the members involved.
pub const MEMBERS_AT_ONCE: usize = 8;

/// Observes every member in `involved`, at most [`MEMBERS_AT_ONCE`] at a time.
pub async fn observe_members(ctx: &DeploymentContext, md: &ModelDeployment, involved: &BTreeSet<String>) -> Members {
    use futures_util::StreamExt;
    let names: Vec<String> = involved.iter().cloned().collect();
    let each: Vec<(Seen, Option<Answered>)> = futures_util::stream::iter(names)
        .map(|cluster| async move { observe_one(ctx, md, cluster).await })
        .buffered(MEMBERS_AT_ONCE)
        .collect()
        .await;
    let mut out = Members::default();
    for (seen, answered) in each {
        absorb(&mut out.seen, seen);
        if let Some((cluster, member, state)) = answered {
            out.answered.insert(cluster, (member, state));
        }
    }
    out
}

/// A member that answered: its name, handle and state.
type Answered = (String, Handle, MemberState);

/// What one member showed: its part of the decision's view and, when it answered, its handle
/// and state.
async fn observe_one(ctx: &DeploymentContext, md: &ModelDeployment, cluster: String) -> (Seen, Option<Answered>) {
    let mut seen = Seen::default();
    let Some(ic) = ctx.clusters.get(&ObjectRef::new(&cluster)) else {
        seen.unreachable.insert(cluster.clone(), "no such InferenceCluster".into());
        seen.vanished.insert(cluster);
        return (seen, None);
    };
    // Its deletion policy, not this reconcile, decides what happens to the objects there.
    if ic.metadata.deletion_timestamp.is_some() {
        seen.unreachable.insert(cluster, "its InferenceCluster is being deleted".into());
        return (seen, None);
    }
    if ctx.members.known_unreachable(&cluster) {
        seen.unreachable.insert(cluster, "its last liveness check got no answer".into());
        return (seen, None);
    }
    let member = match ctx.members.handle(&ctx.client, &ic, ctx.config.timeouts).await {
        Ok(m) => m,
        Err(e) => {
            seen.unreachable.insert(cluster, e.to_string());
            return (seen, None);
        }
    };
    match members::observe(&member, md, &ctx.config.install_id, ctx.config.timeouts.observe).await {
        Ok(state) => {
            for (pool, r) in &state.running {
                seen.running.insert((cluster.clone(), pool.clone()), *r);
            }
            refusals(ctx, md, &cluster, &member, &state, &mut seen).await;
            seen.answered.insert(cluster.clone());
            (seen, Some((cluster, member, state)))
        }
        Err(e) => {
            seen.unreachable.insert(cluster, e.to_string());
            (seen, None)
        }
    }
}

/// Adds one member's view to the whole (every entry is keyed by its cluster: none collide).
fn absorb(all: &mut Seen, one: Seen) {
    all.answered.extend(one.answered);
    all.running.extend(one.running);
    all.unreachable.extend(one.unreachable);
    all.vanished.extend(one.vanished);
    all.refused.extend(one.refused);
}

/// The replicas of `md` in `cluster` whose pods the member's scheduler has refused for longer
/// than `--unschedulable-seconds`, from the member's pod watch: per pool, refused pods, but no
/// more than the replicas asked for there that have no pod on a node (a replica is counted
/// once; pods left over from a scale-down are not counted). Replicas of several pods
/// (`MultiNode`, `Disaggregated`) have more pods than replicas, so they are never counted.
async fn refusals(
    ctx: &DeploymentContext,
    md: &ModelDeployment,
    cluster: &str,
    member: &Handle,
    state: &MemberState,
    seen: &mut Seen,
) {
    // Every replica asked for is ready, so each has a pod on a node: none can be refused, and
    // the member's pods need not be read (a settled deployment, the common case).
    if state.running.values().all(|r| r.ready >= r.applied) {
        return;
    }
    let Ok(watch) = ctx.members.watch(cluster, &member.client, ctx.config.timeouts).await else {
        return;
    };
    let grace = ctx.config.unschedulable_after.as_secs() as i64;
    let before = Timestamp::from_second(Timestamp::now().as_second() - grace).unwrap_or(Timestamp::UNIX_EPOCH);
    let ns = md.namespace().unwrap_or_else(|| "default".into());
    for (pool, pods) in watch.pool_pods(&ns, &crate::render::deployment_key(md), before) {
        let applied = state.running.get(&pool).map_or(0, |r| r.applied);
        let replicas = pods.refused.min((applied - pods.scheduled).max(0));
        if replicas > 0 {
            seen.refused.insert((cluster.to_string(), pool), Refusal { replicas, message: pods.message });
        }
    }
}
