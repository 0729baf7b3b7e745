//! What the steady window holds besides the converged deployments: `FLOTILLA_BENCH_CACHES`
//! ModelCaches, each staged in two members by cluster selector and Ready there before the window
//! (kwok runs no containers, so the benchmark plays the staging program as `e2e_cache.rs` does:
//! the `StageResult` the real program writes, as the Job pod's termination message; the
//! member's Job controller completes the Job), and, during the window, inventory churn on
//! `FLOTILLA_BENCH_CHURN_MEMBERS` members every `FLOTILLA_BENCH_CHURN_SECONDS`: a label of one
//! GPU node changes and the ResourceSlice of another is republished with the next pool
//! generation, neither changing a device Flotilla counts. What it should cost the controller:
//! nothing — no LIST and no write on any API server ([`rates_header`], [`rates_row`]: each API
//! server's LISTs and writes per minute, every client's from its metrics, the controller's from
//! its audit log).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use flotilla_apis::ModelCache;
use flotilla_apis::cache::CachePhase;
use flotilla_apis::stage::{ManifestFile, StageManifest, StageResult};
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{ListParams, Patch, PatchParams};
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::Window;
use crate::fleet::Params;
use crate::harness::{apiserver, apply};

const SOURCE: &str = "hf://org/cached-model";

/// The ModelCaches staged for the steady window.
pub struct Caches {
    /// How many, and the (cache, member) stagings.
    pub caches: usize,
    pub stagings: usize,
    /// Applied → Ready in every target member.
    pub ready: Option<Duration>,
}

/// Applies `p.caches` ModelCaches over `members` (two each, round the list), plays their staging
/// to a verified `Ready` and waits for every one's status to say so.
pub async fn stage_caches(control: &Client, members: &[(String, Client)], p: &Params) -> Caches {
    let start = Instant::now();
    let mut targets = Vec::new();
    for i in 0..p.caches {
        let pair: Vec<&(String, Client)> =
            (0..2.min(members.len())).map(|k| &members[(i * 2 + k) % members.len()]).collect();
        let names: Vec<&str> = pair.iter().map(|(n, _)| n.as_str()).collect();
        let name = format!("cache-{i}");
        apply(
            control,
            json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelCache", "metadata": {"name": name, "namespace": "ml"},
                "spec": {"source": SOURCE, "size": "1Gi",
                         "targets": {"clusterSelector": {"matchExpressions": [
                             {"key": "flotilla.dev/cluster", "operator": "In", "values": names}]}}}}),
        )
        .await;
        targets.push((name, pair));
    }
    let files = vec![
        ManifestFile { path: "config.json".into(), size: 3, sha256: "a".repeat(64) },
        ManifestFile { path: "model.safetensors".into(), size: 3, sha256: "b".repeat(64) },
    ];
    let digest = StageManifest::new(SOURCE.into(), None, files).digest;
    let timeout = Duration::from_secs(p.timeout_seconds.min(300));
    let mut stagings = 0;
    for (name, pair) in &targets {
        for (member, client) in pair {
            match staging_pod(client, name, timeout).await {
                Some(pod) => {
                    finish(client, &pod, &digest).await;
                    stagings += 1;
                }
                None => println!("# caches: no staging pod of {name} in {member} after {timeout:?}"),
            }
        }
    }
    let api: Api<ModelCache> = Api::namespaced(control.clone(), "ml");
    let mut ready = None;
    while start.elapsed() < timeout {
        let mut all = true;
        for (name, pair) in &targets {
            let status = api.get(name).await.ok().and_then(|c| c.status);
            let n = status.iter().flat_map(|s| &s.clusters).filter(|c| c.phase == CachePhase::Ready).count();
            all &= n == pair.len();
        }
        if all {
            ready = Some(start.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Caches { caches: targets.len(), stagings, ready }
}

/// The cache's staging Job's pod in a member, once the controller and the Job controller made it.
async fn staging_pod(client: &Client, cache: &str, timeout: Duration) -> Option<Pod> {
    let start = Instant::now();
    let jobs: Api<Job> = Api::namespaced(client.clone(), "ml");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "ml");
    let by_cache = ListParams::default().labels(&format!("flotilla.dev/cache=ml.{cache}"));
    while start.elapsed() < timeout {
        if let Some(job) = jobs.list(&by_cache).await.ok().and_then(|l| l.items.into_iter().next()) {
            let lp = ListParams::default().labels(&format!("batch.kubernetes.io/job-name={}", job.name_any()));
            if let Some(pod) = pods.list(&lp).await.ok().and_then(|l| l.items.into_iter().next()) {
                return Some(pod);
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    None
}

/// Plays the staging container's end: exit 0 with the verified `Ready` result.
async fn finish(client: &Client, pod: &Pod, digest: &str) {
    let result = StageResult {
        phase: CachePhase::Ready,
        reason: None,
        message: format!("2 files, 6 bytes staged and verified; manifest {digest}"),
        source: SOURCE.into(),
        file: None,
        digest: Some(digest.into()),
        expected_digest: None,
        resolved: Some("0123456789abcdef0123456789abcdef01234567".into()),
        files: 2,
        bytes: 6,
    }
    .to_line();
    let t = "2026-12-01T00:00:00Z";
    let state = json!({"terminated": {"exitCode": 0, "reason": "Completed", "message": result, "startedAt": t, "finishedAt": t}});
    let patch = json!({"status": {"phase": "Succeeded", "containerStatuses": [{"name": "stage", "image": "flotilla-stage",
        "imageID": "", "ready": false, "restartCount": 0, "started": false, "state": state}]}});
    if let Err(e) = Api::<Pod>::namespaced(client.clone(), "ml")
        .patch_status(&pod.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        println!("# caches: cannot finish the staging pod {}: {e}", pod.name_any());
    }
}

/// Inventory churn while it runs: what it changed, and its first refusal.
#[derive(Default)]
pub struct Churn {
    pub nodes: AtomicUsize,
    pub slices: AtomicUsize,
    pub refused: AtomicUsize,
    pub first_refusal: std::sync::Mutex<Option<String>>,
}

/// Every `every`, on each of `members`, a label of one H100 node (`bench.flotilla.dev/churn`)
/// changes and another node's ResourceSlice gets the next pool generation; until aborted.
pub fn churn(
    members: Vec<(String, Client)>,
    h100_nodes: u32,
    every: Duration,
) -> (Arc<Churn>, tokio::task::JoinHandle<()>) {
    let counts = Arc::new(Churn::default());
    let c = counts.clone();
    let task = tokio::spawn(async move {
        let mut tick: u32 = 0;
        loop {
            tokio::time::sleep(every).await;
            tick += 1;
            let node = format!("h100-{}", tick % h100_nodes);
            let slice = format!("h100-{}-gpu.nvidia.com", (tick + 1) % h100_nodes);
            for (_, client) in &members {
                let label = json!({"metadata": {"labels": {"bench.flotilla.dev/churn": tick.to_string()}}});
                let r =
                    Api::<Node>::all(client.clone()).patch(&node, &PatchParams::default(), &Patch::Merge(&label)).await;
                c.count(r.map(|_| ()), &c.nodes);
                let generation = json!({"spec": {"pool": {"generation": 1 + tick}}});
                let r = Api::<ResourceSlice>::all(client.clone())
                    .patch(&slice, &PatchParams::default(), &Patch::Merge(&generation))
                    .await;
                c.count(r.map(|_| ()), &c.slices);
            }
        }
    });
    (counts, task)
}

impl Churn {
    fn count(&self, r: Result<(), kube::Error>, done: &AtomicUsize) {
        match r {
            Ok(()) => {
                done.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => {
                self.refused.fetch_add(1, Ordering::Relaxed);
                if let Ok(mut first) = self.first_refusal.lock() {
                    first.get_or_insert_with(|| e.to_string());
                }
            }
        }
    }

    pub fn describe(&self) -> String {
        let refused = self.refused.load(Ordering::Relaxed);
        let mut s = format!(
            "{} node label changes, {} ResourceSlice republications",
            self.nodes.load(Ordering::Relaxed),
            self.slices.load(Ordering::Relaxed)
        );
        if refused > 0 {
            let first = self.first_refusal.lock().ok().and_then(|f| f.clone()).unwrap_or_default();
            s.push_str(&format!(", {refused} refused (first: {first})"));
        }
        s
    }
}

/// (LISTs, writes) in a reading of requests.
fn lists_writes(r: &apiserver::Requests) -> (f64, f64) {
    let verb = |k: &String| k.split(' ').next().unwrap_or("").to_string();
    // Folded from +0.0: an empty `sum` of floats is -0.0, printed as such.
    let lists = r.iter().filter(|(k, _)| verb(k) == "LIST").fold(0.0, |n, (_, v)| n + v);
    let writes =
        r.iter().filter(|(k, _)| apiserver::WRITE_VERBS.contains(&verb(k).as_str())).fold(0.0, |n, (_, v)| n + v);
    (lists, writes)
}

pub fn rates_header() -> &'static str {
    "| API server, steady window | LISTs per minute, every client (its metrics) | writes per minute, every client (its metrics) | the controller's LISTs per minute (audit log) | the controller's writes per minute (audit log) |"
}

/// One row per API server of `steady`.
pub fn rates_rows(steady: &Window) -> Vec<String> {
    let minutes = steady.took.as_secs_f64() / 60.0;
    steady
        .grown
        .iter()
        .map(|(server, grown)| {
            let (l, w) = lists_writes(grown);
            let (cl, cw) = steady.audited.get(server).map(lists_writes).unwrap_or_default();
            format!(
                "| {server} | {:.1} | {:.1} | {:.1} | {:.1} |",
                l / minutes.max(1e-9),
                w / minutes.max(1e-9),
                cl / minutes.max(1e-9),
                cw / minutes.max(1e-9)
            )
        })
        .collect()
}

/// The controller's LISTs + writes per minute on its busiest API server in `steady` (audit log).
pub fn controller_busiest(steady: &Window) -> (String, f64) {
    let minutes = steady.took.as_secs_f64() / 60.0;
    steady
        .audited
        .iter()
        .map(|(n, g)| {
            let (l, w) = lists_writes(g);
            (n.clone(), (l + w) / minutes.max(1e-9))
        })
        .max_by(|a, b| a.1.total_cmp(&b.1))
        .unwrap_or_else(|| ("—".into(), 0.0))
}
