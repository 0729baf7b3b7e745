//! Deleting a ModelCache. Its volume claim, staging Jobs and credentials copy exist only in
//! members its status lists (`status.clusters`: every target it was staged in, kept there until
//! its objects were removed), so only those must be cleaned; every other member that is
//! Reachable is cleaned by label too, best effort, and an unreachable member that never held
//! the cache holds nothing up (objects written in a member whose status entry was never
//! written are found by the periodic sweep). Decide (pure, [`scope`] and the verdict shared
//! with ModelDeployments, `deployment::cleanup`): while a deployment mounts the cache
//! somewhere, deletion waits (`Ready=False`, `InUse`); otherwise the finalizer goes once every
//! member that must be cleaned was, or when the cache is annotated
//! `flotilla.dev/orphan-on-unreachable=true`; until then `Ready=False`, `CleanupBlocked`
//! names the members and the annotation.

use std::collections::BTreeSet;
use std::sync::Arc;

use flotilla_apis::cache::ClusterCacheStatus;
use flotilla_apis::conditions::merge;
use flotilla_apis::constants::annotations;
use flotilla_apis::{InferenceCluster, ModelCache};
use kube::ResourceExt;
use kube::runtime::controller::Action;

use super::{CacheContext, now, remove_in, status, write_status};
use crate::Error;
use crate::deployment::cleanup::{
    Scope, Verdict, blocked_condition, blocked_error, decide, failures, orphan_annotated, reachable,
};

/// Which members the deletion of a cache touches: `held` are the clusters in its status,
/// `in_use` those where a deployment still mounts it (left alone), `clusters` every
/// InferenceCluster with whether its status says it is Reachable.
pub fn scope(held: &BTreeSet<String>, in_use: &BTreeSet<String>, clusters: &[(String, bool)]) -> Scope {
    let others: Vec<(String, bool)> = clusters.iter().filter(|(c, _)| !in_use.contains(c)).cloned().collect();
    crate::deployment::cleanup::scope(held, &others)
}

/// What a blocked ModelCache deletion waits for (`deployment::cleanup::blocked_condition`).
const CACHE_OBJECTS: &str = "this cache's volume and Jobs";

/// The finalizer's cleanup: wait for deployments that mount the cache, remove its objects in
/// the scope's members concurrently, then act on the verdict.
pub async fn cleanup(cache: Arc<ModelCache>, ctx: &CacheContext) -> Result<Action, Error> {
    let who = format!("{}/{}", cache.namespace().unwrap_or_default(), cache.name_any());
    let deployments = ctx.live_deployments();
    let dep_refs: Vec<&flotilla_apis::ModelDeployment> = deployments.iter().map(AsRef::as_ref).collect();
    let clusters = ctx.clusters.state();
    let cluster_refs: Vec<&InferenceCluster> = clusters.iter().map(AsRef::as_ref).collect();
    let users = status::users(&cache, &dep_refs, &cluster_refs);
    let held: BTreeSet<String> = cache.status.iter().flat_map(|s| &s.clusters).map(|c| c.cluster.clone()).collect();
    let facts: Vec<(String, bool)> = clusters.iter().map(|c| (c.name_any(), reachable(c))).collect();
    let in_use: BTreeSet<String> = users.keys().cloned().collect();
    let scope = scope(&held, &in_use, &facts);
    let work = clusters
        .iter()
        .filter(|c| scope.must.contains(&c.name_any()) || scope.sweep.contains(&c.name_any()))
        .map(|ic| {
            let (cache, clusters) = (&cache, &clusters);
            async move { (ic.name_any(), remove_in(ctx, cache, clusters, &ic.name_any()).await) }
        });
    let failed = failures(&who, &scope, futures_util::future::join_all(work).await);
    if !users.is_empty() {
        let kept: Vec<ClusterCacheStatus> = cache
            .status
            .iter()
            .flat_map(|s| s.clusters.iter())
            .filter(|c| users.contains_key(&c.cluster))
            .cloned()
            .collect();
        let targets: BTreeSet<String> = kept.iter().map(|c| c.cluster.clone()).collect();
        let next = status::desired(&cache, &targets, kept, Some(&users), &now());
        write_status(ctx, &cache, next).await?;
        let by: BTreeSet<&String> = users.values().flatten().collect();
        return Err(Error::Cleanup(format!("in use by {by:?}")));
    }
    match decide(failed, orphan_annotated(&cache.metadata)) {
        Verdict::Release => {
            tracing::info!(cache = %who, clusters = ?scope.must, "member volumes and Jobs removed");
            Ok(Action::await_change())
        }
        Verdict::Orphan(left) => {
            tracing::warn!(cache = %who, members = ?left.keys().collect::<Vec<_>>(),
                "deleted with {}: its volumes and Jobs stay in unreachable members until the sweep finds them",
                annotations::ORPHAN_ON_UNREACHABLE);
            Ok(Action::await_change())
        }
        Verdict::Wait(blocked) => {
            let mut next = cache.status.clone().unwrap_or_default();
            next.conditions.0 = merge(
                &next.conditions.0,
                &[blocked_condition(CACHE_OBJECTS, &blocked)],
                cache.metadata.generation,
                &now(),
            );
            write_status(ctx, &cache, next).await?;
            Err(blocked_error(&blocked))
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use flotilla_apis::conditions::Status;
    use flotilla_apis::constants::{condition, reason};

    fn set(names: &[&str]) -> BTreeSet<String> {
        names.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn only_members_that_held_the_cache_are_waited_for() {
        // eu1 held it and is reachable, eu2 held it and is not; us1 never held it and is
        // unreachable (the demo fleet's five unreachable clusters); us2 is reachable.
        let clusters = [("eu1".to_string(), true), ("eu2".into(), false), ("us1".into(), false), ("us2".into(), true)];
        let s = scope(&set(&["eu1", "eu2", "gone"]), &BTreeSet::new(), &clusters);
        assert_eq!(s.must, set(&["eu1", "eu2"]), "held, reachable or not; a deleted cluster is not waited for");
        assert_eq!(s.sweep, set(&["us2"]), "an unreachable member that never held it is not touched");
        let s = scope(&BTreeSet::new(), &BTreeSet::new(), &clusters);
        assert!(s.must.is_empty(), "never staged anywhere: nothing to wait for");
    }

    #[test]
    fn members_where_a_deployment_mounts_it_are_left_alone() {
        let clusters = [("eu1".to_string(), true), ("eu2".into(), true)];
        let s = scope(&set(&["eu1", "eu2"]), &set(&["eu1"]), &clusters);
        assert_eq!(s.must, set(&["eu2"]));
        assert!(s.sweep.is_empty(), "eu1 is in use: not even swept");
    }

    #[test]
    fn the_blocked_condition_names_the_member_and_the_annotation() {
        let failed: BTreeMap<String, String> = [("eu2".to_string(), "connection refused".to_string())].into();
        assert_eq!(decide(failed.clone(), false), Verdict::Wait(failed.clone()));
        assert_eq!(decide(failed.clone(), true), Verdict::Orphan(failed.clone()));
        let c = blocked_condition(CACHE_OBJECTS, &failed);
        assert_eq!((c.type_, c.status, c.reason), (condition::READY, Status::False, reason::CLEANUP_BLOCKED));
        assert!(c.message.contains("eu2 (connection refused)"), "{}", c.message);
        assert!(c.message.contains("flotilla.dev/orphan-on-unreachable=true"), "{}", c.message);
    }
}
