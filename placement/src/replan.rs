//! Incremental re-plan. The greedy pass is a sequence of steps: per priority tier, every
//! running deployment keeps what it runs (a keep step), then every deployment places the rest
//! (a fill step). A step is a pure function of its deployment, the free devices of the pools it
//! reads (`free.rs` notes them) and, for a keep step, the tier's `open` view; a fill step also
//! takes what its keep step left. So a re-plan walks the steps again and runs only those whose
//! deployment changed or that read a pool whose free devices differ, at that point, from the
//! last solve (a "dirty" pool); every other step's output and writes are reused. A pool stays
//! dirty until a step that runs again leaves it as the last solve did. Which later steps read a
//! dirty pool comes from an index (pool → steps that read it), so the walk costs the steps that
//! run again, not every candidate of every deployment.
//!
//! The plan is byte for byte the one `solve` gives for the same snapshot (a property test checks
//! it on random change sequences). A re-plan solves the whole fleet when what it would reuse
//! cannot stand: the first solve, clusters that changed in more than their pools' free devices
//! (capacity observed: those pools are dirty from the start), other classes, another set of
//! deployments (or another solve order), explain mode, a solve whose evaluations near the budget
//! or whose trace would outgrow its bound. When the greedy pass leaves replicas unplaced and the
//! improvement phase is on, the phase runs on the replayed pass's result as `solve` runs it, its
//! move attempts reused where what they read is unchanged (`phase_trace.rs`); the greedy plans it
//! changed, its deployment data and the solve's caches are kept for the next re-plan.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap, HashMap};

use super::free::{Free, StepIo};
use super::held::{Held, movable};
use super::improve::PhaseMemo;
use super::{Fixed, Kept, Pending, SolveOptions, Solved, initial_free, order_indices, solve, solve_cmp};
use crate::devices::{DeviceMatcher, MatcherMemo};
use crate::filters::StaticMemo;
use crate::plan::{DeploymentPlan, Plan};
use crate::snapshot::{ClassView, ClusterView, DeploymentView, FleetSnapshot, PoolView};
use tier_open::TierOpen;

/// Keeps the last plan and how it was reached, and re-plans the next snapshot from them.
pub struct Replanner {
    options: SolveOptions,
    clusters: Vec<ClusterView>,
    classes: BTreeMap<String, ClassView>,
    /// The deployments in solve order, as last solved.
    deployments: Vec<DeploymentView>,
    /// Their positions in the last snapshot's list, and whether no two share a place in the
    /// order (then the same names at the same positions are the same order).
    order_ix: Vec<usize>,
    unique: bool,
    /// What the solve works out once from the clusters and classes.
    fixed: Option<Fixed>,
    /// Entries a trace may hold (`MAX_TRACE_ENTRIES`).
    limit: u64,
    /// A whole solve's trace outgrew `limit` (or its evaluations neared the budget): every
    /// solve is whole from then on, untraced.
    untraceable: bool,
    /// The last plan (after the improvement phase, when it ran).
    plan: Plan,
    /// The greedy pass's plans that the improvement phase changed (solve-order index, plan):
    /// with `plan`, the last greedy pass, which the next walk starts from.
    greedy_saved: Vec<(usize, DeploymentPlan)>,
    /// The last greedy pass, step by step; `None` when the last plan cannot be re-planned from
    /// (explain mode, the evaluations neared the budget, the trace outgrew its bound).
    trace: Option<Trace>,
    stats: ReplanStats,
}

/// What the last solve or re-plan did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReplanStats {
    /// The whole fleet was solved.
    pub full: bool,
    /// Steps of the greedy pass run.
    pub steps_run: usize,
    /// Steps reused from the last solve.
    pub steps_reused: usize,
    /// Entries the trace kept for the next re-plan holds (0: none kept).
    pub trace_entries: u64,
    /// The improvement phase's move attempts (one per deployment left short, until its budget
    /// is spent) run, and reused from the last solve.
    pub phase_run: usize,
    pub phase_reused: usize,
}

/// One step as it ran: what it read and wrote, and the evaluations it cost.
#[derive(Clone, Debug, Default)]
struct Step {
    io: StepIo,
    cost: u64,
}

/// A keep step and what it left for the fill step (`None`: the spec is invalid; the fill step
/// says so).
#[derive(Clone)]
struct KeepStep {
    step: Step,
    kept: Option<Kept>,
}

struct Trace {
    /// Per deployment in solve order: its keep step (when it ran one) and its fill step.
    keep: Vec<Option<KeepStep>>,
    fill: Vec<Step>,
    /// Per deployment in solve order, the first deployment of its tier.
    tier_start: Vec<usize>,
    /// Per tier (by its first deployment): the `open` view its keep steps judged spread on.
    open: HashMap<usize, TierOpen>,
    /// Flat pool → positions (`position`) of the steps that read it, ascending.
    readers: Vec<Vec<u64>>,
    evaluations: u64,
    /// Entries held (`entries`).
    entries: u64,
    /// Per deployment in solve order, where the greedy pass put its replicas (what the
    /// improvement phase starts from).
    held: Vec<Vec<Held>>,
    /// The improvement phase's deployment data, for the next re-plan's phase.
    phase: PhaseMemo,
    /// What the device matcher compiled and judged (the classes are the same in a re-plan).
    matcher: Option<MatcherMemo>,
    /// The static filters' verdicts per policy (the clusters' static facts are the same).
    statics: StaticMemo,
}

/// Entries (pools read, values written) a trace may hold by default, about 12 bytes each with
/// the index: a fleet whose trace would be larger is solved whole every time rather than hold
/// it (the 1,000 × 5,000 benchmark fleet needs a fraction of this).
pub const MAX_TRACE_ENTRIES: u64 = 16_000_000;

/// What one step adds to the trace.
fn entries(io: &StepIo) -> u64 {
    (io.reads.len() + io.open_reads.len() + io.writes.iter().map(|w| 1 + w.1.len()).sum::<usize>()) as u64
}

/// A step's place in the pass: tiers in order, a tier's keep steps before its fill steps,
/// deployments in solve order.
fn position(tier_start: usize, fill: bool, i: usize) -> u64 {
    ((tier_start as u64) << 33) | (u64::from(fill) << 32) | i as u64
}

impl Replanner {
    /// Solves `snapshot` whole, keeping what a re-plan needs.
    pub fn new(snapshot: &FleetSnapshot, options: SolveOptions) -> Self {
        Self::with_limit(snapshot, options, MAX_TRACE_ENTRIES)
    }

    /// As [`Replanner::new`], with the trace held to `limit` entries (`MAX_TRACE_ENTRIES`).
    pub fn with_limit(snapshot: &FleetSnapshot, options: SolveOptions, limit: u64) -> Self {
        let mut r = Self {
            options,
            clusters: Vec::new(),
            classes: BTreeMap::new(),
            deployments: Vec::new(),
            order_ix: Vec::new(),
            unique: false,
            fixed: None,
            limit,
            untraceable: false,
            plan: Plan::default(),
            greedy_saved: Vec::new(),
            trace: None,
            stats: ReplanStats::default(),
        };
        r.full(snapshot);
        r
    }

    /// The last plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The last plan, owned.
    pub fn into_plan(self) -> Plan {
        self.plan
    }

    /// What the last solve or re-plan did.
    pub fn stats(&self) -> ReplanStats {
        self.stats
    }

    /// The plan for `snapshot`: the one `solve` gives, reusing what its changes cannot affect.
    pub fn replan(&mut self, snapshot: &FleetSnapshot) -> &Plan {
        // The same place in the solve order: priority, creation, namespace and name.
        let same_key = |a: &DeploymentView, b: &DeploymentView| solve_cmp(a, b).is_eq();
        let n = self.deployments.len();
        // The last order still holds when every position names the same deployment and no two
        // tie; otherwise sort again.
        let kept_order = self.unique
            && snapshot.deployments.len() == n
            && self.order_ix.iter().zip(&self.deployments).all(|(&i, b)| same_key(&snapshot.deployments[i], b));
        let order_ix = if kept_order { std::mem::take(&mut self.order_ix) } else { order_indices(snapshot) };
        let order: Vec<&DeploymentView> = order_ix.iter().map(|&i| &snapshot.deployments[i]).collect();
        let same_frame = self.trace.is_some()
            && order.len() == n
            && (kept_order || order.iter().zip(&self.deployments).all(|(a, b)| same_key(a, b)))
            && snapshot.classes == self.classes;
        // Clusters may differ in their pools' free devices (capacity observed), nothing else.
        let capacity = if same_frame { free_changes(&snapshot.clusters, &self.clusters) } else { None };
        self.order_ix = order_ix;
        let (Some(fixed), Some(capacity)) = (self.fixed.take().filter(|_| same_frame), capacity) else {
            self.full(snapshot);
            return self.plan();
        };
        let changed: Vec<bool> = order.iter().zip(&self.deployments).map(|(a, b)| *a != b).collect();
        let prev = self.trace.take();
        // The walk starts from the last greedy pass's plans.
        for (i, p) in self.greedy_saved.drain(..) {
            self.plan.deployments[i] = p;
        }
        let changes = Changes { deployments: &changed, capacity: &capacity };
        let plans = &mut self.plan.deployments;
        let outcome = Walk::run(snapshot, &fixed, &order, &self.options, prev, changes, plans, self.limit);
        self.fixed = Some(fixed);
        match outcome {
            Outcome::Traced(t) => {
                let Traced { trace, stats, greedy_saved } = *t;
                self.greedy_saved = greedy_saved;
                for (ci, pi, _) in capacity {
                    self.clusters[ci].pools[pi]
                        .free_per_node
                        .clone_from(&snapshot.clusters[ci].pools[pi].free_per_node);
                }
                for (i, d) in order.iter().enumerate() {
                    if changed[i] {
                        self.deployments[i] = (*d).clone();
                    }
                }
                self.trace = Some(trace);
                self.stats = stats;
            }
            Outcome::Abort => self.full(snapshot),
        }
        self.plan()
    }

    /// Solves `snapshot` whole: traced when a later re-plan can start from it.
    fn full(&mut self, snapshot: &FleetSnapshot) {
        self.order_ix = order_indices(snapshot);
        let order: Vec<&DeploymentView> = self.order_ix.iter().map(|&i| &snapshot.deployments[i]).collect();
        self.unique = order.windows(2).all(|w| solve_cmp(w[0], w[1]) == std::cmp::Ordering::Less);
        self.clusters = snapshot.clusters.clone();
        self.classes = snapshot.classes.clone();
        self.deployments = order.iter().map(|d| (*d).clone()).collect();
        self.trace = None;
        self.greedy_saved = Vec::new();
        let fixed = Fixed::of(snapshot);
        let n = order.len();
        let mut plans = Vec::with_capacity(n);
        let outcome = if self.options.explain.is_none() && !self.untraceable {
            let changes = Changes { deployments: &vec![true; n], capacity: &[] };
            Walk::run(snapshot, &fixed, &order, &self.options, None, changes, &mut plans, self.limit)
        } else {
            Outcome::Abort
        };
        self.fixed = Some(fixed);
        self.stats = ReplanStats { full: true, ..ReplanStats::default() };
        match outcome {
            Outcome::Traced(t) => {
                let Traced { trace, stats, greedy_saved } = *t;
                self.plan = Plan { deployments: plans };
                self.greedy_saved = greedy_saved;
                self.trace = Some(trace);
                self.stats = ReplanStats { full: true, ..stats };
            }
            Outcome::Abort => {
                self.untraceable |= self.options.explain.is_none();
                self.plan = solve(snapshot, &self.options);
            }
        }
    }
}

/// The pools whose free devices per node differ between `new` and `old` (not their number of
/// nodes), as (cluster, pool, the old value); `None` when the clusters differ in anything else
/// (names, labels, readiness, taints, pools, caches...), which the static filters read.
fn free_changes(new: &[ClusterView], old: &[ClusterView]) -> Option<Vec<(usize, usize, Vec<u32>)>> {
    if new.len() != old.len() {
        return None;
    }
    let mut changes = Vec::new();
    for (ci, (a, b)) in new.iter().zip(old).enumerate() {
        // Every field named, so that a new one is not left out of the comparison.
        let ClusterView {
            name,
            labels,
            region,
            zones,
            jurisdiction,
            ready,
            not_ready_reason,
            cordoned,
            taints,
            pools,
            ready_caches,
        } = a;
        let same = *name == b.name
            && *labels == b.labels
            && *region == b.region
            && *zones == b.zones
            && *jurisdiction == b.jurisdiction
            && *ready == b.ready
            && *not_ready_reason == b.not_ready_reason
            && *cordoned == b.cordoned
            && *taints == b.taints
            && *ready_caches == b.ready_caches
            && pools.len() == b.pools.len();
        if !same {
            return None;
        }
        for (pi, (p, q)) in pools.iter().zip(&b.pools).enumerate() {
            let PoolView { name, class, capacity_type, free_per_node, reserved_for, refused_block } = p;
            let same = *name == q.name
                && *class == q.class
                && *capacity_type == q.capacity_type
                && *reserved_for == q.reserved_for
                && *refused_block == q.refused_block
                && free_per_node.len() == q.free_per_node.len();
            if !same {
                return None;
            }
            if *free_per_node != q.free_per_node {
                changes.push((ci, pi, q.free_per_node.clone()));
            }
        }
    }
    Some(changes)
}

/// What changed since the last solve: per deployment in solve order, and the pools whose free
/// devices the snapshot reports otherwise (`free_changes`).
struct Changes<'c> {
    deployments: &'c [bool],
    capacity: &'c [(usize, usize, Vec<u32>)],
}

/// A traced walk (its plans are written in place), and the greedy plans the improvement phase
/// changed when the greedy pass left it work.
struct Traced {
    trace: Trace,
    stats: ReplanStats,
    greedy_saved: Vec<(usize, DeploymentPlan)>,
}

/// How a walk ended.
enum Outcome {
    /// The greedy pass, traced.
    Traced(Box<Traced>),
    /// Nothing reusable: solve the fleet whole.
    Abort,
}

/// One walk over the greedy pass, against the last one (`prev`) when there is one.
struct Walk {
    /// The dirty pools: where the last solve's free devices, at the same point of the pass,
    /// differ from this walk's, with the last solve's. Every other pool is the same in both.
    old: HashMap<u32, Vec<u32>>,
    /// (position of the next step that reads the pool, pool), for dirty pools.
    next: BinaryHeap<Reverse<(u64, u32)>>,
    readers: Vec<Vec<u64>>,
    incremental: bool,
    /// Entries the trace holds so far (`entries`).
    entries: u64,
}

impl Walk {
    /// Walks the greedy pass; `plans` holds the last pass's plans (empty on a first solve) and
    /// is left with this pass's, then the improvement phase's.
    #[allow(clippy::too_many_arguments)]
    fn run(
        snapshot: &FleetSnapshot,
        fixed: &Fixed,
        order: &[&DeploymentView],
        options: &SolveOptions,
        prev: Option<Trace>,
        changes: Changes<'_>,
        plans: &mut Vec<DeploymentPlan>,
        max_entries: u64,
    ) -> Outcome {
        let Changes { deployments: changed, capacity } = changes;
        let n = order.len();
        let limit = options.max_evaluations / 2;
        if prev.as_ref().is_some_and(|t| t.evaluations > limit || t.fill.len() != n) {
            return Outcome::Abort;
        }
        let mut free = Free::new(initial_free(snapshot));
        let pools = free.len();
        free.record();
        let incremental = prev.is_some();
        let mut walk = Walk {
            old: HashMap::new(),
            next: BinaryHeap::new(),
            readers: Vec::new(),
            incremental,
            entries: prev.as_ref().map_or(0, |t| t.entries),
        };
        // A matcher that starts from the last one's, unless that holds more than this snapshot's
        // expressions could need (a bound on what changed specs leave behind).
        let mut prev = prev;
        let exprs: usize =
            snapshot.deployments.iter().flat_map(|d| &d.spec.devices.alternatives).map(|a| a.selectors.len()).sum();
        let classes = snapshot.classes.len();
        let bound = 2 * (exprs + classes) * (classes + 1) + 1024;
        let mut matcher = match prev.as_mut().and_then(|t| t.matcher.take()) {
            Some(m) if m.len() <= bound => DeviceMatcher::resume(&snapshot.classes, m),
            _ => DeviceMatcher::new(&snapshot.classes),
        };
        // The same for the static filters' verdicts: one row per policy.
        let mut statics = match prev.as_mut().map(|t| std::mem::take(&mut t.statics)) {
            Some(s) if s.len() <= 2 * snapshot.deployments.len() + 64 => s,
            _ => StaticMemo::default(),
        };
        let mut evaluations = 0u64;
        let mut spare = Vec::new();
        let mut ctx = fixed.ctx(snapshot, &mut free, &mut matcher, &mut statics, &mut evaluations, &mut spare);
        let cluster_ix: HashMap<&str, usize> =
            snapshot.clusters.iter().enumerate().map(|(i, c)| (c.name.as_str(), i)).collect();
        let (mut keep_out, mut fill_out, mut open_out, tier_start_old, mut held, mut phase) = match prev {
            Some(t) => {
                walk.readers = t.readers;
                (t.keep, t.fill, t.open, t.tier_start, t.held, t.phase)
            }
            None => {
                walk.readers = vec![Vec::new(); pools];
                let none = vec![None; n];
                (none, vec![Step::default(); n], HashMap::new(), Vec::new(), vec![Vec::new(); n], PhaseMemo::default())
            }
        };
        for i in (0..n).filter(|&i| changed[i]) {
            phase.forget(i);
            phase.dirty.dep(i);
        }
        // Pools whose free devices the snapshot reports otherwise than the last one: dirty from
        // the start, with the last solve's value.
        for (ci, pi, was) in capacity {
            // The phase re-packs pools from the snapshot's free devices.
            phase.dirty.pool((*ci, *pi));
            let p = ctx.free.flat(*ci, *pi);
            if ctx.free.get_flat(p) != was {
                walk.old.insert(p, was.clone());
                if let Some(&q) = walk.readers[p as usize].first() {
                    walk.next.push(Reverse((q, p)));
                }
            }
        }
        let mut tier_start = vec![0usize; n];
        let mut costs = vec![0u64; n];
        let mut stats = ReplanStats::default();
        let mut start = 0;
        while start < n {
            let tier = order[start].priority();
            let end = start + order[start..].iter().take_while(|d| d.priority() == tier).count();
            tier_start[start..end].iter_mut().for_each(|t| *t = start);
            if incremental && tier_start_old.get(start) != Some(&start) {
                return Outcome::Abort;
            }
            // The tier's `open` view, and the pools where it differs from the last solve's.
            let mut open_dirty = Vec::new();
            let open = TierOpen::of(
                snapshot,
                &cluster_ix,
                &order[start..end],
                &changed[start..end],
                ctx.free,
                walk.old.keys().copied(),
                if incremental { open_out.remove(&start) } else { None },
                &mut open_dirty,
            );
            let view = open.as_ref().map(|o| o.view.as_slice());
            // What each keep step left; `None`: reused, taken from its record if the fill runs.
            let mut pending: Vec<Option<Pending>> = Vec::with_capacity(end - start);
            let mut keep_ran = vec![false; end - start];
            for i in start..end {
                let d = order[i];
                let runs = d.current.iter().any(|p| p.desired > 0);
                let pos = position(start, false, i);
                let hit = walk.pop(pos);
                let old = keep_out[i].take();
                let open_hit = old
                    .as_ref()
                    .is_some_and(|k| k.step.io.open_reads.iter().any(|&p| open_dirty.get(p as usize) == Some(&true)));
                if !runs {
                    if old.is_some() || !hit.is_empty() {
                        walk.ran(ctx.free, pos, old.as_ref().map(|o| &o.step.io), &StepIo::default(), Vec::new(), &hit);
                    }
                    pending.push(Some(Pending::Fresh));
                    continue;
                }
                let reuse = incremental && !changed[i] && hit.is_empty() && !open_hit && old.is_some();
                if let Some(o) = old.as_ref().filter(|_| reuse) {
                    walk.reused(ctx.free, &o.step.io);
                    *ctx.evaluations += o.step.cost;
                    costs[i] += o.step.cost;
                    pending.push(None);
                    stats.steps_reused += 1;
                    keep_out[i] = old;
                } else {
                    ctx.free.begin();
                    let before = *ctx.evaluations;
                    let kept = ctx.with(d, &options.explain, view).keep(d);
                    let (io, changed_from) = ctx.free.end();
                    let cost = *ctx.evaluations - before;
                    costs[i] += cost;
                    walk.ran(ctx.free, pos, old.as_ref().map(|o| &o.step.io), &io, changed_from, &hit);
                    pending.push(Some(kept.clone().map_or(Pending::Fresh, Pending::Kept)));
                    keep_out[i] = Some(KeepStep { step: Step { io, cost }, kept });
                    keep_ran[i - start] = true;
                    stats.steps_run += 1;
                }
                if *ctx.evaluations > limit || walk.entries > max_entries {
                    return Outcome::Abort;
                }
            }
            if let Some(o) = open {
                open_out.insert(start, o);
            } else {
                open_out.remove(&start);
            }
            for (i, pending) in (start..end).zip(pending) {
                let d = order[i];
                let pos = position(start, true, i);
                let hit = walk.pop(pos);
                let reuse = incremental && !changed[i] && !keep_ran[i - start] && hit.is_empty();
                if reuse {
                    let o = &fill_out[i];
                    walk.reused(ctx.free, &o.io);
                    *ctx.evaluations += o.cost;
                    costs[i] += o.cost;
                    stats.steps_reused += 1;
                    continue;
                }
                let pending = pending.unwrap_or_else(|| {
                    keep_out[i].as_ref().and_then(|k| k.kept.clone()).map_or(Pending::Fresh, Pending::Kept)
                });
                let kept = match pending {
                    Pending::Kept(k) => Some(k),
                    Pending::Fresh => None,
                    Pending::Exhausted => return Outcome::Abort,
                };
                ctx.free.begin();
                let before = *ctx.evaluations;
                let (plan, h) = ctx.with(d, &options.explain, None).solve_one(d, kept);
                let (io, changed_from) = ctx.free.end();
                let cost = *ctx.evaluations - before;
                costs[i] += cost;
                let old = std::mem::take(&mut fill_out[i]);
                walk.ran(ctx.free, pos, incremental.then_some(&old.io), &io, changed_from, &hit);
                fill_out[i] = Step { io, cost };
                // What the improvement phase will see otherwise than in the last run: this
                // deployment, and the users of the pools it had or has replicas on.
                if incremental
                    && (held[i] != h
                        || plans.get(i).is_none_or(|o| {
                            (o.unplaced, o.desired, movable(o)) != (plan.unplaced, plan.desired, movable(&plan))
                        }))
                {
                    phase.dirty.dep(i);
                    held[i].iter().chain(&h).for_each(|x| phase.dirty.pool((x.cluster, x.pool)));
                }
                if i < plans.len() {
                    plans[i] = plan;
                } else {
                    // A first solve: every fill step runs, in solve order.
                    plans.push(plan);
                }
                held[i] = h;
                stats.steps_run += 1;
                if *ctx.evaluations > limit || walk.entries > max_entries {
                    return Outcome::Abort;
                }
            }
            start = end;
        }
        let evaluations = *ctx.evaluations;
        // Replicas left unplaced: the improvement phase, on this pass's result, as `solve` runs
        // it (the same plans, placements, costs and free devices; its attempts traced).
        let short = options.max_improvement > 0 && plans.iter().any(|p| p.unplaced > 0);
        let greedy_saved = if short {
            // Pools whose free devices differ from the last pass's at its end.
            for &p in walk.old.keys() {
                phase.dirty.pool(ctx.free.coords(p));
            }
            let solved = Solved { plans: Vec::new(), held: held.clone(), cost: costs };
            let saved = ctx.improve(order, plans, solved, options, Some(&mut phase));
            // The phase's trace within the same bound: beyond it, the next phase runs whole.
            if walk.entries + phase.trace_entries() > max_entries {
                phase.skipped();
            }
            saved
        } else {
            phase.skipped();
            Vec::new()
        };
        let trace = Trace {
            keep: keep_out,
            fill: fill_out,
            tier_start,
            open: open_out,
            readers: walk.readers,
            evaluations,
            entries: walk.entries,
            held,
            phase,
            matcher: Some(matcher.into_memo()),
            statics,
        };
        let stats = ReplanStats {
            trace_entries: trace.entries + trace.phase.trace_entries(),
            phase_run: trace.phase.units_run,
            phase_reused: trace.phase.units_reused,
            ..stats
        };
        Outcome::Traced(Box::new(Traced { trace, stats, greedy_saved }))
    }

    /// The dirty pools the step at `pos` reads (their next reader was this step).
    fn pop(&mut self, pos: u64) -> Vec<u32> {
        let mut hit = Vec::new();
        while let Some(&Reverse((p, pool))) = self.next.peek() {
            if p > pos {
                break;
            }
            self.next.pop();
            if p == pos && self.old.contains_key(&pool) && !hit.contains(&pool) {
                hit.push(pool);
            }
        }
        hit
    }

    /// A step reused: its writes, the same in both solves (a pool it writes is clean, or it
    /// would have run).
    fn reused(&mut self, free: &mut Free, io: &StepIo) {
        for (p, v) in &io.writes {
            free.set_flat(*p, v);
        }
    }

    /// A step that ran (`new`; it already changed `free`), in place of the last solve's
    /// (`old`): the last solve's state moves on by `old`'s writes; pools it or `old` wrote, or
    /// that brought it here (`hit`), are dirty when the two differ, and their next reader runs.
    /// `before`: the pools `new` changed, with their values before it.
    fn ran(
        &mut self,
        free: &Free,
        pos: u64,
        old: Option<&StepIo>,
        new: &StepIo,
        before: Vec<(u32, Vec<u32>)>,
        hit: &[u32],
    ) {
        self.entries = (self.entries + entries(new)).saturating_sub(old.map_or(0, entries));
        if !self.incremental {
            for &p in &new.reads {
                self.readers[p as usize].push(pos);
            }
            return;
        }
        // A clean pool this step changed had, in the last solve, the value it had before.
        for (p, v) in before {
            self.old.entry(p).or_insert(v);
        }
        if let Some(o) = old {
            for (p, v) in &o.writes {
                self.old.insert(*p, v.clone());
            }
            for &p in &o.reads {
                let r = &mut self.readers[p as usize];
                if let Ok(at) = r.binary_search(&pos) {
                    r.remove(at);
                }
            }
        }
        for &p in &new.reads {
            let r = &mut self.readers[p as usize];
            if let Err(at) = r.binary_search(&pos) {
                r.insert(at, pos);
            }
        }
        let touched = old.into_iter().flat_map(|o| o.writes.iter().map(|w| w.0)).chain(new.writes.iter().map(|w| w.0));
        let mut pools: Vec<u32> = touched.chain(hit.iter().copied()).collect();
        pools.sort_unstable();
        pools.dedup();
        for p in pools {
            if self.old.get(&p).is_some_and(|o| o == free.get_flat(p)) {
                self.old.remove(&p);
            }
            if self.old.contains_key(&p) {
                let r = &self.readers[p as usize];
                let at = r.partition_point(|&q| q <= pos);
                if let Some(&q) = r.get(at) {
                    self.next.push(Reverse((q, p)));
                }
            }
        }
    }
}

#[path = "tier_open.rs"]
mod tier_open;
