//! What the ModelDeployment reconciler does to a member cluster: observe the workloads it made
//! (by label), apply rendered objects with server-side apply under one field manager — only
//! when their content hash differs from what runs, or when the live spec drifted from what was
//! applied (`drift.rs`; re-applied with force, reported as `DriftCorrected`), so a quiet fleet
//! writes nothing — and delete what it made and no longer wants. Ready counts follow
//! `readiness.rs`. Nothing without Flotilla's labels is touched.

pub mod drift;
pub mod readiness;

use std::collections::BTreeMap;

use flotilla_apis::ModelDeployment;
use flotilla_apis::constants::{event, labels};
use flotilla_apis::deployment::TopologyType;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::Value;

use super::rollout::Running;
use crate::render::selector;

/// Annotation holding the hash of an object's rendered content.
pub const HASH_ANNOTATION: &str = "flotilla.dev/rendered-hash";

/// What Flotilla's objects in one member look like now.
#[derive(Clone, Debug, Default)]
pub struct MemberState {
    /// Per pool: replicas asked for and ready (whole replicas, over every role).
    pub running: BTreeMap<String, Running>,
    /// Object `Kind/name` → rendered hash.
    pub hashes: BTreeMap<String, String>,
    /// Object `Kind/name` → its live `spec`, for drift (`drift.rs`).
    pub specs: BTreeMap<String, Value>,
}

/// What `apply` did in one member.
#[derive(Clone, Debug, Default)]
pub struct Applied {
    /// Objects written.
    pub written: usize,
    /// Objects re-applied because their live spec drifted: `Kind/name` and the paths.
    pub drifted: Vec<(String, Vec<String>)>,
}

/// The replica counts of one workload from its metadata and status (`readiness.rs`).
fn units(generation: Option<i64>, status: &Value, div: i32) -> readiness::Readiness {
    let int = |k: &str| status[k].as_i64().unwrap_or(0) as i32;
    // A LeaderWorkerSet that does not report status.observedGeneration: its conditions'.
    let observed_generation = status["observedGeneration"]
        .as_i64()
        .or_else(|| status["conditions"].as_array()?.iter().filter_map(|c| c["observedGeneration"].as_i64()).max());
    let r = readiness::readiness(&readiness::WorkloadStatus {
        generation,
        observed_generation,
        replicas: int("replicas"),
        ready: int("readyReplicas"),
        updated: int("updatedReplicas"),
    });
    let div = div.max(1);
    readiness::Readiness { serving: r.serving / div, current: r.current / div }
}

fn id(kind: &str, name: &str) -> String {
    format!("{kind}/{name}")
}

/// A stable hash of a rendered object (FNV-1a over its canonical JSON).
pub fn content_hash(v: &Value) -> String {
    let text = serde_json::to_string(v).unwrap_or_default();
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in text.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// Lists Flotilla's objects for `md` in a member.
pub async fn observe(client: &Client, md: &ModelDeployment) -> Result<MemberState, kube::Error> {
    let ns = md.namespace().unwrap_or_else(|| "default".into());
    let lp = ListParams::default().labels(&selector(md));
    let mut state = MemberState::default();
    let deps = Api::<Deployment>::namespaced(client.clone(), &ns).list(&lp).await?;
    let pods_per_role: BTreeMap<String, i32> =
        md.spec.topology.roles.iter().map(|r| (format!("{:?}", r.name).to_lowercase(), r.pods.max(1) as i32)).collect();
    let disaggregated = md.spec.topology.type_ == TopologyType::Disaggregated;
    let mut per_pool: BTreeMap<String, Vec<(i32, readiness::Readiness)>> = BTreeMap::new();
    for d in deps.items {
        let l = d.labels();
        let pool = l.get(labels::POOL).cloned().unwrap_or_default();
        let div = if disaggregated {
            l.get("flotilla.dev/role").and_then(|r| pods_per_role.get(r)).copied().unwrap_or(1)
        } else {
            1
        };
        let spec_replicas = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
        let status = serde_json::to_value(&d.status).unwrap_or_default();
        let r = units(d.metadata.generation, &status, div);
        per_pool.entry(pool).or_default().push((spec_replicas / div, r));
        keep(&mut state, "Deployment", &d.metadata, serde_json::to_value(&d.spec).unwrap_or_default());
    }
    // Multi-node replicas run as LeaderWorkerSets (where the member has the LWS CRD).
    for l in lws_list(client, &ns, &lp).await? {
        let pool = l.labels().get(labels::POOL).cloned().unwrap_or_default();
        let applied = l.data["spec"]["replicas"].as_i64().unwrap_or(0) as i32;
        let r = units(l.metadata.generation, &l.data["status"], 1);
        per_pool.entry(pool).or_default().push((applied, r));
        keep(&mut state, "LeaderWorkerSet", &l.metadata, l.data["spec"].clone());
    }
    for (pool, units) in std::mem::take(&mut per_pool) {
        let applied = units.iter().map(|u| u.0).min().unwrap_or(0);
        let ready = units.iter().map(|u| u.1.serving).min().unwrap_or(0);
        let current = units.iter().map(|u| u.1.current).min().unwrap_or(0);
        state.running.insert(pool, Running { applied, ready, current });
    }
    for s in Api::<Service>::namespaced(client.clone(), &ns).list(&lp).await?.items {
        keep(&mut state, "Service", &s.metadata, serde_json::to_value(&s.spec).unwrap_or_default());
    }
    match Api::<ResourceClaimTemplate>::namespaced(client.clone(), &ns).list(&lp).await {
        Ok(list) => {
            for r in list.items {
                keep(
                    &mut state,
                    "ResourceClaimTemplate",
                    &r.metadata,
                    serde_json::to_value(&r.spec).unwrap_or_default(),
                );
            }
        }
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(e),
    }
    Ok(state)
}

/// Records an observed object's rendered hash and live spec.
fn keep(state: &mut MemberState, kind: &str, meta: &kube::api::ObjectMeta, spec: Value) {
    let key = id(kind, meta.name.as_deref().unwrap_or(""));
    if let Some(h) = meta.annotations.as_ref().and_then(|a| a.get(HASH_ANNOTATION)) {
        state.hashes.insert(key.clone(), h.clone());
    }
    state.specs.insert(key, spec);
}

fn api_for(client: &Client, obj: &Value) -> Api<DynamicObject> {
    let api_version = obj["apiVersion"].as_str().unwrap_or("v1");
    let kind = obj["kind"].as_str().unwrap_or("");
    let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk(group, version, kind));
    match obj["metadata"]["namespace"].as_str() {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

/// Applies the rendered objects whose hash differs from what runs, and those whose live spec
/// drifted from the one applied (same hash, different fields: `drift::diff`).
pub async fn apply(
    client: &Client,
    field_manager: &str,
    objects: &[Value],
    state: &MemberState,
) -> Result<Applied, kube::Error> {
    let mut done = Applied::default();
    let mut namespace_done = false;
    for obj in objects {
        let hash = content_hash(obj);
        let kind = obj["kind"].as_str().unwrap_or("");
        let name = obj["metadata"]["name"].as_str().unwrap_or("");
        let key = id(kind, name);
        if state.hashes.get(&key) == Some(&hash) {
            let drifted = state.specs.get(&key).map(|live| drift::diff(&obj["spec"], live)).unwrap_or_default();
            if drifted.is_empty() {
                continue;
            }
            done.drifted.push((key, drifted));
        }
        if !namespace_done {
            if let Some(ns) = obj["metadata"]["namespace"].as_str() {
                let nsobj: Namespace = serde_json::from_value(serde_json::json!({"metadata": {"name": ns}}))
                    .map_err(kube::Error::SerdeError)?;
                // A member that grants the controller only Roles in tenant namespaces
                // (examples/member-rbac) refuses this: the namespace then exists already, or the
                // next write fails naming it.
                match Api::<Namespace>::all(client.clone())
                    .patch(ns, &PatchParams::apply(field_manager), &Patch::Apply(&nsobj))
                    .await
                {
                    Ok(_) => {}
                    Err(kube::Error::Api(s)) if s.code == 403 => {}
                    Err(e) => return Err(e),
                }
            }
            namespace_done = true;
        }
        let mut obj = obj.clone();
        obj["metadata"]["annotations"] = serde_json::json!({ HASH_ANNOTATION: hash });
        let dynobj: DynamicObject = serde_json::from_value(obj.clone()).map_err(kube::Error::SerdeError)?;
        api_for(client, &obj).patch(name, &PatchParams::apply(field_manager).force(), &Patch::Apply(&dynobj)).await?;
        done.written += 1;
    }
    Ok(done)
}

/// Says that objects in `cluster` drifted and were re-applied: a warning in the log and a
/// `Warning` event `DriftCorrected` on the ModelDeployment, naming member, object and fields.
pub async fn report_drift(recorder: &Recorder, md: &ModelDeployment, cluster: &str, drifted: &[(String, Vec<String>)]) {
    let ns = md.namespace().unwrap_or_else(|| "default".into());
    for (object, fields) in drifted {
        let note = format!(
            "{cluster}: {object} in namespace {ns} was changed outside Flotilla ({}); re-applied",
            fields.join(", ")
        );
        tracing::warn!(deployment = %format!("{ns}/{}", md.name_any()), cluster, object, ?fields, "drift corrected");
        let ev = Event {
            type_: EventType::Warning,
            reason: event::DRIFT_CORRECTED.into(),
            note: Some(note),
            action: "Correct".into(),
            secondary: None,
        };
        if let Err(e) = recorder.publish(&ev, &md.object_ref(&())).await {
            tracing::debug!(error = %crate::member::brief(&e), "DriftCorrected event not recorded");
        }
    }
}

/// Deletes Flotilla's objects for `md` in a member whose `Kind/name` is not in `keep`.
/// Returns how many were deleted.
pub async fn prune(client: &Client, md: &ModelDeployment, keep: &[String]) -> Result<usize, kube::Error> {
    let ns = md.namespace().unwrap_or_else(|| "default".into());
    let lp = ListParams::default().labels(&selector(md));
    let dp = DeleteParams::background();
    let mut deleted = 0;
    let deps = Api::<Deployment>::namespaced(client.clone(), &ns);
    for d in deps.list(&lp).await?.items {
        if !keep.contains(&id("Deployment", &d.name_any())) {
            deps.delete(&d.name_any(), &dp).await?;
            deleted += 1;
        }
    }
    let svcs = Api::<Service>::namespaced(client.clone(), &ns);
    for s in svcs.list(&lp).await?.items {
        if !keep.contains(&id("Service", &s.name_any())) {
            svcs.delete(&s.name_any(), &dp).await?;
            deleted += 1;
        }
    }
    for l in lws_list(client, &ns, &lp).await? {
        if !keep.contains(&id("LeaderWorkerSet", &l.name_any())) {
            lws_api(client, &ns).delete(&l.name_any(), &dp).await?;
            deleted += 1;
        }
    }
    let rcts = Api::<ResourceClaimTemplate>::namespaced(client.clone(), &ns);
    match rcts.list(&lp).await {
        Ok(list) => {
            for r in list.items {
                if !keep.contains(&id("ResourceClaimTemplate", &r.name_any())) {
                    rcts.delete(&r.name_any(), &dp).await?;
                    deleted += 1;
                }
            }
        }
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => return Err(e),
    }
    Ok(deleted)
}

fn lws_api(client: &Client, ns: &str) -> Api<DynamicObject> {
    let ar = ApiResource::from_gvk(&GroupVersionKind::gvk("leaderworkerset.x-k8s.io", "v1", "LeaderWorkerSet"));
    Api::namespaced_with(client.clone(), ns, &ar)
}

/// LeaderWorkerSets with Flotilla's labels; none where the member lacks the CRD.
async fn lws_list(client: &Client, ns: &str, lp: &ListParams) -> Result<Vec<DynamicObject>, kube::Error> {
    match lws_api(client, ns).list(lp).await {
        Ok(list) => Ok(list.items),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(Vec::new()),
        Err(e) => Err(e),
    }
}

/// `Kind/name` of rendered objects.
pub fn ids(objects: &[Value]) -> Vec<String> {
    objects.iter().map(|o| id(o["kind"].as_str().unwrap_or(""), o["metadata"]["name"].as_str().unwrap_or(""))).collect()
}
