//! Same-tier trades, after the improvement phase. The greedy pass fills a priority tier in
//! creation order, so an earlier deployment may take room where several replicas of later
//! ones of the same priority would fit (two TP8 replicas on the only nodes where eight TP2
//! replicas fit), or hold the cheap pool a later one needs to stay within its cost ceiling.
//! Here a tier left short is solved again in a few other orders (smallest replicas first;
//! the deployments left short first; those with a cost ceiling first; ...), each a whole greedy
//! pass with its improvement phase, and an order is kept only if it places strictly more of
//! the tier, no higher tier's deployment loses a replica, no replica that runs is given up,
//! and no minimum of the tier gets further from met. Running replicas are kept first in every
//! order, as always, so only replicas newly planned are traded. The order is recorded in the
//! plan (`Plan::trades`, and per deployment `DeploymentPlan::trade`) with what each deployment
//! gave up. Deterministic (fixed orders) and
//! bounded by the improvement budget: tries start only on fleets whose greedy pass is small
//! against it, and each try's evaluations are charged to it.

use flotilla_apis::common::parse_price_micros;

use super::{Ctx, Fixed, Free, SolveOptions, initial_free};
use crate::devices::{DeviceMatcher, ReplicaShape};
use crate::filters::StaticMemo;
use crate::plan::{DeploymentPlan, GaveUp, Plan, TierTrade, Trade};
use crate::snapshot::{DeploymentView, FleetSnapshot};

/// Rounds of tries per tier: after an order is kept, the next round tries orders derived from it.
const ROUNDS: usize = 2;

/// A try is started only when the budget left covers this many greedy passes of the fleet's
/// size (pools × device alternatives), so fleets beyond about 30 clusters × 100 deployments
/// never start one (each try is a whole solve: at 50 × 200, twelve tries cost 13 times the
/// solve).
const PASSES_AHEAD: u64 = 32;

/// The plan with the tiers it left short solved in other orders where that places strictly more
/// of them (`None`: no trade, the plan stands). `order` is the usual solve order and `plan`'s
/// deployments follow it.
pub(super) fn trade(
    snapshot: &FleetSnapshot,
    options: &SolveOptions,
    fixed: &Fixed,
    order: &[&DeploymentView],
    plan: &Plan,
) -> Option<Plan> {
    let n = order.len();
    if !options.trades
        || options.max_improvement == 0
        || plan.deployments.len() != n
        || plan.deployments.iter().all(|p| p.unplaced == 0)
    {
        return None;
    }
    // About what one greedy pass evaluates: every (pool, alternative) of every deployment.
    let pools: u64 = snapshot.clusters.iter().map(|c| c.pools.len() as u64).sum();
    let alternatives: u64 = order.iter().map(|d| d.spec.devices.alternatives.len().max(1) as u64).sum();
    let pass = pools.max(1).saturating_mul(alternatives);
    let mut budget = options.max_improvement;
    if pass.saturating_mul(PASSES_AHEAD) > budget {
        return None;
    }
    let sizes: Vec<u32> = order.iter().map(|d| ReplicaShape::of(&d.spec.topology).devices()).collect();
    let capped: Vec<bool> = order
        .iter()
        .map(|d| d.spec.placement.max_cost_per_hour.as_deref().and_then(parse_price_micros).is_some())
        .collect();
    let names: Vec<String> = order.iter().map(|d| format!("{}/{}", d.namespace, d.name)).collect();
    // perm[k]: the usual position of the deployment solved k-th.
    let mut perm: Vec<usize> = (0..n).collect();
    // The selectors compiled and the static filters judged once for every try.
    let mut matcher = DeviceMatcher::new(&snapshot.classes);
    let mut statics = StaticMemo::default();
    let mut best: Vec<DeploymentPlan> = plan.deployments.clone();
    let mut trades = Vec::new();
    let mut start = 0;
    'tiers: while start < n {
        let prio = order[start].priority();
        let end = start + order[start..].iter().take_while(|d| d.priority() == prio).count();
        let mut traded = false;
        let tier = |ps: &[DeploymentPlan]| ps[start..end].iter().map(placed).sum::<u32>();
        // (after the trades of the tiers above, which may have left this one fewer)
        let entering = tier(&best);
        for _ in 0..ROUNDS {
            if end - start < 2 || best[start..end].iter().all(|p| p.unplaced == 0) {
                break;
            }
            let cur = perm[start..end].to_vec();
            let mut kept_one = false;
            for cand in orders(&cur, &best, &sizes, &capped, &names) {
                if budget < pass.saturating_mul(PASSES_AHEAD) {
                    break 'tiers;
                }
                let mut p = perm.clone();
                p[start..end].copy_from_slice(&cand);
                let try_order: Vec<&DeploymentView> = p.iter().map(|&i| order[i]).collect();
                let (plans, cost) = solve_in(snapshot, options, fixed, &try_order, &mut matcher, &mut statics);
                budget = budget.saturating_sub(cost.max(pass));
                let mut usual: Vec<Option<DeploymentPlan>> = vec![None; n];
                for (k, pl) in plans.into_iter().enumerate() {
                    usual[p[k]] = Some(pl);
                }
                let Some(usual) = usual.into_iter().collect::<Option<Vec<_>>>() else { continue };
                if better(snapshot, order, &best, &usual, start, end) {
                    best = usual;
                    perm = p;
                    kept_one = true;
                    traded = true;
                }
            }
            if !kept_one {
                break;
            }
        }
        if traded {
            trades.push(Trade {
                priority: prio,
                order: perm[start..end].iter().map(|&i| names[i].clone()).collect(),
                placed_before: entering,
                placed_after: tier(&best),
                gave_up: Vec::new(),
            });
        }
        start = end;
    }
    if trades.is_empty() {
        return None;
    }
    // What each deployment gave up against the usual order, under the lowest trade at or
    // above its tier; and each deployment's own record.
    for (i, (was, now)) in plan.deployments.iter().zip(best.iter_mut()).enumerate() {
        let lost = placed(was).saturating_sub(placed(now));
        let prio = order[i].priority();
        let own = trades.iter().position(|t| t.priority == prio);
        let Some(k) = own.or_else(|| trades.iter().rposition(|t| t.priority > prio).filter(|_| lost > 0)) else {
            continue;
        };
        let t = &mut trades[k];
        if lost > 0 {
            t.gave_up.push(GaveUp { deployment: names[i].clone(), replicas: lost });
        }
        now.trade = Some(TierTrade {
            priority: t.priority,
            position: own.and_then(|_| t.order.iter().position(|n| *n == names[i])).map(|p| p as u32),
            tier_placed_before: t.placed_before,
            tier_placed_after: t.placed_after,
            gave_up: lost,
        });
    }
    Some(Plan { deployments: best, exact: None, quotas: Vec::new(), trades })
}

fn placed(p: &DeploymentPlan) -> u32 {
    p.desired - p.unplaced.min(p.desired)
}

/// The orders tried for a tier now solved in `cur` (usual positions): smallest replicas first
/// (then by name, so the try does not depend on the documents' order), the deployments left
/// short first, those with a cost ceiling first, the short ones first and smallest first among
/// them, and `cur` reversed; each once, `cur` itself not. (Moving each deployment to the front
/// or the back in turn as well doubled the tries and placed no more on the quality benchmark.)
fn orders(cur: &[usize], best: &[DeploymentPlan], sizes: &[u32], capped: &[bool], names: &[String]) -> Vec<Vec<usize>> {
    let short = |i: usize| best[i].unplaced > 0;
    let pos = |i: usize| cur.iter().position(|&x| x == i).unwrap_or(usize::MAX);
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut push = |mut o: Vec<usize>, key: &dyn Fn(&usize, &usize) -> std::cmp::Ordering| {
        o.sort_by(key);
        if o != cur && !out.contains(&o) {
            out.push(o);
        }
    };
    push(cur.to_vec(), &|&a, &b| sizes[a].cmp(&sizes[b]).then(names[a].cmp(&names[b])));
    push(cur.to_vec(), &|&a, &b| short(b).cmp(&short(a)).then(pos(a).cmp(&pos(b))));
    push(cur.to_vec(), &|&a, &b| capped[b].cmp(&capped[a]).then(pos(a).cmp(&pos(b))));
    push(cur.to_vec(), &|&a, &b| short(b).cmp(&short(a)).then(sizes[a].cmp(&sizes[b])).then(names[a].cmp(&names[b])));
    push(cur.to_vec(), &|&a, &b| pos(b).cmp(&pos(a)));
    out
}

/// Whether `new` (a try, in the usual order) is a trade to keep against `best` for the tier
/// `[start, end)`: per tier from the highest, the first count that differs is this tier's, and
/// larger in `new`;
/// no deployment of a higher tier places fewer, none anywhere keeps fewer of the replicas it
/// runs, no minimum of this tier or a higher one is further from met, and no FleetQuota is
/// passed.
fn better(
    snapshot: &FleetSnapshot,
    order: &[&DeploymentView],
    best: &[DeploymentPlan],
    new: &[DeploymentPlan],
    start: usize,
    end: usize,
) -> bool {
    let mut first_change = None;
    let mut s = 0;
    while s < order.len() {
        let prio = order[s].priority();
        let e = s + order[s..].iter().take_while(|d| d.priority() == prio).count();
        let (b, n): (u32, u32) = (best[s..e].iter().map(placed).sum(), new[s..e].iter().map(placed).sum());
        if b != n {
            // (the tier traded itself: a lower tier's gain never pays for a replica of this one)
            first_change = Some(s == start && n > b);
            break;
        }
        s = e;
    }
    if first_change != Some(true) {
        return false;
    }
    for i in 0..order.len() {
        let (b, n) = (&best[i], &new[i]);
        if (i < start && placed(n) < placed(b)) || kept(order[i], n) < kept(order[i], b) {
            return false;
        }
        // A minimum unmet in `new` was unmet in `best` with no more placed.
        let worse_minimum =
            n.unmet_minimums.iter().any(|u| !b.unmet_minimums.iter().any(|w| w.rank == u.rank && w.placed <= u.placed));
        if i < end && worse_minimum {
            return false;
        }
    }
    !super::quota::over(snapshot, new)
}

/// Replicas of `d` the plan keeps where they run: per (cluster, pool) it runs on, the smaller of
/// what runs there and what the plan puts there.
fn kept(d: &DeploymentView, p: &DeploymentPlan) -> u32 {
    d.current
        .iter()
        .filter(|c| c.desired > 0)
        .map(|c| {
            let there: u32 =
                p.assignments.iter().filter(|a| a.cluster == c.cluster && a.pool == c.pool).map(|a| a.replicas).sum();
            there.min(c.desired as u32)
        })
        .sum()
}

/// The greedy pass and its improvement phase over `order` (a solve order with whole tiers,
/// highest first): the plans in that order and the evaluations spent.
fn solve_in<'s>(
    snapshot: &'s FleetSnapshot,
    options: &SolveOptions,
    fixed: &Fixed,
    order: &[&DeploymentView],
    matcher: &mut DeviceMatcher<'s>,
    statics: &mut StaticMemo,
) -> (Vec<DeploymentPlan>, u64) {
    let mut free = Free::new(initial_free(snapshot));
    let (mut evaluations, mut spare) = (0u64, Vec::new());
    let mut ctx: Ctx<'_, '_> = fixed.ctx(snapshot, &mut free, matcher, statics, &mut evaluations, &mut spare);
    let mut solved = ctx.solve_tiers(order, options);
    let mut plans = std::mem::take(&mut solved.plans);
    if plans.iter().any(|p| p.unplaced > 0) {
        ctx.improve(order, &mut plans, solved, options, None);
    }
    (plans, evaluations)
}
