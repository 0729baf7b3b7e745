use std::collections::BTreeMap;

use serde_json::json;

use super::*;

fn class() -> BTreeMap<String, InferenceClassSpec> {
    let spec: InferenceClassSpec = serde_json::from_value(json!({
        "device": {"driver": "gpu.nvidia.com",
                   "attributes": {"productName": {"string": "NVIDIA H100 80GB HBM3"}},
                   "capacity": {"memory": "80Gi"}},
        "devicesPerNode": 8
    }))
    .unwrap();
    [("h100".to_string(), spec)].into_iter().collect()
}

fn pools() -> Vec<NodePool> {
    serde_json::from_value(json!([{"name": "h100", "class": "h100", "maxNodes": 4, "capacityTypes": ["on-demand"]}]))
        .unwrap()
}

fn node(name: &str, pool: &str, ready: bool, gpus: Option<&str>) -> Node {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"flotilla.dev/pool": pool}},
        "status": {
            "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
            "allocatable": gpus.map(|g| json!({"nvidia.com/gpu": g})).unwrap_or(json!({}))
        }
    }))
    .unwrap()
}

fn slice(node: &str, product: &str, n: usize) -> ResourceSlice {
    let devices: Vec<_> = (0..n)
        .map(|i| json!({"name": format!("gpu-{i}"), "attributes": {"productName": {"string": product}}, "capacity": {"memory": {"value": "80Gi"}}}))
        .collect();
    serde_json::from_value(json!({
        "metadata": {"name": format!("{node}-gpu")},
        "spec": {"driver": "gpu.nvidia.com", "nodeName": node, "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "devices": devices}
    }))
    .unwrap()
}

fn pod(node: &str, gpus: &str, phase: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": format!("p-{node}-{gpus}")},
        "spec": {"nodeName": node, "containers": [{"name": "c", "resources": {"requests": {"nvidia.com/gpu": gpus}}}]},
        "status": {"phase": phase}
    }))
    .unwrap()
}

#[test]
fn extended_resource_nodes_are_counted_with_pod_requests() {
    let seen = MemberObservation {
        nodes: vec![
            node("n1", "h100", true, Some("8")),
            node("n2", "h100", true, Some("8")),
            node("n3", "h100", false, Some("8")),
        ],
        pods: vec![pod("n1", "4", "Running"), pod("n2", "8", "Succeeded")],
        ..Default::default()
    };
    let inv = observe(&pools(), &class(), &seen);
    assert_eq!(inv.pools[0].nodes, 2, "the not-ready node does not count");
    assert_eq!(inv.pools[0].devices_total, 16);
    assert_eq!(inv.pools[0].devices_allocated, 4, "finished pods free their devices");
    assert_eq!(inv.pools[0].devices_free, 12);
    assert!(inv.empty_pools.is_empty());
    assert!(!inv.dra, "no ResourceSlices: the extended resource");
}

#[test]
fn dra_slices_count_only_devices_matching_the_class() {
    let seen = MemberObservation {
        nodes: vec![node("n1", "h100", true, None)],
        slices: vec![slice("n1", "NVIDIA H100 80GB HBM3", 8), slice("n1", "NVIDIA A100-SXM4-80GB", 2)],
        ..Default::default()
    };
    let inv = observe(&pools(), &class(), &seen);
    assert_eq!(inv.pools[0].devices_total, 8, "the A100 devices are not this class");
    assert!(inv.dra, "devices found through ResourceSlices");
}

#[test]
fn nodes_of_other_pools_and_empty_pools() {
    let seen = MemberObservation { nodes: vec![node("n1", "other", true, Some("8"))], ..Default::default() };
    let inv = observe(&pools(), &class(), &seen);
    assert_eq!(inv.pools[0].nodes, 0);
    assert_eq!(inv.empty_pools, vec!["h100".to_string()]);
}

#[test]
fn devices_held_by_flotilla_replicas_are_counted_apart() {
    let mut mine = pod("n1", "4", "Running");
    mine.metadata.labels = Some([("app.kubernetes.io/managed-by".to_string(), "flotilla".to_string())].into());
    let seen = MemberObservation {
        nodes: vec![node("n1", "h100", true, Some("8"))],
        pods: vec![mine, pod("n1", "2", "Pending")],
        ..Default::default()
    };
    let inv = observe(&pools(), &class(), &seen);
    assert_eq!(inv.pools[0].devices_allocated, 6);
    assert_eq!(inv.pools[0].devices_managed, 4, "only the Flotilla pod's devices");
}

#[test]
fn nodes_a_claim_obtained_are_reserved_for_it_and_not_counted_as_the_pools() {
    let mut claimed = node("c1", "h100", true, Some("8"));
    claimed.spec = serde_json::from_value(json!({"taints": [
        {"key": "flotilla.dev/claim", "value": "ml.big", "effect": "NoSchedule"}]}))
    .unwrap();
    let mut other = node("c2", "h100", true, Some("8"));
    other.spec = serde_json::from_value(json!({"taints": [
        {"key": "flotilla.dev/claim", "value": "ml.big", "effect": "NoSchedule"}]}))
    .unwrap();
    let seen = MemberObservation {
        nodes: vec![node("n1", "h100", true, Some("8")), claimed, other],
        pods: vec![pod("c1", "8", "Running"), pod("n1", "2", "Running")],
        ..Default::default()
    };
    let inv = observe(&pools(), &class(), &seen);
    let p = &inv.pools[0];
    assert_eq!((p.nodes, p.devices_total, p.devices_free), (1, 8, 6), "the claim's nodes are not the pool's");
    assert_eq!(p.reserved.len(), 1);
    let r = &p.reserved[0];
    assert_eq!((r.claim.as_str(), r.nodes, r.devices_total, r.devices_allocated), ("ml.big", 2, 16, 8));
    assert_eq!(inv.total(), 8, "free and total figures are the shared pool's");

    // Only reserved nodes: the pool is not empty.
    let seen = MemberObservation { nodes: seen.nodes[1..].to_vec(), ..Default::default() };
    assert!(observe(&pools(), &class(), &seen).empty_pools.is_empty());
}

fn bar(free: i32, managed: i32, nodes: i32) -> flotilla_apis::cluster::NodeDevices {
    flotilla_apis::cluster::NodeDevices { free, managed, nodes }
}

/// The breakdown adds up to the pool's totals, as validation and the snapshot require.
fn adds_up(p: &PoolStatus) -> Vec<String> {
    flotilla_apis::cluster::node_devices_problems(
        &p.node_devices,
        ("nodes", p.nodes.into()),
        ("devicesFree", p.devices_free),
        ("devicesManaged", p.devices_managed),
    )
}

#[test]
fn two_nodes_with_four_of_eight_used_each_are_two_nodes_with_four_free() {
    let seen = MemberObservation {
        nodes: vec![node("n1", "h100", true, Some("8")), node("n2", "h100", true, Some("8"))],
        pods: vec![pod("n1", "4", "Running"), pod("n2", "4", "Running")],
        ..Default::default()
    };
    let p = &observe(&pools(), &class(), &seen).pools[0];
    assert_eq!(p.devices_free, 8);
    assert_eq!(p.node_devices, [bar(4, 0, 2)], "not one full node and one empty");
    assert!(adds_up(p).is_empty(), "{:?}", adds_up(p));

    // Twin, same totals: all 8 used on one node.
    let seen = MemberObservation { pods: vec![pod("n1", "8", "Running")], ..seen };
    let p = &observe(&pools(), &class(), &seen).pools[0];
    assert_eq!(p.devices_free, 8);
    assert_eq!(p.node_devices, [bar(0, 0, 1), bar(8, 0, 1)]);
}

fn claim(name: &str, pool: &str, devices: usize, flotilla: bool) -> ResourceClaim {
    let results: Vec<_> = (0..devices)
        .map(|i| json!({"request": "gpu", "driver": "gpu.nvidia.com", "pool": pool, "device": format!("gpu-{i}")}))
        .collect();
    let labels = if flotilla { json!({"app.kubernetes.io/managed-by": "flotilla"}) } else { json!({}) };
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": labels},
        "spec": {},
        "status": {"allocation": {"devices": {"results": results}}}
    }))
    .unwrap()
}

#[test]
fn dra_claims_are_counted_on_the_node_whose_devices_they_hold() {
    let seen = MemberObservation {
        nodes: vec![node("n1", "h100", true, None), node("n2", "h100", true, None), node("n3", "h100", true, None)],
        slices: vec![
            slice("n1", "NVIDIA H100 80GB HBM3", 8),
            slice("n2", "NVIDIA H100 80GB HBM3", 8),
            slice("n3", "NVIDIA H100 80GB HBM3", 8),
        ],
        claims: vec![claim("mine", "n1", 4, true), claim("theirs", "n2", 2, false), claim("theirs-2", "n2", 2, false)],
        ..Default::default()
    };
    let p = &observe(&pools(), &class(), &seen).pools[0];
    assert_eq!((p.devices_allocated, p.devices_managed), (8, 4));
    assert_eq!(
        p.node_devices,
        [bar(4, 0, 1), bar(4, 4, 1), bar(8, 0, 1)],
        "n2: 4 free after others' claims; n1: 4 free and 4 Flotilla's; n3 untouched"
    );
    assert!(adds_up(p).is_empty(), "{:?}", adds_up(p));
}

#[test]
fn a_claims_nodes_have_their_own_breakdown() {
    let mut claimed = node("c1", "h100", true, Some("8"));
    claimed.spec = serde_json::from_value(json!({"taints": [
        {"key": "flotilla.dev/claim", "value": "ml.big", "effect": "NoSchedule"}]}))
    .unwrap();
    let mut mine = pod("c1", "8", "Running");
    mine.metadata.labels = Some([("app.kubernetes.io/managed-by".to_string(), "flotilla".to_string())].into());
    let seen = MemberObservation {
        nodes: vec![node("n1", "h100", true, Some("8")), claimed],
        pods: vec![mine, pod("n1", "2", "Running")],
        ..Default::default()
    };
    let p = &observe(&pools(), &class(), &seen).pools[0];
    assert_eq!(p.node_devices, [bar(6, 0, 1)], "the claim's node is not in the pool's breakdown");
    assert_eq!(p.reserved[0].node_devices, [bar(0, 8, 1)], "the claim's node, held by its owner's replica");
}
