//! Building a deployment's candidates: every cluster through the static filters (selector,
//! sovereignty, readiness, cordon, taints), then every (pool, alternative) of a passing cluster
//! through the device match, node fit, capacity type and price, with the first refusal of each
//! cluster kept for the report; and the documented ranking of what passed.

use flotilla_apis::CapacityType;

use super::place::stage;
use super::{Blocks, Candidate, Ctx, PerCluster};
use crate::devices::{ClassMatch, ReplicaShape, misfit};
use crate::filters::{Row, first_refusal, prefers_not, static_verdicts};
use crate::plan::{Reason, Verdict};
use crate::snapshot::{ClusterView, DeploymentView};

/// What scanning the clusters found for one deployment: its candidates (unranked), and for
/// the report the filter verdicts (explain mode), each cluster's static refusal, its most
/// telling pool refusal and where that was, and which classes each alternative accepts.
pub(super) struct Scan {
    pub verdicts: Vec<Vec<Verdict>>,
    pub static_block: Blocks,
    pub pool_blocks: Blocks,
    pub pool_block_at: PerCluster<(usize, usize)>,
    pub candidates: Vec<Candidate>,
    pub class_matches: Vec<Vec<ClassMatch>>,
}

/// What candidates read of a class, computed once per solve: devices per node, and the price
/// per node of each capacity type (parsed once, not per candidate).
pub(super) struct ClassFacts {
    per_node: u32,
    prices: [Option<u64>; 3],
}

impl ClassFacts {
    pub(super) fn of(class: &crate::snapshot::ClassView) -> Self {
        use flotilla_apis::CapacityType::{OnDemand, Reserved, Spot};
        let p = class.prices();
        Self { per_node: class.devices_per_node(), prices: [p.micros(Reserved), p.micros(OnDemand), p.micros(Spot)] }
    }

    /// The price per node hour of `capacity_type`, in micros, if the class has one.
    pub(super) fn price(&self, capacity_type: flotilla_apis::CapacityType) -> Option<u64> {
        use flotilla_apis::CapacityType::{OnDemand, Reserved, Spot};
        match capacity_type {
            Reserved => self.prices[0],
            OnDemand => self.prices[1],
            Spot => self.prices[2],
        }
    }
}

/// What the candidates of one deployment on one cluster share (`Ctx::here`).
#[derive(Clone, Copy)]
struct Here {
    prefer_not: bool,
    cache_ready: bool,
}

/// The first static filter that refuses cluster `ci` to `d`: the policy's memoized `row` where
/// `d` does not run, judged as sticky where it does (a cordon or a `NoSchedule` taint keeps
/// the replicas it runs there).
fn static_refusal(d: &DeploymentView, row: &Row, ci: usize, cluster: &ClusterView) -> Option<Reason> {
    if d.current.iter().any(|p| p.cluster == cluster.name && p.desired > 0) {
        first_refusal(&d.spec.placement, cluster, true)
    } else {
        row.refusal(ci)
    }
}

impl Scan {
    /// Nothing to report: a deployment whose every replica was placed, outside explain mode.
    pub(super) fn empty() -> Self {
        Self {
            verdicts: Vec::new(),
            static_block: PerCluster::with_len(0),
            pool_blocks: PerCluster::with_len(0),
            pool_block_at: PerCluster::with_len(0),
            candidates: Vec::new(),
            class_matches: Vec::new(),
        }
    }
}

impl Ctx<'_, '_> {
    /// Which classes each of `d`'s alternatives accepts: a handful of classes, matched once,
    /// looked up by the pools' class indexes.
    pub(super) fn class_matches(&mut self, d: &DeploymentView) -> Vec<Vec<ClassMatch>> {
        d.spec
            .devices
            .alternatives
            .iter()
            .map(|alt| self.snapshot.classes.keys().map(|c| self.matcher.matches(alt, c)).collect())
            .collect()
    }

    /// `d`'s candidates alone (unranked), as [`Self::scan`] builds them and counting the same
    /// evaluations, without the refusals: most deployments place every replica and report
    /// none, so the refusals are found ([`Self::scan`] with `count` false) only for those left
    /// short.
    pub(super) fn candidates(
        &mut self,
        d: &DeploymentView,
        shape: &ReplicaShape,
        cap_types: &[CapacityType],
        max_cost: Option<u64>,
    ) -> Vec<Candidate> {
        let policy = &d.spec.placement;
        let clusters = &self.snapshot.clusters;
        let mut candidates = std::mem::take(self.spare);
        candidates.clear();
        let class_matches = self.class_matches(d);
        let own_claim = flotilla_apis::names::owner_key(&d.namespace, &d.name);
        let row = self.statics.row(policy, clusters);
        for (ci, cluster) in clusters.iter().enumerate() {
            if static_refusal(d, &row, ci, cluster).is_some() {
                continue;
            }
            let here = self.here(d, cluster);
            for (pi, pool) in cluster.pools.iter().enumerate() {
                if pool.reserved_for_another(&own_claim) {
                    continue;
                }
                *self.evaluations += class_matches.len() as u64;
                let class = self.pool_class[ci][pi];
                for (ai, accepts) in class_matches.iter().enumerate() {
                    if !matches!(class.and_then(|ix| accepts.get(ix)), Some(ClassMatch::Match)) {
                        continue;
                    }
                    let rank = ai as u32 + 1;
                    if let Ok(c) = self.candidate(d, cluster, ci, pi, rank, here, shape, cap_types, max_cost, false) {
                        candidates.push(c);
                    }
                }
            }
        }
        candidates
    }

    /// Every cluster and (pool, alternative) of `d` evaluated once: the candidates and the
    /// refusals. `count`: the evaluations count against the solve's budget (false when
    /// [`Self::candidates`] counted them already).
    pub(super) fn scan(
        &mut self,
        d: &DeploymentView,
        shape: &ReplicaShape,
        cap_types: &[CapacityType],
        max_cost: Option<u64>,
        count: bool,
    ) -> Scan {
        let spec = &d.spec;
        let policy = &spec.placement;
        let clusters = &self.snapshot.clusters;
        let mut verdicts: Vec<Vec<Verdict>> = Vec::with_capacity(clusters.len());
        let mut static_block: Blocks = PerCluster::with_len(clusters.len());
        let mut pool_blocks: Blocks = PerCluster::with_len(clusters.len());
        let mut pool_block_at: PerCluster<(usize, usize)> = PerCluster::with_len(clusters.len());
        let mut candidates: Vec<Candidate> = Vec::new();
        let class_matches = self.class_matches(d);
        let own_claim = flotilla_apis::names::owner_key(&d.namespace, &d.name);
        let row = self.statics.row(policy, clusters);
        for (ci, cluster) in clusters.iter().enumerate() {
            // Verdicts with words only in explain mode; otherwise just the first refusal
            // (finish() says the words for what it reports).
            let v = if self.explain {
                let sticky_here = d.current.iter().any(|p| p.cluster == cluster.name && p.desired > 0);
                static_verdicts(policy, cluster, sticky_here, true)
            } else {
                Vec::new()
            };
            let refusal = if self.explain {
                v.iter().find(|v| !v.pass).map(|f| f.reason.unwrap_or(Reason::ClusterNotReady))
            } else {
                static_refusal(d, &row, ci, cluster)
            };
            if let Some(reason) = refusal {
                let words = v.iter().find(|v| !v.pass).map(|f| f.detail.clone()).unwrap_or_default();
                static_block.insert(ci, (reason, words));
                if self.explain {
                    verdicts.push(v);
                }
                continue;
            }
            let before = candidates.len();
            let mut device_verdicts = Vec::new();
            for (pi, pool) in cluster.pools.iter().enumerate() {
                if pool.reserved_for_another(&own_claim) {
                    continue;
                }
                for (ai, accepts) in class_matches.iter().enumerate() {
                    *self.evaluations += u64::from(count);
                    let rank = ai as u32 + 1;
                    let words = self.explain;
                    let outcome = self.evaluate(d, ci, pi, ai, accepts, shape, cap_types, max_cost, words);
                    match outcome {
                        Ok(c) => candidates.push(c),
                        Err((reason, msg)) => {
                            let device = |(p, a): (usize, usize)| {
                                self.pool_class[ci][p].and_then(|ix| class_matches.get(a).and_then(|m| m.get(ix)))
                            };
                            let better = pool_blocks.get(&ci).is_none_or(|(r, _)| {
                                let best = pool_block_at.get(&ci).copied().and_then(device);
                                stage(reason, device((pi, ai))) > stage(*r, best)
                            });
                            if !better && !self.explain {
                                continue;
                            }
                            if better {
                                pool_block_at.insert(ci, (pi, ai));
                            }
                            // Without explain the words are said later, only for what is reported.
                            let msg =
                                if words { format!("pool {} (alternative {rank}): {msg}", pool.name) } else { msg };
                            if self.explain {
                                device_verdicts.push(Verdict {
                                    filter: "devices",
                                    pass: false,
                                    reason: Some(reason),
                                    detail: msg.clone(),
                                });
                            }
                            if better {
                                pool_blocks.insert(ci, (reason, msg));
                            }
                        }
                    }
                }
            }
            let mut v = v;
            if candidates.len() == before && cluster.pools.is_empty() {
                pool_blocks.insert(ci, (Reason::NoMatchingDevices, "cluster has no pools".into()));
            }
            if self.explain {
                v.extend(device_verdicts);
                verdicts.push(v);
            }
        }
        Scan { verdicts, static_block, pool_blocks, pool_block_at, candidates, class_matches }
    }

    /// Orders candidates by the documented ranking: where it runs now, a claim's own nodes,
    /// no `PreferNoSchedule` taint, capacity-type preference, a Ready ModelCache, price, then
    /// cluster name, pool and fallback rank. No two candidates share (cluster, pool, rank), so
    /// the order is total and an unstable sort gives the one order a stable sort would. The
    /// keys are sorted, not the candidates (larger, and moved at every swap).
    pub(super) fn rank_candidates(&self, candidates: &mut [Candidate]) {
        // (flags, price, cluster name) in one integer, then (pool, rank): the documented order.
        let mut keys: Vec<(u128, u64, usize)> = candidates
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let flags = (u32::from(c.sticky_quota == 0) << 31)
                    | (u32::from(!c.reserved) << 30)
                    | (u32::from(c.prefer_not) << 29)
                    | (c.capacity_type_rank.min(0xff_ffff) << 1)
                    | u32::from(!c.cache_ready);
                let first = (u128::from(flags) << 96)
                    | (u128::from(c.replica_price) << 32)
                    | u128::from(self.name_rank[c.cluster]);
                let pool = u32::try_from(c.pool).unwrap_or(u32::MAX);
                (first, (u64::from(pool) << 32) | u64::from(c.rank), i)
            })
            .collect();
        keys.sort_unstable();
        // Position i takes the candidate at keys[i].2: applied in place, one cycle at a time
        // (a second vector of candidates costs a large fresh allocation per deployment).
        for start in 0..keys.len() {
            if keys[start].2 == start {
                continue;
            }
            let first = candidates[start];
            let mut at = start;
            loop {
                let from = std::mem::replace(&mut keys[at].2, at);
                if from == start {
                    candidates[at] = first;
                    break;
                }
                candidates[at] = candidates[from];
                at = from;
            }
        }
    }

    /// One (pool, alternative): a candidate, or the refusal (with words when asked). The caller
    /// has passed the cluster through the static filters, as sticky where `d` runs on it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn evaluate(
        &self,
        d: &DeploymentView,
        ci: usize,
        pi: usize,
        ai: usize,
        accepts: &[ClassMatch],
        shape: &ReplicaShape,
        cap_types: &[CapacityType],
        max_cost: Option<u64>,
        words: bool,
    ) -> Result<Candidate, (Reason, String)> {
        let cluster = &self.snapshot.clusters[ci];
        let say = |s: &String| if words { s.clone() } else { String::new() };
        match self.pool_class[ci][pi].and_then(|ix| accepts.get(ix)) {
            Some(ClassMatch::Match) => {
                let here = self.here(d, cluster);
                self.candidate(d, cluster, ci, pi, ai as u32 + 1, here, shape, cap_types, max_cost, words)
            }
            Some(ClassMatch::NoMatch(why) | ClassMatch::OtherClass(why)) => Err((Reason::NoMatchingDevices, say(why))),
            Some(ClassMatch::Error(why) | ClassMatch::ClassInvalid(why)) => Err((Reason::SelectorError, say(why))),
            None => Err((Reason::NoMatchingDevices, say(&format!("class {} is not defined", cluster.pools[pi].class)))),
        }
    }

    /// What every candidate of `d` on `cluster` shares: an untolerated `PreferNoSchedule`
    /// taint, and `d`'s ModelCache Ready there.
    fn here(&self, d: &DeploymentView, cluster: &ClusterView) -> Here {
        Here {
            prefer_not: prefers_not(&d.spec.placement, cluster),
            // A score term, never a filter: a cold cluster still takes replicas (the cache is
            // staged there first); it only ranks after warm ones of the same capacity-type rank.
            cache_ready: self.cache.as_ref().is_some_and(|k| cluster.ready_caches.contains(k)),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn candidate(
        &self,
        d: &DeploymentView,
        cluster: &ClusterView,
        ci: usize,
        pi: usize,
        rank: u32,
        shared: Here,
        shape: &ReplicaShape,
        cap_types: &[CapacityType],
        max_cost: Option<u64>,
        words: bool,
    ) -> Result<Candidate, (Reason, String)> {
        // Refusals carry words only when asked: the hot pass needs the reason alone.
        let say = |f: &dyn Fn() -> String| if words { f() } else { String::new() };
        let pool = &cluster.pools[pi];
        let Some(class) = self.pool_class[ci][pi].and_then(|ix| self.class_facts.get(ix)) else {
            return Err((Reason::NoMatchingDevices, say(&|| "class not defined".into())));
        };
        let per_node = class.per_node;
        if shape.largest_pod() > per_node {
            return Err((Reason::DoesNotFitNode, say(&|| misfit(shape, &[], per_node).1)));
        }
        if shape.distinct_nodes && shape.pods.len() > pool.free_per_node.len() {
            return Err((
                Reason::InsufficientDevices,
                say(&|| {
                    format!("a replica spans {} nodes; the pool has {}", shape.pods.len(), pool.free_per_node.len())
                }),
            ));
        }
        let Some(cap) = pool.capacity_type else {
            return Err((Reason::CapacityTypeNotAllowed, say(&|| "pool declares no capacity type".into())));
        };
        let Some(cap_rank) = cap_types.iter().position(|t| *t == cap) else {
            return Err((
                Reason::CapacityTypeNotAllowed,
                say(&|| {
                    let allowed: Vec<_> = cap_types.iter().map(|t| t.as_str()).collect();
                    format!("nodes are {cap}; the deployment allows [{}]", allowed.join(", "))
                }),
            ));
        };
        let node_price = class.price(cap);
        if node_price.is_none() && max_cost.is_some() {
            return Err((
                Reason::NoPrice,
                say(&|| format!("class {} has no {cap} price and a cost ceiling is set", pool.class)),
            ));
        }
        let replica_price = node_price
            .map_or(0, |p| (u128::from(p) * u128::from(shape.devices()) / u128::from(per_node.max(1))) as u64);
        // Replicas the member's scheduler refused here are not kept: they are placed anew.
        let here = || d.current.iter().filter(|p| p.cluster == cluster.name && p.pool == pool.name);
        let sticky_quota: u32 = here()
            .filter(|p| p.fallback_rank.max(1) as u32 == rank)
            .map(|p| (p.desired - p.unschedulable.max(0)).max(0) as u32)
            .sum();
        let refused: u32 = here().map(|p| p.unschedulable.max(0) as u32).sum();
        // Read only by a proportional split and by explain: counted only for them.
        let proportional = d.spec.placement.split == Some(flotilla_apis::deployment::SplitStrategy::Proportional);
        let initial_slots = if proportional || self.explain { shape.count(&self.free[(ci, pi)], u32::MAX) } else { 0 };
        // A pool backed off for this deployment, or whose scheduler found no node with room
        // for a pod this size (any deployment's refusal), takes no new replica of it.
        let backed_off = d.refused_pools.iter().any(|r| r.cluster == cluster.name && r.pool == pool.name);
        let short = pool.refused_block.is_some_and(|b| shape.largest_pod() >= b);
        // The cluster passed the static filters (the caller's check), as sticky where `d` runs
        // on it: only there can they refuse new replicas (a cordon, a `NoSchedule` taint).
        let runs_here = || d.current.iter().any(|p| p.cluster == cluster.name && p.desired > 0);
        let sticky_only = refused > 0
            || backed_off
            || short
            || (runs_here() && first_refusal(&d.spec.placement, cluster, false).is_some());
        Ok(Candidate {
            cluster: ci,
            pool: pi,
            rank,
            capacity_type_rank: cap_rank as u32,
            prefer_not: shared.prefer_not,
            cache_ready: shared.cache_ready,
            replica_price,
            sticky_quota,
            sticky_only,
            refused,
            reserved: pool.reserved_for.is_some(),
            initial_slots,
            placed: 0,
            kept: 0,
        })
    }
}
