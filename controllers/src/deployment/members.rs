//! What the ModelDeployment reconciler does to a member cluster: observe the workloads it made
//! (by label, from the member's caches — `member/objects.rs`, no LIST — read through the memo
//! of Flotilla's own writes, so a reconcile right after an apply neither applies again nor
//! takes the cache's older copy for drift), apply rendered objects with server-side apply under one field manager — only
//! when their content hash differs from what runs, or when the live spec drifted from what was
//! applied (`drift.rs`; re-applied with force, reported as `DriftCorrected`), so a quiet fleet
//! writes nothing — and delete what it made and no longer wants (read from the caches too; a
//! namespace not cached yet, as on a deletion's sweep of other members, is listed once). Ready
//! counts follow `readiness.rs`. Nothing without Flotilla's labels is touched.
//!
//! Every write carries the installation's `flotilla.dev/install` and the InferenceCluster's
//! `flotilla.dev/cluster` ([`Stamp`]). Before the first write of a name that the caches do not
//! show as this installation's object of this owner, the member is asked what is there
//! ([`ownership`], pure): nothing — create it; this installation's — write; an object of a
//! release before install labels (Flotilla's managed-by and owner labels and its rendered-hash
//! annotation, no install label) — adopt it with a write conditional on the resourceVersion
//! seen, so that of two installations only the first labels it and the other then finds it
//! foreign; anything else (another team's Service, another ModelDeployment's object of the
//! same name, another installation's) — left alone byte for byte and reported
//! ([`Applied::conflicts`], the deployment's `NameConflict`).

pub mod drift;
pub mod readiness;

use std::collections::BTreeMap;
use std::time::Duration;

use flotilla_apis::ModelDeployment;
use flotilla_apis::constants::{event, labels};
use flotilla_apis::deployment::TopologyType;
use flotilla_apis::fnv::fnv1a64;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::ObjectMeta;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::events::{Event, EventType, Recorder};
use kube::{Api, Client, Resource, ResourceExt};
use serde_json::Value;

use super::rollout::Running;
use crate::member::objects::{KINDS, resource};
use crate::member::{Handle, MemberError};
use crate::render::{MANAGED_BY, deployment_key, label_value, selector};

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
    /// Object `Kind/name` → the resourceVersion seen, for objects of a release before install
    /// labels: adopted by a write conditional on it.
    pub legacy: BTreeMap<String, String>,
}

/// The labels every write adds to the rendered ones.
#[derive(Clone, Copy, Debug)]
pub struct Stamp<'a> {
    /// This installation's `flotilla.dev/install`.
    pub install: &'a str,
    /// The InferenceCluster written through (`flotilla.dev/cluster`).
    pub cluster: &'a str,
}

/// Whose an existing member object is, to a write that renders the same name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ownership {
    /// This installation's object of the same owner.
    Ours,
    /// Flotilla's object of the same owner from a release before install labels.
    Legacy,
    /// Someone else's: left alone, for the reason given.
    Foreign(String),
}

/// Whose `live` is, to a write of an object labelled `rendered` by installation `install`.
pub fn ownership(live: &ObjectMeta, rendered: &BTreeMap<String, String>, install: &str) -> Ownership {
    let empty = BTreeMap::new();
    let l = live.labels.as_ref().unwrap_or(&empty);
    if l.get(labels::MANAGED_BY).map(String::as_str) != Some(MANAGED_BY) {
        return Ownership::Foreign("it was not created by Flotilla".into());
    }
    for owner in [labels::DEPLOYMENT, labels::CACHE] {
        if let Some(want) = rendered.get(owner)
            && l.get(owner) != Some(want)
        {
            return Ownership::Foreign(match l.get(owner) {
                Some(other) => format!(
                    "it belongs to {} {other}",
                    if owner == labels::CACHE { "ModelCache" } else { "ModelDeployment" }
                ),
                None => format!("it carries no {owner} label"),
            });
        }
    }
    match l.get(labels::INSTALL) {
        Some(i) if i == install => Ownership::Ours,
        Some(other) => {
            Ownership::Foreign(format!("another Flotilla installation ({}={other}) wrote it", labels::INSTALL))
        }
        None if live.annotations.as_ref().is_some_and(|a| a.contains_key(HASH_ANNOTATION)) => Ownership::Legacy,
        None => Ownership::Foreign(format!("it carries Flotilla's labels but no {HASH_ANNOTATION} Flotilla writes")),
    }
}

/// Whether an object carries this installation's install label.
pub fn is_ours(meta: &ObjectMeta, install: &str) -> bool {
    meta.labels.as_ref().and_then(|l| l.get(labels::INSTALL)).is_some_and(|i| i == install)
}

/// Whether an observed object is this installation's, or a release's before install labels.
pub fn ours_or_legacy(meta: &ObjectMeta, install: &str) -> bool {
    match meta.labels.as_ref().and_then(|l| l.get(labels::INSTALL)) {
        Some(i) => i == install,
        None => meta.annotations.as_ref().is_some_and(|a| a.contains_key(HASH_ANNOTATION)),
    }
}

/// What `apply` did in one member.
#[derive(Clone, Debug, Default)]
pub struct Applied {
    /// Objects written.
    pub written: usize,
    /// Objects re-applied because their live spec drifted: `Kind/name` and the paths.
    pub drifted: Vec<(String, Vec<String>)>,
    /// Objects left alone because someone else's object holds the name: `Kind namespace/name
    /// (why)`.
    pub conflicts: Vec<String>,
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
    format!("{:016x}", fnv1a64(text.as_bytes()))
}

/// Flotilla's objects for `md` in a member, from its caches (waiting at most `wait` for a
/// namespace's first sync).
pub async fn observe(
    member: &Handle,
    md: &ModelDeployment,
    install: &str,
    wait: Duration,
) -> Result<MemberState, MemberError> {
    let ns = md.namespace().unwrap_or_else(|| "default".into());
    let cached = member.objects.owned(&ns, labels::DEPLOYMENT, &deployment_key(md), install, wait).await?;
    let mut state = MemberState::default();
    let pods_per_role: BTreeMap<String, i32> =
        md.spec.topology.roles.iter().map(|r| (format!("{:?}", r.name).to_lowercase(), r.pods.max(1) as i32)).collect();
    let disaggregated = md.spec.topology.type_ == TopologyType::Disaggregated;
    let mut per_pool: BTreeMap<String, Vec<(i32, readiness::Readiness)>> = BTreeMap::new();
    for c in &cached {
        let key = id(c.kind, &c.name);
        if let Some(hash) = &c.pending {
            // Flotilla wrote it and the cache does not show it yet: as written, no drift check.
            state.hashes.insert(key, hash.clone());
        }
        let Some(o) = &c.object else { continue };
        if c.pending.is_none() {
            keep(&mut state, c.kind, &o.metadata, o.data["spec"].clone());
            if o.labels().get(labels::INSTALL).is_none() {
                state.legacy.insert(id(c.kind, &c.name), o.metadata.resource_version.clone().unwrap_or_default());
            }
        }
        // Replicas run as Deployments, multi-node ones as LeaderWorkerSets.
        let div = match c.kind {
            "Deployment" if disaggregated => {
                o.labels().get("flotilla.dev/role").and_then(|r| pods_per_role.get(r)).copied().unwrap_or(1)
            }
            "Deployment" | "LeaderWorkerSet" => 1,
            _ => continue,
        };
        let pool = o.labels().get(labels::POOL).cloned().unwrap_or_default();
        let spec_replicas =
            o.data["spec"]["replicas"].as_i64().map_or(if c.kind == "Deployment" { 1 } else { 0 }, |r| r as i32);
        let r = units(o.metadata.generation, &o.data["status"], div);
        per_pool.entry(pool).or_default().push((spec_replicas / div, r));
    }
    for (pool, units) in per_pool {
        let applied = units.iter().map(|u| u.0).min().unwrap_or(0);
        let ready = units.iter().map(|u| u.1.serving).min().unwrap_or(0);
        let current = units.iter().map(|u| u.1.current).min().unwrap_or(0);
        state.running.insert(pool, Running { applied, ready, current });
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
/// Each write is remembered in the member's memo (`member/memo.rs`).
pub async fn apply(
    member: &Handle,
    md: &ModelDeployment,
    field_manager: &str,
    stamp: Stamp<'_>,
    objects: &[Value],
    state: &MemberState,
) -> Result<Applied, kube::Error> {
    let owner = deployment_key(md);
    apply_with(
        &member.client,
        field_manager,
        stamp,
        objects,
        state,
        Some(&member.objects),
        |kind, ns, name, hash, rv| member.objects.applied(kind, ns, name, &owner, hash, rv),
    )
    .await
}

/// `obj` with the stamp's labels added.
fn stamped(obj: &Value, stamp: Stamp<'_>) -> Value {
    let mut obj = obj.clone();
    if !obj["metadata"]["labels"].is_object() {
        obj["metadata"]["labels"] = serde_json::json!({});
    }
    obj["metadata"]["labels"][labels::INSTALL] = Value::String(stamp.install.to_string());
    obj["metadata"]["labels"][labels::CLUSTER] = Value::String(label_value(stamp.cluster));
    obj
}

/// What the member holds under `obj`'s name, if anything: one LIST by name (members grant
/// `list`, not always `get`: `examples/member-rbac`).
async fn existing(client: &Client, obj: &Value, name: &str) -> Result<Option<ObjectMeta>, kube::Error> {
    let lp = ListParams::default().fields(&format!("metadata.name={name}"));
    match api_for(client, obj).list_metadata(&lp).await {
        Ok(l) => Ok(l.items.into_iter().next().map(|o| o.metadata)),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
        Err(e) => Err(e),
    }
}

/// [`apply`] on a client, telling `wrote` each object written (`kind`, `namespace`, `name`,
/// hash, answered `resourceVersion`). The objects' namespace is applied before the first write,
/// and only once per member while `known` (the member's caches) remembers it: a rollout that
/// rewrites a Deployment does not rewrite its namespace each time.
pub async fn apply_with(
    client: &Client,
    field_manager: &str,
    stamp: Stamp<'_>,
    objects: &[Value],
    state: &MemberState,
    known: Option<&crate::member::objects::MemberObjects>,
    mut wrote: impl FnMut(&str, &str, &str, &str, &str),
) -> Result<Applied, kube::Error> {
    let mut done = Applied::default();
    let mut namespace_done = false;
    for rendered in objects {
        let obj = &stamped(rendered, stamp);
        let hash = content_hash(obj);
        let kind = obj["kind"].as_str().unwrap_or("");
        let name = obj["metadata"]["name"].as_str().unwrap_or("");
        let key = id(kind, name);
        let mut adopt_at = state.legacy.get(&key).cloned();
        if !state.hashes.contains_key(&key) && !state.specs.contains_key(&key) {
            // Not seen as ours: never written over before the member says what is there.
            if let Some(live) = existing(client, obj, name).await? {
                let want: BTreeMap<String, String> =
                    serde_json::from_value(obj["metadata"]["labels"].clone()).unwrap_or_default();
                match ownership(&live, &want, stamp.install) {
                    Ownership::Ours => {}
                    Ownership::Legacy => adopt_at = live.resource_version.clone(),
                    Ownership::Foreign(why) => {
                        let ns = obj["metadata"]["namespace"].as_str().unwrap_or("");
                        done.conflicts.push(format!("{kind} {ns}/{name} exists and {why}: left alone"));
                        continue;
                    }
                }
            }
        }
        if state.hashes.get(&key) == Some(&hash) {
            let drifted = state.specs.get(&key).map(|live| drift::diff(&obj["spec"], live)).unwrap_or_default();
            if drifted.is_empty() {
                continue;
            }
            done.drifted.push((key, drifted));
        }
        if !namespace_done {
            if let Some(ns) = obj["metadata"]["namespace"].as_str()
                && !known.is_some_and(|k| k.namespace_applied(ns))
            {
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
                if let Some(k) = known {
                    k.mark_namespace(ns);
                }
            }
            namespace_done = true;
        }
        let mut obj = obj.clone();
        // The rendered annotations (an HTTPRoute's model) and the content hash.
        let mut annotations = obj["metadata"]["annotations"].as_object().cloned().unwrap_or_default();
        annotations.insert(HASH_ANNOTATION.into(), Value::String(hash.clone()));
        obj["metadata"]["annotations"] = Value::Object(annotations);
        if let Some(rv) = adopt_at.filter(|rv| !rv.is_empty()) {
            // Adopting an object of an earlier release: only if no one changed it since it was
            // seen without an install label (another installation adopting it first).
            obj["metadata"]["resourceVersion"] = Value::String(rv);
        }
        let dynobj: DynamicObject = serde_json::from_value(obj.clone()).map_err(kube::Error::SerdeError)?;
        let ns = obj["metadata"]["namespace"].as_str().unwrap_or("");
        let answer = match api_for(client, &obj)
            .patch(name, &PatchParams::apply(field_manager).force(), &Patch::Apply(&dynobj))
            .await
        {
            Ok(a) => a,
            Err(e) => {
                if let Some(k) = known {
                    k.forget_namespace(ns);
                }
                return Err(e);
            }
        };
        wrote(kind, ns, name, &hash, answer.metadata.resource_version.as_deref().unwrap_or(""));
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

/// Deletes Flotilla's objects for `md` in a member whose `Kind/name` is not in `keep`, as the
/// member's caches show them (each deletion remembered in the memo, so a cache that has not
/// seen it yet does not cause a second one). Where the namespace is not cached yet (a
/// deletion sweeping a member this controller never applied to) or its cache does not sync
/// within `wait`, the objects are listed once instead. Returns how many were deleted.
pub async fn prune(
    member: &Handle,
    md: &ModelDeployment,
    install: &str,
    keep: &[String],
    wait: Duration,
) -> Result<usize, kube::Error> {
    let ns = md.namespace().unwrap_or_else(|| "default".into());
    let owner = deployment_key(md);
    let cached = if member.objects.has(&ns).await {
        match member.objects.owned(&ns, labels::DEPLOYMENT, &owner, install, wait).await {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::debug!(namespace = %ns, "member cache not usable for prune, listing: {e}");
                None
            }
        }
    } else {
        None
    };
    let found: Vec<(usize, String)> = match cached {
        Some(cached) => cached
            .iter()
            // Objects of an earlier release are adopted by the next apply, never deleted here: an
            // unlabelled object may be another installation's.
            .filter(|c| {
                c.object
                    .as_ref()
                    .is_none_or(|o| o.metadata.deletion_timestamp.is_none() && is_ours(&o.metadata, install))
            })
            .filter_map(|c| Some((KINDS.iter().position(|k| k.2 == c.kind)?, c.name.clone())))
            .collect(),
        None => list(&member.client, &ns, &selector(md), install).await?,
    };
    let dp = DeleteParams::background();
    let mut deleted = 0;
    for (i, name) in found {
        let kind = KINDS[i].2;
        if keep.contains(&id(kind, &name)) {
            continue;
        }
        match Api::<DynamicObject>::namespaced_with(member.client.clone(), &ns, &resource(i)).delete(&name, &dp).await {
            Ok(_) => deleted += 1,
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e),
        }
        member.objects.deleted(kind, &ns, &name, &owner);
    }
    Ok(deleted)
}

/// Lists Flotilla's objects of every cached kind in `ns` matching `labels` (a kind the member
/// does not serve is skipped), this installation's: the fallback when a namespace is not
/// cached.
async fn list(client: &Client, ns: &str, labels: &str, install: &str) -> Result<Vec<(usize, String)>, kube::Error> {
    let lp = ListParams::default().labels(labels);
    let mut out = Vec::new();
    for i in 0..KINDS.len() {
        match Api::<DynamicObject>::namespaced_with(client.clone(), ns, &resource(i)).list_metadata(&lp).await {
            Ok(l) => out.extend(
                l.items
                    .into_iter()
                    .filter(|o| o.metadata.deletion_timestamp.is_none() && is_ours(&o.metadata, install))
                    .map(|o| (i, o.metadata.name.unwrap_or_default())),
            ),
            Err(kube::Error::Api(s)) if s.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// `Kind/name` of rendered objects.
pub fn ids(objects: &[Value]) -> Vec<String> {
    objects.iter().map(|o| id(o["kind"].as_str().unwrap_or(""), o["metadata"]["name"].as_str().unwrap_or(""))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(labels: &[(&str, &str)], hash: bool) -> ObjectMeta {
        ObjectMeta {
            labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            annotations: hash.then(|| [(HASH_ANNOTATION.to_string(), "x".to_string())].into()),
            ..ObjectMeta::default()
        }
    }

    #[test]
    fn the_content_hash_is_what_earlier_releases_wrote() {
        assert_eq!(content_hash(&serde_json::json!({"a": 1})), "9c3e82dd6fcae8b1");
    }

    #[test]
    fn only_this_installations_object_of_the_same_owner_is_written_over() {
        let want: BTreeMap<String, String> = [(labels::MANAGED_BY, "flotilla"), (labels::DEPLOYMENT, "ml.qwen")]
            .map(|(k, v)| (k.into(), v.into()))
            .into();
        let ours = [(labels::MANAGED_BY, "flotilla"), (labels::DEPLOYMENT, "ml.qwen"), (labels::INSTALL, "prod")];
        assert_eq!(ownership(&meta(&ours, true), &want, "prod"), Ownership::Ours);
        let legacy = &ours[..2];
        assert_eq!(ownership(&meta(legacy, true), &want, "prod"), Ownership::Legacy, "an earlier release's");
        let refused = [
            (meta(&[("team", "search")], false), "not created by Flotilla"),
            (
                meta(
                    &[
                        (labels::MANAGED_BY, "flotilla"),
                        (labels::DEPLOYMENT, "ml.qwen-h100"),
                        (labels::INSTALL, "prod"),
                    ],
                    true,
                ),
                "ModelDeployment ml.qwen-h100",
            ),
            (
                meta(
                    &[(labels::MANAGED_BY, "flotilla"), (labels::DEPLOYMENT, "ml.qwen"), (labels::INSTALL, "staging")],
                    true,
                ),
                "another Flotilla installation",
            ),
            (meta(legacy, false), "no flotilla.dev/rendered-hash"),
            (meta(&[(labels::MANAGED_BY, "flotilla")], true), "no flotilla.dev/deployment label"),
        ];
        for (live, why) in refused {
            match ownership(&live, &want, "prod") {
                Ownership::Foreign(w) => assert!(w.contains(why), "{w} / {why}"),
                other => panic!("{other:?} for {live:?}"),
            }
        }
        assert!(is_ours(&meta(&ours, false), "prod") && !is_ours(&meta(legacy, true), "prod"));
        assert!(ours_or_legacy(&meta(legacy, true), "prod") && !ours_or_legacy(&meta(&ours, true), "staging"));
    }

    #[test]
    fn every_write_carries_the_installation_and_the_cluster() {
        let obj = serde_json::json!({"kind": "Service", "metadata": {"name": "qwen", "labels": {"a": "b"}}});
        let s = stamped(&obj, Stamp { install: "prod", cluster: &"c".repeat(70) });
        assert_eq!(s["metadata"]["labels"]["a"], "b");
        assert_eq!(s["metadata"]["labels"][labels::INSTALL], "prod");
        assert!(s["metadata"]["labels"][labels::CLUSTER].as_str().unwrap().len() <= 63);
        assert_ne!(content_hash(&s), content_hash(&obj), "an unlabelled object of an earlier release is re-applied");
    }
}
