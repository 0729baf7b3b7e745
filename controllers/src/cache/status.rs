//! The status a ModelCache should have. Which clusters it targets (selector over the
//! InferenceClusters' labels, plus wherever the named deployments are placed); in each, the phase
//! read from what the member reports — the volume claim, the staging Job, its pods' termination
//! messages (`StageResult`, else the exit code, else `JobFailed`) and the last progress line —
//! following `docs/staging.md`; which deployments still use it where; and the aggregate
//! conditions. Ready in a cluster only from a `Ready` result for this source and digest. Pure:
//! a reconcile that learns nothing new computes the same status and writes nothing.

use std::collections::{BTreeMap, BTreeSet};

use flotilla_apis::cache::{CachePhase, ClusterCacheStatus, ModelCacheStatus};
use flotilla_apis::conditions::{Desired, Status, merge};
use flotilla_apis::constants::{condition, reason};
use flotilla_apis::stage::{StageProgress, StageReason, StageResult};
use flotilla_apis::{InferenceCluster, ModelCache, ModelDeployment};
use flotilla_placement::filters::selector_matches;
use flotilla_placement::snapshot::cluster_labels;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

use crate::deployment::adapters::{Place, outside_policy};

/// What one member holds for the cache.
#[derive(Clone, Debug, Default)]
pub struct MemberObjects {
    /// The volume claim.
    pub pvc: Option<PersistentVolumeClaim>,
    /// The staging Job for the current spec.
    pub job: Option<Job>,
    /// That Job's pods.
    pub pods: Vec<Pod>,
    /// The last progress line the running pod printed, if its log could be read.
    pub progress: Option<StageProgress>,
    /// Why writing the missing objects failed (the member refused them), if it did.
    pub apply_error: Option<String>,
}

/// What the reconcile learned about one target cluster.
#[derive(Clone, Debug)]
pub enum Observation {
    /// The member answered.
    Seen(Box<MemberObjects>),
    /// It did not (or the objects could not be written): why.
    Unreachable(String),
}

/// The clusters the cache stages in: those its selector matches, and those where the named
/// deployments (same namespace, not being deleted) have replicas desired or running. A named
/// deployment that uses the cache only for adapters (`spec.adapters[].cacheRef`, not
/// `model.cacheRef`) brings only the clusters one of those adapters' policies allows
/// (`deployment/adapters.rs`): an adapter's files are never staged where it may not be served.
pub fn targets(
    cache: &ModelCache,
    clusters: &[&InferenceCluster],
    deployments: &[&ModelDeployment],
) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    if let Some(sel) = &cache.spec.targets.cluster_selector {
        for c in clusters {
            if selector_matches(sel, &cluster_labels(c)).is_ok() {
                out.insert(c.metadata.name.clone().unwrap_or_default());
            }
        }
    }
    let ns = cache.metadata.namespace.as_deref().unwrap_or("default");
    for d in deployments {
        let name = d.metadata.name.as_deref().unwrap_or("");
        if d.metadata.namespace.as_deref().unwrap_or("default") == ns
            && d.metadata.deletion_timestamp.is_none()
            && cache.spec.targets.deployments.iter().any(|t| t == name)
        {
            let mut wanted = placed_in(d);
            // Scaled to zero by its autoscaler: the weights stay where they are staged, so
            // the next start from zero does not download them again.
            if parked_at_zero(d) {
                wanted.extend(cache.status.iter().flat_map(|s| &s.clusters).map(|c| c.cluster.clone()));
            }
            out.extend(wanted.into_iter().filter(|c| serves_there(cache, d, clusters, c)));
        }
    }
    out
}

/// Whether deployment `d` may use `cache` in `cluster`: always when it is the model's cache
/// (or not one `d` names at all); when only adapters name it, where one of them is allowed
/// ([`outside_policy`]), and never in a cluster not among `clusters`.
fn serves_there(cache: &ModelCache, d: &ModelDeployment, clusters: &[&InferenceCluster], cluster: &str) -> bool {
    let name = cache.metadata.name.as_deref().unwrap_or("");
    let adapters: Vec<_> = d.spec.adapters.iter().filter(|a| a.cache_ref == name).collect();
    if adapters.is_empty() || d.spec.model.cache_ref.as_deref() == Some(name) {
        return true;
    }
    let Some(ic) = clusters.iter().find(|c| c.metadata.name.as_deref() == Some(cluster)) else { return false };
    let (base, place) = (d.spec.placement.sovereignty.clone().unwrap_or_default(), Place::of(ic));
    adapters.iter().any(|a| outside_policy(a, &base, &place).is_none())
}

/// At zero replicas with `spec.autoscaling.minReplicas: 0`: idle, and started again on demand.
pub(crate) fn parked_at_zero(d: &ModelDeployment) -> bool {
    d.spec.replicas == 0 && d.spec.autoscaling.as_ref().is_some_and(|a| a.min_replicas == 0)
}

pub(crate) fn placed_in(d: &ModelDeployment) -> BTreeSet<String> {
    d.status
        .iter()
        .flat_map(|s| &s.placements)
        .filter(|p| p.desired > 0 || p.ready > 0 || p.serving > 0)
        .map(|p| p.cluster.clone())
        .collect()
}

/// Per cluster, the deployments (`namespace/name`) that mount the cache there (`cacheRef`, or
/// an adapter's `cacheRef` where the adapter is allowed) and have replicas desired or running.
pub fn users(
    cache: &ModelCache,
    deployments: &[&ModelDeployment],
    clusters: &[&InferenceCluster],
) -> BTreeMap<String, Vec<String>> {
    let ns = cache.metadata.namespace.as_deref().unwrap_or("default");
    let name = cache.metadata.name.as_deref().unwrap_or("");
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for d in deployments {
        let mounts =
            d.spec.model.cache_ref.as_deref() == Some(name) || d.spec.adapters.iter().any(|a| a.cache_ref == name);
        if d.metadata.namespace.as_deref().unwrap_or("default") != ns || !mounts {
            continue;
        }
        for cluster in placed_in(d).into_iter().filter(|c| serves_there(cache, d, clusters, c)) {
            out.entry(cluster).or_default().push(format!("{ns}/{}", d.metadata.name.as_deref().unwrap_or("")));
        }
    }
    out
}

fn entry(cluster: &str, phase: CachePhase, reason: &str, message: String) -> ClusterCacheStatus {
    ClusterCacheStatus {
        cluster: cluster.to_string(),
        phase,
        bytes: 0,
        digest: None,
        reason: Some(reason.to_string()),
        message: Some(message),
    }
}

fn terminated(pod: &Pod) -> Option<(i32, Option<String>)> {
    let cs = pod.status.as_ref()?.container_statuses.as_ref()?.iter().find(|c| c.name == "stage")?;
    let t = cs.state.as_ref()?.terminated.as_ref()?;
    Some((t.exit_code, t.message.clone()))
}

fn running(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.name == "stage" && c.state.as_ref().is_some_and(|s| s.running.is_some())))
}

fn job_condition(job: &Job, type_: &str) -> Option<String> {
    let conds = job.status.as_ref()?.conditions.as_ref()?;
    let c = conds.iter().find(|c| c.type_ == type_ && c.status == "True")?;
    Some(c.message.clone().unwrap_or_else(|| c.reason.clone().unwrap_or_default()))
}

/// A finished pod's verdict: the result in its termination message, else its exit code, else
/// `JobFailed` with whatever it left (a log tail).
fn verdict(
    cache: &ModelCache,
    cluster: &str,
    exit: i32,
    message: Option<&str>,
) -> (ClusterCacheStatus, Option<StageReason>) {
    let s = &cache.spec;
    if let Some(r) = message.and_then(StageResult::from_termination_message) {
        let (phase, why, msg) = r.verdict(&s.source, s.digest.as_deref());
        let mut e = entry(cluster, phase, why, msg);
        e.bytes = i64::try_from(r.bytes).unwrap_or(i64::MAX);
        if phase == CachePhase::Ready {
            e.digest = r.digest.clone();
        }
        return (e, if phase == CachePhase::Ready { None } else { r.reason });
    }
    if let Some(r) = StageReason::from_exit_code(exit) {
        let msg = format!("the staging program exited with code {exit} ({}) and left no result", r.as_str());
        return (entry(cluster, CachePhase::Failed, r.as_str(), msg), Some(r));
    }
    let tail: String = message.unwrap_or("").chars().rev().take(512).collect::<Vec<_>>().into_iter().rev().collect();
    let msg = if exit == 0 {
        format!("the staging program exited 0 without a result: {}", tail.trim())
    } else {
        format!("the staging container exited with code {exit}: {}", tail.trim())
    };
    (entry(cluster, CachePhase::Failed, reason::JOB_FAILED, msg.trim_end_matches(": ").to_string()), None)
}

/// The staging state in one target cluster.
pub fn cluster_status(
    cache: &ModelCache,
    cluster: &str,
    observed: &Observation,
    previous: Option<&ClusterCacheStatus>,
) -> ClusterCacheStatus {
    let o = match observed {
        Observation::Seen(o) => o,
        // What the member last reported stays; a new target waits.
        Observation::Unreachable(why) => {
            return previous.cloned().unwrap_or_else(|| {
                entry(
                    cluster,
                    CachePhase::Pending,
                    reason::CACHE_PENDING,
                    format!("the member cannot be reached: {why}"),
                )
            });
        }
    };
    let pvc_phase = o.pvc.as_ref().and_then(|p| p.status.as_ref()?.phase.clone());
    if pvc_phase.as_deref() == Some("Lost") {
        let msg = "the volume claim lost its volume: delete the PersistentVolumeClaim to stage again".to_string();
        return entry(cluster, CachePhase::Failed, reason::STORAGE_UNAVAILABLE, msg);
    }
    let Some(job) = &o.job else {
        return match (&o.apply_error, &o.pvc) {
            (Some(e), None) => entry(
                cluster,
                CachePhase::Failed,
                reason::STORAGE_UNAVAILABLE,
                format!("the member refused the volume claim: {e}"),
            ),
            (Some(e), Some(_)) => entry(
                cluster,
                CachePhase::Failed,
                reason::JOB_FAILED,
                format!("the member refused the staging Job: {e}"),
            ),
            (None, _) => entry(
                cluster,
                CachePhase::Pending,
                reason::CACHE_PENDING,
                "creating the volume and the staging Job".into(),
            ),
        };
    };
    let mut pods: Vec<&Pod> = o.pods.iter().collect();
    pods.sort_by(|a, b| {
        let t = |p: &Pod| p.metadata.creation_timestamp.as_ref().map(|t| t.0.as_second());
        t(a).cmp(&t(b)).then(a.metadata.name.cmp(&b.metadata.name))
    });
    // 1. A pod that finished with exit 0: its result is the verdict.
    if let Some((exit, msg)) = pods.iter().rev().filter_map(|p| terminated(p)).find(|(exit, _)| *exit == 0) {
        return verdict(cache, cluster, exit, msg.as_deref()).0;
    }
    let job_name = job.metadata.name.as_deref().unwrap_or("");
    if let Some(done) = job_condition(job, "Complete") {
        // The pod that proved it is gone (garbage-collected): what was read from it stands.
        if let Some(p) = previous.filter(|p| p.phase == CachePhase::Ready) {
            return p.clone();
        }
        let msg = format!("Job {job_name} completed ({done}) but its pod is gone: delete the Job to stage again");
        return entry(cluster, CachePhase::Failed, reason::JOB_FAILED, msg);
    }
    let last_failure = pods.iter().rev().filter_map(|p| terminated(p)).find(|(exit, _)| *exit != 0);
    // 2. The Job failed: the last failure says why.
    if let Some(why) = job_condition(job, "Failed") {
        return match &last_failure {
            Some((exit, msg)) => verdict(cache, cluster, *exit, msg.as_deref()).0,
            None => entry(cluster, CachePhase::Failed, reason::JOB_FAILED, format!("Job {job_name} failed: {why}")),
        };
    }
    // 3. A pod is staging now.
    if pods.last().is_some_and(|p| running(p)) {
        return match &o.progress {
            Some(p) => {
                let phase =
                    if p.phase == CachePhase::Verifying { CachePhase::Verifying } else { CachePhase::Downloading };
                let why = if phase == CachePhase::Verifying { reason::VERIFYING } else { reason::DOWNLOADING };
                let mut e = entry(
                    cluster,
                    phase,
                    why,
                    format!(
                        "{} of {} files, {} of {} bytes",
                        p.files,
                        p.total_files,
                        p.bytes.max(p.received_bytes),
                        p.total_bytes
                    ),
                );
                e.bytes = i64::try_from(p.bytes.max(p.received_bytes)).unwrap_or(i64::MAX);
                e
            }
            None => entry(cluster, CachePhase::Downloading, reason::DOWNLOADING, format!("Job {job_name} is staging")),
        };
    }
    // 4. A failed attempt: permanent failures end it (the Job's podFailurePolicy fails it too);
    // transient ones are retried by the Job.
    if let Some((exit, msg)) = &last_failure {
        let (mut e, why) = verdict(cache, cluster, *exit, msg.as_deref());
        if why.is_some_and(StageReason::is_transient) {
            e.phase = CachePhase::Pending;
            e.message = Some(format!(
                "retrying after {}: {}",
                e.reason.as_deref().unwrap_or(""),
                e.message.unwrap_or_default()
            ));
        }
        return e;
    }
    // 5. Waiting for the pod to start (volume binding, scheduling, image pull).
    let waiting = pods
        .last()
        .and_then(|p| {
            let conds = p.status.as_ref()?.conditions.as_ref()?;
            let c = conds.iter().find(|c| c.type_ == "PodScheduled" && c.status == "False")?;
            c.message.clone()
        })
        .map(|m| format!("the staging pod is not scheduled: {m}"));
    let msg = match (waiting, pvc_phase.as_deref()) {
        (Some(m), _) => m,
        (None, Some("Pending")) => "waiting for the volume claim to be bound".to_string(),
        _ => format!("Job {job_name} is starting"),
    };
    entry(cluster, CachePhase::Pending, reason::CACHE_PENDING, msg)
}

/// What deletion waits for: per cluster the deployments still using the cache there.
pub type InUse = BTreeMap<String, Vec<String>>;

/// The whole status. `in_use` is set while deletion waits for deployments.
pub fn desired(
    cache: &ModelCache,
    targets: &BTreeSet<String>,
    clusters: Vec<ClusterCacheStatus>,
    in_use: Option<&InUse>,
    now: &Time,
) -> ModelCacheStatus {
    let old = cache.status.clone().unwrap_or_default();
    let generation = cache.metadata.generation;
    let mut clusters = clusters;
    clusters.sort_by(|a, b| a.cluster.cmp(&b.cluster));
    let n = targets.len();
    let ready = clusters.iter().filter(|c| targets.contains(&c.cluster) && c.phase == CachePhase::Ready).count();
    let accepted = if n == 0 {
        Desired::new(
            condition::ACCEPTED,
            Status::True,
            reason::AS_EXPECTED,
            "no target cluster yet: the selector matches no InferenceCluster and the named deployments are not placed",
        )
    } else {
        let names: Vec<&str> = targets.iter().map(String::as_str).collect();
        Desired::new(condition::ACCEPTED, Status::True, reason::AS_EXPECTED, format!("stages in {}", names.join(", ")))
    };
    let not_ready: Vec<&ClusterCacheStatus> =
        clusters.iter().filter(|c| targets.contains(&c.cluster) && c.phase != CachePhase::Ready).collect();
    let worst = |p: CachePhase| not_ready.iter().find(|c| c.phase == p);
    let staged = if n > 0 && not_ready.is_empty() {
        Desired::new(condition::STAGED, Status::True, reason::AS_EXPECTED, format!("{ready}/{n} clusters Ready"))
    } else {
        let why = match (worst(CachePhase::Failed), worst(CachePhase::Verifying), worst(CachePhase::Downloading)) {
            (Some(f), _, _) => reason_const(f.reason.as_deref()),
            (None, Some(_), _) => reason::VERIFYING,
            (None, None, Some(_)) => reason::DOWNLOADING,
            _ => reason::CACHE_PENDING,
        };
        let detail: Vec<String> = not_ready
            .iter()
            .map(|c| format!("{}: {:?} ({})", c.cluster, c.phase, c.message.as_deref().unwrap_or("")))
            .collect();
        let tail = if detail.is_empty() { String::new() } else { format!("; {}", detail.join("; ")) };
        Desired::new(condition::STAGED, Status::False, why, format!("{ready}/{n} clusters Ready{tail}"))
    };
    let ready_cond = match in_use {
        Some(users) if !users.is_empty() => {
            let who: Vec<String> = users.iter().map(|(c, ds)| format!("{} in {c}", ds.join(", "))).collect();
            Desired::new(
                condition::READY,
                Status::False,
                reason::IN_USE,
                format!("deletion waits until no deployment mounts the cache: {}", who.join("; ")),
            )
        }
        _ => Desired { type_: condition::READY, ..staged.clone() },
    };
    let summary: Vec<String> = clusters.iter().map(|c| format!("{}:{:?}", c.cluster, c.phase)).collect();
    ModelCacheStatus {
        observed_generation: generation,
        conditions: flotilla_apis::Conditions(merge(
            &old.conditions.0,
            &[accepted, staged, ready_cond],
            generation,
            now,
        )),
        ready_clusters: Some(format!("{ready}/{n}")),
        summary: (!summary.is_empty()).then(|| summary.join(",")),
        clusters,
    }
}

/// The constant for a reason read back from status (a closed set; unknown → `JobFailed`).
fn reason_const(r: Option<&str>) -> &'static str {
    let known = StageReason::ALL.into_iter().map(StageReason::as_str).chain([reason::JOB_FAILED]);
    known.into_iter().find(|k| Some(*k) == r).unwrap_or(reason::JOB_FAILED)
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
