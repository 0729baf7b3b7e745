//! Same-tier trades (`placement/src/trade.rs`): a tier the greedy pass and the improvement phase
//! left short is solved again in other orders of its deployments, and an order that places
//! strictly more of the tier is kept; never at the cost of a replica that runs or a met
//! `minReplicas` of the tier (a higher tier is solved before the tier in every order). And the per-tier counts no longer depend on the
//! documents' order on fleets where one of the orders tried is optimal.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers outside #[test] fns

use flotilla_apis::CapacityType;
use flotilla_apis::class::InferenceClassSpec;
use flotilla_apis::deployment::{ClusterPlacement, ModelDeploymentSpec};
use flotilla_placement::generate::GenSpec;
use flotilla_placement::plan::DeploymentPlan;
use flotilla_placement::{ClassView, ClusterView, DeploymentView, FleetSnapshot, Plan, PoolView, SolveOptions, solve};
use serde_json::json;

fn class(name: &str, on_demand: &str) -> (String, ClassView) {
    let spec: InferenceClassSpec = serde_json::from_value(json!({
        "device": {"driver": "gpu.nvidia.com", "attributes": {"productName": {"string": name}},
                   "capacity": {"memory": "80Gi"}},
        "devicesPerNode": 8,
        "pricePerNodeHour": {"onDemand": on_demand}
    }))
    .unwrap();
    (name.to_string(), ClassView { spec })
}

fn cluster(name: &str, class: &str, free_per_node: Vec<u32>) -> ClusterView {
    ClusterView {
        name: name.into(),
        region: format!("{name}-region"),
        jurisdiction: "EU".into(),
        ready: true,
        pools: vec![PoolView {
            name: class.into(),
            class: class.into(),
            capacity_type: Some(CapacityType::OnDemand),
            free_per_node,
            reserved_for: None,
            refused_block: None,
        }],
        ..Default::default()
    }
}

fn deployment(name: &str, created: i64, replicas: i32, tp: u32, alternatives: serde_json::Value) -> DeploymentView {
    let spec = json!({
        "model": {"name": name, "source": "hf://org/m"},
        "replicas": replicas,
        "engine": {"image": "vllm/vllm-openai:v0.11.0"},
        "topology": {"type": "TensorParallel", "devicesPerReplica": tp},
        "devices": {"alternatives": alternatives},
        "placement": {}
    });
    DeploymentView {
        namespace: "ml".into(),
        name: name.into(),
        created,
        spec: serde_json::from_value::<ModelDeploymentSpec>(spec).unwrap(),
        current: vec![],
        refused_pools: vec![],
    }
}

/// Two A100 nodes in `a`, one H100 node in `b`. `big` (two TP8 replicas, A100 first, H100 as
/// a fallback) comes first and takes both A100 nodes; `small` (eight TP2 replicas, A100 only)
/// fits there eight times.
fn fleet() -> FleetSnapshot {
    FleetSnapshot {
        classes: [class("a100", "10.00"), class("h100", "20.00")].into_iter().collect(),
        clusters: vec![cluster("a", "a100", vec![8, 8]), cluster("b", "h100", vec![8])],
        deployments: vec![
            deployment("big", 1, 2, 8, json!([{"class": "a100"}, {"class": "h100"}])),
            deployment("small", 2, 8, 2, json!([{"class": "a100"}])),
        ],
        quotas: Vec::new(),
    }
}

fn no_trades() -> SolveOptions {
    SolveOptions { trades: false, ..SolveOptions::default() }
}

fn placed(p: &DeploymentPlan) -> u32 {
    p.desired - p.unplaced
}

fn counts(plan: &Plan) -> Vec<u32> {
    plan.deployments.iter().map(placed).collect()
}

#[test]
fn a_tier_left_short_trades_a_large_replica_for_several_small_ones() {
    let snap = fleet();
    // Without trades: the improvement phase moves one `big` replica to the H100, which makes
    // room for four `small` ones; six replicas of the tier.
    let before = solve(&snap, &no_trades());
    assert_eq!(counts(&before), vec![2, 4]);
    assert!(before.trades.is_empty());
    // With them: `small` first fills both A100 nodes, `big` is placed anew on the H100: nine.
    let plan = solve(&snap, &SolveOptions::default());
    assert_eq!(counts(&plan), vec![1, 8]);
    let on = |p: &DeploymentPlan| p.assignments.iter().map(|a| (a.cluster.clone(), a.replicas)).collect::<Vec<_>>();
    assert_eq!(on(&plan.deployments[0]), vec![("b".to_string(), 1)]);
    assert_eq!(on(&plan.deployments[1]), vec![("a".to_string(), 8)]);
    // The plan says so: the order used, the tier's counts, and what `big` gave up.
    assert_eq!(plan.trades.len(), 1, "{:?}", plan.trades);
    let t = &plan.trades[0];
    assert_eq!((t.priority, t.placed_before, t.placed_after), (0, 6, 9));
    assert_eq!(t.order, vec!["ml/small".to_string(), "ml/big".to_string()]);
    assert_eq!(t.gave_up.len(), 1);
    assert_eq!((t.gave_up[0].deployment.as_str(), t.gave_up[0].replicas), ("ml/big", 1));
    // `big` still reports why its second replica has no place.
    assert_eq!(plan.deployments[0].unplaced, 1);
    assert!(!plan.deployments[0].rejections.is_empty());
    // Each deployment of the tier carries it in the JSON (its place in the order, the tier's
    // counts, what it gave up); without a trade the field is left out.
    let json = serde_json::to_value(&plan).unwrap();
    assert_eq!(
        json["deployments"][0]["trade"],
        json!({"priority": 0, "position": 1, "tierPlacedBefore": 6, "tierPlacedAfter": 9, "gaveUp": 1})
    );
    assert_eq!(
        json["deployments"][1]["trade"],
        json!({"priority": 0, "position": 0, "tierPlacedBefore": 6, "tierPlacedAfter": 9})
    );
    let json = serde_json::to_value(&before).unwrap();
    assert!(json["deployments"].as_array().unwrap().iter().all(|d| d.get("trade").is_none()));
}

#[test]
fn a_trade_never_gives_up_a_replica_that_runs() {
    // `big` runs one replica on an A100 node that is its pool's only node now; `small` ran
    // four there too. The tier keeps `big`'s (created first): solved with `small` first, the
    // tier would place four instead of one, but `big`'s running replica would go.
    let mut snap = fleet();
    snap.clusters = vec![cluster("a", "a100", vec![8])];
    snap.deployments[0].spec.replicas = 1;
    snap.deployments[0].spec.devices.alternatives.truncate(1);
    let running = |n: i32| ClusterPlacement {
        cluster: "a".into(),
        pool: "a100".into(),
        class: "a100".into(),
        capacity_type: CapacityType::OnDemand,
        fallback_rank: 1,
        desired: n,
        ready: n,
        serving: n,
        unschedulable: 0,
    };
    snap.deployments[0].current = vec![running(1)];
    snap.deployments[1].current = vec![running(4)];
    let plan = solve(&snap, &SolveOptions::default());
    assert!(plan.trades.is_empty(), "{:?}", plan.trades);
    assert_eq!(counts(&plan), vec![1, 0]);
    assert_eq!(plan, solve(&snap, &no_trades()));
}

#[test]
fn a_trade_never_leaves_a_met_minimum_unmet() {
    // `big` wants its two replicas on A100s (`minReplicas: 2` on that alternative), and has
    // them: trading them for eight `small` replicas would leave the minimum unmet.
    let mut snap = fleet();
    snap.deployments[0].spec.devices.alternatives[0].min_replicas = Some(2);
    let plan = solve(&snap, &SolveOptions::default());
    assert!(plan.trades.is_empty(), "{:?}", plan.trades);
    assert_eq!(counts(&plan), vec![2, 0]);
    assert!(plan.deployments[0].unmet_minimums.is_empty());
}

#[test]
fn trades_are_off_without_an_improvement_budget() {
    let snap = fleet();
    let plan = solve(&snap, &SolveOptions { max_improvement: 0, ..SolveOptions::default() });
    assert!(plan.trades.is_empty());
    assert_eq!(counts(&plan), vec![2, 0]);
}

/// A small seeded generator: one tier, one class every deployment may use, single-pod replicas
/// of 1, 2, 4 or 8 devices (sizes that divide each other and the node), nodes with 0, 2, 4 or
/// 8 devices free, no ceiling, no spread, no minimum, nothing running. On such fleets the
/// smallest replicas first is an order that places the most, and it is one of the orders
/// tried, so the tier's count does not depend on the documents' order.
fn divisible_fleet(seed: u64) -> FleetSnapshot {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = |n: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % n
    };
    let clusters = (0..1 + next(3))
        .map(|c| {
            let nodes = (0..1 + next(3)).map(|_| [0, 2, 4, 8, 8][next(5) as usize]).collect();
            cluster(&format!("c{c}"), "a100", nodes)
        })
        .collect();
    let deployments = (0..2 + next(5))
        .map(|i| {
            let tp = [1, 2, 4, 8][next(4) as usize];
            deployment(&format!("d{i}"), i as i64, 1 + next(4) as i32, tp, json!([{"class": "a100"}]))
        })
        .collect();
    FleetSnapshot { classes: [class("a100", "10.00")].into_iter().collect(), clusters, deployments, quotas: Vec::new() }
}

fn reversed(snap: &FleetSnapshot) -> FleetSnapshot {
    let mut snap = snap.clone();
    for d in &mut snap.deployments {
        d.created = -d.created;
    }
    snap
}

/// Replicas placed per priority tier, highest first.
fn tiers(snap: &FleetSnapshot, plan: &Plan) -> Vec<(i32, u32)> {
    let mut out: std::collections::BTreeMap<std::cmp::Reverse<i32>, u32> = Default::default();
    for (d, p) in snap.deployments.iter().map(|d| (d, plan.get(&d.namespace, &d.name).unwrap())) {
        *out.entry(std::cmp::Reverse(d.priority())).or_default() += placed(p);
    }
    out.into_iter().map(|(p, n)| (p.0, n)).collect()
}

#[test]
fn the_documents_order_of_a_tier_does_not_change_its_count_on_divisible_fleets() {
    let (mut traded, mut sensitive_without) = (0, 0);
    for seed in 0..300 {
        let snap = divisible_fleet(seed);
        let plan = solve(&snap, &SolveOptions::default());
        let other = solve(&reversed(&snap), &SolveOptions::default());
        assert_eq!(tiers(&snap, &plan), tiers(&snap, &other), "seed {seed}: {:?} / {:?}", plan.trades, other.trades);
        traded += usize::from(!plan.trades.is_empty() || !other.trades.is_empty());
        let (a, b) = (solve(&snap, &no_trades()), solve(&reversed(&snap), &no_trades()));
        sensitive_without += usize::from(tiers(&snap, &a) != tiers(&snap, &b));
    }
    // The property is the trades' doing: without them the order changes the count on some of
    // these fleets, and trades happen.
    assert!(sensitive_without > 0 && traded > 0, "{sensitive_without} {traded}");
}

/// On crowded fleets (`flotilla_placement::crowded`, the quality benchmark's) trades happen and
/// every traded plan passes the same checks as any plan: a property-test-sized sample here (the
/// independent checker of `properties.rs` runs on them too, `trades_pass_the_checker_on_crowded_fleets`).
#[test]
fn trades_happen_on_crowded_fleets_and_keep_higher_tiers_whole() {
    let mut traded = 0;
    for seed in 1..=12u64 {
        let mix = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
        let spec = GenSpec { clusters: 4 + (mix % 6) as usize, deployments: 8 + ((mix / 6) % 20) as usize, seed };
        let snap = flotilla_placement::crowded::generate_crowded(&spec);
        let plan = solve(&snap, &SolveOptions::default());
        let before = solve(&snap, &no_trades());
        if plan.trades.is_empty() {
            assert_eq!(plan, before, "seed {seed}");
            continue;
        }
        traded += 1;
        // Each trade placed strictly more of its own tier.
        for t in &plan.trades {
            assert!(t.placed_after > t.placed_before, "seed {seed}: {t:?}");
        }
        // Per tier from the highest, the first count that differs is larger.
        let (a, b) = (tiers(&snap, &plan), tiers(&snap, &before));
        let first = a.iter().zip(&b).find(|(x, y)| x.1 != y.1);
        assert!(first.is_some_and(|(x, y)| x.1 > y.1), "seed {seed}: {a:?} against {b:?}");
        // What each deployment gave up is said, exactly.
        for (p, q) in plan.deployments.iter().zip(&before.deployments) {
            let name = format!("{}/{}", p.namespace, p.name);
            let said: u32 =
                plan.trades.iter().flat_map(|t| &t.gave_up).filter(|g| g.deployment == name).map(|g| g.replicas).sum();
            assert_eq!(said, placed(q).saturating_sub(placed(p)), "seed {seed}: {name}");
            assert_eq!(p.trade.as_ref().map_or(0, |t| t.gave_up), said, "seed {seed}: {name}");
        }
    }
    assert!(traded > 0);
}

/// A measurement, not a check (docs/placement.md, known gaps): on the quality benchmark's 40
/// crowded fleets, how many change their per-tier counts when every tier's documents are taken
/// in reverse order, with and without trades. `cargo test --release -p flotilla-placement --test
/// trade -- --ignored --nocapture`.
#[test]
#[ignore]
fn crowded_fleets_order_sensitivity() {
    let (mut with, mut without) = (0, 0);
    for seed in 1..=40u64 {
        let mix = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32;
        let spec = GenSpec { clusters: 4 + (mix % 6) as usize, deployments: 8 + ((mix / 6) % 20) as usize, seed };
        let snap = flotilla_placement::crowded::generate_crowded(&spec);
        let back = reversed(&snap);
        let differs = |o: &SolveOptions| tiers(&snap, &solve(&snap, o)) != tiers(&snap, &solve(&back, o));
        with += usize::from(differs(&SolveOptions::default()));
        without += usize::from(differs(&no_trades()));
    }
    eprintln!("per-tier counts change with the documents' order: {with} of 40 with trades, {without} without");
}
