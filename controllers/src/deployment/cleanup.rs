//! Deleting a ModelDeployment. Its objects exist only in members its status names (the
//! write-ahead records a cluster before anything is applied there), so only those must be
//! cleaned; every other member that is Reachable is swept by label too, best effort. Decide
//! ([`scope`], [`decide`], pure): the finalizer goes once every member that must be cleaned
//! was, or when the deployment is annotated `flotilla.dev/orphan-on-unreachable=true`;
//! otherwise only this deployment waits, `Ready=False` `CleanupBlocked` naming the members. An
//! unreachable member that never ran the deployment holds nothing up; nor does a placement on
//! an InferenceCluster that no longer exists (its own deletion policy decided). What is there is
//! read from the member's caches; a member whose cache of the namespace was never started (or
//! does not sync in time) is listed once (`members::prune`).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use flotilla_apis::conditions::{Desired, Status, merge};
use flotilla_apis::constants::{annotations, condition, reason};
use flotilla_apis::{InferenceCluster, ModelDeployment};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::runtime::controller::Action;

use super::{DeploymentContext, members, write_status};
use crate::Error;
use crate::member::brief;

/// The members a deployment's cleanup touches.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Scope {
    /// Clusters that run or may run its objects (status placements that still exist): the
    /// finalizer waits for each.
    pub must: BTreeSet<String>,
    /// Other Reachable clusters, swept by label; a failure there is logged, not waited for.
    pub sweep: BTreeSet<String>,
}

/// Which clusters to clean: `placed` are the clusters in status placements; `clusters` every
/// InferenceCluster with whether its status says it is Reachable.
pub fn scope(placed: &BTreeSet<String>, clusters: &[(String, bool)]) -> Scope {
    let mut s = Scope::default();
    for (name, reachable) in clusters {
        if placed.contains(name) {
            s.must.insert(name.clone());
        } else if *reachable {
            s.sweep.insert(name.clone());
        }
    }
    s
}

/// The failures of a cleanup's member work (`results`, one per member of `scope`): those of the
/// members that must be clean, with why; a sweep member's failure is only logged.
pub fn failures<E: std::fmt::Display>(
    who: &str,
    scope: &Scope,
    results: impl IntoIterator<Item = (String, Result<usize, E>)>,
) -> BTreeMap<String, String> {
    let mut failed = BTreeMap::new();
    for (cluster, result) in results {
        match result {
            Err(e) if scope.must.contains(&cluster) => {
                failed.insert(cluster, e.to_string());
            }
            Err(e) => tracing::debug!(object = %who, %cluster, "cleanup on deletion skipped: {e}"),
            Ok(_) => {}
        }
    }
    failed
}

/// The error a blocked deletion returns (retried with back-off): each blocking member and why.
pub fn blocked_error(blocked: &BTreeMap<String, String>) -> Error {
    let which: Vec<String> = blocked.iter().map(|(c, why)| format!("{c}: {why}")).collect();
    Error::Cleanup(which.join("; "))
}

/// What to do with the finalizer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every member that must be clean is: remove the finalizer.
    Release,
    /// Some are not, and the deployment says to let go: remove the finalizer, leaving them.
    Orphan(BTreeMap<String, String>),
    /// Some are not: keep the finalizer and say which, and why.
    Wait(BTreeMap<String, String>),
}

/// The verdict from the members that must be clean but could not be cleaned (with why), and
/// whether the deployment is annotated to orphan on unreachable members.
pub fn decide(failed: BTreeMap<String, String>, orphan: bool) -> Verdict {
    match (failed.is_empty(), orphan) {
        (true, _) => Verdict::Release,
        (false, true) => Verdict::Orphan(failed),
        (false, false) => Verdict::Wait(failed),
    }
}

/// `Ready=False CleanupBlocked`, naming each member that holds `what` (`this deployment's
/// objects`, `this cache's volume and Jobs`) and cannot be reached, and what to do.
pub fn blocked_condition(what: &str, blocked: &BTreeMap<String, String>) -> Desired {
    let which: Vec<String> = blocked.iter().map(|(c, why)| format!("{c} ({why})")).collect();
    Desired::new(
        condition::READY,
        Status::False,
        reason::CLEANUP_BLOCKED,
        format!(
            "deletion waits: member(s) holding {what} cannot be reached: {}; bring them back, or annotate {}=true to \
             delete it and leave the objects there",
            which.join("; "),
            annotations::ORPHAN_ON_UNREACHABLE
        ),
    )
}

/// What a blocked ModelDeployment deletion waits for.
pub const DEPLOYMENT_OBJECTS: &str = "this deployment's objects";

/// Whether an object carries `flotilla.dev/orphan-on-unreachable: "true"`.
pub fn orphan_annotated(meta: &kube::api::ObjectMeta) -> bool {
    meta.annotations.as_ref().and_then(|a| a.get(annotations::ORPHAN_ON_UNREACHABLE)).is_some_and(|v| v == "true")
}

/// Whether the cluster's status says its member answered at the last poll.
pub fn reachable(ic: &InferenceCluster) -> bool {
    ic.status.as_ref().is_some_and(|s| s.conditions.is_true(condition::REACHABLE))
}

async fn prune_in(ctx: &DeploymentContext, ic: &InferenceCluster, md: &ModelDeployment) -> Result<usize, String> {
    let member = ctx.members.handle(&ctx.client, ic, ctx.config.timeouts).await.map_err(|e| e.to_string())?;
    let t = ctx.config.timeouts.observe;
    // Bounded twice: a cache's first sync or a list, and the deletions.
    match tokio::time::timeout(t * 2, members::prune(&member, md, &ctx.config.install_id, &[], t)).await {
        Ok(Ok(n)) => Ok(n),
        Ok(Err(e)) => Err(brief(&e)),
        Err(_) => Err("did not answer in time".into()),
    }
}

/// The finalizer's cleanup: prune the scope's members concurrently, then act on the verdict.
pub async fn cleanup(md: Arc<ModelDeployment>, ctx: Arc<DeploymentContext>) -> Result<Action, Error> {
    let who = super::trigger::namespaced_key(md.as_ref());
    ctx.apply_failures.keep_only(&who, []);
    let placed: BTreeSet<String> =
        md.status.iter().flat_map(|s| s.placements.iter()).map(|p| p.cluster.clone()).collect();
    let clusters = ctx.clusters.state();
    let facts: Vec<(String, bool)> = clusters.iter().map(|c| (c.name_any(), reachable(c))).collect();
    let scope = scope(&placed, &facts);
    let work = clusters
        .iter()
        .filter(|c| scope.must.contains(&c.name_any()) || scope.sweep.contains(&c.name_any()))
        .map(|ic| {
            let (ctx, md) = (&ctx, &md);
            async move { (ic.name_any(), prune_in(ctx, ic, md).await) }
        });
    let failed = failures(&who, &scope, futures_util::future::join_all(work).await);
    match decide(failed, orphan_annotated(&md.metadata)) {
        Verdict::Release => {
            tracing::info!(deployment = %who, clusters = ?scope.must, "member workloads removed");
            Ok(Action::await_change())
        }
        Verdict::Orphan(left) => {
            tracing::warn!(deployment = %who, members = ?left.keys().collect::<Vec<_>>(),
                "deleted with {}: its objects stay in unreachable members until the sweep finds them",
                annotations::ORPHAN_ON_UNREACHABLE);
            Ok(Action::await_change())
        }
        Verdict::Wait(blocked) => {
            let current = md.status.clone().unwrap_or_default();
            let mut next = current.clone();
            next.conditions.0 = merge(
                &current.conditions.0,
                &[blocked_condition(DEPLOYMENT_OBJECTS, &blocked)],
                md.metadata.generation,
                &Time(Timestamp::now()),
            );
            write_status(&ctx, &md, md.status.as_ref(), md.resource_version(), &next).await?;
            Err(blocked_error(&blocked))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn cleanup_touches_its_placements_and_sweeps_only_reachable_others() {
        let clusters = [("eu1".to_string(), true), ("eu2".into(), false), ("us1".into(), false), ("us2".into(), true)];
        let s = scope(&set(&["eu1", "eu2", "gone"]), &clusters);
        assert_eq!(s.must, set(&["eu1", "eu2"]), "placements, reachable or not; a deleted cluster is not waited for");
        assert_eq!(s.sweep, set(&["us2"]), "an unreachable member that never ran it is not touched");
        let s = scope(&BTreeSet::new(), &clusters);
        assert!(s.must.is_empty(), "never placed: nothing to wait for");
    }

    #[test]
    fn only_members_that_must_be_clean_hold_the_finalizer_until_the_annotation_lets_go() {
        assert_eq!(decide(BTreeMap::new(), false), Verdict::Release);
        let failed: BTreeMap<String, String> = [("eu2".to_string(), "connection failed".to_string())].into();
        assert_eq!(decide(failed.clone(), false), Verdict::Wait(failed.clone()));
        assert_eq!(decide(failed.clone(), true), Verdict::Orphan(failed.clone()));
        let c = blocked_condition(DEPLOYMENT_OBJECTS, &failed);
        assert_eq!((c.type_, c.status, c.reason), (condition::READY, Status::False, reason::CLEANUP_BLOCKED));
        assert!(c.message.contains("eu2 (connection failed)"), "{}", c.message);
        assert!(c.message.contains("flotilla.dev/orphan-on-unreachable=true"), "{}", c.message);
    }

    #[test]
    fn the_annotation_must_say_true() {
        let mut meta = kube::api::ObjectMeta::default();
        assert!(!orphan_annotated(&meta));
        meta.annotations = Some([(annotations::ORPHAN_ON_UNREACHABLE.to_string(), "yes".to_string())].into());
        assert!(!orphan_annotated(&meta));
        meta.annotations = Some([(annotations::ORPHAN_ON_UNREACHABLE.to_string(), "true".to_string())].into());
        assert!(orphan_annotated(&meta));
    }
}
