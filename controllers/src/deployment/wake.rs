//! Which ModelDeployments a change of the fleet concerns, so that only those are reconciled
//! (`trigger.rs` drives it). A deployment is woken when its plan entry differs from the one its
//! last reconcile acted on ([`Acted`]), when a ModelCache it references (`cacheRef`, or an
//! adapter's `cacheRef`) changed what the reconcile reads of it, when a cluster it is placed on (or planned on) changed reachability,
//! readiness, DRA or deletion, and when a class it uses changed its spec ([`Changes`] turns
//! every watch event into such facts). A cluster's heartbeat or capacity figures wake nobody
//! unless they move the plan.
//!
//! No missed wake-up, for plan changes. Plans carry increasing sequence numbers
//! (`SolveOnce`). The trigger compares each new plan with every deployment's record under one
//! lock, and a reconcile records the plan it acts on under the same lock, taking the newest
//! plan the trigger has compared if its own is older. So either the record comes first and the
//! comparison sees it (and wakes the deployment if its entry differs: a reconcile running at
//! that moment is run again after it, kube's runner holds the request), or the comparison comes
//! first and the reconcile acts on that plan or a newer one. Every plan solved is compared:
//! each fleet change ticks the trigger after the store holds it, and the trigger reads the
//! stores after draining its ticks. A record is advanced to a newer plan whose entry is equal,
//! so old plans are dropped, and a deployment is woken at most once per plan.
//!
//! No missed wake-up, for facts: [`Changes`] sees every watch event (as the store does, in the
//! same task), so a fact that flips and flips back between two trigger runs still marks the
//! object changed.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::{Arc, Mutex};

use flotilla_placement::Plan;
use flotilla_placement::plan::DeploymentPlan;
use kube::runtime::watcher::Event;

/// A deployment: (namespace, name).
pub type DeploymentKey = (String, String);

/// Why a deployment is woken (a closed set: a metric label).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Why {
    /// Its plan entry changed.
    PlanChanged,
    /// A ModelCache it references (its model's or an adapter's) changed.
    CacheChanged,
    /// A cluster it is placed or planned on changed reachability, readiness or deletion.
    ClusterChanged,
    /// A class it uses changed.
    ClassChanged,
}

/// The plan each deployment's last reconcile acted on, and the newest plan compared.
#[derive(Default)]
pub struct Acted {
    inner: Mutex<ActedInner>,
}

#[derive(Default)]
struct ActedInner {
    compared: Option<(u64, Arc<Plan>)>,
    records: HashMap<DeploymentKey, Record>,
}

struct Record {
    seq: u64,
    plan: Arc<Plan>,
    woken_for: u64,
}

impl Acted {
    /// The plan a reconcile of `key` acts on: `solved` (with its sequence number), or the newer
    /// plan the trigger already compared. Recorded as the one acted on.
    pub fn act_on(&self, key: DeploymentKey, solved: (u64, Arc<Plan>)) -> Arc<Plan> {
        let Ok(mut inner) = self.inner.lock() else { return solved.1 };
        let (seq, plan) = match &inner.compared {
            Some((seq, plan)) if *seq > solved.0 => (*seq, plan.clone()),
            _ => solved,
        };
        inner.records.insert(key, Record { seq, plan: plan.clone(), woken_for: 0 });
        plan
    }

    /// Compares `plan` (number `seq`) with what each deployment acted on; returns those whose
    /// entry differs, each once per plan. Records of deployments not in `live` are dropped;
    /// records of a plan at least as new are left alone (a later comparison covers them).
    pub fn changed(&self, seq: u64, plan: &Arc<Plan>, live: &HashSet<DeploymentKey>) -> BTreeSet<DeploymentKey> {
        let Ok(mut inner) = self.inner.lock() else { return BTreeSet::new() };
        if inner.compared.as_ref().is_none_or(|(s, _)| *s < seq) {
            inner.compared = Some((seq, plan.clone()));
        }
        inner.records.retain(|k, _| live.contains(k));
        let new = index(plan);
        let mut old_indexes: HashMap<*const Plan, HashMap<(&str, &str), &DeploymentPlan>> = HashMap::new();
        let mut woken = BTreeSet::new();
        let mut advance = Vec::new();
        for (key, record) in &inner.records {
            if record.seq >= seq {
                continue;
            }
            let old = old_indexes.entry(Arc::as_ptr(&record.plan)).or_insert_with(|| index(&record.plan));
            let k = (key.0.as_str(), key.1.as_str());
            if old.get(&k) == new.get(&k) {
                advance.push(key.clone());
            } else if record.woken_for < seq {
                woken.insert(key.clone());
            }
        }
        drop(old_indexes);
        drop(new);
        for key in advance {
            if let Some(r) = inner.records.get_mut(&key) {
                r.seq = seq;
                r.plan = plan.clone();
            }
        }
        for key in &woken {
            if let Some(r) = inner.records.get_mut(key) {
                r.woken_for = seq;
            }
        }
        woken
    }
}

fn index(plan: &Plan) -> HashMap<(&str, &str), &DeploymentPlan> {
    plan.deployments.iter().map(|d| ((d.namespace.as_str(), d.name.as_str()), d)).collect()
}

/// Per object (by key), the last fact its watch events showed, and the keys whose fact changed
/// since the last [`Changes::take`]. A gone object's fact is absent.
pub struct Changes<F> {
    inner: Mutex<ChangesInner<F>>,
}

struct ChangesInner<F> {
    last: HashMap<String, F>,
    /// Changed keys, each with its fact before the first change since the last take.
    dirty: BTreeMap<String, Option<F>>,
    relisted: Option<HashSet<String>>,
}

/// One object whose fact changed: its key, the fact before (`None`: it did not exist) and now
/// (`None`: it is gone).
#[derive(Clone, Debug, PartialEq)]
pub struct Change<F> {
    /// The object's key.
    pub key: String,
    /// Its fact at the last take.
    pub before: Option<F>,
    /// Its fact now.
    pub now: Option<F>,
}

impl<F: PartialEq + Clone> Default for Changes<F> {
    fn default() -> Self {
        Self { inner: Mutex::new(ChangesInner { last: HashMap::new(), dirty: BTreeMap::new(), relisted: None }) }
    }
}

impl<F: PartialEq + Clone> Changes<F> {
    /// Takes in one watch event: `key` names an object, `fact` is what the reconcile reads of
    /// it. A relist (`Init` … `InitDone`) that no longer lists an object counts as its deletion.
    pub fn event<K>(&self, event: &Event<K>, key: impl Fn(&K) -> String, fact: impl Fn(&K) -> F) {
        let Ok(mut inner) = self.inner.lock() else { return };
        match event {
            Event::Apply(k) => inner.set(key(k), Some(fact(k))),
            Event::Delete(k) => inner.set(key(k), None),
            Event::Init => inner.relisted = Some(HashSet::new()),
            Event::InitApply(k) => {
                let key = key(k);
                if let Some(seen) = inner.relisted.as_mut() {
                    seen.insert(key.clone());
                }
                inner.set(key, Some(fact(k)));
            }
            Event::InitDone => {
                if let Some(seen) = inner.relisted.take() {
                    let gone: Vec<String> = inner.last.keys().filter(|k| !seen.contains(*k)).cloned().collect();
                    for key in gone {
                        inner.set(key, None);
                    }
                }
            }
        }
    }

    /// The keys whose fact changed since the last call (of this or [`Changes::take_changes`]).
    pub fn take(&self) -> BTreeSet<String> {
        self.inner.lock().map(|mut i| std::mem::take(&mut i.dirty).into_keys().collect()).unwrap_or_default()
    }

    /// The changes since the last call, each with the fact before and now.
    pub fn take_changes(&self) -> Vec<Change<F>> {
        let Ok(mut inner) = self.inner.lock() else { return Vec::new() };
        let dirty = std::mem::take(&mut inner.dirty);
        dirty.into_iter().map(|(key, before)| Change { now: inner.last.get(&key).cloned(), key, before }).collect()
    }
}

impl<F: PartialEq + Clone> ChangesInner<F> {
    fn set(&mut self, key: String, fact: Option<F>) {
        let before = self.last.get(&key);
        if before != fact.as_ref() && !self.dirty.contains_key(&key) {
            let before = before.cloned();
            self.dirty.insert(key.clone(), before);
        }
        match fact {
            Some(f) => {
                self.last.insert(key, f);
            }
            None => {
                self.last.remove(&key);
            }
        }
    }
}

/// The objects whose facts changed since the last trigger run.
#[derive(Clone, Debug, Default)]
pub struct Changed {
    /// InferenceClusters (by name).
    pub clusters: BTreeSet<String>,
    /// ModelCaches (`namespace/name`).
    pub caches: BTreeSet<String>,
    /// InferenceClasses (by name).
    pub classes: BTreeSet<String>,
}

/// What the wake rule reads of one deployment.
#[derive(Clone, Debug, Default)]
pub struct Watched {
    /// The deployment.
    pub key: DeploymentKey,
    /// `namespace/name` of the ModelCaches it references: `cacheRef` and its adapters'.
    pub caches: Vec<String>,
    /// (cluster, class) of its status placements and of its plan entry's assignments.
    pub uses: Vec<(String, String)>,
}

/// The deployments to wake, with the first reason found: those in `plan_changed`, and those
/// that reference a changed cache or use a changed cluster or class.
pub fn to_wake(
    deployments: &[Watched],
    plan_changed: &BTreeSet<DeploymentKey>,
    changed: &Changed,
) -> BTreeMap<DeploymentKey, Why> {
    let mut out: BTreeMap<DeploymentKey, Why> = plan_changed.iter().map(|k| (k.clone(), Why::PlanChanged)).collect();
    for d in deployments {
        if out.contains_key(&d.key) {
            continue;
        }
        let why = if d.caches.iter().any(|c| changed.caches.contains(c)) {
            Some(Why::CacheChanged)
        } else if d.uses.iter().any(|(cluster, _)| changed.clusters.contains(cluster)) {
            Some(Why::ClusterChanged)
        } else if d.uses.iter().any(|(_, class)| changed.classes.contains(class)) {
            Some(Why::ClassChanged)
        } else {
            None
        };
        if let Some(why) = why {
            out.insert(d.key.clone(), why);
        }
    }
    out
}

#[cfg(test)]
#[path = "wake_tests.rs"]
mod tests;
