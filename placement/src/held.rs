//! Where each deployment's replicas are during the improvement phase (per cluster, pool and
//! alternative, with those kept where they already ran), how a pool re-packs them in the
//! greedy's order (per priority tier, kept replicas first), which pools a deployment may use,
//! and the plan rebuilt from them afterwards.

use std::collections::BTreeMap;

use flotilla_apis::common::parse_price_micros;
use flotilla_apis::deployment::DeviceAlternative;

use super::place::unmet_minimums;
use super::{Candidate, Ctx};
use crate::devices::ReplicaShape;
use crate::filters::first_refusal;
use crate::plan::{DeploymentPlan, Move};
use crate::snapshot::DeploymentView;

/// Replicas of one deployment on one (cluster, pool, alternative).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) struct Held {
    pub cluster: usize,
    pub pool: usize,
    pub rank: u32,
    pub count: u32,
    /// Of `count`, kept where they already ran: never moved.
    pub kept: u32,
    pub price: u64,
}

impl Held {
    /// Where a deployment's replicas went, from its final candidates.
    pub(super) fn of(candidates: &[Candidate]) -> Vec<Held> {
        candidates
            .iter()
            .filter(|c| c.placed > 0)
            .map(|c| Held {
                cluster: c.cluster,
                pool: c.pool,
                rank: c.rank,
                count: c.placed,
                kept: c.kept,
                price: c.replica_price,
            })
            .collect()
    }
}

/// One replica moved: (deployment, from (cluster, pool), to (cluster, pool)).
pub(super) type MoveStep = (usize, (usize, usize), (usize, usize));

/// Moves under consideration: replaced placements and re-packed pools.
#[derive(Clone, Default)]
pub(super) struct Tentative {
    pub held: BTreeMap<usize, Vec<Held>>,
    pub free: BTreeMap<(usize, usize), Vec<u32>>,
    /// (moved deployment, from pool, to pool), pools as (cluster, pool) indexes.
    pub moves: Vec<MoveStep>,
    /// How many of the first `moves` close a spread domain (`close.rs`).
    pub closing: usize,
}

pub(super) fn held_of<'a>(t: &'a Tentative, held: &'a [Vec<Held>], i: usize) -> &'a [Held] {
    super::improve::phase_trace::note_dep(i);
    t.held.get(&i).map_or(held[i].as_slice(), Vec::as_slice)
}

/// One more replica on `c`. Where the deployment runs more replicas than it kept there (the
/// greedy could not keep them for capacity), the replica counts as kept: it runs there, and
/// the pool packs it with the kept ones, as a re-plan (and the property checker) would.
pub(super) fn add(held: &mut Vec<Held>, c: &Candidate) {
    match held.iter_mut().find(|h| (h.cluster, h.pool, h.rank) == (c.cluster, c.pool, c.rank)) {
        Some(h) => {
            if h.kept == h.count && h.kept < c.sticky_quota {
                h.kept += 1;
            }
            h.count += 1;
        }
        None => held.push(Held {
            cluster: c.cluster,
            pool: c.pool,
            rank: c.rank,
            count: 1,
            kept: u32::from(c.sticky_quota > 0),
            price: c.replica_price,
        }),
    }
}

/// Whether candidate `c` counts for the spread of a deployment that holds `held`, capacity
/// aside: the greedy's rule, `place::open`.
pub(super) fn open(alts: &[DeviceAlternative], max_cost: Option<u64>, held: &[Held], c: &Candidate) -> bool {
    super::place::open(alts, per_rank(held, c.rank), cost(held), max_cost, c)
}

/// Whether a deployment holding `cur` may move one replica from `from` to `dest` within its
/// own limits: `dest`'s alternative under its `maxReplicas` and `from`'s above a met
/// `minReplicas` (when they differ), and the cost within `max_cost`.
pub(super) fn may_move(
    alts: &[DeviceAlternative],
    max_cost: Option<u64>,
    cur: &[Held],
    from: &Held,
    dest: &Candidate,
) -> bool {
    if dest.rank != from.rank {
        let most = alts[(dest.rank - 1) as usize].max_replicas;
        let least = alts[(from.rank - 1) as usize].min_replicas.unwrap_or(0).max(0) as u32;
        if most.is_some_and(|m| per_rank(cur, dest.rank) >= m.max(0) as u32) || per_rank(cur, from.rank) <= least {
            return false;
        }
    }
    max_cost.is_none_or(|m| cost(cur) - from.price + dest.replica_price <= m)
}

/// `cur` with one replica that does not run yet moved from (`p`, `rank`) to `dest`, or `None`
/// when no such replica is there.
pub(super) fn moved_one(cur: &[Held], p: (usize, usize), rank: u32, dest: &Candidate) -> Option<Vec<Held>> {
    let at = cur.iter().position(|h| (h.cluster, h.pool, h.rank) == (p.0, p.1, rank) && h.count > h.kept)?;
    let mut next = cur.to_vec();
    next[at].count -= 1;
    if next[at].count == 0 {
        next.remove(at);
    }
    add(&mut next, dest);
    Some(next)
}

pub(super) fn per_rank(held: &[Held], rank: u32) -> u32 {
    held.iter().filter(|h| h.rank == rank).map(|h| h.count).sum()
}

pub(super) fn cost(held: &[Held]) -> u64 {
    held.iter().map(|h| h.price * u64::from(h.count)).sum()
}

/// Whether `after` offers no room `before` did not: sorted largest first, no node has more.
pub(super) fn no_more_room(before: &[u32], after: &[u32]) -> bool {
    let (mut b, mut a) = (before.to_vec(), after.to_vec());
    b.sort_unstable_by(|x, y| y.cmp(x));
    a.sort_unstable_by(|x, y| y.cmp(x));
    a.len() == b.len() && a.iter().zip(&b).all(|(x, y)| x <= y)
}

impl Ctx<'_, '_> {
    /// Whether `d` may take a replica on pool `q` at all (its cluster's rules and some
    /// alternative's device and capacity rules), capacity aside.
    pub(super) fn can_use(&mut self, d: &DeploymentView, shape: &ReplicaShape, (ci, pi): (usize, usize)) -> bool {
        let policy = &d.spec.placement;
        let cluster = &self.snapshot.clusters[ci];
        let sticky = d.current.iter().any(|p| p.cluster == cluster.name && p.desired > 0);
        let own_claim = flotilla_apis::names::owner_key(&d.namespace, &d.name);
        if first_refusal(policy, cluster, sticky).is_some() || cluster.pools[pi].reserved_for_another(&own_claim) {
            return false;
        }
        let cap_types = policy.capacity_types_or_default();
        let max_cost = policy.max_cost_per_hour.as_deref().and_then(parse_price_micros);
        let snapshot = self.snapshot;
        let accepts: Vec<Vec<_>> = d
            .spec
            .devices
            .alternatives
            .iter()
            .map(|alt| snapshot.classes.keys().map(|c| self.matcher.matches(alt, c)).collect())
            .collect();
        accepts
            .iter()
            .enumerate()
            .any(|(ai, a)| self.evaluate(d, ci, pi, ai, a, shape, &cap_types, max_cost, false).is_ok())
    }

    /// Every candidate of `d`, ranked as the greedy ranks them.
    pub(super) fn candidates_of(&mut self, d: &DeploymentView, shape: &ReplicaShape, work: &mut u64) -> Vec<Candidate> {
        let policy = &d.spec.placement;
        let cap_types = policy.capacity_types_or_default();
        let max_cost = policy.max_cost_per_hour.as_deref().and_then(parse_price_micros);
        let class_matches = self.class_matches(d);
        let own_claim = flotilla_apis::names::owner_key(&d.namespace, &d.name);
        let mut out = Vec::new();
        let row = self.statics.row(policy, &self.snapshot.clusters);
        for (ci, cluster) in self.snapshot.clusters.iter().enumerate() {
            let sticky = d.current.iter().any(|p| p.cluster == cluster.name && p.desired > 0);
            *work += 1;
            let refusal = if sticky { first_refusal(policy, cluster, true) } else { row.refusal(ci) };
            if refusal.is_some() {
                continue;
            }
            for (pi, pool) in cluster.pools.iter().enumerate() {
                if pool.reserved_for_another(&own_claim) {
                    continue;
                }
                for (ai, accepts) in class_matches.iter().enumerate() {
                    *work += 1;
                    if let Ok(c) = self.evaluate(d, ci, pi, ai, accepts, shape, &cap_types, max_cost, false) {
                        out.push(c);
                    }
                }
            }
        }
        self.rank_candidates(&mut out);
        out
    }

    /// The plan of a deployment whose placements the phase changed.
    pub(super) fn refresh(&self, d: &DeploymentView, plan: &mut DeploymentPlan, held: &[Held]) {
        let assignments = self.assignments(held.iter().map(|h| (h.cluster, h.pool, h.rank, h.count, h.price)));
        let placed: u32 = held.iter().map(|h| h.count).sum();
        plan.assignments = assignments;
        plan.cost_micros_per_hour = cost(held);
        plan.unplaced = plan.desired.saturating_sub(placed);
        plan.unmet_minimums = unmet_minimums(d, |rank| per_rank(held, rank));
        let assignments = &plan.assignments;
        if let Some(explanation) = &mut plan.explanation {
            for e in explanation.iter_mut() {
                e.placed = assignments.iter().filter(|a| a.cluster == e.cluster).map(|a| a.replicas).sum();
            }
            plan.rejections.retain(|r| !assignments.iter().any(|a| a.cluster == r.cluster));
        } else if plan.unplaced == 0 {
            plan.rejections.clear();
        }
    }
}

/// Whether the phase may change a deployment's plan: a valid spec that was solved.
pub(super) fn movable(plan: &DeploymentPlan) -> bool {
    // A rejection for every cluster (`*`) is a plan's only one when made, so it stays first.
    plan.invalid.is_none() && plan.rejections.first().is_none_or(|r| r.cluster != "*")
}

/// Pool `q`'s free devices per node after packing every replica the deployments have on it
/// (with `t`'s changes) in the greedy's order: one priority tier (`prios`, by solve-order
/// index) after another, and within a tier first the replicas each deployment kept where they
/// ran, in solve order, then the rest, in solve order. With `upto` (a solve-order index), as
/// `upto` saw the pool when it placed the rest: the replicas of its tier's later deployments
/// count only where they were kept, and lower tiers not at all. `None` when one does not fit.
#[allow(clippy::too_many_arguments)]
pub(super) fn repack(
    snapshot: &crate::snapshot::FleetSnapshot,
    users: &BTreeMap<(usize, usize), Vec<usize>>,
    shapes: &[ReplicaShape],
    prios: &[i32],
    held: &[Vec<Held>],
    t: &Tentative,
    q: (usize, usize),
    upto: usize,
    work: &mut u64,
) -> Option<Vec<u32>> {
    let mut free = snapshot.clusters[q.0].pools[q.1].free_per_node.clone();
    super::improve::phase_trace::note_pool(q);
    let mut ids: Vec<usize> = users.get(&q).cloned().unwrap_or_default();
    ids.extend(t.held.keys().copied());
    ids.sort_unstable();
    ids.dedup();
    let tier = prios.get(upto).copied();
    ids.retain(|&i| i <= upto || tier == Some(prios[i]));
    // Solve order is highest priority first, so a tier's deployments are consecutive.
    for same_tier in ids.chunk_by(|&a, &b| prios[a] == prios[b]) {
        for kept in [true, false] {
            for &i in same_tier.iter().filter(|&&i| kept || i <= upto) {
                for h in held_of(t, held, i).iter().filter(|h| (h.cluster, h.pool) == q) {
                    let n = if kept { h.kept.min(h.count) } else { h.count.saturating_sub(h.kept) };
                    for _ in 0..n {
                        *work += free.len() as u64;
                        if !shapes[i].take_in(&mut free) {
                            return None;
                        }
                    }
                }
            }
        }
    }
    Some(free)
}

/// `namespace/name`, as moves name deployments.
pub(super) fn name(d: &DeploymentView) -> String {
    format!("{}/{}", d.namespace, d.name)
}

/// Adds `m` to `moves`, merged with an equal record.
pub(super) fn record(moves: &mut Vec<Move>, m: Move) {
    let same = |x: &&mut Move| {
        (&x.moved, &x.from, &x.to, &x.made_room_for, x.closes_spread_domain, x.higher_priority, x.lowers_cost)
            == (&m.moved, &m.from, &m.to, &m.made_room_for, m.closes_spread_domain, m.higher_priority, m.lowers_cost)
    };
    match moves.iter_mut().find(same) {
        Some(x) => x.replicas += m.replicas,
        None => moves.push(m),
    }
}

/// Per pool, the deployments (solve-order indexes, ascending) with replicas on it.
pub(super) fn users_of(held: &[Vec<Held>]) -> BTreeMap<(usize, usize), Vec<usize>> {
    // Sorted pairs, then the map built from them in order (cheaper than an insert each).
    let mut pairs: Vec<((usize, usize), usize)> =
        held.iter().enumerate().flat_map(|(i, hs)| hs.iter().map(move |h| ((h.cluster, h.pool), i))).collect();
    pairs.sort_unstable();
    pairs.dedup();
    let mut users: Vec<((usize, usize), Vec<usize>)> = Vec::new();
    for (q, i) in pairs {
        match users.last_mut() {
            Some((last, u)) if *last == q => u.push(i),
            _ => users.push((q, vec![i])),
        }
    }
    users.into_iter().collect()
}

/// Deployments whose spread or unplaced replicas make room a move frees matter.
pub(super) fn watched(order: &[&DeploymentView], plans: &[DeploymentPlan]) -> Vec<usize> {
    (0..order.len()).filter(|&i| order[i].spec.placement.spread.is_some() || plans[i].unplaced > 0).collect()
}

/// The plans the improvement phase works on, in solve order. For a re-plan it keeps, on first
/// change, the greedy pass's plan of every deployment it changes, so that the next walk starts
/// from the greedy plans without the phase copying all of them.
pub(super) struct Plans<'p> {
    v: &'p mut [DeploymentPlan],
    /// Per deployment, whether its greedy plan is in `saved` (`None`: nothing is kept).
    seen: Option<Vec<bool>>,
    saved: Vec<(usize, DeploymentPlan)>,
}

impl<'p> Plans<'p> {
    pub(super) fn new(v: &'p mut [DeploymentPlan], keep_greedy: bool) -> Self {
        let seen = keep_greedy.then(|| vec![false; v.len()]);
        Self { v, seen, saved: Vec::new() }
    }

    /// Every plan, to read.
    pub(super) fn all(&self) -> &[DeploymentPlan] {
        self.v
    }

    /// Whether deployment `i`'s plan may have changed since the phase began.
    pub(super) fn touched(&self, i: usize) -> bool {
        self.seen.as_ref().is_none_or(|s| s[i])
    }

    /// The greedy plans of the deployments the phase changed (empty unless kept).
    pub(super) fn into_saved(self) -> Vec<(usize, DeploymentPlan)> {
        self.saved
    }
}

impl std::ops::Deref for Plans<'_> {
    type Target = [DeploymentPlan];
    fn deref(&self) -> &[DeploymentPlan] {
        self.v
    }
}

impl std::ops::Index<usize> for Plans<'_> {
    type Output = DeploymentPlan;
    fn index(&self, i: usize) -> &DeploymentPlan {
        &self.v[i]
    }
}

impl std::ops::IndexMut<usize> for Plans<'_> {
    fn index_mut(&mut self, i: usize) -> &mut DeploymentPlan {
        if let Some(seen) = &mut self.seen
            && !std::mem::replace(&mut seen[i], true)
        {
            self.saved.push((i, self.v[i].clone()));
        }
        &mut self.v[i]
    }
}
