//! From what a member cluster shows — nodes, DRA `ResourceSlice`s, pods and `ResourceClaim`s —
//! to observed capacity per declared pool: ready nodes, devices (matched to the pool's class by
//! the class's device description), devices allocated, devices free, and the same node by
//! node (how many nodes have how many devices free and held by Flotilla), so that the solver
//! knows a pool with 8 free as 4 + 4 cannot hold an 8-device pod. Pure: the reconciler lists,
//! this decides.

use std::collections::{BTreeMap, BTreeSet};

use flotilla_apis::class::InferenceClassSpec;
use flotilla_apis::cluster::{NodePool, PoolStatus, ReservedCapacity, node_devices};
use flotilla_apis::common::DeviceAttribute;
use flotilla_apis::constants::labels;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::{DeviceAttribute as SliceAttribute, ResourceClaim, ResourceSlice};

/// The extended resource clusters without DRA publish GPUs as.
pub const GPU_RESOURCE: &str = "nvidia.com/gpu";

/// What was observed in one member.
#[derive(Clone, Debug, Default)]
pub struct MemberObservation {
    /// Nodes.
    pub nodes: Vec<Node>,
    /// ResourceSlices (empty when the member has no DRA).
    pub slices: Vec<ResourceSlice>,
    /// Pods that are not finished.
    pub pods: Vec<Pod>,
    /// Allocated ResourceClaims.
    pub claims: Vec<ResourceClaim>,
}

/// Observed capacity of every declared pool, and the pools no node matched.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Inventory {
    /// One entry per declared pool, in spec order.
    pub pools: Vec<PoolStatus>,
    /// Pools with no ready node.
    pub empty_pools: Vec<String>,
    /// Whether the devices were found as DRA devices (ResourceSlices) — then workloads ask for
    /// them with ResourceClaims — rather than as the `nvidia.com/gpu` extended resource.
    pub dra: bool,
}

impl Inventory {
    /// Devices over all pools.
    pub fn total(&self) -> i64 {
        self.pools.iter().map(|p| p.devices_total).sum()
    }

    /// Free devices over all pools.
    pub fn free(&self) -> i64 {
        self.pools.iter().map(|p| p.devices_free).sum()
    }
}

fn node_ready(node: &Node) -> bool {
    let schedulable = !node.spec.as_ref().and_then(|s| s.unschedulable).unwrap_or(false);
    let ready = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    schedulable && ready
}

fn attribute_equal(want: &DeviceAttribute, have: &SliceAttribute) -> bool {
    match (want, have) {
        (DeviceAttribute { string: Some(w), .. }, SliceAttribute { string: Some(h), .. }) => w == h,
        (DeviceAttribute { int: Some(w), .. }, SliceAttribute { int: Some(h), .. }) => w == h,
        (DeviceAttribute { bool: Some(w), .. }, SliceAttribute { bool: Some(h), .. }) => w == h,
        (DeviceAttribute { version: Some(w), .. }, SliceAttribute { version: Some(h), .. }) => w == h,
        _ => false,
    }
}

/// DRA devices on `node` that match the class's device description (driver and attributes).
fn dra_devices(class: &InferenceClassSpec, node: &str, slices: &[ResourceSlice]) -> Option<(i64, BTreeSet<String>)> {
    let mut found = false;
    let mut count = 0;
    let mut pools = BTreeSet::new();
    for slice in slices.iter().filter(|s| s.spec.node_name.as_deref() == Some(node)) {
        if slice.spec.driver != class.device.driver {
            continue;
        }
        found = true;
        for device in slice.spec.devices.iter().flatten() {
            let attrs = device.attributes.as_ref();
            let matches = class.device.identity_attributes().into_iter().all(|(name, want)| {
                let short = name.rsplit_once('/').map_or(name.as_str(), |(_, n)| n);
                attrs.and_then(|a| a.get(name).or_else(|| a.get(short))).is_some_and(|have| attribute_equal(want, have))
            });
            if matches {
                count += 1;
                pools.insert(slice.spec.pool.name.clone());
            }
        }
    }
    found.then_some((count, pools))
}

fn gpu_quantity(q: Option<&k8s_openapi::apimachinery::pkg::api::resource::Quantity>) -> i64 {
    q.and_then(|q| q.0.parse::<i64>().ok()).unwrap_or(0)
}

/// Whether Flotilla manages a pod (it carries Flotilla's managed-by label).
fn managed(p: &Pod) -> bool {
    p.metadata.labels.as_ref().and_then(|l| l.get(labels::MANAGED_BY)).is_some_and(|v| v == "flotilla")
}

/// Devices requested through the extended resource by pods on `node` (all, and Flotilla's).
fn pod_gpus(node: &str, pods: &[Pod]) -> (i64, i64) {
    (gpus_of(node, pods.iter()), gpus_of(node, pods.iter().filter(|p| managed(p))))
}

fn gpus_of<'a>(node: &str, pods: impl Iterator<Item = &'a Pod>) -> i64 {
    pods.filter(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .filter(|p| !matches!(p.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Succeeded" | "Failed")))
        .flat_map(|p| p.spec.iter().flat_map(|s| s.containers.iter()))
        .map(|c| {
            let r = c.resources.as_ref();
            let req = r.and_then(|r| r.requests.as_ref()).and_then(|m| m.get(GPU_RESOURCE));
            let lim = r.and_then(|r| r.limits.as_ref()).and_then(|m| m.get(GPU_RESOURCE));
            gpu_quantity(req.or(lim))
        })
        .sum()
}

/// Devices allocated through DRA claims from the given driver pools (all, and Flotilla's:
/// claims made from Flotilla's templates carry its managed-by label).
fn claimed(driver: &str, pools: &BTreeSet<String>, claims: &[ResourceClaim]) -> (i64, i64) {
    let count = |mine: bool| {
        claims
            .iter()
            .filter(|c| {
                !mine
                    || c.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(labels::MANAGED_BY))
                        .is_some_and(|v| v == "flotilla")
            })
            .filter_map(|c| c.status.as_ref()?.allocation.as_ref()?.devices.as_ref())
            .flat_map(|d| d.results.iter().flatten())
            .filter(|r| r.driver == driver && pools.contains(&r.pool))
            .count() as i64
    };
    (count(false), count(true))
}

/// The claim a node is set aside for: its `flotilla.dev/claim=<namespace>.<name>:NoSchedule`
/// taint (what the CapacityClaim controller asks providers to put on the nodes it obtains).
fn reserved_for(node: &Node) -> Option<String> {
    node.spec
        .as_ref()?
        .taints
        .as_ref()?
        .iter()
        .find(|t| t.key == labels::CLAIM && t.effect == "NoSchedule")
        .map(|t| t.value.clone().unwrap_or_default())
}

fn clamp_i32(n: i64) -> i32 {
    i32::try_from(n.max(0)).unwrap_or(i32::MAX)
}

/// Observed capacity for every declared pool, with the per-node breakdown (`nodeDevices`) of
/// the shared nodes and of each claim's nodes.
pub fn observe(
    pools: &[NodePool],
    classes: &BTreeMap<String, InferenceClassSpec>,
    seen: &MemberObservation,
) -> Inventory {
    let mut out = Inventory::default();
    for pool in pools {
        let mut status = PoolStatus { name: pool.name.clone(), class: pool.class.clone(), ..Default::default() };
        let class = classes.get(&pool.class);
        // (free, managed) of every ready node, by the claim it is set aside for (`None`: shared).
        let mut per_node: BTreeMap<Option<String>, Vec<(i32, i32)>> = BTreeMap::new();
        for node in seen
            .nodes
            .iter()
            .filter(|n| n.metadata.labels.as_ref().and_then(|l| l.get(labels::POOL)).is_some_and(|p| *p == pool.name))
        {
            if !node_ready(node) {
                continue;
            }
            let name = node.metadata.name.as_deref().unwrap_or("");
            let (pods_all, pods_mine) = pod_gpus(name, &seen.pods);
            let (devices, allocated, mine) =
                match class.and_then(|c| dra_devices(c, name, &seen.slices).map(|d| (c, d))) {
                    Some((c, (devices, driver_pools))) => {
                        out.dra |= devices > 0;
                        let (claims_all, claims_mine) = claimed(&c.device.driver, &driver_pools, &seen.claims);
                        (devices, pods_all + claims_all, pods_mine + claims_mine)
                    }
                    None => {
                        let alloc =
                            node.status.as_ref().and_then(|s| s.allocatable.as_ref()).and_then(|a| a.get(GPU_RESOURCE));
                        (gpu_quantity(alloc), pods_all, pods_mine)
                    }
                };
            let (allocated, mine) = (allocated.min(devices), mine.min(devices));
            // A claim's nodes are counted for the claim, the rest for the pool.
            let claim = reserved_for(node);
            let shape = (clamp_i32(devices - allocated), clamp_i32(mine));
            per_node.entry(claim.clone()).or_default().push(shape);
            let (nodes, total, alloc, managed) = match claim {
                Some(claim) => {
                    let at = match status.reserved.iter().position(|r| r.claim == claim) {
                        Some(i) => i,
                        None => {
                            status.reserved.push(ReservedCapacity { claim, ..Default::default() });
                            status.reserved.len() - 1
                        }
                    };
                    let r = &mut status.reserved[at];
                    (&mut r.nodes, &mut r.devices_total, &mut r.devices_allocated, &mut r.devices_managed)
                }
                None => (
                    &mut status.nodes,
                    &mut status.devices_total,
                    &mut status.devices_allocated,
                    &mut status.devices_managed,
                ),
            };
            *nodes += 1;
            *total += devices;
            *alloc += allocated;
            *managed += mine;
        }
        status.devices_free = status.devices_total - status.devices_allocated;
        for (claim, shapes) in per_node {
            let bars = node_devices(shapes);
            match claim {
                None => status.node_devices = bars,
                Some(claim) => {
                    if let Some(r) = status.reserved.iter_mut().find(|r| r.claim == claim) {
                        r.node_devices = bars;
                    }
                }
            }
        }
        status.reserved.sort_by(|a, b| a.claim.cmp(&b.claim));
        if status.nodes == 0 && status.reserved.is_empty() {
            out.empty_pools.push(pool.name.clone());
        }
        out.pools.push(status);
    }
    out
}

#[cfg(test)]
#[path = "inventory_tests.rs"]
mod tests;
