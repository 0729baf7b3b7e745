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
//! at most one per node and replica). Deployments it does not reason about keep their greedy
//! counts as constants: those that spread (the greedy's spread rule depends on the order
//! replicas are placed in) and those that run somewhere (stickiness). The budget is in
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
    /// Largest model (integer variables) tried; a larger fleet keeps the greedy plan.
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
    /// Why the exact mode's answer was not used, when it was not.
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
/// exact (every pod size divides the next and the free count), else split into single nodes.
fn groups(free_per_node: &[u32], sizes: &[u32]) -> Vec<(u32, u32)> {
    let mut counts: BTreeMap<u32, u32> = BTreeMap::new();
    for &f in free_per_node.iter().filter(|&&f| f > 0) {
        *counts.entry(f).or_default() += 1;
    }
    let mut chain: Vec<u32> = sizes.to_vec();
    chain.sort_unstable();
    chain.dedup();
    let divisible = chain.windows(2).all(|w| w[1] % w[0] == 0);
    let mut out = Vec::new();
    for (free, n) in counts {
        let exact = n == 1 || (divisible && chain.iter().filter(|&&s| s <= free).all(|s| free % s == 0));
        if exact {
            out.push((free, n));
        } else {
            out.extend(std::iter::repeat_n((free, 1), n as usize));
        }
    }
    out
}

/// The model: variables per (deployment, option), and what each step needs to rebuild it.
struct Model<'p> {
    p: &'p Problem,
    /// Per deployment: fixed counts per option (`Some`) or free.
    fixed: Vec<Option<Vec<u32>>>,
    groups: Vec<Vec<(u32, u32)>>,
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
}

impl<'p> Model<'p> {
    fn new(p: &'p Problem, fixed: Vec<Option<Vec<u32>>>) -> Self {
        let sizes: Vec<u32> = p.deployments.iter().flat_map(|d| d.pods.iter().copied()).collect();
        let groups: Vec<Vec<(u32, u32)>> = p.pools.iter().map(|q| groups(&q.free_per_node, &sizes)).collect();
        let mut variables = 0;
        for d in &p.deployments {
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
        }
        Self { p, fixed, groups, variables }
    }

    /// The program with objective coefficients per (deployment, option) from `objective`, and
    /// `at_least` (per tier: the sum of its replicas) as constraints.
    fn build(&self, objective: impl Fn(&ProblemDeployment, usize) -> f64, at_least: &[(i32, f64)]) -> Built {
        let p = self.p;
        let mut mip = microlp::Problem::new(OptimizationDirection::Maximize);
        let mut x: Vec<Vec<Variable>> = Vec::with_capacity(p.deployments.len());
        let mut x_at = Vec::with_capacity(p.deployments.len());
        let mut all = Vec::new();
        // Per (pool, group): (devices per pod, pods variable).
        let mut used: HashMap<(usize, usize), Vec<(f64, Variable)>> = HashMap::new();
        for (di, d) in p.deployments.iter().enumerate() {
            let most = d.replicas.min(i32::MAX as u32) as i32;
            let xs: Vec<Variable> = d
                .options
                .iter()
                .enumerate()
                .map(|(k, _)| match &self.fixed[di] {
                    Some(counts) => {
                        let v = counts[k].min(i32::MAX as u32) as i32;
                        mip.add_integer_var(objective(d, k), (v, v))
                    }
                    None => mip.add_integer_var(objective(d, k), (0, most)),
                })
                .collect();
            x_at.push(all.len()..all.len() + xs.len());
            all.extend(xs.iter().copied());
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
                        let z = mip.add_integer_var(0.0, (0, most.saturating_mul(t as i32)));
                        all.push(z);
                        if d.distinct_nodes {
                            // At most one pod of a replica per node: n nodes hold at most n pods
                            // per replica.
                            mip.add_constraint([(z, 1.0), (xs[k], -f64::from(n))], ComparisonOp::Le, 0.0);
                        }
                        zs.push((z, 1.0));
                        used.entry((o.pool, gi)).or_default().push((f64::from(s), z));
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
            let terms: Vec<(Variable, f64)> = used[key].iter().map(|&(s, z)| (z, s)).collect();
            mip.add_constraint(terms, ComparisonOp::Le, f64::from(free) * f64::from(n));
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
        Built { mip, x, all, x_at }
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
    let model = Model::new(p, fixed);
    if model.variables > options.max_variables {
        return Err(Unsolved::from(format!(
            "the model would have {} integer variables, more than the {} allowed",
            model.variables, options.max_variables
        )));
    }
    let mut tiers: Vec<i32> = p.deployments.iter().map(|d| d.priority).collect();
    tiers.sort_unstable_by(|a, b| b.cmp(a));
    tiers.dedup();
    let tier_sum = |c: &[Vec<u32>], t: i32| -> u32 {
        p.deployments.iter().zip(c).filter(|(d, _)| d.priority == t).map(|(_, xs)| xs.iter().sum::<u32>()).sum()
    };
    let mut at_least: Vec<(i32, f64)> = Vec::new();
    let mut proven = true;
    let mut timed_out = false;
    let budget =
        Budget { max_nodes: options.max_nodes, deadline: options.max_time.map(|t| std::time::Instant::now() + t) };
    let mut start: Option<Vec<f64>> = None;
    let mut best = greedy.clone();
    for &t in &tiers {
        let built = model.build(|d, _| if d.priority == t { 1.0 } else { 0.0 }, &at_least);
        // The first step starts from the greedy's counts (the pods' split left to the solver),
        // each next one from the step before.
        let warm: Vec<(Variable, f64)> = match &start {
            Some(values) => built.all.iter().copied().zip(values.iter().copied()).collect(),
            None => built
                .x
                .iter()
                .zip(&greedy)
                .flat_map(|(xs, g)| xs.iter().copied().zip(g.iter().map(|&n| f64::from(n))))
                .collect(),
        };
        let step = run(&built, budget, warm)?;
        proven &= step.proven;
        timed_out |= step.timed_out;
        let values = step.values;
        best = counts(&built, &values);
        // Never below what the greedy placed in this tier (its plan is a solution too).
        at_least.push((t, f64::from(tier_sum(&best, t).max(tier_sum(&greedy, t)))));
        start = Some(values);
    }
    // Preferences, every tier fixed: earlier alternatives, preferred capacity types, then price.
    let max_price = p.deployments.iter().flat_map(|d| &d.options).map(|o| o.price_micros).max().unwrap_or(1).max(1);
    let built = model.build(
        |d, k| {
            let o = &d.options[k];
            -(f64::from(o.rank - 1) * 4.0 + f64::from(o.capacity_type_rank) + o.price_micros as f64 / max_price as f64)
        },
        &at_least,
    );
    let warm = start.map(|values| built.all.iter().copied().zip(values).collect()).unwrap_or_default();
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
    Ok(Solved { guide, proven, timed_out, tiers })
}

#[cfg(test)]
mod tests {
    use super::groups;

    #[test]
    fn node_groups_sum_only_where_exact() {
        // 8-device nodes with pods of 1, 2, 4, 8: equal free counts summed.
        assert_eq!(groups(&[8, 8, 8, 0], &[1, 2, 8]), vec![(8, 3)]);
        // 6 free is not a multiple of 4: single nodes.
        assert_eq!(groups(&[6, 6, 8], &[4, 8]), vec![(6, 1), (6, 1), (8, 1)]);
        // Sizes 3 and 2 do not divide each other: single nodes.
        assert_eq!(groups(&[6, 6], &[2, 3]), vec![(6, 1), (6, 1)]);
    }
}
