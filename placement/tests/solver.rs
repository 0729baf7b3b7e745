//! One test per filter and per scoring rule, each with its negative twin: the same case with
//! the constraint removed (or reversed) gives a different answer, so the test fails if the
//! mechanism is missing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers outside #[test] fns

use flotilla_apis::CapacityType;
use flotilla_apis::class::InferenceClassSpec;
use flotilla_apis::deployment::{ClusterPlacement, ModelDeploymentSpec, RefusedPool};
use flotilla_placement::plan::{DeploymentPlan, Reason};
use flotilla_placement::snapshot::free_per_node;
use flotilla_placement::{ClassView, ClusterView, DeploymentView, FleetSnapshot, PoolView, SolveOptions, solve};
use serde_json::{Value, json};

fn class(name: &str, memory: &str, arch: &str, per_node: u32, on_demand: &str, spot: &str) -> (String, ClassView) {
    let spec: InferenceClassSpec = serde_json::from_value(json!({
        "device": {
            "driver": "gpu.nvidia.com",
            "attributes": {"architecture": {"string": arch}, "productName": {"string": name}},
            "capacity": {"memory": memory}
        },
        "devicesPerNode": per_node,
        "pricePerNodeHour": {"reserved": "10.00", "onDemand": on_demand, "spot": spot}
    }))
    .unwrap();
    (name.to_string(), ClassView { spec })
}

fn pool(name: &str, class: &str, nodes: u32, per_node: u32, cap: CapacityType) -> PoolView {
    PoolView {
        name: name.into(),
        class: class.into(),
        capacity_type: Some(cap),
        free_per_node: free_per_node(nodes, per_node, 0),
        reserved_for: None,
        refused_block: None,
    }
}

fn cluster(name: &str, region: &str, jurisdiction: &str, pools: Vec<PoolView>) -> ClusterView {
    let mut labels = std::collections::BTreeMap::new();
    labels.insert("flotilla.dev/cluster".to_string(), name.to_string());
    labels.insert("flotilla.dev/jurisdiction".to_string(), jurisdiction.to_string());
    ClusterView {
        name: name.into(),
        labels,
        region: region.into(),
        zones: vec![format!("{region}a")],
        jurisdiction: jurisdiction.into(),
        ready: true,
        pools,
        ..Default::default()
    }
}

/// A deployment: `extra` is merged into the spec (placement, devices, topology, ...).
fn deployment(name: &str, replicas: i32, extra: Value) -> DeploymentView {
    let mut spec = json!({
        "model": {"name": name, "source": "hf://org/model"},
        "replicas": replicas,
        "engine": {"image": "vllm/vllm-openai:v0.11.0"},
        "topology": {"type": "TensorParallel", "devicesPerReplica": 4},
        "devices": {"alternatives": [{"class": "h100"}]},
        "placement": {"capacityTypes": ["reserved", "on-demand", "spot"]}
    });
    merge(&mut spec, extra);
    DeploymentView {
        namespace: "ml".into(),
        name: name.into(),
        created: 0,
        spec: serde_json::from_value::<ModelDeploymentSpec>(spec).unwrap(),
        current: vec![],
        refused_pools: vec![],
    }
}

fn merge(base: &mut Value, extra: Value) {
    match (base, extra) {
        (Value::Object(b), Value::Object(e)) => {
            for (k, v) in e {
                merge(b.entry(k).or_insert(Value::Null), v);
            }
        }
        (b, e) => *b = e,
    }
}

/// Two H100 clusters (EU and US, on-demand) and an A100 EU cluster; 2 nodes of 8 each.
fn fleet(deployments: Vec<DeploymentView>) -> FleetSnapshot {
    let od = CapacityType::OnDemand;
    FleetSnapshot {
        classes: [
            class("h100", "80Gi", "Hopper", 8, "98.00", "40.00"),
            class("a100", "80Gi", "Ampere", 8, "40.00", "16.00"),
            class("l40s", "48Gi", "Ada", 4, "10.00", "4.00"),
        ]
        .into_iter()
        .collect(),
        clusters: vec![
            cluster("eu-1", "eu-central-1", "EU", vec![pool("h100", "h100", 2, 8, od)]),
            cluster("eu-2", "eu-west-3", "EU", vec![pool("a100", "a100", 2, 8, od)]),
            cluster("us-1", "us-east-1", "US", vec![pool("h100", "h100", 2, 8, od)]),
        ],
        deployments,
        quotas: Vec::new(),
    }
}

fn solve1(snap: &FleetSnapshot) -> DeploymentPlan {
    solve(snap, &SolveOptions::default()).deployments.into_iter().next().unwrap()
}

fn on(plan: &DeploymentPlan, cluster: &str) -> u32 {
    plan.assignments.iter().filter(|a| a.cluster == cluster).map(|a| a.replicas).sum()
}

fn reason(plan: &DeploymentPlan, cluster: &str) -> Option<Reason> {
    plan.rejections.iter().find(|r| r.cluster == cluster).map(|r| r.reason)
}

#[test]
fn sovereignty_never_spills_over_even_when_full() {
    // 6 TP4 replicas; the one EU H100 cluster holds 4 (2 nodes × 2). The US cluster has room.
    let eu_only = deployment("m", 6, json!({"placement": {"sovereignty": {"allowedJurisdictions": ["EU"]}}}));
    let plan = solve1(&fleet(vec![eu_only]));
    assert_eq!(on(&plan, "eu-1"), 4);
    assert_eq!(on(&plan, "us-1"), 0, "the sovereign model never left its jurisdiction");
    assert_eq!(plan.unplaced, 2);
    assert_eq!(reason(&plan, "us-1"), Some(Reason::JurisdictionNotAllowed));
    // Twin: without the policy the US cluster takes the overflow.
    let plan = solve1(&fleet(vec![deployment("m", 6, json!({}))]));
    assert_eq!(plan.unplaced, 0);
    assert_eq!(on(&plan, "us-1"), 2);
}

#[test]
fn allowed_and_denied_regions() {
    let d = deployment("m", 2, json!({"placement": {"sovereignty": {"allowedRegions": ["us-east-1"]}}}));
    let plan = solve1(&fleet(vec![d]));
    assert_eq!(on(&plan, "us-1"), 2);
    assert_eq!(reason(&plan, "eu-1"), None, "all placed: no rejections reported");
    let d = deployment("m", 6, json!({"placement": {"sovereignty": {"deniedRegions": ["us-east-1"]}}}));
    let plan = solve1(&fleet(vec![d]));
    assert_eq!(on(&plan, "us-1"), 0);
    assert_eq!(reason(&plan, "us-1"), Some(Reason::RegionDenied));
    // Twin: allowedRegions naming eu-central-1 sends it there instead.
    let d = deployment("m", 2, json!({"placement": {"sovereignty": {"allowedRegions": ["eu-central-1"]}}}));
    assert_eq!(on(&solve1(&fleet(vec![d])), "eu-1"), 2);
}

#[test]
fn cluster_selector_excludes() {
    let sel = json!({"placement": {"clusterSelector": {"matchLabels": {"flotilla.dev/jurisdiction": "US"}}}});
    let plan = solve1(&fleet(vec![deployment("m", 6, sel)]));
    assert_eq!(on(&plan, "eu-1"), 0);
    assert_eq!(reason(&plan, "eu-1"), Some(Reason::ClusterSelectorMismatch));
    let expr = json!({"placement": {"clusterSelector": {"matchExpressions": [
        {"key": "flotilla.dev/cluster", "operator": "NotIn", "values": ["eu-1"]}]}}});
    let plan = solve1(&fleet(vec![deployment("m", 6, expr)]));
    assert_eq!(on(&plan, "eu-1"), 0);
    assert_eq!(on(&plan, "us-1"), 4);
    // Twin: no selector, eu-1 (first by name at equal price) gets replicas.
    assert!(on(&solve1(&fleet(vec![deployment("m", 6, json!({}))])), "eu-1") > 0);
}

#[test]
fn readiness_and_cordon() {
    let mut snap = fleet(vec![deployment("m", 2, json!({}))]);
    snap.clusters[0].ready = false;
    snap.clusters[0].not_ready_reason = Some("Unreachable: timeout".into());
    let plan = solve1(&snap);
    assert_eq!(on(&plan, "eu-1"), 0);
    assert_eq!(on(&plan, "us-1"), 2);
    // Cordoned: no new replicas, but the replicas already there stay.
    let mut snap = fleet(vec![deployment("m", 6, json!({}))]);
    snap.clusters[0].cordoned = true;
    let plan = solve1(&snap);
    assert_eq!(on(&plan, "eu-1"), 0);
    assert_eq!(reason(&plan, "eu-1"), Some(Reason::ClusterCordoned));
    snap.deployments[0].current = vec![placement("eu-1", "h100", 1, 2)];
    let plan = solve1(&snap);
    assert_eq!(on(&plan, "eu-1"), 2, "cordon keeps existing replicas");
}

fn placement(cluster: &str, pool: &str, rank: i32, desired: i32) -> ClusterPlacement {
    ClusterPlacement {
        cluster: cluster.into(),
        pool: pool.into(),
        class: pool.into(),
        capacity_type: CapacityType::OnDemand,
        fallback_rank: rank,
        desired,
        ready: desired,
        serving: desired,
        unschedulable: 0,
    }
}

#[test]
fn replicas_the_member_refused_are_placed_elsewhere() {
    // Two TP4 replicas running on eu-1: a re-plan keeps them there (the twin).
    let mut snap = fleet(vec![deployment("m", 2, json!({}))]);
    snap.deployments[0].current = vec![placement("eu-1", "h100", 1, 2)];
    assert_eq!(on(&solve1(&snap), "eu-1"), 2, "running replicas stay");
    // The member's scheduler refused one of them (devices split over nodes, say): it goes to
    // the other H100 cluster, the other stays, and eu-1 gets no more.
    snap.deployments[0].current[0].unschedulable = 1;
    let plan = solve1(&snap);
    assert_eq!((on(&plan, "eu-1"), on(&plan, "us-1"), plan.unplaced), (1, 1, 0), "{plan:?}");
    // Where no other cluster is allowed, the refused replica is unplaced with that reason
    // (never put back where it cannot start), and the one that runs stays.
    let eu_only = json!({"placement": {"sovereignty": {"allowedJurisdictions": ["EU"]}}});
    let mut snap = fleet(vec![deployment("m", 2, eu_only)]);
    snap.deployments[0].current = vec![ClusterPlacement { unschedulable: 1, ..placement("eu-1", "h100", 1, 2) }];
    let plan = solve1(&snap);
    assert_eq!((on(&plan, "eu-1"), plan.unplaced), (1, 1), "{plan:?}");
    assert_eq!(reason(&plan, "eu-1"), Some(Reason::ReplicasUnschedulable));
    assert!(plan.rejections[0].message.contains("refused 1 replica"), "{:?}", plan.rejections);
}

fn backed_off(cluster: &str, pool: &str, devices_short: bool) -> RefusedPool {
    RefusedPool {
        cluster: cluster.into(),
        pool: pool.into(),
        retry_after: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap(),
        ),
        devices_short,
        message: "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.".into(),
    }
}

#[test]
fn a_pool_that_refused_a_replica_stays_backed_off_after_it_moved() {
    // The replica was refused on eu-1 and moved to us-1, which refuses it too. Without the
    // back-off it goes straight back to eu-1 (the twin): the ping-pong of the scale benchmark.
    let mut snap = fleet(vec![deployment("m", 1, json!({}))]);
    snap.deployments[0].current = vec![ClusterPlacement { unschedulable: 1, ..placement("us-1", "h100", 1, 1) }];
    assert_eq!(on(&solve1(&snap), "eu-1"), 1, "twin: eu-1 takes it when nothing says it refused");
    snap.deployments[0].refused_pools = vec![backed_off("eu-1", "h100", true)];
    let plan = solve1(&snap);
    assert_eq!((on(&plan, "eu-1"), on(&plan, "us-1"), plan.unplaced), (0, 0, 1), "{plan:?}");
    assert_eq!(reason(&plan, "eu-1"), Some(Reason::ReplicasUnschedulable));
    let eu1 = &plan.rejections.iter().find(|r| r.cluster == "eu-1").unwrap().message;
    assert!(eu1.contains("Insufficient") && eu1.contains("before 2027-01-15"), "{eu1}");
    // Replicas running in a backed-off pool stay: the back-off stops new ones only.
    snap.deployments[0].current = vec![placement("eu-1", "h100", 1, 1)];
    snap.deployments[0].spec.replicas = 2;
    let plan = solve1(&snap);
    assert_eq!((on(&plan, "eu-1"), on(&plan, "us-1")), (1, 1), "{plan:?}");
}

#[test]
fn a_pool_short_of_devices_for_one_deployment_takes_no_new_pod_as_large_from_any() {
    // The member's scheduler found no node with 4 free on eu-1 (another deployment's refusal):
    // a new TP4 replica of `b` goes to us-1 instead, a TP2 replica of `c` still fits eu-1.
    let tp2 = json!({"topology": {"type": "TensorParallel", "devicesPerReplica": 2}});
    let run = |block: Option<u32>| {
        let mut snap = fleet(vec![deployment("b", 1, json!({})), deployment("c", 1, tp2.clone())]);
        snap.clusters[0].pools[0].refused_block = block;
        let plan = solve(&snap, &SolveOptions::default());
        let b = plan.deployments.iter().find(|d| d.name == "b").unwrap().clone();
        let c = plan.deployments.iter().find(|d| d.name == "c").unwrap().clone();
        (b, c)
    };
    let (b, c) = run(None);
    assert_eq!((on(&b, "eu-1"), on(&c, "eu-1")), (1, 1), "twin: eu-1 ranks first for both");
    let (b, c) = run(Some(4));
    assert_eq!((on(&b, "eu-1"), on(&b, "us-1")), (0, 1), "{b:?}");
    assert_eq!(on(&c, "eu-1"), 1, "a smaller pod still goes where it fits");
}

#[test]
fn taints_need_tolerations() {
    let mut snap = fleet(vec![deployment("m", 2, json!({}))]);
    for c in &mut snap.clusters {
        c.taints = vec![
            serde_json::from_value(json!({"key": "dedicated", "value": "research", "effect": "NoSchedule"})).unwrap(),
        ];
    }
    let plan = solve1(&snap);
    assert_eq!(plan.unplaced, 2);
    assert_eq!(reason(&plan, "eu-1"), Some(Reason::TaintNotTolerated));
    let tolerant =
        json!({"placement": {"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "research"}]}});
    snap.deployments = vec![deployment("m", 2, tolerant)];
    assert_eq!(solve1(&snap).unplaced, 0);
}

#[test]
fn cel_selectors_choose_devices() {
    let hopper = json!({"devices": {"alternatives": [{"selectors": [
        "device.attributes[\"gpu.nvidia.com\"].architecture == \"Ampere\""]}]}});
    let plan = solve1(&fleet(vec![deployment("m", 2, hopper)]));
    assert_eq!(on(&plan, "eu-2"), 2, "only the A100 cluster matches Ampere");
    assert_eq!(on(&plan, "eu-1") + on(&plan, "us-1"), 0);
    // Twin: a memory selector every class here satisfies places on the cheapest (A100 on-demand).
    let mem = json!({"devices": {"alternatives": [{"selectors": [
        "device.capacity[\"gpu.nvidia.com\"].memory.compareTo(quantity(\"80Gi\")) >= 0"]}]}});
    let plan = solve1(&fleet(vec![deployment("m", 6, mem)]));
    assert_eq!(plan.unplaced, 0);
    assert!(on(&plan, "eu-1") + on(&plan, "us-1") > 0);
    // A selector that errors (missing attribute) is a non-match with a reason, not a crash.
    let missing =
        json!({"devices": {"alternatives": [{"selectors": ["device.attributes[\"gpu.nvidia.com\"].nosuch == 1"]}]}});
    let plan = solve1(&fleet(vec![deployment("m", 1, missing)]));
    assert_eq!(plan.unplaced, 1);
    assert_eq!(reason(&plan, "eu-1"), Some(Reason::NoMatchingDevices));
    assert!(plan.rejections[0].message.contains("nosuch"), "{:?}", plan.rejections);
}

#[test]
fn tensor_parallel_must_fit_one_node() {
    let mut snap = fleet(vec![deployment(
        "m",
        1,
        json!({"devices": {"alternatives": [{"class": "l40s"}]},
        "topology": {"devicesPerReplica": 8}}),
    )]);
    snap.clusters.push(cluster("eu-3", "eu-north-1", "EU", vec![pool("l40s", "l40s", 4, 4, CapacityType::OnDemand)]));
    let plan = solve1(&snap);
    assert_eq!(plan.unplaced, 1, "16 free L40S devices, but no node has 8");
    assert_eq!(reason(&plan, "eu-3"), Some(Reason::DoesNotFitNode));
    // Twin: TP4 fits.
    snap.deployments = vec![deployment("m", 1, json!({"devices": {"alternatives": [{"class": "l40s"}]}}))];
    assert_eq!(on(&solve1(&snap), "eu-3"), 1);
}

#[test]
fn multi_node_replicas_need_distinct_nodes() {
    let mn = json!({"topology": {"type": "MultiNode", "devicesPerReplica": 8, "nodesPerReplica": 2}});
    let plan = solve1(&fleet(vec![deployment("m", 3, mn)]));
    assert_eq!(plan.unplaced, 1, "each H100 cluster has 2 nodes: one 2-node replica each");
    assert_eq!(on(&plan, "eu-1") + on(&plan, "us-1"), 2);
}

#[test]
fn capacity_types_allowed_and_preferred() {
    let mut snap = fleet(vec![deployment("m", 2, json!({"placement": {"capacityTypes": ["spot"]}}))]);
    let plan = solve1(&snap);
    assert_eq!(plan.unplaced, 2);
    assert_eq!(reason(&plan, "eu-1"), Some(Reason::CapacityTypeNotAllowed));
    // Twin: a spot pool exists on us-1 → used, and preferred over on-demand when listed first.
    snap.clusters[2].pools.push(pool("spot", "h100", 1, 8, CapacityType::Spot));
    assert_eq!(on(&solve1(&snap), "us-1"), 2);
    snap.deployments = vec![deployment("m", 2, json!({"placement": {"capacityTypes": ["spot", "on-demand"]}}))];
    let plan = solve1(&snap);
    assert!(plan.assignments.iter().all(|a| a.capacity_type == CapacityType::Spot), "{:?}", plan.assignments);
    snap.deployments = vec![deployment("m", 2, json!({"placement": {"capacityTypes": ["on-demand", "spot"]}}))];
    let plan = solve1(&snap);
    assert!(plan.assignments.iter().all(|a| a.capacity_type == CapacityType::OnDemand), "{:?}", plan.assignments);
}

#[test]
fn cheaper_cluster_first() {
    let any80 = json!({"devices": {"alternatives": [{"selectors": [
        "device.capacity[\"gpu.nvidia.com\"].memory.compareTo(quantity(\"80Gi\")) >= 0"]}]}});
    let plan = solve1(&fleet(vec![deployment("m", 2, any80.clone())]));
    assert_eq!(on(&plan, "eu-2"), 2, "A100 at $40 beats H100 at $98");
    // Twin: make the A100 dearer.
    let mut snap = fleet(vec![deployment("m", 2, any80)]);
    snap.classes.get_mut("a100").unwrap().spec.price_per_node_hour.on_demand = Some("200.00".into());
    assert_eq!(on(&solve1(&snap), "eu-2"), 0);
}

#[test]
fn cost_ceiling_holds() {
    // One TP4 H100 replica costs 98/2 = $49/h.
    let plan = solve1(&fleet(vec![deployment("m", 4, json!({"placement": {"maxCostPerHour": "100"}}))]));
    assert_eq!(plan.desired - plan.unplaced, 2);
    assert!(plan.cost_micros_per_hour <= 100_000_000);
    assert!(plan.rejections.iter().any(|r| r.reason == Reason::CostCeilingExceeded), "{:?}", plan.rejections);
    // Twin: no ceiling, all four placed.
    assert_eq!(solve1(&fleet(vec![deployment("m", 4, json!({}))])).unplaced, 0);
}

#[test]
fn ordered_fallback_and_minimums() {
    let alts = json!({"devices": {"alternatives": [{"class": "h100"}, {"class": "a100"}]},
                      "placement": {"clusterSelector": {"matchLabels": {"flotilla.dev/jurisdiction": "EU"}}}});
    // 4 fit on the EU H100: alternative 2 unused.
    let plan = solve1(&fleet(vec![deployment("m", 4, alts.clone())]));
    assert!(plan.assignments.iter().all(|a| a.fallback_rank == 1), "{:?}", plan.assignments);
    // 6: the two the first cannot hold go to the A100 at rank 2.
    let plan = solve1(&fleet(vec![deployment("m", 6, alts)]));
    assert_eq!(on(&plan, "eu-1"), 4);
    assert_eq!(on(&plan, "eu-2"), 2);
    assert!(plan.assignments.iter().any(|a| a.fallback_rank == 2));
    // A minimum on the second alternative is honoured even when the first could hold all.
    let with_min = json!({"devices": {"alternatives": [{"class": "h100"}, {"class": "a100", "minReplicas": 1}]},
                          "placement": {"clusterSelector": {"matchLabels": {"flotilla.dev/jurisdiction": "EU"}}}});
    let plan = solve1(&fleet(vec![deployment("m", 4, with_min)]));
    assert_eq!(on(&plan, "eu-2"), 1);
    assert_eq!(on(&plan, "eu-1"), 3);
    assert!(plan.unmet_minimums.is_empty());
}

#[test]
fn spread_max_skew() {
    let spread = json!({"placement": {"spread": {"by": "cluster", "maxSkew": 1},
        "sovereignty": {"allowedJurisdictions": ["EU", "US"]}}});
    let plan = solve1(&fleet(vec![deployment("m", 4, spread)]));
    assert_eq!((on(&plan, "eu-1"), on(&plan, "us-1")), (2, 2), "{:?}", plan.assignments);
    // Twin: without spread the first cluster is packed.
    let plan = solve1(&fleet(vec![deployment("m", 4, json!({}))]));
    assert_eq!((on(&plan, "eu-1"), on(&plan, "us-1")), (4, 0));
}

#[test]
fn spread_rebalances_when_more_domains_become_eligible() {
    // Placed while only us-1 could take replicas (the EU clusters were not observed yet): once
    // they can, the plan spreads again; the rollout moves make-before-break.
    let spread = json!({"placement": {"spread": {"by": "cluster", "maxSkew": 1},
        "sovereignty": {"allowedJurisdictions": ["EU", "US"]}}});
    let mut snap = fleet(vec![deployment("m", 4, spread)]);
    snap.deployments[0].current = vec![placement("us-1", "h100", 1, 4)];
    let plan = solve1(&snap);
    assert_eq!((on(&plan, "eu-1"), on(&plan, "us-1")), (2, 2), "{:?}", plan.assignments);
    // Twin: without spread the placement sticks where it runs.
    snap.deployments[0].spec.placement.spread = None;
    let plan = solve1(&snap);
    assert_eq!((on(&plan, "eu-1"), on(&plan, "us-1")), (0, 4), "{:?}", plan.assignments);
}

/// A running replica whose pool lost its capacity will not be kept, so it does not count
/// against the ceiling when the replicas that stay are judged for spread. `m` (spread by
/// cluster, skew 1, an $18/h ceiling) runs 2 replicas on `a` ($2.50 each) and 1 on `c`'s
/// H100 ($12.25, $17.25 in all), whose node is now full. Counting that replica, no other
/// cluster would be affordable ($19.75) while `a` keeps its two, so both would stay; the lost
/// one then goes to `b`, and `d` is left empty and affordable ($10 with it) while `a` has 2:
/// over the skew. Judged without it, `a` keeps one and the plan spreads 1 + 1 + 1.
#[test]
fn a_replica_that_cannot_be_kept_does_not_count_against_the_ceiling_for_spread() {
    let od = CapacityType::OnDemand;
    let mut snap = FleetSnapshot {
        classes: [
            class("l40s", "48Gi", "Ada", 4, "10.00", "4.00"),
            class("h100", "80Gi", "Hopper", 8, "98.00", "40.00"),
        ]
        .into_iter()
        .collect(),
        clusters: vec![
            cluster("a", "r-a", "EU", vec![pool("l40s", "l40s", 1, 4, od)]),
            cluster("b", "r-b", "EU", vec![pool("l40s", "l40s", 1, 4, od)]),
            cluster("c", "r-c", "EU", vec![pool("h100", "h100", 1, 8, od)]),
            cluster("d", "r-d", "EU", vec![pool("l40s", "l40s", 1, 4, od)]),
        ],
        deployments: vec![deployment(
            "m",
            3,
            json!({
                "topology": {"type": "Standalone", "devicesPerReplica": 1},
                "devices": {"alternatives": [{"selectors": [
                    "device.capacity[\"gpu.nvidia.com\"].memory.compareTo(quantity(\"40Gi\")) >= 0"
                ]}]},
                "placement": {"spread": {"by": "cluster", "maxSkew": 1}, "maxCostPerHour": "18.00",
                    "sovereignty": {"allowedJurisdictions": ["EU"]}}
            }),
        )],
        quotas: Vec::new(),
    };
    snap.deployments[0].current = vec![placement("a", "l40s", 1, 2), placement("c", "h100", 1, 1)];
    // Twin: while `c` still has room, the replica there is kept and counts: nothing moves.
    let plan = solve1(&snap);
    let spread = |p: &DeploymentPlan| ["a", "b", "c", "d"].map(|c| on(p, c));
    assert_eq!(spread(&plan), [2, 0, 1, 0], "{:?}", plan.assignments);
    snap.clusters[2].pools[0].free_per_node = free_per_node(1, 8, 8);
    let plan = solve1(&snap);
    assert_eq!(spread(&plan), [1, 1, 0, 1], "{:?}", plan.assignments);
}

#[test]
fn stickiness_keeps_a_healthy_placement() {
    let mut snap = fleet(vec![deployment("m", 2, json!({}))]);
    snap.deployments[0].current = vec![placement("us-1", "h100", 1, 2)];
    let plan = solve1(&snap);
    assert_eq!(on(&plan, "us-1"), 2, "stays where it runs although eu-1 sorts first");
    // Twin: no current placement → eu-1.
    snap.deployments[0].current.clear();
    assert_eq!(on(&solve1(&snap), "eu-1"), 2);
    // Sticky but now forbidden by sovereignty → moves.
    snap.deployments =
        vec![deployment("m", 2, json!({"placement": {"sovereignty": {"allowedJurisdictions": ["EU"]}}}))];
    snap.deployments[0].current = vec![placement("us-1", "h100", 1, 2)];
    let plan = solve1(&snap);
    assert_eq!(on(&plan, "us-1"), 0);
    assert_eq!(on(&plan, "eu-1"), 2);
}

#[test]
fn proportional_split_follows_free_capacity() {
    let mut snap = fleet(vec![deployment("m", 6, json!({"placement": {"split": "Proportional"}}))]);
    snap.clusters[2].pools[0] = pool("h100", "h100", 4, 8, CapacityType::OnDemand); // us-1: 8 slots, eu-1: 4
    let plan = solve1(&snap);
    assert_eq!((on(&plan, "eu-1"), on(&plan, "us-1")), (2, 4), "{:?}", plan.assignments);
    // Twin: packed fills eu-1 first.
    snap.deployments = vec![deployment("m", 6, json!({}))];
    let plan = solve1(&snap);
    assert_eq!((on(&plan, "eu-1"), on(&plan, "us-1")), (4, 2));
}

#[test]
fn capacity_is_consumed_across_deployments_in_priority_order() {
    let a = deployment("a", 4, json!({"placement": {"sovereignty": {"allowedJurisdictions": ["EU"]}}}));
    let mut b =
        deployment("b", 4, json!({"placement": {"sovereignty": {"allowedJurisdictions": ["EU"]}, "priority": 10}}));
    b.created = 5;
    let plan = solve(&fleet(vec![a, b]), &SolveOptions::default());
    assert_eq!(plan.deployments[0].name, "b", "higher priority first");
    assert_eq!(plan.deployments[0].unplaced, 0);
    assert_eq!(plan.deployments[1].unplaced, 4, "the devices were promised to b");
    assert_eq!(
        plan.deployments[1].rejections.iter().find(|r| r.cluster == "eu-1").map(|r| r.reason),
        Some(Reason::InsufficientDevices)
    );
}

#[test]
fn same_input_same_bytes() {
    let snap = fleet(vec![
        deployment("a", 3, json!({"placement": {"spread": {"by": "region", "maxSkew": 1}}})),
        deployment("b", 5, json!({"devices": {"alternatives": [{"class": "a100"}, {"class": "h100"}]}})),
    ]);
    let one = serde_json::to_string(&solve(&snap, &SolveOptions::default())).unwrap();
    let two = serde_json::to_string(&solve(&snap, &SolveOptions::default())).unwrap();
    assert_eq!(one, two);
}

#[test]
fn budget_exhaustion_is_reported_not_silent() {
    let snap = fleet(vec![deployment("a", 1, json!({})), deployment("b", 1, json!({}))]);
    let plan = solve(&snap, &SolveOptions { max_evaluations: 0, ..Default::default() });
    // The first deployment runs (the budget is checked between deployments), the second does not.
    assert_eq!(plan.deployments[0].unplaced, 0);
    assert_eq!(plan.deployments[1].rejections[0].reason, Reason::BudgetExhausted);
}

#[test]
fn a_ready_cache_is_preferred_over_a_cheaper_cold_cluster() {
    // eu-1 and us-1 are both H100 at the same price; eu-1 comes first by name. The cache is
    // Ready only in us-1: a deployment referencing it goes there.
    let cached = deployment("m", 2, json!({"model": {"cacheRef": "weights"}}));
    let mut snap = fleet(vec![cached.clone()]);
    snap.clusters[2].ready_caches.insert(flotilla_placement::cache_key("ml", "weights"));
    let plan = solve1(&snap);
    assert_eq!((on(&plan, "us-1"), on(&plan, "eu-1")), (2, 0), "{plan:?}");
    // The explanation says why.
    let explain = SolveOptions { explain: Some(("ml".into(), "m".into())), ..Default::default() };
    let e = solve(&snap, &explain).deployments.remove(0).explanation.unwrap();
    let us = e.iter().find(|c| c.cluster == "us-1").unwrap();
    assert!(us.candidates.iter().all(|c| c.cache_ready));
    assert!(e.iter().find(|c| c.cluster == "eu-1").unwrap().candidates.iter().all(|c| !c.cache_ready));
    // Twins: the same cache Ready in another namespace, or a deployment without cacheRef, change nothing.
    let mut other_ns = fleet(vec![cached]);
    other_ns.clusters[2].ready_caches.insert(flotilla_placement::cache_key("other", "weights"));
    assert_eq!(on(&solve1(&other_ns), "eu-1"), 2);
    let mut no_ref = fleet(vec![deployment("m", 2, json!({}))]);
    no_ref.clusters[2].ready_caches.insert(flotilla_placement::cache_key("ml", "weights"));
    assert_eq!(on(&solve1(&no_ref), "eu-1"), 2);
    // Ranked before price: the A100 cluster eu-2 is cheaper, but the cache is Ready on eu-1.
    let any80 = json!({"model": {"cacheRef": "weights"}, "devices": {"alternatives": [{"selectors": [
        "device.capacity[\"gpu.nvidia.com\"].memory.compareTo(quantity(\"80Gi\")) >= 0"]}]}});
    let mut warm_dear = fleet(vec![deployment("m", 2, any80.clone())]);
    assert_eq!(on(&solve1(&warm_dear), "eu-2"), 2, "cold: the cheaper A100 wins");
    warm_dear.clusters[0].ready_caches.insert(flotilla_placement::cache_key("ml", "weights"));
    assert_eq!(on(&solve1(&warm_dear), "eu-1"), 2, "warm: the Ready cache wins over price");
    // A cold cluster still takes what the warm one cannot hold: a preference, not a filter.
    let mut big = fleet(vec![deployment("m", 6, json!({"model": {"cacheRef": "weights"}}))]);
    big.clusters[2].ready_caches.insert(flotilla_placement::cache_key("ml", "weights"));
    let plan = solve1(&big);
    assert_eq!((on(&plan, "us-1"), on(&plan, "eu-1"), plan.unplaced), (4, 2, 0));
}

#[test]
fn capacity_a_claim_obtained_goes_to_its_owner_alone() {
    // eu-1's shared H100 pool has one node; a claim of ml/big set two more aside.
    let od = CapacityType::OnDemand;
    let eu_only = json!({"placement": {"sovereignty": {"allowedJurisdictions": ["EU"]}},
                         "topology": {"type": "TensorParallel", "devicesPerReplica": 8}});
    let mut other = deployment("other", 3, eu_only.clone());
    other.spec.placement.priority = Some(1000);
    let big = deployment("big", 3, eu_only);
    let mut snap = fleet(vec![other, big]);
    let reserved = PoolView { reserved_for: Some("ml.big".into()), ..pool("h100", "h100", 2, 8, od) };
    snap.clusters[0].pools = vec![pool("h100", "h100", 1, 8, od), reserved];
    let plan = solve(&snap, &SolveOptions::default());
    let (other, big) = (&plan.deployments[0], &plan.deployments[1]);
    assert_eq!(other.name, "other");
    assert_eq!(on(other, "eu-1"), 1, "the higher-priority deployment gets the shared node only");
    assert_eq!(other.unplaced, 2, "and none of the claim's nodes");
    assert_eq!(on(big, "eu-1"), 2, "the owner gets its claim's two nodes");
    assert_eq!(big.assignments.len(), 1, "one assignment per pool: {:?}", big.assignments);
    assert_eq!(big.assignments[0].pool, "h100");

    // Negative twin: without the claim's mark, the higher-priority deployment takes them.
    snap.clusters[0].pools[1].reserved_for = None;
    let plan = solve(&snap, &SolveOptions::default());
    assert_eq!(on(&plan.deployments[0], "eu-1"), 3);
    assert_eq!(on(&plan.deployments[1], "eu-1"), 0);
}

#[test]
fn a_selector_failing_on_a_class_is_the_clusters_reason_over_another_pools_mismatch() {
    // eu-1 has an h100 pool (not the class asked for) and a pool of a class whose capacity no
    // Quantity holds: the error to fix is what the cluster reports, not the plain mismatch.
    let od = CapacityType::OnDemand;
    let mut snap = fleet(vec![deployment(
        "m",
        1,
        json!({"devices": {"alternatives": [{"class": "bad",
            "selectors": ["device.capacity[\"gpu.nvidia.com\"].memory.compareTo(quantity(\"80Gi\")) >= 0"]}]}}),
    )]);
    snap.classes.insert("bad".into(), class("bad", "1e400", "Hopper", 8, "1.00", "1.00").1);
    snap.clusters[0].pools.push(pool("bad", "bad", 1, 8, od));
    let plan = solve1(&snap);
    assert_eq!(reason(&plan, "eu-1"), Some(Reason::SelectorError), "{:?}", plan.rejections);
    let words = &plan.rejections.iter().find(|r| r.cluster == "eu-1").unwrap().message;
    assert!(words.contains("spec.device.capacity.memory"), "{words}");
    // A deployment that does not ask for the bad class hears about its own selector, not about
    // the bad class: a selector false on a valid device tells more than an invalid class.
    let own = deployment(
        "n",
        1,
        json!({"devices": {"alternatives": [{"selectors": ["device.attributes[\"gpu.nvidia.com\"].nosuch == 1"]}]}}),
    );
    let mut other = snap.clone();
    other.deployments = vec![own];
    let plan = solve1(&other);
    let words = &plan.rejections.iter().find(|r| r.cluster == "eu-1").unwrap().message;
    assert_eq!(reason(&plan, "eu-1"), Some(Reason::NoMatchingDevices));
    assert!(words.contains("nosuch"), "{words}");
    // Twin: without the bad pool the cluster's reason is the mismatch.
    snap.clusters[0].pools.pop();
    assert_eq!(reason(&solve1(&snap), "eu-1"), Some(Reason::NoMatchingDevices));
}
