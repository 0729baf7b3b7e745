//! A cost ceiling as a constraint, not a stopping point. Before a deployment is placed, the
//! ceiling is turned into a target: how many replicas it can pay for at the cheapest free
//! capacity the deployment may use. While placing, a replica goes to a preferred (dearer)
//! candidate only if the budget left still pays for the rest of the target at the cheapest
//! prices; otherwise the next candidate is tried. So the plan keeps the documented ranking
//! (capacity type, price) wherever the budget allows it and never places fewer replicas than
//! the cheapest placement would. Spread, `maxReplicas` and node shapes are not in the target;
//! when they make it unreachable, a last fill without the hold places what the plain ceiling
//! allows. Replicas kept where they run (stickiness) are placed before the hold is taken and
//! are never moved for the budget.

use super::{Candidate, Ctx};
use crate::devices::ReplicaShape;

/// The budget held back for the rest of the target.
#[derive(Clone, Debug)]
pub(super) struct Reserve {
    /// Replicas the ceiling pays for at the cheapest free capacity (at most the desired count).
    pub target: u32,
    /// Replicas wanted.
    pub desired: u32,
    /// Distinct (price, cluster, pool) the deployment may take new replicas on, cheapest first.
    pub by_price: Vec<(u64, usize, usize)>,
}

impl Ctx<'_, '_> {
    /// The hold for a deployment with a ceiling, taken after its current placements were
    /// kept (they are never moved for the budget), or `None` when no hold is needed: no
    /// ceiling, or every replica left fits under it even at the dearest candidate.
    pub(super) fn reserve(
        &self,
        candidates: &[Candidate],
        shape: &ReplicaShape,
        desired: u32,
        placed: u32,
        spent: u64,
        max_cost: Option<u64>,
    ) -> Option<Reserve> {
        let max = max_cost?;
        let left = desired.saturating_sub(placed);
        let dearest = candidates.iter().map(|c| c.replica_price).max()?;
        if left == 0 || u128::from(spent) + u128::from(dearest) * u128::from(left) <= u128::from(max) {
            return None;
        }
        let mut by_price: Vec<(u64, usize, usize)> =
            candidates.iter().filter(|c| !c.sticky_only).map(|c| (c.replica_price, c.cluster, c.pool)).collect();
        by_price.sort_unstable();
        by_price.dedup();
        let mut r = Reserve { target: 0, desired, by_price };
        let (count, _) = self.cheapest(&r, shape, left, max.saturating_sub(spent));
        r.target = placed + count;
        Some(r)
    }

    /// The cheapest `want` replicas in today's free capacity: how many exist (up to `want`)
    /// while their cost stays within `limit`, and that cost.
    pub(super) fn cheapest(&self, r: &Reserve, shape: &ReplicaShape, want: u32, limit: u64) -> (u32, u64) {
        let (mut n, mut cost) = (0u32, 0u64);
        for &(price, ci, pi) in &r.by_price {
            if n >= want {
                break;
            }
            let slots = shape.count(&self.free[(ci, pi)], want - n);
            let affordable = (limit - cost).checked_div(price).map_or(slots, |n| n.min(u64::from(slots)) as u32);
            n += affordable;
            cost += price * u64::from(affordable);
            if affordable < slots {
                break;
            }
        }
        (n, cost)
    }

    /// Whether one more replica at `price`, with `free[ci][pi]` already reduced by it, still
    /// leaves budget for the rest of the target at the cheapest prices.
    pub(super) fn within_reserve(&self, r: &Reserve, shape: &ReplicaShape, placed: u32, spent: u64, max: u64) -> bool {
        let rest = r.target.saturating_sub(placed + 1).min(r.desired.saturating_sub(placed + 1));
        if rest == 0 {
            return spent <= max;
        }
        if spent > max {
            return false;
        }
        let (n, _) = self.cheapest(r, shape, rest, max - spent);
        // Fewer than `rest` affordable: either capacity is short (nothing to hold back for) or
        // the budget is; only the budget counts against this replica.
        let (exist, _) = self.cheapest(r, shape, rest, u64::MAX);
        n >= exist
    }
}
