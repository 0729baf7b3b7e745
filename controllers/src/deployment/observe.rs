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

/// Observes every member in `involved`.
pub async fn observe_members(ctx: &DeploymentContext, md: &ModelDeployment, involved: &BTreeSet<String>) -> Members {
    let mut out = Members::default();
    for cluster in involved {
        let Some(ic) = ctx.clusters.get(&ObjectRef::new(cluster)) else {
            out.seen.unreachable.insert(cluster.clone(), "no such InferenceCluster".into());
            out.seen.vanished.insert(cluster.clone());
            continue;
        };
        // Its deletion policy, not this reconcile, decides what happens to the objects there.
        if ic.metadata.deletion_timestamp.is_some() {
            out.seen.unreachable.insert(cluster.clone(), "its InferenceCluster is being deleted".into());
            continue;
        }
        if ctx.members.known_unreachable(cluster) {
            out.seen.unreachable.insert(cluster.clone(), "its last liveness check got no answer".into());
            continue;
        }
        let member = match ctx.members.handle(&ctx.client, &ic, ctx.config.timeouts).await {
            Ok(m) => m,
            Err(e) => {
                out.seen.unreachable.insert(cluster.clone(), e.to_string());
                continue;
            }
        };
        match members::observe(&member, md, &ctx.config.install_id, ctx.config.timeouts.observe).await {
            Ok(state) => {
                for (pool, r) in &state.running {
                    out.seen.running.insert((cluster.clone(), pool.clone()), *r);
                }
                refusals(ctx, md, cluster, &member, &state, &mut out.seen).await;
                out.seen.answered.insert(cluster.clone());
                out.answered.insert(cluster.clone(), (member, state));
            }
            Err(e) => {
                out.seen.unreachable.insert(cluster.clone(), e.to_string());
            }
        }
    }
    out
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
