//! A cost ceiling as a constraint, not a stopping point. Before a deployment is placed, the
//! ceiling is turned into a target: how many replicas it can pay for at the cheapest free
//! capacity the deployment may use. While placing, a replica goes to a preferred (dearer)
//! candidate only if the budget left still pays for the rest of the target at the cheapest
//! prices; otherwise the next candidate is tried. So the plan keeps the documented ranking
//! (capacity type, price) wherever the budget allows it and never places fewer replicas than
//! the cheapest placement would. An alternative's `maxReplicas` bounds what its pools count
//! for in the target (a cheap pool reachable only through an alternative at its maximum pays
//! for nothing); spread and node shapes are not in it: when they make it unreachable, a last
//! fill without the hold places what the plain ceiling allows. Replicas kept where they run
//! (stickiness) are placed before the hold is taken and are never moved for the budget.

use flotilla_apis::deployment::DeviceAlternative;

use super::{Candidate, Ctx};
use crate::devices::ReplicaShape;

/// The budget held back for the rest of the target.
#[derive(Clone, Debug)]
pub(super) struct Reserve {
    /// Replicas the ceiling pays for at the cheapest free capacity (at most the desired count).
    pub target: u32,
    /// Replicas wanted.
    pub desired: u32,
    /// Distinct (price, cluster, pool, alternative rank) the deployment may take new replicas
    /// on, cheapest first.
    pub by_price: Vec<(u64, usize, usize, u32)>,
    /// Per alternative (rank − 1), its `maxReplicas`.
    pub caps: Vec<Option<u32>>,
}

impl Ctx<'_, '_> {
    /// The hold for a deployment with a ceiling, taken after its current placements were
    /// kept (they are never moved for the budget), or `None` when no hold is needed: no
    /// ceiling, or every replica left fits under it even at the dearest candidate. `per_rank`:
    /// replicas placed per alternative so far.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn reserve(
        &self,
        candidates: &[Candidate],
        alts: &[DeviceAlternative],
        shape: &ReplicaShape,
        desired: u32,
        (placed, per_rank): (u32, &[u32]),
        spent: u64,
        max_cost: Option<u64>,
    ) -> Option<Reserve> {
        let max = max_cost?;
        let left = desired.saturating_sub(placed);
        let dearest = candidates.iter().map(|c| c.replica_price).max()?;
        if left == 0 || u128::from(spent) + u128::from(dearest) * u128::from(left) <= u128::from(max) {
            return None;
        }
        let mut by_price: Vec<(u64, usize, usize, u32)> = candidates
            .iter()
            .filter(|c| !c.sticky_only)
            .map(|c| (c.replica_price, c.cluster, c.pool, c.rank))
            .collect();
        by_price.sort_unstable();
        by_price.dedup();
        let caps = alts.iter().map(|a| a.max_replicas.map(|m| m.max(0) as u32)).collect();
        let mut r = Reserve { target: 0, desired, by_price, caps };
        let (count, _) = self.cheapest(&r, shape, left, max.saturating_sub(spent), (per_rank, None));
        r.target = placed + count;
        Some(r)
    }

    /// The cheapest `want` replicas in today's free capacity, each alternative within its
    /// `maxReplicas` (with `per_rank` replicas on it already, and one more on `plus`): how
    /// many exist (up to `want`) while their cost stays within `limit`, and that cost. A pool
    /// listed under two alternatives gives its room once.
    pub(super) fn cheapest(
        &self,
        r: &Reserve,
        shape: &ReplicaShape,
        want: u32,
        limit: u64,
        (per_rank, plus): (&[u32], Option<u32>),
    ) -> (u32, u64) {
        let (mut n, mut cost) = (0u32, 0u64);
        let mut on_rank = per_rank.to_vec();
        if let Some(slot) = plus.and_then(|rank| on_rank.get_mut((rank - 1) as usize)) {
            *slot += 1;
        }
        // Replicas counted per pool so far (a pool may be listed once per alternative).
        let mut on_pool: Vec<((usize, usize), u32)> = Vec::new();
        for &(price, ci, pi, rank) in &r.by_price {
            if n >= want {
                break;
            }
            let k = (rank - 1) as usize;
            let room = match r.caps.get(k).copied().flatten() {
                Some(cap) => cap.saturating_sub(on_rank.get(k).copied().unwrap_or(0)).min(want - n),
                None => want - n,
            };
            if room == 0 {
                continue;
            }
            let at = on_pool.iter().position(|&(q, _)| q == (ci, pi));
            let used = at.map_or(0, |i| on_pool[i].1);
            let slots = shape.count(&self.free[(ci, pi)], room + used).saturating_sub(used);
            let affordable = (limit - cost).checked_div(price).map_or(slots, |n| n.min(u64::from(slots)) as u32);
            n += affordable;
            cost += price * u64::from(affordable);
            if let Some(slot) = on_rank.get_mut(k) {
                *slot += affordable;
            }
            match at {
                Some(i) => on_pool[i].1 += affordable,
                None => on_pool.push(((ci, pi), affordable)),
            }
            if affordable < slots {
                break;
            }
        }
        (n, cost)
    }

    /// Whether one more replica at `price` on alternative `rank`, with `free[ci][pi]` already
    /// reduced by it, still leaves budget for the rest of the target at the cheapest prices
    /// (`per_rank`: replicas per alternative before it).
    pub(super) fn within_reserve(
        &self,
        r: &Reserve,
        shape: &ReplicaShape,
        (placed, per_rank, rank): (u32, &[u32], u32),
        spent: u64,
        max: u64,
    ) -> bool {
        let rest = r.target.saturating_sub(placed + 1).min(r.desired.saturating_sub(placed + 1));
        if rest == 0 {
            return spent <= max;
        }
        if spent > max {
            return false;
        }
        let (n, _) = self.cheapest(r, shape, rest, max - spent, (per_rank, Some(rank)));
        // Fewer than `rest` affordable: either capacity is short (nothing to hold back for) or
        // the budget is; only the budget counts against this replica.
        let (exist, _) = self.cheapest(r, shape, rest, u64::MAX, (per_rank, Some(rank)));
        n >= exist
    }
}
