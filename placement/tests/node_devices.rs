//! Per-node device accounting, end to end through the snapshot and the solver: a pool whose
//! status breaks its free devices down node by node (`nodeDevices`) takes a replica only where
//! one node has room for its largest pod. Each case has a twin with the same pool totals and
//! another per-node shape, which gives the other answer — so the tests fail when the snapshot
//! ignores the breakdown and packs the totals onto whole nodes.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers outside #[test] fns

use flotilla_apis::FleetObject;
use flotilla_placement::plan::{DeploymentPlan, Reason};
use flotilla_placement::{FleetSnapshot, SolveOptions, solve};
use serde_json::{Value, json};

fn class() -> FleetObject {
    FleetObject::Class(
        serde_json::from_value(json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceClass",
            "metadata": {"name": "h100"},
            "spec": {"device": {"driver": "gpu.nvidia.com"}, "devicesPerNode": 8,
                     "pricePerNodeHour": {"onDemand": "98.32"}}}))
        .unwrap(),
    )
}

/// A cluster with one pool of 8-device nodes and the given observed pool status.
fn cluster(pool_status: Value) -> FleetObject {
    FleetObject::Cluster(
        serde_json::from_value(json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceCluster",
            "metadata": {"name": "fra"},
            "spec": {"provider": {"sim": {"cloud": "t"}}, "region": "eu-central-1", "jurisdiction": "EU",
                     "pools": [{"name": "h100", "class": "h100", "maxNodes": 8, "capacityTypes": ["on-demand"]}]},
            "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "AsExpected", "message": "ok",
                                       "lastTransitionTime": "2026-11-29T10:00:00Z"}],
                       "pools": [pool_status]}}))
        .unwrap(),
    )
}

/// Two nodes of 8: `allocated` devices in use, `managed` of them by Flotilla's replicas, and the
/// per-node breakdown (absent when `None`).
fn two_nodes(allocated: i64, managed: i64, node_devices: Option<Value>) -> Value {
    let mut status = json!({"name": "h100", "class": "h100", "nodes": 2, "devicesTotal": 16,
        "devicesAllocated": allocated, "devicesFree": 16 - allocated, "devicesManaged": managed});
    if let Some(bars) = node_devices {
        status["nodeDevices"] = bars;
    }
    status
}

/// One tensor-parallel replica of 8 devices: all of one node.
fn tp8() -> FleetObject {
    FleetObject::Deployment(
        serde_json::from_value(json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": "llama-70b", "namespace": "ml"},
            "spec": {"model": {"name": "llama-70b", "source": "hf://org/model"}, "replicas": 1,
                     "engine": {"image": "vllm/vllm-openai:v0.11.0"},
                     "topology": {"type": "TensorParallel", "devicesPerReplica": 8},
                     "devices": {"alternatives": [{"class": "h100"}]}, "placement": {}}}))
        .unwrap(),
    )
}

fn plan_for(pool_status: Value) -> DeploymentPlan {
    let objects = [class(), cluster(pool_status), tp8()];
    let plan = solve(&FleetSnapshot::from_objects(&objects), &SolveOptions::default());
    plan.get("ml", "llama-70b").cloned().expect("the deployment is in the plan")
}

fn placed(p: &DeploymentPlan) -> u32 {
    p.assignments.iter().map(|a| a.replicas).sum()
}

#[test]
fn eight_free_split_four_and_four_over_two_nodes_do_not_take_a_tensor_parallel_8_replica() {
    let p = plan_for(two_nodes(8, 0, Some(json!([{"free": 4, "nodes": 2}]))));
    assert_eq!(placed(&p), 0, "no node has 8 free: {p:?}");
    assert!(p.assignments.is_empty(), "nothing assigned anywhere: {:?}", p.assignments);
    assert_eq!(p.unplaced, 1);
    let r = p.rejections.iter().find(|r| r.cluster == "fra").expect("fra is rejected with a reason");
    assert_eq!(r.reason, Reason::InsufficientDevices);
    assert!(
        r.message.contains("8 free on 2 node(s), but no node has 8 free (at most 4 on one node)"),
        "the reason says the devices are split: {}",
        r.message
    );
}

#[test]
fn twin_the_same_eight_free_on_one_node_take_it() {
    let p = plan_for(two_nodes(8, 0, Some(json!([{"free": 0, "nodes": 1}, {"free": 8, "nodes": 1}]))));
    assert_eq!(placed(&p), 1, "{p:?}");
    assert_eq!(p.unplaced, 0);
    assert!(p.rejections.is_empty(), "{:?}", p.rejections);
}

#[test]
fn without_a_breakdown_the_old_status_is_packed_onto_whole_nodes_as_before() {
    let p = plan_for(two_nodes(8, 0, None));
    assert_eq!(placed(&p), 1, "8 allocated are assumed to fill one node, leaving the other whole: {p:?}");
}

#[test]
fn devices_a_flotilla_replica_holds_on_a_node_count_as_free_on_that_node() {
    // Node A: 4 free and 4 held by a Flotilla replica (8 for the solver); node B: full of
    // someone else's pods.
    let here =
        plan_for(two_nodes(12, 4, Some(json!([{"free": 0, "nodes": 1}, {"free": 4, "managed": 4, "nodes": 1}]))));
    assert_eq!(placed(&here), 1, "{here:?}");
    // Twin, same totals: the Flotilla replica's 4 devices are on the node without the 4 free,
    // so each node offers 4 at most.
    let split =
        plan_for(two_nodes(12, 4, Some(json!([{"free": 0, "managed": 4, "nodes": 1}, {"free": 4, "nodes": 1}]))));
    assert_eq!(placed(&split), 0, "{split:?}");
    let r = split.rejections.iter().find(|r| r.cluster == "fra").expect("fra is rejected");
    assert!(r.message.contains("no node has 8 free"), "{}", r.message);
}

#[test]
fn a_breakdown_that_does_not_add_up_is_not_believed() {
    // Says one node has 8 free, but the pool reports only 4 free: the totals win (packed).
    let p = plan_for(two_nodes(12, 0, Some(json!([{"free": 0, "nodes": 1}, {"free": 8, "nodes": 1}]))));
    assert_eq!(placed(&p), 0, "{p:?}");
}

#[test]
fn a_claims_nodes_are_read_node_by_node_too() {
    let mut status = two_nodes(16, 0, None);
    status["devicesTotal"] = json!(0);
    status["devicesAllocated"] = json!(0);
    status["devicesFree"] = json!(0);
    status["nodes"] = json!(0);
    status["reserved"] = json!([{"claim": "ml.big", "nodes": 2, "devicesTotal": 16, "devicesAllocated": 8,
        "nodeDevices": [{"free": 4, "nodes": 2}]}]);
    let objects = [class(), cluster(status.clone())];
    let snap = FleetSnapshot::from_objects(&objects);
    let claimed = snap.clusters[0].pools.iter().find(|p| p.reserved_for.as_deref() == Some("ml.big")).unwrap();
    assert_eq!(claimed.free_per_node, [4, 4]);
    // Twin: without the breakdown the same totals are packed.
    status["reserved"][0].as_object_mut().unwrap().remove("nodeDevices");
    let objects = [class(), cluster(status)];
    let snap = FleetSnapshot::from_objects(&objects);
    let claimed = snap.clusters[0].pools.iter().find(|p| p.reserved_for.as_deref() == Some("ml.big")).unwrap();
    assert_eq!(claimed.free_per_node, [0, 8]);
}
