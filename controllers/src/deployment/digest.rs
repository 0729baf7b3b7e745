//! What the fleet plan is solved from, summed up as the watch events arrive, so that a reconcile
//! asks "did anything the plan reads change since it was solved?" at a cost that does not grow
//! with the fleet (`DeploymentContext::solve`), where it used to hash every class, cluster,
//! cache and deployment.
//!
//! - [`Digest::value`] is the wrapping sum of one hash per object (its kind, identity and the
//!   version the plan reads: `resourceVersion` for classes, clusters and caches; `generation`
//!   and deletion for FleetQuotas (the controller writes their status from the plan); `generation`,
//!   refused pools and deletion for deployments, whose status writes do not change a plan). A
//!   relist (`Init` … `InitDone`) replaces its kind's objects at once.
//! - The placements each deployment records in its status do not enter the sum: a deployment
//!   recording what the plan gave it must not solve again (`Solved::holds`). Instead each change
//!   of them is kept until checked once against the current plan ([`Digest::recorded_hold`]).
//!
//! The sum is updated right after the kind's store took the event in, so it can lag the store by
//! a moment, never lead it: a plan computed meanwhile is keyed older than what it was solved
//! from, and is solved once more rather than trusted for too long.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::Mutex;

use kube::runtime::watcher::Event;

/// The kinds a plan reads.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum Part {
    /// InferenceClasses.
    Class,
    /// InferenceClusters.
    Cluster,
    /// ModelCaches.
    Cache,
    /// ModelDeployments.
    Deployment,
    /// FleetQuotas.
    Quota,
}

/// One object as the digest sees it: its identity, the hash of what the plan reads, and (for
/// deployments) the hash of the placements it records.
pub struct Seen {
    /// uid (or `namespace/name` when it has none).
    pub id: String,
    /// What the plan reads of it.
    pub version: u64,
    /// The placements it records (deployments only).
    pub recorded: Option<u64>,
}

/// The fleet's digest (see the module).
#[derive(Default)]
pub struct Digest(Mutex<Inner>);

#[derive(Default)]
struct Inner {
    sum: u64,
    parts: HashMap<(Part, String), u64>,
    relist: HashMap<Part, HashMap<String, u64>>,
    /// Deployments whose recorded placements changed and were not checked yet: uid → hash.
    recorded: HashMap<String, u64>,
}

fn part(kind: Part, id: &str, version: u64) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (kind, id, version).hash(&mut h);
    h.finish()
}

impl Inner {
    fn set(&mut self, kind: Part, id: String, version: u64) {
        let new = part(kind, &id, version);
        if let Some(old) = self.parts.insert((kind, id), new) {
            self.sum = self.sum.wrapping_sub(old);
        }
        self.sum = self.sum.wrapping_add(new);
    }

    fn remove(&mut self, kind: Part, id: &str) {
        if let Some(old) = self.parts.remove(&(kind, id.to_string())) {
            self.sum = self.sum.wrapping_sub(old);
        }
    }
}

impl Digest {
    /// The digest now.
    pub fn value(&self) -> u64 {
        self.0.lock().map(|i| i.sum).unwrap_or_default()
    }

    /// Takes in a watch event of `kind`; `see` says what of an object counts.
    pub fn event<K>(&self, kind: Part, event: &Event<K>, see: impl Fn(&K) -> Seen) {
        let Ok(mut inner) = self.0.lock() else { return };
        match event {
            Event::Apply(obj) => {
                let seen = see(obj);
                if let Some(r) = seen.recorded {
                    inner.recorded.insert(seen.id.clone(), r);
                }
                inner.set(kind, seen.id, seen.version);
            }
            Event::Delete(obj) => {
                let seen = see(obj);
                inner.recorded.remove(&seen.id);
                inner.remove(kind, &seen.id);
            }
            Event::Init => {
                inner.relist.insert(kind, HashMap::new());
            }
            Event::InitApply(obj) => {
                let seen = see(obj);
                if let Some(r) = seen.recorded {
                    inner.recorded.insert(seen.id.clone(), r);
                }
                inner.relist.entry(kind).or_default().insert(seen.id, seen.version);
            }
            Event::InitDone => {
                let listed = inner.relist.remove(&kind).unwrap_or_default();
                let gone: Vec<String> = inner
                    .parts
                    .keys()
                    .filter(|(k, id)| *k == kind && !listed.contains_key(id))
                    .map(|(_, id)| id.clone())
                    .collect();
                for id in gone {
                    inner.remove(kind, &id);
                }
                for (id, version) in listed {
                    inner.set(kind, id, version);
                }
            }
        }
    }

    /// Whether every deployment whose recorded placements changed since the last call agrees
    /// with `holds` (given its uid and the new hash); those that agree are forgotten (checked
    /// once), the others are kept for the next plan. Call with the plan currently trusted.
    pub fn recorded_hold(&self, holds: impl Fn(&str, u64) -> bool) -> bool {
        let Ok(mut inner) = self.0.lock() else { return false };
        inner.recorded.retain(|uid, r| !holds(uid, *r));
        inner.recorded.is_empty()
    }

    /// Forgets the recorded changes: a plan about to be solved from the stores reads them all.
    pub fn recorded_read(&self) {
        if let Ok(mut inner) = self.0.lock() {
            inner.recorded.clear();
        }
    }

    /// How many objects the digest holds (for tests).
    pub fn len(&self) -> usize {
        self.0.lock().map(|i| i.parts.len()).unwrap_or_default()
    }

    /// Whether it holds none.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone)]
    struct Obj(&'static str, u64, Option<u64>);

    fn see(o: &Obj) -> Seen {
        Seen { id: o.0.into(), version: o.1, recorded: o.2 }
    }

    #[test]
    fn the_digest_follows_the_objects_not_the_order_they_came_in() {
        let a = Digest::default();
        a.event(Part::Cluster, &Event::Apply(Obj("eu1", 1, None)), see);
        a.event(Part::Cluster, &Event::Apply(Obj("us1", 1, None)), see);
        let b = Digest::default();
        b.event(Part::Cluster, &Event::Apply(Obj("us1", 1, None)), see);
        b.event(Part::Cluster, &Event::Apply(Obj("eu1", 7, None)), see);
        assert_ne!(a.value(), b.value());
        b.event(Part::Cluster, &Event::Apply(Obj("eu1", 1, None)), see);
        assert_eq!(a.value(), b.value(), "the same objects, whatever came between");
        // One kind's object is not another's.
        let c = Digest::default();
        c.event(Part::Class, &Event::Apply(Obj("eu1", 1, None)), see);
        c.event(Part::Cluster, &Event::Apply(Obj("us1", 1, None)), see);
        assert_ne!(a.value(), c.value());
        // A delete takes its object out; a relist replaces its kind only.
        b.event(Part::Class, &Event::Apply(Obj("h100", 1, None)), see);
        let with_class = b.value();
        b.event(Part::Cluster, &Event::Delete(Obj("us1", 1, None)), see);
        assert_ne!(b.value(), with_class);
        for e in
            [Event::Init, Event::InitApply(Obj("us1", 1, None)), Event::InitApply(Obj("eu1", 1, None)), Event::InitDone]
        {
            b.event(Part::Cluster, &e, see);
        }
        assert_eq!(b.value(), with_class, "the relist brought us1 back and kept the class");
        for e in [Event::Init, Event::InitApply(Obj("eu1", 1, None)), Event::InitDone] {
            b.event(Part::Cluster, &e, see);
        }
        assert_eq!(b.len(), 2, "a relist without us1 drops it: eu1 and the class are left");
    }

    #[test]
    fn recorded_placements_are_checked_once_and_kept_while_they_do_not_hold() {
        let d = Digest::default();
        let before = d.value();
        d.event(Part::Deployment, &Event::Apply(Obj("uid-a", 1, Some(10))), see);
        let with_a = d.value();
        assert_ne!(before, with_a);
        d.event(Part::Deployment, &Event::Apply(Obj("uid-a", 1, Some(11))), see);
        assert_eq!(d.value(), with_a, "recording placements does not change the digest");
        d.event(Part::Deployment, &Event::Apply(Obj("uid-b", 1, Some(20))), see);
        // a's 11 holds, b's 20 does not: b stays for the next plan.
        assert!(!d.recorded_hold(|uid, r| (uid, r) == ("uid-a", 11)));
        assert!(!d.recorded_hold(|uid, _| uid == "uid-a"), "b was kept");
        assert!(d.recorded_hold(|_, r| r == 20), "b holds against the next plan; a was checked already");
        assert!(d.recorded_hold(|_, _| false), "nothing left to check");
        d.event(Part::Deployment, &Event::Apply(Obj("uid-a", 1, Some(12))), see);
        d.recorded_read();
        assert!(d.recorded_hold(|_, _| false), "read by a solve");
    }
}
