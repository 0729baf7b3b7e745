//! A cost ceiling is a constraint: the solver fits the most replicas under `maxCostPerHour`
//! (cheaper capacity when the preferred one would spend the budget too early), keeps the
//! preferred capacity wherever the budget allows, and says why when replicas still do not fit.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers outside #[test] fns

use flotilla_apis::CapacityType;
use flotilla_apis::class::InferenceClassSpec;
use flotilla_apis::deployment::ModelDeploymentSpec;
use flotilla_placement::plan::{DeploymentPlan, Reason};
use flotilla_placement::snapshot::free_per_node;
use flotilla_placement::{ClassView, ClusterView, DeploymentView, FleetSnapshot, PoolView, SolveOptions, solve};
use serde_json::json;

/// A class of 8 devices per node with the given node prices.
fn class(name: &str, reserved: &str, on_demand: &str) -> (String, ClassView) {
    let spec: InferenceClassSpec = serde_json::from_value(json!({
        "device": {"driver": "gpu.nvidia.com", "attributes": {"productName": {"string": name}},
                   "capacity": {"memory": "80Gi"}},
        "devicesPerNode": 8,
        "pricePerNodeHour": {"reserved": reserved, "onDemand": on_demand}
    }))
    .unwrap();
    (name.to_string(), ClassView { spec })
}

fn cluster(name: &str, class: &str, cap: CapacityType, nodes: u32) -> ClusterView {
    ClusterView {
        name: name.into(),
        region: format!("{name}-region"),
        jurisdiction: "EU".into(),
        ready: true,
        pools: vec![PoolView {
            name: class.into(),
            class: class.into(),
            capacity_type: Some(cap),
            free_per_node: free_per_node(nodes, 8, 0),
            reserved_for: None,
            refused_block: None,
        }],
        ..Default::default()
    }
}

/// The fleet: a reserved pool whose TP4 replica costs $20/h (2 nodes: 4 replicas) and
/// an on-demand pool whose replica costs $5/h (2 nodes: 4 replicas). The deployment prefers
/// reserved and the first alternative.
fn fleet(replicas: i32, ceiling: Option<&str>) -> FleetSnapshot {
    let mut placement = json!({"capacityTypes": ["reserved", "on-demand"]});
    if let Some(c) = ceiling {
        placement["maxCostPerHour"] = json!(c);
    }
    let spec = json!({
        "model": {"name": "m", "source": "hf://org/m"},
        "replicas": replicas,
        "engine": {"image": "vllm/vllm-openai:v0.11.0"},
        "topology": {"type": "TensorParallel", "devicesPerReplica": 4},
        "devices": {"alternatives": [{"class": "dear"}, {"class": "cheap"}]},
        "placement": placement
    });
    FleetSnapshot {
        classes: [class("dear", "40.00", "80.00"), class("cheap", "5.00", "10.00")].into_iter().collect(),
        clusters: vec![
            cluster("a-reserved", "dear", CapacityType::Reserved, 2),
            cluster("b-on-demand", "cheap", CapacityType::OnDemand, 2),
        ],
        deployments: vec![deployment(spec)],
        quotas: Vec::new(),
    }
}

/// The one deployment `ml/m` of these fleets, from its spec.
fn deployment(spec: serde_json::Value) -> DeploymentView {
    DeploymentView {
        namespace: "ml".into(),
        name: "m".into(),
        created: 0,
        spec: serde_json::from_value::<ModelDeploymentSpec>(spec).unwrap(),
        current: vec![],
        refused_pools: vec![],
    }
}

fn solve1(snap: &FleetSnapshot) -> DeploymentPlan {
    solve(snap, &SolveOptions::default()).deployments.into_iter().next().unwrap()
}

fn on(plan: &DeploymentPlan, cluster: &str) -> u32 {
    plan.assignments.iter().filter(|a| a.cluster == cluster).map(|a| a.replicas).sum()
}

#[test]
fn a_ceiling_fits_the_most_replicas_not_the_first_preferred() {
    // $40: two reserved replicas ($20 each) would spend it all; four fit when cheaper
    // capacity takes some. The preferred reserved capacity keeps what the budget allows.
    let plan = solve1(&fleet(4, Some("40")));
    assert_eq!(plan.unplaced, 0, "{:?} {:?}", plan.assignments, plan.rejections);
    assert!(plan.cost_micros_per_hour <= 40_000_000, "{}", plan.cost_micros_per_hour);
    assert_eq!((on(&plan, "a-reserved"), on(&plan, "b-on-demand")), (1, 3));
    assert!(plan.rejections.is_empty(), "nothing unplaced, nothing rejected: {:?}", plan.rejections);
}

#[test]
fn with_room_in_the_budget_the_preferred_capacity_is_kept() {
    // Twin: a ceiling that pays for the preferred placement changes nothing.
    let plan = solve1(&fleet(4, Some("80")));
    assert_eq!((on(&plan, "a-reserved"), on(&plan, "b-on-demand"), plan.unplaced), (4, 0, 0));
    let plan = solve1(&fleet(4, None));
    assert_eq!((on(&plan, "a-reserved"), on(&plan, "b-on-demand"), plan.unplaced), (4, 0, 0));
    // $50: two reserved and two cheap ($50) rather than one reserved and three cheap.
    let plan = solve1(&fleet(4, Some("50")));
    assert_eq!((on(&plan, "a-reserved"), on(&plan, "b-on-demand"), plan.unplaced), (2, 2, 0));
}

#[test]
fn a_ceiling_that_cannot_pay_for_all_places_the_most_and_says_so() {
    // $12: two replicas at $5; a third would cost $15. Nothing cheaper exists.
    let plan = solve1(&fleet(4, Some("12")));
    assert_eq!((on(&plan, "a-reserved"), on(&plan, "b-on-demand"), plan.unplaced), (0, 2, 2));
    let why: Vec<_> = plan.rejections.iter().map(|r| (r.cluster.as_str(), r.reason, r.message.as_str())).collect();
    assert!(why.iter().all(|(_, r, _)| *r == Reason::CostCeilingExceeded), "{why:?}");
    let cheap = why.iter().find(|(c, ..)| *c == "b-on-demand").expect("the cheap cluster says why");
    assert!(cheap.2.contains("costs $5.00/h; placed so far $10.00/h, ceiling $12.00/h"), "{}", cheap.2);
}

/// One alternative of reserved ($7 a replica, preferred) and on-demand ($4.75) nodes, a second
/// one of $1 nodes allowed for `cheap_max` replicas; 8 single-GPU replicas wanted under $30/h.
fn capped_fleet(cheap_max: Option<i32>) -> FleetSnapshot {
    let mut cheap = json!({"class": "cheap"});
    if let Some(m) = cheap_max {
        cheap["maxReplicas"] = json!(m);
    }
    let spec = json!({
        "model": {"name": "m", "source": "hf://org/m"},
        "replicas": 8,
        "engine": {"image": "vllm/vllm-openai:v0.11.0"},
        "topology": {"type": "TensorParallel", "devicesPerReplica": 1},
        "devices": {"alternatives": [{"class": "dear"}, cheap]},
        "placement": {"capacityTypes": ["reserved", "on-demand"], "maxCostPerHour": "30"}
    });
    FleetSnapshot {
        classes: [class("dear", "56.00", "38.00"), class("cheap", "8.00", "8.00")].into_iter().collect(),
        clusters: vec![
            cluster("a-reserved", "dear", CapacityType::Reserved, 2),
            cluster("b-on-demand", "dear", CapacityType::OnDemand, 2),
            cluster("c-cheap", "cheap", CapacityType::OnDemand, 1),
        ],
        deployments: vec![deployment(spec)],
        quotas: Vec::new(),
    }
}

#[test]
fn the_budget_held_back_counts_a_capped_alternative_only_up_to_its_maximum() {
    // The $1 alternative may take 2 replicas. Counting all 8 at $1 would hold back $1 each for
    // the rest and let three $7 reserved replicas through; then the rest costs $4.75 and only 6
    // fit ($29.75). Counted at its maximum, the ceiling pays for 7 at the cheapest (2 × $1 +
    // 5 × $4.75): the hold keeps room for them, and 7 are placed (the most that fit: an 8th
    // would cost at least $30.50).
    let plan = solve1(&capped_fleet(Some(2)));
    assert_eq!(plan.unplaced, 1, "{:?} {:?}", plan.assignments, plan.rejections);
    assert!(plan.cost_micros_per_hour <= 30_000_000, "{}", plan.cost_micros_per_hour);
    assert_eq!(on(&plan, "c-cheap"), 2);
    assert!(on(&plan, "a-reserved") <= 1, "the preferred capacity only as far as the budget allows: {plan:?}");
    // Twin: without the maximum the $1 alternative takes the rest, and all 8 fit.
    let plan = solve1(&capped_fleet(None));
    assert_eq!(plan.unplaced, 0, "{:?} {:?}", plan.assignments, plan.rejections);
    assert!(plan.cost_micros_per_hour <= 30_000_000, "{}", plan.cost_micros_per_hour);
}
