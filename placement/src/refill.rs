//! A second try for a deployment that spread and its own limits leave short. The greedy judges
//! spread replica by replica, in preference order, so under a cost ceiling (or an alternative's
//! `maxReplicas`) it may spend the budget where spread sends it early, on a pricier pool in another
//! domain, while spending it on the cheapest pools would have closed that domain (a domain counts
//! only while the deployment can still take a replica there, `place::open`) and placed more. So
//! when such a deployment is short after its fill, it is filled again from where its current
//! placements left it, cheapest candidates first: once with spread judged replica by replica as the
//! greedy does (equal prices to the emptiest domain first, so that none is stacked while another
//! stays cheap enough to count), once without and the finished placement checked against the rule
//! (no domain more than `maxSkew` above the emptiest that could still take a replica). A try is
//! kept only if it places strictly more than the preference-order fill and every try before it, and
//! meets every `minReplicas` that fill met. Deterministic; at most two more fills, only for
//! deployments with spread and a ceiling or a `maxReplicas` left short while a pool they may use
//! still has room for a replica.

use flotilla_apis::deployment::SpreadDomain;

use super::super::refusal::Refusal;
use super::super::{Candidate, Ctx, PerCluster};
use super::{Placing, open};
use crate::devices::ReplicaShape;
use crate::snapshot::DeploymentView;

/// A deployment's placing state, and its candidate pools' free devices, at one moment.
struct Saved {
    candidates: Vec<Candidate>,
    remaining: u32,
    cost: u64,
    per_rank: Vec<u32>,
    domains: Vec<u32>,
    blocks: Vec<Option<Refusal>>,
    free: Vec<((usize, usize), Vec<u32>)>,
}

impl Ctx<'_, '_> {
    /// The fill in preference order (the ceiling's hold first, then without it when that
    /// leaves replicas unplaced), then, when spread and the deployment's own limits leave it
    /// short, the cheapest-first tries of this file.
    pub(in super::super) fn fill_all(
        &mut self,
        state: &mut Placing,
        d: &DeploymentView,
        shape: &ReplicaShape,
        spread: Option<(SpreadDomain, u32)>,
        proportional: bool,
    ) {
        let limited = state.max_cost.is_some() || d.spec.devices.alternatives.iter().any(|a| a.max_replicas.is_some());
        let start = (spread.is_some() && limited).then(|| self.save(state));
        self.fill(state, d, shape, spread, proportional, true);
        // A ceiling hold that spread or `maxReplicas` made unreachable: place what the plain
        // ceiling allows.
        if state.remaining > 0 && state.reserve.take().is_some() {
            self.fill(state, d, shape, spread, proportional, false);
        }
        // Short with room left that it may not use: spread, the ceiling or a maximum held it
        // back (short because every pool is full, no order of filling places more).
        let room = || state.candidates.iter().any(|c| !c.sticky_only && shape.fits(&self.free[(c.cluster, c.pool)]));
        let Some(start) = start.filter(|_| state.remaining > 0 && room()) else { return };
        // Only the pools are put back when no try wins: the fill's own state stands.
        let first = self.pools_of(state);
        let mut best: Option<Saved> = None;
        let mut most = state.placed();
        for judged in [true, false] {
            self.restore_free(&start.free);
            let mut s = start.placing(state.max_cost);
            let mut ids: Vec<usize> = (0..s.candidates.len()).filter(|&i| !s.candidates[i].sticky_only).collect();
            ids.sort_by_key(|&i| s.candidates[i].replica_price);
            let by = if judged { spread } else { None };
            // Judged replica by replica, equal prices go to the emptiest domain first: a
            // domain kept low holds the cheapest one back less.
            let ix = spread.map(|(by, _)| &self.domains.of(by).0);
            loop {
                if let (true, Some(ix)) = (judged, ix) {
                    let count = |i: usize| s.domains.get(ix[s.candidates[i].cluster]).copied().unwrap_or(0);
                    ids.sort_by_key(|&i| (s.candidates[i].replica_price, count(i)));
                }
                if s.remaining == 0 || !self.place(&mut s, &ids, shape, by, d) {
                    break;
                }
            }
            let minimums = d.spec.devices.alternatives.iter().enumerate().all(|(ai, a)| {
                let min = a.min_replicas.unwrap_or(0).max(0) as u32;
                state.per_rank[ai] < min || s.per_rank[ai] >= min
            });
            if s.placed() > most && minimums && (judged || self.spread_holds(&mut s, shape, spread, d)) {
                most = s.placed();
                best = Some(self.save(&s));
            }
        }
        match best {
            Some(b) => {
                self.restore_free(&b.free);
                *state = b.placing(state.max_cost);
            }
            // The preference-order fill stands: its pools as it left them.
            None => self.restore_free(&first),
        }
    }

    /// `state` and its candidate pools' free devices.
    fn save(&self, state: &Placing) -> Saved {
        Saved {
            candidates: state.candidates.clone(),
            remaining: state.remaining,
            cost: state.cost,
            per_rank: state.per_rank.clone(),
            domains: state.domains.clone(),
            blocks: state.blocks.0.clone(),
            free: self.pools_of(state),
        }
    }

    /// The free devices of `state`'s candidate pools, each pool once.
    fn pools_of(&self, state: &Placing) -> Vec<((usize, usize), Vec<u32>)> {
        let mut pools: Vec<(usize, usize)> = state.candidates.iter().map(|c| (c.cluster, c.pool)).collect();
        pools.sort_unstable();
        pools.dedup();
        pools.into_iter().map(|(ci, pi)| ((ci, pi), self.free[(ci, pi)].clone())).collect()
    }

    fn restore_free(&mut self, free: &[((usize, usize), Vec<u32>)]) {
        for ((ci, pi), f) in free {
            self.free[(*ci, *pi)].clone_from(f);
        }
    }

    /// Whether the finished placement `s` holds spread (the greedy's rule, judged once at the
    /// end); its domain counts are brought up to date on the way.
    fn spread_holds(
        &self,
        s: &mut Placing,
        shape: &ReplicaShape,
        spread: Option<(SpreadDomain, u32)>,
        d: &DeploymentView,
    ) -> bool {
        let Some((by, skew)) = spread else { return true };
        let ix = &self.domains.of(by).0;
        s.domains.iter_mut().for_each(|n| *n = 0);
        for c in s.candidates.iter().filter(|c| c.placed > 0) {
            if let Some(n) = s.domains.get_mut(ix[c.cluster]) {
                *n += c.placed;
            }
        }
        let alts = &d.spec.devices.alternatives;
        let least = s
            .candidates
            .iter()
            .filter(|c| {
                open(alts, s.per_rank[(c.rank - 1) as usize], s.cost, s.max_cost, c)
                    && shape.fits(self.room(c.cluster, c.pool))
            })
            .map(|c| s.domains.get(ix[c.cluster]).copied().unwrap_or(0))
            .min();
        least.is_none_or(|m| s.domains.iter().all(|&n| n <= m + skew))
    }
}

impl Saved {
    fn placing(&self, max_cost: Option<u64>) -> Placing {
        Placing {
            candidates: self.candidates.clone(),
            remaining: self.remaining,
            cost: self.cost,
            max_cost,
            per_rank: self.per_rank.clone(),
            domains: self.domains.clone(),
            blocks: PerCluster(self.blocks.clone()),
            reserve: None,
        }
    }
}
