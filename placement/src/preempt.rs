//! Preemption, the improvement phase's last resort for a deployment still short of replicas
//! once the move search has run for every deployment (and only where a lower tier holds
//! replicas on a pool that search looks at): replicas of strictly lower-priority deployments
//! that do not run yet are taken out (the
//! lower tiers keep only what they run), the move search tries again for the deployment, and
//! only if it then places strictly more are the lower tiers solved again, by the greedy pass
//! itself, on the room left — spread, ceilings, `maxReplicas` and minimums judged anew, a
//! preempted deployment free to get its replica back elsewhere. Every replica a lower
//! deployment lost is recorded in both plans (`preemptions`), and where it stays unplaced its
//! reason on that cluster is `Preempted`. Equal priorities never preempt, a running replica is
//! never preempted (the attempt is undone if the re-solve would not keep one), and a higher
//! tier's replica moves only as the move search moves it (to a pool it ranks as high but for
//! price). Deterministic, and bounded by the phase's budget: a re-solve starts
//! only when what the greedy spent on those tiers fits in what is left.

use std::collections::{BTreeMap, BTreeSet};

use super::super::held::{Held, Plans, Tentative, movable, name, record, repack, users_of, watched};
use super::super::{Ctx, SolveOptions};
use super::Phase;
use crate::plan::{DeploymentPlan, Move, Preemption, Reason, Rejection};
use crate::snapshot::DeploymentView;

impl Ctx<'_, '_> {
    /// Places more replicas of `di` by preempting strictly lower-priority replicas that do not
    /// run; false (and nothing changed) when that places none.
    pub(super) fn preempt(
        &mut self,
        ph: &mut Phase<'_, '_>,
        plans: &mut Plans<'_>,
        held: &mut [Vec<Held>],
        changed: &mut [bool],
        di: usize,
    ) -> bool {
        let prio = ph.prios[di];
        // Short because of its namespace's quota: the greedy charged the higher tiers first, so
        // preempting lower ones frees none of it.
        if ph.quota.is_some() {
            self.dep(ph, di);
            if let (Some(q), Some(dep)) = (&ph.quota, ph.deps[di].as_ref())
                && !q.room_for_one(self.snapshot, di, &dep.cands)
            {
                return false;
            }
        }
        // Solve order is highest priority first: the lower tiers are everything from `below`.
        let below = ph.prios.partition_point(|&p| p >= prio);
        let tier = ph.prios.partition_point(|&p| p > prio);
        let n = ph.order.len();
        if below == n
            || !held[below..].iter().any(|hs| hs.iter().any(|h| h.count > h.kept))
            || plans.all()[below..].iter().any(|p| p.rejections.iter().any(|r| r.reason == Reason::BudgetExhausted))
        {
            return false;
        }
        let pools = self.free.len() as u64;
        let resolve: u64 = ph.cost[below..].iter().sum();
        if ph.work + resolve + pools + n as u64 >= ph.budget || !self.lower_in_reach(ph, held, di, below) {
            return false;
        }
        ph.work += pools + n as u64;
        // What to restore when nothing is gained (or a running replica would be lost).
        let saved_held = held.to_vec();
        let saved_free = self.free.raw().clone();
        let saved_users = ph.users.clone();
        let saved_plans: Vec<DeploymentPlan> = plans.all()[tier..below].to_vec();
        let saved_changed: Vec<bool> = changed[tier..below].to_vec();
        // A higher tier's replica may move for the deployment (to a pool it ranks as high but
        // for price, `improve::move_out`): its moves and flag are put back too.
        let saved_above: Vec<(Vec<Move>, bool)> =
            (0..tier).map(|i| (plans.all()[i].moves.clone(), changed[i])).collect();
        let restore = |ctx: &mut Self,
                       ph: &mut Phase<'_, '_>,
                       plans: &mut Plans<'_>,
                       held: &mut [Vec<Held>],
                       changed: &mut [bool]| {
            held.clone_from_slice(&saved_held);
            ctx.free.raw_mut().clone_from(&saved_free);
            ph.users.clone_from(&saved_users);
            if let Some(q) = ph.quota.as_mut() {
                q.rebase(ctx.snapshot, held);
            }
            // A plan not changed since the phase began is still what was saved.
            for (i, p) in (tier..below).zip(&saved_plans) {
                if plans.touched(i) {
                    plans[i].clone_from(p);
                }
            }
            changed[tier..below].copy_from_slice(&saved_changed);
            for (i, (moves, was)) in saved_above.iter().enumerate() {
                if plans.all()[i].moves != *moves {
                    plans[i].moves.clone_from(moves);
                }
                changed[i] = *was;
            }
            ph.floor = None;
        };
        // The lower tiers keep only what they run; their pools are packed again without the rest.
        let lower_pools: Vec<(usize, usize)> =
            ph.users.iter().filter(|(_, u)| u.last().is_some_and(|&i| i >= below)).map(|(&q, _)| q).collect();
        for hs in &mut held[below..] {
            hs.retain_mut(|h| {
                h.count = h.kept;
                h.count > 0
            });
        }
        ph.users = users_of(held);
        for &q in &lower_pools {
            let none = Tentative::default();
            let Some(f) =
                repack(self.snapshot, &ph.users, &ph.shapes, &ph.prios, held, &none, q, usize::MAX, &mut ph.work)
            else {
                restore(self, ph, plans, held, changed);
                return false;
            };
            self.free[(q.0, q.1)] = f;
        }
        // The move search again, the lower tiers out of its way and out of its checks.
        ph.floor = Some(prio);
        let short = plans[di].unplaced;
        while plans[di].unplaced > 0 && ph.work < ph.budget {
            let Some(t) =
                self.one_more(ph, plans, held, di, &Tentative::default()).or_else(|| self.close(ph, plans, held, di))
            else {
                break;
            };
            self.apply(ph, plans, held, changed, t, di);
        }
        ph.floor = None;
        if plans[di].unplaced == short {
            restore(self, ph, plans, held, changed);
            return false;
        }
        // The room the higher tiers leave, and the lower tiers solved on it.
        let top = below - 1;
        let mut room = self.free.raw().clone();
        for &q in ph.users.iter().filter(|(_, u)| u.last().is_some_and(|&i| i >= below)).map(|(q, _)| q) {
            let none = Tentative::default();
            match repack(self.snapshot, &ph.users, &ph.shapes, &ph.prios, held, &none, q, top, &mut ph.work) {
                Some(f) => room[q.0][q.1] = f,
                None => {
                    restore(self, ph, plans, held, changed);
                    return false;
                }
            }
        }
        *self.free.raw_mut() = room;
        let options = SolveOptions {
            explain: ph.explain.clone(),
            max_evaluations: u64::MAX,
            max_improvement: 0,
            exact: None,
            trades: false,
        };
        let before = *self.evaluations;
        let above: Vec<(&DeploymentView, &[Held])> =
            ph.order[..below].iter().zip(held[..below].iter()).map(|(d, h)| (*d, h.as_slice())).collect();
        let solved = self.solve_tiers_over(&ph.order[below..], &options, &above);
        ph.work += *self.evaluations - before;
        // A replica kept where it runs is never preempted: undo the attempt if the re-solve
        // (its spread judged anew) would not keep one.
        let lost_running = (below..n).any(|i| {
            saved_held[i].iter().any(|h| {
                let now: u32 = solved.held[i - below]
                    .iter()
                    .filter(|x| (x.cluster, x.pool) == (h.cluster, h.pool))
                    .map(|x| x.kept)
                    .sum();
                now < h.kept
            })
        });
        if lost_running {
            restore(self, ph, plans, held, changed);
            return false;
        }
        let by = name(ph.order[di]);
        for (k, (mut plan, h)) in solved.plans.into_iter().zip(solved.held).enumerate() {
            let i = below + k;
            plan.moves = std::mem::take(&mut plans[i].moves);
            plan.preemptions = std::mem::take(&mut plans[i].preemptions);
            let (moves, lost) = self.differences(&saved_held[i], &h);
            let y = name(ph.order[i]);
            for (from, to, r) in moves {
                let m = Move {
                    moved: y.clone(),
                    from,
                    to,
                    made_room_for: by.clone(),
                    replicas: r,
                    closes_spread_domain: false,
                    higher_priority: false,
                    lowers_cost: false,
                };
                record(&mut plan.moves, m.clone());
                record(&mut plans[di].moves, m);
            }
            for (from, r) in lost {
                let p = Preemption { preempted: y.clone(), from, by: by.clone(), replicas: r };
                if plan.unplaced > 0 {
                    say_preempted(&mut plan, &p, prio, ph.prios[i]);
                }
                add_preemption(&mut plan.preemptions, p.clone());
                add_preemption(&mut plans[di].preemptions, p);
            }
            plans[i] = plan;
            held[i] = h;
            ph.cost[i] = solved.cost[k];
            ph.movable[i] = movable(&plans[i]);
            changed[i] = false;
        }
        changed[di] = true;
        ph.users = users_of(held);
        ph.watched = watched(ph.order, plans);
        if let Some(q) = ph.quota.as_mut() {
            q.rebase(self.snapshot, held);
        }
        true
    }

    /// Whether a lower tier (from `below`) holds replicas that do not run on a pool the move
    /// search for `di` would look at: one of its own, or one of a deployment it may move off
    /// them (deeper chains aside). Without any, taking them out could not help.
    fn lower_in_reach(&mut self, ph: &mut Phase<'_, '_>, held: &[Vec<Held>], di: usize, below: usize) -> bool {
        let pools_of = |ph: &Phase<'_, '_>, i: usize| -> Vec<(usize, usize)> {
            ph.deps[i].as_ref().map_or_else(Vec::new, |d| d.cands.iter().map(|c| (c.cluster, c.pool)).collect())
        };
        self.dep(ph, di);
        let mine = pools_of(ph, di);
        let mut reach: BTreeSet<(usize, usize)> = mine.iter().copied().collect();
        for q in mine {
            for i in ph.users.get(&q).cloned().unwrap_or_default() {
                ph.work += 1;
                if i != di && i < below && ph.movable[i] && ph.prios[i] <= ph.prios[di] {
                    self.dep(ph, i);
                    reach.extend(pools_of(ph, i));
                }
            }
        }
        ph.work += reach.len() as u64;
        reach.iter().any(|q| {
            ph.users.get(q).is_some_and(|u| {
                u.iter().any(|&i| i >= below && held[i].iter().any(|h| (h.cluster, h.pool) == *q && h.count > h.kept))
            })
        })
    }

    /// What changed between a deployment's placements before and after a re-solve, per pool:
    /// replicas that went from one pool to another (`from`, `to`, count), paired in pool
    /// order, and those lost without a place elsewhere (`from`, count).
    #[allow(clippy::type_complexity)]
    fn differences(&self, before: &[Held], after: &[Held]) -> (Vec<(String, String, u32)>, Vec<(String, u32)>) {
        let mut delta: BTreeMap<(usize, usize), i64> = BTreeMap::new();
        for h in before {
            *delta.entry((h.cluster, h.pool)).or_default() -= i64::from(h.count);
        }
        for h in after {
            *delta.entry((h.cluster, h.pool)).or_default() += i64::from(h.count);
        }
        let mut lost: Vec<((usize, usize), u32)> =
            delta.iter().filter(|(_, d)| **d < 0).map(|(&q, d)| (q, d.unsigned_abs() as u32)).collect();
        let mut gained: Vec<((usize, usize), u32)> =
            delta.iter().filter(|(_, d)| **d > 0).map(|(&q, d)| (q, *d as u32)).collect();
        let mut moves = Vec::new();
        let (mut a, mut b) = (0, 0);
        while a < lost.len() && b < gained.len() {
            let r = lost[a].1.min(gained[b].1);
            moves.push((self.pool_name(lost[a].0), self.pool_name(gained[b].0), r));
            lost[a].1 -= r;
            gained[b].1 -= r;
            if lost[a].1 == 0 {
                a += 1;
            }
            if gained[b].1 == 0 {
                b += 1;
            }
        }
        let lost = lost[a..].iter().filter(|(_, r)| *r > 0).map(|&(q, r)| (self.pool_name(q), r)).collect();
        (moves, lost)
    }
}

/// Adds `p` to `list`, merged with an equal record.
fn add_preemption(list: &mut Vec<Preemption>, p: Preemption) {
    match list.iter_mut().find(|x| (&x.preempted, &x.from, &x.by) == (&p.preempted, &p.from, &p.by)) {
        Some(x) => x.replicas += p.replicas,
        None => list.push(p),
    }
}

/// The preempted deployment's reason on the cluster where it lost the replicas.
fn say_preempted(plan: &mut DeploymentPlan, p: &Preemption, by_prio: i32, prio: i32) {
    let (cluster, pool) = p.from.split_once('/').unwrap_or((p.from.as_str(), ""));
    let message = format!(
        "pool {pool}: {} replica(s) preempted by {} (priority {by_prio}, above this deployment's {prio}); no other \
         allowed pool has room for them",
        p.replicas, p.by
    );
    let r = Rejection { cluster: cluster.to_string(), reason: Reason::Preempted, message };
    match plan.rejections.iter_mut().find(|x| x.cluster == cluster) {
        Some(x) => *x = r,
        None => plan.rejections.push(r),
    }
}
