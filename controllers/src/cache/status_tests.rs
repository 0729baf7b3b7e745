use flotilla_apis::stage::StageResult;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::*;

const DIGEST: &str = "sha256:99668f5da82711e698e1fb1039974b5e673a43337ef024988a0c9cc92baa451b";

fn cache(digest: Option<&str>) -> ModelCache {
    serde_json::from_value(json!({
        "apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelCache",
        "metadata": {"name": "llama", "namespace": "ml", "generation": 2},
        "spec": {"source": "hf://org/llama", "size": "1Gi", "digest": digest,
                 "targets": {"clusterSelector": {"matchLabels": {"tier": "premium"}}, "deployments": ["chat"]}}
    }))
    .unwrap()
}

fn result(phase: CachePhase, reason: Option<StageReason>, digest: Option<&str>) -> String {
    StageResult {
        phase,
        reason,
        message: "done".into(),
        source: "hf://org/llama".into(),
        file: None,
        digest: digest.map(str::to_string),
        expected_digest: None,
        resolved: None,
        files: 3,
        bytes: 1234,
    }
    .to_line()
}

fn pod(name: &str, at: i64, state: Value) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "creationTimestamp": Timestamp::from_second(at).unwrap().to_string()},
        "status": {"containerStatuses": [{"name": "stage", "image": "i", "imageID": "", "ready": false,
                                          "restartCount": 0, "state": state}]}
    }))
    .unwrap()
}

fn ended(name: &str, at: i64, exit: i32, message: Option<String>) -> Pod {
    pod(name, at, json!({"terminated": {"exitCode": exit, "message": message}}))
}

fn job(condition: Option<&str>) -> Job {
    let conds: Vec<Value> = condition.iter().map(|c| json!({"type": c, "status": "True", "message": "m"})).collect();
    serde_json::from_value(json!({"metadata": {"name": "flotilla-stage-llama-1"}, "status": {"conditions": conds}}))
        .unwrap()
}

fn seen(job: Option<Job>, pods: Vec<Pod>) -> Observation {
    Observation::Seen(Box::new(MemberObjects { job, pods, ..Default::default() }))
}

fn now() -> Time {
    Time(Timestamp::from_second(1_000).unwrap())
}

#[test]
fn a_ready_result_for_this_source_and_digest_is_ready() {
    let msg = result(CachePhase::Ready, None, Some(DIGEST));
    let s =
        cluster_status(&cache(Some(DIGEST)), "eu1", &seen(Some(job(None)), vec![ended("p", 1, 0, Some(msg))]), None);
    assert_eq!((s.phase, s.bytes, s.digest.as_deref()), (CachePhase::Ready, 1234, Some(DIGEST)));
    // Twin: the same result against another expected digest is never Ready.
    let other = format!("sha256:{}", "1".repeat(64));
    let msg = result(CachePhase::Ready, None, Some(DIGEST));
    let s =
        cluster_status(&cache(Some(&other)), "eu1", &seen(Some(job(None)), vec![ended("p", 1, 0, Some(msg))]), None);
    assert_eq!((s.phase, s.reason.as_deref()), (CachePhase::Failed, Some("DigestMismatch")));
    assert_eq!(s.digest, None);
}

#[test]
fn a_failed_result_names_its_reason() {
    let msg = result(CachePhase::Failed, Some(StageReason::DigestMismatch), None);
    let s = cluster_status(&cache(None), "eu1", &seen(Some(job(None)), vec![ended("p", 1, 14, Some(msg))]), None);
    assert_eq!((s.phase, s.reason.as_deref()), (CachePhase::Failed, Some("DigestMismatch")));
    let msg = result(CachePhase::Failed, Some(StageReason::SourceUnauthorized), None);
    let s =
        cluster_status(&cache(None), "eu1", &seen(Some(job(Some("Failed"))), vec![ended("p", 1, 11, Some(msg))]), None);
    assert_eq!(s.reason.as_deref(), Some("SourceUnauthorized"));
}

#[test]
fn transient_failures_retry_until_the_job_gives_up() {
    let pods = vec![ended("a", 1, 13, None)];
    let s = cluster_status(&cache(None), "eu1", &seen(Some(job(None)), pods.clone()), None);
    assert_eq!((s.phase, s.reason.as_deref()), (CachePhase::Pending, Some("SourceUnavailable")));
    assert!(s.message.unwrap().starts_with("retrying"));
    let s = cluster_status(&cache(None), "eu1", &seen(Some(job(Some("Failed"))), pods), None);
    assert_eq!((s.phase, s.reason.as_deref()), (CachePhase::Failed, Some("SourceUnavailable")));
    // A new attempt running after a failure is Downloading.
    let pods = vec![ended("a", 1, 13, None), pod("b", 2, json!({"running": {}}))];
    assert_eq!(cluster_status(&cache(None), "eu1", &seen(Some(job(None)), pods), None).phase, CachePhase::Downloading);
}

#[test]
fn no_result_and_an_unknown_exit_is_job_failed_with_the_tail() {
    let pods = vec![ended("a", 1, 137, Some("line 1\nkilled".into()))];
    let s = cluster_status(&cache(None), "eu1", &seen(Some(job(Some("Failed"))), pods), None);
    assert_eq!((s.phase, s.reason.as_deref()), (CachePhase::Failed, Some("JobFailed")));
    assert!(s.message.unwrap().contains("killed"));
    // Exit 0 without a result is not Ready.
    let s = cluster_status(&cache(None), "eu1", &seen(Some(job(None)), vec![ended("a", 1, 0, None)]), None);
    assert_eq!((s.phase, s.reason.as_deref()), (CachePhase::Failed, Some("JobFailed")));
}

#[test]
fn progress_says_downloading_or_verifying() {
    let progress = |phase| StageProgress {
        phase,
        bytes: 10,
        received_bytes: 500,
        total_bytes: 1000,
        files: 1,
        total_files: 4,
        file: None,
    };
    for (phase, want) in
        [(CachePhase::Downloading, CachePhase::Downloading), (CachePhase::Verifying, CachePhase::Verifying)]
    {
        let o = Observation::Seen(Box::new(MemberObjects {
            pvc: None,
            job: Some(job(None)),
            pods: vec![pod("a", 1, json!({"running": {}}))],
            progress: Some(progress(phase)),
            apply_error: None,
        }));
        let s = cluster_status(&cache(None), "eu1", &o, None);
        assert_eq!((s.phase, s.bytes), (want, 500));
    }
}

#[test]
fn pending_lost_volumes_and_unreachable_members() {
    let s = cluster_status(&cache(None), "eu1", &seen(None, vec![]), None);
    assert_eq!(s.phase, CachePhase::Pending);
    let lost: PersistentVolumeClaim = serde_json::from_value(json!({"status": {"phase": "Lost"}})).unwrap();
    let o = Observation::Seen(Box::new(MemberObjects { pvc: Some(lost), job: Some(job(None)), ..Default::default() }));
    let s = cluster_status(&cache(None), "eu1", &o, None);
    assert_eq!((s.phase, s.reason.as_deref()), (CachePhase::Failed, Some("StorageUnavailable")));
    let ready = ClusterCacheStatus { cluster: "eu1".into(), phase: CachePhase::Ready, ..Default::default() };
    let down = Observation::Unreachable("timeout".into());
    assert_eq!(cluster_status(&cache(None), "eu1", &down, Some(&ready)), ready, "what was proven stays");
    assert_eq!(cluster_status(&cache(None), "eu1", &down, None).phase, CachePhase::Pending);
    // A completed Job whose pod was garbage-collected keeps an earlier Ready.
    assert_eq!(cluster_status(&cache(None), "eu1", &seen(Some(job(Some("Complete"))), vec![]), Some(&ready)), ready);
}

fn cluster(name: &str, tier: &str) -> InferenceCluster {
    serde_json::from_value(json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceCluster",
        "metadata": {"name": name, "labels": {"tier": tier}},
        "spec": {"provider": {"sim": {"cloud": "x"}}, "region": "r", "jurisdiction": "EU"}}))
    .unwrap()
}

fn deployment(name: &str, cache_ref: Option<&str>, placed: &[(&str, i32)]) -> ModelDeployment {
    let placements: Vec<Value> = placed
        .iter()
        .map(|(c, n)| json!({"cluster": c, "pool": "p", "class": "h100", "capacityType": "on-demand", "fallbackRank": 1, "desired": n, "ready": 0}))
        .collect();
    serde_json::from_value(json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelDeployment",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"model": {"name": name, "source": "hf://org/llama", "cacheRef": cache_ref}, "replicas": 1,
                 "engine": {"image": "i"}, "topology": {"type": "Standalone", "devicesPerReplica": 1},
                 "devices": {"alternatives": [{"class": "h100"}]}},
        "status": {"placements": placements}}))
    .unwrap()
}

#[test]
fn a_deployment_scaled_to_zero_keeps_its_weights_staged() {
    let (a, b) = (cluster("a", "premium"), cluster("b", "basic"));
    let mut staged = cache(None);
    staged.status = Some(ModelCacheStatus {
        clusters: vec![ClusterCacheStatus { cluster: "b".into(), phase: CachePhase::Ready, ..Default::default() }],
        ..Default::default()
    });
    let mut chat = deployment("chat", None, &[]);
    chat.spec.replicas = 0;
    // At zero by hand (no autoscaling): the cluster is no longer a target, as before.
    assert_eq!(targets(&staged, &[&a, &b], &[&chat]), BTreeSet::from(["a".to_string()]));
    chat.spec.autoscaling =
        serde_json::from_value(json!({"minReplicas": 0, "maxReplicas": 2, "target": {"runningPerReplica": 4}}))
            .unwrap();
    assert_eq!(targets(&staged, &[&a, &b], &[&chat]), BTreeSet::from(["a".to_string(), "b".to_string()]));
    // Started again: its placements say where, as usual.
    chat.spec.replicas = 1;
    assert_eq!(targets(&staged, &[&a, &b], &[&chat]), BTreeSet::from(["a".to_string()]));
}

#[test]
fn targets_are_selected_clusters_and_where_named_deployments_are_placed() {
    let (a, b, c) = (cluster("a", "premium"), cluster("b", "basic"), cluster("c", "basic"));
    let chat = deployment("chat", None, &[("b", 2), ("c", 0)]);
    let other = deployment("other", Some("llama"), &[("c", 1)]);
    let t = targets(&cache(None), &[&a, &b, &c], &[&chat, &other]);
    assert_eq!(t, BTreeSet::from(["a".to_string(), "b".to_string()]), "c: chat wants 0 there, other is not named");
    let u = users(&cache(None), &[&chat, &other], &[&a, &b, &c]);
    assert_eq!(u, BTreeMap::from([("c".to_string(), vec!["ml/other".to_string()])]));
}

#[test]
fn aggregate_status_counts_ready_clusters_and_writes_nothing_new_twice() {
    let t = BTreeSet::from(["eu1".to_string(), "eu2".to_string()]);
    let ready = ClusterCacheStatus { cluster: "eu1".into(), phase: CachePhase::Ready, ..Default::default() };
    let failed = ClusterCacheStatus {
        cluster: "eu2".into(),
        phase: CachePhase::Failed,
        reason: Some("DigestMismatch".into()),
        message: Some("bad".into()),
        ..Default::default()
    };
    let mut c = cache(None);
    let s = desired(&c, &t, vec![failed.clone(), ready.clone()], None, &now());
    assert_eq!(s.ready_clusters.as_deref(), Some("1/2"));
    assert_eq!(s.summary.as_deref(), Some("eu1:Ready,eu2:Failed"));
    let staged = s.conditions.get("Staged").unwrap();
    assert_eq!((staged.status.as_str(), staged.reason.as_str()), ("False", "DigestMismatch"));
    assert!(!s.conditions.is_true("Ready"));
    c.status = Some(s.clone());
    let later = Time(Timestamp::from_second(2_000).unwrap());
    assert_eq!(desired(&c, &t, vec![ready.clone(), failed], None, &later), s, "same inputs, same status");
    let all = desired(
        &c,
        &t,
        vec![ready.clone(), ClusterCacheStatus { cluster: "eu2".into(), ..ready.clone() }],
        None,
        &later,
    );
    assert!(all.conditions.is_true("Ready") && all.conditions.is_true("Staged"));
    let in_use = BTreeMap::from([("eu1".to_string(), vec!["ml/chat".to_string()])]);
    let s = desired(&c, &t, vec![ready], Some(&in_use), &later);
    let r = s.conditions.get("Ready").unwrap();
    assert_eq!((r.status.as_str(), r.reason.as_str()), ("False", "InUse"));
    assert!(r.message.contains("ml/chat in eu1"), "{}", r.message);
}

#[test]
fn a_refused_volume_claim_or_job_is_named() {
    let refused = |pvc: Option<PersistentVolumeClaim>| {
        let o = MemberObjects { pvc, apply_error: Some("HTTP 403 Forbidden".into()), ..Default::default() };
        cluster_status(&cache(None), "eu1", &Observation::Seen(Box::new(o)), None)
    };
    let s = refused(None);
    assert_eq!((s.phase, s.reason.as_deref()), (CachePhase::Failed, Some("StorageUnavailable")));
    assert!(s.message.unwrap().contains("HTTP 403"));
    let s = refused(Some(PersistentVolumeClaim::default()));
    assert_eq!((s.phase, s.reason.as_deref()), (CachePhase::Failed, Some("JobFailed")));
}

/// RFC 7386 merge patch, as the API server applies it to status.
fn merge_patch(target: &mut Value, patch: &Value) {
    let (Value::Object(t), Value::Object(p)) = (&mut *target, patch) else {
        *target = patch.clone();
        return;
    };
    for (k, v) in p {
        if v.is_null() {
            t.remove(k);
        } else {
            merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
        }
    }
}

#[test]
fn a_cluster_that_stops_being_a_target_leaves_status_and_a_quiet_cache_writes_nothing() {
    let was = BTreeSet::from(["m1".to_string()]);
    let ready = ClusterCacheStatus { cluster: "m1".into(), phase: CachePhase::Ready, ..Default::default() };
    let mut c = cache(None);
    c.metadata.resource_version = Some("5".into());
    c.status = Some(desired(&c, &was, vec![ready], None, &now()));
    // m1 is no longer a target and its objects are gone: no targets, no entries.
    let next = desired(&c, &BTreeSet::new(), vec![], None, &now());
    assert_eq!(next.ready_clusters.as_deref(), Some("0/0"));
    let patch =
        crate::status_patch::conditional_status_patch(c.status.as_ref(), c.metadata.resource_version.clone(), &next)
            .unwrap()
            .expect("a changed status is written");
    assert_eq!(patch["metadata"]["resourceVersion"], json!("5"));
    // What the API server stores after the patch is exactly the decided status: m1 is gone.
    let mut stored = serde_json::to_value(c.status.as_ref().unwrap()).unwrap();
    merge_patch(&mut stored, &patch["status"]);
    let stored: ModelCacheStatus = serde_json::from_value(stored).unwrap();
    assert!(stored.clusters.is_empty() && stored.summary.is_none(), "{stored:?}");
    assert_eq!(stored, next);
    // The next reconcile decides the same status from it, and writes nothing.
    c.status = Some(stored);
    let again = desired(&c, &BTreeSet::new(), vec![], None, &Time(Timestamp::from_second(9_000).unwrap()));
    assert_eq!(
        crate::status_patch::conditional_status_patch(c.status.as_ref(), Some("6".into()), &again).unwrap(),
        None
    );
}

/// A cluster in `jurisdiction`.
fn cluster_in(name: &str, jurisdiction: &str) -> InferenceCluster {
    serde_json::from_value(json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceCluster",
        "metadata": {"name": name, "labels": {"tier": "basic"}},
        "spec": {"provider": {"sim": {"cloud": "x"}}, "region": format!("{name}-region"), "jurisdiction": jurisdiction}}))
    .unwrap()
}

/// `chat` placed in eu1 and us1, with the adapter `support-fr` of this cache (`llama`), EU only.
fn chat_with_eu_adapter() -> ModelDeployment {
    let mut chat = deployment("chat", None, &[("eu1", 1), ("us1", 1)]);
    chat.spec.adapters = serde_json::from_value(json!([
        {"name": "support-fr", "cacheRef": "llama", "sovereignty": {"allowedJurisdictions": ["EU"]}}
    ]))
    .unwrap();
    chat
}

#[test]
fn an_eu_only_adapters_cache_is_never_staged_in_a_us_cluster_through_deployment_targets() {
    let (eu1, us1) = (cluster_in("eu1", "EU"), cluster_in("us1", "US"));
    let chat = chat_with_eu_adapter();
    let t = targets(&cache(None), &[&eu1, &us1], &[&chat]);
    assert_eq!(t, BTreeSet::from(["eu1".to_string()]), "us1: the adapter may not be served there");
    // Not even where the adapter's weights are already staged while the deployment is parked.
    let mut parked = chat.clone();
    parked.spec.replicas = 0;
    parked.spec.autoscaling =
        Some(serde_json::from_value(json!({"minReplicas": 0, "maxReplicas": 2, "target": {}})).unwrap());
    let mut staged = cache(None);
    staged.status = Some(ModelCacheStatus {
        clusters: ["eu1", "us1"]
            .map(|c| ClusterCacheStatus { cluster: c.into(), phase: CachePhase::Ready, ..Default::default() })
            .to_vec(),
        ..Default::default()
    });
    assert_eq!(targets(&staged, &[&eu1, &us1], &[&parked]), BTreeSet::from(["eu1".to_string()]));
    // Nor in a cluster the store does not know (its jurisdiction cannot be checked).
    assert_eq!(targets(&cache(None), &[&eu1], &[&chat]), BTreeSet::from(["eu1".to_string()]));
    // The adapter's clusterSelector narrows too.
    let mut picky = chat.clone();
    picky.spec.adapters[0].cluster_selector =
        Some(serde_json::from_value(json!({"matchLabels": {"tier": "premium"}})).unwrap());
    assert_eq!(targets(&cache(None), &[&eu1, &us1], &[&picky]), BTreeSet::new());
    // Twins: the same deployment using the cache for its model stages wherever it is placed,
    // and the cache's own clusterSelector is the user's choice (us1 is not "premium" here).
    let mut model = chat.clone();
    model.spec.model.cache_ref = Some("llama".into());
    assert_eq!(targets(&cache(None), &[&eu1, &us1], &[&model]), BTreeSet::from(["eu1".into(), "us1".into()]));
}

#[test]
fn a_deployment_mounts_an_adapters_cache_only_where_the_adapter_is_allowed() {
    let (eu1, us1) = (cluster_in("eu1", "EU"), cluster_in("us1", "US"));
    let chat = chat_with_eu_adapter();
    let u = users(&cache(None), &[&chat], &[&eu1, &us1]);
    assert_eq!(u, BTreeMap::from([("eu1".to_string(), vec!["ml/chat".to_string()])]), "us1 is free to clean");
}
