//! What the member caches keep of each object: only the fields the controller reads, so a
//! cache of a thousand-node member is a fraction of the objects the API server sends. Applied
//! by `WatchStreamExt::modify` before an object reaches its store. Every kind loses
//! `managedFields`; workloads keep their `spec` (drift compares it), Flotilla's annotations and
//! the status fields readiness reads; nodes keep labels, taints, schedulability, `providerID`
//! (a claim names its empty nodes to the provider by it), conditions and allocatable/capacity; pods keep the node, owner kinds, the mirror annotation, container
//! resources and phase; DRA claims keep labels and their allocation; Secrets keep `data`.
//! Pure.

use k8s_openapi::api::core::v1::{Container, Node, Pod, PodCondition, PodSpec, PodStatus, Secret};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{DynamicObject, ObjectMeta};
use serde_json::{Map, Value};

/// Status fields of a workload that readiness reads (`deployment/members/readiness.rs`).
const WORKLOAD_STATUS: [&str; 4] = ["replicas", "readyReplicas", "updatedReplicas", "observedGeneration"];

/// The pod annotation that marks a static (mirror) pod.
const MIRROR: &str = "kubernetes.io/config.mirror";

fn common(meta: &mut ObjectMeta) {
    meta.managed_fields = None;
}

/// A Deployment, Service, PodDisruptionBudget, LeaderWorkerSet or ResourceClaimTemplate of Flotilla's.
pub fn workload(o: &mut DynamicObject) {
    common(&mut o.metadata);
    if let Some(a) = o.metadata.annotations.as_mut() {
        a.retain(|k, _| k.starts_with("flotilla.dev/"));
    }
    if let Some(status) = o.data.get_mut("status").and_then(Value::as_object_mut) {
        let mut kept = Map::new();
        for k in WORKLOAD_STATUS {
            if let Some(v) = status.get(k) {
                kept.insert(k.to_string(), v.clone());
            }
        }
        // A LeaderWorkerSet without status.observedGeneration: its conditions' (only that field).
        let generations: Vec<Value> = status
            .get("conditions")
            .and_then(Value::as_array)
            .map(|cs| {
                cs.iter()
                    .filter_map(|c| c.get("observedGeneration"))
                    .map(|g| serde_json::json!({"observedGeneration": g}))
                    .collect()
            })
            .unwrap_or_default();
        if !generations.is_empty() {
            kept.insert("conditions".into(), Value::Array(generations));
        }
        *status = kept;
    }
}

/// A node: labels, annotations (claim protection reads them), taints, schedulability,
/// `providerID` (a claim names its empty nodes to the provider by it), conditions, allocatable
/// and capacity.
pub fn node(n: &mut Node) {
    common(&mut n.metadata);
    if let Some(spec) = n.spec.as_mut() {
        spec.config_source = None;
        spec.pod_cidr = None;
        spec.pod_cidrs = None;
    }
    if let Some(status) = n.status.as_mut() {
        status.images = None;
        status.node_info = None;
        status.addresses = None;
        status.daemon_endpoints = None;
        status.volumes_attached = None;
        status.volumes_in_use = None;
        status.config = None;
        status.features = None;
        status.runtime_handlers = None;
        for c in status.conditions.iter_mut().flatten() {
            c.message = None;
            c.last_heartbeat_time = None;
        }
    }
}

/// Of a scheduler's refusal, at most this many characters of its message are kept.
const REFUSAL_CHARS: usize = 300;

/// A pod: the node it runs on, its owners' kinds, whether it is a mirror pod, its containers'
/// resources and its phase; a pod on no node keeps a `PodScheduled=False` condition (the
/// scheduler's refusal, its message cut to 300 characters: `watch.rs` reads it).
pub fn pod(p: &mut Pod) {
    common(&mut p.metadata);
    if let Some(a) = p.metadata.annotations.as_mut() {
        a.retain(|k, _| k == MIRROR);
    }
    let on_a_node = p.spec.as_ref().is_some_and(|s| s.node_name.is_some());
    if let Some(spec) = p.spec.take() {
        let containers = spec
            .containers
            .into_iter()
            .map(|c| Container { name: c.name, resources: c.resources, ..Default::default() })
            .collect();
        p.spec = Some(PodSpec { node_name: spec.node_name, containers, ..Default::default() });
    }
    if let Some(status) = p.status.take() {
        let refusal: Vec<PodCondition> = if on_a_node {
            Vec::new()
        } else {
            status
                .conditions
                .into_iter()
                .flatten()
                .filter(|c| c.type_ == "PodScheduled" && c.status == "False")
                .map(|c| PodCondition {
                    message: c.message.map(|m| m.chars().take(REFUSAL_CHARS).collect()),
                    last_probe_time: None,
                    ..c
                })
                .collect()
        };
        let conditions = (!refusal.is_empty()).then_some(refusal);
        p.status = Some(PodStatus { phase: status.phase, conditions, ..Default::default() });
    }
}

/// A ResourceSlice: inventory reads its whole spec (devices and their attributes).
pub fn slice(s: &mut ResourceSlice) {
    common(&mut s.metadata);
    s.metadata.annotations = None;
}

/// A ResourceClaim: its labels and what was allocated to it.
pub fn claim(c: &mut ResourceClaim) {
    common(&mut c.metadata);
    c.metadata.annotations = None;
    c.spec = Default::default();
    if let Some(status) = c.status.as_mut() {
        status.reserved_for = None;
        status.devices = None;
    }
}

/// A kubeconfig Secret: its data (annotations go: `kubectl apply` would keep a plain-text copy
/// of the data there).
pub fn secret(s: &mut Secret) {
    common(&mut s.metadata);
    s.metadata.annotations = None;
    s.string_data = None;
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_workload_keeps_its_spec_its_hash_and_what_readiness_reads() {
        let mut o: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "d", "namespace": "ml", "generation": 3, "resourceVersion": "7",
                "labels": {"flotilla.dev/pool": "h100"},
                "annotations": {"flotilla.dev/rendered-hash": "abc", "deployment.kubernetes.io/revision": "2",
                                "kubectl.kubernetes.io/last-applied-configuration": "{...}"},
                "managedFields": [{"manager": "flotilla", "operation": "Apply"}]},
            "spec": {"replicas": 2, "template": {"spec": {"containers": [{"name": "engine", "image": "i"}]}}},
            "status": {"replicas": 2, "readyReplicas": 1, "updatedReplicas": 2, "observedGeneration": 3,
                       "availableReplicas": 1, "conditions": [{"type": "Available", "message": "long text"}]}}))
        .unwrap();
        let spec = o.data["spec"].clone();
        workload(&mut o);
        assert!(o.metadata.managed_fields.is_none());
        assert_eq!(o.metadata.annotations.as_ref().unwrap().len(), 1);
        assert_eq!(o.metadata.generation, Some(3));
        assert_eq!(o.data["spec"], spec, "drift compares the whole spec");
        assert_eq!(
            o.data["status"],
            json!({"replicas": 2, "readyReplicas": 1, "updatedReplicas": 2, "observedGeneration": 3})
        );
        // A LeaderWorkerSet's conditions keep only their generation.
        let mut l: DynamicObject = serde_json::from_value(json!({"metadata": {"name": "l"},
            "status": {"replicas": 1, "conditions": [{"type": "Available", "observedGeneration": 4, "message": "m"}]}}))
        .unwrap();
        workload(&mut l);
        assert_eq!(l.data["status"]["conditions"], json!([{"observedGeneration": 4}]));
    }

    #[test]
    fn a_pod_keeps_what_inventory_and_claims_read() {
        let mut p: Pod = serde_json::from_value(json!({
            "metadata": {"name": "p", "labels": {"app.kubernetes.io/managed-by": "flotilla"},
                "annotations": {"kubernetes.io/config.mirror": "x", "big": "y"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u"}],
                "managedFields": [{"manager": "kubelet"}]},
            "spec": {"nodeName": "n1", "volumes": [{"name": "v"}], "containers": [{"name": "engine", "image": "i",
                "args": ["--a"], "resources": {"limits": {"nvidia.com/gpu": "4"}}}]},
            "status": {"phase": "Running", "containerStatuses": [{"name": "engine", "image": "i", "imageID": "",
                "ready": true, "restartCount": 0}]}}))
        .unwrap();
        pod(&mut p);
        let v = serde_json::to_value(&p).unwrap();
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p", "labels": {"app.kubernetes.io/managed-by": "flotilla"},
                "annotations": {"kubernetes.io/config.mirror": "x"},
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u"}]},
                "spec": {"nodeName": "n1", "containers": [{"name": "engine",
                    "resources": {"limits": {"nvidia.com/gpu": "4"}}}]},
                "status": {"phase": "Running"}})
        );
    }

    #[test]
    fn a_pod_on_no_node_keeps_the_schedulers_refusal_and_a_running_one_no_conditions() {
        let refused = json!({"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
            "lastTransitionTime": "2026-12-02T05:53:04Z", "lastProbeTime": null, "message": "x".repeat(1000)});
        let ready = json!({"type": "Ready", "status": "False", "reason": "ContainersNotReady"});
        let mut p: Pod = serde_json::from_value(json!({"metadata": {"name": "p"},
            "spec": {"containers": [{"name": "engine"}]},
            "status": {"phase": "Pending", "conditions": [refused, ready]}}))
        .unwrap();
        pod(&mut p);
        let conds = p.status.unwrap().conditions.unwrap();
        assert_eq!(conds.len(), 1, "only the refusal");
        assert_eq!(conds[0].reason.as_deref(), Some("Unschedulable"));
        assert_eq!(conds[0].message.as_ref().map(|m| m.len()), Some(REFUSAL_CHARS));
        // Twin: scheduled (on a node), nothing of its conditions is kept.
        let mut p: Pod = serde_json::from_value(json!({"metadata": {"name": "p"},
            "spec": {"nodeName": "n1", "containers": [{"name": "engine"}]},
            "status": {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "True"}, ready]}}))
        .unwrap();
        pod(&mut p);
        assert_eq!(p.status.unwrap().conditions, None);
    }

    #[test]
    fn a_node_loses_images_and_managed_fields_but_keeps_capacity_taints_and_provider_id() {
        let mut n: Node = serde_json::from_value(json!({
            "metadata": {"name": "n1", "labels": {"flotilla.dev/pool": "h100"}, "managedFields": [{"manager": "k"}]},
            "spec": {"taints": [{"key": "flotilla.dev/claim", "value": "ml.a", "effect": "NoSchedule"}],
                     "providerID": "aws:///x"},
            "status": {"allocatable": {"nvidia.com/gpu": "8"}, "capacity": {"nvidia.com/gpu": "8"},
                       "conditions": [{"type": "Ready", "status": "True", "message": "kubelet is posting"}],
                       "images": [{"names": ["a"], "sizeBytes": 1}],
                       "nodeInfo": {"architecture": "", "bootID": "", "containerRuntimeVersion": "",
                           "kernelVersion": "", "kubeProxyVersion": "", "kubeletVersion": "", "machineID": "",
                           "operatingSystem": "", "osImage": "", "systemUUID": ""}}}))
        .unwrap();
        node(&mut n);
        let v = serde_json::to_value(&n).unwrap();
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1", "labels": {"flotilla.dev/pool": "h100"}},
                "spec": {"taints": [{"key": "flotilla.dev/claim", "value": "ml.a", "effect": "NoSchedule"}],
                         "providerID": "aws:///x"},
                "status": {"allocatable": {"nvidia.com/gpu": "8"}, "capacity": {"nvidia.com/gpu": "8"},
                           "conditions": [{"type": "Ready", "status": "True"}]}})
        );
    }

    #[test]
    fn a_secret_keeps_its_data_only() {
        let mut s: Secret = serde_json::from_value(json!({"metadata": {"name": "k", "resourceVersion": "3",
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "secret text"},
            "managedFields": [{"manager": "kubectl"}]}, "data": {"kubeconfig": "YQ=="}}))
        .unwrap();
        secret(&mut s);
        assert_eq!(
            serde_json::to_value(&s).unwrap(),
            json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "k", "resourceVersion": "3"}, "data": {"kubeconfig": "YQ=="}})
        );
    }
}
