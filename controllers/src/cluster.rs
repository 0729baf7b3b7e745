//! The InferenceCluster reconciler: observe the member (through its kubeconfig Secret or its
//! ClusterProfile, `member/source.rs`), decide the status (pure: [`desired_status`]), and patch
//! it only when it differs from what is there. Requeues on a short period, so a member that
//! stops answering turns `Reachable=False` within `poll + observe timeout`. Its finalizer
//! applies the cluster's deletion policy to the member (`cluster_delete.rs`).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use flotilla_apis::cluster::InferenceClusterStatus;
use flotilla_apis::conditions::{Desired, Status, merge};
use flotilla_apis::constants::{FINALIZER_CLUSTER_CLEANUP, condition, reason};
use flotilla_apis::{InferenceClass, InferenceCluster};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::PatchParams;
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{Event as Finalizer, finalizer};
use kube::{Api, ResourceExt};

use crate::Context;
use crate::inventory::{Inventory, observe};
use crate::member::MemberError;
use crate::metrics::{Kind, Outcome as MetricOutcome};

/// What one look at a member found.
#[derive(Clone, Debug)]
pub enum Observed {
    /// The member answered.
    Ok {
        /// Capacity per pool.
        inventory: Inventory,
        /// Its Kubernetes version.
        version: String,
    },
    /// It could not be observed.
    Failed(MemberError),
    /// A pool names a class that does not exist.
    UnknownClass(Vec<String>),
}

/// The status the cluster should have. The heartbeat advances when something else changed, when
/// there is none yet, and — only if `heartbeat_every` is not zero (`--heartbeat-seconds`) — when
/// the last one is older than that. By default (zero) a quiet fleet writes nothing: a member
/// that stops answering is marked `Reachable=False` by the leader within one poll and the member
/// timeout, so a `Ready` status stays true while the leader's Lease is renewed.
pub fn desired_status(
    current: Option<&InferenceClusterStatus>,
    generation: Option<i64>,
    observed: &Observed,
    now: Timestamp,
    heartbeat_every: Duration,
) -> InferenceClusterStatus {
    let old = current.cloned().unwrap_or_default();
    let mut next = old.clone();
    next.observed_generation = generation;
    let conds: Vec<Desired> = match observed {
        Observed::Ok { inventory, version } => {
            next.pools = inventory.pools.clone();
            next.devices_total = Some(inventory.total());
            next.devices_free = Some(inventory.free());
            next.kubernetes_version = Some(version.clone());
            next.dra = Some(inventory.dra);
            let reachable = Desired::new(
                condition::REACHABLE,
                Status::True,
                reason::AS_EXPECTED,
                format!("API server {version} answered"),
            );
            let all_empty = !inventory.pools.is_empty() && inventory.empty_pools.len() == inventory.pools.len();
            let capacity = if inventory.pools.is_empty() {
                Desired::new(
                    condition::CAPACITY_KNOWN,
                    Status::False,
                    reason::NO_MATCHING_NODES,
                    "the cluster declares no pools: add spec.pools",
                )
            } else if all_empty {
                Desired::new(
                    condition::CAPACITY_KNOWN,
                    Status::False,
                    reason::NO_MATCHING_NODES,
                    format!("no ready node carries label flotilla.dev/pool={}", inventory.empty_pools.join("|")),
                )
            } else {
                let mut msg = format!(
                    "{} devices, {} free, in {} pool(s)",
                    inventory.total(),
                    inventory.free(),
                    inventory.pools.len()
                );
                if !inventory.empty_pools.is_empty() {
                    msg.push_str(&format!("; no ready nodes in {}", inventory.empty_pools.join(", ")));
                }
                Desired::new(condition::CAPACITY_KNOWN, Status::True, reason::AS_EXPECTED, msg)
            };
            let ready = if capacity.status == Status::True {
                Desired::new(condition::READY, Status::True, reason::AS_EXPECTED, "reachable, capacity observed")
            } else {
                Desired::new(condition::READY, Status::False, capacity.reason, capacity.message.clone())
            };
            vec![reachable, capacity, ready]
        }
        Observed::UnknownClass(classes) => {
            let msg = format!(
                "pools name unknown InferenceClass(es) {}: create them or fix spec.pools[].class",
                classes.join(", ")
            );
            vec![
                Desired::new(condition::CAPACITY_KNOWN, Status::False, reason::UNKNOWN_CLASS, msg.clone()),
                Desired::new(condition::READY, Status::False, reason::UNKNOWN_CLASS, msg),
            ]
        }
        Observed::Failed(err) => {
            let msg = err.to_string();
            vec![
                Desired::new(condition::REACHABLE, Status::False, err.reason(), msg.clone()),
                Desired::new(condition::CAPACITY_KNOWN, Status::Unknown, err.reason(), format!("not observed: {msg}")),
                Desired::new(condition::READY, Status::False, err.reason(), msg),
            ]
        }
    };
    let now_time = Time(now);
    next.conditions.0 = merge(&old.conditions.0, &conds, generation, &now_time);
    let answered = matches!(observed, Observed::Ok { .. });
    let stale = old.last_heartbeat.as_ref().is_none_or(|t| {
        !heartbeat_every.is_zero()
            && now.as_second().saturating_sub(t.0.as_second()) >= heartbeat_every.as_secs() as i64
    });
    if answered && (next != old || stale) {
        next.last_heartbeat = Some(now_time);
    }
    next
}

/// Reconciles one InferenceCluster (with its finalizer).
pub async fn reconcile(ic: Arc<InferenceCluster>, ctx: Arc<Context>) -> Result<Action, crate::Error> {
    let api: Api<InferenceCluster> = Api::all(ctx.client.clone());
    finalizer(&api, FINALIZER_CLUSTER_CLEANUP, ic, |ev| async {
        match ev {
            Finalizer::Apply(ic) => observe_member(ic, ctx.clone()).await,
            Finalizer::Cleanup(ic) => crate::cluster_delete::cleanup(ic, ctx.clone()).await,
        }
    })
    .await
    .map_err(crate::from_finalizer)
}

async fn observe_member(ic: Arc<InferenceCluster>, ctx: Arc<Context>) -> Result<Action, crate::Error> {
    let started = Instant::now();
    let name = ic.name_any();
    let classes: BTreeMap<String, _> =
        ctx.classes.state().iter().map(|c: &Arc<InferenceClass>| (c.name_any(), c.spec.clone())).collect();
    let unknown: Vec<String> =
        ic.spec.pools.iter().filter(|p| !classes.contains_key(&p.class)).map(|p| p.class.clone()).collect();
    let observed = if !unknown.is_empty() {
        Observed::UnknownClass(unknown)
    } else {
        match ctx.members.client(&ctx.client, &ic, ctx.config.timeouts).await {
            Err(e) => Observed::Failed(e),
            Ok(client) => {
                let t = ctx.config.timeouts;
                let seen = async {
                    let version = ctx.members.liveness(&name, &client, t).await?;
                    let watch = ctx.members.watch(&name, &client, t).await?;
                    Ok::<_, MemberError>((watch.observation(t).await?, version))
                };
                match seen.await {
                    Ok((seen, version)) => {
                        Observed::Ok { inventory: observe(&ic.spec.pools, &classes, &seen), version }
                    }
                    Err(e) => Observed::Failed(e),
                }
            }
        }
    };
    let next = desired_status(
        ic.status.as_ref(),
        ic.metadata.generation,
        &observed,
        Timestamp::now(),
        ctx.config.heartbeat_every,
    );
    let api: Api<InferenceCluster> = Api::all(ctx.client.clone());
    let pp = PatchParams::apply(&ctx.config.field_manager);
    let written =
        crate::status_patch::write_status(&api, &name, ic.status.as_ref(), ic.resource_version(), &next, &pp).await?;
    let outcome = if written.is_some() {
        ctx.metrics.status_write(Kind::InferenceCluster);
        match &observed {
            Observed::Ok { .. } => tracing::info!(cluster = %name, "status updated"),
            Observed::Failed(e) => tracing::warn!(cluster = %name, reason = e.reason(), "member not observed: {e}"),
            Observed::UnknownClass(c) => tracing::warn!(cluster = %name, "unknown classes {c:?}"),
        }
        MetricOutcome::Changed
    } else {
        MetricOutcome::Unchanged
    };
    ctx.metrics.reconciled(Kind::InferenceCluster, outcome, started.elapsed());
    Ok(Action::requeue(ctx.config.poll))
}

#[cfg(test)]
#[path = "cluster_tests.rs"]
mod tests;
