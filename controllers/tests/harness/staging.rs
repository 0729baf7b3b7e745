//! Playing the staging program on kwok members, which run no containers: the staging Job's
//! pod gets the container state and termination message (a `StageResult` line) the real
//! program would leave, and the members' real Job controllers turn that into the Job's
//! completion or failure; a pre-bound volume stands in for the storage provisioner. Caches
//! live in namespace `ml`.

use std::time::Duration;

use flotilla_apis::cache::CachePhase;
use flotilla_apis::stage::StageResult;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolume, Pod};
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use super::wait_for;

/// What the real program writes when `source` staged and verified as `digest`.
pub fn ready_result(source: &str, digest: &str) -> String {
    StageResult {
        phase: CachePhase::Ready,
        reason: None,
        message: format!("2 files, 6 bytes staged and verified; manifest {digest}"),
        source: source.into(),
        file: None,
        digest: Some(digest.into()),
        expected_digest: Some(digest.into()),
        resolved: Some("0123456789abcdef0123456789abcdef01234567".into()),
        files: 2,
        bytes: 6,
    }
    .to_line()
}

/// The staging Jobs of `cache` in a member.
pub async fn jobs(client: &Client, cache: &str) -> Vec<Job> {
    let lp = ListParams::default().labels(&format!("flotilla.dev/cache=ml.{cache}"));
    Api::<Job>::namespaced(client.clone(), "ml").list(&lp).await.map(|l| l.items).unwrap_or_default()
}

/// The one Job of a cache in a member, once it exists, and its pod once the Job controller made it.
pub async fn staging_pod(client: &Client, cache: &str) -> (Job, Pod) {
    let job = wait_for(&format!("the staging Job of {cache}"), Duration::from_secs(30), || async {
        jobs(client, cache).await.into_iter().next()
    })
    .await;
    let lp = ListParams::default().labels(&format!("batch.kubernetes.io/job-name={}", job.name_any()));
    let pods = Api::<Pod>::namespaced(client.clone(), "ml");
    let pod = wait_for("the staging pod", Duration::from_secs(30), || async {
        pods.list(&lp).await.ok()?.items.into_iter().next()
    })
    .await;
    (job, pod)
}

/// Plays the container: running, or terminated with an exit code and termination message.
pub async fn set_container(client: &Client, pod: &Pod, state: serde_json::Value, phase: &str) {
    let patch = json!({"status": {"phase": phase, "containerStatuses": [{"name": "stage", "image": "flotilla-stage",
        "imageID": "", "ready": phase == "Running", "restartCount": 0, "started": phase == "Running", "state": state}]}});
    Api::<Pod>::namespaced(client.clone(), "ml")
        .patch_status(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// Plays the storage provisioner (kwok members have none): a volume pre-bound to the claim.
/// Done only once staging finished there, so the staging pod itself is never scheduled and
/// kwok never plays its container in our stead.
pub async fn provide_volume(client: &Client, claim: &str) {
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": format!("pv-{claim}")},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteMany"], "persistentVolumeReclaimPolicy": "Retain",
                 "hostPath": {"path": format!("/tmp/{claim}")}, "claimRef": {"namespace": "ml", "name": claim}}
    }))
    .unwrap();
    Api::<PersistentVolume>::all(client.clone()).create(&PostParams::default(), &pv).await.unwrap();
}

/// A terminated container state with `exit` and the termination `message`.
pub fn terminated(exit: i32, message: &str) -> serde_json::Value {
    let t = "2026-11-29T00:00:00Z";
    json!({"terminated": {"exitCode": exit, "reason": if exit == 0 { "Completed" } else { "Error" }, "message": message,
        "startedAt": t, "finishedAt": t}})
}

/// Stages `cache` in a member as the real program would: its Job's pod terminates with a
/// verified `digest`, and its volume is provided.
pub async fn stage_ready(client: &Client, cache: &str, source: &str, digest: &str) {
    let (_, pod) = staging_pod(client, cache).await;
    set_container(client, &pod, terminated(0, &ready_result(source, digest)), "Succeeded").await;
    provide_volume(client, &format!("flotilla-cache-{cache}")).await;
}
