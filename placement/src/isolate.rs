//! A fleet in which one deployment makes the solver panic (a solver bug, met anyway) still gets
//! a plan: the deployment is found by bisection over the fleet's deployments and left out of
//! planning, and every other deployment is planned as if it were absent. Its plan entry says the
//! solver failed on it the way an invalid spec does (`invalid`: nothing placed, a controller
//! reports `InvalidSpec` and keeps what already runs), naming the failure. A deployment left out
//! stays out while its spec is unchanged, so the bisection runs once per failing spec, not once
//! per solve; a changed spec is tried again.
//!
//! A failure that does not go away with every deployment left out (or that needs more than
//! [`MAX_ISOLATED`] of them left out) is not one deployment's: it is returned as an error, as a
//! panic of the whole solve was before.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::panic::{AssertUnwindSafe, catch_unwind};

use crate::plan::{DeploymentPlan, InvalidSpec, Reason, Rejection};
use crate::snapshot::{DeploymentView, FleetSnapshot};

/// At most this many deployments are left out of one fleet.
pub const MAX_ISOLATED: usize = 8;

/// The deployments left out, by `namespace/name`: a fingerprint of the spec the solver failed
/// on, and the failure.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Quarantine(BTreeMap<String, (u64, String)>);

impl Quarantine {
    /// The deployments left out and why, by `namespace/name`.
    pub fn entries(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, (_, why))| (k.as_str(), why.as_str()))
    }

    /// Whether nothing is left out.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Forgets the deployments that are gone from `snapshot` or whose spec changed.
    fn prune(&mut self, snapshot: &FleetSnapshot) {
        if self.0.is_empty() {
            return;
        }
        let now: BTreeMap<String, u64> = snapshot.deployments.iter().map(|d| (key(d), fingerprint(d))).collect();
        self.0.retain(|k, (fp, _)| now.get(k) == Some(fp));
    }

    /// `snapshot` without the deployments still left out: first forgets those that are gone or
    /// whose spec changed (they are tried again). Borrowed, not copied, when none is left out.
    pub fn without<'s>(&mut self, snapshot: &'s FleetSnapshot) -> Cow<'s, FleetSnapshot> {
        self.prune(snapshot);
        if self.0.is_empty() {
            return Cow::Borrowed(snapshot);
        }
        let mut s = snapshot.clone();
        s.deployments.retain(|d| !self.0.contains_key(&key(d)));
        Cow::Owned(s)
    }

    /// The plan entries of the deployments left out that `snapshot` holds.
    pub fn plans(&self, snapshot: &FleetSnapshot) -> Vec<DeploymentPlan> {
        snapshot.deployments.iter().filter_map(|d| Some(left_out(d, &self.0.get(&key(d))?.1))).collect()
    }
}

fn key(d: &DeploymentView) -> String {
    format!("{}/{}", d.namespace, d.name)
}

/// A fingerprint of what the solver reads of the deployment's own spec.
fn fingerprint(d: &DeploymentView) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    format!("{:?}", d.spec).hash(&mut h);
    h.finish()
}

/// The plan entry of a deployment the solver failed on.
fn left_out(d: &DeploymentView, why: &str) -> DeploymentPlan {
    let message = format!(
        "the placement solver failed on this deployment ({why}); it is left out of planning until its spec changes, \
         and every other deployment is planned without it. This is a bug in Flotilla: please report it with this \
         deployment's spec"
    );
    let replicas = d.spec.replicas.max(0) as u32;
    DeploymentPlan {
        namespace: d.namespace.clone(),
        name: d.name.clone(),
        model: d.spec.model.name.clone(),
        desired: replicas,
        unplaced: replicas,
        rejections: vec![Rejection { cluster: "*".into(), reason: Reason::SolverFailed, message: message.clone() }],
        invalid: Some(InvalidSpec { field: "spec".into(), message }),
        ..Default::default()
    }
}

/// What a panic said.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a panic without a message".into())
}

/// `solve`, unless it panics.
fn attempt<T>(solve: &impl Fn(&FleetSnapshot) -> T, snapshot: &FleetSnapshot) -> Result<T, String> {
    catch_unwind(AssertUnwindSafe(|| solve(snapshot))).map_err(|p| panic_message(p.as_ref()))
}

/// `snapshot` with only the first `n` of `deployments`.
fn with_first(snapshot: &FleetSnapshot, deployments: &[DeploymentView], n: usize) -> FleetSnapshot {
    FleetSnapshot {
        clusters: snapshot.clusters.clone(),
        classes: snapshot.classes.clone(),
        deployments: deployments[..n].to_vec(),
        quotas: snapshot.quotas.clone(),
    }
}

/// Solves `snapshot` with `solve`, leaving out the deployments in `quarantine` (those whose
/// spec is unchanged) and any the solver panics on, which join `quarantine`. Returns the solve's
/// value for the rest of the fleet; [`Quarantine::plans`] gives the entries of those left out.
pub fn solve_isolating<T>(
    snapshot: &FleetSnapshot,
    quarantine: &mut Quarantine,
    solve: impl Fn(&FleetSnapshot) -> T,
) -> Result<T, String> {
    let mut rest = quarantine.without(snapshot).into_owned();
    loop {
        let failure = match attempt(&solve, &rest) {
            Ok(v) => return Ok(v),
            Err(failure) => failure,
        };
        if quarantine.0.len() >= MAX_ISOLATED {
            return Err(format!("the solver failed ({failure}) with {MAX_ISOLATED} deployments already left out"));
        }
        // The shortest prefix of the deployments that still fails ends with one that fails it.
        let all = std::mem::take(&mut rest.deployments);
        if let Err(e) = attempt(&solve, &with_first(&rest, &all, 0)) {
            return Err(format!("the solver failed with no deployment at all: {e}"));
        }
        let (mut ok, mut fails, mut why) = (0, all.len(), failure);
        while fails - ok > 1 {
            let mid = ok + (fails - ok) / 2;
            match attempt(&solve, &with_first(&rest, &all, mid)) {
                Ok(_) => ok = mid,
                Err(e) => (fails, why) = (mid, e),
            }
        }
        let culprit = &all[fails - 1];
        quarantine.0.insert(key(culprit), (fingerprint(culprit), why));
        rest.deployments = all.into_iter().filter(|d| !quarantine.0.contains_key(&key(d))).collect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{GenSpec, generate};
    use crate::{SolveOptions, solve};

    /// The real solver, except that it panics on any fleet holding `poison`.
    fn poisoned(poison: &'static [&'static str]) -> impl Fn(&FleetSnapshot) -> crate::Plan {
        move |s: &FleetSnapshot| {
            if let Some(d) = s.deployments.iter().find(|d| poison.contains(&d.name.as_str())) {
                panic!("index out of bounds in the solver, on {}", d.name);
            }
            solve(s, &SolveOptions::default())
        }
    }

    fn sample() -> FleetSnapshot {
        generate(&GenSpec { clusters: 6, deployments: 40, seed: 7 })
    }

    #[test]
    fn the_deployment_the_solver_fails_on_is_left_out_and_every_other_one_is_planned_as_without_it() {
        let snapshot = sample();
        let poison = snapshot.deployments[23].name.clone().leak();
        let poison: &'static [&'static str] = Box::leak(Box::new([&*poison]));
        let mut q = Quarantine::default();
        let plan = solve_isolating(&snapshot, &mut q, poisoned(poison)).unwrap();
        let left: Vec<(&str, &str)> = q.entries().collect();
        assert_eq!(left.len(), 1, "{left:?}");
        assert!(left[0].0.ends_with(&format!("/{}", poison[0])));
        assert!(left[0].1.contains("index out of bounds"), "{left:?}");
        // Every other deployment has the plan it would have without the bad one.
        let mut without = snapshot.clone();
        without.deployments.remove(23);
        assert_eq!(plan, solve(&without, &SolveOptions::default()));
        assert_eq!(plan.deployments.len(), snapshot.deployments.len() - 1);
        // The bad one's entry: nothing placed, invalid, naming the failure.
        let entries = q.plans(&snapshot);
        assert_eq!(entries.len(), 1);
        let e = &entries[0];
        assert_eq!((e.name.as_str(), e.assignments.len()), (poison[0], 0));
        let invalid = e.invalid.as_ref().unwrap();
        assert!(invalid.message.contains("placement solver failed") && invalid.message.contains("index out of bounds"));
        assert_eq!(e.rejections[0].reason, Reason::SolverFailed);
    }

    #[test]
    fn a_deployment_left_out_stays_out_until_its_spec_changes_and_is_not_bisected_again() {
        let snapshot = sample();
        let name: &'static str = snapshot.deployments[5].name.clone().leak();
        let poison: &'static [&'static str] = Box::leak(Box::new([name]));
        let mut q = Quarantine::default();
        solve_isolating(&snapshot, &mut q, poisoned(poison)).unwrap();
        // Unchanged: the next solve never sees it (one call, no panic to bisect).
        let calls = std::cell::Cell::new(0);
        let counting = |s: &FleetSnapshot| {
            calls.set(calls.get() + 1);
            poisoned(poison)(s)
        };
        solve_isolating(&snapshot, &mut q, counting).unwrap();
        assert_eq!(calls.get(), 1);
        assert!(!q.is_empty());
        // Its spec changed (fixed): tried again, planned, forgotten — also by the re-plan path,
        // which asks only for the fleet without what is left out.
        let mut fixed = snapshot.clone();
        fixed.deployments[5].spec.replicas += 1;
        let mut again = q.clone();
        assert_eq!(again.without(&fixed).deployments.len(), fixed.deployments.len(), "tried again");
        assert!(again.is_empty());
        assert_eq!(q.clone().without(&snapshot).deployments.len(), snapshot.deployments.len() - 1, "still out");
        let plan = solve_isolating(&fixed, &mut q, poisoned(&[])).unwrap();
        assert!(q.is_empty());
        assert!(plan.get(&fixed.deployments[5].namespace, name).is_some());
    }

    #[test]
    fn several_bad_deployments_are_each_left_out_and_a_failure_of_no_deployment_is_an_error() {
        let snapshot = sample();
        let names: Vec<&'static str> =
            [3usize, 17, 39].iter().map(|&i| &*snapshot.deployments[i].name.clone().leak()).collect();
        let poison: &'static [&'static str] = Box::leak(names.clone().into_boxed_slice());
        let mut q = Quarantine::default();
        let plan = solve_isolating(&snapshot, &mut q, poisoned(poison)).unwrap();
        let mut left: Vec<&str> = q.entries().map(|(k, _)| k.rsplit('/').next().unwrap()).collect();
        left.sort_unstable();
        let mut want = names.clone();
        want.sort_unstable();
        assert_eq!(left, want);
        assert_eq!(plan.deployments.len(), snapshot.deployments.len() - 3);
        // A solver that fails whatever the deployments: not one deployment's fault.
        let mut q = Quarantine::default();
        let e =
            solve_isolating(&snapshot, &mut q, |_: &FleetSnapshot| -> crate::Plan { panic!("broken") }).unwrap_err();
        assert!(e.contains("no deployment at all") && e.contains("broken"), "{e}");
        assert!(q.is_empty(), "nobody is blamed for it");
    }
}
