//! The solver's input: a fleet snapshot of clusters (labels, region, jurisdiction, readiness,
//! taints, per-pool node capacity), classes (device descriptions, prices) and deployments
//! (spec, current placements). Built by the controller from its caches and by `fleetctl --live`
//! from the same objects read from the control cluster ([`FleetSnapshot::from_live`]), or
//! offline from YAML by [`FleetSnapshot::from_objects`].

use std::collections::{BTreeMap, BTreeSet};

use flotilla_apis::cache::CachePhase;
use flotilla_apis::class::InferenceClassSpec;
use flotilla_apis::cluster::{NodeDevices, node_devices_problems};
use flotilla_apis::common::{ClusterTaint, PricePerCapacityType};
use flotilla_apis::constants::condition;
use flotilla_apis::deployment::{ClusterPlacement, ModelDeploymentSpec, RefusedPool};
use flotilla_apis::quota::FleetQuotaSpec;
use flotilla_apis::{
    CapacityType, FleetObject, FleetQuota, InferenceClass, InferenceCluster, ModelCache, ModelDeployment,
};

/// Everything the solver looks at.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct FleetSnapshot {
    /// Member clusters.
    pub clusters: Vec<ClusterView>,
    /// Classes by name.
    pub classes: BTreeMap<String, ClassView>,
    /// Deployments to solve.
    pub deployments: Vec<DeploymentView>,
    /// FleetQuotas, in (namespace, name) order: hard limits on what each namespace's
    /// deployments hold placed together (`quota.rs`).
    pub quotas: Vec<QuotaView>,
}

/// A FleetQuota as the solver sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct QuotaView {
    /// Namespace it limits.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The spec.
    pub spec: FleetQuotaSpec,
}

impl QuotaView {
    /// Of a FleetQuota object.
    pub fn of(q: &FleetQuota) -> Self {
        QuotaView {
            namespace: q.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
            name: q.metadata.name.clone().unwrap_or_default(),
            spec: q.spec.clone(),
        }
    }
}

/// A member cluster as the solver sees it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ClusterView {
    /// Name.
    pub name: String,
    /// Labels the cluster selector matches (metadata labels plus `flotilla.dev/*` facts).
    pub labels: BTreeMap<String, String>,
    /// Region.
    pub region: String,
    /// Zones.
    pub zones: Vec<String>,
    /// Jurisdiction code.
    pub jurisdiction: String,
    /// Ready to take replicas.
    pub ready: bool,
    /// Why not, when not ready.
    pub not_ready_reason: Option<String>,
    /// No new replicas (existing stay).
    pub cordoned: bool,
    /// Taints.
    pub taints: Vec<ClusterTaint>,
    /// Pools.
    pub pools: Vec<PoolView>,
    /// ModelCaches (by [`cache_key`]) staged and verified here: deployments whose `cacheRef`
    /// names one of them prefer this cluster (no download before their replicas can start).
    pub ready_caches: BTreeSet<String>,
}

/// How a ModelCache is named in [`ClusterView::ready_caches`]: `<namespace>/<name>`.
pub fn cache_key(namespace: &str, name: &str) -> String {
    format!("{namespace}/{name}")
}

/// A node pool: nodes of one class and their free devices.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct PoolView {
    /// Pool name.
    pub name: String,
    /// Class name.
    pub class: String,
    /// The capacity type its current nodes are paid as.
    pub capacity_type: Option<CapacityType>,
    /// Free devices per ready node, after devices used by anything Flotilla does not manage.
    pub free_per_node: Vec<u32>,
    /// Set aside for one CapacityClaim (`<namespace>.<name>`): only the deployment of that
    /// namespace and name (the claim's owner) is placed here. A pool with claimed nodes appears
    /// once for its shared nodes and once per claim.
    pub reserved_for: Option<String>,
    /// The member's scheduler found no node here with this many devices free for a pod (a
    /// deployment's `status.refusedPools` entry with `devicesShort`, still backed off): no new
    /// replica whose pods need this many or more on one node is placed here, whatever the
    /// per-node figures say (they count Flotilla's own replicas as movable, while the
    /// scheduler packs them where it likes). Replicas running here stay.
    pub refused_block: Option<u32>,
}

impl PoolView {
    /// Capacity a claim obtained is its owner's alone: whether this pool is set aside for a
    /// claim other than `own_claim` (`<namespace>.<name>` of the deployment asking).
    pub fn reserved_for_another(&self, own_claim: &str) -> bool {
        self.reserved_for.as_deref().is_some_and(|k| k != own_claim)
    }
}

/// A class as the solver sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct ClassView {
    /// The spec.
    pub spec: InferenceClassSpec,
}

impl ClassView {
    /// Devices per node.
    pub fn devices_per_node(&self) -> u32 {
        self.spec.devices_per_node
    }

    /// Prices.
    pub fn prices(&self) -> &PricePerCapacityType {
        &self.spec.price_per_node_hour
    }
}

/// A deployment to solve.
#[derive(Clone, Debug, PartialEq)]
pub struct DeploymentView {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// Creation order key (seconds since the epoch, or document order offline).
    pub created: i64,
    /// The spec.
    pub spec: ModelDeploymentSpec,
    /// Where its replicas run now.
    pub current: Vec<ClusterPlacement>,
    /// Pools backed off after their member's scheduler refused its pods (`status.refusedPools`):
    /// no new replica of it goes there.
    pub refused_pools: Vec<RefusedPool>,
}

impl DeploymentView {
    /// `priority`, 0 when unset.
    pub fn priority(&self) -> i32 {
        self.spec.placement.priority.unwrap_or(0)
    }
}

/// Spreads `allocated` devices over `nodes` nodes of `per_node` devices, filling whole nodes
/// first (the shape an observed total most likely has), and returns free devices per node.
pub fn free_per_node(nodes: u32, per_node: u32, allocated: u64) -> Vec<u32> {
    let mut left = allocated;
    (0..nodes)
        .map(|_| {
            let used = left.min(u64::from(per_node)) as u32;
            left -= u64::from(used);
            per_node - used
        })
        .collect()
}

/// Devices a replica may use on each node of an observed per-node breakdown (`nodeDevices`):
/// what is free plus what Flotilla's own replicas hold, one entry per node, smallest first.
pub fn free_per_node_of(bars: &[NodeDevices]) -> Vec<u32> {
    let mut free: Vec<u32> = bars
        .iter()
        .flat_map(|b| std::iter::repeat_n((b.free.max(0) + b.managed.max(0)) as u32, b.nodes.max(0) as usize))
        .collect();
    free.sort_unstable();
    free
}

impl FleetSnapshot {
    /// A snapshot from fleet objects as committed in Git (or exported with their status).
    ///
    /// Capacity: a pool's observed status (`status.pools`) when present, else its declared
    /// `nodes` with nothing allocated, else no nodes. An observed pool's free devices per node
    /// come from its per-node breakdown (`nodeDevices`) when it has one that adds up to its
    /// totals; otherwise the allocated devices are assumed to fill whole nodes first.
    /// Readiness: the `Ready` condition when a status is present, else ready (a declared
    /// cluster is assumed up). Deployments keep the
    /// placements their status records, so that a re-plan is sticky; devices held by replicas
    /// Flotilla manages (`devicesManaged`) are counted free, since the solver places them anew.
    /// A ModelCache's status says in which clusters it is Ready (`ClusterView::ready_caches`).
    pub fn from_objects<'a>(objects: impl IntoIterator<Item = &'a FleetObject>) -> Self {
        Self::build(objects, Evidence::Declared)
    }

    fn build<'a>(objects: impl IntoIterator<Item = &'a FleetObject>, evidence: Evidence) -> Self {
        let mut snap = FleetSnapshot::default();
        let mut order = 0i64;
        let mut clusters = Vec::new();
        let mut ready_caches: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for obj in objects {
            match obj {
                FleetObject::Class(c) => {
                    snap.classes
                        .insert(c.metadata.name.clone().unwrap_or_default(), ClassView { spec: c.spec.clone() });
                }
                FleetObject::Cluster(c) => clusters.push(c),
                FleetObject::Deployment(d) => {
                    order += 1;
                    let created = d.metadata.creation_timestamp.as_ref().map_or(order, |t| t.0.as_second());
                    snap.deployments.push(DeploymentView {
                        namespace: d.metadata.namespace.clone().unwrap_or_else(|| "default".into()),
                        name: d.metadata.name.clone().unwrap_or_default(),
                        created,
                        spec: d.spec.clone(),
                        current: d.status.as_ref().map(|s| s.placements.clone()).unwrap_or_default(),
                        refused_pools: d.status.as_ref().map(|s| s.refused_pools.clone()).unwrap_or_default(),
                    });
                }
                FleetObject::Cache(c) => {
                    let key = cache_key(
                        c.metadata.namespace.as_deref().unwrap_or("default"),
                        c.metadata.name.as_deref().unwrap_or_default(),
                    );
                    let ready = c.status.iter().flat_map(|s| &s.clusters).filter(|s| s.phase == CachePhase::Ready);
                    for s in ready {
                        ready_caches.entry(s.cluster.clone()).or_default().insert(key.clone());
                    }
                }
                FleetObject::Claim(_) => {}
                FleetObject::Quota(q) => snap.quotas.push(QuotaView::of(q)),
            }
        }
        snap.quotas.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        for c in clusters {
            let mut view = cluster_view(c, &snap.classes, evidence);
            view.ready_caches = ready_caches.remove(&view.name).unwrap_or_default();
            snap.clusters.push(view);
        }
        snap.clusters.sort_by(|a, b| a.name.cmp(&b.name));
        refused_blocks(&mut snap);
        snap
    }
}

impl FleetSnapshot {
    /// A snapshot of a live fleet as read from the control cluster — what the ModelDeployment
    /// controller solves on every reconcile, and what `fleetctl plan --live` solves, so that
    /// both agree: every class and cluster (with its observed status), every ModelCache (where
    /// it is Ready), and every ModelDeployment not being deleted, in (namespace, name) order,
    /// with the placements its status records.
    ///
    /// Unlike [`FleetSnapshot::from_objects`], a live cluster whose status the controller has
    /// not written yet is not ready (`not observed yet`): replicas go only where a member was
    /// seen, never on a declared capacity nobody has observed.
    pub fn from_live(
        classes: impl IntoIterator<Item = InferenceClass>,
        clusters: impl IntoIterator<Item = InferenceCluster>,
        caches: impl IntoIterator<Item = ModelCache>,
        deployments: impl IntoIterator<Item = ModelDeployment>,
    ) -> Self {
        FleetSnapshot::build(live_objects(classes, clusters, caches, deployments).iter(), Evidence::Observed)
    }

    /// This snapshot with `quotas` (the live FleetQuotas; those being deleted no longer bind).
    pub fn with_quotas(mut self, quotas: impl IntoIterator<Item = FleetQuota>) -> Self {
        self.quotas =
            quotas.into_iter().filter(|q| q.metadata.deletion_timestamp.is_none()).map(|q| QuotaView::of(&q)).collect();
        self.quotas.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        self
    }
}

/// The objects [`FleetSnapshot::from_live`] solves, in its order: classes, clusters, caches,
/// then the ModelDeployments not being deleted, sorted by namespace and name.
pub fn live_objects(
    classes: impl IntoIterator<Item = InferenceClass>,
    clusters: impl IntoIterator<Item = InferenceCluster>,
    caches: impl IntoIterator<Item = ModelCache>,
    deployments: impl IntoIterator<Item = ModelDeployment>,
) -> Vec<FleetObject> {
    let mut objects: Vec<FleetObject> = classes.into_iter().map(FleetObject::Class).collect();
    objects.extend(clusters.into_iter().map(FleetObject::Cluster));
    objects.extend(caches.into_iter().map(FleetObject::Cache));
    let mut deps: Vec<ModelDeployment> =
        deployments.into_iter().filter(|d| d.metadata.deletion_timestamp.is_none()).collect();
    deps.sort_by(|a, b| (&a.metadata.namespace, &a.metadata.name).cmp(&(&b.metadata.namespace, &b.metadata.name)));
    objects.extend(deps.into_iter().map(FleetObject::Deployment));
    objects
}

pub use flotilla_apis::selector::cluster_labels;

/// Sets [`PoolView::refused_block`]: per pool, the smallest pod (devices on one node) that a
/// member's scheduler found no room for, over every deployment's backed-off `devicesShort`
/// refusal there. Every pool view of that name in the cluster (shared and reserved) gets it.
fn refused_blocks(snap: &mut FleetSnapshot) {
    let mut blocks: BTreeMap<(&str, &str), u32> = BTreeMap::new();
    for d in &snap.deployments {
        let pod = crate::devices::ReplicaShape::of(&d.spec.topology).largest_pod();
        for r in d.refused_pools.iter().filter(|r| r.devices_short && pod > 0) {
            let b = blocks.entry((r.cluster.as_str(), r.pool.as_str())).or_insert(pod);
            *b = (*b).min(pod);
        }
    }
    if blocks.is_empty() {
        return;
    }
    let blocks: BTreeMap<(String, String), u32> =
        blocks.into_iter().map(|((c, p), b)| ((c.to_string(), p.to_string()), b)).collect();
    for c in &mut snap.clusters {
        for p in &mut c.pools {
            p.refused_block = blocks.get(&(c.name.clone(), p.name.clone())).copied();
        }
    }
}

/// What a cluster without a status is taken to be.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Evidence {
    /// Files: a declared cluster is assumed up with its declared nodes (`fleetctl plan -f`).
    Declared,
    /// A live fleet: only what the controller observed counts.
    Observed,
}

/// Why a live cluster without a status takes no replicas.
pub const NOT_OBSERVED: &str = "not observed yet: the controller has not written this cluster's status";

fn cluster_view(c: &InferenceCluster, classes: &BTreeMap<String, ClassView>, evidence: Evidence) -> ClusterView {
    let name = c.metadata.name.clone().unwrap_or_default();
    let labels = cluster_labels(c);
    let (ready, not_ready_reason) = match &c.status {
        Some(s) if !s.conditions.0.is_empty() => match s.conditions.get(condition::READY) {
            Some(r) if r.status == "True" => (true, None),
            Some(r) => (false, Some(format!("{}: {}", r.reason, r.message))),
            None => (false, Some("no Ready condition yet".to_string())),
        },
        _ if evidence == Evidence::Observed => (false, Some(NOT_OBSERVED.to_string())),
        _ => (true, None),
    };
    let pools = c
        .spec
        .pools
        .iter()
        .flat_map(|p| {
            let per_node = classes.get(&p.class).map_or(0, ClassView::devices_per_node);
            let observed = c.status.as_ref().and_then(|s| s.pools.iter().find(|o| o.name == p.name));
            // Flotilla's own replicas are placed again by the solver: only devices held by
            // anything else are taken away. Node by node when the status says how (and adds
            // up), else packed onto whole nodes.
            let free = |nodes: i32, unallocated: i64, allocated: i64, managed: i64, bars: &[NodeDevices]| {
                let agrees =
                    node_devices_problems(bars, ("nodes", nodes.into()), ("free", unallocated), ("managed", managed))
                        .is_empty();
                if bars.is_empty() || !agrees {
                    return free_per_node(nodes.max(0) as u32, per_node, (allocated - managed).max(0) as u64);
                }
                free_per_node_of(bars)
            };
            let shared_free = match observed {
                Some(o) => free(o.nodes, o.devices_free, o.devices_allocated, o.devices_managed, &o.node_devices),
                None => free(p.nodes.unwrap_or(0), 0, 0, 0, &[]),
            };
            let shared = PoolView {
                name: p.name.clone(),
                class: p.class.clone(),
                capacity_type: p.capacity_types.first().copied(),
                free_per_node: shared_free,
                reserved_for: None,
                refused_block: None,
            };
            let reserved: Vec<PoolView> = observed
                .into_iter()
                .flat_map(|o| o.reserved.iter())
                .map(|r| PoolView {
                    reserved_for: Some(r.claim.clone()),
                    free_per_node: free(
                        r.nodes,
                        r.devices_total - r.devices_allocated,
                        r.devices_allocated,
                        r.devices_managed,
                        &r.node_devices,
                    ),
                    ..shared.clone()
                })
                .collect();
            std::iter::once(shared).chain(reserved)
        })
        .collect();
    ClusterView {
        name,
        labels,
        region: c.spec.region.clone(),
        zones: c.spec.zones.clone(),
        jurisdiction: c.spec.jurisdiction.0.clone(),
        ready,
        not_ready_reason,
        cordoned: c.spec.cordoned,
        taints: c.spec.taints.clone(),
        pools,
        ready_caches: BTreeSet::new(),
    }
}

#[cfg(test)]
mod tests {
    use flotilla_apis::{FleetObject, ModelDeployment};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

    use super::{free_per_node, live_objects};

    fn deployment(ns: &str, name: &str, deleting: bool) -> ModelDeployment {
        let mut md: ModelDeployment = serde_json::from_value(serde_json::json!({
            "apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"model": {"name": name, "source": "hf://org/model"}, "replicas": 1,
                     "engine": {"image": "vllm/vllm-openai:v0.11.0"},
                     "topology": {"type": "Standalone", "devicesPerReplica": 1},
                     "devices": {"alternatives": [{"class": "h100"}]}, "placement": {}}
        }))
        .unwrap();
        if deleting {
            md.metadata.deletion_timestamp = Some(Time(Default::default()));
        }
        md
    }

    #[test]
    fn live_objects_drop_deleting_deployments_and_sort_the_rest() {
        let deps = [
            deployment("ml", "b", false),
            deployment("a", "z", false),
            deployment("ml", "gone", true),
            deployment("ml", "a", false),
        ];
        let names: Vec<String> = live_objects([], [], [], deps)
            .iter()
            .map(|o| match o {
                FleetObject::Deployment(d) => {
                    format!("{}/{}", o.namespace().unwrap_or(""), d.metadata.name.clone().unwrap_or_default())
                }
                _ => String::new(),
            })
            .collect();
        assert_eq!(names, ["a/z", "ml/a", "ml/b"]);
    }

    #[test]
    fn a_pools_claimed_nodes_become_a_view_reserved_for_the_claim() {
        let class: flotilla_apis::InferenceClass = serde_json::from_value(serde_json::json!({
            "apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceClass", "metadata": {"name": "h100"},
            "spec": {"device": {"driver": "gpu.nvidia.com"}, "devicesPerNode": 8}}))
        .unwrap();
        let cluster: flotilla_apis::InferenceCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceCluster", "metadata": {"name": "eu2"},
            "spec": {"provider": {"sim": {"cloud": "x"}}, "region": "eu-west-3", "jurisdiction": "EU",
                     "pools": [{"name": "h100", "class": "h100", "maxNodes": 8, "capacityTypes": ["on-demand"]}]},
            "status": {"pools": [{"name": "h100", "class": "h100", "nodes": 1, "devicesTotal": 8,
                                  "devicesAllocated": 2, "devicesFree": 6,
                                  "reserved": [{"claim": "ml.big", "nodes": 2, "devicesTotal": 16,
                                                "devicesAllocated": 8, "devicesManaged": 8}]}]}}))
        .unwrap();
        let snap = super::FleetSnapshot::from_live([class], [cluster], [], []);
        let pools: Vec<_> = snap.clusters[0]
            .pools
            .iter()
            .map(|p| (p.name.as_str(), p.reserved_for.as_deref(), p.free_per_node.clone()))
            .collect();
        assert_eq!(
            pools,
            [("h100", None, vec![6]), ("h100", Some("ml.big"), vec![8, 8])],
            "the shared node has what others left; the claim's nodes count the owner's replicas as its own"
        );
    }

    #[test]
    fn a_live_cluster_nobody_observed_takes_nothing_while_files_assume_it_up() {
        let cluster: flotilla_apis::InferenceCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceCluster", "metadata": {"name": "new"},
            "spec": {"provider": {"sim": {"cloud": "x"}}, "region": "eu-west-3", "jurisdiction": "EU",
                     "pools": [{"name": "h100", "class": "h100", "nodes": 2, "maxNodes": 8, "capacityTypes": ["on-demand"]}]}}))
        .unwrap();
        let live = super::FleetSnapshot::from_live([], [cluster.clone()], [], []);
        assert!(!live.clusters[0].ready);
        assert_eq!(live.clusters[0].not_ready_reason.as_deref(), Some(super::NOT_OBSERVED));
        // Twin: the same object read from files is assumed up, as `fleetctl plan -f` documents.
        let files = super::FleetSnapshot::from_objects([&FleetObject::Cluster(cluster)]);
        assert!(files.clusters[0].ready);
    }

    #[test]
    fn a_devices_short_refusal_caps_the_pool_for_pods_as_large() {
        let objects: Vec<FleetObject> = vec![
            FleetObject::Class(serde_json::from_value(serde_json::json!({
                "apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceClass", "metadata": {"name": "h100"},
                "spec": {"device": {"driver": "gpu.nvidia.com"}, "devicesPerNode": 8}}))
            .unwrap()),
            FleetObject::Cluster(serde_json::from_value(serde_json::json!({
                "apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceCluster", "metadata": {"name": "eu1"},
                "spec": {"provider": {"sim": {"cloud": "x"}}, "region": "eu-west-3", "jurisdiction": "EU",
                         "pools": [{"name": "h100", "class": "h100", "nodes": 2, "maxNodes": 2, "capacityTypes": ["on-demand"]},
                                   {"name": "other", "class": "h100", "nodes": 2, "maxNodes": 2, "capacityTypes": ["on-demand"]}]}}))
            .unwrap()),
        ];
        let refusing = |name: &str, per_replica: u32, short: bool| {
            let mut md = deployment("ml", name, false);
            md.spec.topology =
                serde_json::from_value(serde_json::json!({"type": "TensorParallel", "devicesPerReplica": per_replica}))
                    .unwrap();
            md.status = Some(flotilla_apis::ModelDeploymentStatus {
                refused_pools: vec![flotilla_apis::deployment::RefusedPool {
                    cluster: "eu1".into(),
                    pool: "h100".into(),
                    retry_after: Time(Default::default()),
                    devices_short: short,
                    message: String::new(),
                }],
                ..Default::default()
            });
            FleetObject::Deployment(md)
        };
        let block = |deps: Vec<FleetObject>| {
            let all: Vec<FleetObject> = objects.iter().cloned().chain(deps).collect();
            let snap = super::FleetSnapshot::from_objects(all.iter());
            snap.clusters[0].pools.iter().map(|p| p.refused_block).collect::<Vec<_>>()
        };
        assert_eq!(
            block(vec![refusing("a", 4, true), refusing("b", 2, true)]),
            [Some(2), None],
            "the smallest pod refused"
        );
        assert_eq!(block(vec![refusing("a", 4, false)]), [None, None], "a taint or selector concerns one deployment");
        assert_eq!(block(vec![]), [None, None]);
    }

    #[test]
    fn allocation_fills_whole_nodes_first() {
        assert_eq!(free_per_node(4, 8, 10), vec![0, 6, 8, 8]);
        assert_eq!(free_per_node(2, 8, 0), vec![8, 8]);
        assert_eq!(free_per_node(2, 8, 99), vec![0, 0]);
        assert!(free_per_node(0, 8, 0).is_empty());
    }
}
