//! The solver. Deployments are taken in a stable order (priority, creation, name), one
//! priority tier at a time: every deployment of the tier first keeps its current placements,
//! then each places the rest. For each, clusters are filtered (selector, sovereignty,
//! readiness, taints), (pool, alternative) candidates are built (device match, node fit,
//! capacity type, price; `scan.rs`) and ranked (stickiness, capacity-type preference, a
//! ModelCache already Ready there, price, name), then replicas are placed one at a time —
//! current placements first, then per-alternative minimums, then the rest in fallback order —
//! each one consuming the pool's free devices, within spread, `maxReplicas` and the cost
//! ceiling (held back for the most replicas it can pay for, `ceiling.rs`). Then a bounded
//! improvement phase moves equal- or lower-priority replicas to place what the greedy pass
//! left out, and as a last resort preempts strictly lower-priority replicas that do not run
//! and solves the lower tiers again (`improve.rs`, `preempt.rs`). A tier still left short is
//! solved again in a few other orders of its deployments, one kept where it places strictly
//! more of the tier (`trade.rs`).

use flotilla_apis::common::parse_price_micros;
use flotilla_apis::deployment::SplitStrategy;

use crate::devices::{DeviceMatcher, ReplicaShape};
use crate::filters::{StaticMemo, static_verdicts};
use crate::plan::{DeploymentPlan, InvalidSpec, Plan, Reason, Rejection};
use crate::snapshot::{DeploymentView, FleetSnapshot};

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
    /// After the greedy pass, look for the optimum with an integer program and let it guide a
    /// second pass (`exact.rs`); `None` (the default): the greedy plan.
    pub exact: Option<ExactOptions>,
    /// After the improvement phase, solve a priority tier it left short again in other orders of
    /// its deployments and keep one that places strictly more of the tier (`trade.rs`); on by
    /// default, within the `max_improvement` budget (off when that is 0).
    pub trades: bool,
}

impl Default for SolveOptions {
    fn default() -> Self {
        Self { explain: None, max_evaluations: 200_000_000, max_improvement: 1_000_000, exact: None, trades: true }
    }
}

/// One (cluster, pool, alternative) a deployment may use.
#[derive(Clone, Copy, Debug)]
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
    /// Replicas the pool could hold when the candidate was built (proportional split and
    /// explain only; 0 otherwise).
    initial_slots: u32,
    placed: u32,
    /// Of `placed`, replicas kept where they already run (never moved by `improve`).
    kept: u32,
}

/// Solves the whole fleet. Same snapshot and options in, same plan out.
pub fn solve(snapshot: &FleetSnapshot, options: &SolveOptions) -> Plan {
    let mut free = Free::new(initial_free(snapshot));
    let mut matcher = DeviceMatcher::new(&snapshot.classes);
    let order = solve_order(snapshot);
    let fixed = Fixed::of(snapshot);
    let mut evaluations = 0u64;
    let mut statics = StaticMemo::default();
    let mut spare = Vec::new();
    let mut ctx = fixed.ctx(snapshot, &mut free, &mut matcher, &mut statics, &mut evaluations, &mut spare);
    let mut solved = ctx.solve_tiers(&order, options);
    let mut plan = Plan { deployments: std::mem::take(&mut solved.plans), ..Plan::default() };
    if options.max_improvement > 0 && plan.deployments.iter().any(|p| p.unplaced > 0) {
        ctx.improve(&order, &mut plan.deployments, solved, options, None);
    }
    // Tiers left short solved again in other orders where that places more of them (`trade.rs`).
    let traded = trade::trade(snapshot, options, &fixed, &order, &plan);
    if let Some(exact) = &options.exact {
        // The exact mode searches every placement, trades within a tier included: it starts from
        // the plan before the trades, and the traded plan stands only where it places more.
        let by_exact = exact_pass(snapshot, options, exact, &order, &fixed, plan);
        plan = match traded {
            Some(t) if more_in_tier_order(&tier_counts(&order, &t), &tier_counts(&order, &by_exact)) => {
                let counts = tier_counts(&order, &t);
                let report = by_exact.exact.map(|mut r| {
                    r.produced_by = exact::Producer::Greedy;
                    r.note =
                        Some("same-tier trades placed more than the exact mode's plan: the traded plan is kept".into());
                    for tier in &mut r.tiers {
                        tier.plan = counts.get(&tier.priority).copied().unwrap_or(0);
                    }
                    r
                });
                Plan { exact: report, ..t }
            }
            _ => by_exact,
        };
    } else if let Some(t) = traded {
        plan = t;
    }
    if (options.max_improvement > 0 || options.exact.is_some()) && quota::over(snapshot, &plan.deployments) {
        // A step after the greedy pass took a namespace past a quota (they judge capacity and
        // each deployment's own rules, not a namespace's sum): the greedy pass alone holds them.
        let greedy = SolveOptions { max_improvement: 0, exact: None, ..options.clone() };
        return solve(snapshot, &greedy);
    }
    plan.quotas = quota::usage(snapshot, &plan);
    plan
}

/// The greedy's `plan` or, when the exact optimum places more in the tier order and the greedy
/// guided by it (a second pass on the same snapshot) does too, that pass's plan; with a report.
fn exact_pass(
    snapshot: &FleetSnapshot,
    options: &SolveOptions,
    exact: &ExactOptions,
    order: &[&DeploymentView],
    fixed: &Fixed,
    mut plan: Plan,
) -> Plan {
    let key = |ns: &str, name: &str| format!("{ns}/{name}");
    let tiers_of = |plan: &Plan| -> std::collections::BTreeMap<i32, u32> {
        let mut out = std::collections::BTreeMap::new();
        for (d, p) in order.iter().zip(&plan.deployments) {
            *out.entry(d.priority()).or_default() += p.desired - p.unplaced.min(p.desired);
        }
        out
    };
    let greedy = tiers_of(&plan);
    // What the exact mode did: which pass gave the plan, per tier the greedy's, the optimum's
    // and the plan's replicas (`planned`: another plan's, else the greedy's).
    let report = |produced_by,
                  proven,
                  timed_out,
                  note: Option<String>,
                  optimum: &std::collections::BTreeMap<i32, u32>,
                  planned: Option<&std::collections::BTreeMap<i32, u32>>| {
        let tiers = greedy
            .iter()
            .rev()
            .map(|(&priority, &g)| exact::TierCount {
                priority,
                greedy: g,
                optimum: optimum.get(&priority).copied(),
                plan: planned.and_then(|p| p.get(&priority).copied()).unwrap_or(g),
            })
            .collect();
        Some(exact::ExactReport { produced_by, proven, time_limit_reached: timed_out, note, tiers })
    };
    if plan.deployments.iter().all(|p| p.unplaced == 0) {
        plan.exact =
            report(exact::Producer::Greedy, true, false, Some("every replica is placed".into()), &greedy, None);
        return plan;
    }
    let problem = problem::problem(snapshot);
    let plans: std::collections::HashMap<String, &DeploymentPlan> =
        plan.deployments.iter().map(|p| (key(&p.namespace, &p.name), p)).collect();
    let mut pool_ix: std::collections::HashMap<(&str, &str), Vec<usize>> = std::collections::HashMap::new();
    for (i, q) in problem.pools.iter().enumerate() {
        pool_ix.entry((q.cluster.as_str(), q.pool.as_str())).or_default().push(i);
    }
    // Deployments whose greedy counts the model keeps: those that run somewhere (replicas that
    // run stay where they run).
    let kept: std::collections::HashSet<String> = snapshot
        .deployments
        .iter()
        .filter(|d| d.current.iter().any(|c| c.desired > 0))
        .map(|d| key(&d.namespace, &d.name))
        .collect();
    let solved = match exact::optimum(&problem, &plans, &pool_ix, &|n| kept.contains(n), exact) {
        Ok(s) => s,
        Err(exact::Unsolved { note, timed_out }) => {
            plan.exact = report(exact::Producer::Greedy, false, timed_out, Some(note), &Default::default(), None);
            return plan;
        }
    };
    let better = |a: &std::collections::BTreeMap<i32, u32>, b: &std::collections::BTreeMap<i32, u32>| {
        // Highest tier first: the first tier where they differ decides.
        a.iter().rev().zip(b.iter().rev()).find(|(x, y)| x.1 != y.1).is_some_and(|(x, y)| x.1 > y.1)
    };
    if !better(&solved.tiers, &greedy) {
        let note = if solved.proven { "the greedy plan is optimal" } else { "no better plan found within the budget" };
        let note = solved.note.as_ref().map_or(note.to_string(), |n| format!("{note} ({n})"));
        plan.exact = report(exact::Producer::Greedy, solved.proven, solved.timed_out, Some(note), &solved.tiers, None);
        return plan;
    }
    // The guide by (cluster, pool, alternative): pool indexes of the problem are the
    // snapshot's pools in order.
    let flat: Vec<(usize, usize)> =
        snapshot.clusters.iter().enumerate().flat_map(|(ci, c)| (0..c.pools.len()).map(move |pi| (ci, pi))).collect();
    let guide: Guide = solved
        .guide
        .iter()
        .map(|(name, per)| {
            (name.clone(), per.iter().map(|(&(q, rank), &n)| ((flat[q].0, flat[q].1, rank), n)).collect())
        })
        .collect();
    let mut free = Free::new(initial_free(snapshot));
    let mut matcher = DeviceMatcher::new(&snapshot.classes);
    let (mut evaluations, mut statics, mut spare) = (0u64, StaticMemo::default(), Vec::new());
    let mut ctx = fixed.ctx(snapshot, &mut free, &mut matcher, &mut statics, &mut evaluations, &mut spare);
    ctx.guide = Some(&guide);
    let mut solved_again = ctx.solve_tiers(order, options);
    let mut guided = Plan { deployments: std::mem::take(&mut solved_again.plans), ..Plan::default() };
    if options.max_improvement > 0 && guided.deployments.iter().any(|p| p.unplaced > 0) {
        ctx.improve(order, &mut guided.deployments, solved_again, options, None);
    }
    let placed = tiers_of(&guided);
    if better(&placed, &greedy) {
        guided.exact =
            report(exact::Producer::Exact, solved.proven, solved.timed_out, solved.note, &solved.tiers, Some(&placed));
        return guided;
    }
    let note = "the greedy's own checks refused replicas the optimum placed; the greedy plan is kept";
    plan.exact =
        report(exact::Producer::Greedy, solved.proven, solved.timed_out, Some(note.into()), &solved.tiers, None);
    plan
}

/// Replicas placed per priority tier.
fn tier_counts(order: &[&DeploymentView], plan: &Plan) -> std::collections::BTreeMap<i32, u32> {
    let mut out = std::collections::BTreeMap::new();
    for (d, p) in order.iter().zip(&plan.deployments) {
        *out.entry(d.priority()).or_default() += p.desired - p.unplaced.min(p.desired);
    }
    out
}

/// Whether `a` places more than `b` in the tier order: the highest tier where they differ has more.
fn more_in_tier_order(a: &std::collections::BTreeMap<i32, u32>, b: &std::collections::BTreeMap<i32, u32>) -> bool {
    a.iter().rev().zip(b.iter().rev()).find(|(x, y)| x.1 != y.1).is_some_and(|(x, y)| x.1 > y.1)
}

/// Every pool's free devices per node, as the snapshot reports them.
fn initial_free(snapshot: &FleetSnapshot) -> Vec<Vec<Vec<u32>>> {
    snapshot.clusters.iter().map(|c| c.pools.iter().map(|p| p.free_per_node.clone()).collect()).collect()
}

/// What a solve works out once from the clusters and classes: the ranking's integers and the
/// spread domains.
struct Fixed {
    /// Each cluster's position in name order, so ranking compares integers, not strings.
    name_rank: Vec<u32>,
    /// Per cluster, per pool: the index of the pool's class in `snapshot.classes`.
    pool_class: Vec<Vec<Option<usize>>>,
    domains: place::DomainIndex,
    class_facts: Vec<ClassFacts>,
}

impl Fixed {
    fn of(snapshot: &FleetSnapshot) -> Self {
        let mut by_name: Vec<usize> = (0..snapshot.clusters.len()).collect();
        by_name.sort_by(|a, b| snapshot.clusters[*a].name.cmp(&snapshot.clusters[*b].name));
        let mut name_rank = vec![0u32; by_name.len()];
        for (rank, ci) in by_name.into_iter().enumerate() {
            name_rank[ci] = rank as u32;
        }
        let class_ix: std::collections::HashMap<&str, usize> =
            snapshot.classes.keys().enumerate().map(|(i, c)| (c.as_str(), i)).collect();
        let pool_class = snapshot
            .clusters
            .iter()
            .map(|c| c.pools.iter().map(|p| class_ix.get(p.class.as_str()).copied()).collect())
            .collect();
        Self {
            name_rank,
            pool_class,
            domains: place::DomainIndex::new(&snapshot.clusters),
            class_facts: snapshot.classes.values().map(ClassFacts::of).collect(),
        }
    }

    fn ctx<'a, 's>(
        &'a self,
        snapshot: &'s FleetSnapshot,
        free: &'a mut Free,
        matcher: &'a mut DeviceMatcher<'s>,
        statics: &'a mut StaticMemo,
        evaluations: &'a mut u64,
        spare: &'a mut Vec<Candidate>,
    ) -> Ctx<'a, 's> {
        Ctx {
            snapshot,
            free,
            matcher,
            statics,
            evaluations,
            explain: false,
            name_rank: &self.name_rank,
            pool_class: &self.pool_class,
            class_facts: &self.class_facts,
            spare,
            domains: &self.domains,
            cache: None,
            open: None,
            guide: None,
            quota: None,
        }
    }
}

/// What the greedy pass gives a run of deployments (in solve order): their plans, where their
/// replicas went (for `improve`), and the evaluations each cost.
struct Solved {
    plans: Vec<DeploymentPlan>,
    held: Vec<Vec<held::Held>>,
    cost: Vec<u64>,
}

impl<'s> Ctx<'_, 's> {
    /// This context for deployment `d`: explained when `explain` names it, with its cache,
    /// judging spread on `open` (while a tier keeps its current placements).
    fn with<'b>(
        &'b mut self,
        d: &DeploymentView,
        explain: &Option<(String, String)>,
        open: Option<&'b [Vec<Vec<u32>>]>,
    ) -> Ctx<'b, 's> {
        Ctx {
            snapshot: self.snapshot,
            free: &mut *self.free,
            matcher: &mut *self.matcher,
            statics: &mut *self.statics,
            evaluations: &mut *self.evaluations,
            explain: explain.as_ref().is_some_and(|(ns, n)| *ns == d.namespace && *n == d.name),
            name_rank: self.name_rank,
            pool_class: self.pool_class,
            class_facts: self.class_facts,
            spare: &mut *self.spare,
            domains: self.domains,
            cache: d.spec.model.cache_ref.as_deref().map(|c| crate::snapshot::cache_key(&d.namespace, c)),
            open,
            guide: self.guide,
            quota: None,
        }
    }

    /// The greedy pass over `order` (whole priority tiers, highest first) on the free capacity
    /// as it is. One priority tier at a time: first every deployment of the tier keeps what it
    /// runs (in solve order), then each places the rest. So an earlier deployment never grows
    /// into room a later one of its tier runs in: a re-plan of an unchanged fleet keeps every
    /// replica. Also re-solves the tiers below one that preempted (`preempt.rs`).
    fn solve_tiers(&mut self, order: &[&DeploymentView], options: &SolveOptions) -> Solved {
        self.solve_tiers_over(order, options, &[])
    }

    /// As [`Self::solve_tiers`], where the deployments of `fixed` keep the places given (they
    /// count against their namespaces' quotas; their capacity is already taken from the pools).
    fn solve_tiers_over(
        &mut self,
        order: &[&DeploymentView],
        options: &SolveOptions,
        fixed: &[(&DeploymentView, &[held::Held])],
    ) -> Solved {
        let snapshot = self.snapshot;
        let cluster_ix: std::collections::HashMap<&str, usize> =
            snapshot.clusters.iter().enumerate().map(|(i, c)| (c.name.as_str(), i)).collect();
        let mut out = Solved {
            plans: Vec::with_capacity(order.len()),
            held: Vec::with_capacity(order.len()),
            cost: vec![0; order.len()],
        };
        // The namespaces' FleetQuotas, charged as deployments place (`quota.rs`).
        let mut book = quota::Book::new(snapshot, order);
        if let Some(b) = book.as_mut() {
            for (d, held) in fixed {
                b.charge_fixed(d, held.iter().map(|h| (h.cluster, h.pool, h.count, h.price)));
            }
        }
        let mut start = 0;
        while start < order.len() {
            let tier = order[start].priority();
            let end = start + order[start..].iter().take_while(|d| d.priority() == tier).count();
            let open = kept_ahead(snapshot, self.free.raw(), &cluster_ix, &order[start..end]);
            let mut pending: Vec<Pending> = Vec::with_capacity(end - start);
            for (i, &d) in order.iter().enumerate().take(end).skip(start) {
                let before = *self.evaluations;
                pending.push(if *self.evaluations > options.max_evaluations {
                    Pending::Exhausted
                } else if d.current.iter().any(|p| p.desired > 0) || self.guide.is_some() {
                    // (with the exact mode's guide, every deployment's guided replicas are placed
                    // in this first step too, before any of the tier places more)
                    let mut ctx = self.with(d, &options.explain, open.as_deref());
                    ctx.quota = book.as_ref().and_then(|b| b.room(i));
                    let kept = ctx.keep(d);
                    if let (Some(b), Some(k)) = (book.as_mut(), &kept) {
                        let held = k.candidates.iter().filter(|c| c.placed > 0);
                        b.charge(
                            i,
                            &ReplicaShape::of(&d.spec.topology),
                            held.map(|c| (c.cluster, c.pool, c.placed, c.replica_price)),
                        );
                    }
                    kept.map_or(Pending::Fresh, Pending::Kept)
                } else {
                    Pending::Fresh
                });
                out.cost[i] += *self.evaluations - before;
            }
            for ((i, &d), pending) in order.iter().enumerate().take(end).skip(start).zip(pending) {
                let kept = match pending {
                    Pending::Kept(k) => Some(k),
                    Pending::Fresh if *self.evaluations <= options.max_evaluations => None,
                    Pending::Fresh | Pending::Exhausted => {
                        out.plans.push(budget_exhausted(d));
                        out.held.push(Vec::new());
                        continue;
                    }
                };
                let before = *self.evaluations;
                let mut ctx = self.with(d, &options.explain, None);
                ctx.quota = book.as_ref().and_then(|b| b.room(i));
                let (p, h) = ctx.solve_one(d, kept);
                if let Some(b) = book.as_mut() {
                    b.charge(
                        i,
                        &ReplicaShape::of(&d.spec.topology),
                        h.iter().map(|h| (h.cluster, h.pool, h.count, h.price)),
                    );
                }
                out.cost[i] += *self.evaluations - before;
                out.plans.push(p);
                out.held.push(h);
            }
            start = end;
        }
        out
    }
}

/// The pools once every deployment of `tier` kept what it runs where its cluster still allows
/// it (capacity permitting, in solve order), or `None` when no deployment of the tier both
/// runs somewhere and spreads (nothing to judge then).
fn kept_ahead(
    snapshot: &FleetSnapshot,
    free: &[Vec<Vec<u32>>],
    cluster_ix: &std::collections::HashMap<&str, usize>,
    tier: &[&DeploymentView],
) -> Option<Vec<Vec<Vec<u32>>>> {
    let runs = |d: &&&DeploymentView| d.current.iter().any(|p| p.desired > 0);
    if !tier.iter().filter(runs).any(|d| d.spec.placement.spread.is_some()) {
        return None;
    }
    let mut open = free.to_vec();
    kept_in_tier(snapshot, cluster_ix, tier, |_, ci, pi, shape, desired| {
        for _ in 0..desired {
            if !shape.take_in(&mut open[ci][pi]) {
                break;
            }
        }
    });
    Some(open)
}

/// Every replica `kept_ahead` keeps, in its order: (position in the tier, cluster, pool, shape,
/// replicas) per current placement of the tier's running deployments where the cluster still
/// allows it. A pool's open view reads only its own free devices and these.
fn kept_in_tier(
    snapshot: &FleetSnapshot,
    cluster_ix: &std::collections::HashMap<&str, usize>,
    tier: &[&DeploymentView],
    mut keep: impl FnMut(usize, usize, usize, &ReplicaShape, u32),
) {
    for (k, d) in tier.iter().enumerate().filter(|(_, d)| d.current.iter().any(|p| p.desired > 0)) {
        let shape = ReplicaShape::of(&d.spec.topology);
        for p in d.current.iter().filter(|p| p.desired > 0) {
            let Some(&ci) = cluster_ix.get(p.cluster.as_str()) else { continue };
            let cluster = &snapshot.clusters[ci];
            let Some(pi) = cluster.pools.iter().position(|x| x.name == p.pool) else { continue };
            if crate::filters::first_refusal(&d.spec.placement, cluster, true).is_some() {
                continue;
            }
            keep(k, ci, pi, &shape, p.desired as u32);
        }
    }
}

/// A deployment of the tier being solved, between keeping its current placements and placing
/// the rest.
enum Pending {
    /// Nothing runs (or its spec is invalid): solved whole in the second step.
    Fresh,
    /// Its current placements are kept; the rest comes in the second step.
    Kept(Kept),
    /// The evaluation budget ran out before it.
    Exhausted,
}

/// A deployment's placing state after its current placements were kept. The refusals found
/// while building the candidates are not kept (one per cluster, for every deployment of a
/// tier, would be large): they are found again only when the plan reports them.
#[derive(Clone)]
struct Kept {
    candidates: Vec<Candidate>,
    remaining: u32,
    cost: u64,
    per_rank: Vec<u32>,
    domains: Vec<u32>,
    blocks: Vec<(usize, refusal::Refusal)>,
}

/// Deployments in the order they are solved: priority (highest first), creation, namespace,
/// name.
fn solve_order(snapshot: &FleetSnapshot) -> Vec<&DeploymentView> {
    order_indices(snapshot).into_iter().map(|i| &snapshot.deployments[i]).collect()
}

/// [`solve_order`] as positions in `snapshot.deployments`.
fn order_indices(snapshot: &FleetSnapshot) -> Vec<usize> {
    let d = &snapshot.deployments;
    let mut ix: Vec<usize> = (0..d.len()).collect();
    ix.sort_by(|&a, &b| solve_cmp(&d[a], &d[b]));
    ix
}

fn solve_cmp(a: &DeploymentView, b: &DeploymentView) -> std::cmp::Ordering {
    b.priority()
        .cmp(&a.priority())
        .then(a.created.cmp(&b.created))
        .then(a.namespace.cmp(&b.namespace))
        .then(a.name.cmp(&b.name))
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

/// Every replica of `d` unplaced, for one reason that holds on every cluster (`*`): the plan's
/// first rejection (`held::movable` reads only that one).
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
    free: &'a mut Free,
    matcher: &'a mut DeviceMatcher<'s>,
    /// The static filters per distinct placement policy, judged once per solve.
    statics: &'a mut StaticMemo,
    evaluations: &'a mut u64,
    explain: bool,
    name_rank: &'a [u32],
    /// Per cluster, per pool: the index of the pool's class in `snapshot.classes`.
    pool_class: &'a [Vec<Option<usize>>],
    /// Per class (in `snapshot.classes` order), what the hot path reads of it.
    class_facts: &'a [ClassFacts],
    /// The candidate list of the last deployment solved, emptied: the next one's grows into
    /// it instead of a fresh allocation (a deployment may have thousands of candidates).
    spare: &'a mut Vec<Candidate>,
    /// Spread domains as indexes.
    domains: &'a place::DomainIndex,
    /// The deployment's ModelCache (`cacheRef`) as a `ready_caches` key, if any.
    cache: Option<String>,
    /// While a tier keeps its current placements: the pools as they will be once every
    /// deployment of the tier kept what it runs. Spread judges which domains can still take a
    /// replica on it, as it will when the tier places the rest.
    open: Option<&'a [Vec<Vec<u32>>]>,
    /// The exact mode's guide: replicas per (cluster, pool, alternative) each deployment
    /// (`namespace/name`) places first (`exact.rs`).
    guide: Option<&'a Guide>,
    /// The deployment's room under its namespace's FleetQuotas (`quota.rs`), when it has any.
    quota: Option<quota::Room>,
}

/// Per deployment (`namespace/name`): replicas per (cluster, pool, alternative rank).
type Guide = std::collections::HashMap<String, std::collections::BTreeMap<(usize, usize, u32), u32>>;

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

    /// The entries set, by cluster index: small to keep while other deployments are solved.
    fn into_sparse(self) -> Vec<(usize, T)> {
        self.0.into_iter().enumerate().filter_map(|(ci, v)| v.map(|v| (ci, v))).collect()
    }

    /// The map of `n` clusters with `entries` set.
    fn from_sparse(n: usize, entries: Vec<(usize, T)>) -> Self {
        let mut map = Self::with_len(n);
        for (ci, v) in entries {
            map.insert(ci, v);
        }
        map
    }
}

impl Ctx<'_, '_> {
    /// The free devices of pool `(ci, pi)` as spread judges them: on the tier's `open` view
    /// while it keeps its current placements, else as they are now.
    fn room(&self, ci: usize, pi: usize) -> &[u32] {
        match self.open {
            Some(o) => {
                self.free.note_open(ci, pi);
                &o[ci][pi]
            }
            None => &self.free[(ci, pi)],
        }
    }

    /// The first step of a tier: builds `d`'s candidates and keeps its current placements;
    /// `None` when its spec is invalid (the second step says so).
    fn keep(&mut self, d: &DeploymentView) -> Option<Kept> {
        if self.matcher.invalid_selector(&d.spec.devices.alternatives).is_some() {
            return None;
        }
        let policy = &d.spec.placement;
        let shape = ReplicaShape::of(&d.spec.topology);
        let max_cost = policy.max_cost_per_hour.as_deref().and_then(parse_price_micros);
        let candidates = self.candidates(d, &shape, &policy.capacity_types_or_default(), max_cost);
        let mut state = self.placing(d, candidates, max_cost);
        self.keep_current(&mut state, &shape, d);
        if let Some(want) = self.guide.and_then(|g| g.get(&format!("{}/{}", d.namespace, d.name))) {
            let spread = policy.spread.as_ref().map(|s| (s.by, s.max_skew.max(1) as u32));
            self.guided(&mut state, want, &shape, spread, d);
        }
        // Fully placed by what it keeps (most deployments of a re-plan): the second step only
        // reports where its replicas are, so only those candidates are kept until then.
        if state.remaining == 0 && !self.explain {
            state.candidates.retain(|c| c.placed > 0);
            state.candidates.shrink_to_fit();
            state.domains = Vec::new();
        }
        Some(Kept {
            candidates: state.candidates,
            remaining: state.remaining,
            cost: state.cost,
            per_rank: state.per_rank,
            domains: state.domains,
            blocks: state.blocks.into_sparse(),
        })
    }

    /// One deployment's plan, and where its replicas went (for `improve`): its current
    /// placements kept (`kept`, from the tier's first step, or here), then the rest placed.
    fn solve_one(&mut self, d: &DeploymentView, kept: Option<Kept>) -> (DeploymentPlan, Vec<held::Held>) {
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
        let spread = policy.spread.as_ref().map(|s| (s.by, s.max_skew.max(1) as u32));
        let proportional = policy.split == Some(SplitStrategy::Proportional);

        // 1. Current placements, round-robin so spread can hold.
        // Whether the evaluations of the refusals' scan were counted already (candidates built
        // here without refusals): a solve counts each (cluster, pool, alternative) of a
        // deployment's pass once, however its refusals are found.
        let mut counted = false;
        let (mut state, mut scan) = match kept {
            Some(k) => {
                let state = Placing {
                    candidates: k.candidates,
                    remaining: k.remaining,
                    cost: k.cost,
                    max_cost,
                    per_rank: k.per_rank,
                    domains: k.domains,
                    blocks: PerCluster::from_sparse(clusters.len(), k.blocks),
                    reserve: None,
                };
                (state, None)
            }
            None if self.explain => {
                let mut scan = self.scan(d, &shape, &cap_types, max_cost, true);
                let mut state = self.placing(d, std::mem::take(&mut scan.candidates), max_cost);
                self.keep_current(&mut state, &shape, d);
                (state, Some(scan))
            }
            None => {
                let candidates = self.candidates(d, &shape, &cap_types, max_cost);
                counted = true;
                let mut state = self.placing(d, candidates, max_cost);
                self.keep_current(&mut state, &shape, d);
                (state, None)
            }
        };
        // 2. Per-alternative minimums, 3. the rest in fallback order, within the ceiling's hold.
        let at = (state.placed(), state.per_rank.as_slice());
        state.reserve =
            self.reserve(&state.candidates, &d.spec.devices.alternatives, &shape, desired, at, state.cost, max_cost);
        // (then a cheapest-first try when spread and its own limits leave it short, `refill.rs`)
        self.fill_all(&mut state, d, &shape, spread, proportional);
        // The refusals are reported only with replicas unplaced (or when explaining): found
        // now, for this deployment alone.
        if scan.is_none() && (state.remaining > 0 || self.explain) {
            scan = Some(self.scan(d, &shape, &cap_types, max_cost, !counted));
        }
        let Scan { verdicts, static_block, mut pool_blocks, pool_block_at, class_matches, .. } =
            scan.unwrap_or_else(Scan::empty);
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
            let pool = &cluster.pools[c.pool];
            if let Some(r) = d.refused_pools.iter().find(|r| r.cluster == cluster.name && r.pool == pool.name) {
                pool_blocks.insert(
                    c.cluster,
                    (
                        Reason::ReplicasUnschedulable,
                        format!(
                            "pool {}: the member's scheduler refused this deployment's pods there ({}); no new \
                             replica goes there before {}",
                            pool.name, r.message, r.retry_after.0
                        ),
                    ),
                );
                continue;
            }
            if let Some(b) = pool.refused_block.filter(|b| shape.largest_pod() >= *b) {
                pool_blocks.insert(
                    c.cluster,
                    (
                        Reason::InsufficientDevices,
                        format!(
                            "pool {}: the member's scheduler found no node with {b} devices free for a pod (another \
                             deployment's refusal, backed off); this deployment's pods need {}",
                            pool.name,
                            shape.largest_pod()
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
        let plan = self.finish(d, &state, verdicts, static_block, pool_blocks, &shape);
        if state.candidates.capacity() > self.spare.capacity() {
            *self.spare = state.candidates;
        }
        (plan, held)
    }

    /// A deployment's placing state before anything is placed, its candidates ranked.
    fn placing(&self, d: &DeploymentView, mut candidates: Vec<Candidate>, max_cost: Option<u64>) -> Placing {
        self.rank_candidates(&mut candidates);
        let clusters = self.snapshot.clusters.len();
        Placing {
            candidates,
            remaining: d.spec.replicas.max(0) as u32,
            cost: 0,
            max_cost,
            per_rank: vec![0; d.spec.devices.alternatives.len()],
            domains: vec![0; clusters],
            blocks: PerCluster::with_len(clusters),
            reserve: None,
        }
    }

    /// Keeps `d`'s current placements, one replica per candidate in turn so spread can hold.
    fn keep_current(&mut self, state: &mut Placing, shape: &ReplicaShape, d: &DeploymentView) {
        let spread = d.spec.placement.spread.as_ref().map(|s| (s.by, s.max_skew.max(1) as u32));
        loop {
            let mut progress = false;
            for i in 0..state.candidates.len() {
                if state.remaining == 0 {
                    break;
                }
                if state.candidates[i].sticky_quota > 0 && self.keep_one(state, i, shape, spread, d) {
                    state.candidates[i].sticky_quota -= 1;
                    state.candidates[i].kept += 1;
                    progress = true;
                }
            }
            if !progress || state.remaining == 0 {
                break;
            }
        }
    }

    /// Places the exact mode's guided replicas (`want`, per cluster, pool and alternative rank;
    /// those kept count), one per candidate in turn so spread can hold; every rule is checked as
    /// for any replica, and one refused is left to the fill.
    fn guided(
        &mut self,
        state: &mut Placing,
        want: &std::collections::BTreeMap<(usize, usize, u32), u32>,
        shape: &ReplicaShape,
        spread: Option<(flotilla_apis::deployment::SpreadDomain, u32)>,
        d: &DeploymentView,
    ) {
        let targets: Vec<(usize, u32)> = (0..state.candidates.len())
            .filter(|&i| !state.candidates[i].sticky_only)
            .filter_map(|i| {
                let c = &state.candidates[i];
                want.get(&(c.cluster, c.pool, c.rank)).map(|&n| (i, n))
            })
            .collect();
        loop {
            let mut progress = false;
            for &(i, n) in &targets {
                if state.remaining > 0 && state.candidates[i].placed < n && self.place(state, &[i], shape, spread, d) {
                    progress = true;
                }
            }
            if !progress || state.remaining == 0 {
                break;
            }
        }
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
#[path = "exact.rs"]
pub mod exact;
#[path = "free.rs"]
mod free;
#[path = "held.rs"]
mod held;
#[path = "improve.rs"]
mod improve;
#[path = "place.rs"]
mod place;
#[path = "problem.rs"]
pub mod problem;
#[path = "quota.rs"]
pub mod quota;
#[path = "refusal.rs"]
mod refusal;
#[path = "replan.rs"]
mod replan;
#[path = "scan.rs"]
mod scan;
#[path = "trade.rs"]
mod trade;
pub use exact::{ExactOptions, ExactReport};
use free::Free;
use place::Placing;
pub use replan::{ReplanStats, Replanner};
use scan::{ClassFacts, Scan};
