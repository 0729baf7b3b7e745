//! What the ModelCache reconciler does to one member cluster: observe the volume claim, the
//! staging Jobs and the current Job's pods (and the last progress line of a running one), apply
//! the rendered volume claim and credentials Secret when their content hash differs, create the
//! Job only when it does not exist yet (a finished Job is the proof that the files are there:
//! it is never run again for the same spec), delete Jobs of an earlier spec, and on cleanup
//! delete every object with the cache's and this installation's labels (or, for a cache refused for its
//! `credentialsRef`, only the credentials copy). Nothing without them is touched.

use std::collections::BTreeMap;
use std::time::Duration;

use flotilla_apis::ModelCache;
use flotilla_apis::constants::labels;
use flotilla_apis::stage::StageEvent;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Secret};
use kube::api::{DeleteParams, ListParams, LogParams};
use kube::core::PartialObjectMeta;
use kube::{Api, Client, ResourceExt};
use serde_json::Value;

use super::render::{cache_key, credentials_secret_name, job_name, pvc_name, selector};
use super::status::MemberObjects;
use crate::deployment::members::{self as md_members, HASH_ANNOTATION, MemberState};
use crate::member::Handle;
use crate::member::staging::StagingNs;

/// One member's objects for the cache, and the hashes of what was applied.
pub struct Observed {
    /// What the status is computed from.
    pub objects: MemberObjects,
    /// `Kind/name` → rendered hash, for apply.
    pub state: MemberState,
    /// Jobs of an earlier spec.
    pub stale_jobs: Vec<String>,
}

fn record<K: kube::Resource>(state: &mut MemberState, kind: &str, o: &K) {
    if let Some(h) = o.meta().annotations.as_ref().and_then(|a| a.get(HASH_ANNOTATION)) {
        state.hashes.insert(format!("{kind}/{}", o.meta().name.clone().unwrap_or_default()), h.clone());
    }
}

/// The cache's objects in a member as read: the volume claim, Secrets' metadata, Jobs and
/// the current Job's pods.
struct Read {
    pvc: Option<PersistentVolumeClaim>,
    secrets: Vec<PartialObjectMeta<Secret>>,
    jobs: Vec<Job>,
    pods: Vec<Pod>,
}

/// Observes the cache's objects in a member — from the member's staging watches when they are
/// synced (`member/staging.rs`: no request), else by listing them — keeping those of
/// installation `install` (or of a release before install labels); another installation's
/// object of the same name is not evidence.
pub async fn observe(
    member: &Handle,
    cache: &ModelCache,
    install: &str,
    wait: Duration,
) -> Result<Observed, kube::Error> {
    let ns = cache.namespace().unwrap_or_else(|| "default".into());
    let read = match member.objects.staging.synced(&ns, wait).await {
        Some(cached) => from_watches(&cached, cache),
        None => listed(&member.client, cache, &ns).await?,
    };
    Ok(assemble(&member.client, cache, install, &ns, read).await)
}

/// What the staging watches hold of the cache.
fn from_watches(cached: &StagingNs, cache: &ModelCache) -> Read {
    let key = cache_key(cache);
    let of_cache = |m: &kube::api::ObjectMeta| m.labels.as_ref().and_then(|l| l.get(labels::CACHE)) == Some(&key);
    let pvc_name = pvc_name(&cache.name_any());
    let current = job_name(cache);
    Read {
        pvc: cached.pvcs.state().into_iter().find(|p| p.name_any() == pvc_name).map(|p| p.as_ref().clone()),
        secrets: cached
            .secrets
            .state()
            .into_iter()
            .filter(|s| of_cache(&s.metadata))
            .map(|s| s.as_ref().clone())
            .collect(),
        jobs: cached.jobs.state().into_iter().filter(|j| of_cache(&j.metadata)).map(|j| j.as_ref().clone()).collect(),
        pods: cached
            .pods
            .state()
            .into_iter()
            .filter(|p| p.labels().get(JOB_NAME).is_some_and(|j| *j == current))
            .map(|p| p.as_ref().clone())
            .collect(),
    }
}

/// The label a Job's pods carry with its name.
const JOB_NAME: &str = "batch.kubernetes.io/job-name";

/// The cache's objects, listed (and the volume claim read by name).
async fn listed(client: &Client, cache: &ModelCache, ns: &str) -> Result<Read, kube::Error> {
    let lp = ListParams::default().labels(&selector(cache));
    let pvc =
        Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns).get_opt(&pvc_name(&cache.name_any())).await?;
    let secrets = Api::<Secret>::namespaced(client.clone(), ns).list_metadata(&lp).await?.items;
    let jobs = Api::<Job>::namespaced(client.clone(), ns).list(&lp).await?.items;
    let current = job_name(cache);
    let pods = if jobs.iter().any(|j| j.name_any() == current) {
        Api::<Pod>::namespaced(client.clone(), ns)
            .list(&ListParams::default().labels(&format!("{JOB_NAME}={current}")))
            .await?
            .items
    } else {
        Vec::new()
    };
    Ok(Read { pvc, secrets, jobs, pods })
}

/// What was read, as the status and the apply step see it: this installation's objects, the
/// hashes of what was applied, Jobs of an earlier spec, and the running pod's progress.
async fn assemble(client: &Client, cache: &ModelCache, install: &str, ns: &str, read: Read) -> Observed {
    let mut state = MemberState::default();
    let pvc = read.pvc.filter(|p| md_members::ours_or_legacy(&p.metadata, install));
    if let Some(p) = &pvc {
        record(&mut state, "PersistentVolumeClaim", p);
    }
    for s in read.secrets.iter().filter(|s| md_members::ours_or_legacy(&s.metadata, install)) {
        record(&mut state, "Secret", s);
    }
    let current = job_name(cache);
    let mut job = None;
    let mut stale_jobs = Vec::new();
    for j in read.jobs.into_iter().filter(|j| md_members::ours_or_legacy(&j.metadata, install)) {
        if j.name_any() == current {
            job = Some(j);
        } else if j.metadata.deletion_timestamp.is_none() {
            stale_jobs.push(j.name_any());
        }
    }
    let pods = if job.is_some() { read.pods } else { Vec::new() };
    let progress = progress(client, ns, &pods).await;
    Observed { objects: MemberObjects { pvc, job, pods, progress, apply_error: None }, state, stale_jobs }
}

/// The last progress line of the newest pod, while it runs: best effort (no log, no progress).
async fn progress(client: &Client, ns: &str, pods: &[Pod]) -> Option<flotilla_apis::stage::StageProgress> {
    let newest = pods.iter().max_by_key(|p| p.metadata.creation_timestamp.as_ref().map(|t| t.0.as_second()))?;
    if newest.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Running") {
        return None;
    }
    let lp = LogParams { container: Some("stage".into()), tail_lines: Some(5), ..LogParams::default() };
    let text = Api::<Pod>::namespaced(client.clone(), ns).logs(&newest.name_any(), &lp).await.ok()?;
    text.lines().rev().find_map(|l| match serde_json::from_str::<StageEvent>(l.trim()) {
        Ok(StageEvent::Progress(p)) => Some(p),
        _ => None,
    })
}

/// Applies the volume claim and Secret when they changed, creates the Job when missing, and
/// deletes Jobs of an earlier spec. Returns how many writes were made.
pub async fn apply(
    client: &Client,
    field_manager: &str,
    stamp: md_members::Stamp<'_>,
    objects: &[Value],
    observed: &Observed,
) -> Result<usize, kube::Error> {
    let todo: Vec<Value> =
        objects.iter().filter(|o| o["kind"] != "Job" || observed.objects.job.is_none()).cloned().collect();
    let mut written =
        md_members::apply_with(client, field_manager, stamp, &todo, &observed.state, None, |_, _, _, _, _| {})
            .await?
            .written;
    if let Some(ns) = objects.first().and_then(|o| o["metadata"]["namespace"].as_str()) {
        let jobs = Api::<Job>::namespaced(client.clone(), ns);
        for name in &observed.stale_jobs {
            jobs.delete(name, &DeleteParams::background()).await?;
            written += 1;
        }
    }
    Ok(written)
}

/// Deletes every object of the cache that installation `install` wrote in a member (Jobs with
/// their pods, the volume claim, the Secret); another installation's objects of the same cache
/// name stay. Returns how many were deleted.
pub async fn remove(client: &Client, cache: &ModelCache, install: &str) -> Result<usize, kube::Error> {
    let ns = cache.namespace().unwrap_or_else(|| "default".into());
    let lp = ListParams::default().labels(&selector(cache));
    let dp = DeleteParams::background();
    let mut deleted = 0;
    let jobs = Api::<Job>::namespaced(client.clone(), &ns);
    for j in jobs.list_metadata(&lp).await?.items {
        if j.metadata.deletion_timestamp.is_none() && md_members::is_ours(&j.metadata, install) {
            jobs.delete(&j.name_any(), &dp).await?;
            deleted += 1;
        }
    }
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), &ns);
    for p in pvcs.list_metadata(&lp).await?.items {
        if p.metadata.deletion_timestamp.is_none() && md_members::is_ours(&p.metadata, install) {
            pvcs.delete(&p.name_any(), &dp).await?;
            deleted += 1;
        }
    }
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns);
    for s in secrets.list_metadata(&lp).await?.items {
        if md_members::is_ours(&s.metadata, install) {
            secrets.delete(&s.name_any(), &dp).await?;
            deleted += 1;
        }
    }
    Ok(deleted)
}

/// Deletes the member copy of the cache's credentials Secret, if there is one with the cache's
/// labels. Returns whether one was deleted.
pub async fn remove_credentials(client: &Client, cache: &ModelCache, install: &str) -> Result<bool, kube::Error> {
    let ns = cache.namespace().unwrap_or_else(|| "default".into());
    let secrets = Api::<Secret>::namespaced(client.clone(), &ns);
    let name = credentials_secret_name(&cache.name_any());
    let Some(s) = secrets.get_metadata_opt(&name).await? else { return Ok(false) };
    let ours = s.metadata.labels.as_ref().and_then(|l| l.get(labels::CACHE)) == Some(&cache_key(cache))
        && md_members::ours_or_legacy(&s.metadata, install);
    if !ours {
        return Ok(false);
    }
    secrets.delete(&name, &DeleteParams::background()).await?;
    Ok(true)
}

/// The data of the control cluster's credentials Secret, base64 as in the API (`None` when
/// it does not exist).
pub async fn credentials(
    control: &Client,
    ns: &str,
    name: &str,
) -> Result<Option<BTreeMap<String, String>>, kube::Error> {
    let Some(s) = Api::<Secret>::namespaced(control.clone(), ns).get_opt(name).await? else {
        return Ok(None);
    };
    let mut data: BTreeMap<String, String> = BTreeMap::new();
    for (k, v) in s.data.unwrap_or_default() {
        if let Value::String(b64) = serde_json::to_value(&v).map_err(kube::Error::SerdeError)? {
            data.insert(k, b64);
        }
    }
    Ok(Some(data))
}
