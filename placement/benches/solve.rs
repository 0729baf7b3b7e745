//! Solver benchmarks over generated fleets (`placement::generate`, seed 1): a full solve at
//! 10 / 100 / 1,000 clusters × 50 / 500 / 5,000 deployments, and the incremental case, one
//! deployment's replicas changed on the 1,000 × 5,000 fleet whose deployments all run where
//! the previous plan put them (sticky). Reproduce an input with
//! `cargo run -p flotilla-placement --example gen_fleet -- --clusters 1000 --deployments 5000 --seed 1`.
//! Results and the machine are in `docs/benchmarks.md`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;
use std::hint::black_box;
use std::time::Duration;

use criterion::{BenchmarkId, Criterion, SamplingMode, criterion_group, criterion_main};
use flotilla_apis::cel::SelectorEngine;
use flotilla_placement::devices::{ClassMatch, DeviceMatcher};
use flotilla_placement::filters::static_verdicts;
use flotilla_placement::generate::{GenSpec, generate, with_current};
use flotilla_placement::{FleetSnapshot, Replanner, SolveOptions, solve};

/// As the binaries that solve (`fleetctl`, the controller) allocate.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const SIZES: [(usize, usize); 9] =
    [(10, 50), (10, 500), (10, 5_000), (100, 50), (100, 500), (100, 5_000), (1_000, 50), (1_000, 500), (1_000, 5_000)];

fn fleet(clusters: usize, deployments: usize) -> FleetSnapshot {
    generate(&GenSpec { clusters, deployments, seed: 1 })
}

fn full_solve(c: &mut Criterion) {
    let mut group = c.benchmark_group("solve");
    // Flat sampling: a slow solve runs once per sample instead of 1, 2, ..., 10 times.
    group.sampling_mode(SamplingMode::Flat).sample_size(10);
    group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    for (clusters, deployments) in SIZES {
        let snap = fleet(clusters, deployments);
        let id = BenchmarkId::from_parameter(format!("{clusters}x{deployments}"));
        group.bench_with_input(id, &snap, |b, snap| b.iter(|| solve(black_box(snap), &SolveOptions::default())));
    }
    // The greedy pass alone on the largest fleet: what the improvement phase adds.
    let snap = fleet(1_000, 5_000);
    let greedy = SolveOptions { max_improvement: 0, ..SolveOptions::default() };
    group.bench_function("1000x5000/greedy-only", |b| b.iter(|| solve(black_box(&snap), &greedy)));
    group.finish();
}

/// The 1,000 × 5,000 fleet running its own plan, with one deployment scaled by +2 replicas.
fn changed_one(c: &mut Criterion) {
    let base = fleet(1_000, 5_000);
    let running = with_current(&base, &solve(&base, &SolveOptions::default()));
    let mut changed = running.clone();
    let target = changed.deployments.iter().position(|d| d.spec.replicas > 0).unwrap();
    changed.deployments[target].spec.replicas += 2;

    let mut group = c.benchmark_group("replan");
    group.sampling_mode(SamplingMode::Flat).sample_size(10);
    group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    group.bench_function("1000x5000/unchanged", |b| {
        b.iter(|| solve(black_box(&running), &SolveOptions::default()));
    });
    group.bench_function("1000x5000/one-deployment-scaled", |b| {
        b.iter(|| solve(black_box(&changed), &SolveOptions::default()));
    });
    group.finish();
}

/// The incremental re-plan (`Replanner`) on the 1,000 × 5,000 fleet running its own plan: one
/// deployment scaled by +2 replicas and back, one re-plan per iteration from the other state.
/// With the default options the plan leaves replicas for the improvement phase, so every
/// re-plan solves whole; with the phase off (`greedy-only`) the re-plan reuses every step the
/// change cannot reach.
fn incremental(c: &mut Criterion) {
    let base = fleet(1_000, 5_000);
    let mut group = c.benchmark_group("replan-incremental");
    group.sampling_mode(SamplingMode::Flat).sample_size(10);
    group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    let greedy = SolveOptions { max_improvement: 0, ..SolveOptions::default() };
    for (label, options) in [("default", SolveOptions::default()), ("greedy-only", greedy)] {
        let running = with_current(&base, &solve(&base, &options));
        let mut changed = running.clone();
        let target = changed.deployments.iter().position(|d| d.spec.replicas > 0).unwrap();
        changed.deployments[target].spec.replicas += 2;
        let mut r = Replanner::new(&running, options.clone());
        r.replan(&changed);
        eprintln!("1000x5000 one deployment scaled, {label}: {:?}", r.stats());
        let mut flip = false;
        group.bench_function(format!("1000x5000/one-deployment-scaled/{label}"), |b| {
            b.iter(|| {
                flip = !flip;
                let snap = if flip { &running } else { &changed };
                r.replan(black_box(snap)).deployments.len()
            });
        });
    }
    // With FleetQuotas on two of the four namespaces (half of what each holds, in devices, so
    // both bind): a step reads its namespace's room, and runs again only where that answers one
    // of its checks otherwise.
    let free = solve(&base, &SolveOptions::default());
    let held = flotilla_placement::quota_usage(&with_quotas(&base, 1_000_000), &free);
    let mut limited = base.clone();
    limited.quotas = with_quotas(&base, 0).quotas;
    for (q, u) in limited.quotas.iter_mut().zip(&held) {
        q.spec.devices[0].max = (u.limits[0].used / 2) as u32;
    }
    let running = with_current(&limited, &solve(&limited, &SolveOptions::default()));
    let mut changed = running.clone();
    let target = changed.deployments.iter().position(|d| d.spec.replicas > 0).unwrap();
    changed.deployments[target].spec.replicas += 2;
    let mut r = Replanner::new(&running, SolveOptions::default());
    r.replan(&changed);
    eprintln!("1000x5000 one deployment scaled, with quotas: {:?}", r.stats());
    let mut flip = false;
    group.bench_function("1000x5000/one-deployment-scaled/with-quotas", |b| {
        b.iter(|| {
            flip = !flip;
            let snap = if flip { &running } else { &changed };
            r.replan(black_box(snap)).deployments.len()
        });
    });
    group.finish();
}

/// `snapshot` with a FleetQuota of `max` devices on namespaces `ml` and `search`.
fn with_quotas(snapshot: &FleetSnapshot, max: u32) -> FleetSnapshot {
    let mut s = snapshot.clone();
    s.quotas = ["ml", "search"]
        .iter()
        .map(|ns| flotilla_placement::QuotaView {
            namespace: (*ns).into(),
            name: "devices".into(),
            spec: serde_json::from_value(serde_json::json!({"devices": [{"max": max}]})).unwrap(),
        })
        .collect();
    s
}

/// The solver's stages on the 1,000 × 5,000 fleet, measured apart with the same public
/// pieces the solver calls: the static filters for every (deployment, cluster) pair, the
/// device match for every (deployment, cluster, pool, alternative), and the fixed cost of a
/// CEL engine with every distinct selector and device compiled.
fn parts(c: &mut Criterion) {
    let snap = fleet(1_000, 5_000);
    let pools: usize = snap.clusters.iter().map(|c| c.pools.len()).sum();
    let alts: usize = snap.deployments.iter().map(|d| d.spec.devices.alternatives.len()).sum();
    let plan = solve(&snap, &SolveOptions::default());
    let rejections: usize = plan.deployments.iter().map(|d| d.rejections.len()).sum();
    let rejection_bytes: usize =
        plan.deployments.iter().flat_map(|d| &d.rejections).map(|r| r.message.len() + r.cluster.len()).sum();
    let (mut passing, mut evaluations) = (0usize, 0usize);
    for d in &snap.deployments {
        for cluster in &snap.clusters {
            if static_verdicts(&d.spec.placement, cluster, false, false).iter().all(|v| v.pass) {
                passing += 1;
                evaluations += cluster.pools.len() * d.spec.devices.alternatives.len();
            }
        }
    }
    eprintln!(
        "1000x5000: {} (deployment, cluster) pairs, {passing} pass the static filters; {} (deployment, cluster, \
         pool, alternative) combinations, {evaluations} of them on passing clusters; {} rejections in the plan \
         ({} bytes of message)",
        snap.clusters.len() * snap.deployments.len(),
        pools * alts,
        rejections,
        rejection_bytes
    );
    let mut group = c.benchmark_group("parts");
    group.sampling_mode(SamplingMode::Flat).sample_size(10);
    group.warm_up_time(Duration::from_millis(500)).measurement_time(Duration::from_secs(3));
    group.bench_function("1000x5000/static-filters", |b| {
        b.iter(|| {
            let mut passed = 0usize;
            for d in &snap.deployments {
                for cluster in &snap.clusters {
                    let v = static_verdicts(&d.spec.placement, cluster, false, false);
                    passed += usize::from(v.iter().all(|v| v.pass));
                }
            }
            passed
        });
    });
    group.bench_function("1000x5000/device-match", |b| {
        b.iter(|| {
            let mut matcher = DeviceMatcher::new(&snap.classes);
            let mut matched = 0usize;
            for d in &snap.deployments {
                for cluster in &snap.clusters {
                    for pool in &cluster.pools {
                        for alt in &d.spec.devices.alternatives {
                            matched += usize::from(matcher.matches(alt, &pool.class) == ClassMatch::Match);
                        }
                    }
                }
            }
            matched
        });
    });
    let exprs: BTreeSet<&str> = snap
        .deployments
        .iter()
        .flat_map(|d| &d.spec.devices.alternatives)
        .flat_map(|a| &a.selectors)
        .map(|e| e.0.as_str())
        .collect();
    group.bench_function("cel-setup", |b| {
        b.iter(|| {
            let engine = SelectorEngine::new();
            let selectors: Vec<_> = exprs.iter().map(|e| engine.compile(e).unwrap()).collect();
            let devices: Vec<_> = snap.classes.values().map(|c| engine.device(&c.spec.device).unwrap()).collect();
            (selectors.len(), devices.len())
        });
    });
    group.finish();
}

/// What the benchmark input costs to build, for scale.
fn generate_fleet(c: &mut Criterion) {
    let mut group = c.benchmark_group("generate");
    group.sampling_mode(SamplingMode::Flat).sample_size(10);
    group.warm_up_time(Duration::from_millis(200)).measurement_time(Duration::from_secs(2));
    group.bench_function("1000x5000", |b| b.iter(|| fleet(black_box(1_000), 5_000)));
    group.finish();
}

criterion_group!(benches, full_solve, changed_one, incremental, parts, generate_fleet);
criterion_main!(benches);
