//! FleetQuotas: a namespace's limits across the fleet bind as hard constraints. A replica that
//! would pass one falls back to capacity the limit does not count, or stays unplaced with
//! `QuotaExceeded` naming the quota; another namespace is never touched by it; within the
//! namespace, priority takes the quota first; no plan — greedy, improved, re-planned or exact —
//! holds more than a limit allows.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // test helpers outside #[test] fns

use flotilla_apis::CapacityType;
use flotilla_apis::class::InferenceClassSpec;
use flotilla_apis::deployment::ModelDeploymentSpec;
use flotilla_apis::quota::FleetQuotaSpec;
use flotilla_placement::generate::{GenSpec, generate};
use flotilla_placement::plan::{DeploymentPlan, Plan, Reason};
use flotilla_placement::snapshot::free_per_node;
use flotilla_placement::{
    ClassView, ClusterView, DeploymentView, ExactOptions, FleetSnapshot, PoolView, QuotaView, Replanner, SolveOptions,
    quota_usage, solve,
};
use serde_json::{Value, json};

fn class(name: &str, on_demand: &str, spot: &str) -> (String, ClassView) {
    let spec: InferenceClassSpec = serde_json::from_value(json!({
        "device": {"driver": "gpu.nvidia.com", "attributes": {"productName": {"string": name}},
                   "capacity": {"memory": "80Gi"}},
        "devicesPerNode": 8,
        "pricePerNodeHour": {"onDemand": on_demand, "spot": spot}
    }))
    .unwrap();
    (name.to_string(), ClassView { spec })
}

fn pool(class: &str, cap: CapacityType, nodes: u32) -> PoolView {
    PoolView {
        name: format!("{class}-{}", cap.as_str()),
        class: class.into(),
        capacity_type: Some(cap),
        free_per_node: free_per_node(nodes, 8, 0),
        reserved_for: None,
        refused_block: None,
    }
}

fn cluster(name: &str, pools: Vec<PoolView>) -> ClusterView {
    ClusterView {
        name: name.into(),
        region: format!("{name}-region"),
        jurisdiction: "EU".into(),
        ready: true,
        pools,
        ..Default::default()
    }
}

/// `ns/name`: `replicas` TP`devices` replicas over `alternatives` (classes), on-demand or spot.
fn deployment(
    ns: &str,
    name: &str,
    created: i64,
    replicas: i32,
    devices: u32,
    alternatives: &[&str],
    placement: Value,
) -> DeploymentView {
    let mut placement = placement;
    if placement.get("capacityTypes").is_none() {
        placement["capacityTypes"] = json!(["on-demand", "spot"]);
    }
    let alts: Vec<Value> = alternatives.iter().map(|c| json!({"class": c})).collect();
    let spec = json!({
        "model": {"name": name, "source": "hf://org/m"},
        "replicas": replicas,
        "engine": {"image": "vllm/vllm-openai:v0.11.0"},
        "topology": {"type": "TensorParallel", "devicesPerReplica": devices},
        "devices": {"alternatives": alts},
        "placement": placement
    });
    DeploymentView {
        namespace: ns.into(),
        name: name.into(),
        created,
        spec: serde_json::from_value::<ModelDeploymentSpec>(spec).unwrap(),
        current: vec![],
        refused_pools: vec![],
    }
}

fn quota(ns: &str, name: &str, spec: Value) -> QuotaView {
    QuotaView { namespace: ns.into(), name: name.into(), spec: serde_json::from_value::<FleetQuotaSpec>(spec).unwrap() }
}

/// Two clusters: `eu` with 2 h100 on-demand nodes and 2 a100 on-demand nodes, `us` with 2 h100
/// spot nodes.
fn fleet(deployments: Vec<DeploymentView>, quotas: Vec<QuotaView>) -> FleetSnapshot {
    FleetSnapshot {
        classes: [class("h100", "80.00", "24.00"), class("a100", "32.00", "12.00")].into_iter().collect(),
        clusters: vec![
            cluster("eu", vec![pool("h100", CapacityType::OnDemand, 2), pool("a100", CapacityType::OnDemand, 2)]),
            cluster("us", vec![pool("h100", CapacityType::Spot, 2)]),
        ],
        deployments,
        quotas,
    }
}

fn plan_of<'p>(plan: &'p Plan, name: &str) -> &'p DeploymentPlan {
    plan.deployments.iter().find(|d| d.name == name).unwrap()
}

/// Devices of `class` a deployment's plan holds.
fn devices_on(p: &DeploymentPlan, class: &str, per_replica: u32) -> u32 {
    p.assignments.iter().filter(|a| a.class == class).map(|a| a.replicas * per_replica).sum()
}

#[test]
fn a_class_limit_sends_replicas_to_the_next_alternative_and_leaves_other_namespaces_alone() {
    let deps = || {
        vec![
            deployment("team-a", "big", 1, 6, 4, &["h100", "a100"], json!({})),
            deployment("team-b", "other", 2, 4, 4, &["h100"], json!({})),
        ]
    };
    let free = solve(&fleet(deps(), vec![]), &SolveOptions::default());
    assert!(devices_on(plan_of(&free, "big"), "h100", 4) > 8, "without the quota team-a takes more h100: {free:?}");
    let limited = fleet(deps(), vec![quota("team-a", "gpus", json!({"devices": [{"class": "h100", "max": 8}]}))]);
    let plan = solve(&limited, &SolveOptions::default());
    let big = plan_of(&plan, "big");
    assert_eq!(devices_on(big, "h100", 4), 8, "the limit binds exactly: {big:?}");
    assert_eq!(big.unplaced, 0, "the rest went to a100, which the limit does not count: {big:?}");
    assert_eq!(devices_on(big, "a100", 4), 16);
    // team-b has no quota: its four replicas are placed, all on h100, as before.
    let other = plan_of(&plan, "other");
    assert_eq!((other.unplaced, devices_on(other, "h100", 4)), (0, 16), "{other:?}");
    let usage = &plan.quotas;
    assert_eq!(usage.len(), 1);
    assert_eq!((usage[0].limits[0].used, usage[0].limits[0].max, usage[0].unplaced), (8, 8, 0));
    assert_eq!(usage[0].summary(), "h100 devices 8/8");
}

#[test]
fn a_binding_limit_says_quota_exceeded_naming_the_quota_and_its_numbers() {
    let deps = vec![deployment("team-a", "big", 1, 5, 8, &["h100"], json!({}))];
    let limited = fleet(deps, vec![quota("team-a", "gpus", json!({"devices": [{"max": 24}]}))]);
    let plan = solve(&limited, &SolveOptions::default());
    let big = plan_of(&plan, "big");
    assert_eq!((big.desired, big.unplaced), (5, 2), "three TP8 replicas fit 24 devices: {big:?}");
    let quota_refusals: Vec<_> = big.rejections.iter().filter(|r| r.reason == Reason::QuotaExceeded).collect();
    assert!(!quota_refusals.is_empty(), "{:?}", big.rejections);
    for r in &quota_refusals {
        assert!(
            r.message.starts_with(
                "FleetQuota team-a/gpus: devices 24 of 24 used in the namespace; one more replica here needs 8"
            ),
            "{}",
            r.message
        );
    }
    // The two free h100 nodes left are not a capacity problem.
    assert!(big.rejections.iter().all(|r| r.reason != Reason::InsufficientDevices), "{:?}", big.rejections);
    assert_eq!(plan.quotas[0].unplaced, 2);
}

#[test]
fn within_a_namespace_priority_takes_the_quota_first_and_another_team_is_never_preempted() {
    let deps = vec![
        // Created first, low priority: the greedy would otherwise place it in document order.
        deployment("team-a", "batch", 1, 2, 8, &["h100"], json!({"priority": 0})),
        deployment("team-a", "chat", 2, 2, 8, &["h100"], json!({"priority": 100})),
        deployment("team-b", "rival", 3, 2, 8, &["h100"], json!({"priority": 0})),
    ];
    let limited = fleet(deps, vec![quota("team-a", "gpus", json!({"devices": [{"class": "h100", "max": 16}]}))]);
    let plan = solve(&limited, &SolveOptions::default());
    assert_eq!(plan_of(&plan, "chat").unplaced, 0, "{plan:?}");
    let batch = plan_of(&plan, "batch");
    assert_eq!(batch.unplaced, 2, "{batch:?}");
    assert!(batch.rejections.iter().any(|r| r.reason == Reason::QuotaExceeded), "{:?}", batch.rejections);
    let rival = plan_of(&plan, "rival");
    // The four h100 nodes: two for chat, the two batch may not have go to team-b.
    assert_eq!(rival.unplaced, 0, "{rival:?}");
    assert!(rival.preemptions.is_empty() && batch.preemptions.is_empty());
}

#[test]
fn a_cost_limit_and_a_capacity_type_limit_bind_too() {
    // $/h per TP8 replica: h100 on-demand 80, h100 spot 24, a100 on-demand 32.
    let deps = vec![deployment("team-a", "big", 1, 4, 8, &["h100", "a100"], json!({}))];
    let by_cost = fleet(deps.clone(), vec![quota("team-a", "money", json!({"maxCostPerHour": "100"}))]);
    let plan = solve(&by_cost, &SolveOptions::default());
    let big = plan_of(&plan, "big");
    assert!(big.cost_micros_per_hour <= 100_000_000, "{big:?}");
    assert!(big.unplaced > 0, "four replicas cost more than $100/h anywhere: {big:?}");
    assert!(big.rejections.iter().any(|r| r.reason == Reason::QuotaExceeded && r.message.contains("maxCostPerHour")));
    let by_type = fleet(deps, vec![quota("team-a", "spot", json!({"devices": [{"capacityType": "spot", "max": 0}]}))]);
    let plan = solve(&by_type, &SolveOptions::default());
    let big = plan_of(&plan, "big");
    assert!(big.assignments.iter().all(|a| a.capacity_type != CapacityType::Spot), "{big:?}");
    assert_eq!(big.unplaced, 0, "{big:?}");
}

#[test]
fn a_quota_of_another_namespace_or_one_that_cannot_bind_changes_nothing() {
    for seed in 0..6 {
        let snap = generate(&GenSpec { clusters: 6, deployments: 40, seed });
        let free = solve(&snap, &SolveOptions::default());
        let mut roomy = snap.clone();
        // Far above anything the namespace could ask for, on every limit kind.
        roomy.quotas = vec![
            quota(
                "ml",
                "roomy",
                json!({"devices": [{"max": 1_000_000}, {"class": "h100", "max": 1_000_000}], "maxCostPerHour": "999999999"}),
            ),
            quota("nobody-here", "tight", json!({"devices": [{"max": 0}]})),
        ];
        let plan = solve(&roomy, &SolveOptions::default());
        assert_eq!(plan.deployments, free.deployments, "seed {seed}");
        assert_eq!(plan.quotas.len(), 2);
    }
}

#[test]
fn no_plan_passes_a_limit_whatever_produced_it() {
    let exact = SolveOptions { exact: Some(ExactOptions::default()), ..SolveOptions::default() };
    for seed in 0..8 {
        let snap = generate(&GenSpec { clusters: 4, deployments: 20, seed });
        let free = solve(&snap, &SolveOptions::default());
        // Half of what each of two namespaces holds without quotas, in devices and in cost.
        let held = |ns: &str| -> (u64, u64) {
            let probe = FleetSnapshot {
                quotas: vec![quota(
                    ns,
                    "probe",
                    json!({"devices": [{"max": 1_000_000}], "maxCostPerHour": "999999999"}),
                )],
                ..snap.clone()
            };
            let u = &quota_usage(&probe, &free)[0];
            (u.limits[0].used, u.limits[1].used)
        };
        let mut limited = snap.clone();
        for ns in ["ml", "search"] {
            let (devices, cost) = held(ns);
            limited.quotas.push(quota(
                ns,
                "half",
                json!({"devices": [{"max": devices / 2}], "maxCostPerHour": format!("{}", cost / 2_000_000)}),
            ));
        }
        // (the exact mode on the first seeds only: its integer programs are slow in debug builds)
        let modes = if seed < 2 {
            vec![("default", SolveOptions::default()), ("exact", exact.clone())]
        } else {
            vec![("default", SolveOptions::default())]
        };
        for (what, options) in modes {
            let plan = solve(&limited, &options);
            for u in &plan.quotas {
                assert!(!u.over(), "seed {seed}, {what}: {}/{} passes a limit: {}", u.namespace, u.name, u.summary());
            }
            assert_eq!(plan.quotas, quota_usage(&limited, &plan), "seed {seed}: the plan's usage is the plan's");
            let short_for_quota: u32 = plan.quotas.iter().map(|q| q.unplaced).sum();
            assert!(short_for_quota > 0, "seed {seed}, {what}: half the usage binds somewhere");
        }
        // The re-planner solves whole while quotas exist: the same plan as `solve`.
        let mut r = Replanner::new(&snap, SolveOptions::default());
        assert_eq!(
            r.replan(&limited).deployments,
            solve(&limited, &SolveOptions::default()).deployments,
            "seed {seed}"
        );
        assert!(r.stats().full);
        // And back without quotas: the plan without them.
        assert_eq!(r.replan(&snap).deployments, free.deployments, "seed {seed}");
    }
}
