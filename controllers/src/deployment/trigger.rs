//! The fleet trigger of the ModelDeployment controller. Every change of an input of the fleet
//! plan (an InferenceCluster, InferenceClass, ModelCache, ModelDeployment or FleetQuota) ticks it; after a
//! quiet moment (`debounce`, a burst is one pass) it solves the fleet once (`SolveOnce`, on a
//! blocking thread) and sends the deployments `wake::to_wake` names to the controller
//! (`Controller::reconcile_on`, through a bounded channel; the controller's scheduler merges
//! repeats). Nothing else reconciles deployments besides their own changes and their
//! periodic requeue. The facts the rule compares come from [`Facts`], fed by the reflectors.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use flotilla_apis::constants::condition;
use flotilla_apis::{InferenceClass, InferenceCluster, ModelCache};
use flotilla_placement::plan::DeploymentPlan;
use futures_util::{FutureExt, Stream, StreamExt};
use kube::ResourceExt;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::Event;

use super::digest::Part;
use super::wake::{Changed, Changes, DeploymentKey, Watched, Why, to_wake};
use super::{DeploymentContext, ModelDeployment};
use crate::metrics::Wake;

/// What a reconcile reads of an InferenceCluster besides the plan: whether it is being
/// deleted, its `Reachable` and `Ready` condition statuses, whether it publishes DRA devices,
/// the member Gateway its routes go to.
/// Capacity figures and the heartbeat are not in it (they move the plan, or nothing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterFact {
    deleting: bool,
    reachable: Option<String>,
    ready: Option<String>,
    dra: Option<bool>,
    gateway: Option<flotilla_apis::cluster::GatewayRef>,
}

/// What a reconcile reads of a ModelCache (its `cacheRef`'s or an adapter's): `spec.digest` and,
/// per cluster, the phase, the digest observed there and a failure's reason.
pub type CacheFact = super::adapters::AdapterCache;

/// What a reconcile reads of an InferenceClass: its spec (by generation).
pub type ClassFact = Option<i64>;

/// The fact of a cluster.
pub fn cluster_fact(ic: &InferenceCluster) -> ClusterFact {
    let cond = |t: &str| ic.status.as_ref()?.conditions.get(t).map(|c| c.status.clone());
    ClusterFact {
        deleting: ic.metadata.deletion_timestamp.is_some(),
        reachable: cond(condition::REACHABLE),
        ready: cond(condition::READY),
        dra: ic.status.as_ref().and_then(|s| s.dra),
        gateway: ic.spec.gateway_ref.clone(),
    }
}

/// The fact of a cache.
pub fn cache_fact(c: &ModelCache) -> CacheFact {
    super::adapters::AdapterCache::of(c)
}

/// The fact of a class.
pub fn class_fact(c: &InferenceClass) -> ClassFact {
    c.metadata.generation
}

/// `namespace/name` of a namespaced object.
pub fn namespaced_key<K: kube::Resource>(k: &K) -> String {
    format!("{}/{}", k.namespace().unwrap_or_default(), k.name_any())
}

/// The changes of the facts, one tracker per kind, fed by the reflectors' events.
#[derive(Clone, Default)]
pub struct Facts {
    /// InferenceClusters, by name.
    pub clusters: Arc<Changes<ClusterFact>>,
    /// ModelCaches, by `namespace/name`.
    pub caches: Arc<Changes<CacheFact>>,
    /// InferenceClasses, by name.
    pub classes: Arc<Changes<ClassFact>>,
    /// What the plan reads of all four kinds (`digest.rs`), for `DeploymentContext::solve`.
    pub digest: Arc<super::digest::Digest>,
}

impl Facts {
    /// Takes in an InferenceCluster watch event.
    pub fn cluster_event(&self, e: &Event<InferenceCluster>) {
        self.clusters.event(e, |k| k.name_any(), cluster_fact);
        self.digest.event(Part::Cluster, e, |o| super::meta_seen(&o.metadata));
    }

    /// Takes in a ModelCache watch event.
    pub fn cache_event(&self, e: &Event<ModelCache>) {
        self.caches.event(e, namespaced_key, cache_fact);
        self.digest.event(Part::Cache, e, |o| super::meta_seen(&o.metadata));
    }

    /// Takes in an InferenceClass watch event.
    pub fn class_event(&self, e: &Event<InferenceClass>) {
        self.classes.event(e, |k| k.name_any(), class_fact);
        self.digest.event(Part::Class, e, |o| super::meta_seen(&o.metadata));
    }

    /// Takes in a ModelDeployment watch event.
    pub fn deployment_event(&self, e: &Event<ModelDeployment>) {
        self.digest.event(Part::Deployment, e, super::deployment_seen);
    }

    /// Takes in a FleetQuota watch event: its spec and deletion (not its status, which the
    /// controller writes from the plan).
    pub fn quota_event(&self, e: &Event<flotilla_apis::FleetQuota>) {
        self.digest.event(Part::Quota, e, |q| super::spec_seen(&q.metadata));
    }

    /// The changes since the last call.
    fn take(&self) -> Changed {
        Changed { clusters: self.clusters.take(), caches: self.caches.take(), classes: self.classes.take() }
    }
}

/// Runs the trigger until `ticks` ends or the controller stops taking wake-ups. Changes seen
/// before the call are dropped: the controller's first pass reconciles every deployment anyway.
pub async fn run(
    ctx: Arc<DeploymentContext>,
    facts: Facts,
    ticks: impl Stream<Item = ()> + Send,
    wake: tokio::sync::mpsc::Sender<ObjectRef<ModelDeployment>>,
    debounce: Duration,
) {
    let _ = facts.take();
    // The quotas' status once at the start: a quiet fleet ticks nothing.
    if !ctx.quotas.state().is_empty()
        && let Ok((_, plan)) = ctx.solve(None).await
    {
        write_quotas(&ctx, &plan).await;
    }
    let mut ticks = std::pin::pin!(ticks);
    while ticks.next().await.is_some() {
        tokio::time::sleep(debounce).await;
        // Every change ticked so far is in the stores now; a change after this drain ticks again.
        while let Some(Some(())) = ticks.next().now_or_never() {}
        let changed = facts.take();
        let (seq, plan) = loop {
            match ctx.solve(None).await {
                Ok(p) => break p,
                Err(e) => {
                    tracing::warn!("fleet solve failed ({e}); trying again in 5 s");
                    tokio::time::sleep(Duration::from_secs(5)).await;
                }
            }
        };
        ctx.metrics.fleet_pass();
        write_quotas(&ctx, &plan).await;
        let deployments = ctx.deployments.state();
        let live: HashSet<DeploymentKey> =
            deployments.iter().map(|d| (d.namespace().unwrap_or_default(), d.name_any())).collect();
        let plan_changed = ctx.acted.changed(seq, &plan, &live);
        let watched: Vec<Watched> =
            if changed.clusters.is_empty() && changed.caches.is_empty() && changed.classes.is_empty() {
                Vec::new()
            } else {
                let entries: HashMap<(&str, &str), &DeploymentPlan> =
                    plan.deployments.iter().map(|d| ((d.namespace.as_str(), d.name.as_str()), d)).collect();
                deployments.iter().map(|d| watched(d, &entries)).collect()
            };
        let woken = to_wake(&watched, &plan_changed, &changed);
        if !woken.is_empty() {
            tracing::debug!(deployments = woken.len(), plan = seq, "fleet change: waking deployments");
        }
        for ((ns, name), why) in woken {
            ctx.metrics.woken(match why {
                Why::PlanChanged => Wake::PlanChanged,
                Why::CacheChanged => Wake::CacheChanged,
                Why::ClusterChanged => Wake::ClusterChanged,
                Why::ClassChanged => Wake::ClassChanged,
            });
            if wake.send(ObjectRef::new(&name).within(&ns)).await.is_err() {
                return;
            }
        }
    }
}

/// Writes what `plan` uses of each FleetQuota to its status (`crate::quota`).
async fn write_quotas(ctx: &DeploymentContext, plan: &flotilla_placement::Plan) {
    let quotas = ctx.quotas.state();
    if quotas.is_empty() {
        return;
    }
    let classes = ctx.classes.state().iter().map(|c| c.name_any()).collect();
    crate::quota::write_all(&ctx.client, &quotas, &classes, plan).await;
}

/// What the wake rule reads of a deployment: its caches (`cacheRef` and the adapters') and the
/// (cluster, class) of its status placements and of its plan entry.
fn watched(d: &ModelDeployment, plan: &HashMap<(&str, &str), &DeploymentPlan>) -> Watched {
    let ns = d.namespace().unwrap_or_default();
    let name = d.name_any();
    let mut uses: Vec<(String, String)> =
        d.status.iter().flat_map(|s| s.placements.iter()).map(|p| (p.cluster.clone(), p.class.clone())).collect();
    if let Some(entry) = plan.get(&(ns.as_str(), name.as_str())) {
        uses.extend(entry.assignments.iter().map(|a| (a.cluster.clone(), a.class.clone())));
    }
    let caches = d.spec.model.cache_ref.iter().chain(d.spec.adapters.iter().map(|a| &a.cache_ref));
    Watched { caches: caches.map(|c| format!("{ns}/{c}")).collect(), key: (ns, name), uses }
}
