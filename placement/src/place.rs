//! Placing one replica on the best candidate that can take it (alternative maximum, cost
//! ceiling, spread skew against the domains that could still take one of its replicas, free
//! devices), and turning the final state into a deployment plan with assignments, unmet
//! minimums, per-cluster rejections and, on request, explanations.

use flotilla_apis::deployment::{DeviceAlternative, SpreadDomain};

use super::ceiling::Reserve;
use super::refusal::Refusal;
use super::{Blocks, Candidate, Ctx, PerCluster};
use crate::devices::{ClassMatch, ReplicaShape, free_facts};
use crate::plan::{
    Assignment, CandidateScore, ClusterExplanation, DeploymentPlan, Reason, Rejection, UnmetMinimum, Verdict,
};
use crate::snapshot::{ClusterView, DeploymentView};

/// The placement state of one deployment.
pub(super) struct Placing {
    pub candidates: Vec<Candidate>,
    pub remaining: u32,
    pub cost: u64,
    pub max_cost: Option<u64>,
    pub per_rank: Vec<u32>,
    /// Replicas per spread domain (by the domain's index).
    pub domains: Vec<u32>,
    /// Per cluster, the last refusal `place` met there (said in words by `finish`).
    pub blocks: PerCluster<Refusal>,
    /// Under a cost ceiling: the budget held back for the rest of the target (`ceiling.rs`).
    pub reserve: Option<Reserve>,
}

impl Placing {
    /// Replicas placed so far.
    pub fn placed(&self) -> u32 {
        self.candidates.iter().map(|c| c.placed).sum()
    }
}

/// How far a candidate got before it was refused; the furthest is the most telling reason. At
/// the device match, from least to most telling: the alternative names another class; the
/// pool's class is itself invalid (it says so in its own status); a selector is false on the
/// device; a selector fails on a valid device.
pub(super) fn stage(reason: Reason, device: Option<&ClassMatch>) -> u8 {
    match (device, reason) {
        (Some(ClassMatch::OtherClass(_)), _) => 1,
        (Some(ClassMatch::ClassInvalid(_)), _) => 2,
        (_, Reason::NoMatchingDevices) => 3,
        (_, Reason::SelectorError) => 4,
        (_, Reason::DoesNotFitNode) => 5,
        (_, Reason::CapacityTypeNotAllowed) => 6,
        (_, Reason::NoPrice) => 7,
        (_, Reason::InsufficientDevices) => 8,
        _ => 9,
    }
}

/// Whether candidate `c` counts for spread as a place a replica of the deployment could still
/// go, capacity aside: its alternative (of `alts`) is under `maxReplicas` with `on_rank`
/// replicas on it, and one more replica there keeps the deployment, at `cost` now, under
/// `max_cost`. A domain whose every candidate fails this (or has no room) can take no replica
/// of this deployment, so it does not hold its spread back. The improvement phase
/// (`held::open`: `improve.rs::spread_ok`, `close.rs`) asks this too; the property checker and
/// the exact model of `scripts/solver-quality.py` say the same rule in their own words.
pub(super) fn open(alts: &[DeviceAlternative], on_rank: u32, cost: u64, max_cost: Option<u64>, c: &Candidate) -> bool {
    alts[(c.rank - 1) as usize].max_replicas.is_none_or(|m| on_rank < m.max(0) as u32)
        && max_cost.is_none_or(|m| cost + c.replica_price <= m)
}

/// Replicas per alternative and cost the deployment uses, for [`open`]. While it keeps its
/// current placements (`keeping`), the replicas it runs and has not kept yet count too, as
/// many as `keepable` says still fit where they run: a new replica would come on top of them.
/// One whose pool has no room left for it (capacity lost) will not be kept and costs nothing.
fn used(state: &Placing, keeping: bool, keepable: impl Fn(&Candidate) -> u32) -> (std::borrow::Cow<'_, [u32]>, u64) {
    if !keeping {
        return (std::borrow::Cow::Borrowed(&state.per_rank), state.cost);
    }
    let (mut per_rank, mut cost) = (state.per_rank.clone(), state.cost);
    for k in state.candidates.iter().filter(|k| k.sticky_quota > 0) {
        let n = keepable(k);
        if let Some(r) = per_rank.get_mut((k.rank - 1) as usize) {
            *r += n;
        }
        cost += k.replica_price * u64::from(n);
    }
    (std::borrow::Cow::Owned(per_rank), cost)
}

fn domain(cluster: &ClusterView, by: SpreadDomain) -> &str {
    match by {
        SpreadDomain::Cluster => &cluster.name,
        SpreadDomain::Region => &cluster.region,
        SpreadDomain::Zone => cluster.zones.first().unwrap_or(&cluster.region),
    }
}

/// Spread domains as small integers, computed once per solve: per kind of domain, each
/// cluster's domain index and the domains' names.
pub(super) struct DomainIndex {
    by_kind: [(Vec<usize>, Vec<String>); 3],
}

impl DomainIndex {
    pub(super) fn new(clusters: &[ClusterView]) -> Self {
        let index = |by: SpreadDomain| {
            let mut names: Vec<String> = Vec::new();
            let mut seen: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
            let ix = clusters
                .iter()
                .map(|c| {
                    let name = domain(c, by);
                    *seen.entry(name).or_insert_with(|| {
                        names.push(name.to_string());
                        names.len() - 1
                    })
                })
                .collect();
            (ix, names)
        };
        Self { by_kind: [index(SpreadDomain::Cluster), index(SpreadDomain::Zone), index(SpreadDomain::Region)] }
    }

    pub(super) fn of(&self, by: SpreadDomain) -> &(Vec<usize>, Vec<String>) {
        match by {
            SpreadDomain::Cluster => &self.by_kind[0],
            SpreadDomain::Zone => &self.by_kind[1],
            SpreadDomain::Region => &self.by_kind[2],
        }
    }
}

impl Ctx<'_, '_> {
    /// Keeps one current replica on candidate `i` (spread judged with the replicas the
    /// deployment runs and has not kept yet, `open`). False when it cannot stay.
    pub(super) fn keep_one(
        &mut self,
        state: &mut Placing,
        i: usize,
        shape: &ReplicaShape,
        spread: Option<(SpreadDomain, u32)>,
        d: &DeploymentView,
    ) -> bool {
        self.place_judged(state, &[i], shape, spread, d, true)
    }

    /// Places one replica on the first of `ids` that can take it. False when none can.
    pub(super) fn place(
        &mut self,
        state: &mut Placing,
        ids: &[usize],
        shape: &ReplicaShape,
        spread: Option<(SpreadDomain, u32)>,
        d: &DeploymentView,
    ) -> bool {
        self.place_judged(state, ids, shape, spread, d, false)
    }

    fn place_judged(
        &mut self,
        state: &mut Placing,
        ids: &[usize],
        shape: &ReplicaShape,
        spread: Option<(SpreadDomain, u32)>,
        d: &DeploymentView,
        keeping: bool,
    ) -> bool {
        let spread_ix = spread.map(|(by, skew)| (self.domains.of(by), skew));
        // The namespace's quotas: what this deployment holds against each limit so far.
        let devices = shape.devices();
        let pool_of = |c: &Candidate| {
            let pool = &self.snapshot.clusters[c.cluster].pools[c.pool];
            (pool.class.as_str(), pool.capacity_type.unwrap_or(flotilla_apis::CapacityType::OnDemand))
        };
        let own = self.quota.as_ref().map(|room| {
            let placed = state.candidates.iter().filter(|c| c.placed > 0);
            room.own(devices, placed.map(|c| (pool_of(c).0, pool_of(c).1, c.placed, c.replica_price)))
        });
        let quota_refuses = |c: &Candidate| {
            let (room, own) = (self.quota.as_ref()?, own.as_deref()?);
            let (class, t) = pool_of(c);
            room.refuses(own, class, t, devices, c.replica_price).map(|(k, used, add)| {
                let l = &room.limits[k];
                Refusal::Quota { quota: l.quota, device: l.device, max: l.max, used, add }
            })
        };
        // The emptiest domain that can still take a replica of this deployment (`open`); None
        // when nothing can take one (then the pool's own refusal is the reason).
        let min_domain = spread_ix.and_then(|((ix, _), _)| {
            let free = &*self.free;
            let (per_rank, cost) = used(state, keeping, |k| shape.count(&free[(k.cluster, k.pool)], k.sticky_quota));
            state
                .candidates
                .iter()
                .filter(|c| {
                    let alts = &d.spec.devices.alternatives;
                    open(alts, per_rank[(c.rank - 1) as usize], cost, state.max_cost, c)
                        && quota_refuses(c).is_none()
                        && shape.fits(self.room(c.cluster, c.pool))
                })
                .map(|c| state.domains.get(ix[c.cluster]).copied().unwrap_or(0))
                .min()
        });
        for &i in ids {
            *self.evaluations += 1;
            let c = &state.candidates[i];
            let (ci, pi) = (c.cluster, c.pool);
            let alt = &d.spec.devices.alternatives[(c.rank - 1) as usize];
            if let Some(max) = alt.max_replicas
                && state.per_rank[(c.rank - 1) as usize] >= max.max(0) as u32
            {
                state.blocks.insert(ci, Refusal::AlternativeMax { rank: c.rank, max });
                continue;
            }
            if let Some(max) = state.max_cost
                && state.cost + c.replica_price > max
            {
                state.blocks.insert(ci, Refusal::Ceiling { price: c.replica_price, placed: state.cost, max });
                continue;
            }
            if let Some(r) = quota_refuses(c) {
                state.blocks.insert(ci, r);
                continue;
            }
            let domain_key = spread_ix.map(|((ix, _), _)| ix[ci]);
            if let (Some((by, skew)), Some(dix), Some(min)) = (spread, domain_key, min_domain) {
                let count = state.domains.get(dix).copied().unwrap_or(0);
                if count + 1 > min + skew {
                    state.blocks.insert(ci, Refusal::Spread { by, domain: dix, count: count + 1, min, skew });
                    continue;
                }
            }
            let Some(next) = shape.take(&self.free[(ci, pi)]) else {
                state.blocks.insert(ci, Refusal::Misfit { pool: pi, free: free_facts(&self.free[(ci, pi)]) });
                continue;
            };
            if let (Some(r), Some(max)) = (&state.reserve, state.max_cost) {
                let price = state.candidates[i].replica_price;
                let before = std::mem::replace(&mut self.free[(ci, pi)], next.clone());
                let at = (state.placed(), state.per_rank.as_slice(), state.candidates[i].rank);
                let ok = self.within_reserve(r, shape, at, state.cost + price, max);
                self.free[(ci, pi)] = before;
                if !ok {
                    state.blocks.insert(ci, Refusal::Reserve { price, placed: state.cost, max });
                    continue;
                }
            }
            self.free[(ci, pi)] = next;
            let c = &mut state.candidates[i];
            c.placed += 1;
            state.per_rank[(c.rank - 1) as usize] += 1;
            state.cost += c.replica_price;
            state.remaining -= 1;
            if let Some(dix) = domain_key
                && let Some(n) = state.domains.get_mut(dix)
            {
                *n += 1;
            }
            return true;
        }
        false
    }

    /// Places per-alternative minimums (when `minimums`), then the rest in fallback order,
    /// the fill repeated while it makes progress: a replica one alternative refused for spread
    /// may fit it after a later alternative evened the domains.
    pub(super) fn fill(
        &mut self,
        state: &mut Placing,
        d: &DeploymentView,
        shape: &ReplicaShape,
        spread: Option<(SpreadDomain, u32)>,
        proportional: bool,
        minimums: bool,
    ) {
        let mut phase_min = minimums;
        loop {
            let mut progress = false;
            for (ai, alt) in d.spec.devices.alternatives.iter().enumerate() {
                let rank = ai as u32 + 1;
                let ids: Vec<usize> = (0..state.candidates.len())
                    .filter(|&i| state.candidates[i].rank == rank && !state.candidates[i].sticky_only)
                    .collect();
                let want = alt.min_replicas.unwrap_or(0).max(0) as u32;
                while state.remaining > 0 && (!phase_min || state.per_rank[ai] < want) {
                    let pick = if proportional { self.proportional_order(state, &ids) } else { ids.clone() };
                    if !self.place(state, &pick, shape, spread, d) {
                        break;
                    }
                    progress = true;
                }
            }
            if phase_min {
                phase_min = false;
                continue;
            }
            if !progress || state.remaining == 0 {
                break;
            }
        }
    }

    /// The assignments of a deployment from its placements — (cluster, pool, fallback rank,
    /// replicas, price per replica) — sorted by cluster, pool and rank. A pool's shared nodes and
    /// those a claim set aside for this deployment are one pool to the member: one assignment.
    pub(super) fn assignments(&self, placed: impl Iterator<Item = (usize, usize, u32, u32, u64)>) -> Vec<Assignment> {
        let clusters = &self.snapshot.clusters;
        let mut assignments: Vec<Assignment> = placed
            .map(|(ci, pi, rank, count, price)| {
                let pool = &clusters[ci].pools[pi];
                Assignment {
                    cluster: clusters[ci].name.clone(),
                    pool: pool.name.clone(),
                    class: pool.class.clone(),
                    capacity_type: pool.capacity_type.unwrap_or(flotilla_apis::CapacityType::OnDemand),
                    fallback_rank: rank,
                    replicas: count,
                    cost_micros_per_hour: price * u64::from(count),
                }
            })
            .collect();
        assignments.sort_by(|a, b| {
            a.cluster.cmp(&b.cluster).then(a.pool.cmp(&b.pool)).then(a.fallback_rank.cmp(&b.fallback_rank))
        });
        assignments.dedup_by(|b, a| {
            let same = (&a.cluster, &a.pool, a.fallback_rank, &a.class, a.capacity_type)
                == (&b.cluster, &b.pool, b.fallback_rank, &b.class, b.capacity_type);
            if same {
                a.replicas += b.replicas;
                a.cost_micros_per_hour += b.cost_micros_per_hour;
            }
            same
        });
        assignments
    }

    /// Builds the deployment's plan from the final state.
    pub(super) fn finish(
        &mut self,
        d: &DeploymentView,
        state: &Placing,
        verdicts: Vec<Vec<Verdict>>,
        static_block: Blocks,
        pool_blocks: Blocks,
        shape: &ReplicaShape,
    ) -> DeploymentPlan {
        let clusters = &self.snapshot.clusters;
        let assignments = self.assignments(
            state
                .candidates
                .iter()
                .filter(|c| c.placed > 0)
                .map(|c| (c.cluster, c.pool, c.rank, c.placed, c.replica_price)),
        );
        let unmet_minimums = unmet_minimums(d, |rank| state.per_rank[rank as usize - 1]);
        let took: std::collections::BTreeSet<usize> =
            state.candidates.iter().filter(|c| c.placed > 0).map(|c| c.cluster).collect();
        let mut rejections = Vec::new();
        if state.remaining > 0 || self.explain {
            let row = self.statics.row(&d.spec.placement, clusters);
            for (ci, cluster) in clusters.iter().enumerate() {
                // With replicas unplaced every refusing cluster is reported, including those
                // that took some; in explain mode only those that took none.
                if took.contains(&ci) && state.remaining == 0 {
                    continue;
                }
                let placing = || state.blocks.get(&ci).map(|r| self.said(ci, r, shape));
                let (reason, message) =
                    match static_block.get(&ci).cloned().or_else(placing).or_else(|| pool_blocks.get(&ci).cloned()) {
                        // A static refusal recorded without words: say them now, for this cluster only.
                        Some((r, m)) if m.is_empty() && static_block.contains_key(&ci) => {
                            let sticky = d.current.iter().any(|p| p.cluster == cluster.name && p.desired > 0);
                            let words = if sticky {
                                crate::filters::refusal_words(&d.spec.placement, cluster, true)
                            } else {
                                row.words(ci, &d.spec.placement, cluster)
                            };
                            (r, words)
                        }
                        Some(r) => r,
                        None => continue,
                    };
                rejections.push(Rejection { cluster: cluster.name.clone(), reason, message });
            }
        }
        let explanation = self.explain.then(|| {
            clusters
                .iter()
                .enumerate()
                .map(|(ci, cluster)| ClusterExplanation {
                    cluster: cluster.name.clone(),
                    verdicts: verdicts.get(ci).cloned().unwrap_or_default(),
                    candidates: state
                        .candidates
                        .iter()
                        .filter(|c| c.cluster == ci)
                        .map(|c| {
                            let pool = &cluster.pools[c.pool];
                            CandidateScore {
                                pool: pool.name.clone(),
                                class: pool.class.clone(),
                                fallback_rank: c.rank,
                                capacity_type: pool.capacity_type.unwrap_or(flotilla_apis::CapacityType::OnDemand),
                                capacity_type_rank: c.capacity_type_rank,
                                replica_price_micros: c.replica_price,
                                sticky: d.current.iter().any(|p| p.cluster == cluster.name && p.pool == pool.name),
                                cache_ready: c.cache_ready,
                                free_replica_slots: c.initial_slots,
                            }
                        })
                        .collect(),
                    placed: state.candidates.iter().filter(|c| c.cluster == ci).map(|c| c.placed).sum(),
                })
                .collect()
        });
        DeploymentPlan {
            namespace: d.namespace.clone(),
            name: d.name.clone(),
            model: d.spec.model.name.clone(),
            desired: d.spec.replicas.max(0) as u32,
            assignments,
            unplaced: state.remaining,
            unmet_minimums,
            cost_micros_per_hour: state.cost,
            rejections,
            explanation,
            invalid: None,
            moves: Vec::new(),
            preemptions: Vec::new(),
            trade: None,
        }
    }
}

/// The alternatives whose `minReplicas` the placement does not meet; `placed(rank)` is how many
/// replicas it put on the alternative of that fallback rank (1-based).
pub(super) fn unmet_minimums(d: &DeploymentView, placed: impl Fn(u32) -> u32) -> Vec<UnmetMinimum> {
    d.spec
        .devices
        .alternatives
        .iter()
        .enumerate()
        .filter_map(|(ai, alt)| {
            let rank = ai as u32 + 1;
            let wanted = alt.min_replicas.unwrap_or(0).max(0) as u32;
            let got = placed(rank);
            (got < wanted).then_some(UnmetMinimum { rank, wanted, placed: got })
        })
        .collect()
}

#[path = "refill.rs"]
mod refill;
