//! The ModelCache controller on real API servers: a control cluster and three members with
//! kwok GPU nodes. kwok runs no containers, so the test plays the staging program: it writes
//! the `StageResult` the real program would (the shared type, as the Job pod's container
//! termination message and exit code) into the pod's status, and the members' real Job
//! controllers turn that into the Job's completion or failure (the Job's `podFailurePolicy`
//! fails it at once on a non-transient exit code). Asserted: a cache targeted by selector
//! stages only in the selected member and goes Pending → Downloading → Ready; a cache targeted
//! by a deployment's placement stages where the deployment is placed; replicas never start
//! before the cache is Ready in their cluster (watched throughout); a `DigestMismatch` result
//! is `Failed` with that reason and keeps replicas out; a second deployment of the same cache,
//! and scaling out, create no second Job; deleting the cache waits (`InUse`) while deployments
//! mount it, then removes its volume claims and Jobs; a settled cache is never rewritten; a
//! cluster that stops matching the selector leaves status and is cleaned; the sweep removes this
//! installation's orphaned staging objects and never another installation's
//! (`e2e_cache/foreign.rs`). What a tenant's cache
//! may reach (credentials, the node's role, deletion beside unreachable members) is in
//! `e2e_cache/trust.rs`. Run by `scripts/test-e2e.sh`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "e2e_cache/foreign.rs"]
mod foreign;
mod harness;
#[path = "e2e_cache/trust.rs"]
mod trust;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flotilla_apis::cache::CachePhase;
use flotilla_apis::stage::{ManifestFile, StageManifest, StageReason, StageResult};
use flotilla_apis::{ModelCache, ModelDeployment};
use futures_util::StreamExt;
use harness::staging::{self, jobs, provide_volume, set_container, staging_pod, terminated};
use harness::{ControllerProcess, Fleet, apply, install_crds, wait_for};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Pod, Secret};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::json;

const MEMBERS: [&str; 3] = ["m1", "m2", "m3"];
const SOURCE: &str = "hf://org/llama";

async fn setup_control(fleet: &Fleet, control: &Client) {
    install_crds(control).await;
    for ns in ["flotilla-system", "ml"] {
        let n: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        Api::<Namespace>::all(control.clone()).create(&PostParams::default(), &n).await.unwrap();
    }
    apply(
        control,
        json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceClass", "metadata": {"name": "h100"},
        "spec": {"device": {"driver": "gpu.nvidia.com", "attributes": {"productName": {"string": "NVIDIA H100 80GB HBM3"}},
                 "capacity": {"memory": "80Gi"}}, "devicesPerNode": 8, "pricePerNodeHour": {"onDemand": "98.32"}}}),
    )
    .await;
    for name in MEMBERS {
        let s: Secret = serde_json::from_value(
            json!({"metadata": {"name": format!("{name}-kubeconfig")}, "stringData": {"kubeconfig": fleet.member_kubeconfig_text(name)}}),
        )
        .unwrap();
        Api::<Secret>::namespaced(control.clone(), "flotilla-system").create(&PostParams::default(), &s).await.unwrap();
        let tier = if name == "m1" { "premium" } else { "basic" };
        apply(control, json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceCluster",
            "metadata": {"name": name, "labels": {"tier": tier}},
            "spec": {"provider": {"sim": {"cloud": "e2e"}}, "region": format!("r-{name}"), "jurisdiction": "EU",
                     "credentials": {"secretRef": {"namespace": "flotilla-system", "name": format!("{name}-kubeconfig")}},
                     "endpoint": format!("http://127.0.0.1:1/{name}"),
                     "pools": [{"name": "h100", "class": "h100", "maxNodes": 8, "capacityTypes": ["on-demand"]}]}}))
        .await;
    }
}

fn cache(name: &str, targets: serde_json::Value, digest: Option<&str>) -> serde_json::Value {
    json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelCache", "metadata": {"name": name, "namespace": "ml"},
        "spec": {"source": SOURCE, "size": "1Gi", "digest": digest, "targets": targets}})
}

fn model(name: &str, replicas: i32, clusters: &[&str]) -> serde_json::Value {
    json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelDeployment", "metadata": {"name": name, "namespace": "ml"},
        "spec": {"model": {"name": name, "source": SOURCE, "cacheRef": "llama"}, "replicas": replicas,
                 "engine": {"image": "vllm/vllm-openai:v0.11.0"}, "topology": {"type": "Standalone", "devicesPerReplica": 1},
                 "devices": {"alternatives": [{"class": "h100"}]},
                 "placement": {"clusterSelector": {"matchExpressions": [{"key": "flotilla.dev/cluster", "operator": "In", "values": clusters}]},
                               "spread": {"by": "cluster", "maxSkew": 1}}}})
}

fn ready_result(digest: &str) -> String {
    staging::ready_result(SOURCE, digest)
}

fn mismatch_result(digest: &str) -> String {
    StageResult {
        phase: CachePhase::Failed,
        reason: Some(StageReason::DigestMismatch),
        message: format!("manifest digest sha256:{} does not match the expected {digest}", "e".repeat(64)),
        source: SOURCE.into(),
        file: None,
        digest: None,
        expected_digest: Some(digest.into()),
        resolved: None,
        files: 0,
        bytes: 0,
    }
    .to_line()
}

async fn cluster_phase(api: &Api<ModelCache>, name: &str, cluster: &str) -> Option<(CachePhase, Option<String>)> {
    let s = api.get(name).await.ok()?.status?;
    s.clusters.iter().find(|c| c.cluster == cluster).map(|c| (c.phase, c.reason.clone()))
}

async fn wait_phase(api: &Api<ModelCache>, name: &str, cluster: &str, phase: CachePhase) -> Option<String> {
    wait_for(&format!("{name} {phase:?} in {cluster}"), Duration::from_secs(30), || async {
        cluster_phase(api, name, cluster).await.filter(|(p, _)| *p == phase).map(|(_, r)| r)
    })
    .await
}

/// Every replica count and pod of `ml.<model>` a member ever showed: (when, member, what, n).
type Seen = Arc<Mutex<Vec<(Instant, &'static str, &'static str, i32)>>>;

fn watch_replicas(member: &'static str, client: Client, seen: Seen) -> tokio::task::JoinHandle<()> {
    // Replicas only (the staging pod carries the cache's labels, not a deployment's).
    let lp = "flotilla.dev/deployment";
    let deps = watcher(Api::<Deployment>::namespaced(client.clone(), "ml"), watcher::Config::default().labels(lp))
        .filter_map(|e| async move {
            match e {
                Ok(watcher::Event::Apply(d) | watcher::Event::InitApply(d)) => {
                    Some(("Deployment", d.spec.and_then(|s| s.replicas).unwrap_or(0)))
                }
                _ => None,
            }
        });
    let pods = watcher(Api::<Pod>::namespaced(client, "ml"), watcher::Config::default().labels(lp)).filter_map(
        |e| async move {
            match e {
                Ok(watcher::Event::Apply(_) | watcher::Event::InitApply(_)) => Some(("Pod", 1)),
                _ => None,
            }
        },
    );
    tokio::spawn(async move {
        let mut events = futures_util::stream::select(deps.boxed(), pods.boxed());
        while let Some((what, n)) = events.next().await {
            seen.lock().unwrap().push((Instant::now(), member, what, n));
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e harness; run by scripts/test-e2e.sh"]
async fn model_cache_controller_on_real_api_servers() {
    let started = Instant::now();
    // Audited: the API servers log each client's LISTs and writes with its User-Agent.
    let fleet = Fleet::up_audited("cache", &["control", "m1", "m2", "m3"]);
    for m in MEMBERS {
        fleet.gpu_nodes(m, "h100", 1, "h100", &format!("r-{m}"));
    }
    let control = fleet.client("control").await;
    let mut members: BTreeMap<&str, Client> = BTreeMap::new();
    for m in MEMBERS {
        members.insert(m, fleet.client(m).await);
    }
    setup_control(&fleet, &control).await;
    let mut ctl = ControllerProcess::start(
        &fleet,
        "control",
        "ctl",
        // The sweep every 4 s: the settled window below spans several of its passes too.
        &[
            "--poll-seconds",
            "2",
            "--member-timeout-seconds",
            "8",
            "--tenant-namespaces",
            "ml",
            "--sweep-seconds",
            "4",
            "--sweep-grace-seconds",
            "2",
        ],
    );
    let caches: Api<ModelCache> = Api::namespaced(control.clone(), "ml");
    let mds: Api<ModelDeployment> = Api::namespaced(control.clone(), "ml");

    // 1. By selector: only m1 (tier=premium) stages; Pending → Downloading → Ready.
    apply(&control, cache("premium", json!({"clusterSelector": {"matchLabels": {"tier": "premium"}}}), None)).await;
    let (_, pod) = staging_pod(&members["m1"], "premium").await;
    let reason = wait_phase(&caches, "premium", "m1", CachePhase::Pending).await;
    assert_eq!(reason.as_deref(), Some("Pending"));
    let pvc = Api::<PersistentVolumeClaim>::namespaced(members["m1"].clone(), "ml").get("flotilla-cache-premium").await;
    assert_eq!(pvc.unwrap().spec.unwrap().resources.unwrap().requests.unwrap()["storage"].0, "1Gi");
    set_container(&members["m1"], &pod, json!({"running": {"startedAt": "2026-11-29T00:00:00Z"}}), "Running").await;
    wait_phase(&caches, "premium", "m1", CachePhase::Downloading).await;
    let files = vec![
        ManifestFile { path: "config.json".into(), size: 3, sha256: "a".repeat(64) },
        ManifestFile { path: "model.safetensors".into(), size: 3, sha256: "b".repeat(64) },
    ];
    let digest = StageManifest::new(SOURCE.into(), None, files).digest;
    set_container(&members["m1"], &pod, terminated(0, &ready_result(&digest)), "Succeeded").await;
    wait_phase(&caches, "premium", "m1", CachePhase::Ready).await;
    let s = caches.get("premium").await.unwrap().status.unwrap();
    assert_eq!(s.ready_clusters.as_deref(), Some("1/1"));
    assert_eq!(s.clusters[0].digest.as_deref(), Some(digest.as_str()));
    assert_eq!(s.clusters[0].bytes, 6);
    assert!(s.conditions.is_true("Ready") && s.conditions.is_true("Staged"));
    for m in ["m2", "m3"] {
        assert!(jobs(&members[m], "premium").await.is_empty(), "{m} is not selected: no Job there");
    }
    // The member's real Job controller completes the Job from the pod we finished.
    wait_for("the m1 Job Complete", Duration::from_secs(30), || async {
        let j = jobs(&members["m1"], "premium").await.into_iter().next()?;
        j.status?.conditions?.iter().any(|c| c.type_ == "Complete" && c.status == "True").then_some(())
    })
    .await;

    // Settled: the cache is looked at again every 3 polls (6 s here), from the member's
    // watches of its staging objects — the controller sends m1 no LIST of them over two of
    // those looks (m1's audit log, the controller's User-Agent; other clients may list); nor
    // do the deletion sweep's passes meanwhile (every 4 s), which read the same watches.
    let log = fleet.audit_log("m1").expect("audited");
    let from = harness::apiserver::audit_end(&log);
    let reconciles = || ctl.metric_sum("flotilla_controller_reconciles_total", "kind=\"ModelCache\"");
    let looked = reconciles();
    let sweeps = || ctl.metric_sum("flotilla_controller_member_sweeps_total", "outcome=\"Swept\"");
    let swept = sweeps();
    tokio::time::sleep(Duration::from_secs(14)).await;
    assert!(reconciles() >= looked + 1.0, "the settled cache was looked at again meanwhile");
    assert!(sweeps() >= swept + 2.0, "the sweep passed over the members meanwhile");
    // A read that falls back to listing (`cache::members::listed`) always lists the cache's Jobs
    // and Secrets, and the sweep's lists its Jobs, volume claims and Secrets: those must not
    // appear. `LIST pods` is left out: one CI run (of many) saw a `LIST pods` alone in the
    // window — no Jobs or Secrets listed with it, so not a fallback read of the cache; where it
    // came from (a pod watch re-listing?) is not found yet.
    let lists: Vec<(String, f64)> = harness::apiserver::audited(&log, flotilla_controllers::USER_AGENT, from)
        .into_iter()
        .filter(|(k, _)| ["LIST jobs", "LIST persistentvolumeclaims", "LIST secrets"].contains(&k.as_str()))
        .collect();
    assert!(lists.is_empty(), "a settled cache is re-checked without listing the member: {lists:?}");
    foreign::another_installations_staging_objects_survive_the_sweep(&control, &members["m1"]).await;

    let premium_version = caches.get("premium").await.unwrap().resource_version();

    // 2. By placement: `chat` (1 replica each on m2 and m3) stages `llama` there. Replicas wait.
    let seen: Seen = Arc::default();
    let watches: Vec<_> =
        ["m2", "m3"].into_iter().map(|m| watch_replicas(m, members[m].clone(), seen.clone())).collect();
    apply(&control, cache("llama", json!({"deployments": ["chat"]}), Some(&digest))).await;
    apply(&control, model("chat", 2, &["m2", "m3"])).await;
    let (_, pod2) = staging_pod(&members["m2"], "llama").await;
    let (_, pod3) = staging_pod(&members["m3"], "llama").await;
    assert!(jobs(&members["m1"], "llama").await.is_empty(), "chat is not placed on m1: no Job there");
    wait_for("chat waits for the cache in m2 and m3", Duration::from_secs(30), || async {
        let s = mds.get("chat").await.ok()?.status?;
        let c = s.conditions.get("WaitingForCache")?;
        (c.status == "True" && c.reason == "CacheNotReady" && c.message.contains("m2 (") && c.message.contains("m3 ("))
            .then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await; // several reconciles while the cache is Pending
    // m3's staging finds a digest mismatch: Failed with that reason, and the Job fails at once.
    set_container(&members["m3"], &pod3, terminated(14, &mismatch_result(&digest)), "Failed").await;
    assert_eq!(wait_phase(&caches, "llama", "m3", CachePhase::Failed).await.as_deref(), Some("DigestMismatch"));
    wait_for("the m3 Job failed by its podFailurePolicy", Duration::from_secs(30), || async {
        let j = jobs(&members["m3"], "llama").await.into_iter().next()?;
        j.status?.conditions?.iter().any(|c| c.type_ == "Failed" && c.status == "True").then_some(())
    })
    .await;
    // m2 becomes Ready: only now may a replica start there.
    let gate_m2 = Instant::now();
    set_container(&members["m2"], &pod2, terminated(0, &ready_result(&digest)), "Succeeded").await;
    wait_phase(&caches, "llama", "m2", CachePhase::Ready).await;
    provide_volume(&members["m2"], "flotilla-cache-llama").await;
    wait_for("a chat replica Ready on m2", Duration::from_secs(30), || async {
        let s = mds.get("chat").await.ok()?.status?;
        (s.placements.iter().find(|p| p.cluster == "m2")?.ready == 1).then_some(())
    })
    .await;
    let s = caches.get("llama").await.unwrap().status.unwrap();
    assert_eq!(s.ready_clusters.as_deref(), Some("1/2"));
    assert_eq!(s.conditions.get("Staged").unwrap().reason, "DigestMismatch");
    let c = mds.get("chat").await.unwrap().status.unwrap().conditions.get("WaitingForCache").cloned().unwrap();
    assert!(
        c.status == "True" && c.message.contains("m3 (Failed: DigestMismatch)") && !c.message.contains("m2"),
        "{c:?}"
    );

    // 3. A second deployment of the same cache on m2, then scaling it out: no second Job.
    let job_m2 = jobs(&members["m2"], "llama").await;
    apply(&control, model("chat2", 1, &["m2"])).await;
    wait_for("chat2 Ready at once on m2", Duration::from_secs(30), || async {
        let s = mds.get("chat2").await.ok()?.status?;
        (s.ready_replicas == 1).then_some(())
    })
    .await;
    mds.patch("chat2", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"replicas": 3}}))).await.unwrap();
    wait_for("chat2 scaled out to 3 on m2", Duration::from_secs(30), || async {
        (mds.get("chat2").await.ok()?.status?.ready_replicas == 3).then_some(())
    })
    .await;
    let after = jobs(&members["m2"], "llama").await;
    assert_eq!(after.len(), 1, "one Job per cluster");
    assert_eq!(after[0].uid(), job_m2[0].uid(), "the same Job: nothing downloaded again");

    // Replicas never started before the cache was Ready in their cluster; never in m3.
    let events = seen.lock().unwrap().clone();
    for (at, member, what, n) in &events {
        if *n > 0 && *member == "m2" {
            assert!(*at > gate_m2, "a {what} on m2 with {n} before the cache was Ready there");
        }
        assert!(!(*member == "m3" && *n > 0), "a {what} with {n} on m3, where the cache failed");
    }
    assert!(events.iter().any(|(_, m, w, n)| *m == "m2" && *w == "Pod" && *n > 0), "the watch saw m2's replicas");
    for w in watches {
        w.abort();
    }

    // 4. Deleting the cache waits while deployments mount it, then removes its objects.
    caches.delete("llama", &DeleteParams::default()).await.unwrap();
    wait_for("llama says who uses it", Duration::from_secs(30), || async {
        let c = caches.get("llama").await.ok()?.status?.conditions.get("Ready")?.clone();
        (c.reason == "InUse" && c.message.contains("ml/chat") && c.message.contains("ml/chat2")).then_some(())
    })
    .await;
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(members["m2"].clone(), "ml");
    assert!(
        pvcs.get_opt("flotilla-cache-llama").await.unwrap().is_some_and(|p| p.metadata.deletion_timestamp.is_none())
    );
    for d in ["chat", "chat2"] {
        mds.delete(d, &DeleteParams::default()).await.unwrap();
    }
    wait_for("llama gone with its volumes and Jobs", Duration::from_secs(45), || async {
        let gone = caches.get_opt("llama").await.ok()?.is_none();
        let mut clean = true;
        for m in ["m2", "m3"] {
            clean &= jobs(&members[m], "llama").await.is_empty();
            let p = Api::<PersistentVolumeClaim>::namespaced(members[m].clone(), "ml");
            clean &=
                p.get_opt("flotilla-cache-llama").await.ok()?.is_none_or(|p| p.metadata.deletion_timestamp.is_some());
        }
        (gone && clean).then_some(())
    })
    .await;
    assert_eq!(jobs(&members["m1"], "premium").await.len(), 1, "the other cache is untouched");
    // Reconciled many times since (every deployment change triggers it), never rewritten.
    assert_eq!(
        caches.get("premium").await.unwrap().resource_version(),
        premium_version,
        "a quiet cache writes nothing"
    );

    // 5. m1 stops matching the selector: it leaves premium's status (0/0, no m1 entry), its
    // objects there go, and the settled status is then not rewritten.
    let ics = Api::<flotilla_apis::InferenceCluster>::all(control.clone());
    ics.patch("m1", &PatchParams::default(), &Patch::Merge(&json!({"metadata": {"labels": {"tier": "basic"}}})))
        .await
        .unwrap();
    wait_for("m1 leaves premium's status", Duration::from_secs(45), || async {
        let s = caches.get("premium").await.ok()?.status?;
        (s.clusters.is_empty() && s.ready_clusters.as_deref() == Some("0/0") && s.summary.is_none()).then_some(())
    })
    .await;
    assert!(jobs(&members["m1"], "premium").await.is_empty(), "a cluster that is no longer a target is cleaned");
    let settled = caches.get("premium").await.unwrap().resource_version();
    tokio::time::sleep(Duration::from_secs(8)).await; // past a settled requeue (3 polls of 2 s)
    assert_eq!(caches.get("premium").await.unwrap().resource_version(), settled, "no write once settled");
    ctl.kill();
    eprintln!("e2e_cache took {:?}", started.elapsed());
}
