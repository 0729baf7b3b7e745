//! The improvement phase's first loop (moves, per deployment left short, in solve order) traced
//! for re-plans, as the greedy pass is (`replan.rs`). One deployment's attempt (a "unit") is a
//! pure function of what it reads: the free devices and users of some pools, the placements and
//! plans of some deployments (every earlier one of its tier when it closes a spread domain,
//! every later one watched when it settles moves), whether the deployment data it uses was built
//! yet, and the work spent so far, only through the budget. Each read is noted where it is made
//! (`note_*`; free devices through `Free`'s own notes). A re-plan walks the units again and
//! reuses one whose deployment and reads are clean and whose work could not reach the budget in
//! either run: its writes are applied as recorded. Anything a unit that ran (or did not run
//! again) may have written differently is dirty from then on, as are deployments whose greedy
//! plan or spec changed and pools whose free devices or users differ after the greedy pass.

use std::cell::RefCell;
use std::collections::{BTreeSet, HashSet};

use super::super::held::Held;
use crate::plan::Move;

/// What a unit read, noted as it ran.
#[derive(Clone, Debug, Default)]
pub(super) struct Reads {
    /// Deployments whose placements, plan or data were read.
    deps: Vec<usize>,
    /// Pools whose users (or free devices) were read.
    pools: Vec<(usize, usize)>,
    /// Every deployment in `[a, b)` was read.
    ranges: Vec<(usize, usize)>,
    /// Deployment data used: (deployment, built by this unit).
    built: Vec<(usize, bool)>,
    /// What the unit wrote: deployments (placements, plan) and pools (free devices, users).
    wrote_deps: Vec<usize>,
    wrote_pools: Vec<(usize, usize)>,
}

thread_local! {
    static READS: RefCell<Option<Reads>> = const { RefCell::new(None) };
}

fn with(f: impl FnOnce(&mut Reads)) {
    READS.with(|r| {
        if let Some(r) = r.borrow_mut().as_mut() {
            f(r);
        }
    });
}

/// A unit read deployment `i`'s placements, plan or eligibility.
pub(in crate::solve) fn note_dep(i: usize) {
    with(|r| r.deps.push(i));
}

/// A unit read pool `q`'s users.
pub(in crate::solve) fn note_pool(q: (usize, usize)) {
    with(|r| r.pools.push(q));
}

/// A unit read every deployment in `[a, b)`.
pub(super) fn note_range(a: usize, b: usize) {
    with(|r| r.ranges.push((a, b)));
}

/// A unit used deployment `i`'s data, built by it (`built`) or before.
pub(super) fn note_built(i: usize, built: bool) {
    with(|r| r.built.push((i, built)));
}

/// A unit wrote deployment `i`'s placements or plan.
pub(super) fn note_wrote_dep(i: usize) {
    with(|r| r.wrote_deps.push(i));
}

/// A unit wrote pool `q`'s free devices and users.
pub(super) fn note_wrote_pool(q: (usize, usize)) {
    with(|r| r.wrote_pools.push(q));
}

/// Notes nothing (a unit that panicked left its notes open: they must not grow on this thread).
pub(super) fn reset() {
    READS.with(|r| *r.borrow_mut() = None);
}

/// Notes reads until `end`.
pub(super) fn begin() {
    READS.with(|r| *r.borrow_mut() = Some(Reads::default()));
}

/// Stops noting; what was read since `begin`.
pub(super) fn end() -> Reads {
    let mut r = READS.with(|r| r.borrow_mut().take()).unwrap_or_default();
    for v in [&mut r.deps, &mut r.wrote_deps] {
        v.sort_unstable();
        v.dedup();
    }
    for v in [&mut r.pools, &mut r.wrote_pools] {
        v.sort_unstable();
        v.dedup();
    }
    // The first use of each deployment's data says whether it was built before the unit.
    let mut seen = HashSet::new();
    r.built.retain(|&(i, _)| seen.insert(i));
    r
}

/// What a unit left in the deployments and pools it wrote.
#[derive(Clone, Debug, Default, PartialEq)]
pub(super) struct Writes {
    pub deps: Vec<DepWrite>,
    pub pools: Vec<PoolWrite>,
}

/// A deployment as a unit left it: placements, moves, unplaced replicas, and whether its plan
/// is to be rebuilt.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct DepWrite {
    pub i: usize,
    pub held: Vec<Held>,
    pub moves: Vec<Move>,
    pub unplaced: u32,
    pub changed: bool,
}

/// A pool as a unit left it: free devices and users.
#[derive(Clone, Debug, PartialEq)]
pub(super) struct PoolWrite {
    pub q: (usize, usize),
    pub free: Vec<u32>,
    pub users: Option<Vec<usize>>,
}

impl Reads {
    pub(super) fn wrote_deps(&self) -> &[usize] {
        &self.wrote_deps
    }

    pub(super) fn wrote_pools(&self) -> &[(usize, usize)] {
        &self.wrote_pools
    }
}

/// One unit as it ran.
#[derive(Clone, Debug)]
pub(super) struct Unit {
    pub reads: Reads,
    /// Free-device pools read (`Free`'s notes).
    pub free_reads: Vec<(usize, usize)>,
    pub writes: Writes,
    /// Work when it began and ended.
    pub start: u64,
    pub end: u64,
}

/// The first loop's units by deployment (solve order); `None`: no unit (nothing to place, or
/// the budget was spent).
#[derive(Default)]
pub(super) struct PhaseTrace {
    pub units: Vec<Option<Unit>>,
}

impl PhaseTrace {
    /// Entries held (reads and written values), for the trace's bound.
    pub(super) fn entries(&self) -> u64 {
        let unit = |u: &Unit| {
            let r = &u.reads;
            let writes: usize = u.writes.deps.iter().map(|w| 1 + w.held.len() + w.moves.len()).sum::<usize>()
                + u.writes.pools.iter().map(|w| 1 + w.free.len() + w.users.as_ref().map_or(0, Vec::len)).sum::<usize>();
            r.deps.len() + r.pools.len() + r.ranges.len() + r.built.len() + u.free_reads.len() + writes
        };
        self.units.iter().flatten().map(unit).sum::<usize>() as u64
    }
}

/// What differs from the last run at the current point of the loop: never clean again within
/// one re-plan (conservative).
#[derive(Default)]
pub(in crate::solve) struct Dirty {
    deps: BTreeSet<usize>,
    pools: HashSet<(usize, usize)>,
    /// A unit left something other than the last run's did: every later unit runs.
    all: bool,
}

impl Dirty {
    pub(in crate::solve) fn dep(&mut self, i: usize) {
        self.deps.insert(i);
    }

    pub(in crate::solve) fn pool(&mut self, q: (usize, usize)) {
        self.pools.insert(q);
    }

    pub(super) fn has_dep(&self, i: usize) -> bool {
        self.deps.contains(&i)
    }

    /// Whether `unit` read anything dirty.
    fn hit(&self, unit: &Unit) -> bool {
        let r = &unit.reads;
        self.all
            || r.deps.iter().any(|i| self.deps.contains(i))
            || r.built.iter().any(|(i, _)| self.deps.contains(i))
            || r.ranges.iter().any(|&(a, b)| self.deps.range(a..b).next().is_some())
            || r.pools.iter().chain(&unit.free_reads).any(|q| self.pools.contains(q))
    }

    /// A unit ran (or did not run again): when it left something other than the last run's
    /// unit did, nothing later is reused. (Marking only what it changed would do in principle,
    /// but a move reaches later units through chains the tests cannot show are all noted; a
    /// re-plan that changes the phase's moves then runs the rest of it, as a whole solve does.)
    pub(super) fn wrote(&mut self, old: Option<&Writes>, new: &Writes) {
        let none = Writes::default();
        if old.unwrap_or(&none) != new {
            self.all = true;
        }
    }
}

impl Unit {
    /// Whether this unit, from the last run, may stand for deployment `di`'s now: its
    /// deployment and reads are clean, the deployment data it used is built (or not) as it
    /// was, and neither run's work could reach `budget` within it (`work`: spent so far now).
    pub(super) fn reusable(
        &self,
        di: usize,
        dirty: &Dirty,
        built: impl Fn(usize) -> bool,
        work: u64,
        budget: u64,
    ) -> bool {
        !dirty.has_dep(di)
            && self.end < budget
            && work + (self.end - self.start) < budget
            && self.reads.built.iter().all(|&(i, here)| built(i) != here)
            && !dirty.hit(self)
    }

    /// Deployment data this unit built (charged for).
    pub(super) fn built_here(&self) -> impl Iterator<Item = usize> + '_ {
        self.reads.built.iter().filter(|b| b.1).map(|b| b.0)
    }
}
