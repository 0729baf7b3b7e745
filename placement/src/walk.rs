//! One walk over the greedy pass for a re-plan (`replan.rs`): tier by tier, the tier's `open`
//! view, then every deployment's keep step, then every fill step, each run again or reused from
//! the last trace; then the improvement phase on the result. The dirty pools (whose free
//! devices, at that point of the pass, differ from the last solve's) and the index of which
//! steps read each pool (`DirtyPools`) decide which steps run; the walk leaves the new trace.

use std::collections::HashMap;

use super::super::free::{Free, StepIo};
use super::super::held::{Held, movable};
use super::super::improve::PhaseMemo;
use super::super::quota::{Book, Room};
use super::super::{Ctx, Fixed, Kept, SolveOptions, Solved, initial_free};
use super::tier_open::TierOpen;
use super::{Changes, KeepStep, Outcome, ReplanStats, Step, StepQuota, Trace, Traced};
use crate::devices::ReplicaShape;
use crate::devices::{DeviceMatcher, MatcherMemo};
use crate::filters::StaticMemo;
use crate::plan::DeploymentPlan;
use crate::snapshot::{DeploymentView, FleetSnapshot};
use dirty_pools::{DirtyPools, position};

/// The walk stops: its evaluations neared the budget, its trace outgrew its bound, or the last
/// trace cannot stand for this pass. The fleet is then solved whole.
struct Abort;

/// What a tier's keep step left for the deployment's fill step.
enum Left {
    /// The deployment runs nothing: its fill step places it from scratch.
    Nothing,
    /// The keep step was reused: what it kept is in its record, taken if the fill step runs.
    Reused,
    /// The keep step ran again (`None`: the spec is invalid), and so does the fill step.
    Ran(Option<Kept>),
}

/// One walk over the greedy pass, against the last one when there is one: the steps' records
/// it reuses or replaces, and what it gathers for the next re-plan.
pub(super) struct Walk<'w> {
    order: &'w [&'w DeploymentView],
    options: &'w SolveOptions,
    /// Per deployment in solve order: whether it changed since the last solve.
    changed: &'w [bool],
    pools: DirtyPools,
    /// The walk stops past these evaluations (half the budget) and trace entries.
    limit: u64,
    max_entries: u64,
    /// Per deployment in solve order: its keep step (when it ran one) and its fill step.
    keep: Vec<Option<KeepStep>>,
    fill: Vec<Step>,
    /// Per tier (by its first deployment): the `open` view its keep steps judged spread on.
    open: HashMap<usize, TierOpen>,
    /// Per deployment in solve order, the first deployment of its tier: in the last trace
    /// (empty on a first solve) and in this walk.
    tier_start_old: Vec<usize>,
    tier_start: Vec<usize>,
    /// Per deployment in solve order, where the greedy pass put its replicas.
    held: Vec<Vec<Held>>,
    phase: PhaseMemo,
    /// Per deployment in solve order, the evaluations its steps cost.
    costs: Vec<u64>,
    /// The namespaces' FleetQuotas, charged as the steps run or are reused (`quota.rs`).
    book: Option<Book<'w>>,
    stats: ReplanStats,
}

impl<'w> Walk<'w> {
    /// Walks the greedy pass; `plans` holds the last pass's plans (empty on a first solve) and
    /// is left with this pass's, then the improvement phase's.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn run(
        snapshot: &'w FleetSnapshot,
        fixed: &Fixed,
        order: &'w [&'w DeploymentView],
        options: &'w SolveOptions,
        prev: Option<Trace>,
        changes: Changes<'w>,
        plans: &mut Vec<DeploymentPlan>,
        max_entries: u64,
    ) -> Outcome {
        let limit = options.max_evaluations / 2;
        if prev.as_ref().is_some_and(|t| t.evaluations > limit || t.fill.len() != order.len()) {
            return Outcome::Abort;
        }
        let mut free = Free::new(initial_free(snapshot));
        free.record();
        let mut prev = prev;
        let memo = within(prev.as_mut().and_then(|t| t.matcher.take()), matcher_bound(snapshot), MatcherMemo::len);
        let mut matcher = match memo {
            Some(m) => DeviceMatcher::resume(&snapshot.classes, m),
            None => DeviceMatcher::new(&snapshot.classes),
        };
        let statics = prev.as_mut().map(|t| std::mem::take(&mut t.statics));
        let mut statics = within(statics, statics_bound(snapshot), StaticMemo::len).unwrap_or_default();
        let mut walk = Walk::start(order, options, changes.deployments, prev, free.len(), (limit, max_entries));
        walk.book = Book::new(snapshot, order);
        walk.note_changes(&free, changes.capacity);
        let mut evaluations = 0u64;
        let mut spare = Vec::new();
        let mut ctx = fixed.ctx(snapshot, &mut free, &mut matcher, &mut statics, &mut evaluations, &mut spare);
        if walk.greedy(&mut ctx, plans).is_err() {
            return Outcome::Abort;
        }
        let evaluations = *ctx.evaluations;
        let greedy_saved = walk.improve(&mut ctx, plans);
        Outcome::Traced(Box::new(walk.finish(evaluations, matcher.into_memo(), statics, greedy_saved)))
    }

    /// A walk from the last trace (`prev`), or from nothing on a first solve.
    fn start(
        order: &'w [&'w DeploymentView],
        options: &'w SolveOptions,
        changed: &'w [bool],
        prev: Option<Trace>,
        pools: usize,
        (limit, max_entries): (u64, u64),
    ) -> Self {
        let n = order.len();
        let mut walk = Walk {
            order,
            options,
            changed,
            pools: DirtyPools::new(prev.is_some(), pools),
            limit,
            max_entries,
            keep: vec![None; n],
            fill: vec![Step::default(); n],
            open: HashMap::new(),
            tier_start_old: Vec::new(),
            tier_start: vec![0; n],
            held: vec![Vec::new(); n],
            phase: PhaseMemo::default(),
            costs: vec![0; n],
            book: None,
            stats: ReplanStats::default(),
        };
        if let Some(t) = prev {
            walk.pools.readers = t.readers;
            walk.pools.entries = t.entries;
            (walk.keep, walk.fill, walk.open, walk.tier_start_old, walk.held, walk.phase) =
                (t.keep, t.fill, t.open, t.tier_start, t.held, t.phase);
        }
        walk
    }

    /// What changed before the pass starts: the changed deployments' phase data is forgotten,
    /// and pools whose free devices the snapshot reports otherwise than the last one
    /// (`capacity`, with the last value) are dirty from the start.
    fn note_changes(&mut self, free: &Free, capacity: &[(usize, usize, Vec<u32>)]) {
        for i in (0..self.changed.len()).filter(|&i| self.changed[i]) {
            self.phase.forget(i);
            self.phase.dirty.dep(i);
        }
        for (ci, pi, was) in capacity {
            // The phase re-packs pools from the snapshot's free devices.
            self.phase.dirty.pool((*ci, *pi));
            let p = free.flat(*ci, *pi);
            if free.get_flat(p) != was {
                self.pools.dirty_from_start(p, was);
            }
        }
    }

    /// The greedy pass, one priority tier after another.
    fn greedy(&mut self, ctx: &mut Ctx<'_, '_>, plans: &mut Vec<DeploymentPlan>) -> Result<(), Abort> {
        let snapshot = ctx.snapshot;
        let cluster_ix: HashMap<&str, usize> =
            snapshot.clusters.iter().enumerate().map(|(i, c)| (c.name.as_str(), i)).collect();
        let mut start = 0;
        while start < self.order.len() {
            let end = tier_end(self.order, start);
            self.tier(ctx, &cluster_ix, start, end, plans)?;
            start = end;
        }
        Ok(())
    }

    /// One tier (`start..end` in solve order): its `open` view, every keep step, every fill step.
    fn tier(
        &mut self,
        ctx: &mut Ctx<'_, '_>,
        cluster_ix: &HashMap<&str, usize>,
        start: usize,
        end: usize,
        plans: &mut Vec<DeploymentPlan>,
    ) -> Result<(), Abort> {
        self.tier_start[start..end].fill(start);
        if self.pools.incremental && self.tier_start_old.get(start) != Some(&start) {
            return Err(Abort);
        }
        // The tier's `open` view, and the pools where it differs from the last solve's.
        let mut open_dirty = Vec::new();
        let last = if self.pools.incremental { self.open.remove(&start) } else { None };
        let (tier, changed) = (&self.order[start..end], &self.changed[start..end]);
        let dirty = self.pools.old.keys().copied();
        let open = TierOpen::of(ctx.snapshot, cluster_ix, tier, changed, ctx.free, dirty, last, &mut open_dirty);
        let view = open.as_ref().map(|o| o.view.as_slice());
        let mut left = Vec::with_capacity(end - start);
        for i in start..end {
            left.push(self.keep_step(ctx, i, start, view, &open_dirty)?);
        }
        if let Some(o) = open {
            self.open.insert(start, o);
        }
        for (i, left) in (start..end).zip(left) {
            self.fill_step(ctx, i, start, left, plans)?;
        }
        Ok(())
    }

    /// Deployment `i`'s keep step (a tier starting at `start`, judging spread on `view`): run
    /// again when the deployment changed, a pool it read is dirty or its part of the tier's
    /// view (`open_dirty`) differs; else reused.
    fn keep_step(
        &mut self,
        ctx: &mut Ctx<'_, '_>,
        i: usize,
        start: usize,
        view: Option<&[Vec<Vec<u32>>]>,
        open_dirty: &[bool],
    ) -> Result<Left, Abort> {
        let pos = position(start, false, i);
        let hit = self.pools.pop(pos);
        let old = self.keep[i].take();
        if !self.order[i].current.iter().any(|p| p.desired > 0) {
            if old.is_some() || !hit.is_empty() {
                self.pools.ran(ctx.free, pos, old.as_ref().map(|o| &o.step.io), &StepIo::default(), Vec::new(), &hit);
            }
            return Ok(Left::Nothing);
        }
        let open_hit = old
            .as_ref()
            .is_some_and(|k| k.step.io.open_reads.iter().any(|&p| open_dirty.get(p as usize) == Some(&true)));
        let reuse = self.pools.incremental
            && !self.changed[i]
            && hit.is_empty()
            && !open_hit
            && old.as_ref().is_some_and(|o| self.same_room(i, &o.step));
        let left = match old {
            Some(old) if reuse => {
                replay(ctx.free, &old.step.io);
                self.recharge(i, &old.step);
                self.reused(ctx, i, old.step.cost);
                self.keep[i] = Some(old);
                Left::Reused
            }
            old => {
                ctx.free.begin();
                let before = *ctx.evaluations;
                let d = self.order[i];
                let room = self.room(i);
                let mut step_ctx = ctx.with(d, &self.options.explain, view);
                step_ctx.quota = room;
                let kept = step_ctx.keep(d);
                let room = step_ctx.quota.take();
                let (io, changed_from) = ctx.free.end();
                let cost = *ctx.evaluations - before;
                self.costs[i] += cost;
                self.pools.ran(ctx.free, pos, old.as_ref().map(|o| &o.step.io), &io, changed_from, &hit);
                let quota = kept.as_ref().and_then(|k| {
                    let held = k.candidates.iter().filter(|c| c.placed > 0);
                    self.charge(i, room, held.map(|c| (c.cluster, c.pool, c.placed, c.replica_price)))
                });
                self.keep[i] = Some(KeepStep { step: Step { io, cost, quota }, kept: kept.clone() });
                self.stats.steps_run += 1;
                Left::Ran(kept)
            }
        };
        self.within_bounds(ctx)?;
        Ok(left)
    }

    /// Deployment `i`'s fill step, after its keep step left `left`: reused when neither the
    /// deployment nor its keep step nor a pool it read changed; else run again.
    fn fill_step(
        &mut self,
        ctx: &mut Ctx<'_, '_>,
        i: usize,
        start: usize,
        left: Left,
        plans: &mut Vec<DeploymentPlan>,
    ) -> Result<(), Abort> {
        let pos = position(start, true, i);
        let hit = self.pools.pop(pos);
        let same = self.pools.incremental && !self.changed[i] && hit.is_empty();
        let kept = match left {
            Left::Nothing | Left::Reused if same && self.same_room(i, &self.fill[i]) => {
                replay(ctx.free, &self.fill[i].io);
                let step = std::mem::take(&mut self.fill[i]);
                self.recharge(i, &step);
                self.reused(ctx, i, step.cost);
                self.fill[i] = step;
                return Ok(());
            }
            Left::Nothing => None,
            Left::Reused => self.keep[i].as_ref().and_then(|k| k.kept.clone()),
            Left::Ran(kept) => kept,
        };
        ctx.free.begin();
        let before = *ctx.evaluations;
        let d = self.order[i];
        let room = self.room(i);
        let mut step_ctx = ctx.with(d, &self.options.explain, None);
        step_ctx.quota = room;
        let (plan, h) = step_ctx.solve_one(d, kept);
        let room = step_ctx.quota.take();
        let (io, changed_from) = ctx.free.end();
        let cost = *ctx.evaluations - before;
        self.costs[i] += cost;
        let old = std::mem::take(&mut self.fill[i]);
        let incremental = self.pools.incremental;
        self.pools.ran(ctx.free, pos, incremental.then_some(&old.io), &io, changed_from, &hit);
        let quota = self.charge(i, room, h.iter().map(|h| (h.cluster, h.pool, h.count, h.price)));
        self.fill[i] = Step { io, cost, quota };
        // What the improvement phase will see otherwise than in the last run: this
        // deployment, and the users of the pools it had or has replicas on.
        if incremental && phase_sees_change(&self.held[i], &h, plans.get(i), &plan) {
            self.phase.dirty.dep(i);
            self.held[i].iter().chain(&h).for_each(|x| self.phase.dirty.pool((x.cluster, x.pool)));
        }
        if i < plans.len() {
            plans[i] = plan;
        } else {
            // A first solve: every fill step runs, in solve order.
            plans.push(plan);
        }
        self.held[i] = h;
        self.stats.steps_run += 1;
        self.within_bounds(ctx)
    }

    /// The room deployment `i`'s step has under its namespace's quotas now (`None`: none).
    fn room(&self, i: usize) -> Option<Room> {
        self.book.as_ref().and_then(|b| b.room(i))
    }

    /// Whether deployment `i`'s last `step` read its room as it stands now: no quota then and
    /// now, or every check of the step answering the same (`Probe::holds`).
    fn same_room(&self, i: usize, step: &Step) -> bool {
        match (self.book.as_ref().and_then(|b| b.others(i)), &step.quota) {
            (None, None) => true,
            (Some((others, limits)), Some(q)) => q.probe.holds(&others, limits),
            _ => false,
        }
    }

    /// A reused step of deployment `i` charges its namespace as it did.
    fn recharge(&mut self, i: usize, step: &Step) {
        if let (Some(b), Some(q)) = (self.book.as_mut(), &step.quota) {
            b.set_charged(i, &q.charged);
        }
    }

    /// Deployment `i` charged with its replicas `placed` (cluster, pool, replicas, price per
    /// replica) after a step that ran on `room`: what the step leaves in its trace.
    fn charge(
        &mut self,
        i: usize,
        room: Option<Room>,
        placed: impl Iterator<Item = (usize, usize, u32, u64)>,
    ) -> Option<StepQuota> {
        let b = self.book.as_mut()?;
        let room = room?;
        b.charge(i, &ReplicaShape::of(&self.order[i].spec.topology), placed);
        Some(StepQuota { probe: room.probe(), charged: b.charged(i).to_vec() })
    }

    /// A step of deployment `i` reused (its writes already replayed): what it cost is spent.
    fn reused(&mut self, ctx: &mut Ctx<'_, '_>, i: usize, cost: u64) {
        *ctx.evaluations += cost;
        self.costs[i] += cost;
        self.stats.steps_reused += 1;
    }

    /// Whether the walk may go on: its evaluations within half the budget, its trace within
    /// its bound.
    fn within_bounds(&self, ctx: &Ctx<'_, '_>) -> Result<(), Abort> {
        if *ctx.evaluations > self.limit || self.pools.entries > self.max_entries { Err(Abort) } else { Ok(()) }
    }

    /// Replicas left unplaced: the improvement phase, on this pass's result, as `solve` runs it
    /// (the same plans, placements, costs and free devices; its attempts traced). Returns the
    /// greedy plans it changed.
    fn improve(&mut self, ctx: &mut Ctx<'_, '_>, plans: &mut [DeploymentPlan]) -> Vec<(usize, DeploymentPlan)> {
        if self.options.max_improvement == 0 || plans.iter().all(|p| p.unplaced == 0) {
            self.phase.skipped();
            return Vec::new();
        }
        // Pools whose free devices differ from the last pass's at its end.
        for &p in self.pools.old.keys() {
            self.phase.dirty.pool(ctx.free.coords(p));
        }
        let solved = Solved { plans: Vec::new(), held: self.held.clone(), cost: std::mem::take(&mut self.costs) };
        let saved = ctx.improve(self.order, plans, solved, self.options, Some(&mut self.phase));
        // The phase's trace within the same bound: beyond it, the next phase runs whole.
        if self.pools.entries + self.phase.trace_entries() > self.max_entries {
            self.phase.skipped();
        }
        saved
    }

    /// The trace this walk leaves for the next re-plan, and what it did.
    fn finish(
        self,
        evaluations: u64,
        matcher: MatcherMemo,
        statics: StaticMemo,
        greedy_saved: Vec<(usize, DeploymentPlan)>,
    ) -> Traced {
        let trace = Trace {
            keep: self.keep,
            fill: self.fill,
            tier_start: self.tier_start,
            open: self.open,
            readers: self.pools.readers,
            evaluations,
            entries: self.pools.entries,
            held: self.held,
            phase: self.phase,
            matcher: Some(matcher),
            statics,
        };
        let stats = ReplanStats {
            trace_entries: trace.entries + trace.phase.trace_entries(),
            phase_run: trace.phase.units_run,
            phase_reused: trace.phase.units_reused,
            ..self.stats
        };
        Traced { trace, stats, greedy_saved }
    }
}

/// The end of the priority tier that starts at `start` (the deployments are in solve order).
fn tier_end(order: &[&DeploymentView], start: usize) -> usize {
    let tier = order[start].priority();
    start + order[start..].iter().take_while(|d| d.priority() == tier).count()
}

/// A memo kept from the last solve, unless it holds more than `bound` entries (a bound on what
/// changed specs leave behind).
fn within<T>(memo: Option<T>, bound: usize, len: impl Fn(&T) -> usize) -> Option<T> {
    memo.filter(|m| len(m) <= bound)
}

/// The entries a device matcher over this snapshot's expressions and classes could need.
fn matcher_bound(snapshot: &FleetSnapshot) -> usize {
    let exprs: usize =
        snapshot.deployments.iter().flat_map(|d| &d.spec.devices.alternatives).map(|a| a.selectors.len()).sum();
    let classes = snapshot.classes.len();
    2 * (exprs + classes) * (classes + 1) + 1024
}

/// The static filters' verdicts this snapshot could need: one row per policy.
fn statics_bound(snapshot: &FleetSnapshot) -> usize {
    2 * snapshot.deployments.len() + 64
}

/// Whether the improvement phase sees deployment `i` otherwise than in the last run, after
/// its fill step ran again: its replicas went elsewhere (`held`, from `last_held`), or its
/// plan (from `last`, `None` on a first solve) differs in what the phase reads of it.
fn phase_sees_change(last_held: &[Held], held: &[Held], last: Option<&DeploymentPlan>, plan: &DeploymentPlan) -> bool {
    last_held != held
        || last.is_none_or(|o| (o.unplaced, o.desired, movable(o)) != (plan.unplaced, plan.desired, movable(plan)))
}

/// A reused step's writes, the same in both solves (a pool it writes is clean, or it would have
/// run).
fn replay(free: &mut Free, io: &StepIo) {
    for (p, v) in &io.writes {
        free.set_flat(*p, v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{GenSpec, generate};

    /// A pool's free devices in a `Free` of one cluster with `pools` pools of two nodes.
    fn free(pools: usize) -> Free {
        Free::new(vec![vec![vec![8, 8]; pools]])
    }

    fn io(reads: &[u32], writes: &[(u32, &[u32])]) -> StepIo {
        StepIo {
            reads: reads.to_vec(),
            open_reads: vec![],
            writes: writes.iter().map(|(p, v)| (*p, v.to_vec())).collect(),
        }
    }

    #[test]
    fn a_tier_ends_where_the_priority_changes() {
        let mut snap = generate(&GenSpec { clusters: 1, deployments: 5, seed: 1 });
        for (d, p) in snap.deployments.iter_mut().zip([500, 500, 0, 0, -100]) {
            d.spec.placement.priority = Some(p);
        }
        let order: Vec<&DeploymentView> = snap.deployments.iter().collect();
        assert_eq!(tier_end(&order, 0), 2);
        assert_eq!(tier_end(&order, 2), 4);
        assert_eq!(tier_end(&order, 4), 5);
    }

    #[test]
    fn a_memo_is_kept_up_to_its_bound() {
        let snap = generate(&GenSpec { clusters: 3, deployments: 2, seed: 1 });
        let mut memo = StaticMemo::default();
        for d in &snap.deployments {
            memo.row(&d.spec.placement, &snap.clusters);
        }
        let rows = memo.len();
        assert!(rows > 0);
        assert_eq!(within(Some(memo), rows, StaticMemo::len).map(|m| m.len()), Some(rows));
        let mut memo = StaticMemo::default();
        memo.row(&snap.deployments[0].spec.placement, &snap.clusters);
        assert!(within(Some(memo), 0, StaticMemo::len).is_none(), "a memo past its bound starts afresh");
        assert!(within(None::<StaticMemo>, 10, StaticMemo::len).is_none());
    }

    #[test]
    fn the_memos_bounds_grow_with_the_snapshot() {
        let small = generate(&GenSpec { clusters: 2, deployments: 2, seed: 4 });
        let large = generate(&GenSpec { clusters: 2, deployments: 40, seed: 4 });
        assert_eq!(statics_bound(&small), 2 * 2 + 64);
        assert_eq!(statics_bound(&large), 2 * 40 + 64);
        assert!(matcher_bound(&small) >= 1024);
        assert!(matcher_bound(&large) > matcher_bound(&small), "more selectors, more entries");
        let classes = small.classes.len();
        let none = FleetSnapshot { deployments: vec![], ..small };
        assert_eq!(matcher_bound(&none), 2 * classes * (classes + 1) + 1024);
    }

    #[test]
    fn a_replayed_step_writes_its_pools() {
        let mut free = free(2);
        replay(&mut free, &io(&[0, 1], &[(1, &[2, 8])]));
        assert_eq!(free.raw(), &vec![vec![vec![8, 8], vec![2, 8]]]);
    }

    #[test]
    fn the_phase_sees_a_deployment_change_when_its_replicas_or_counts_do() {
        let held = |pool| vec![Held { cluster: 0, pool, rank: 1, count: 1, kept: 0, price: 0 }];
        let plan = DeploymentPlan { desired: 2, unplaced: 1, ..Default::default() };
        assert!(!phase_sees_change(&held(0), &held(0), Some(&plan), &plan));
        assert!(phase_sees_change(&held(0), &held(1), Some(&plan), &plan), "its replica moved");
        assert!(phase_sees_change(&held(0), &held(0), None, &plan), "no last plan");
        let placed = DeploymentPlan { unplaced: 0, ..plan.clone() };
        assert!(phase_sees_change(&held(0), &held(0), Some(&plan), &placed), "fewer unplaced");
        let why = crate::plan::InvalidSpec { field: "spec".into(), message: "invalid".into() };
        let invalid = DeploymentPlan { invalid: Some(why), ..plan.clone() };
        assert!(phase_sees_change(&held(0), &held(0), Some(&plan), &invalid), "no longer movable");
        // What the phase does not read of the plan (its cost, say) is no change.
        let cost = DeploymentPlan { cost_micros_per_hour: 5, ..plan.clone() };
        assert!(!phase_sees_change(&held(0), &held(0), Some(&plan), &cost));
    }
}

#[path = "dirty_pools.rs"]
mod dirty_pools;
