//! The improvement phase after the greedy pass. The greedy places deployments one at a time,
//! so an earlier one may take the only pool a later one could use while it had other options.
//! Here, for each deployment left with unplaced replicas (highest priority first), replicas of
//! equal- or lower-priority deployments are moved out of a pool it could use, each to another
//! pool its own rules allow (when those are full, to one that a further such victim leaves
//! for room of its own: a chain, [`CHAIN_DEPTH`] deep), until one more replica fits; the moves
//! are kept only if every rule still holds: capacity (pools re-packed as the greedy packed
//! them: tier by tier, kept replicas first, `held::repack`), `maxReplicas`, met
//! `minReplicas`, cost ceilings, and spread as each deployment saw it when it was solved (also
//! for deployments the moves did not touch but whose pools gained room).
//! A replica kept where it already runs is never moved; one of a higher-priority deployment
//! only when the lower-priority ones cannot make the room, and only to a pool it ranks as high
//! on every key but price (same device alternative and capacity type), never by a chain; no
//! deployment loses a replica to a move. When spread holds a deployment back,
//! earlier replicas of its tier may be moved into the domains that hold it back until they
//! can take no further replica of it (`close.rs`). When no move makes room, strictly
//! lower-priority replicas that do not run may be preempted and the lower tiers solved again
//! (`preempt.rs`). Deterministic (fixed orders, no clock) and bounded by a work budget. The
//! placements it works on are in `held.rs`.

use std::collections::BTreeMap;

use flotilla_apis::common::parse_price_micros;
use flotilla_apis::deployment::SpreadDomain;

use super::held::{
    Held, Plans, Tentative, add, cost, held_of, may_move, movable, moved_one, name, no_more_room, open, per_rank,
    record, repack, users_of, watched,
};
use super::{Candidate, Ctx, SolveOptions, Solved};
use crate::devices::ReplicaShape;
use crate::plan::{DeploymentPlan, Move};
use crate::snapshot::DeploymentView;
use phase_trace::{DepWrite, Dirty, PhaseTrace, PoolWrite, Unit, Writes};

#[path = "close.rs"]
mod close;
#[path = "phase_trace.rs"]
pub(super) mod phase_trace;
#[path = "polish.rs"]
mod polish;
#[path = "preempt.rs"]
mod preempt;

/// Candidates the phase's deployment data may hold between re-plans (`PhaseMemo`, about 56
/// bytes each): the 1,000 × 5,000 benchmark fleet's phase builds about 42,000.
const MAX_MEMO_CANDIDATES: usize = 1_000_000;

/// Victims moved for one more replica, at most (chains included).
const MAX_MOVES: usize = 8;

/// How many victims deep a move may reach: a victim whose other pools are full moves into
/// one of them once a second victim there moved on to room of its own (depth 1), and so on.
const CHAIN_DEPTH: u32 = 1;

/// Who a move makes room for, and how much deeper it may chain.
#[derive(Clone, Copy)]
struct Mover {
    /// The deployment that gains a replica (never a victim itself).
    di: usize,
    /// Its priority: a victim of a higher one moves only to a pool it ranks as high but for
    /// price, and never by a chain (`move_out`).
    prio: i32,
    /// Further victims a move may displace to find room.
    depth: u32,
    /// The only pool the moved replica may go to (closing a spread domain, `close.rs`).
    to: Option<(usize, usize)>,
}

/// What the phase knows of one deployment.
struct Dep {
    shape: ReplicaShape,
    /// Every candidate, in the greedy's ranking.
    cands: Vec<Candidate>,
    max_cost: Option<u64>,
    spread: Option<(SpreadDomain, u32)>,
}

/// Deployments' phase data (`Dep`, and the work building it charged), kept from one re-plan to
/// the next by solve-order index: a deployment that did not change has the same candidates as
/// the phase reads them (its spec, the clusters' static facts and the classes are the same; of
/// the free devices a candidate notes only `initial_slots`, which the phase never reads), and
/// building them again would charge the same work.
#[derive(Default)]
pub(super) struct PhaseMemo {
    deps: Vec<Option<(Dep, u64)>>,
    /// The last run's first loop (`phase_trace.rs`), when the phase ran on the last greedy pass.
    trace: Option<PhaseTrace>,
    /// What differs from that run when this one starts: set by the walk.
    pub(super) dirty: Dirty,
    /// Units of the first loop the last run ran, and reused.
    pub(super) units_run: usize,
    pub(super) units_reused: usize,
}

impl PhaseMemo {
    /// Entries the last run's trace holds.
    pub(super) fn trace_entries(&self) -> u64 {
        self.trace.as_ref().map_or(0, PhaseTrace::entries)
    }

    /// The phase did not run on this greedy pass: the next has no trace to start from.
    pub(super) fn skipped(&mut self) {
        self.trace = None;
        self.dirty = Dirty::default();
        (self.units_run, self.units_reused) = (0, 0);
    }

    /// Forgets deployment `i`'s data (its spec changed).
    pub(super) fn forget(&mut self, i: usize) {
        if let Some(d) = self.deps.get_mut(i) {
            *d = None;
        }
    }
}

/// The phase's state: lazily built deployment data, pool users, work spent.
struct Phase<'o, 's> {
    order: &'o [&'s DeploymentView],
    shapes: Vec<ReplicaShape>,
    /// Per deployment, its priority (tiers pack in turn, `repack`).
    prios: Vec<i32>,
    deps: Vec<Option<Dep>>,
    /// Per deployment: the work building its `Dep` charged.
    dep_work: Vec<u64>,
    /// Data kept from the last re-plan, taken as first used.
    memo: Vec<Option<(Dep, u64)>>,
    /// Per pool, the deployments (solve-order indexes, ascending) with replicas on it.
    users: BTreeMap<(usize, usize), Vec<usize>>,
    /// Per deployment: a valid spec that was solved (the phase may change its plan).
    movable: Vec<bool>,
    /// The namespaces' FleetQuotas as the phase's placements use them (`quota.rs`): a move
    /// set is kept only if every namespace it touches stays within its limits.
    quota: Option<super::quota::PhaseQuota>,
    /// Deployments whose spread or unplaced replicas make room a move frees matter.
    watched: Vec<usize>,
    work: u64,
    budget: u64,
    /// While a tier tries preemption: the lowest priority whose placements count. Lower tiers
    /// hold only what they run, and are re-solved afterwards (`preempt.rs`).
    floor: Option<i32>,
    /// Per deployment, the evaluations its last greedy solve cost (what re-solving it costs).
    cost: Vec<u64>,
    /// The deployment to explain, when a re-solve reaches it.
    explain: Option<(String, String)>,
    /// Whether a higher-priority replica may be moved for a lower one (`move_out`): not in the
    /// first loop, so that the budget goes to equal- and lower-priority moves first.
    upward: bool,
}

impl Ctx<'_, '_> {
    /// Runs the phase over the greedy's plans and placements (both in solve order). For a
    /// re-plan (`memo`), returns the greedy plan of every deployment whose plan it changed, and
    /// leaves in `memo` the deployment data it built or reused.
    pub(super) fn improve(
        &mut self,
        order: &[&DeploymentView],
        plans: &mut [DeploymentPlan],
        solved: Solved,
        options: &SolveOptions,
        mut memo: Option<&mut PhaseMemo>,
    ) -> Vec<(usize, DeploymentPlan)> {
        let Solved { mut held, cost, .. } = solved;
        phase_trace::reset();
        let mut phase_plans = Plans::new(plans, memo.is_some());
        let plans = &mut phase_plans;
        let mut ph = Phase {
            order,
            shapes: order.iter().map(|d| ReplicaShape::of(&d.spec.topology)).collect(),
            prios: order.iter().map(|d| d.priority()).collect(),
            deps: (0..order.len()).map(|_| None).collect(),
            dep_work: vec![0; order.len()],
            memo: match memo.as_deref_mut() {
                Some(m) => {
                    m.deps.resize_with(order.len(), || None);
                    std::mem::take(&mut m.deps)
                }
                None => Vec::new(),
            },
            users: users_of(&held),
            movable: plans.iter().map(movable).collect(),
            quota: super::quota::PhaseQuota::new(self.snapshot, order, &held),
            watched: watched(order, plans),
            work: 0,
            budget: options.max_improvement,
            floor: None,
            cost,
            explain: options.explain.clone(),
            upward: false,
        };
        let mut changed = vec![false; order.len()];
        // Moves first, for every deployment; preemption only with the budget they leave, so
        // attempts that gain nothing never cost a deployment a move.
        if let Some(m) = memo.as_deref_mut() {
            self.traced_moves(&mut ph, plans, &mut held, &mut changed, m);
        } else {
            for di in 0..order.len() {
                self.moves(&mut ph, plans, &mut held, &mut changed, di);
            }
        }
        self.free.stop();
        // With the budget the first loop leaves: higher-priority replicas may yield their
        // price (pools ranked as high but for price), then preemption.
        ph.upward = true;
        for di in 0..order.len() {
            if ph.work >= ph.budget {
                break;
            }
            self.moves(&mut ph, plans, &mut held, &mut changed, di);
        }
        for di in 0..order.len() {
            while ph.movable[di]
                && plans[di].unplaced > 0
                && ph.work < ph.budget
                && self.preempt(&mut ph, plans, &mut held, &mut changed, di)
            {
                // The lower tiers were solved again: their moves are looked for again too.
                let below = ph.prios.partition_point(|&p| p >= ph.prios[di]);
                for i in std::iter::once(di).chain(below..order.len()) {
                    self.moves(&mut ph, plans, &mut held, &mut changed, i);
                }
            }
        }
        // Last, with what is left of the budget: replicas the phase's changes left on a worse
        // pool than one with room now move there if it costs less (`polish.rs`).
        self.polish(&mut ph, plans, &mut held, &mut changed);
        for (i, d) in order.iter().enumerate() {
            if changed[i] {
                self.refresh(d, &mut plans[i], &held[i]);
            }
        }
        if let Some(m) = memo {
            m.deps = ph.memo;
            for (i, (d, w)) in ph.deps.into_iter().zip(ph.dep_work).enumerate() {
                if let Some(d) = d {
                    m.deps[i] = Some((d, w));
                }
            }
            // Held between re-plans only within a bound (the phase rebuilds what it lacks).
            let held: usize = m.deps.iter().flatten().map(|(d, _)| d.cands.len()).sum();
            if held > MAX_MEMO_CANDIDATES {
                m.deps.iter_mut().for_each(|d| *d = None);
            }
        }
        phase_plans.into_saved()
    }

    /// The first loop for a re-plan: each deployment's unit reused from the last run when it
    /// may stand (`Unit::reusable`), else run and noted; the trace left in `m` for the next.
    fn traced_moves(
        &mut self,
        ph: &mut Phase<'_, '_>,
        plans: &mut Plans<'_>,
        held: &mut [Vec<Held>],
        changed: &mut [bool],
        m: &mut PhaseMemo,
    ) {
        let n = ph.order.len();
        let mut last = m.trace.take().map(|t| t.units).unwrap_or_default();
        let mut dirty = std::mem::take(&mut m.dirty);
        let mut units: Vec<Option<Unit>> = Vec::with_capacity(n);
        (m.units_run, m.units_reused) = (0, 0);
        for di in 0..n {
            let old = last.get_mut(di).and_then(Option::take);
            if !(ph.movable[di] && plans[di].unplaced > 0 && ph.work < ph.budget) {
                if let Some(u) = &old {
                    dirty.wrote(Some(&u.writes), &Writes::default());
                }
                units.push(None);
                continue;
            }
            // With FleetQuotas an attempt also reads its namespaces' usage, which the trace
            // does not note: every attempt runs.
            let reuse = ph.quota.is_none()
                && old.as_ref().is_some_and(|u| {
                    let deps = &ph.deps;
                    u.reusable(di, &dirty, |i| deps[i].is_some(), ph.work, ph.budget)
                });
            match old {
                Some(u) if reuse => {
                    m.units_reused += 1;
                    units.push(Some(self.replay_unit(ph, plans, held, changed, u)));
                }
                other => {
                    m.units_run += 1;
                    units.push(Some(self.run_unit(ph, plans, held, changed, di, other.as_ref(), &mut dirty)));
                }
            }
        }
        m.trace = Some(PhaseTrace { units });
    }

    /// Applies what the last run's unit `u` wrote, and the work it spent: its deployment data
    /// built, placements, moves, unplaced replicas, pools' free devices and users. `u` as it
    /// stands now (its work from here).
    fn replay_unit(
        &mut self,
        ph: &mut Phase<'_, '_>,
        plans: &mut Plans<'_>,
        held: &mut [Vec<Held>],
        changed: &mut [bool],
        mut u: Unit,
    ) -> Unit {
        let start = ph.work;
        for i in u.built_here() {
            self.dep(ph, i);
        }
        for w in &u.writes.deps {
            held[w.i].clone_from(&w.held);
            changed[w.i] |= w.changed;
            plans[w.i].moves.clone_from(&w.moves);
            plans[w.i].unplaced = w.unplaced;
        }
        for w in &u.writes.pools {
            self.free.raw_mut()[w.q.0][w.q.1].clone_from(&w.free);
            match &w.users {
                Some(v) => ph.users.insert(w.q, v.clone()),
                None => ph.users.remove(&w.q),
            };
        }
        ph.work = start + (u.end - u.start);
        (u.start, u.end) = (start, ph.work);
        u
    }

    /// Runs deployment `di`'s unit, noting what it reads and writes; when it wrote otherwise
    /// than the last run's unit (`old`), nothing later is reused (`Dirty::wrote`).
    #[allow(clippy::too_many_arguments)]
    fn run_unit(
        &mut self,
        ph: &mut Phase<'_, '_>,
        plans: &mut Plans<'_>,
        held: &mut [Vec<Held>],
        changed: &mut [bool],
        di: usize,
        old: Option<&Unit>,
        dirty: &mut Dirty,
    ) -> Unit {
        phase_trace::begin();
        self.free.begin();
        let start = ph.work;
        self.moves(ph, plans, held, changed, di);
        let (io, _) = self.free.end();
        let reads = phase_trace::end();
        let writes = Writes {
            deps: reads
                .wrote_deps()
                .iter()
                .map(|&i| DepWrite {
                    i,
                    held: held[i].clone(),
                    moves: plans[i].moves.clone(),
                    unplaced: plans[i].unplaced,
                    changed: changed[i],
                })
                .collect(),
            pools: reads
                .wrote_pools()
                .iter()
                .map(|&q| PoolWrite { q, free: self.free.raw()[q.0][q.1].clone(), users: ph.users.get(&q).cloned() })
                .collect(),
        };
        dirty.wrote(old.map(|u| &u.writes), &writes);
        let free_reads = io.reads.iter().map(|&f| self.free.coords(f)).collect();
        Unit { reads, free_reads, writes, start, end: ph.work }
    }

    /// Places what moves can of deployment `di`'s missing replicas, within the budget.
    fn moves(
        &mut self,
        ph: &mut Phase<'_, '_>,
        plans: &mut Plans<'_>,
        held: &mut [Vec<Held>],
        changed: &mut [bool],
        di: usize,
    ) {
        while ph.movable[di] && plans[di].unplaced > 0 && ph.work < ph.budget {
            // When no move makes room, a domain that holds the deployment's spread back may be
            // closed (`close.rs`).
            let Some(t) =
                self.one_more(ph, plans, held, di, &Tentative::default()).or_else(|| self.close(ph, plans, held, di))
            else {
                break;
            };
            self.apply(ph, plans, held, changed, t, di);
        }
    }

    /// Takes the moves `t` found for deployment `di`: placements, pools, their users, and the
    /// moves recorded in both plans.
    fn apply(
        &mut self,
        ph: &mut Phase<'_, '_>,
        plans: &mut Plans<'_>,
        held: &mut [Vec<Held>],
        changed: &mut [bool],
        t: Tentative,
        di: usize,
    ) {
        let order = ph.order;
        if let Some(q) = ph.quota.as_mut() {
            q.take(self.snapshot, held, &t);
        }
        for (&i, h) in &t.held {
            phase_trace::note_wrote_dep(i);
            held[i] = h.clone();
            changed[i] = true;
        }
        phase_trace::note_wrote_dep(di);
        for (&(ci, pi), f) in &t.free {
            phase_trace::note_wrote_pool((ci, pi));
            self.free[(ci, pi)] = f.clone();
            let mut u: Vec<usize> = ph.users.remove(&(ci, pi)).unwrap_or_default();
            u.extend(t.held.keys().copied());
            u.sort_unstable();
            u.dedup();
            u.retain(|&i| held[i].iter().any(|h| (h.cluster, h.pool) == (ci, pi)));
            ph.users.insert((ci, pi), u);
        }
        for (n, &(ei, from, to)) in t.moves.iter().enumerate() {
            let m = Move {
                moved: name(order[ei]),
                from: self.pool_name(from),
                to: self.pool_name(to),
                made_room_for: name(order[di]),
                replicas: 1,
                closes_spread_domain: n < t.closing,
                higher_priority: ph.prios[ei] > ph.prios[di],
                lowers_cost: ei == di,
            };
            for i in [ei, di] {
                phase_trace::note_wrote_dep(i);
                record(&mut plans[i].moves, m.clone());
            }
        }
        let placed: u32 = held[di].iter().map(|h| h.count).sum();
        plans[di].unplaced = plans[di].desired.saturating_sub(placed);
    }

    /// A pool as the plan names it: `cluster/pool`.
    fn pool_name(&self, (ci, pi): (usize, usize)) -> String {
        let c = &self.snapshot.clusters[ci];
        format!("{}/{}", c.name, c.pools[pi].name)
    }

    /// Builds the deployment's phase data on first use.
    fn dep(&mut self, ph: &mut Phase<'_, '_>, i: usize) {
        phase_trace::note_built(i, ph.deps[i].is_none());
        if ph.deps[i].is_none() {
            if let Some((dep, work)) = ph.memo.get_mut(i).and_then(Option::take) {
                ph.work += work;
                ph.dep_work[i] = work;
                ph.deps[i] = Some(dep);
                return;
            }
            let d = ph.order[i];
            self.cache = d.spec.model.cache_ref.as_deref().map(|c| crate::snapshot::cache_key(&d.namespace, c));
            let before = ph.work;
            let cands = self.candidates_of(d, &ph.shapes[i], &mut ph.work);
            ph.dep_work[i] = ph.work - before;
            let policy = &d.spec.placement;
            ph.deps[i] = Some(Dep {
                shape: ph.shapes[i].clone(),
                cands,
                max_cost: policy.max_cost_per_hour.as_deref().and_then(parse_price_micros),
                spread: policy.spread.as_ref().map(|s| (s.by, s.max_skew.max(1) as u32)),
            });
        }
    }

    /// Moves (at most [`MAX_MOVES`], with those already in `base`) that let deployment `di`
    /// take one more replica, on top of `base`, or `None`.
    fn one_more(
        &mut self,
        ph: &mut Phase<'_, '_>,
        plans: &[DeploymentPlan],
        held: &[Vec<Held>],
        di: usize,
        base: &Tentative,
    ) -> Option<Tentative> {
        let d = ph.order[di];
        let prio = d.priority();
        self.dep(ph, di);
        if let (Some(q), Some(dep)) = (&ph.quota, ph.deps[di].as_ref())
            && !q.room_for_one(self.snapshot, di, &dep.cands)
        {
            return None;
        }
        let n = ph.deps[di].as_ref()?.cands.len();
        for k in 0..n {
            if ph.work >= ph.budget {
                return None;
            }
            let dep = ph.deps[di].as_ref()?;
            let c = &dep.cands[k];
            if c.sticky_only {
                continue;
            }
            let alt = &d.spec.devices.alternatives[(c.rank - 1) as usize];
            let before = held_of(base, held, di);
            if alt.max_replicas.is_some_and(|m| per_rank(before, c.rank) >= m.max(0) as u32)
                || dep.max_cost.is_some_and(|m| cost(before) + c.replica_price > m)
            {
                continue;
            }
            let p = (c.cluster, c.pool);
            let mut t = base.clone();
            let mut mine = before.to_vec();
            add(&mut mine, c);
            t.held.insert(di, mine);
            if dep.shape.fits(base.free.get(&p).unwrap_or(&self.free[(p.0, p.1)]))
                && let Some(done) = self.settle(ph, plans, held, t.clone(), (di, k))
            {
                return Some(done);
            }
            // Victims: replicas on the pool not kept where they ran, lowest priority first, then
            // the last solved first. A higher-priority one only once the first loop is done
            // (`Phase::upward`), last, and only to a pool it ranks as high but for price
            // (`move_out`).
            let mut victims: Vec<(usize, u32)> = Vec::new();
            phase_trace::note_pool(p);
            let mut ids: Vec<usize> = ph.users.get(&p).cloned().unwrap_or_default();
            ids.extend(base.held.keys().copied());
            ids.sort_unstable();
            ids.dedup();
            for i in ids {
                phase_trace::note_dep(i);
                if i == di || !ph.movable[i] || (!ph.upward && ph.prios[i] > prio) {
                    continue;
                }
                for h in held_of(base, held, i).iter().filter(|h| (h.cluster, h.pool) == p && h.count > h.kept) {
                    victims.push((i, h.rank));
                }
            }
            victims.sort_by_key(|&(i, rank)| (ph.order[i].priority(), std::cmp::Reverse(i), rank));
            for (ei, rank) in victims {
                loop {
                    if t.moves.len() >= MAX_MOVES || ph.work >= ph.budget {
                        break;
                    }
                    let Some(next) =
                        self.move_out(ph, held, &t, Mover { di, prio, depth: CHAIN_DEPTH, to: None }, ei, rank, p)
                    else {
                        break;
                    };
                    t = next;
                    if let Some(done) = self.settle(ph, plans, held, t.clone(), (di, k)) {
                        return Some(done);
                    }
                }
            }
        }
        None
    }

    /// One replica of `ei` on (`p`, `rank`) moved to the first other candidate of its own
    /// that takes it within its limits, or `None`. A candidate without room is made room on
    /// by moving on, with `mover.depth` left, replicas of other deployments there that the
    /// gaining deployment may displace (a chain), within [`MAX_MOVES`]. A replica of a higher
    /// priority than the gaining deployment's moves only to a candidate ranked as high as the
    /// one it leaves on everything but price ([`as_high_but_price`]), and never by a chain.
    #[allow(clippy::too_many_arguments)]
    fn move_out(
        &mut self,
        ph: &mut Phase<'_, '_>,
        held: &[Vec<Held>],
        t: &Tentative,
        mover: Mover,
        ei: usize,
        rank: u32,
        p: (usize, usize),
    ) -> Option<Tentative> {
        self.dep(ph, ei);
        let up = ph.prios[ei] > mover.prio;
        let dests: Vec<Candidate> = {
            let dep = ph.deps[ei].as_ref()?;
            let alts = &ph.order[ei].spec.devices.alternatives;
            let cur = held_of(t, held, ei);
            let from = cur.iter().find(|h| (h.cluster, h.pool, h.rank) == (p.0, p.1, rank) && h.count > h.kept)?;
            // What a higher-priority replica leaves, to rank its destinations against.
            let left = if up {
                Some(*dep.cands.iter().find(|c| (c.cluster, c.pool, c.rank) == (p.0, p.1, rank))?)
            } else {
                None
            };
            dep.cands
                .iter()
                .filter(|dest| {
                    let q = (dest.cluster, dest.pool);
                    if dest.sticky_only || q == p || mover.to.is_some_and(|to| to != q) {
                        return false;
                    }
                    if left.is_some_and(|l| !as_high_but_price(dest, &l)) {
                        return false;
                    }
                    may_move(alts, dep.max_cost, cur, from, dest)
                })
                .cloned()
                .collect()
        };
        // Direct room first (the destination's order within each pass), then chains.
        for chain in [false, true] {
            if chain && (mover.depth == 0 || up) {
                break;
            }
            for dest in &dests {
                if ph.work >= ph.budget {
                    return None;
                }
                let q = (dest.cluster, dest.pool);
                ph.work += 1;
                let mut base = t.clone();
                if chain {
                    match self.room_on(ph, held, base, mover, ei, q) {
                        Some(b) => base = b,
                        None => continue,
                    }
                } else if !ph.shapes[ei].fits(t.free.get(&q).unwrap_or(&self.free[(q.0, q.1)])) {
                    continue;
                }
                let Some(next) = moved_one(held_of(&base, held, ei), p, rank, dest) else { continue };
                let mut t2 = base;
                t2.held.insert(ei, next);
                let Some(packed) =
                    repack(self.snapshot, &ph.users, &ph.shapes, &ph.prios, held, &t2, q, usize::MAX, &mut ph.work)
                else {
                    continue;
                };
                t2.free.insert(q, packed);
                t2.moves.push((ei, p, q));
                return Some(t2);
            }
        }
        None
    }

    /// `t` with replicas on pool `q` moved on (one chain level down) until a replica of `ei`
    /// fits there, or `None`. Victims as in `one_more`: not the gaining deployment, not `ei`,
    /// no higher priority than the gaining one, not kept where they run.
    fn room_on(
        &mut self,
        ph: &mut Phase<'_, '_>,
        held: &[Vec<Held>],
        mut t: Tentative,
        mover: Mover,
        ei: usize,
        q: (usize, usize),
    ) -> Option<Tentative> {
        let mut victims: Vec<(usize, u32)> = Vec::new();
        phase_trace::note_pool(q);
        let mut ids: Vec<usize> = ph.users.get(&q).cloned().unwrap_or_default();
        ids.extend(t.held.keys().copied());
        ids.sort_unstable();
        ids.dedup();
        for i in ids {
            phase_trace::note_dep(i);
            if i == mover.di || i == ei || !ph.movable[i] || ph.order[i].priority() > mover.prio {
                continue;
            }
            for h in held_of(&t, held, i).iter().filter(|h| (h.cluster, h.pool) == q && h.count > h.kept) {
                victims.push((i, h.rank));
            }
        }
        victims.sort_by_key(|&(i, rank)| (ph.order[i].priority(), std::cmp::Reverse(i), rank));
        let deeper = Mover { depth: mover.depth - 1, to: None, ..mover };
        for (vi, rank) in victims {
            loop {
                // Leave room in the move count for `ei`'s own move and the gaining one's.
                if t.moves.len() + 1 >= MAX_MOVES || ph.work >= ph.budget {
                    return None;
                }
                let Some(next) = self.move_out(ph, held, &t, deeper, vi, rank, q) else { break };
                t = next;
                let free =
                    repack(self.snapshot, &ph.users, &ph.shapes, &ph.prios, held, &t, q, usize::MAX, &mut ph.work)?;
                if ph.shapes[ei].fits(&free) {
                    t.free.insert(q, free);
                    return Some(t);
                }
                t.free.insert(q, free);
            }
        }
        None
    }

    /// `t` completed with the gaining deployment's candidate pool re-packed, if every replica
    /// fits and every rule holds. Room the moves freed beyond one replica is taken by more
    /// replicas of the gaining deployment, within its limits.
    fn settle(
        &mut self,
        ph: &mut Phase<'_, '_>,
        plans: &[DeploymentPlan],
        held: &[Vec<Held>],
        mut t: Tentative,
        (di, k): (usize, usize),
    ) -> Option<Tentative> {
        let dep = ph.deps[di].as_ref()?;
        let c = dep.cands[k];
        let p = (c.cluster, c.pool);
        if ph.quota.as_ref().is_some_and(|q| !q.holds(self.snapshot, held, &t)) {
            return None;
        }
        let packed = repack(self.snapshot, &ph.users, &ph.shapes, &ph.prios, held, &t, p, usize::MAX, &mut ph.work)?;
        t.free.insert(p, packed);
        let alt = &ph.order[di].spec.devices.alternatives[(c.rank - 1) as usize];
        loop {
            let mine = held_of(&t, held, di);
            let placed: u32 = mine.iter().map(|h| h.count).sum();
            let dep = ph.deps[di].as_ref()?;
            if placed >= plans[di].desired
                || alt.max_replicas.is_some_and(|m| per_rank(mine, c.rank) >= m.max(0) as u32)
                || dep.max_cost.is_some_and(|m| cost(mine) + c.replica_price > m)
                || !dep.shape.fits(t.free.get(&p)?)
            {
                break;
            }
            let mut more = t.clone();
            let mut mine = mine.to_vec();
            add(&mut mine, &c);
            more.held.insert(di, mine);
            if ph.quota.as_ref().is_some_and(|q| !q.holds(self.snapshot, held, &more)) {
                break;
            }
            let Some(packed) =
                repack(self.snapshot, &ph.users, &ph.shapes, &ph.prios, held, &more, p, usize::MAX, &mut ph.work)
            else {
                break;
            };
            more.free.insert(p, packed);
            t = more;
        }
        // Room a move leaves where a deployment solved after the first one changed would have
        // seen it (a victim solved before the one that gains, or a victim's replica larger than
        // what took its place): one with spread must still hold its skew against it, and one
        // still missing replicas must not be able to use it (it would have had first pick).
        let roomier: Vec<(usize, usize)> =
            t.free.iter().filter(|&(&(ci, pi), f)| !no_more_room(&self.free[(ci, pi)], f)).map(|(&q, _)| q).collect();
        let victim_first = t.moves.iter().any(|m| t.held.keys().any(|&i| i > m.0));
        // A replica added where its deployment runs more than it kept counts as kept (`add`),
        // and a tier packs its kept replicas before any of it places more: every deployment
        // of that tier saw the pool change.
        let kept = |hs: &[Held]| hs.iter().map(|h| h.kept).sum::<u32>();
        t.held.keys().for_each(|&i| phase_trace::note_dep(i));
        let kept_grew = t.held.iter().filter(|&(&i, h)| kept(h) > kept(&held[i])).map(|(&i, _)| i).min();
        if !roomier.is_empty() || victim_first || kept_grew.is_some() {
            let changed_first = t.held.keys().copied().min().unwrap_or(0);
            let first =
                kept_grew.map_or(changed_first, |i| changed_first.min(ph.prios.partition_point(|&p| p > ph.prios[i])));
            let last = t.held.keys().copied().max().unwrap_or(0);
            // Every later deployment may be looked at (the watched ones, as the last run saw them).
            phase_trace::note_range(first, ph.order.len());
            let from = ph.watched.partition_point(|&x| x < first);
            for w in from..ph.watched.len() {
                let x = ph.watched[w];
                ph.work += 1;
                // Below a tier trying preemption, everything is re-solved afterwards.
                if !ph.movable[x] || ph.floor.is_some_and(|f| ph.prios[x] < f) {
                    continue;
                }
                // A deployment the moves changed has its spread checked below; one still
                // short (a victim, or the one that gains) must not be able to use the room
                // either.
                let mine = held_of(&t, held, x);
                let spread = !t.held.contains_key(&x) && ph.order[x].spec.placement.spread.is_some();
                let short = mine.iter().map(|h| h.count).sum::<u32>() < plans[x].desired;
                if !spread && !short {
                    continue;
                }
                // Between the first and the last deployment changed (and in a tier whose kept
                // replicas changed), every pool touched may show more room than before; after
                // the last, only the roomier ones.
                let all = x < last || kept_grew.is_some_and(|i| ph.prios[i] == ph.prios[x]);
                let pools: Vec<(usize, usize)> = if all { t.free.keys().copied().collect() } else { roomier.clone() };
                for &q in &pools {
                    ph.work += 1;
                    if ph.work >= ph.budget || !self.can_use(ph.order[x], &ph.shapes[x], q) {
                        continue;
                    }
                    self.dep(ph, x);
                    if spread && !self.spread_ok(ph, held, x, &t) {
                        return None;
                    }
                    let dep = ph.deps[x].as_ref()?;
                    let alts = &ph.order[x].spec.devices.alternatives;
                    let usable = short
                        && dep
                            .cands
                            .iter()
                            .any(|c| (c.cluster, c.pool) == q && !c.sticky_only && open(alts, dep.max_cost, mine, c));
                    if usable {
                        let at = repack(self.snapshot, &ph.users, &ph.shapes, &ph.prios, held, &t, q, x, &mut ph.work)?;
                        if ph.shapes[x].fits(&at) {
                            return None;
                        }
                    }
                }
            }
            if ph.work >= ph.budget {
                return None;
            }
        }
        let ids: Vec<usize> = t.held.keys().copied().collect();
        for i in ids {
            self.dep(ph, i);
            if !self.spread_ok(ph, held, i, &t) {
                return None;
            }
        }
        Some(t)
    }

    /// Spread as the greedy keeps it when it solves deployment `x`: no domain more than
    /// `maxSkew` above the emptiest domain that could still take a replica of `x` then
    /// (capacity counted after the deployments solved before `x`, and `x` itself; an
    /// alternative at its `maxReplicas`, or a replica over the cost ceiling, takes none).
    fn spread_ok(&self, ph: &mut Phase<'_, '_>, held_all: &[Vec<Held>], x: usize, t: &Tentative) -> bool {
        let Some(dep) = ph.deps[x].as_ref() else { return false };
        let Some((by, skew)) = dep.spread else { return true };
        let ix = &self.domains.of(by).0;
        let mine = held_of(t, held_all, x);
        let mut counts: BTreeMap<usize, u32> = BTreeMap::new();
        for h in mine {
            *counts.entry(ix[h.cluster]).or_default() += h.count;
        }
        let alts = &ph.order[x].spec.devices.alternatives;
        let mut least: Option<u32> = None;
        for c in &dep.cands {
            let q = (c.cluster, c.pool);
            if !open(alts, dep.max_cost, mine, c) {
                continue;
            }
            // Deployments solved after `x` on this pool do not count.
            phase_trace::note_pool(q);
            let later = ph.users.get(&q).is_some_and(|u| u.last().is_some_and(|&i| i > x))
                || t.held.keys().any(|&i| i > x && held_of(t, held_all, i).iter().any(|h| (h.cluster, h.pool) == q));
            let at_x;
            let free = if later {
                let Some(f) = repack(self.snapshot, &ph.users, &ph.shapes, &ph.prios, held_all, t, q, x, &mut ph.work)
                else {
                    return false;
                };
                at_x = f;
                &at_x
            } else {
                t.free.get(&q).unwrap_or(&self.free[(q.0, q.1)])
            };
            if dep.shape.fits(free) {
                let n = counts.get(&ix[c.cluster]).copied().unwrap_or(0);
                least = Some(least.map_or(n, |m| m.min(n)));
            }
        }
        least.is_none_or(|m| counts.values().all(|&n| n <= m + skew))
    }
}

/// Whether `dest` ranks as high as `left` for its deployment on every key the greedy ranks by
/// but price: the same device alternative and capacity type, no untolerated
/// `PreferNoSchedule` taint unless `left` had one, the ModelCache Ready and a CapacityClaim's
/// nodes wherever `left` had them. Where a higher-priority replica may go to make room for a
/// lower one: it keeps its count, its rules and every preference but the price.
fn as_high_but_price(dest: &Candidate, left: &Candidate) -> bool {
    dest.rank == left.rank
        && dest.capacity_type_rank == left.capacity_type_rank
        && (!dest.prefer_not || left.prefer_not)
        && (dest.cache_ready || !left.cache_ready)
        && (dest.reserved || !left.reserved)
}
