//! Which domains hold a deployment's spread back: only those that could still take one of its
//! replicas. A domain with room counts only through a candidate the deployment may still use
//! for one more replica: its alternative under `maxReplicas`, one more replica there within
//! `maxCostPerHour`. Each case has its twins: the same fleet where the domain stays usable
//! spreads evenly, and without spread the preferred pool is packed.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers outside #[test] fns

use flotilla_apis::CapacityType;
use flotilla_apis::class::InferenceClassSpec;
use flotilla_apis::deployment::ModelDeploymentSpec;
use flotilla_placement::generate::with_current;
use flotilla_placement::plan::DeploymentPlan;
use flotilla_placement::snapshot::free_per_node;
use flotilla_placement::{ClassView, ClusterView, DeploymentView, FleetSnapshot, PoolView, SolveOptions, solve};
use serde_json::{Value, json};

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

fn cluster(name: &str, class: &str, nodes: u32) -> ClusterView {
    ClusterView {
        name: name.into(),
        region: format!("{name}-region"),
        jurisdiction: "EU".into(),
        ready: true,
        pools: vec![PoolView {
            name: class.into(),
            class: class.into(),
            capacity_type: Some(CapacityType::OnDemand),
            free_per_node: free_per_node(nodes, 8, 0),
            reserved_for: None,
            refused_block: None,
        }],
        ..Default::default()
    }
}

/// Cluster `a`: two H100 nodes ($10/h a node, $5 a 4-device replica); `b`: one H200 node
/// ($20/h, $10 a replica), room for two replicas. One deployment of 4 replicas of 4 devices,
/// H100 preferred, H200 second; `placement` is its placement policy, `h200` its second
/// alternative's extra fields.
fn fleet(placement: Value, h200: Value) -> FleetSnapshot {
    let mut second = json!({"class": "h200"});
    second.as_object_mut().unwrap().extend(h200.as_object().unwrap().clone());
    second.as_object_mut().unwrap().retain(|_, v| !v.is_null());
    let spec = json!({
        "model": {"name": "m", "source": "hf://org/m"},
        "replicas": 4,
        "engine": {"image": "vllm/vllm-openai:v0.11.0"},
        "topology": {"type": "TensorParallel", "devicesPerReplica": 4},
        "devices": {"alternatives": [{"class": "h100"}, second]},
        "placement": placement
    });
    FleetSnapshot {
        classes: [class("h100", "10.00"), class("h200", "20.00")].into_iter().collect(),
        clusters: vec![cluster("a", "h100", 2), cluster("b", "h200", 1)],
        deployments: vec![DeploymentView {
            namespace: "ml".into(),
            name: "m".into(),
            created: 0,
            spec: serde_json::from_value::<ModelDeploymentSpec>(spec).unwrap(),
            current: vec![],
            refused_pools: vec![],
        }],
        quotas: Vec::new(),
    }
}

/// The plan of the fleet's one deployment; the greedy pass alone gives the same (the rule is
/// the greedy's, not only the improvement phase's) and nothing is moved.
fn solve1(snap: &FleetSnapshot) -> DeploymentPlan {
    let plan = solve(snap, &SolveOptions::default()).deployments.into_iter().next().unwrap();
    let greedy = SolveOptions { max_improvement: 0, ..SolveOptions::default() };
    let alone = solve(snap, &greedy).deployments.into_iter().next().unwrap();
    assert_eq!(plan.assignments, alone.assignments, "the greedy pass alone differs");
    assert!(plan.moves.is_empty(), "{:?}", plan.moves);
    plan
}

/// Replicas per cluster (`a`, `b`) and unplaced.
fn layout(plan: &DeploymentPlan) -> (u32, u32, u32) {
    let on = |c: &str| plan.assignments.iter().filter(|a| a.cluster == c).map(|a| a.replicas).sum();
    (on("a"), on("b"), plan.unplaced)
}

fn spread() -> Value {
    spread_by(1)
}

fn spread_by(skew: u32) -> Value {
    json!({"by": "cluster", "maxSkew": skew})
}

#[test]
fn a_domain_reachable_only_through_an_alternative_at_its_max_does_not_hold_spread_back() {
    // The H200 may take one replica: once it has, `b` can take no further replica of this
    // deployment, so `a` grows past `b` + maxSkew. (Counting `b` open because its node has
    // room left `a` at 2 and one replica unplaced, `SpreadConstraint`.)
    let snap = fleet(json!({"spread": spread()}), json!({"maxReplicas": 1}));
    let plan = solve1(&snap);
    assert_eq!(layout(&plan), (3, 1, 0), "{plan:?}");
    assert!(plan.rejections.is_empty(), "{:?}", plan.rejections);
    // Same plan, byte for byte, run to run.
    let again = serde_json::to_string(&solve(&snap, &SolveOptions::default())).unwrap();
    assert_eq!(again, serde_json::to_string(&solve(&snap, &SolveOptions::default())).unwrap());
    // Twin: with the H200 under no maximum, `b` stays usable and holds `a` to 2.
    let plan = solve1(&fleet(json!({"spread": spread()}), json!({})));
    assert_eq!(layout(&plan), (2, 2, 0), "{plan:?}");
    // Twin: without spread, the preferred H100s take all four.
    let plan = solve1(&fleet(json!({}), json!({"maxReplicas": 1})));
    assert_eq!(layout(&plan), (4, 0, 0), "{plan:?}");
}

#[test]
fn a_domain_whose_replica_the_ceiling_does_not_pay_for_does_not_hold_spread_back() {
    // $25/h: one H100 replica ($5), one H200 ($10), a second H100 ($20 in all); then another
    // H200 replica would cost $30, over the ceiling: `b` can take none, and the last H100
    // replica ($25) goes to `a`. (Counting `b` open left it unplaced.)
    let plan = solve1(&fleet(json!({"spread": spread(), "maxCostPerHour": "25"}), json!({})));
    assert_eq!(layout(&plan), (3, 1, 0), "{plan:?}");
    assert_eq!(plan.cost_micros_per_hour, 25_000_000);
    assert!(plan.rejections.is_empty(), "{:?}", plan.rejections);
    // Twin: at $30/h the second H200 replica is affordable: `b` holds `a` to 2.
    let plan = solve1(&fleet(json!({"spread": spread(), "maxCostPerHour": "30"}), json!({})));
    assert_eq!(layout(&plan), (2, 2, 0), "{plan:?}");
    // Twin: without spread, four H100 replicas at $20.
    let plan = solve1(&fleet(json!({"maxCostPerHour": "25"}), json!({})));
    assert_eq!((layout(&plan), plan.cost_micros_per_hour), ((4, 0, 0), 20_000_000));
}

#[test]
fn a_replan_counts_the_running_replicas_against_the_alternative_max() {
    // The second alternative is any GPU, at most 2 replicas: the H100s in `a` and the H200 in
    // `b` both offer it. A fresh plan uses it up (one replica in `a`, one in `b`), after which
    // `b` can take no further replica and `a` grows to 3.
    let snap = fleet(
        json!({"spread": spread()}),
        json!({"class": null, "maxReplicas": 2,
        "selectors": ["device.driver == \"gpu.nvidia.com\""]}),
    );
    let first = solve(&snap, &SolveOptions::default());
    assert_eq!(layout(&first.deployments[0]), (3, 1, 0), "{first:?}");
    let ranks: Vec<(&str, u32, u32)> =
        first.deployments[0].assignments.iter().map(|a| (a.cluster.as_str(), a.fallback_rank, a.replicas)).collect();
    assert_eq!(ranks, vec![("a", 1, 2), ("a", 2, 1), ("b", 2, 1)]);
    // Re-planned with those replicas running, nothing changes: while the replicas are kept one
    // per pool in turn, those running on the second alternative count against its maximum
    // before they are kept. (Counting only the ones kept so far, `b` looked open, the third
    // replica in `a` was not kept, and the re-plan moved it to `b`: 2 and 2.)
    let again = solve(&with_current(&snap, &first), &SolveOptions::default());
    assert_eq!(again.deployments[0].assignments, first.deployments[0].assignments);
}

#[test]
fn a_deployment_spread_and_its_ceiling_leave_short_is_filled_again_cheapest_first() {
    // $20/h. In preference order spread sends the second replica to the $10 H200 in `b`
    // (`a` would be 2 above `b`, which can still take one at $15 in all); then a second H100
    // ($20 in all) and nothing more: 2 + 1, one short. Cheapest first, four $5 H100 replicas
    // spend the budget, after which `b`'s replica is over the ceiling and `b` does not count:
    // 4 in `a` holds spread, and places one more.
    let snap = fleet(json!({"spread": spread(), "maxCostPerHour": "20"}), json!({}));
    let plan = solve(&snap, &SolveOptions::default()).deployments.remove(0);
    assert_eq!((layout(&plan), plan.cost_micros_per_hour), ((4, 0, 0), 20_000_000), "{plan:?}");
    assert!(plan.moves.is_empty() && plan.rejections.is_empty(), "{plan:?}");
    // Twin: at $30/h `b` stays affordable: the fill in preference order places all four, 2
    // and 2 (spread holds `a` to one above `b`), and nothing is tried again.
    let plan = solve1(&fleet(json!({"spread": spread(), "maxCostPerHour": "30"}), json!({})));
    assert_eq!(layout(&plan), (2, 2, 0), "{plan:?}");
}

#[test]
fn the_cheapest_first_try_gives_equal_prices_to_the_emptiest_domain_first() {
    // 7 one-GPU replicas, $11.76/h, spread by cluster with skew 3: `a` at $1.05 a replica,
    // `b` and `c` at $2.6225, `d` at $4.875, `e` at $7.75. In preference order (cheapest
    // first, then by name) `a` takes 3, then `b` 3 ($11.02), and `a` may not grow while `c`
    // is affordable: 6. Tried again with equal prices going to the emptiest domain first, `b`
    // and `c` take one each ($8.40), after which `d` and `e` are over the ceiling, then `b`
    // and `c` too, and `a` grows to 5: 7 for $10.495.
    let spec = json!({
        "model": {"name": "m", "source": "hf://org/m"}, "replicas": 7,
        "engine": {"image": "vllm/vllm-openai:v0.11.0"},
        "topology": {"type": "TensorParallel", "devicesPerReplica": 1},
        "devices": {"alternatives": [{"selectors": ["device.driver == \"gpu.nvidia.com\""]}]},
        "placement": {"spread": spread_by(3), "maxCostPerHour": "11.76"}
    });
    let snap = FleetSnapshot {
        classes: [class("l4", "8.40"), class("l40s", "20.98"), class("h100", "39.00"), class("h200", "62.00")]
            .into_iter()
            .collect(),
        clusters: vec![
            cluster("a", "l4", 2),
            cluster("b", "l40s", 2),
            cluster("c", "l40s", 2),
            cluster("d", "h100", 2),
            cluster("e", "h200", 2),
        ],
        deployments: vec![DeploymentView {
            namespace: "ml".into(),
            name: "m".into(),
            created: 0,
            spec: serde_json::from_value::<ModelDeploymentSpec>(spec).unwrap(),
            current: vec![],
            refused_pools: vec![],
        }],
        quotas: Vec::new(),
    };
    let plan = solve1(&snap);
    let on = |c: &str| plan.assignments.iter().filter(|a| a.cluster == c).map(|a| a.replicas).sum::<u32>();
    assert_eq!((on("a"), on("b"), on("c"), plan.unplaced), (5, 1, 1, 0), "{plan:?}");
    assert_eq!(plan.cost_micros_per_hour, 10_495_000);
}
