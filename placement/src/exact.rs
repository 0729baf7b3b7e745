//! Exact mode: after the greedy pass and its improvement phase, the placement is formulated as
//! an integer program over the filtered problem (`problem.rs`) and solved with `microlp` (pure
//! Rust branch and bound) within a node budget: the most replicas for the highest priority
//! tier, that fixed, the most for the next, and so on; then, with every tier fixed, the best
//! fallback rank and capacity type, then the lowest price. The optimum's counts per (pool,
//! alternative) guide a second greedy pass (`solve.rs::guided`), which places each deployment's
//! guided replicas first and checks every rule itself as it always does; that plan replaces the
//! greedy one only when it places more replicas in the lexicographic tier order. So the exact
//! mode can only add replicas, and every plan it gives passed the greedy's own checks.
//!
//! What the model encodes: replicas per deployment, `maxReplicas` per alternative,
//! `maxCostPerHour`, devices per node (nodes with the same free count summed where pod sizes
//! divide each other and the free count, single nodes otherwise; pods of a multi-node replica
//! at most one per node and replica), spread as the greedy keeps it (`Model::spread`).
//! Deployments that run somewhere keep their greedy counts as constants (stickiness). Two
//! rounds (spreading deployments held at the greedy's counts, then free), each step
//! warm-started from a complete solution (`Model::lexicographic`). The budget is in
//! branch-and-bound nodes, so the same snapshot gives the same plan, with a wall-clock limit
//! under it as a safety net (`ExactOptions::max_time`; the report says when it was reached).

use std::collections::{BTreeMap, HashMap};

use microlp::{ComparisonOp, OptimizationDirection, Variable};
use serde::Serialize;

use super::problem::{Problem, ProblemDeployment};
use crate::plan::DeploymentPlan;

/// Knobs of the exact mode.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExactOptions {
    /// Branch-and-bound nodes per step (one step per priority tier, and one for preferences).
    pub max_nodes: u64,
    /// Largest model (integer variables) tried, per independent part of the fleet; a larger
    /// part keeps the greedy's counts.
    pub max_variables: usize,
    /// Wall-clock time for all the steps together: a safety net under the node budget (a node
    /// of a large program may take long). When it is reached the plan is the best found so far
    /// and may differ from run to run; the report says so. `None`: nodes only, deterministic.
    pub max_time: Option<std::time::Duration>,
}

impl Default for ExactOptions {
    fn default() -> Self {
        Self { max_nodes: 20_000, max_variables: 20_000, max_time: Some(std::time::Duration::from_secs(10)) }
    }
}

/// What the exact mode did, reported with the plan.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ExactReport {
    /// Which pass produced the plan: `exact` (the greedy guided by the optimum) or `greedy`.
    pub produced_by: Producer,
    /// Whether every step was proven optimal within the node budget.
    pub proven: bool,
    /// The time limit (`ExactOptions::max_time`) stopped a step: the plan is the best found by
    /// then, and another run may find another.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub time_limit_reached: bool,
    /// Why the exact mode's answer was not used, when it was not; or which independent parts
    /// of the fleet it does not cover, and why.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    /// Per priority tier, highest first: replicas the greedy placed, and the plan placed.
    pub tiers: Vec<TierCount>,
}

/// Which pass produced the plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub enum Producer {
    /// The greedy pass and its improvement phase.
    Greedy,
    /// The greedy guided by the exact optimum.
    Exact,
}

/// One priority tier's replica counts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct TierCount {
    /// `spec.placement.priority`.
    pub priority: i32,
    /// Replicas the greedy pass and its improvement phase placed.
    pub greedy: u32,
    /// Replicas the optimum places, as the model counts them (absent when no optimum was found).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub optimum: Option<u32>,
    /// Replicas the plan places.
    pub plan: u32,
}

/// Per deployment (`namespace/name`): replicas per (pool index of [`Problem::pools`], rank).
pub(super) type Guide = HashMap<String, BTreeMap<(usize, u32), u32>>;

/// The optimum's guide, or why there is none.
pub(super) struct Solved {
    pub(super) guide: Guide,
    pub(super) proven: bool,
    pub(super) timed_out: bool,
    /// Per priority tier: the optimum's replicas.
    pub(super) tiers: BTreeMap<i32, u32>,
    /// What of the fleet the optimum does not cover (independent parts that kept the greedy's
    /// counts, and why).
    pub(super) note: Option<String>,
}

/// Why there is no optimum to guide a pass, and whether the time limit is the cause.
pub(super) struct Unsolved {
    pub(super) note: String,
    pub(super) timed_out: bool,
}

impl From<String> for Unsolved {
    fn from(note: String) -> Self {
        Self { note, timed_out: false }
    }
}

/// Node groups of a pool: (free devices per node, nodes), a group summed only where that is
/// exact (every pod size divides the next and the free count), else split into single nodes;
/// and per node, its group (none for a node with nothing free).
fn groups(free_per_node: &[u32], sizes: &[u32]) -> (Vec<(u32, u32)>, Vec<Option<usize>>) {
    let mut nodes: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for (i, &f) in free_per_node.iter().enumerate().filter(|(_, f)| **f > 0) {
        nodes.entry(f).or_default().push(i);
    }
    let mut chain: Vec<u32> = sizes.to_vec();
    chain.sort_unstable();
    chain.dedup();
    let divisible = chain.windows(2).all(|w| w[1] % w[0] == 0);
    let (mut out, mut of) = (Vec::new(), vec![None; free_per_node.len()]);
    for (free, on) in nodes {
        let exact = on.len() == 1 || (divisible && chain.iter().filter(|&&s| s <= free).all(|s| free % s == 0));
        for &i in &on {
            of[i] = Some(out.len());
            if !exact {
                out.push((free, 1));
            }
        }
        if exact {
            out.push((free, on.len() as u32));
        }
    }
    (out, of)
}

/// Pods per (deployment, option, pod size, node group) of a solution: its `z` variables.
type Pods = HashMap<(usize, usize, u32, usize), u32>;

/// Per (pool, node group): (deployment, devices per pod, its pods variable there).
type Used = HashMap<(usize, usize), Vec<(usize, f64, Variable)>>;

/// A program's variables as they are added: every one, and each with its warm-start value.
#[derive(Default)]
struct Vars {
    all: Vec<Variable>,
    warm: Vec<(Variable, f64)>,
}

impl Vars {
    /// An integer variable with objective coefficient `obj`, `bounds`, and warm value `at`.
    fn add(&mut self, mip: &mut microlp::Problem, obj: f64, bounds: (i32, i32), at: f64) -> Variable {
        let v = mip.add_integer_var(obj, bounds);
        self.all.push(v);
        self.warm.push((v, at));
        v
    }
}

/// The model: variables per (deployment, option), and what each step needs to rebuild it.
struct Model<'p> {
    p: &'p Problem,
    /// Per deployment: fixed counts per option (`Some`) or free.
    fixed: Vec<Option<Vec<u32>>>,
    /// Per deployment: the greedy's counts per option (what a spreading deployment may keep).
    greedy: Vec<Vec<u32>>,
    groups: Vec<Vec<(u32, u32)>>,
    /// Per pool, per node: its group.
    node_group: Vec<Vec<Option<usize>>>,
    /// Per deployment whose spread the model reasons about (free, spreading over two domains
    /// or more): its options by spread domain.
    spread_by: Vec<Option<BTreeMap<usize, Vec<usize>>>>,
    variables: usize,
}

/// One built program and its option variables.
struct Built {
    mip: microlp::Problem,
    x: Vec<Vec<Variable>>,
    /// Every variable, in the order a step's values come in.
    all: Vec<Variable>,
    /// Per deployment, where its option variables `x` sit in `all`.
    x_at: Vec<std::ops::Range<usize>>,
    /// Where each pods variable sits in `all`, by (deployment, option, pod size, node group).
    z_at: Vec<((usize, usize, u32, usize), usize)>,
    /// A value for every variable, from `Model::build`'s `start`.
    warm: Option<Vec<(Variable, f64)>>,
}

/// The spread domains of a deployment's options (by `ProblemDeployment::spread`'s kind), when
/// it spreads over two domains or more.
fn spread_domains(p: &Problem, d: &ProblemDeployment) -> Option<BTreeMap<usize, Vec<usize>>> {
    let (kind, _) = d.spread?;
    let mut by: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (k, o) in d.options.iter().enumerate() {
        by.entry(p.pools[o.pool].domains[kind]).or_default().push(k);
    }
    (by.len() > 1).then_some(by)
}

impl<'p> Model<'p> {
    fn new(p: &'p Problem, fixed: Vec<Option<Vec<u32>>>, greedy: Vec<Vec<u32>>) -> Self {
        let sizes: Vec<u32> = p.deployments.iter().flat_map(|d| d.pods.iter().copied()).collect();
        let (groups, node_group): (Vec<_>, Vec<_>) = p.pools.iter().map(|q| groups(&q.free_per_node, &sizes)).unzip();
        let spread_by: Vec<_> = p
            .deployments
            .iter()
            .zip(&fixed)
            .map(|(d, f)| if f.is_none() { spread_domains(p, d) } else { None })
            .collect();
        let mut variables = 0;
        for (di, d) in p.deployments.iter().enumerate() {
            let distinct = {
                let mut s = d.pods.clone();
                s.sort_unstable();
                s.dedup();
                s
            };
            for o in &d.options {
                variables +=
                    1 + distinct.iter().map(|&s| groups[o.pool].iter().filter(|g| g.0 >= s).count()).sum::<usize>();
            }
            if let Some(by) = &spread_by[di] {
                // Kept or not; per pool full; per capped alternative at its maximum; per price
                // over the ceiling; per domain open.
                let pools: std::collections::BTreeSet<usize> = d.options.iter().map(|o| o.pool).collect();
                let prices: std::collections::BTreeSet<u64> = d.options.iter().map(|o| o.price_micros).collect();
                variables += 1
                    + pools.len()
                    + d.alternatives.iter().filter(|a| a.1.is_some()).count()
                    + if d.max_cost_micros.is_some() { prices.len() } else { 0 }
                    + by.len();
            }
        }
        Self { p, fixed, greedy, groups, node_group, spread_by, variables }
    }

    /// Whether the model reasons about deployment `di`'s spread (it is free and spreads over
    /// two domains or more).
    fn spreads(&self, di: usize) -> bool {
        self.spread_by[di].is_some()
    }

    /// Pods per (deployment, option, pod size, node group) for replica `counts` per option,
    /// packed pool by pool, largest pods first (multi-pod replicas first among equals), best
    /// fit; `None` when they do not fit so.
    fn pods_of(&self, counts: &[Vec<u32>]) -> Option<Pods> {
        let shapes: Vec<crate::devices::ReplicaShape> = self
            .p
            .deployments
            .iter()
            .map(|d| crate::devices::ReplicaShape { pods: d.pods.clone(), distinct_nodes: d.distinct_nodes })
            .collect();
        let mut on: Vec<Vec<(usize, usize)>> = vec![Vec::new(); self.p.pools.len()];
        for (di, d) in self.p.deployments.iter().enumerate() {
            for (k, o) in d.options.iter().enumerate() {
                on[o.pool].extend(std::iter::repeat_n((di, k), counts[di][k] as usize));
            }
        }
        let mut out = Pods::new();
        for (pool, mut replicas) in on.into_iter().enumerate() {
            replicas.sort_by_key(|&(di, _)| std::cmp::Reverse((shapes[di].largest_pod(), shapes[di].pods.len())));
            let mut free = self.p.pools[pool].free_per_node.clone();
            for (di, k) in replicas {
                let nodes = shapes[di].take_nodes(&mut free)?;
                for (&node, &s) in nodes.iter().zip(&shapes[di].pods) {
                    *out.entry((di, k, s, self.node_group[pool][node]?)).or_default() += 1;
                }
            }
        }
        Some(out)
    }

    /// The program with objective coefficients per (deployment, option) from `objective`, and
    /// `at_least` (per tier: the sum of its replicas) as constraints. With `start` (the greedy's
    /// pods, `pods_of`), the built program carries the greedy's solution as a complete warm
    /// start: counts per option and their pods (`pods_of`). With `hold`, the deployments whose
    /// spread the model reasons about keep the greedy's counts instead (a smaller program whose
    /// answer is a complete warm start of the full one).
    fn build(
        &self,
        objective: impl Fn(&ProblemDeployment, usize) -> f64,
        at_least: &[(i32, f64)],
        start: Option<(&[Vec<u32>], &Pods)>,
        hold: bool,
    ) -> Built {
        let p = self.p;
        let mut mip = microlp::Problem::new(OptimizationDirection::Maximize);
        let mut x: Vec<Vec<Variable>> = Vec::with_capacity(p.deployments.len());
        let mut x_at = Vec::with_capacity(p.deployments.len());
        let mut vars = Vars::default();
        let mut used = Used::new();
        let mut z_at = Vec::new();
        // Per deployment whose spread the model reasons about: whether it keeps the greedy's
        // counts (then its spread is the greedy's, already checked).
        let mut keeps: Vec<Option<Variable>> = vec![None; p.deployments.len()];
        for (di, d) in p.deployments.iter().enumerate() {
            let most = d.replicas.min(i32::MAX as u32) as i32;
            let greedy = &self.greedy[di];
            let xs: Vec<Variable> = (0..d.options.len())
                .map(|k| {
                    let g = f64::from(start.map_or(greedy[k], |(c, _)| c[di][k]));
                    let held = (hold && self.spreads(di)).then_some(greedy.as_slice());
                    match self.fixed[di].as_deref().or(held) {
                        Some(counts) => {
                            let v = counts[k].min(i32::MAX as u32) as i32;
                            vars.add(&mut mip, objective(d, k), (v, v), g)
                        }
                        None => vars.add(&mut mip, objective(d, k), (0, most), g),
                    }
                })
                .collect();
            x_at.push(vars.all.len() - xs.len()..vars.all.len());
            if self.spreads(di) && !hold {
                // x = greedy when kept: x + M·keep <= g + M and x - M·keep >= g - M.
                let kept = start.is_none_or(|(c, _)| c[di] == *greedy);
                let keep = vars.add(&mut mip, 0.0, (0, 1), f64::from(u8::from(kept)));
                let m = f64::from(d.replicas);
                for (k, &v) in xs.iter().enumerate() {
                    let g = f64::from(greedy[k]);
                    mip.add_constraint([(v, 1.0), (keep, m)], ComparisonOp::Le, g + m);
                    mip.add_constraint([(v, 1.0), (keep, -m)], ComparisonOp::Ge, g - m);
                }
                keeps[di] = Some(keep);
            }
            if !xs.is_empty() {
                mip.add_constraint(
                    xs.iter().map(|&v| (v, 1.0)).collect::<Vec<_>>(),
                    ComparisonOp::Le,
                    f64::from(d.replicas),
                );
            }
            for (r, (_, max)) in d.alternatives.iter().enumerate() {
                let Some(max) = max else { continue };
                let on: Vec<(Variable, f64)> =
                    d.options.iter().zip(&xs).filter(|(o, _)| o.rank == r as u32 + 1).map(|(_, &v)| (v, 1.0)).collect();
                if !on.is_empty() {
                    mip.add_constraint(on, ComparisonOp::Le, f64::from(*max));
                }
            }
            if let Some(max) = d.max_cost_micros {
                // In dollars: coefficients near 1 keep the simplex well conditioned.
                let spent: Vec<(Variable, f64)> =
                    d.options.iter().zip(&xs).map(|(o, &v)| (v, o.price_micros as f64 / 1e6)).collect();
                if !spent.is_empty() {
                    mip.add_constraint(spent, ComparisonOp::Le, max as f64 / 1e6 + 1e-7);
                }
            }
            let mut times: BTreeMap<u32, u32> = BTreeMap::new();
            for &s in &d.pods {
                *times.entry(s).or_default() += 1;
            }
            for (k, o) in d.options.iter().enumerate() {
                for (&s, &t) in &times {
                    let mut zs = Vec::new();
                    for (gi, &(free, n)) in self.groups[o.pool].iter().enumerate() {
                        if free < s {
                            continue;
                        }
                        let at = start.map_or(0, |(_, pods)| pods.get(&(di, k, s, gi)).copied().unwrap_or(0));
                        let z = vars.add(&mut mip, 0.0, (0, most.saturating_mul(t as i32)), f64::from(at));
                        z_at.push(((di, k, s, gi), vars.all.len() - 1));
                        if d.distinct_nodes {
                            // At most one pod of a replica per node: n nodes hold at most n pods
                            // per replica.
                            mip.add_constraint([(z, 1.0), (xs[k], -f64::from(n))], ComparisonOp::Le, 0.0);
                        }
                        zs.push((z, 1.0));
                        used.entry((o.pool, gi)).or_default().push((di, f64::from(s), z));
                    }
                    zs.push((xs[k], -f64::from(t)));
                    mip.add_constraint(zs, ComparisonOp::Eq, 0.0);
                }
            }
            x.push(xs);
        }
        let mut keys: Vec<&(usize, usize)> = used.keys().collect();
        keys.sort_unstable();
        for key in keys {
            let (free, n) = self.groups[key.0][key.1];
            let terms: Vec<(Variable, f64)> = used[key].iter().map(|&(_, s, z)| (z, s)).collect();
            mip.add_constraint(terms, ComparisonOp::Le, f64::from(free) * f64::from(n));
        }
        for (di, d) in p.deployments.iter().enumerate() {
            if let Some(keep) = keeps[di] {
                self.spread(&mut mip, &mut vars, &used, (di, d), &x[di], keep);
            }
        }
        for &(tier, least) in at_least {
            let terms: Vec<(Variable, f64)> = p
                .deployments
                .iter()
                .zip(&x)
                .filter(|(d, _)| d.priority == tier)
                .flat_map(|(_, xs)| xs.iter().map(|&v| (v, 1.0)))
                .collect();
            if !terms.is_empty() {
                mip.add_constraint(terms, ComparisonOp::Ge, least - 0.5);
            }
        }
        let warm = start.map(|_| vars.warm);
        Built { mip, x, all: vars.all, x_at, z_at, warm }
    }

    /// Spread of deployment `di` as the greedy keeps it, unless it keeps the greedy's counts
    /// (`keep`): no domain more than maxSkew above another that is open, and a domain may be
    /// closed only while every option in it has a reason to take no further replica: its pool
    /// full once the deployments solved up to this one are placed (no node group with room for
    /// a pod of a one-pod replica; fewer free devices in all than a replica needs), its
    /// alternative at `maxReplicas`, or one more replica at its price over the ceiling. Each
    /// reason is a 0/1 variable that may be 1 only when the reason holds.
    fn spread(
        &self,
        mip: &mut microlp::Problem,
        vars: &mut Vars,
        used: &Used,
        (di, d): (usize, &ProblemDeployment),
        xs: &[Variable],
        keep: Variable,
    ) {
        let Some(by) = &self.spread_by[di] else { return };
        let Some((_, skew)) = d.spread else { return };
        let m = f64::from(d.replicas);
        let smallest = d.pods.iter().copied().min().unwrap_or(1);
        let total: u32 = d.pods.iter().sum();
        let mut full: BTreeMap<usize, Variable> = BTreeMap::new();
        for pool in d.options.iter().map(|o| o.pool).collect::<std::collections::BTreeSet<_>>() {
            let f = vars.add(mip, 0.0, (0, 1), 0.0);
            full.insert(pool, f);
            // What the deployments solved up to this one use of a group, and its devices.
            let use_of = |gi: usize| -> (Vec<(Variable, f64)>, f64) {
                let (free, n) = self.groups[pool][gi];
                let terms = used.get(&(pool, gi)).map_or(Vec::new(), |u| {
                    u.iter().filter(|&&(dj, _, _)| dj <= di).map(|&(_, s, z)| (z, -s)).collect()
                });
                (terms, f64::from(free) * f64::from(n))
            };
            let room: Vec<usize> =
                (0..self.groups[pool].len()).filter(|&gi| self.groups[pool][gi].0 >= smallest).collect();
            if d.pods.len() == 1 {
                // Full: every group has at most pod - 1 devices left, -used + devices·full <= pod - 1.
                for gi in room {
                    let (mut terms, devices) = use_of(gi);
                    terms.push((f, devices));
                    mip.add_constraint(terms, ComparisonOp::Le, f64::from(smallest) - 1.0);
                }
            } else if !room.is_empty() {
                // Full: the groups a pod fits in have fewer devices left than a replica needs.
                let (mut terms, mut devices) = (Vec::new(), 0.0);
                for gi in room {
                    let (t, dv) = use_of(gi);
                    terms.extend(t);
                    devices += dv;
                }
                terms.push((f, devices));
                mip.add_constraint(terms, ComparisonOp::Le, f64::from(total) - 1.0);
            }
        }
        let mut at_max: BTreeMap<u32, Variable> = BTreeMap::new();
        for (r, (_, most)) in d.alternatives.iter().enumerate() {
            let Some(most) = most else { continue };
            let rank = r as u32 + 1;
            let a = vars.add(mip, 0.0, (0, 1), 0.0);
            let mut terms: Vec<(Variable, f64)> =
                d.options.iter().zip(xs).filter(|(o, _)| o.rank == rank).map(|(_, &v)| (v, 1.0)).collect();
            terms.push((a, -f64::from(*most)));
            mip.add_constraint(terms, ComparisonOp::Ge, 0.0);
            at_max.insert(rank, a);
        }
        let mut broke: BTreeMap<u64, Variable> = BTreeMap::new();
        if let Some(max) = d.max_cost_micros {
            for price in d.options.iter().map(|o| o.price_micros).collect::<std::collections::BTreeSet<_>>() {
                // Spent + price > max: spent >= (max + 1 micro - price)·broke, in dollars.
                let b = vars.add(mip, 0.0, (0, 1), 0.0);
                let mut terms: Vec<(Variable, f64)> =
                    d.options.iter().zip(xs).map(|(o, &v)| (v, o.price_micros as f64 / 1e6)).collect();
                terms.push((b, -((max as f64 + 1.0 - price as f64) / 1e6)));
                mip.add_constraint(terms, ComparisonOp::Ge, 0.0);
                broke.insert(price, b);
            }
        }
        let count = |ks: &[usize], sign: f64| -> Vec<(Variable, f64)> { ks.iter().map(|&k| (xs[k], sign)).collect() };
        for (dom, ks) in by {
            let open = vars.add(mip, 0.0, (0, 1), 1.0);
            for &k in ks {
                let o = &d.options[k];
                let mut why = vec![(open, 1.0), (full[&o.pool], 1.0)];
                why.extend(at_max.get(&o.rank).map(|&a| (a, 1.0)));
                why.extend(broke.get(&o.price_micros).map(|&b| (b, 1.0)));
                mip.add_constraint(why, ComparisonOp::Ge, 1.0);
            }
            // Open and not kept: every other domain within maxSkew of this one.
            for (other, oks) in by {
                if other == dom {
                    continue;
                }
                let mut terms = count(oks, 1.0);
                terms.extend(count(ks, -1.0));
                terms.push((open, m));
                terms.push((keep, -m));
                mip.add_constraint(terms, ComparisonOp::Le, f64::from(skew) + m);
            }
        }
    }
}

/// What bounds one step: its nodes, and the deadline of all the steps.
#[derive(Clone, Copy)]
struct Budget {
    max_nodes: u64,
    deadline: Option<std::time::Instant>,
}

/// One step's answer: every variable's value, proven optimal, stopped by the time limit.
struct Step {
    values: Vec<f64>,
    proven: bool,
    timed_out: bool,
}

/// Solves `built` within `budget`, warm-started from `warm` (values of some or all of its
/// variables).
fn run(built: &Built, budget: Budget, warm: Vec<(Variable, f64)>) -> Result<Step, Unsolved> {
    let mut options = microlp::SolveOptions::default();
    options.node_limit = Some(budget.max_nodes);
    options.warm_start = Some(warm);
    if let Some(deadline) = budget.deadline {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(Unsolved { note: "the time limit ran out before this step".into(), timed_out: true });
        }
        options.time_limit = Some(left);
    }
    let outcome =
        built.mip.solve_with(options).map_err(|e| Unsolved::from(format!("the integer program failed: {e}")))?;
    let proven = outcome.is_optimal();
    let timed_out = outcome.termination_reason() == microlp::TerminationReason::TimeLimit;
    let max_nodes = budget.max_nodes;
    let solution = outcome.into_solution().map_err(|_| {
        let note = if timed_out {
            "no solution before the time limit".to_string()
        } else {
            format!("no solution within {max_nodes} branch-and-bound nodes")
        };
        Unsolved { note, timed_out }
    })?;
    Ok(Step { values: built.all.iter().map(|&v| solution.var_value(v)).collect(), proven, timed_out })
}

/// Replicas per option from a solution's values.
fn counts(built: &Built, values: &[f64]) -> Vec<Vec<u32>> {
    built.x_at.iter().map(|at| values[at.clone()].iter().map(|v| v.round().max(0.0) as u32).collect()).collect()
}

/// The optimum for `p`, given the greedy `plans` (by `namespace/name`) and which deployments
/// keep their greedy counts (`keep`: by `namespace/name`). `Err` says why there is none.
pub(super) fn optimum(
    p: &Problem,
    plans: &HashMap<String, &DeploymentPlan>,
    pool_ix: &HashMap<(&str, &str), Vec<usize>>,
    keep: &dyn Fn(&str) -> bool,
    options: &ExactOptions,
) -> Result<Solved, Unsolved> {
    // The greedy's counts per option: the warm start, and the constants of kept deployments.
    let mut greedy: Vec<Vec<u32>> = Vec::with_capacity(p.deployments.len());
    for d in &p.deployments {
        let mut per = vec![0u32; d.options.len()];
        for a in plans.get(&d.name).map(|dp| dp.assignments.as_slice()).unwrap_or_default() {
            let pools = pool_ix.get(&(a.cluster.as_str(), a.pool.as_str())).map(Vec::as_slice).unwrap_or_default();
            let [q] = pools else {
                return Err(Unsolved::from(format!(
                    "{}: replicas on {}/{}, which the model cannot tell apart from a CapacityClaim's reserved nodes",
                    d.name, a.cluster, a.pool
                )));
            };
            let Some(k) = d.options.iter().position(|o| o.pool == *q && o.rank == a.fallback_rank) else {
                return Err(Unsolved::from(format!(
                    "{}: replicas kept on {}/{} (alternative {}), where no new replica may go",
                    d.name, a.cluster, a.pool, a.fallback_rank
                )));
            };
            per[k] += a.replicas;
        }
        greedy.push(per);
    }
    let fixed: Vec<Option<Vec<u32>>> =
        p.deployments.iter().zip(&greedy).map(|(d, g)| keep(&d.name).then(|| g.clone())).collect();
    let deadline = options.max_time.map(|t| std::time::Instant::now() + t);
    let parts = parts(p);
    if parts.len() == 1 {
        return optimum_of(p, greedy, fixed, options, deadline);
    }
    // Independent parts (no deployment has options in two), each its own program within the
    // same budget per step and the same deadline; a part without an answer keeps the greedy's
    // counts (no guide: the guided pass places its deployments as the greedy did).
    let mut out = Solved { guide: Guide::new(), proven: true, timed_out: false, tiers: BTreeMap::new(), note: None };
    let (mut failed, mut first): (usize, Option<String>) = (0, None);
    for (pools, deps) in &parts {
        let at: HashMap<usize, usize> = pools.iter().enumerate().map(|(i, &q)| (q, i)).collect();
        let sub = Problem {
            pools: pools.iter().map(|&q| p.pools[q].clone()).collect(),
            deployments: deps
                .iter()
                .map(|&di| {
                    let mut d = p.deployments[di].clone();
                    d.options.iter_mut().for_each(|o| o.pool = at[&o.pool]);
                    d
                })
                .collect(),
        };
        let g: Vec<Vec<u32>> = deps.iter().map(|&di| greedy[di].clone()).collect();
        let f: Vec<Option<Vec<u32>>> = deps.iter().map(|&di| fixed[di].clone()).collect();
        match optimum_of(&sub, g.clone(), f, options, deadline) {
            Ok(solved) => {
                for (name, per) in solved.guide {
                    out.guide.insert(name, per.into_iter().map(|((q, rank), n)| ((pools[q], rank), n)).collect());
                }
                out.proven &= solved.proven;
                out.timed_out |= solved.timed_out;
                for (t, n) in solved.tiers {
                    *out.tiers.entry(t).or_default() += n;
                }
            }
            Err(e) => {
                failed += 1;
                out.proven = false;
                out.timed_out |= e.timed_out;
                first.get_or_insert(e.note);
                for (d, g) in sub.deployments.iter().zip(&g) {
                    *out.tiers.entry(d.priority).or_default() += g.iter().sum::<u32>();
                }
            }
        }
    }
    if failed == parts.len() {
        return Err(Unsolved { note: first.unwrap_or_default(), timed_out: out.timed_out });
    }
    if let Some(why) = first {
        out.note = Some(format!(
            "{failed} of {} independent parts of the fleet kept the greedy's counts; the first: {why}",
            parts.len()
        ));
    }
    Ok(out)
}

/// The fleet's independent parts: (pools, deployments), indexes into `p`, each set ascending,
/// no deployment with options in two parts; deployments without options are in none. Parts in
/// the order of their first pool.
fn parts(p: &Problem) -> Vec<(Vec<usize>, Vec<usize>)> {
    let mut parent: Vec<usize> = (0..p.pools.len()).collect();
    fn root(parent: &mut [usize], mut x: usize) -> usize {
        while parent[x] != x {
            parent[x] = parent[parent[x]];
            x = parent[x];
        }
        x
    }
    for d in &p.deployments {
        let mut qs = d.options.iter().map(|o| o.pool);
        if let Some(first) = qs.next() {
            for q in qs {
                let (a, b) = (root(&mut parent, first), root(&mut parent, q));
                parent[a.max(b)] = a.min(b);
            }
        }
    }
    let mut by_root: BTreeMap<usize, (Vec<usize>, Vec<usize>)> = BTreeMap::new();
    let used: std::collections::BTreeSet<usize> =
        p.deployments.iter().flat_map(|d| d.options.iter().map(|o| o.pool)).collect();
    for q in used {
        let r = root(&mut parent, q);
        by_root.entry(r).or_default().0.push(q);
    }
    for (di, d) in p.deployments.iter().enumerate() {
        if let Some(o) = d.options.first() {
            let r = root(&mut parent, o.pool);
            by_root.entry(r).or_default().1.push(di);
        }
    }
    by_root.into_values().collect()
}

/// The optimum of one independent part (or the whole fleet), from the greedy's counts.
fn optimum_of(
    p: &Problem,
    greedy: Vec<Vec<u32>>,
    fixed: Vec<Option<Vec<u32>>>,
    options: &ExactOptions,
    deadline: Option<std::time::Instant>,
) -> Result<Solved, Unsolved> {
    let model = Model::new(p, fixed, greedy.clone());
    if model.variables > options.max_variables {
        return Err(Unsolved::from(format!(
            "the model would have {} integer variables, more than the {} allowed",
            model.variables, options.max_variables
        )));
    }
    let mut tiers: Vec<i32> = p.deployments.iter().map(|d| d.priority).collect();
    tiers.sort_unstable_by(|a, b| b.cmp(a));
    tiers.dedup();
    let budget = Budget { max_nodes: options.max_nodes, deadline };
    // Two rounds: spreading deployments at the greedy's counts (a smaller search), then free,
    // warm-started from the first round's answer (so never below it); the second's failure
    // (the time limit) leaves the first's answer, unproven.
    let spreading = (0..p.deployments.len()).any(|di| model.spreads(di));
    let pods = model.pods_of(&greedy);
    let mut lex = model.lexicographic(&tiers, budget, true, &greedy, pods.as_ref())?;
    if spreading {
        match model.lexicographic(&tiers, budget, false, &lex.counts, lex.pods.as_ref()) {
            Ok(free) => lex = free,
            Err(e) => {
                lex.proven = false;
                lex.timed_out |= e.timed_out;
            }
        }
    }
    let tier_sum = |c: &[Vec<u32>], t: i32| model.tier_sum(c, t);
    let Lexicographic { counts: mut best, pods, at_least, mut proven, mut timed_out, values, hold } = lex;
    // Preferences, every tier fixed: earlier alternatives, preferred capacity types, then price.
    let max_price = p.deployments.iter().flat_map(|d| &d.options).map(|o| o.price_micros).max().unwrap_or(1).max(1);
    let built = model.build(
        |d, k| {
            let o = &d.options[k];
            -(f64::from(o.rank - 1) * 4.0 + f64::from(o.capacity_type_rank) + o.price_micros as f64 / max_price as f64)
        },
        &at_least,
        if values.is_none() { pods.as_ref().map(|q| (best.as_slice(), q)) } else { None },
        hold,
    );
    let warm = match (values, &built.warm) {
        (Some(v), _) => built.all.iter().copied().zip(v).collect(),
        (None, w) => w.clone().unwrap_or_default(),
    };
    if let Ok(step) = run(&built, budget, warm) {
        let c = counts(&built, &step.values);
        timed_out |= step.timed_out;
        if tiers.iter().all(|&t| tier_sum(&c, t) >= tier_sum(&best, t)) {
            best = c;
            proven &= step.proven;
        }
    }
    let mut guide = Guide::new();
    for (d, xs) in p.deployments.iter().zip(&best) {
        let per: BTreeMap<(usize, u32), u32> =
            d.options.iter().zip(xs).filter(|(_, n)| **n > 0).fold(BTreeMap::new(), |mut m, (o, &n)| {
                *m.entry((o.pool, o.rank)).or_default() += n;
                m
            });
        guide.insert(d.name.clone(), per);
    }
    let tiers = tiers.iter().map(|&t| (t, tier_sum(&best, t))).collect();
    Ok(Solved { guide, proven, timed_out, tiers, note: None })
}

/// One lexicographic round's answer.
struct Lexicographic {
    /// Replicas per deployment and option.
    counts: Vec<Vec<u32>>,
    /// Their pods over node groups.
    pods: Option<Pods>,
    /// Every variable's value (of a program built with `hold`), unless `counts` are `from`'s.
    values: Option<Vec<f64>>,
    hold: bool,
    /// Per tier, the replicas it keeps.
    at_least: Vec<(i32, f64)>,
    proven: bool,
    timed_out: bool,
}

impl Model<'_> {
    /// Adds to `values` (a solution of `built`) replicas of the deployments below tier `t`
    /// wherever they still fit as the program counts room, in solve order, each on its first
    /// option (by alternative, capacity type, price) that takes one within its limits. Only
    /// deployments the program places freely and that do not spread are filled, so every
    /// constraint still holds: the answer stays a solution, with at least its objective.
    fn fill(&self, built: &Built, values: &mut [f64], t: i32) {
        let z_of: HashMap<(usize, usize, u32, usize), usize> = built.z_at.iter().copied().collect();
        let mut used: HashMap<(usize, usize), u32> = HashMap::new();
        for &((di, k, s, gi), at) in &built.z_at {
            let pool = self.p.deployments[di].options[k].pool;
            *used.entry((pool, gi)).or_default() += s * values[at].round().max(0.0) as u32;
        }
        for (di, d) in self.p.deployments.iter().enumerate() {
            if d.priority >= t || self.fixed[di].is_some() || d.spread.is_some() {
                continue;
            }
            let at = built.x_at[di].clone();
            let mut xs: Vec<u32> = values[at.clone()].iter().map(|v| v.round().max(0.0) as u32).collect();
            let mut order: Vec<usize> = (0..d.options.len()).collect();
            order.sort_by_key(|&k| {
                let o = &d.options[k];
                (o.rank, o.capacity_type_rank, o.price_micros, k)
            });
            'replica: while xs.iter().sum::<u32>() < d.replicas {
                for &k in &order {
                    let o = &d.options[k];
                    let per_rank: u32 =
                        d.options.iter().zip(&xs).filter(|(q, _)| q.rank == o.rank).map(|(_, n)| n).sum();
                    let spent: u64 = d.options.iter().zip(&xs).map(|(q, &n)| q.price_micros * u64::from(n)).sum();
                    if d.alternatives[(o.rank - 1) as usize].1.is_some_and(|m| per_rank >= m)
                        || d.max_cost_micros.is_some_and(|m| spent + o.price_micros > m)
                    {
                        continue;
                    }
                    // Each pod to the group with the least room that takes it (at most one pod of
                    // a replica per node where pods need distinct nodes).
                    let mut took: Vec<(usize, u32)> = Vec::new();
                    let fits = d.pods.iter().all(|&s| {
                        let best = self.groups[o.pool]
                            .iter()
                            .enumerate()
                            .filter(|&(gi, &(free, n))| {
                                let left = (free * n)
                                    .saturating_sub(used.get(&(o.pool, gi)).copied().unwrap_or(0))
                                    .saturating_sub(took.iter().filter(|(g, _)| *g == gi).map(|(_, s)| s).sum::<u32>());
                                let pods = z_of.get(&(di, k, s, gi)).map_or(0, |&i| values[i].round() as u32)
                                    + took.iter().filter(|(g, q)| *g == gi && *q == s).count() as u32;
                                free >= s && left >= s && (!d.distinct_nodes || pods < n * (xs[k] + 1))
                            })
                            .min_by_key(|&(gi, &(free, n))| {
                                ((free * n).saturating_sub(used.get(&(o.pool, gi)).copied().unwrap_or(0)), gi)
                            })
                            .map(|(gi, _)| gi);
                        best.map(|gi| took.push((gi, s))).is_some()
                    });
                    if !fits {
                        continue;
                    }
                    for (gi, s) in took {
                        *used.entry((o.pool, gi)).or_default() += s;
                        if let Some(&i) = z_of.get(&(di, k, s, gi)) {
                            values[i] = values[i].round() + 1.0;
                        }
                    }
                    xs[k] += 1;
                    values[at.start + k] = f64::from(xs[k]);
                    continue 'replica;
                }
                break;
            }
        }
    }

    /// Replicas of tier `t` in `c`.
    fn tier_sum(&self, c: &[Vec<u32>], t: i32) -> u32 {
        self.p.deployments.iter().zip(c).filter(|(d, _)| d.priority == t).map(|(_, xs)| xs.iter().sum::<u32>()).sum()
    }

    /// The most replicas for each tier in turn (`tiers`, highest first), each fixed before the
    /// next, starting from `from` (counts per option, with their pods when they pack); `hold` as
    /// in [`Model::build`]. A tier never gets less than `from` gives it while every higher tier
    /// has what `from` gives it (`from` is a solution too).
    fn lexicographic(
        &self,
        tiers: &[i32],
        budget: Budget,
        hold: bool,
        from: &[Vec<u32>],
        pods: Option<&Pods>,
    ) -> Result<Lexicographic, Unsolved> {
        let mut at_least: Vec<(i32, f64)> = Vec::new();
        let (mut proven, mut timed_out, mut same) = (true, false, true);
        let mut values: Option<Vec<f64>> = None;
        let mut out = (from.to_vec(), pods.cloned());
        for &t in tiers {
            // The tier's replicas; in the first round (`hold`) also the next two tiers' at
            // weights that sum to less than one replica of the tier above them (the tier comes
            // first, and the answer is a good start for the next steps). The second round counts
            // the tier alone: on the crowded fleets its search reaches the tier's optimum more
            // often so (the fill below gives the lower tiers their start).
            let below: u32 = self.p.deployments.iter().filter(|d| d.priority < t).map(|d| d.replicas).sum();
            let eps = if hold { 1.0 / (f64::from(below) + 1.0) } else { 0.0 };
            let at = tiers.iter().position(|&u| u == t).unwrap_or(0);
            let objective = |d: &ProblemDeployment, _| match tiers.iter().position(|&u| u == d.priority) {
                Some(j) if j == at => 1.0,
                Some(j) if j == at + 1 => eps,
                Some(j) if j == at + 2 => eps * eps,
                _ => 0.0,
            };
            let built =
                self.build(objective, &at_least, if values.is_none() { pods.map(|q| (from, q)) } else { None }, hold);
            // The first step starts from `from` (only its counts when its pods do not pack as the
            // model's groups count them: the solver completes or drops them), each next one
            // from the step before.
            let warm: Vec<(Variable, f64)> = match (&values, &built.warm) {
                (Some(v), _) => built.all.iter().copied().zip(v.iter().copied()).collect(),
                (None, Some(w)) => w.clone(),
                (None, None) => built
                    .x
                    .iter()
                    .zip(from)
                    .flat_map(|(xs, g)| xs.iter().copied().zip(g.iter().map(|&n| f64::from(n))))
                    .collect(),
            };
            let mut step = run(&built, budget, warm)?;
            proven &= step.proven;
            timed_out |= step.timed_out;
            // The step maximised this tier; the lower ones get what still fits (a better start
            // for their own steps than what the search left them).
            self.fill(&built, &mut step.values, t);
            let counts = counts(&built, &step.values);
            let found: Pods = built
                .z_at
                .iter()
                .map(|&(key, at)| (key, step.values[at]))
                .filter(|&(_, v)| v > 0.5)
                .map(|(key, v)| (key, v.round() as u32))
                .collect();
            let (got, had) = (self.tier_sum(&counts, t), self.tier_sum(from, t));
            if same && got < had {
                // The search fell short of `from` within its budget: `from` is the better answer
                // so far, and the next step starts from it again.
                at_least.push((t, f64::from(had)));
                out = (from.to_vec(), pods.cloned());
                values = None;
                continue;
            }
            at_least.push((t, f64::from(got)));
            same &= got == had;
            out = (counts, Some(found));
            values = Some(step.values);
        }
        let (counts, pods) = out;
        Ok(Lexicographic { counts, pods, values, hold, at_least, proven, timed_out })
    }
}

#[cfg(test)]
mod tests {
    use super::groups;

    #[test]
    fn node_groups_sum_only_where_exact() {
        // 8-device nodes with pods of 1, 2, 4, 8: equal free counts summed.
        assert_eq!(groups(&[8, 8, 8, 0], &[1, 2, 8]), (vec![(8, 3)], vec![Some(0), Some(0), Some(0), None]));
        // 6 free is not a multiple of 4: single nodes.
        assert_eq!(groups(&[6, 6, 8], &[4, 8]), (vec![(6, 1), (6, 1), (8, 1)], vec![Some(0), Some(1), Some(2)]));
        // Sizes 3 and 2 do not divide each other: single nodes.
        assert_eq!(groups(&[6, 8, 6], &[2, 3]), (vec![(6, 1), (6, 1), (8, 1)], vec![Some(0), Some(2), Some(1)]));
    }
}
