//! `fleetctl get` tables from fixed objects, as snapshots (insta): readiness, the CONDITIONS
//! column with reasons (Ready first, then what needs attention), the NAMESPACE column for all
//! namespaces, and `-o wide` with every condition's message and each deployment's unplaced
//! reasons. No cluster: the objects are what a control cluster would return.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use fleetctl::tables::{self, TableOptions};
use flotilla_apis::{CapacityClaim, InferenceClass, InferenceCluster, ModelCache, ModelDeployment};
use k8s_openapi::jiff::Timestamp;
use serde_json::json;

fn now() -> Timestamp {
    "2026-11-29T12:00:00Z".parse().unwrap()
}

fn opts(wide: bool, namespace_column: bool) -> TableOptions {
    TableOptions { wide, namespace_column, now: now() }
}

fn cond(type_: &str, status: &str, reason: &str, message: &str, at: &str) -> serde_json::Value {
    json!({"type": type_, "status": status, "reason": reason, "message": message, "lastTransitionTime": at})
}

fn clusters() -> Vec<InferenceCluster> {
    let spec = |region: &str, j: &str| {
        json!({"provider": {"sim": {"cloud": "t"}}, "region": region, "jurisdiction": j,
               "credentials": {"secretRef": {"namespace": "flotilla-system", "name": "k"}},
               "endpoint": "https://x.example.com", "pools": [{"name": "h100", "class": "h100", "maxNodes": 8, "capacityTypes": ["on-demand"]}]})
    };
    serde_json::from_value(json!([
        {"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceCluster",
         "metadata": {"name": "eu1", "creationTimestamp": "2026-11-29T10:00:00Z"}, "spec": spec("eu-central-1", "EU"),
         "status": {"conditions": [
             cond("Reachable", "True", "AsExpected", "the member answers (v1.36.3)", "2026-11-29T10:01:00Z"),
             cond("CapacityKnown", "True", "AsExpected", "1 pool observed", "2026-11-29T10:01:00Z"),
             cond("Ready", "True", "AsExpected", "reachable, capacity known", "2026-11-29T10:01:00Z")],
           "pools": [{"name": "h100", "class": "h100", "nodes": 3, "devicesTotal": 24, "devicesAllocated": 8, "devicesFree": 16, "devicesManaged": 8}],
           "devicesTotal": 24, "devicesFree": 16, "dra": true, "kubernetesVersion": "v1.36.3",
           "lastHeartbeat": "2026-11-29T11:59:30Z"}},
        {"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceCluster",
         "metadata": {"name": "eu2", "creationTimestamp": "2026-11-27T09:00:00Z"}, "spec": spec("eu-west-3", "EU"),
         "status": {"conditions": [
             cond("Reachable", "False", "Unreachable", "the member did not answer within 8 s", "2026-11-29T11:55:00Z"),
             cond("CapacityKnown", "Unknown", "Unreachable", "capacity unknown while unreachable", "2026-11-29T11:55:00Z"),
             cond("Ready", "False", "Unreachable", "the member did not answer within 8 s", "2026-11-29T11:55:00Z")]}},
        {"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceCluster",
         "metadata": {"name": "us1", "creationTimestamp": "2026-11-29T11:59:50Z"}, "spec": spec("us-east-1", "US")}
    ]))
    .unwrap()
}

fn deployments() -> Vec<ModelDeployment> {
    let spec = |replicas: i32| {
        json!({"model": {"name": "m", "source": "hf://org/m"}, "replicas": replicas, "engine": {"image": "vllm/vllm-openai:v0.11.0"},
               "topology": {"type": "TensorParallel", "devicesPerReplica": 4}, "devices": {"alternatives": [{"class": "h100"}]},
               "placement": {"sovereignty": {"allowedJurisdictions": ["EU"]}}})
    };
    serde_json::from_value(json!([
        {"apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelDeployment",
         "metadata": {"name": "eu-model", "namespace": "ml", "generation": 2, "creationTimestamp": "2026-11-29T10:05:00Z"}, "spec": spec(4),
         "status": {"observedGeneration": 2, "replicas": 4, "readyReplicas": 4, "clusters": "eu1:2/2,eu2:2/2",
           "placements": [
             {"cluster": "eu1", "pool": "h100", "class": "h100", "capacityType": "on-demand", "fallbackRank": 1, "desired": 2, "ready": 2},
             {"cluster": "eu2", "pool": "h100", "class": "h100", "capacityType": "on-demand", "fallbackRank": 1, "desired": 2, "ready": 2}],
           "conditions": [
             cond("Placed", "True", "Placed", "4 of 4 replicas placed", "2026-11-29T10:05:01Z"),
             cond("Ready", "True", "AllReplicasReady", "4 of 4 replicas ready", "2026-11-29T10:06:00Z"),
             cond("Degraded", "False", "AllReplicasReady", "4 of 4 replicas ready", "2026-11-29T10:06:00Z")]}},
        {"apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelDeployment",
         "metadata": {"name": "big", "namespace": "research", "generation": 3, "creationTimestamp": "2026-11-29T11:00:00Z"}, "spec": spec(12),
         "status": {"observedGeneration": 2, "replicas": 8, "readyReplicas": 6, "clusters": "eu1:4/6,eu2:2/2",
           "placements": [
             {"cluster": "eu1", "pool": "h100", "class": "h100", "capacityType": "on-demand", "fallbackRank": 1, "desired": 6, "ready": 4},
             {"cluster": "eu2", "pool": "h100", "class": "h100", "capacityType": "on-demand", "fallbackRank": 1, "desired": 2, "ready": 2}],
           "unplaced": {"replicas": 4, "reasons": [
             {"cluster": "eu1", "reason": "InsufficientDevices", "message": "needs 4 free devices on one node; pool h100 has 0 free (largest free on a node: 0)"},
             {"cluster": "us1", "reason": "JurisdictionNotAllowed", "message": "jurisdiction US is not in allowedJurisdictions [EU]"}]},
           "conditions": [
             cond("Placed", "False", "InsufficientCapacity", "8 of 12 replicas placed; eu1: needs 4 free devices", "2026-11-29T11:00:01Z"),
             cond("Ready", "False", "ReplicasNotReady", "6 of 12 replicas ready", "2026-11-29T11:00:01Z"),
             cond("Degraded", "True", "ReplicasNotReady", "6 of 12 replicas ready", "2026-11-29T11:02:00Z")]}},
        {"apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelDeployment",
         "metadata": {"name": "fresh", "namespace": "ml", "generation": 1, "creationTimestamp": "2026-11-29T11:59:58Z"}, "spec": spec(1)}
    ]))
    .unwrap()
}

#[test]
fn clusters_table() {
    insta::assert_snapshot!("clusters", tables::clusters(&clusters(), &opts(false, false)));
}

#[test]
fn clusters_wide() {
    insta::assert_snapshot!("clusters_wide", tables::clusters(&clusters(), &opts(true, false)));
}

#[test]
fn deployments_all_namespaces() {
    let text = tables::deployments(&deployments(), &opts(false, true));
    // The reasons a reader acts on are in the table itself, not only in -o wide.
    assert!(text.contains(
        "Ready=False(ReplicasNotReady), Placed=False(InsufficientCapacity), Degraded=True(ReplicasNotReady)"
    ));
    insta::assert_snapshot!("deployments_all_namespaces", text);
}

#[test]
fn deployments_wide() {
    let text = tables::deployments(&deployments(), &opts(true, false));
    assert!(
        text.contains("us1  JurisdictionNotAllowed  jurisdiction US is not in allowedJurisdictions [EU]"),
        "{text}"
    );
    insta::assert_snapshot!("deployments_wide", text);
}

#[test]
fn caches_claims_classes() {
    let caches: Vec<ModelCache> = serde_json::from_value(json!([
        {"apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelCache",
         "metadata": {"name": "llama-70b", "namespace": "ml", "creationTimestamp": "2026-11-28T12:00:00Z"},
         "spec": {"source": "hf://meta-llama/Llama-3.3-70B-Instruct", "revision": "main", "size": "140Gi",
                  "targets": {"deployments": ["llama-70b-eu"]}},
         "status": {"summary": "1/2 Ready", "clusters": [
             {"cluster": "eu1", "phase": "Ready", "bytes": 150_323_855_360_i64},
             {"cluster": "eu2", "phase": "Failed", "reason": "DigestMismatch", "message": "digest sha256:aa != sha256:bb"}],
           "conditions": [cond("Ready", "False", "DigestMismatch", "eu2: digest sha256:aa != sha256:bb", "2026-11-29T08:00:00Z")]}}
    ]))
    .unwrap();
    let claims: Vec<CapacityClaim> = serde_json::from_value(json!([
        {"apiVersion": "flotilla.dev/v1alpha1", "kind": "CapacityClaim",
         "metadata": {"name": "h200-eu", "namespace": "ml", "creationTimestamp": "2026-11-29T11:00:00Z"},
         "spec": {"podSets": [{"name": "replicas", "count": 2, "devicesPerPod": 4}],
                  "capacity": {"capacityTypes": ["reserved", "on-demand"], "deviceClasses": [{"class": "h200-141g"}]}},
         "status": {"devicesRequested": 8, "devicesObtained": 0,
           "attempts": [{"provider": "aws", "region": "eu-central-1", "class": "h200-141g", "capacityType": "reserved",
                         "result": "InsufficientCapacity", "message": "InsufficientInstanceCapacity"}],
           "conditions": [cond("Fulfilled", "False", "CapacityUnavailable", "no offering had capacity", "2026-11-29T11:01:00Z")]}}
    ]))
    .unwrap();
    let classes: Vec<InferenceClass> = serde_json::from_value(json!([
        {"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceClass",
         "metadata": {"name": "h100", "creationTimestamp": "2026-11-01T12:00:00Z"},
         "spec": {"device": {"driver": "gpu.nvidia.com", "attributes": {"productName": {"string": "NVIDIA H100 80GB HBM3"}}},
                  "devicesPerNode": 8, "provisioning": {"aws": {"instanceTypes": ["p5.48xlarge"]}},
                  "pricePerNodeHour": {"onDemand": "98.32", "spot": "39.00"}},
         "status": {"fleetDevices": 48, "conditions": [cond("Ready", "True", "AsExpected", "valid", "2026-11-01T12:00:01Z")]}}
    ]))
    .unwrap();
    let o = opts(false, false);
    let w = opts(true, false);
    let text = [
        tables::caches(&caches, &o),
        tables::caches(&caches, &w),
        tables::claims(&claims, &o),
        tables::claims(&claims, &w),
        tables::classes(&classes, &o),
        tables::classes(&classes, &w),
    ]
    .join("\n---\n");
    insta::assert_snapshot!("caches_claims_classes", text);
}

#[test]
fn ages_read_like_kubectl() {
    let cases = [(5, "5s"), (119, "119s"), (125, "2m5s"), (900, "15m"), (4 * 3600 + 120, "4h2m"), (20 * 3600, "20h")];
    for (s, want) in cases {
        assert_eq!(tables::human_age(s), want);
    }
    assert_eq!(tables::human_age(3 * 86_400 + 3600), "3d1h");
    assert_eq!(tables::human_age(30 * 86_400), "30d");
}
