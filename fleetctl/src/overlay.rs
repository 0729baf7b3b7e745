//! The live fleet as read from the control cluster, and the files laid over it for
//! `plan --live` / `explain --live`. An object in the files replaces the live object of the same
//! kind, namespace and name — as `kubectl apply` would: the spec comes from the file, while
//! what the API server keeps (creation time, uid, and the status: observed capacity, current
//! placements) stays the live one's unless the file carries a status itself. Objects only in
//! the files are new: they are created `now`, as the controller would see them. Pure.

use std::collections::BTreeSet;

use flotilla_apis::document::{Kind, Problem, Severity};
use flotilla_apis::validate::validate_set;
use flotilla_apis::{
    CapacityClaim, FleetObject, FleetQuota, InferenceClass, InferenceCluster, Located, ModelCache, ModelDeployment,
    SourceLocation,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;

/// Every Flotilla object of a control cluster.
#[derive(Clone, Debug, Default)]
pub struct LiveFleet {
    /// InferenceClasses.
    pub classes: Vec<InferenceClass>,
    /// InferenceClusters.
    pub clusters: Vec<InferenceCluster>,
    /// ModelDeployments, every namespace.
    pub deployments: Vec<ModelDeployment>,
    /// ModelCaches, every namespace.
    pub caches: Vec<ModelCache>,
    /// CapacityClaims, every namespace.
    pub claims: Vec<CapacityClaim>,
    /// FleetQuotas, every namespace.
    pub quotas: Vec<FleetQuota>,
}

impl LiveFleet {
    /// The solver's snapshot, built exactly as the ModelDeployment controller builds it.
    pub fn snapshot(&self) -> flotilla_placement::FleetSnapshot {
        flotilla_placement::FleetSnapshot::from_live(
            self.classes.iter().cloned(),
            self.clusters.iter().cloned(),
            self.caches.iter().cloned(),
            self.deployments.iter().cloned(),
        )
        .with_quotas(self.quotas.iter().cloned())
    }

    /// Every object, each as a [`FleetObject`].
    pub fn objects(&self) -> Vec<FleetObject> {
        let mut out: Vec<FleetObject> = self.classes.iter().cloned().map(FleetObject::Class).collect();
        out.extend(self.clusters.iter().cloned().map(FleetObject::Cluster));
        out.extend(self.deployments.iter().cloned().map(FleetObject::Deployment));
        out.extend(self.caches.iter().cloned().map(FleetObject::Cache));
        out.extend(self.claims.iter().cloned().map(FleetObject::Claim));
        out.extend(self.quotas.iter().cloned().map(FleetObject::Quota));
        out
    }

    fn push(&mut self, object: FleetObject) {
        match object {
            FleetObject::Class(o) => self.classes.push(o),
            FleetObject::Cluster(o) => self.clusters.push(o),
            FleetObject::Deployment(o) => self.deployments.push(o),
            FleetObject::Cache(o) => self.caches.push(o),
            FleetObject::Claim(o) => self.claims.push(o),
            FleetObject::Quota(o) => self.quotas.push(o),
        }
    }
}

/// Identity of an object: kind, namespace (`default` when a namespaced object leaves it out),
/// name.
pub type Key = (Kind, Option<String>, String);

/// The key of an object.
pub fn key(object: &FleetObject) -> Key {
    (object.kind(), object.namespace().map(str::to_string), object.name().to_string())
}

fn meta_mut(object: &mut FleetObject) -> &mut ObjectMeta {
    match object {
        FleetObject::Class(o) => &mut o.metadata,
        FleetObject::Cluster(o) => &mut o.metadata,
        FleetObject::Deployment(o) => &mut o.metadata,
        FleetObject::Cache(o) => &mut o.metadata,
        FleetObject::Claim(o) => &mut o.metadata,
        FleetObject::Quota(o) => &mut o.metadata,
    }
}

/// Gives `file` what the API server keeps of `live` when a spec is applied over it.
fn keep_server_fields(file: &mut FleetObject, live: &FleetObject) {
    let live_meta = match live {
        FleetObject::Class(o) => &o.metadata,
        FleetObject::Cluster(o) => &o.metadata,
        FleetObject::Deployment(o) => &o.metadata,
        FleetObject::Cache(o) => &o.metadata,
        FleetObject::Claim(o) => &o.metadata,
        FleetObject::Quota(o) => &o.metadata,
    };
    let meta = meta_mut(file);
    meta.namespace = live_meta.namespace.clone();
    meta.creation_timestamp = live_meta.creation_timestamp.clone();
    meta.uid = live_meta.uid.clone();
    meta.generation = live_meta.generation;
    match (file, live) {
        (FleetObject::Class(f), FleetObject::Class(l)) if f.status.is_none() => f.status = l.status.clone(),
        (FleetObject::Cluster(f), FleetObject::Cluster(l)) if f.status.is_none() => f.status = l.status.clone(),
        (FleetObject::Deployment(f), FleetObject::Deployment(l)) if f.status.is_none() => f.status = l.status.clone(),
        (FleetObject::Cache(f), FleetObject::Cache(l)) if f.status.is_none() => f.status = l.status.clone(),
        (FleetObject::Claim(f), FleetObject::Claim(l)) if f.status.is_none() => f.status = l.status.clone(),
        (FleetObject::Quota(f), FleetObject::Quota(l)) if f.status.is_none() => f.status = l.status.clone(),
        _ => {}
    }
}

/// The live fleet with the files laid over it.
#[derive(Clone, Debug, Default)]
pub struct Overlaid {
    /// The fleet as it would be once the files are applied.
    pub fleet: LiveFleet,
    /// Objects of the files that replace a live one.
    pub replaced: BTreeSet<Key>,
    /// Objects of the files that are not live yet.
    pub added: BTreeSet<Key>,
}

/// Lays `files` over `live`; new objects are created at `now`.
pub fn overlay(live: &LiveFleet, files: &[Located<FleetObject>], now: Timestamp) -> Overlaid {
    let mut out = Overlaid::default();
    let mut from_files: Vec<(Key, FleetObject)> = files.iter().map(|f| (key(&f.value), f.value.clone())).collect();
    for object in live.objects() {
        let k = key(&object);
        match from_files.iter().position(|(fk, _)| *fk == k) {
            Some(i) => {
                let (k, mut file) = from_files.remove(i);
                keep_server_fields(&mut file, &object);
                out.replaced.insert(k);
                out.fleet.push(file);
            }
            None => out.fleet.push(object),
        }
    }
    for (k, mut file) in from_files {
        if out.replaced.contains(&k) || out.added.contains(&k) {
            continue; // a duplicate in the files: validation reports it
        }
        let meta = meta_mut(&mut file);
        if meta.creation_timestamp.is_none() {
            meta.creation_timestamp = Some(Time(now));
        }
        if k.0.namespaced() && meta.namespace.is_none() {
            meta.namespace = Some("default".into());
        }
        out.added.insert(k);
        out.fleet.push(file);
    }
    out
}

/// Validates the files together with the live objects they do not replace (so references to
/// live classes, caches and deployments resolve) and returns the problems found in the files.
/// Problems of live objects are not the files' doing and are left out.
pub fn validate_over(
    live: &LiveFleet,
    files: &[Located<FleetObject>],
    refused: &[(Kind, Option<String>, String)],
) -> Vec<Problem> {
    let in_files: BTreeSet<Key> = files.iter().map(|f| key(&f.value)).collect();
    let mut set: Vec<Located<FleetObject>> = files.to_vec();
    for object in live.objects() {
        if in_files.contains(&key(&object)) {
            continue;
        }
        let location = SourceLocation { file: format!("(live) {}", object.display_name()), document: 0, line: 0 };
        set.push(Located { location, value: object });
    }
    let mut problems: Vec<Problem> =
        validate_set(&set, refused).into_iter().filter(|p| !p.location.file.starts_with("(live) ")).collect();
    problems.sort_by(|a, b| a.location.cmp(&b.location).then(a.field.cmp(&b.field)));
    problems
}

/// The errors among `problems`.
pub fn errors(problems: &[Problem]) -> Vec<&Problem> {
    problems.iter().filter(|p| p.severity == Severity::Error).collect()
}
