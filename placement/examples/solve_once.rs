//! Solves one generated fleet once and prints how long it took: a target for profilers
//! (`perf record -g target/release/examples/solve_once 1000 5000 1`). With `--replan`, the
//! fleet first runs its own plan (every deployment's current placements set from it) and the
//! re-plan is what is timed. The process's peak RSS is printed last. With `--dump FILE` the
//! plan is also written to FILE as JSON (to check that a change to the solver keeps every plan
//! byte for byte: dump before and after, then `cmp`); with `--explain` every deployment is
//! solved once more in explain mode and those plans are dumped too (FILE.explain).

use std::time::Instant;

/// As the binaries that solve (`fleetctl`, the controller) allocate.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    let args: Vec<String> = std::env::args().collect();
    if let Some(path) = args.iter().position(|a| a == "--dump").and_then(|i| args.get(i + 1)) {
        let json = serde_json::to_string_pretty(&plan).unwrap_or_default();
        if let Err(e) = std::fs::write(path, json) {
            eprintln!("solve_once: cannot write {path}: {e}");
        }
        if args.iter().any(|a| a == "--explain") {
            let mut out = String::new();
            for d in snap.deployments.iter().step_by(snap.deployments.len().div_ceil(50).max(1)) {
                let explain = SolveOptions { explain: Some((d.namespace.clone(), d.name.clone())), ..options.clone() };
                let p = solve(&snap, &explain);
                let one = p.deployments.iter().find(|x| x.namespace == d.namespace && x.name == d.name);
                out.push_str(&serde_json::to_string_pretty(&one).unwrap_or_default());
            }
            if let Err(e) = std::fs::write(format!("{path}.explain"), out) {
                eprintln!("solve_once: cannot write {path}.explain: {e}");
            }
        }
    }
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
