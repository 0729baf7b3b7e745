//! Closing a spread domain, the improvement phase's step for a deployment that spread holds back:
//! it could take a replica in one domain, but that would put the domain more than `maxSkew` above
//! another that can still take one of its replicas (room, an alternative under `maxReplicas`,
//! within the cost ceiling: `place::open`; such a domain holds it back only through a pool where it
//! takes no new replica, one backed off for it, say). The solver judges "can still take one" once
//! the deployments solved before it are placed, so the other domain stops counting when those fill
//! it: replicas of earlier deployments of the same priority are moved into its remaining room from
//! their other pools (each within its own rules), until the held-back deployment's replica fits
//! there no more; then the move search runs again on top of those moves. All of it is kept only if
//! the deployment gains a replica and every rule the phase checks still holds (`settle`: capacity,
//! spread of everyone moved, no deployment still short able to use the room the moves leave);
//! otherwise nothing changes. A higher-priority replica, a replica kept where it runs, or one of a
//! deployment solved after the held-back one is never moved here (the last would not count for its
//! spread). Deterministic, bounded by the phase's budget and [`MAX_MOVES`](super::MAX_MOVES).

use std::collections::BTreeMap;

use super::super::held::{Tentative, cost, held_of, open as counts_open, per_rank, repack};
use super::super::{Ctx, held::Held};
use super::{MAX_MOVES, Mover, Phase};
use crate::plan::DeploymentPlan;

impl Ctx<'_, '_> {
    /// Moves that close the domains holding deployment `di`'s spread back, followed by the
    /// moves that then let it take one more replica, or `None` (nothing changed).
    pub(super) fn close(
        &mut self,
        ph: &mut Phase<'_, '_>,
        plans: &[DeploymentPlan],
        held: &[Vec<Held>],
        di: usize,
    ) -> Option<Tentative> {
        self.dep(ph, di);
        let (by, skew) = ph.deps[di].as_ref()?.spread?;
        let ix = self.domains.of(by).0.clone();
        super::phase_trace::note_dep(di);
        let mut counts: BTreeMap<usize, u32> = BTreeMap::new();
        for h in &held[di] {
            *counts.entry(ix[h.cluster]).or_default() += h.count;
        }
        let count = |dom: usize| counts.get(&dom).copied().unwrap_or(0);
        // Per candidate pool: open (a candidate there may take one more replica of the
        // deployment, within its alternative's `maxReplicas` and the ceiling, and the replica
        // fits the pool as the deployment saw it).
        let none = Tentative::default();
        let alts = &ph.order[di].spec.devices.alternatives;
        let n = ph.deps[di].as_ref()?.cands.len();
        let mut open: Vec<(usize, usize)> = Vec::new();
        for k in 0..n {
            let dep = ph.deps[di].as_ref()?;
            let c = dep.cands[k];
            let q = (c.cluster, c.pool);
            if !open.contains(&q)
                && counts_open(alts, dep.max_cost, &held[di], &c)
                && self.fits_at(ph, held, &none, di, q)?
            {
                open.push(q);
            }
        }
        let least = open.iter().map(|q| count(ix[q.0])).min()?;
        // The best-ranked candidate spread alone refuses: open, within the deployment's other
        // limits, and its domain already `maxSkew` above the emptiest open one.
        let d = ph.order[di];
        let dep = ph.deps[di].as_ref()?;
        let mine = &held[di];
        let target = dep.cands.iter().find(|c| {
            let alt = &d.spec.devices.alternatives[(c.rank - 1) as usize];
            !c.sticky_only
                && open.contains(&(c.cluster, c.pool))
                && count(ix[c.cluster]) + 1 > least + skew
                && alt.max_replicas.is_none_or(|m| per_rank(mine, c.rank) < m.max(0) as u32)
                && dep.max_cost.is_none_or(|m| cost(mine) + c.replica_price <= m)
        })?;
        let grow = count(ix[target.cluster]) + 1;
        // Every open pool of a domain too far below the one that grows must be closed.
        let shut: Vec<(usize, usize)> = open.iter().copied().filter(|q| count(ix[q.0]) + skew < grow).collect();
        let prio = ph.prios[di];
        let mover = Mover { di, prio, depth: 0, to: None };
        let mut t = Tentative::default();
        for &q in &shut {
            while self.fits_at(ph, held, &t, di, q)? {
                if t.moves.len() >= MAX_MOVES - 1 || ph.work >= ph.budget {
                    return None;
                }
                // Earlier deployments of the tier, the last solved first, and their replicas
                // not kept where they run, on any other pool.
                let mut next = None;
                let tier_start = ph.prios.partition_point(|&p| p > prio);
                super::phase_trace::note_range(tier_start, di);
                let earlier: Vec<usize> = (0..di).rev().filter(|&i| ph.prios[i] == prio && ph.movable[i]).collect();
                'find: for ei in earlier {
                    let from: Vec<(usize, usize, u32)> = held_of(&t, held, ei)
                        .iter()
                        .filter(|h| (h.cluster, h.pool) != q && h.count > h.kept)
                        .map(|h| (h.cluster, h.pool, h.rank))
                        .collect();
                    for (ci, pi, rank) in from {
                        ph.work += 1;
                        let Some(mut t2) =
                            self.move_out(ph, held, &t, Mover { to: Some(q), ..mover }, ei, rank, (ci, pi))
                        else {
                            continue;
                        };
                        // The pool the replica left, as the checks in `settle` must see it.
                        let Some(left) = repack(
                            self.snapshot,
                            &ph.users,
                            &ph.shapes,
                            &ph.prios,
                            held,
                            &t2,
                            (ci, pi),
                            usize::MAX,
                            &mut ph.work,
                        ) else {
                            continue;
                        };
                        t2.free.insert((ci, pi), left);
                        next = Some(t2);
                        break 'find;
                    }
                }
                t = next?;
            }
        }
        // A later move may have taken a replica out of a pool closed before it.
        for &q in &shut {
            if self.fits_at(ph, held, &t, di, q)? {
                return None;
            }
        }
        t.closing = t.moves.len();
        self.one_more(ph, plans, held, di, &t)
    }

    /// Whether a replica of `di` fits on pool `q` as `di` saw it when it was solved (the
    /// deployments solved after it not counted), with `t`'s changes; `None` when the pool does
    /// not pack.
    fn fits_at(
        &mut self,
        ph: &mut Phase<'_, '_>,
        held: &[Vec<Held>],
        t: &Tentative,
        di: usize,
        q: (usize, usize),
    ) -> Option<bool> {
        let free = repack(self.snapshot, &ph.users, &ph.shapes, &ph.prios, held, t, q, di, &mut ph.work)?;
        Some(ph.shapes[di].fits(&free))
    }
}
