//! Which ModelCaches a change of another kind concerns. A cache's targets and users are read
//! from InferenceClusters (labels, for `targets.clusterSelector`; spec; being deleted) and from
//! the ModelDeployments of its namespace (where they are placed, their `cacheRef`, parked at
//! zero, being deleted). The reflectors' events keep one fact per cluster and per deployment
//! ([`CacheFacts`]); a cluster's status moving (heartbeats, inventory) or a deployment's status
//! moving without its placements changing is no change. On each coalesced wake-up the trigger
//! ([`run`]) reconciles only the caches [`concerned`] names, never every cache of the fleet.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use flotilla_apis::{InferenceCluster, ModelCache, ModelDeployment};
use futures_util::{FutureExt, Stream, StreamExt};
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::runtime::watcher::Event;

use crate::deployment::trigger::namespaced_key;
use crate::deployment::wake::{Change, Changes};

/// What a cache reads of an InferenceCluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterInput {
    generation: Option<i64>,
    labels: BTreeMap<String, String>,
    deleting: bool,
}

/// What a cache reads of a ModelDeployment: its `cacheRef`, its adapters (their caches and
/// policies, and the deployment's sovereignty they narrow: where an adapter's cache stages),
/// where it is placed, parked at zero, being deleted.
#[derive(Clone, Debug, PartialEq)]
pub struct DeploymentInput {
    cache_ref: Option<String>,
    adapters: Vec<flotilla_apis::deployment::Adapter>,
    sovereignty: Option<flotilla_apis::common::Sovereignty>,
    placed: BTreeSet<String>,
    parked: bool,
    deleting: bool,
}

/// The input of a cluster.
pub fn cluster_input(ic: &InferenceCluster) -> ClusterInput {
    ClusterInput {
        generation: ic.metadata.generation,
        labels: ic.labels().clone(),
        deleting: ic.metadata.deletion_timestamp.is_some(),
    }
}

/// The input of a deployment.
pub fn deployment_input(d: &ModelDeployment) -> DeploymentInput {
    DeploymentInput {
        cache_ref: d.spec.model.cache_ref.clone(),
        adapters: d.spec.adapters.clone(),
        sovereignty: d.spec.placement.sovereignty.clone(),
        placed: super::status::placed_in(d),
        parked: super::status::parked_at_zero(d),
        deleting: d.metadata.deletion_timestamp.is_some(),
    }
}

/// The facts, fed by the reflectors' events.
#[derive(Clone, Default)]
pub struct CacheFacts {
    /// InferenceClusters, by name.
    pub clusters: Arc<Changes<ClusterInput>>,
    /// ModelDeployments, by `namespace/name`.
    pub deployments: Arc<Changes<DeploymentInput>>,
}

impl CacheFacts {
    /// Takes in an InferenceCluster watch event.
    pub fn cluster_event(&self, e: &Event<InferenceCluster>) {
        self.clusters.event(e, |c| c.name_any(), cluster_input);
    }

    /// Takes in a ModelDeployment watch event.
    pub fn deployment_event(&self, e: &Event<ModelDeployment>) {
        self.deployments.event(e, namespaced_key, deployment_input);
    }
}

/// The caches a set of changes concerns: for a cluster, every cache that selects clusters by
/// label and every cache whose status names it (so a cluster that an adapter's policy no longer
/// allows is cleared at once; one it newly allows is staged on the cache's next periodic look);
/// for a deployment, the caches of its namespace it references (`cacheRef` or an adapter's,
/// before or now) and those whose `targets.deployments` name it.
pub fn concerned(
    caches: &[Arc<ModelCache>],
    clusters: &[Change<ClusterInput>],
    deployments: &[Change<DeploymentInput>],
) -> Vec<ObjectRef<ModelCache>> {
    caches.iter().filter(|c| concerns(c, clusters, deployments)).map(|c| ObjectRef::from_obj(c.as_ref())).collect()
}

fn concerns(cache: &ModelCache, clusters: &[Change<ClusterInput>], deployments: &[Change<DeploymentInput>]) -> bool {
    let selects = cache.spec.targets.cluster_selector.is_some();
    let listed = |name: &str| cache.status.iter().flat_map(|s| &s.clusters).any(|c| c.cluster == name);
    if clusters.iter().any(|c| selects || listed(&c.key)) {
        return true;
    }
    let ns = cache.namespace().unwrap_or_default();
    let name = cache.name_any();
    deployments.iter().any(|d| {
        let Some((d_ns, d_name)) = d.key.split_once('/') else { return false };
        let refers = |i: &Option<DeploymentInput>| {
            i.as_ref().is_some_and(|i| {
                i.cache_ref.as_deref() == Some(&name) || i.adapters.iter().any(|a| a.cache_ref == name)
            })
        };
        d_ns == ns
            && (refers(&d.before) || refers(&d.now) || cache.spec.targets.deployments.iter().any(|t| t == d_name))
    })
}

/// Runs until `ticks` ends or the controller stops taking wake-ups: on each tick (a burst
/// coalesced), the caches the changes since the last tick concern are sent to the controller.
/// Changes before the call are dropped: the controller's first pass reconciles every cache.
pub async fn run(
    facts: CacheFacts,
    caches: Store<ModelCache>,
    ticks: impl Stream<Item = ()> + Send,
    wake: tokio::sync::mpsc::Sender<ObjectRef<ModelCache>>,
) {
    let _ = (facts.clusters.take(), facts.deployments.take());
    let mut ticks = std::pin::pin!(ticks);
    while ticks.next().await.is_some() {
        while let Some(Some(())) = ticks.next().now_or_never() {}
        let clusters = facts.clusters.take_changes();
        let deployments = facts.deployments.take_changes();
        if clusters.is_empty() && deployments.is_empty() {
            continue;
        }
        let woken = concerned(&caches.state(), &clusters, &deployments);
        if !woken.is_empty() {
            tracing::debug!(caches = woken.len(), "cluster or deployment change: waking caches");
        }
        for r in woken {
            if wake.send(r).await.is_err() {
                return;
            }
        }
    }
}

#[cfg(test)]
#[path = "wake_tests.rs"]
mod tests;
