//! The solver. Deployments are taken in a stable order (priority, creation, name); for each,
//! clusters are filtered (selector, sovereignty, readiness, taints), (pool, alternative)
//! candidates are built (device match, node fit, capacity type, price) and ranked (stickiness,
//! capacity-type preference, a ModelCache already Ready there, price, name), then replicas are placed one at a time — current
//! placements first, then per-alternative minimums, then the rest in fallback order — each one
//! consuming the pool's free devices, within spread, `maxReplicas` and the cost ceiling (held
//! back for the most replicas it can pay for, `ceiling.rs`). Then a bounded improvement phase
//! moves equal- or lower-priority replicas to place what the greedy pass left out
//! (`improve.rs`).

use flotilla_apis::common::parse_price_micros;
use flotilla_apis::deployment::SplitStrategy;

use crate::devices::{ClassMatch, DeviceMatcher, ReplicaShape, misfit};
use crate::filters::{first_refusal, prefers_not, static_verdicts};
use crate::plan::{DeploymentPlan, InvalidSpec, Plan, Reason, Rejection, Verdict};
use crate::snapshot::{ClusterView, DeploymentView, FleetSnapshot};

/// Knobs of one solve. No clock: the budget counts candidate evaluations, so a solve that
/// runs out of budget runs out at the same point every time.
#[derive(Clone, Debug)]
pub struct SolveOptions {
    /// Record filter verdicts and scores for this deployment (`namespace`, `name`).
    pub explain: Option<(String, String)>,
    /// Candidate evaluations allowed before the remaining deployments are left unsolved
    /// (reason `BudgetExhausted`; a controller keeps their current placements).
    pub max_evaluations: u64,
    /// Work units (candidate evaluations and node visits while re-packing pools) the
    /// improvement phase may spend after the greedy pass; 0 turns it off. Counted, not timed:
    /// a solve that runs out stops at the same point every time.
    pub max_improvement: u64,
}

impl Default for SolveOptions {
    fn default() -> Self {
        Self { explain: None, max_evaluations: 200_000_000, max_improvement: 1_000_000 }
    }
}

/// One (cluster, pool, alternative) a deployment may use.
#[derive(Clone, Debug)]
struct Candidate {
    cluster: usize,
    pool: usize,
    rank: u32,
    capacity_type_rank: u32,
    prefer_not: bool,
    /// The deployment's ModelCache is Ready in the cluster: replicas start without a download.
    cache_ready: bool,
    replica_price: u64,
    sticky_quota: u32,
    /// Only current replicas may stay (cordoned, a `NoSchedule` taint, or replicas the
    /// member's scheduler refused here): no new ones.
    sticky_only: bool,
    /// Replicas of this deployment the member's scheduler refused in this pool (status
    /// `placements[].unschedulable`): not kept here, placed elsewhere.
    refused: u32,
    /// Nodes a CapacityClaim of this deployment obtained: used before shared capacity.
    reserved: bool,
    initial_slots: u32,
    placed: u32,
    /// Of `placed`, replicas kept where they already run (never moved by `improve`).
    kept: u32,
}

/// Solves the whole fleet. Same snapshot and options in, same plan out.
pub fn solve(snapshot: &FleetSnapshot, options: &SolveOptions) -> Plan {
    let mut free: Vec<Vec<Vec<u32>>> =
        snapshot.clusters.iter().map(|c| c.pools.iter().map(|p| p.free_per_node.clone()).collect()).collect();
    let mut matcher = DeviceMatcher::new(&snapshot.classes);
    let order = solve_order(snapshot);
    // Each cluster's position in name order, so ranking compares integers, not strings.
    let mut by_name: Vec<usize> = (0..snapshot.clusters.len()).collect();
    by_name.sort_by(|a, b| snapshot.clusters[*a].name.cmp(&snapshot.clusters[*b].name));
    let mut name_rank = vec![0u32; by_name.len()];
    for (rank, ci) in by_name.into_iter().enumerate() {
        name_rank[ci] = rank as u32;
    }
    let class_ix: std::collections::HashMap<&str, usize> =
        snapshot.classes.keys().enumerate().map(|(i, c)| (c.as_str(), i)).collect();
    let pool_class: Vec<Vec<Option<usize>>> = snapshot
        .clusters
        .iter()
        .map(|c| c.pools.iter().map(|p| class_ix.get(p.class.as_str()).copied()).collect())
        .collect();
    let domains = place::DomainIndex::new(&snapshot.clusters);
    let mut evaluations = 0u64;
    let mut plan = Plan::default();
    let mut held: Vec<Vec<held::Held>> = Vec::with_capacity(order.len());
    for &d in &order {
        let explain = options.explain.as_ref().is_some_and(|(ns, n)| *ns == d.namespace && *n == d.name);
        if evaluations > options.max_evaluations {
            plan.deployments.push(budget_exhausted(d));
            held.push(Vec::new());
            continue;
        }
        let mut ctx = Ctx {
            snapshot,
            free: &mut free,
            matcher: &mut matcher,
            evaluations: &mut evaluations,
            explain,
            name_rank: &name_rank,
            pool_class: &pool_class,
            domains: &domains,
            cache: d.spec.model.cache_ref.as_deref().map(|c| crate::snapshot::cache_key(&d.namespace, c)),
        };
        let (p, h) = ctx.solve_one(d);
        plan.deployments.push(p);
        held.push(h);
    }
    if options.max_improvement > 0 && plan.deployments.iter().any(|p| p.unplaced > 0) {
        let mut ctx = Ctx {
            snapshot,
            free: &mut free,
            matcher: &mut matcher,
            evaluations: &mut evaluations,
            explain: false,
            name_rank: &name_rank,
            pool_class: &pool_class,
            domains: &domains,
            cache: None,
        };
        ctx.improve(&order, &mut plan.deployments, &mut held, options.max_improvement);
    }
    plan
}

/// Deployments in the order they are solved: priority (highest first), creation, namespace,
/// name.
fn solve_order(snapshot: &FleetSnapshot) -> Vec<&DeploymentView> {
    let mut order: Vec<&DeploymentView> = snapshot.deployments.iter().collect();
    order.sort_by(|a, b| {
        b.priority()
            .cmp(&a.priority())
            .then(a.created.cmp(&b.created))
            .then(a.namespace.cmp(&b.namespace))
            .then(a.name.cmp(&b.name))
    });
    order
}

fn budget_exhausted(d: &DeploymentView) -> DeploymentPlan {
    let message = "the solver's evaluation budget ran out before this deployment; current placements are kept";
    unplaced(d, Reason::BudgetExhausted, message.into())
}

/// A deployment whose spec cannot be used: nothing placed, nothing consumed, one rejection
/// that names the field, and the field again in `invalid` for the controller's `InvalidSpec`.
fn invalid_spec(d: &DeploymentView, field: String, message: String) -> DeploymentPlan {
    let rejection = format!("{field}: {message}");
    DeploymentPlan { invalid: Some(InvalidSpec { field, message }), ..unplaced(d, Reason::SelectorError, rejection) }
}

/// Every replica of `d` unplaced, for one reason that holds on every cluster (`*`).
fn unplaced(d: &DeploymentView, reason: Reason, message: String) -> DeploymentPlan {
    DeploymentPlan {
        namespace: d.namespace.clone(),
        name: d.name.clone(),
        model: d.spec.model.name.clone(),
        desired: d.spec.replicas.max(0) as u32,
        unplaced: d.spec.replicas.max(0) as u32,
        rejections: vec![Rejection { cluster: "*".into(), reason, message }],
        ..Default::default()
    }
}

struct Ctx<'a, 's> {
    snapshot: &'s FleetSnapshot,
    free: &'a mut Vec<Vec<Vec<u32>>>,
    matcher: &'a mut DeviceMatcher<'s>,
    evaluations: &'a mut u64,
    explain: bool,
    name_rank: &'a [u32],
    /// Per cluster, per pool: the index of the pool's class in `snapshot.classes`.
    pool_class: &'a [Vec<Option<usize>>],
    /// Spread domains as indexes.
    domains: &'a place::DomainIndex,
    /// The deployment's ModelCache (`cacheRef`) as a `ready_caches` key, if any.
    cache: Option<String>,
}

/// What blocked the last attempt on a cluster, for the rejection report.
type Blocks = PerCluster<(Reason, String)>;

/// A dense map keyed by cluster index (cheaper than a tree on the solver's hot path).
pub(super) struct PerCluster<T>(Vec<Option<T>>);

impl<T> PerCluster<T> {
    fn with_len(n: usize) -> Self {
        Self(std::iter::repeat_with(|| None).take(n).collect())
    }

    pub(super) fn get(&self, ci: &usize) -> Option<&T> {
        self.0.get(*ci).and_then(Option::as_ref)
    }

    pub(super) fn insert(&mut self, ci: usize, v: T) {
        if let Some(slot) = self.0.get_mut(ci) {
            *slot = Some(v);
        }
    }

    pub(super) fn contains_key(&self, ci: &usize) -> bool {
        self.get(ci).is_some()
    }
}

impl Ctx<'_, '_> {
    /// One deployment's plan, and where its replicas went (for `improve`).
    fn solve_one(&mut self, d: &DeploymentView) -> (DeploymentPlan, Vec<held::Held>) {
        if let Some((field, message)) = self.matcher.invalid_selector(&d.spec.devices.alternatives) {
            return (invalid_spec(d, field, message), Vec::new());
        }
        let spec = &d.spec;
        let policy = &spec.placement;
        let shape = ReplicaShape::of(&spec.topology);
        let cap_types = policy.capacity_types_or_default();
        let max_cost = policy.max_cost_per_hour.as_deref().and_then(parse_price_micros);
        let desired = spec.replicas.max(0) as u32;
        let clusters = &self.snapshot.clusters;

        let mut verdicts: Vec<Vec<Verdict>> = Vec::with_capacity(clusters.len());
        let mut static_block: Blocks = PerCluster::with_len(clusters.len());
        let mut pool_blocks: Blocks = PerCluster::with_len(clusters.len());
        let mut pool_block_at: PerCluster<(usize, usize)> = PerCluster::with_len(clusters.len());
        let mut candidates: Vec<Candidate> = Vec::new();
        // Which classes each alternative accepts: a handful of classes, matched once, looked up
        // by the pools' class indexes.
        let class_matches: Vec<Vec<ClassMatch>> = spec
            .devices
            .alternatives
            .iter()
            .map(|alt| self.snapshot.classes.keys().map(|c| self.matcher.matches(alt, c)).collect())
            .collect();
        let own_claim = format!("{}.{}", d.namespace, d.name);
        for (ci, cluster) in clusters.iter().enumerate() {
            let sticky_here = d.current.iter().any(|p| p.cluster == cluster.name && p.desired > 0);
            // Verdicts with words only in explain mode; otherwise just the first refusal
            // (finish() says the words for what it reports).
            let v = if self.explain { static_verdicts(policy, cluster, sticky_here, true) } else { Vec::new() };
            let refusal = if self.explain {
                v.iter().find(|v| !v.pass).map(|f| f.reason.unwrap_or(Reason::ClusterNotReady))
            } else {
                first_refusal(policy, cluster, sticky_here)
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
                // Capacity a claim obtained is its owner's alone.
                if pool.reserved_for.as_ref().is_some_and(|k| *k != own_claim) {
                    continue;
                }
                for (ai, accepts) in class_matches.iter().enumerate() {
                    *self.evaluations += 1;
                    let rank = ai as u32 + 1;
                    let words = self.explain;
                    let outcome = self.evaluate(d, ci, pi, ai, accepts, &shape, &cap_types, max_cost, words);
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
        self.rank_candidates(&mut candidates);

        let mut state = Placing {
            candidates,
            remaining: desired,
            cost: 0,
            max_cost,
            per_rank: vec![0; spec.devices.alternatives.len()],
            domains: vec![0; clusters.len()],
            blocks: PerCluster::with_len(clusters.len()),
            reserve: None,
        };
        let spread = policy.spread.as_ref().map(|s| (s.by, s.max_skew.max(1) as u32));
        let proportional = policy.split == Some(SplitStrategy::Proportional);

        // 1. Current placements, round-robin so spread can hold.
        loop {
            let mut progress = false;
            for i in 0..state.candidates.len() {
                if state.remaining == 0 {
                    break;
                }
                if state.candidates[i].sticky_quota > 0 && self.place(&mut state, &[i], &shape, spread, d) {
                    state.candidates[i].sticky_quota -= 1;
                    state.candidates[i].kept += 1;
                    progress = true;
                }
            }
            if !progress || state.remaining == 0 {
                break;
            }
        }
        // 2. Per-alternative minimums, 3. the rest in fallback order, within the ceiling's hold.
        state.reserve = self.reserve(&state.candidates, &shape, desired, state.placed(), state.cost, max_cost);
        self.fill(&mut state, d, &shape, spread, proportional, true);
        // A ceiling hold that spread or `maxReplicas` made unreachable: place what the plain
        // ceiling allows.
        if state.remaining > 0 && state.reserve.take().is_some() {
            self.fill(&mut state, d, &shape, spread, proportional, false);
        }
        // Clusters that keep replicas only because they already run them say why no more come.
        for c in state.candidates.iter().filter(|c| c.sticky_only) {
            let cluster = &clusters[c.cluster];
            if c.refused > 0 {
                let pool = &cluster.pools[c.pool].name;
                pool_blocks.insert(
                    c.cluster,
                    (
                        Reason::ReplicasUnschedulable,
                        format!(
                            "pool {pool}: the member's scheduler refused {} replica(s) of this deployment there; they \
                             are placed elsewhere and no more come while any are refused",
                            c.refused
                        ),
                    ),
                );
                continue;
            }
            if let Some(v) = static_verdicts(policy, cluster, false, true).into_iter().find(|v| !v.pass) {
                pool_blocks.insert(
                    c.cluster,
                    (v.reason.unwrap_or(Reason::ClusterCordoned), format!("{}; replicas already there stay", v.detail)),
                );
            }
        }
        // Say the words of the pool refusals that will be reported.
        if state.remaining > 0 && !self.explain {
            for (ci, cluster) in clusters.iter().enumerate() {
                let (Some((pi, ai)), Some((_, m))) = (pool_block_at.get(&ci).copied(), pool_blocks.get(&ci)) else {
                    continue;
                };
                if !m.is_empty() {
                    continue;
                }
                let said = self.evaluate(d, ci, pi, ai, &class_matches[ai], &shape, &cap_types, max_cost, true);
                if let Err((reason, msg)) = said {
                    let pool = &cluster.pools[pi].name;
                    pool_blocks.insert(ci, (reason, format!("pool {pool} (alternative {}): {msg}", ai + 1)));
                }
            }
        }
        let held = held::Held::of(&state.candidates);
        (self.finish(d, state, verdicts, static_block, pool_blocks, &shape), held)
    }

    /// Orders candidates by the documented ranking: where it runs now, a claim's own nodes,
    /// no `PreferNoSchedule` taint, capacity-type preference, a Ready ModelCache, price, then
    /// cluster name, pool and fallback rank.
    fn rank_candidates(&self, candidates: &mut [Candidate]) {
        candidates.sort_by(|a, b| {
            (b.sticky_quota > 0)
                .cmp(&(a.sticky_quota > 0))
                .then(b.reserved.cmp(&a.reserved))
                .then(a.prefer_not.cmp(&b.prefer_not))
                .then(a.capacity_type_rank.cmp(&b.capacity_type_rank))
                .then(b.cache_ready.cmp(&a.cache_ready))
                .then(a.replica_price.cmp(&b.replica_price))
                .then(self.name_rank[a.cluster].cmp(&self.name_rank[b.cluster]))
                .then(a.pool.cmp(&b.pool))
                .then(a.rank.cmp(&b.rank))
        });
    }

    /// One (pool, alternative): a candidate, or the refusal (with words when asked).
    #[allow(clippy::too_many_arguments)]
    fn evaluate(
        &self,
        d: &DeploymentView,
        ci: usize,
        pi: usize,
        ai: usize,
        accepts: &[ClassMatch],
        shape: &ReplicaShape,
        cap_types: &[flotilla_apis::CapacityType],
        max_cost: Option<u64>,
        words: bool,
    ) -> Result<Candidate, (Reason, String)> {
        let cluster = &self.snapshot.clusters[ci];
        let say = |s: &String| if words { s.clone() } else { String::new() };
        match self.pool_class[ci][pi].and_then(|ix| accepts.get(ix)) {
            Some(ClassMatch::Match) => {
                self.candidate(d, cluster, ci, pi, ai as u32 + 1, shape, cap_types, max_cost, words)
            }
            Some(ClassMatch::NoMatch(why) | ClassMatch::OtherClass(why)) => Err((Reason::NoMatchingDevices, say(why))),
            Some(ClassMatch::Error(why) | ClassMatch::ClassInvalid(why)) => Err((Reason::SelectorError, say(why))),
            None => Err((Reason::NoMatchingDevices, say(&format!("class {} is not defined", cluster.pools[pi].class)))),
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
        shape: &ReplicaShape,
        cap_types: &[flotilla_apis::CapacityType],
        max_cost: Option<u64>,
        words: bool,
    ) -> Result<Candidate, (Reason, String)> {
        // Refusals carry words only when asked: the hot pass needs the reason alone.
        let say = |f: &dyn Fn() -> String| if words { f() } else { String::new() };
        let pool = &cluster.pools[pi];
        let Some(class) = self.snapshot.classes.get(&pool.class) else {
            return Err((Reason::NoMatchingDevices, say(&|| "class not defined".into())));
        };
        let per_node = class.devices_per_node();
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
        let node_price = class.prices().micros(cap);
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
        let initial_slots = shape.count(&self.free[ci][pi], u32::MAX);
        let sticky_only = refused > 0 || first_refusal(&d.spec.placement, cluster, false).is_some();
        Ok(Candidate {
            cluster: ci,
            pool: pi,
            rank,
            capacity_type_rank: cap_rank as u32,
            prefer_not: prefers_not(&d.spec.placement, cluster),
            // A score term, never a filter: a cold cluster still takes replicas (the cache is
            // staged there first); it only ranks after warm ones of the same capacity-type rank.
            cache_ready: self.cache.as_ref().is_some_and(|k| cluster.ready_caches.contains(k)),
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

    /// Candidates ordered for a proportional split: least placed relative to free slots first.
    fn proportional_order(&self, state: &Placing, ids: &[usize]) -> Vec<usize> {
        let mut ids = ids.to_vec();
        ids.sort_by(|&a, &b| {
            let (ca, cb) = (&state.candidates[a], &state.candidates[b]);
            // ca.placed / ca.slots < cb.placed / cb.slots, without division.
            (u64::from(ca.placed) * u64::from(cb.initial_slots.max(1)))
                .cmp(&(u64::from(cb.placed) * u64::from(ca.initial_slots.max(1))))
                .then(cb.initial_slots.cmp(&ca.initial_slots))
                .then(a.cmp(&b))
        });
        ids
    }
}

#[path = "ceiling.rs"]
mod ceiling;
#[path = "held.rs"]
mod held;
#[path = "improve.rs"]
mod improve;
#[path = "place.rs"]
mod place;
#[path = "problem.rs"]
pub mod problem;
use place::{Placing, stage};
