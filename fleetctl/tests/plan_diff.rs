//! `plan --live` without a cluster: a fixed live fleet (clusters with observed capacity, a
//! class, deployments whose status records where their replicas run), files laid over it as
//! `fleetctl` does, the solver, and the rendered difference (insta). A converged fleet with no
//! files shows no change; each file change shows exactly the deployment it changes, with the
//! right numbers, added and removed clusters, and reasons for newly unplaced replicas.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use fleetctl::diff::{self, PlanDiff};
use fleetctl::overlay::{self, LiveFleet};
use flotilla_apis::document::parse_stream;
use flotilla_placement::{SolveOptions, solve};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

fn ready() -> Value {
    json!([{"type": "Ready", "status": "True", "reason": "AsExpected", "message": "ok", "lastTransitionTime": "2026-11-29T10:00:00Z"}])
}

fn cluster(name: &str, region: &str, j: &str, nodes: i32, allocated: i64, managed: i64) -> Value {
    json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceCluster",
        "metadata": {"name": name, "creationTimestamp": "2026-11-29T09:00:00Z"},
        "spec": {"provider": {"sim": {"cloud": "t"}}, "region": region, "jurisdiction": j,
                 "credentials": {"secretRef": {"namespace": "flotilla-system", "name": format!("{name}-kubeconfig")}},
                 "endpoint": "https://x.example.com",
                 "pools": [{"name": "h100", "class": "h100", "maxNodes": 8, "capacityTypes": ["on-demand"]}]},
        "status": {"conditions": ready(), "pools": [{"name": "h100", "class": "h100", "nodes": nodes,
                   "devicesTotal": nodes * 8, "devicesAllocated": allocated, "devicesFree": i64::from(nodes) * 8 - allocated,
                   "devicesManaged": managed}]}})
}

fn deployment(name: &str, replicas: i32, per_replica: u32, j: &str, placed: &[(&str, i32)], created: &str) -> Value {
    let placements: Vec<Value> = placed
        .iter()
        .map(|(c, n)| json!({"cluster": c, "pool": "h100", "class": "h100", "capacityType": "on-demand", "fallbackRank": 1, "desired": n, "ready": n}))
        .collect();
    json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelDeployment",
        "metadata": {"name": name, "namespace": "ml", "creationTimestamp": created, "generation": 1},
        "spec": {"model": {"name": name, "source": "hf://org/model"}, "replicas": replicas,
                 "engine": {"image": "vllm/vllm-openai:v0.11.0"},
                 "topology": {"type": if per_replica > 1 { "TensorParallel" } else { "Standalone" }, "devicesPerReplica": per_replica},
                 "devices": {"alternatives": [{"class": "h100"}]},
                 "placement": {"sovereignty": {"allowedJurisdictions": [j]}, "spread": {"by": "region", "maxSkew": 1}}},
        "status": {"replicas": replicas, "readyReplicas": replicas, "placements": placements}})
}

/// eu1 (3 nodes) and eu2 (1 node) in the EU, us1 (2 nodes) in the US; eu-model runs 2 + 2
/// tensor-parallel replicas in the EU, us-model 3 single-device replicas in us1.
fn live() -> LiveFleet {
    LiveFleet {
        classes: vec![serde_json::from_value(json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceClass",
            "metadata": {"name": "h100"},
            "spec": {"device": {"driver": "gpu.nvidia.com", "attributes": {"productName": {"string": "NVIDIA H100 80GB HBM3"}},
                                "capacity": {"memory": "80Gi"}},
                     "devicesPerNode": 8, "pricePerNodeHour": {"onDemand": "98.32"}}}))
        .unwrap()],
        clusters: [
            cluster("eu1", "eu-central-1", "EU", 3, 8, 8),
            cluster("eu2", "eu-west-3", "EU", 1, 8, 8),
            cluster("us1", "us-east-1", "US", 2, 3, 3),
        ]
        .into_iter()
        .map(|v| serde_json::from_value(v).unwrap())
        .collect(),
        deployments: [
            deployment("eu-model", 4, 4, "EU", &[("eu1", 2), ("eu2", 2)], "2026-11-29T10:00:00Z"),
            deployment("us-model", 3, 1, "US", &[("us1", 3)], "2026-11-29T10:01:00Z"),
        ]
        .into_iter()
        .map(|v| serde_json::from_value(v).unwrap())
        .collect(),
        ..Default::default()
    }
}

/// A file as a user would commit it: the live object's spec, edited.
fn file_of(name: &str, edit: impl FnOnce(&mut Value)) -> String {
    let mut v = match name {
        "eu-model" => deployment("eu-model", 4, 4, "EU", &[], ""),
        "us-model" => deployment("us-model", 3, 1, "US", &[], ""),
        other => deployment(other, 1, 1, "EU", &[], ""),
    };
    let obj = v.as_object_mut().unwrap();
    obj.remove("status");
    obj["metadata"] = json!({"name": name, "namespace": "ml"});
    edit(&mut v);
    serde_yaml_ng::to_string(&v).unwrap()
}

fn plan_over(files: &[String]) -> (PlanDiff, String, bool) {
    let live = live();
    let mut objects = Vec::new();
    for (i, text) in files.iter().enumerate() {
        let parsed = parse_stream(&format!("change-{i}.yaml"), text);
        assert!(parsed.problems.is_empty(), "{:?}", parsed.problems);
        objects.extend(parsed.objects);
    }
    let problems = overlay::validate_over(&live, &objects, &[]);
    assert!(overlay::errors(&problems).is_empty(), "{problems:?}");
    let over = overlay::overlay(&live, &objects, "2026-11-29T12:00:00Z".parse::<Timestamp>().unwrap());
    let plan = solve(&over.fleet.snapshot(), &SolveOptions::default());
    let d = diff::diff(&live.deployments, &plan);
    let text = diff::render(&d);
    (d, text, plan.fully_placed())
}

#[test]
fn a_converged_fleet_without_files_has_no_changes() {
    let (d, text, placed) = plan_over(&[]);
    assert!(d.changed.is_empty(), "{text}");
    assert_eq!(d.unchanged, 2);
    assert!(placed);
    assert_eq!(text, "No changes: all 2 deployment(s) keep their placement.\n");
}

#[test]
fn the_same_spec_from_a_file_changes_nothing() {
    let (d, text, _) = plan_over(&[file_of("eu-model", |_| {}), file_of("us-model", |_| {})]);
    assert!(d.changed.is_empty(), "{text}");
}

#[test]
fn more_replicas_show_as_a_change_of_that_deployment_only() {
    let (d, text, placed) = plan_over(&[file_of("eu-model", |v| v["spec"]["replicas"] = json!(6))]);
    assert!(placed);
    assert_eq!(d.changed.len(), 1, "{text}");
    assert_eq!(d.unchanged, 1);
    let eu = &d.changed[0];
    assert_eq!((eu.name.as_str(), eu.current_desired, eu.planned_desired), ("eu-model", 4, 6));
    let pools: Vec<(&str, u32, u32)> = eu.pools.iter().map(|p| (p.cluster.as_str(), p.current, p.planned)).collect();
    assert_eq!(pools, [("eu1", 2, 4), ("eu2", 2, 2)], "eu2 has room for 2 only; spread gives the rest to eu1");
    insta::assert_snapshot!("replicas_4_to_6", text);
}

#[test]
fn a_sovereignty_change_moves_a_deployment_between_clusters() {
    let (d, text, placed) = plan_over(&[file_of("us-model", |v| {
        v["spec"]["placement"]["sovereignty"]["allowedJurisdictions"] = json!(["EU"]);
    })]);
    assert!(placed);
    assert_eq!(d.changed.len(), 1, "{text}");
    let us = &d.changed[0];
    assert_eq!(us.name, "us-model");
    let pools: Vec<(&str, u32, u32, Option<&str>)> =
        us.pools.iter().map(|p| (p.cluster.as_str(), p.current, p.planned, p.cluster_change)).collect();
    assert_eq!(pools, [("eu1", 0, 3, Some("added")), ("us1", 3, 0, Some("removed"))], "{text}");
    insta::assert_snapshot!("sovereignty_us_to_eu", text);
}

#[test]
fn replicas_beyond_the_fleet_are_newly_unplaced_with_reasons() {
    let (d, text, placed) = plan_over(&[file_of("eu-model", |v| v["spec"]["replicas"] = json!(12))]);
    assert!(!placed, "exit code 2 follows");
    assert_eq!(d.changed.len(), 1, "{text}");
    let eu = &d.changed[0];
    assert_eq!((eu.current_unplaced, eu.planned_unplaced), (0, 4), "eu1 takes 6, eu2 2, of 12");
    assert!(eu.reasons.iter().any(|r| r.cluster == "us1" && r.reason == "JurisdictionNotAllowed"), "{text}");
    insta::assert_snapshot!("replicas_4_to_12_unplaced", text);
}

#[test]
fn a_deployment_only_in_the_files_is_new() {
    let (d, text, _) = plan_over(&[file_of("newcomer", |v| v["spec"]["replicas"] = json!(2))]);
    assert_eq!(d.changed.len(), 1, "{text}");
    assert!(d.changed[0].new);
    assert_eq!(d.changed[0].current_desired, 0);
    insta::assert_snapshot!("new_deployment", text);
}

#[test]
fn a_file_keeps_the_live_status_and_creation_time() {
    let live = live();
    let parsed = parse_stream("x.yaml", &file_of("eu-model", |v| v["spec"]["replicas"] = json!(6)));
    let over = overlay::overlay(&live, &parsed.objects, Timestamp::UNIX_EPOCH);
    let md = over.fleet.deployments.iter().find(|d| d.metadata.name.as_deref() == Some("eu-model")).unwrap();
    assert_eq!(md.spec.replicas, 6);
    assert_eq!(md.status.as_ref().unwrap().placements.len(), 2, "current placements keep the plan sticky");
    assert_eq!(md.metadata.creation_timestamp, live.deployments[0].metadata.creation_timestamp);
    assert_eq!(over.replaced.len(), 1);
    assert!(over.added.is_empty());
}

#[test]
fn files_may_refer_to_live_objects() {
    // The class exists only live: validating the file alone would call it unknown.
    let parsed = parse_stream("x.yaml", &file_of("newcomer", |_| {}));
    assert!(overlay::errors(&overlay::validate_over(&live(), &parsed.objects, &[])).is_empty());
    let parsed = parse_stream(
        "x.yaml",
        &file_of("newcomer", |v| v["spec"]["devices"]["alternatives"] = json!([{"class": "no-such-class"}])),
    );
    let problems = overlay::validate_over(&live(), &parsed.objects, &[]);
    assert!(overlay::errors(&problems).iter().any(|p| p.message.contains("no-such-class")), "{problems:?}");
}
