//! Cost down after the moves, the improvement phase's last step (issue 18: "then reduce cost
//! without losing replicas, respecting the documented ranking"). The greedy pass put every
//! replica on the best-ranked candidate with room at the time; the moves and preemptions that
//! followed can leave room where a replica of a deployment they changed would rank better. Such
//! a replica, not running yet, moves to a candidate of its own that ranks before the one it is
//! on (the greedy's order) **and** costs less, within its alternative limits and ceiling,
//! when every check of a move holds (`settle`: capacity re-packed, spread, no deployment still
//! short able to use the room it leaves). Only deployments the phase changed are looked at; the
//! rest are where the greedy put them. Recorded as a move of the deployment for itself
//! (`lowersCost: true`). Deterministic, and within the phase's budget.

use super::super::held::{Held, Plans, Tentative, may_move, moved_one, repack};
use super::super::{Candidate, Ctx};
use super::Phase;

impl Ctx<'_, '_> {
    /// Moves replicas of the deployments the phase changed (`changed`) to better-ranked,
    /// cheaper candidates of their own while one is found, in solve order.
    pub(super) fn polish(
        &mut self,
        ph: &mut Phase<'_, '_>,
        plans: &mut Plans<'_>,
        held: &mut [Vec<Held>],
        changed: &mut [bool],
    ) {
        for i in 0..ph.order.len() {
            if ph.work >= ph.budget {
                return;
            }
            if !changed[i] || !ph.movable[i] {
                continue;
            }
            // At most one move per replica the deployment has (each lowers its cost).
            let mut left: u32 = held[i].iter().map(|h| h.count).sum();
            while left > 0 && ph.work < ph.budget {
                let Some(t) = self.cheaper(ph, plans, held, i) else { break };
                self.apply(ph, plans, held, changed, t, i);
                left -= 1;
            }
        }
    }

    /// One replica of `i` moved to a candidate ranked before its own and cheaper, with room,
    /// if every rule holds; the worst-ranked replicas are tried first.
    fn cheaper(
        &mut self,
        ph: &mut Phase<'_, '_>,
        plans: &Plans<'_>,
        held: &[Vec<Held>],
        i: usize,
    ) -> Option<Tentative> {
        self.dep(ph, i);
        let alts = &ph.order[i].spec.devices.alternatives;
        let dep = ph.deps[i].as_ref()?;
        // Copied: `settle` below needs the phase mutably.
        let cands: Vec<Candidate> = dep.cands.clone();
        let max_cost = dep.max_cost;
        let mine = &held[i];
        let mut at: Vec<(usize, &Held)> = mine
            .iter()
            .filter(|h| h.count > h.kept)
            .filter_map(|h| {
                cands.iter().position(|c| (c.cluster, c.pool, c.rank) == (h.cluster, h.pool, h.rank)).map(|k| (k, h))
            })
            .collect();
        at.sort_by_key(|&(k, _)| std::cmp::Reverse(k));
        for (k, h) in at {
            let from = cands[k];
            let p = (from.cluster, from.pool);
            for (kb, to) in cands.iter().enumerate().take(k) {
                ph.work += 1;
                if ph.work >= ph.budget {
                    return None;
                }
                let q = (to.cluster, to.pool);
                if to.sticky_only
                    || q == p
                    || to.rank > from.rank
                    || to.replica_price >= from.replica_price
                    || !may_move(alts, max_cost, mine, h, to)
                    || !ph.shapes[i].fits(&self.free[(q.0, q.1)])
                {
                    continue;
                }
                let next = moved_one(mine, p, h.rank, to)?;
                let mut t = Tentative::default();
                t.held.insert(i, next);
                let left =
                    repack(self.snapshot, &ph.users, &ph.shapes, &ph.prios, held, &t, p, usize::MAX, &mut ph.work)?;
                t.free.insert(p, left);
                t.moves.push((i, p, q));
                if let Some(done) = self.settle(ph, plans, held, t, (i, kb)) {
                    return Some(done);
                }
            }
        }
        None
    }
}
