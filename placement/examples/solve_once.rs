//! Solves one generated fleet once and prints how long it took: a target for profilers
//! (`perf record -g target/release/examples/solve_once 1000 5000 1`). With `--replan`, the
//! fleet first runs its own plan (every deployment's current placements set from it) and the
//! re-plan is what is timed. The process's peak RSS is printed last.

use std::time::Instant;

use flotilla_placement::generate::{GenSpec, generate, with_current};
use flotilla_placement::{SolveOptions, solve};

fn main() {
    let args: Vec<u64> = std::env::args().skip(1).filter_map(|a| a.parse().ok()).collect();
    let (clusters, deployments, seed) = match args.as_slice() {
        [c, d, s] => (*c as usize, *d as usize, *s),
        _ => (1000, 5000, 1),
    };
    let snap = generate(&GenSpec { clusters, deployments, seed });
    // `--greedy`: without the improvement phase.
    let options = if std::env::args().any(|a| a == "--greedy") {
        SolveOptions { max_improvement: 0, ..SolveOptions::default() }
    } else {
        SolveOptions::default()
    };
    let snap =
        if std::env::args().any(|a| a == "--replan") { with_current(&snap, &solve(&snap, &options)) } else { snap };
    let cpu_before = cpu_ticks();
    let start = Instant::now();
    let plan = solve(&snap, &options);
    let took = start.elapsed();
    // The solve's own CPU time (ticks of 10 ms): on a loaded machine wall time says little.
    let solve_cpu = cpu_ticks().zip(cpu_before).map(|(a, b)| a.saturating_sub(b) * 10);
    let placed: u32 = plan.deployments.iter().flat_map(|d| &d.assignments).map(|a| a.replicas).sum();
    let rejections: usize = plan.deployments.iter().map(|d| d.rejections.len()).sum();
    let cpu = cpu_ticks();
    println!(
        "{clusters} x {deployments}: {took:?}, {placed} replicas placed, {rejections} rejections (solve CPU ms: \
         {solve_cpu:?}; process CPU ticks so far: {cpu:?}); peak RSS {}",
        peak_rss().unwrap_or_else(|| "unknown".into())
    );
}

/// The process's peak resident set (`VmHWM`, Linux), if readable.
fn peak_rss() -> Option<String> {
    let s = std::fs::read_to_string("/proc/self/status").ok()?;
    s.lines().find_map(|l| l.strip_prefix("VmHWM:")).map(|v| v.trim().to_string())
}

/// User + system CPU ticks of this process so far (Linux), if readable.
fn cpu_ticks() -> Option<u64> {
    let s = std::fs::read_to_string("/proc/self/stat").ok()?;
    let f: Vec<&str> = s.rsplit(')').next()?.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}
