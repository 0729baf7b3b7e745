//! Crowded fleets for the solver's quality benchmark: few, small pools (1–4 nodes of 8 or 4
//! devices, some already partly allocated), many TP8, TP4 and two-node replicas beside 1–2-device
//! ones, 1–3 alternatives in a drawn order, tight cost ceilings and three priority tiers. These
//! are the fleets where the order deployments are taken in decides how many fit (issue #37); the
//! benchmark fleets of [`crate::generate`] are roomy and rarely show it. Deterministic like
//! [`crate::generate`]: one seed, one fleet; cluster `i` and deployment `i` each from their own
//! stream.

use std::collections::BTreeMap;

use flotilla_apis::cluster::{ClusterCredentials, ClusterProvider, NodePool, SimCluster};
use flotilla_apis::common::{JurisdictionCode, SecretRef};
use flotilla_apis::deployment::{
    DeviceAlternative, ModelSource, PlacementPolicy, Spread, SpreadDomain, Topology, TopologyType,
};
use flotilla_apis::{CapacityType, FleetObject, InferenceCluster, InferenceClusterSpec, ModelDeployment};

use crate::generate::{CLASSES, GenSpec, Rng, alt, cluster_status, model_deployment, objects_of, sov_policy, topology};
use crate::snapshot::FleetSnapshot;

/// The crowded fleet's objects: classes, then clusters, then deployments.
pub fn generate_crowded_objects(spec: &GenSpec) -> Vec<FleetObject> {
    objects_of(spec, cluster, deployment)
}

/// The crowded fleet's snapshot, as the solver sees it.
pub fn generate_crowded(spec: &GenSpec) -> FleetSnapshot {
    FleetSnapshot::from_objects(&generate_crowded_objects(spec))
}

/// Big-device classes the crowded pools are drawn from (8 per node), and one 4-per-node class.
const BIG: [&str; 3] = ["h200-141g", "h100-sxm-80g", "a100-sxm-80g"];
const SMALL: &str = "l40s-48g";

/// (jurisdiction, region, zones): two jurisdictions, so sovereignty narrows the choice.
const REGIONS: [(&str, &str, u32); 4] =
    [("EU", "eu-central-1", 3), ("EU", "eu-west-1", 3), ("US", "us-east-1", 3), ("US", "us-west-2", 3)];

fn cluster(seed: u64, index: usize, classes: &[&'static str]) -> InferenceCluster {
    let mut rng = Rng::stream(seed, 12, index as u64);
    let &(jurisdiction, region, zone_count) = rng.pick(&REGIONS);
    let name = format!("k{index:03}-{region}");
    let zone = format!("{region}{}", (b'a' + rng.range(0, zone_count - 1) as u8) as char);
    let mut pools: Vec<NodePool> = Vec::new();
    for _ in 0..rng.range(1, 3) {
        let class = if rng.chance(75) { *rng.pick(&BIG) } else { SMALL };
        let class = if classes.contains(&class) { class } else { "h100-sxm-80g" };
        let caps: &[CapacityType] = match rng.range(0, 3) {
            0 => &[CapacityType::Reserved],
            1 => &[CapacityType::OnDemand],
            2 => &[CapacityType::Reserved, CapacityType::OnDemand],
            _ => &[CapacityType::Spot],
        };
        let short = class.split('-').next().unwrap_or(class);
        let pool_name = if caps[0] == CapacityType::Spot { format!("{short}-spot") } else { short.to_string() };
        if pools.iter().any(|p| p.name == pool_name) {
            continue;
        }
        let nodes = rng.range(1, 4) as i32;
        pools.push(NodePool {
            name: pool_name,
            class: class.into(),
            min_nodes: 0,
            max_nodes: nodes,
            nodes: Some(nodes),
            capacity_types: caps.to_vec(),
            reservation_ids: vec![],
        });
    }
    let mut status = cluster_status(true, &pools, &mut rng);
    // Less allocation than the benchmark fleets (0–25 %): crowded by demand, not by neighbours.
    for (p, pool) in status.pools.iter_mut().zip(&pools) {
        let per_node = CLASSES.iter().find(|row| row.0 == pool.class).map_or(8, |row| row.8);
        p.nodes = pool.nodes.unwrap_or(0);
        p.devices_total = i64::from(p.nodes) * i64::from(per_node);
        p.devices_allocated = p.devices_total * i64::from(rng.range(0, 25)) / 100;
        p.devices_free = p.devices_total - p.devices_allocated;
    }
    let spec = InferenceClusterSpec {
        provider: ClusterProvider { aws: None, static_: None, sim: Some(SimCluster { cloud: "simcloud".into() }) },
        region: region.into(),
        zones: vec![zone],
        jurisdiction: JurisdictionCode(jurisdiction.into()),
        country: None,
        credentials: Some(ClusterCredentials {
            secret_ref: SecretRef {
                namespace: Some("flotilla-system".into()),
                name: format!("{name}-kubeconfig"),
                key: None,
            },
        }),
        cluster_profile_ref: None,
        endpoint: Some(format!("https://inference.{name}.example.com")),
        pools,
        taints: vec![],
        cordoned: false,
        cache_storage_class_name: None,
        deletion_policy: None,
        endpoint_auth: None,
        gateway_ref: None,
    };
    let mut c = InferenceCluster::new(&name, spec);
    c.metadata.labels = Some(BTreeMap::from([("flotilla.dev/env".to_string(), "prod".to_string())]));
    c.status = Some(status);
    c
}

/// On-demand $ per device-hour of a class (the ceiling's yardstick).
fn dollars_per_device(class: &str) -> f64 {
    CLASSES
        .iter()
        .find(|row| row.0 == class)
        .map_or(10.0, |row| row.9[1].parse::<f64>().unwrap_or(80.0) / f64::from(row.8))
}

/// A replica shape and the classes it may use, in a drawn order (1–3 alternatives).
fn shape(rng: &mut Rng, classes: &[&str]) -> (&'static str, Topology, Vec<&'static str>, (u32, u32)) {
    let big: Vec<&'static str> = BIG.iter().copied().filter(|c| classes.contains(c)).collect();
    let tp = |n| topology(TopologyType::TensorParallel, n, None, vec![]);
    let (name, topo, pool, replicas): (&'static str, Topology, Vec<&'static str>, (u32, u32)) = match rng.range(0, 99) {
        0..=34 => ("tp8", tp(8), big.clone(), (1, 3)),
        35..=49 => ("two-node", topology(TopologyType::MultiNode, 8, Some(2), vec![]), big.clone(), (1, 2)),
        50..=64 => ("tp4", tp(4), [big.as_slice(), &[SMALL]].concat(), (1, 4)),
        65..=82 => ("tp2", tp(2), [big.as_slice(), &[SMALL]].concat(), (1, 6)),
        _ => ("one", topology(TopologyType::Standalone, 1, None, vec![]), [big.as_slice(), &[SMALL]].concat(), (2, 8)),
    };
    // 1–3 of the usable classes, in a drawn order.
    let mut choices = pool;
    let mut picked = Vec::new();
    for _ in 0..rng.range(1, 3) {
        if choices.is_empty() {
            break;
        }
        let i = (rng.range(0, choices.len() as u32 - 1)) as usize;
        picked.push(choices.remove(i));
    }
    (name, topo, picked, replicas)
}

fn deployment(seed: u64, index: usize, classes: &[&'static str]) -> ModelDeployment {
    let mut rng = Rng::stream(seed, 13, index as u64);
    let (shape_name, topology, picked, (lo, hi)) = shape(&mut rng, classes);
    let replicas = rng.range(lo, hi);
    let mut alternatives: Vec<DeviceAlternative> = picked.iter().map(|c| alt(Some(c), &[])).collect();
    if alternatives.len() > 1 && rng.chance(30) {
        alternatives[0].max_replicas = Some(rng.range(1, replicas.max(1)) as i32);
    }
    let mut p = PlacementPolicy::default();
    if rng.chance(30) {
        p.sovereignty = Some(sov_policy(&["EU"], &[], &[]));
    }
    if rng.chance(20) {
        p.spread = Some(Spread { by: SpreadDomain::Cluster, max_skew: 1 });
    }
    p.capacity_types = match rng.range(0, 3) {
        0 => vec![CapacityType::Reserved, CapacityType::OnDemand],
        1 => vec![CapacityType::Spot, CapacityType::Reserved, CapacityType::OnDemand],
        _ => vec![],
    };
    if rng.chance(50) {
        // A tight ceiling: 60–110 % of the replicas on the cheapest alternative at on-demand.
        let cheapest = picked.iter().map(|c| dollars_per_device(c)).fold(f64::INFINITY, f64::min);
        let devices = f64::from(topology.devices_per_replica_total() * replicas.max(1));
        let cents = (devices * cheapest * 100.0 * f64::from(rng.range(60, 110)) / 100.0).round() as u64;
        p.max_cost_per_hour = Some(format!("{}.{:02}", cents / 100, cents % 100));
    }
    p.priority = Some(*rng.pick(&[500, 100, 0]));
    let model = ModelSource {
        name: format!("{shape_name}-model-{index}"),
        aliases: vec![],
        source: format!("hf://example/{shape_name}"),
        cache_ref: None,
    };
    let namespace = ["team-a", "team-b"][index % 2];
    model_deployment((namespace, &format!("{shape_name}-{index:04}")), model, replicas, topology, alternatives, p)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crowded_fleets_are_deterministic_and_crowded() {
        let spec = GenSpec { clusters: 6, deployments: 20, seed: 3 };
        assert_eq!(format!("{:?}", generate_crowded(&spec)), format!("{:?}", generate_crowded(&spec)));
        let snap = generate_crowded(&spec);
        for c in &snap.clusters {
            for p in &c.pools {
                assert!((1..=4).contains(&p.free_per_node.len()), "{}/{}: {:?}", c.name, p.name, p.free_per_node);
            }
        }
        // More devices asked for than the fleet has free: the plan cannot place everything.
        let free: u64 =
            snap.clusters.iter().flat_map(|c| &c.pools).flat_map(|p| &p.free_per_node).map(|&f| u64::from(f)).sum();
        let asked: u64 = snap
            .deployments
            .iter()
            .map(|d| u64::from(d.spec.topology.devices_per_replica_total()) * d.spec.replicas as u64)
            .sum();
        assert!(asked > free, "asked {asked} devices, {free} free");
    }
}
