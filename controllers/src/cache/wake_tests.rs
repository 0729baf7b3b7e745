use serde_json::{Value, json};

use super::*;

fn cache(ns: &str, name: &str, targets: Value, status_clusters: &[&str]) -> Arc<ModelCache> {
    let clusters: Vec<Value> = status_clusters.iter().map(|c| json!({"cluster": c, "phase": "Ready"})).collect();
    Arc::new(
        serde_json::from_value(json!({
            "apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelCache",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"source": "hf://org/llama", "size": "1Gi", "targets": targets},
            "status": {"clusters": clusters}
        }))
        .unwrap(),
    )
}

fn cluster(name: &str, labels: Value, generation: i64) -> InferenceCluster {
    serde_json::from_value(json!({
        "apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceCluster",
        "metadata": {"name": name, "labels": labels, "generation": generation},
        "spec": {"provider": {"sim": {"cloud": "x"}}, "region": "r", "jurisdiction": "EU"}
    }))
    .unwrap()
}

fn deployment(ns: &str, name: &str, cache_ref: Option<&str>, placed: &[&str], ready: i32) -> ModelDeployment {
    let placements: Vec<Value> = placed
        .iter()
        .map(|c| json!({"cluster": c, "pool": "p", "class": "h100", "capacityType": "on-demand", "fallbackRank": 1, "desired": 1, "ready": ready}))
        .collect();
    serde_json::from_value(json!({
        "apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelDeployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"model": {"name": "llama", "source": "hf://org/llama", "cacheRef": cache_ref},
                 "replicas": 1, "engine": {"image": "i"}, "topology": {"type": "Standalone", "devicesPerReplica": 1},
                 "devices": {"alternatives": [{"class": "h100"}]}},
        "status": {"placements": placements}
    }))
    .unwrap()
}

fn names(r: &[ObjectRef<ModelCache>]) -> Vec<String> {
    let mut out: Vec<String> =
        r.iter().map(|o| format!("{}/{}", o.namespace.as_deref().unwrap_or(""), o.name)).collect();
    out.sort();
    out
}

/// The fleet of the tests: `ml/by-label` selects clusters by label; `ml/by-name` follows the
/// deployment `ml/chat`; `ml/mounted` is referenced by `ml/chat` (cacheRef); `other/by-name`
/// names a deployment `chat` in another namespace; `ml/staged-in-b` is staged in cluster b.
fn caches() -> Vec<Arc<ModelCache>> {
    vec![
        cache("ml", "by-label", json!({"clusterSelector": {"matchLabels": {"tier": "gold"}}}), &[]),
        cache("ml", "by-name", json!({"deployments": ["chat"]}), &[]),
        cache("ml", "mounted", json!({}), &[]),
        cache("other", "by-name", json!({"deployments": ["chat"]}), &[]),
        cache("ml", "staged-in-b", json!({}), &["b"]),
    ]
}

fn facts() -> CacheFacts {
    let f = CacheFacts::default();
    f.cluster_event(&Event::Apply(cluster("a", json!({"tier": "gold"}), 1)));
    f.cluster_event(&Event::Apply(cluster("b", json!({}), 1)));
    f.deployment_event(&Event::Apply(deployment("ml", "chat", Some("mounted"), &["a"], 0)));
    let _ = (f.clusters.take_changes(), f.deployments.take_changes());
    f
}

fn woken(f: &CacheFacts) -> Vec<String> {
    names(&concerned(&caches(), &f.clusters.take_changes(), &f.deployments.take_changes()))
}

#[test]
fn a_clusters_status_or_a_deployments_status_without_new_placements_wakes_no_cache() {
    let f = facts();
    // The same cluster again (a heartbeat moves only status): nothing.
    f.cluster_event(&Event::Apply(cluster("a", json!({"tier": "gold"}), 1)));
    // Replicas became ready where they were already placed: nothing.
    f.deployment_event(&Event::Apply(deployment("ml", "chat", Some("mounted"), &["a"], 1)));
    assert!(woken(&f).is_empty());
}

#[test]
fn a_cluster_change_wakes_the_caches_that_select_by_label_or_are_staged_there() {
    let f = facts();
    f.cluster_event(&Event::Apply(cluster("b", json!({"tier": "gold"}), 1)));
    assert_eq!(woken(&f), ["ml/by-label", "ml/staged-in-b"]);
    // A spec change (generation) of cluster a: a is staged by nobody, only the selecting cache.
    f.cluster_event(&Event::Apply(cluster("a", json!({"tier": "gold"}), 2)));
    assert_eq!(woken(&f), ["ml/by-label"]);
    f.cluster_event(&Event::Delete(cluster("b", json!({"tier": "gold"}), 1)));
    assert_eq!(woken(&f), ["ml/by-label", "ml/staged-in-b"]);
}

#[test]
fn a_deployment_placed_elsewhere_wakes_its_namespaces_caches_that_name_or_mount_it_only() {
    let f = facts();
    f.deployment_event(&Event::Apply(deployment("ml", "chat", Some("mounted"), &["a", "b"], 0)));
    // Not `other/by-name` (another namespace's `chat`), not the label or cluster-b caches.
    assert_eq!(woken(&f), ["ml/by-name", "ml/mounted"]);
}

#[test]
fn a_deployment_that_changes_its_cache_wakes_the_cache_it_left_too() {
    let f = facts();
    f.deployment_event(&Event::Apply(deployment("ml", "chat", Some("staged-in-b"), &["a"], 0)));
    assert_eq!(woken(&f), ["ml/by-name", "ml/mounted", "ml/staged-in-b"]);
    f.deployment_event(&Event::Delete(deployment("ml", "chat", Some("staged-in-b"), &["a"], 0)));
    assert_eq!(woken(&f), ["ml/by-name", "ml/staged-in-b"]);
}

#[test]
fn a_relist_that_no_longer_shows_a_deployment_counts_as_its_deletion() {
    let f = facts();
    f.deployment_event(&Event::Init);
    f.deployment_event(&Event::InitDone);
    assert_eq!(woken(&f), ["ml/by-name", "ml/mounted"]);
}

#[test]
fn an_adapters_cache_or_policy_changing_wakes_the_caches_it_concerns() {
    let f = facts();
    let with_adapter = |sovereignty: Value| {
        let mut d = deployment("ml", "chat", Some("mounted"), &["a"], 0);
        d.spec.adapters = serde_json::from_value(json!([
            {"name": "support-fr", "cacheRef": "staged-in-b", "sovereignty": sovereignty}
        ]))
        .unwrap();
        d
    };
    // An adapter now names `ml/staged-in-b`: it is woken (with the caches chat names or mounts).
    f.deployment_event(&Event::Apply(with_adapter(json!({"allowedJurisdictions": ["EU"]}))));
    assert_eq!(woken(&f), ["ml/by-name", "ml/mounted", "ml/staged-in-b"]);
    // The adapter's policy narrowed, placements unchanged: where its cache stages may shrink.
    f.deployment_event(&Event::Apply(with_adapter(json!({"allowedJurisdictions": ["EU"], "deniedRegions": ["r"]}))));
    assert_eq!(woken(&f), ["ml/by-name", "ml/mounted", "ml/staged-in-b"]);
    // Nothing changed: nobody.
    f.deployment_event(&Event::Apply(with_adapter(json!({"allowedJurisdictions": ["EU"], "deniedRegions": ["r"]}))));
    assert!(woken(&f).is_empty());
}
