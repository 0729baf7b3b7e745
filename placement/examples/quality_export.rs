//! Writes generated fleets as exact-solver input, one JSON document per line: the problem as
//! the solver sees it after filtering (`flotilla_placement::problem`) and where our plan put
//! each deployment's replicas. `scripts/solver-quality.py` reads it and compares the plan with
//! an exact optimum. Usage: `quality_export [FLEETS] [FIRST_SEED] [--greedy] [--exact] [--crowded]
//! > fleets.jsonl` (`--greedy`: the plan without the improvement phase; `--exact`: with the exact
//! mode, `SolveOptions::exact`). Fleet `i` has 5–15
//! clusters and 5–30 deployments drawn from its seed, like `gen_fleet`; with `--crowded` it is
//! a crowded fleet (`flotilla_placement::crowded`) of 4–9 clusters and 8–27 deployments.

use std::collections::HashMap;
use std::io::Write as _;

use flotilla_placement::crowded::generate_crowded;
use flotilla_placement::generate::{GenSpec, generate};
use flotilla_placement::{SolveOptions, problem, solve};

fn main() -> std::io::Result<()> {
    let args: Vec<u64> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let fleets = args.first().copied().unwrap_or(120);
    let first = args.get(1).copied().unwrap_or(1);
    let mut options = if std::env::args().any(|a| a == "--greedy") {
        SolveOptions { max_improvement: 0, ..SolveOptions::default() }
    } else {
        SolveOptions::default()
    };
    if std::env::args().any(|a| a == "--exact") {
        options.exact = Some(flotilla_placement::ExactOptions::default());
    }
    let crowded = std::env::args().any(|a| a == "--crowded");
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for seed in first..first + fleets {
        // Sizes from the seed, spread over the whole range.
        let mix = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
        let (spec, snap) = if crowded {
            let spec = GenSpec { clusters: 4 + (mix % 6) as usize, deployments: 8 + ((mix / 6) % 20) as usize, seed };
            (spec, generate_crowded(&spec))
        } else {
            let spec = GenSpec { clusters: 5 + (mix % 11) as usize, deployments: 5 + ((mix / 11) % 26) as usize, seed };
            (spec, generate(&spec))
        };
        let p = problem::problem(&snap);
        let started = std::time::Instant::now();
        let plan = solve(&snap, &options);
        let solve_micros = started.elapsed().as_micros() as u64;
        let pool_ix: HashMap<(&str, &str), usize> =
            p.pools.iter().enumerate().map(|(i, x)| ((x.cluster.as_str(), x.pool.as_str()), i)).collect();
        let by_name: HashMap<String, &flotilla_placement::DeploymentPlan> =
            plan.deployments.iter().map(|d| (format!("{}/{}", d.namespace, d.name), d)).collect();
        // Per deployment of the problem: (pool, rank, replicas) of the plan.
        let placed: Vec<Vec<(usize, u32, u32)>> = p
            .deployments
            .iter()
            .map(|d| {
                by_name.get(&d.name).map_or_else(Vec::new, |dp| {
                    dp.assignments
                        .iter()
                        .filter_map(|a| {
                            pool_ix
                                .get(&(a.cluster.as_str(), a.pool.as_str()))
                                .map(|&i| (i, a.fallback_rank, a.replicas))
                        })
                        .collect()
                })
            })
            .collect();
        // The plan's solve order as problem indexes: the usual one, but a tier the plan traded in
        // another order (`Plan::trades`) follows that order (spread is judged against the
        // deployments solved before a deployment).
        let traded: HashMap<&str, usize> =
            plan.trades.iter().flat_map(|t| t.order.iter().enumerate().map(|(k, n)| (n.as_str(), k))).collect();
        let mut solve_order: Vec<usize> = (0..p.deployments.len()).collect();
        solve_order.sort_by_key(|&i| {
            let d = &p.deployments[i];
            (std::cmp::Reverse(d.priority), traded.get(d.name.as_str()).copied().unwrap_or(i))
        });
        let doc = serde_json::json!({
            "spec": {"clusters": spec.clusters, "deployments": spec.deployments, "seed": spec.seed, "crowded": crowded},
            "problem": p,
            "placed": placed,
            "solveOrder": solve_order,
            "solveMicros": solve_micros,
            "exact": plan.exact,
        });
        writeln!(out, "{doc}")?;
    }
    Ok(())
}
