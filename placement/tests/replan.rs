//! The incremental re-plan (`Replanner`) against a full solve of the same snapshot, byte for
//! byte (the plans' JSON), over random fleets and random sequences of changes: replicas scaled,
//! deployments started where the last plan put them or stopped, ceilings and spread changed,
//! pools refused, a deployment's priority changed, capacity lost or regained, a cluster
//! cordoned; and every other kind of deployment-side edit: device selectors (CEL, including
//! ones that read a missing attribute, return no bool or do not compile), tolerations,
//! fallback alternatives added, removed or reordered, `minReplicas`/`maxReplicas`, capacity
//! types and split, and a hardware class's attributes, memory, devices per node or price.
//! Then that the re-plan really is incremental: it reuses steps, one changed deployment runs
//! few of them, and every edit kind reaches the re-plan. The same with FleetQuotas on random
//! namespaces, some binding and some not (a step reads its namespace's room like a pool's free
//! devices), and with quotas edited.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use flotilla_apis::CapacityType;
use flotilla_apis::class::InferenceClassSpec;
use flotilla_apis::common::format_price_micros;
use flotilla_apis::common::{ClusterToleration, TaintEffect, TolerationOperator};
use flotilla_apis::deployment::{
    CelExpression, ClusterPlacement, DeviceAlternative, ModelDeploymentSpec, RefusedPool, SplitStrategy, Spread,
    SpreadDomain,
};
use flotilla_placement::generate::{GenSpec, generate, with_current};
use flotilla_placement::snapshot::free_per_node;
use flotilla_placement::{
    ClassView, ClusterView, DeploymentView, FleetSnapshot, Plan, PoolView, QuotaView, Replanner, SolveOptions,
    quota_usage, solve,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use proptest::prelude::*;
use serde_json::json;

fn json(plan: &Plan) -> String {
    serde_json::to_string(plan).unwrap()
}

/// One change to a fleet, applied to deployment (or pool) `at` modulo their number.
#[derive(Clone, Debug)]
enum Change {
    Scale(usize, i32),
    /// Every deployment now runs where the last plan put it.
    Running,
    /// The deployment's replicas stop running.
    Stopped(usize),
    Ceiling(usize, Option<u32>),
    Spread(usize, Option<(u8, i32)>),
    /// The member's scheduler refused the deployment's pods in the pool of its first placement.
    Refused(usize),
    /// Another solve order: the whole fleet is solved again.
    Priority(usize, i32),
    /// Half the nodes of a pool lose their free devices (capacity observed: incremental).
    CapacityLoss(usize),
    /// Every node of a pool has all its devices free again.
    CapacityGain(usize),
    /// A pool's cluster is cordoned: the whole fleet is solved again.
    Cordon(usize),
    /// An alternative's CEL device selectors become set `k` of `SELECTORS` (deployment,
    /// alternative, set).
    Selectors(usize, usize, usize),
    /// The deployment's tolerations become set `k` of `tolerations`.
    Tolerations(usize, usize),
    /// The deployment's fallback alternatives edited: one added, removed or moved.
    Alternatives(usize, AltEdit),
    /// An alternative's `minReplicas` / `maxReplicas` (deployment, alternative, min, max).
    Limits(usize, usize, Option<i32>, Option<i32>),
    /// The deployment's allowed capacity types become set `k` of `CAPACITY_TYPES`.
    CapacityTypes(usize, usize),
    /// `split: Proportional` set or cleared.
    Split(usize, bool),
    /// A hardware class edited (another frame: the whole fleet is solved again).
    Class(usize, ClassEdit),
    /// Every limit of FleetQuota `k` (modulo their number) becomes `pct` % of what it was.
    Quota(usize, u32),
}

/// How a deployment's alternatives change: `at` and `to` modulo their number.
#[derive(Clone, Debug)]
enum AltEdit {
    /// A new alternative at `at`: class `k` of the fleet's (modulo their number), or none with
    /// the selectors of set `k` of `SELECTORS`.
    Add { at: usize, class: bool, k: usize },
    /// The alternative at `at` removed (the last one too: the spec is then invalid).
    Remove(usize),
    /// The alternative at `at` moved to `to` (another fallback order).
    Move { at: usize, to: usize },
}

/// How a class changes.
#[derive(Clone, Debug)]
enum ClassEdit {
    /// Its architecture attribute flips between Hopper and Ampere (what CEL selectors read).
    Architecture,
    /// Its device memory becomes `Gi` gibibytes.
    Memory(u32),
    /// Its devices per node become `n`; its pools' nodes offer at most that many.
    DevicesPerNode(u32),
    /// Its on-demand price becomes `dollars` per node-hour, or none.
    Price(Option<u32>),
}

/// Device selector sets an edit picks from: none, ones the generated classes satisfy or not,
/// one that reads a missing attribute, one that is not a bool and one that does not compile.
const SELECTORS: [&[&str]; 8] = [
    &[],
    &[r#"device.attributes["gpu.nvidia.com"].architecture == "Hopper""#],
    &[r#"device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("80Gi")) >= 0"#],
    &[
        r#"device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA")"#,
        r#"device.driver == "gpu.nvidia.com""#,
    ],
    &[r#"device.driver == "gpu.amd.com""#],
    &[r#"device.attributes["gpu.nvidia.com"].noSuchAttribute == 1"#],
    &[r#"device.attributes["gpu.nvidia.com"].productName"#],
    &[r#"device.attributes[("#],
];

fn tolerations(k: usize) -> Vec<ClusterToleration> {
    let t = |key: Option<&str>, operator, value: Option<&str>, effect| ClusterToleration {
        key: key.map(Into::into),
        operator: Some(operator),
        value: value.map(Into::into),
        effect,
    };
    match k % 5 {
        0 => vec![],
        1 => vec![t(Some("dedicated"), TolerationOperator::Equal, Some("research"), Some(TaintEffect::NoSchedule))],
        2 => vec![t(Some("maintenance"), TolerationOperator::Exists, None, None)],
        3 => vec![t(None, TolerationOperator::Exists, None, None)],
        _ => vec![t(Some("flotilla.dev/cost"), TolerationOperator::Equal, Some("high"), None)],
    }
}

const CAPACITY_TYPES: [&[CapacityType]; 6] = [
    &[],
    &[CapacityType::OnDemand],
    &[CapacityType::Reserved, CapacityType::OnDemand],
    &[CapacityType::OnDemand, CapacityType::Reserved],
    &[CapacityType::Spot, CapacityType::OnDemand],
    &[CapacityType::Spot],
];

fn change() -> impl Strategy<Value = Change> {
    prop_oneof![
        4 => (any::<usize>(), -2i32..=3).prop_map(|(i, k)| Change::Scale(i, k)),
        3 => Just(Change::Running),
        1 => any::<usize>().prop_map(Change::Stopped),
        1 => (any::<usize>(), proptest::option::of(1u32..60)).prop_map(|(i, c)| Change::Ceiling(i, c)),
        1 => (any::<usize>(), proptest::option::of((0u8..3, 1i32..3))).prop_map(|(i, s)| Change::Spread(i, s)),
        1 => any::<usize>().prop_map(Change::Refused),
        1 => (any::<usize>(), 0i32..4).prop_map(|(i, p)| Change::Priority(i, p * 100)),
        1 => any::<usize>().prop_map(Change::CapacityLoss),
        1 => any::<usize>().prop_map(Change::CapacityGain),
        1 => any::<usize>().prop_map(Change::Cordon),
        1 => (any::<usize>(), any::<usize>(), 0..SELECTORS.len()).prop_map(|(i, a, k)| Change::Selectors(i, a, k)),
        1 => (any::<usize>(), 0usize..5).prop_map(|(i, k)| Change::Tolerations(i, k)),
        1 => (any::<usize>(), alt_edit()).prop_map(|(i, e)| Change::Alternatives(i, e)),
        1 => (any::<usize>(), any::<usize>(), proptest::option::of(0i32..3), proptest::option::of(0i32..4))
            .prop_map(|(i, a, min, max)| Change::Limits(i, a, min, max)),
        1 => (any::<usize>(), 0..CAPACITY_TYPES.len()).prop_map(|(i, k)| Change::CapacityTypes(i, k)),
        1 => (any::<usize>(), any::<bool>()).prop_map(|(i, on)| Change::Split(i, on)),
        1 => (any::<usize>(), class_edit()).prop_map(|(k, e)| Change::Class(k, e)),
    ]
}

fn alt_edit() -> impl Strategy<Value = AltEdit> {
    prop_oneof![
        (any::<usize>(), any::<bool>(), any::<usize>()).prop_map(|(at, class, k)| AltEdit::Add { at, class, k }),
        any::<usize>().prop_map(AltEdit::Remove),
        (any::<usize>(), any::<usize>()).prop_map(|(at, to)| AltEdit::Move { at, to }),
    ]
}

fn class_edit() -> impl Strategy<Value = ClassEdit> {
    prop_oneof![
        Just(ClassEdit::Architecture),
        prop_oneof![Just(24u32), Just(48), Just(80), Just(192)].prop_map(ClassEdit::Memory),
        prop_oneof![Just(2u32), Just(4), Just(8)].prop_map(ClassEdit::DevicesPerNode),
        proptest::option::of(1u32..100).prop_map(ClassEdit::Price),
    ]
}

fn apply(snap: &mut FleetSnapshot, last: &Plan, change: &Change) {
    let n = snap.deployments.len();
    match *change {
        Change::Scale(i, k) => {
            let d = &mut snap.deployments[i % n];
            d.spec.replicas = (d.spec.replicas + k).max(0);
        }
        Change::Running => *snap = with_current(snap, last),
        Change::Stopped(i) => snap.deployments[i % n].current.clear(),
        Change::Ceiling(i, c) => {
            snap.deployments[i % n].spec.placement.max_cost_per_hour = c.map(|c| c.to_string());
        }
        Change::Spread(i, s) => {
            let by = |k: u8| match k {
                0 => SpreadDomain::Cluster,
                1 => SpreadDomain::Zone,
                _ => SpreadDomain::Region,
            };
            snap.deployments[i % n].spec.placement.spread = s.map(|(k, skew)| Spread { by: by(k), max_skew: skew });
        }
        Change::Refused(i) => {
            let d = &mut snap.deployments[i % n];
            if let Some(p) = d.current.first() {
                let refused = RefusedPool {
                    cluster: p.cluster.clone(),
                    pool: p.pool.clone(),
                    retry_after: Time(k8s_openapi::jiff::Timestamp::from_second(1_800_000_000).unwrap()),
                    devices_short: false,
                    message: "0/4 nodes are available".into(),
                };
                d.refused_pools.push(refused);
            }
        }
        Change::Priority(i, p) => snap.deployments[i % n].spec.placement.priority = Some(p),
        Change::CapacityLoss(i) => {
            if let Some((ci, pi)) = pool(snap, i) {
                let free = &mut snap.clusters[ci].pools[pi].free_per_node;
                let half = free.len().div_ceil(2);
                free.iter_mut().take(half).for_each(|f| *f = 0);
            }
        }
        Change::CapacityGain(i) => {
            if let Some((ci, pi)) = pool(snap, i) {
                let class = snap.clusters[ci].pools[pi].class.clone();
                let per_node = snap.classes.get(&class).map_or(8, |c| c.devices_per_node());
                snap.clusters[ci].pools[pi].free_per_node.iter_mut().for_each(|f| *f = per_node);
            }
        }
        Change::Cordon(i) => {
            if let Some((ci, _)) = pool(snap, i) {
                snap.clusters[ci].cordoned = !snap.clusters[ci].cordoned;
            }
        }
        Change::Selectors(i, a, k) => {
            let alts = &mut snap.deployments[i % n].spec.devices.alternatives;
            let at = a % alts.len().max(1);
            if let Some(alt) = alts.get_mut(at) {
                alt.selectors = SELECTORS[k].iter().map(|e| CelExpression((*e).into())).collect();
            }
        }
        Change::Tolerations(i, k) => snap.deployments[i % n].spec.placement.tolerations = tolerations(k),
        Change::Alternatives(i, ref edit) => {
            let classes: Vec<String> = snap.classes.keys().cloned().collect();
            edit_alternatives(&mut snap.deployments[i % n].spec.devices.alternatives, edit, &classes);
        }
        Change::Limits(i, a, min, max) => {
            let alts = &mut snap.deployments[i % n].spec.devices.alternatives;
            let at = a % alts.len().max(1);
            if let Some(alt) = alts.get_mut(at) {
                (alt.min_replicas, alt.max_replicas) = (min, max);
            }
        }
        Change::CapacityTypes(i, k) => {
            snap.deployments[i % n].spec.placement.capacity_types = CAPACITY_TYPES[k].to_vec();
        }
        Change::Split(i, on) => {
            snap.deployments[i % n].spec.placement.split = on.then_some(SplitStrategy::Proportional);
        }
        Change::Class(k, ref edit) => edit_class(snap, k, edit),
        Change::Quota(k, pct) => {
            let n = snap.quotas.len();
            if let Some(q) = snap.quotas.get_mut(k % n.max(1)) {
                for l in &mut q.spec.devices {
                    l.max = (u64::from(l.max) * u64::from(pct) / 100) as u32;
                }
                let cost = q.spec.max_cost_per_hour.as_deref().and_then(flotilla_apis::common::parse_price_micros);
                q.spec.max_cost_per_hour = cost.map(|c| format_price_micros(c * u64::from(pct) / 100));
            }
        }
    }
}

fn edit_alternatives(alts: &mut Vec<DeviceAlternative>, edit: &AltEdit, classes: &[String]) {
    match *edit {
        AltEdit::Add { at, class, k } => {
            let new = DeviceAlternative {
                class: class.then(|| classes[k % classes.len().max(1)].clone()).filter(|_| !classes.is_empty()),
                selectors: if class {
                    vec![]
                } else {
                    SELECTORS[k % 5].iter().map(|e| CelExpression((*e).into())).collect()
                },
                min_replicas: None,
                max_replicas: None,
            };
            alts.insert(at % (alts.len() + 1), new);
        }
        AltEdit::Remove(at) if !alts.is_empty() => {
            alts.remove(at % alts.len());
        }
        AltEdit::Move { at, to } if !alts.is_empty() => {
            let alt = alts.remove(at % alts.len());
            alts.insert(to % (alts.len() + 1), alt);
        }
        _ => {}
    }
}

fn edit_class(snap: &mut FleetSnapshot, k: usize, edit: &ClassEdit) {
    let Some(name) = snap.classes.keys().nth(k % snap.classes.len().max(1)).cloned() else { return };
    let Some(class) = snap.classes.get_mut(&name) else { return };
    let spec = &mut class.spec;
    match *edit {
        ClassEdit::Architecture => {
            let arch = spec.device.attributes.entry("architecture".into()).or_default();
            let next = if arch.string.as_deref() == Some("Hopper") { "Ampere" } else { "Hopper" };
            arch.string = Some(next.into());
        }
        ClassEdit::Memory(gi) => {
            spec.device.capacity.insert("memory".into(), Quantity(format!("{gi}Gi")));
        }
        ClassEdit::DevicesPerNode(per_node) => {
            spec.devices_per_node = per_node;
            let pools = snap.clusters.iter_mut().flat_map(|c| &mut c.pools).filter(|p| p.class == name);
            pools.flat_map(|p| &mut p.free_per_node).for_each(|f| *f = (*f).min(per_node));
        }
        ClassEdit::Price(dollars) => spec.price_per_node_hour.on_demand = dollars.map(|d| format!("{d}.00")),
    }
}

/// The `i`-th pool of the fleet, modulo their number.
fn pool(snap: &FleetSnapshot, i: usize) -> Option<(usize, usize)> {
    let pools: Vec<(usize, usize)> =
        snap.clusters.iter().enumerate().flat_map(|(ci, c)| (0..c.pools.len()).map(move |pi| (ci, pi))).collect();
    pools.get(i % pools.len().max(1)).copied()
}

/// Runs `changes` on the fleet of `spec`, checking every re-plan against a full solve; returns
/// the re-plans that were incremental and the steps they reused.
fn check_sequence(spec: &GenSpec, options: &SolveOptions, changes: &[Change]) -> Result<(usize, usize), String> {
    check_snapshot(generate(spec), options, changes)
}

/// [`check_sequence`] from a given fleet.
fn check_snapshot(
    mut snap: FleetSnapshot,
    options: &SolveOptions,
    changes: &[Change],
) -> Result<(usize, usize), String> {
    let mut r = Replanner::new(&snap, options.clone());
    if json(r.plan()) != json(&solve(&snap, options)) {
        return Err("the first plan differs from solve".into());
    }
    let (mut incremental, mut reused) = (0, 0);
    for (k, c) in changes.iter().enumerate() {
        let last = r.plan().clone();
        apply(&mut snap, &last, c);
        let got = json(r.replan(&snap));
        let want = json(&solve(&snap, options));
        if got != want {
            return Err(format!("after change {k} ({c:?}) of {changes:?}:\nreplan {got}\nsolve  {want}"));
        }
        let s = r.stats();
        if !s.full {
            incremental += 1;
            reused += s.steps_reused;
        }
    }
    Ok((incremental, reused))
}

fn fleets() -> impl Strategy<Value = GenSpec> {
    (1usize..=20, 1usize..=30, any::<u64>()).prop_map(|(clusters, deployments, seed)| GenSpec {
        clusters,
        deployments,
        seed,
    })
}

fn crowded() -> impl Strategy<Value = GenSpec> {
    (2usize..=6, 15usize..=40, any::<u64>()).prop_map(|(clusters, deployments, seed)| GenSpec {
        clusters,
        deployments,
        seed,
    })
}

/// A fleet where the order of placement matters: 3–7 clusters of 1–3 nodes (one replica each)
/// and 4–14 deployments in two tiers, each allowed on 1–3 of them, so that the greedy pass
/// leaves replicas unplaced that moves place, and one attempt's moves change what the next
/// finds.
fn matching() -> impl Strategy<Value = FleetSnapshot> {
    let deployment_ = (0i32..2, 1i32..=3, proptest::collection::vec(0usize..7, 1..=3));
    (3usize..=7, proptest::collection::vec(1u32..=3, 7), proptest::collection::vec(deployment_, 4..=14)).prop_map(
        |(n, nodes, deps)| {
            let clusters = (0..n).map(|c| cluster(&format!("c{c}"), nodes[c])).collect();
            let deployments = deps
                .iter()
                .enumerate()
                .map(|(k, (tier, replicas, on))| {
                    let sites: Vec<String> = on.iter().map(|c| format!("c{}", c % n)).collect();
                    let selector = json!({"matchExpressions": [{"key": "site", "operator": "In", "values": sites}]});
                    deployment(&format!("d{k:02}"), tier * 100, *replicas, json!({"clusterSelector": selector}))
                })
                .collect();
            FleetSnapshot { classes: h100_class(), clusters, deployments, quotas: Vec::new() }
        },
    )
}

/// The namespaces the generator draws deployments in.
const NAMESPACES: [&str; 4] = ["ml", "search", "assistants", "research"];

/// What a FleetQuota limits: every device, one class's, one capacity type's, or cost.
#[derive(Clone, Copy, Debug)]
enum Limits {
    Devices,
    Class(usize),
    Spot,
    Cost,
    /// Devices and cost together.
    Both,
}

/// A FleetQuota drawn on namespace `ns` (of `NAMESPACES`): what it limits, at `pct` % of what
/// the namespace holds in a plan without it (0–100: binding, above: not).
#[derive(Clone, Copy, Debug)]
struct QuotaDraw {
    ns: usize,
    limits: Limits,
    pct: u32,
}

fn quota_draws() -> impl Strategy<Value = Vec<QuotaDraw>> {
    let limits = prop_oneof![
        3 => Just(Limits::Devices),
        1 => any::<usize>().prop_map(Limits::Class),
        1 => Just(Limits::Spot),
        2 => Just(Limits::Cost),
        1 => Just(Limits::Both),
    ];
    let pct = prop_oneof![Just(0u32), Just(30), Just(50), Just(80), Just(100), Just(120), Just(300), Just(10_000)];
    proptest::collection::vec((0..NAMESPACES.len(), limits, pct), 1..=4)
        .prop_map(|v| v.into_iter().map(|(ns, limits, pct)| QuotaDraw { ns, limits, pct }).collect())
}

/// `snap` with the drawn quotas: each limit set to its percentage of what its namespace holds
/// in `solve`'s plan of `snap` under the same quotas at a limit nothing reaches.
fn with_quotas(mut snap: FleetSnapshot, draws: &[QuotaDraw]) -> FleetSnapshot {
    let classes: Vec<String> = snap.classes.keys().cloned().collect();
    let unlimited = |d: &QuotaDraw| {
        let devices =
            |class: Option<&String>, t: Option<&str>| json!({"max": 1_000_000, "class": class, "capacityType": t});
        let spec = match d.limits {
            Limits::Devices => json!({"devices": [devices(None, None)]}),
            Limits::Class(k) => json!({"devices": [devices(classes.get(k % classes.len().max(1)), None)]}),
            Limits::Spot => json!({"devices": [devices(None, Some("spot"))]}),
            Limits::Cost => json!({"maxCostPerHour": "999999"}),
            Limits::Both => json!({"devices": [devices(None, None)], "maxCostPerHour": "999999"}),
        };
        serde_json::from_value(spec).unwrap()
    };
    snap.quotas = draws
        .iter()
        .enumerate()
        .map(|(k, d)| QuotaView { namespace: NAMESPACES[d.ns].into(), name: format!("q{k}"), spec: unlimited(d) })
        .collect();
    snap.quotas.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
    let used = quota_usage(&snap, &solve(&snap, &SolveOptions { max_improvement: 0, ..SolveOptions::default() }));
    for (q, u) in snap.quotas.iter_mut().zip(used) {
        let k: usize = q.name[1..].parse().unwrap();
        let pct = u64::from(draws[k].pct);
        for (l, used) in q.spec.devices.iter_mut().zip(&u.limits) {
            l.max = (used.used * pct / 100).min(1_000_000) as u32;
        }
        if let Some(cost) = u.limits.iter().find(|l| l.device.is_none()) {
            q.spec.max_cost_per_hour = Some(format_price_micros((cost.used * pct / 100).min(999_999_000_000)));
        }
    }
    snap
}

/// The changes of `change()`, and quotas edited.
fn quota_change() -> impl Strategy<Value = Change> {
    prop_oneof![
        12 => change(),
        1 => (any::<usize>(), prop_oneof![Just(0u32), Just(50), Just(90), Just(200)]).prop_map(|(k, p)| Change::Quota(k, p)),
    ]
}

/// [`check_sequence`] on the fleet of `spec` with the quotas `draws`.
fn check_quotas(
    spec: &GenSpec,
    draws: &[QuotaDraw],
    options: &SolveOptions,
    changes: &[Change],
) -> Result<(usize, usize), String> {
    check_snapshot(with_quotas(generate(spec), draws), options, changes)
}

proptest! {
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(48),
        ..ProptestConfig::default()
    })]

    /// With the improvement phase off, every re-plan of an unchanged frame is incremental,
    /// short deployments and all.
    #[test]
    fn greedy_replans_equal_full_solves(spec in fleets(), changes in proptest::collection::vec(change(), 1..8)) {
        let options = SolveOptions { max_improvement: 0, ..SolveOptions::default() };
        if let Err(e) = check_sequence(&spec, &options, &changes) {
            prop_assert!(false, "{spec:?}: {e}");
        }
    }

    /// With the default options (the improvement phase re-plans whole when it has work).
    #[test]
    fn replans_equal_full_solves(spec in fleets(), changes in proptest::collection::vec(change(), 1..8)) {
        if let Err(e) = check_sequence(&spec, &SolveOptions::default(), &changes) {
            prop_assert!(false, "{spec:?}: {e}");
        }
    }

    /// The same on crowded fleets (many deployments on few clusters), where the improvement
    /// phase has most to do and one attempt's moves change what a later one finds.
    #[test]
    fn crowded_replans_equal_full_solves(spec in crowded(), changes in proptest::collection::vec(change(), 1..8)) {
        if let Err(e) = check_sequence(&spec, &SolveOptions::default(), &changes) {
            prop_assert!(false, "{spec:?}: {e}");
        }
    }

    /// And with an improvement budget small enough to run out: where it runs out, and what
    /// the deployment data built before it cost, decide which attempts a re-plan may reuse.
    #[test]
    fn replans_on_a_small_budget_equal_full_solves(
        spec in crowded(),
        budget in 1u64..4_000,
        changes in proptest::collection::vec(change(), 1..8),
    ) {
        let options = SolveOptions { max_improvement: budget, ..SolveOptions::default() };
        if let Err(e) = check_sequence(&spec, &options, &changes) {
            prop_assert!(false, "{spec:?} budget {budget}: {e}");
        }
    }
    /// With FleetQuotas on random namespaces, some binding and some not: greedy-only (every
    /// re-plan of the same frame incremental) and with the default options.
    #[test]
    fn replans_with_quotas_equal_full_solves(
        spec in fleets(),
        draws in quota_draws(),
        greedy in any::<bool>(),
        changes in proptest::collection::vec(quota_change(), 1..8),
    ) {
        let options = if greedy { SolveOptions { max_improvement: 0, ..SolveOptions::default() } } else { SolveOptions::default() };
        if let Err(e) = check_quotas(&spec, &draws, &options, &changes) {
            prop_assert!(false, "{spec:?} {draws:?} greedy {greedy}: {e}");
        }
    }

    /// The same on crowded fleets, where a quota's room is what many deployments compete for.
    #[test]
    fn crowded_replans_with_quotas_equal_full_solves(
        spec in crowded(),
        draws in quota_draws(),
        greedy in any::<bool>(),
        changes in proptest::collection::vec(quota_change(), 1..8),
    ) {
        let options = if greedy { SolveOptions { max_improvement: 0, ..SolveOptions::default() } } else { SolveOptions::default() };
        if let Err(e) = check_quotas(&spec, &draws, &options, &changes) {
            prop_assert!(false, "{spec:?} {draws:?} greedy {greedy}: {e}");
        }
    }
}

proptest! {
    // Small fleets: many cases in a second or two.
    #![proptest_config(ProptestConfig {
        cases: std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(600),
        ..ProptestConfig::default()
    })]

    /// On fleets where moves matter most (`matching`), with the default budget and with one
    /// small enough to run out.
    #[test]
    fn matching_replans_equal_full_solves(
        snap in matching(),
        budget in prop_oneof![Just(1_000_000u64), 1u64..400],
        changes in proptest::collection::vec(change(), 1..8),
    ) {
        let options = SolveOptions { max_improvement: budget, ..SolveOptions::default() };
        if let Err(e) = check_snapshot(snap, &options, &changes) {
            prop_assert!(false, "budget {budget}: {e}");
        }
    }
}

/// Every kind of deployment-side edit the properties generate reaches the re-plan: over fixed
/// seeds, on fleets that run their plan or nothing yet, each kind changes some plan, and each but a class edit
/// (another frame) is re-planned incrementally, equal to a full solve. An edit that never
/// changed a plan, or always solved whole, would leave the properties above without teeth for it.
#[test]
fn every_edit_kind_changes_plans_and_replans_incrementally() {
    let options = SolveOptions::default();
    type Edit = fn(usize) -> Change;
    let kinds: [(&str, Edit); 9] = [
        ("selectors", |k| Change::Selectors(k, k / 3, 1 + k % (SELECTORS.len() - 1))),
        ("tolerations", |k| Change::Tolerations(k, 1 + k % 4)),
        ("alternative added", |k| Change::Alternatives(k, AltEdit::Add { at: 0, class: k % 2 == 0, k })),
        ("alternative removed", |k| Change::Alternatives(k, AltEdit::Remove(0))),
        ("alternatives reordered", |k| Change::Alternatives(k, AltEdit::Move { at: 0, to: 1 + k })),
        ("min/max replicas", |k| Change::Limits(k, 0, Some((k % 2) as i32), Some(1))),
        ("capacity types", |k| Change::CapacityTypes(k, 1 + k % (CAPACITY_TYPES.len() - 1))),
        ("split", |k| Change::Split(k, true)),
        ("class", |k| Change::Class(k, ClassEdit::Architecture)),
    ];
    for (kind, edit) in kinds {
        let (mut changed, mut incremental) = (0, 0);
        for seed in 0..5u64 {
            let spec = GenSpec { clusters: 10, deployments: 24, seed };
            let base = generate(&spec);
            // Half the fleets run their plan (edits meet kept replicas), half run nothing yet.
            let mut snap = if seed % 2 == 0 { with_current(&base, &solve(&base, &options)) } else { base };
            let mut r = Replanner::new(&snap, options.clone());
            for k in 0..4 {
                let before = r.plan().clone();
                apply(&mut snap, &before, &edit(seed as usize * 7 + k));
                let got = json(r.replan(&snap));
                assert_eq!(got, json(&solve(&snap, &options)), "{kind}, seed {seed}, edit {k}");
                changed += usize::from(got != json(&before));
                incremental += usize::from(!r.stats().full);
            }
        }
        assert!(changed > 0, "{kind}: no edit changed a plan");
        if kind == "class" {
            assert_eq!(incremental, 0, "a class edit is another frame: solved whole");
        } else {
            assert!(incremental > 0, "{kind}: never re-planned incrementally");
        }
    }
}

/// The properties above have teeth: over fixed seeds, most re-plans are incremental and reuse
/// steps (a `Replanner` that always solved whole would pass them).
#[test]
fn replans_reuse_steps() {
    let options = SolveOptions { max_improvement: 0, ..SolveOptions::default() };
    let changes = [
        Change::Running,
        Change::Scale(3, 1),
        Change::Scale(7, -1),
        Change::CapacityLoss(5),
        Change::Stopped(2),
        Change::CapacityGain(5),
        Change::Running,
    ];
    let (mut incremental, mut reused) = (0, 0);
    for seed in 0..12u64 {
        let spec = GenSpec { clusters: 8 + seed as usize, deployments: 20 + seed as usize, seed };
        let (i, r) = check_sequence(&spec, &options, &changes).unwrap();
        incremental += i;
        reused += r;
    }
    assert_eq!(incremental, 12 * changes.len(), "every re-plan keeps the frame: none solves whole");
    assert!(reused > 12 * 20, "re-plans reuse steps: {reused}");
}

/// One deployment scaled on a fleet that runs its plan: the re-plan runs that deployment's
/// steps and the few its new replica touches, not the fleet's.
#[test]
fn one_changed_deployment_runs_few_steps() {
    let options = SolveOptions { max_improvement: 0, ..SolveOptions::default() };
    let base = generate(&GenSpec { clusters: 60, deployments: 300, seed: 5 });
    let running = with_current(&base, &solve(&base, &options));
    let mut r = Replanner::new(&running, options.clone());
    let total = r.stats().steps_run;
    let mut changed = running.clone();
    let i = changed.deployments.iter().position(|d| d.spec.replicas > 0).unwrap();
    changed.deployments[i].spec.replicas += 1;
    let got = json(r.replan(&changed));
    assert_eq!(got, json(&solve(&changed, &options)));
    let s = r.stats();
    assert!(!s.full);
    assert_eq!(s.steps_run + s.steps_reused, total, "every step is either run or reused");
    assert!(s.steps_run * 10 < total, "{} of {total} steps ran", s.steps_run);
    // And back: the same plan as before the change.
    let back = json(r.replan(&running));
    assert_eq!(back, json(&solve(&running, &options)));
}

/// The same with the improvement phase: on a fleet that leaves replicas unplaced, one changed
/// deployment re-runs few of the phase's attempts and reuses the rest (a re-plan that ran the
/// phase whole would pass the properties above too).
#[test]
fn one_changed_deployment_reruns_few_attempts_of_the_phase() {
    let options = SolveOptions::default();
    let base = generate(&GenSpec { clusters: 20, deployments: 300, seed: 5 });
    let running = with_current(&base, &solve(&base, &options));
    let mut r = Replanner::new(&running, options.clone());
    let total = r.stats().phase_run;
    assert!(total > 20, "the phase has work on this fleet: {total} attempts");
    let mut changed = running.clone();
    let i = changed.deployments.iter().position(|d| d.spec.replicas > 0).unwrap();
    changed.deployments[i].spec.replicas += 1;
    let got = json(r.replan(&changed));
    assert_eq!(got, json(&solve(&changed, &options)));
    let s = r.stats();
    assert!(!s.full);
    assert!(s.phase_reused > 0 && s.phase_run * 4 < s.phase_run + s.phase_reused, "{s:?}");
    let back = json(r.replan(&running));
    assert_eq!(back, json(&solve(&running, &options)));
}

/// One class, H100 nodes of 8 devices at $10/h.
fn h100_class() -> std::collections::BTreeMap<String, ClassView> {
    let spec: InferenceClassSpec = serde_json::from_value(json!({
        "device": {"driver": "gpu.nvidia.com", "attributes": {"productName": {"string": "h100"}}},
        "devicesPerNode": 8,
        "pricePerNodeHour": {"onDemand": "10.00"}
    }))
    .unwrap();
    [("h100".to_string(), ClassView { spec })].into_iter().collect()
}

/// `replicas` running on `cluster`'s H100 pool.
fn runs_on(cluster: &str, replicas: i32) -> ClusterPlacement {
    ClusterPlacement {
        cluster: cluster.into(),
        pool: "h100".into(),
        class: "h100".into(),
        capacity_type: CapacityType::OnDemand,
        fallback_rank: 1,
        desired: replicas,
        ready: replicas,
        serving: replicas,
        unschedulable: 0,
    }
}

/// Where deployment `name`'s replicas are in `plan`: (cluster, replicas).
fn placed_on(plan: &Plan, name: &str) -> Vec<(String, u32)> {
    let p = plan.deployments.iter().find(|p| p.name == name).unwrap();
    p.assignments.iter().map(|a| (a.cluster.clone(), a.replicas)).collect()
}

fn cluster(name: &str, nodes: u32) -> ClusterView {
    ClusterView {
        name: name.into(),
        labels: [("site".to_string(), name.to_string())].into_iter().collect(),
        region: format!("{name}-region"),
        jurisdiction: "EU".into(),
        ready: true,
        pools: vec![PoolView {
            name: "h100".into(),
            class: "h100".into(),
            capacity_type: Some(CapacityType::OnDemand),
            free_per_node: free_per_node(nodes, 8, 0),
            reserved_for: None,
            refused_block: None,
        }],
        ..Default::default()
    }
}

fn deployment(name: &str, priority: i32, replicas: i32, placement: serde_json::Value) -> DeploymentView {
    let mut placement = placement;
    placement["priority"] = json!(priority);
    let spec = json!({
        "model": {"name": name, "source": "hf://org/m"},
        "replicas": replicas,
        "engine": {"image": "vllm/vllm-openai:v0.11.0"},
        "topology": {"type": "TensorParallel", "devicesPerReplica": 8},
        "devices": {"alternatives": [{"class": "h100"}]},
        "placement": placement
    });
    DeploymentView {
        namespace: "ml".into(),
        name: name.into(),
        created: 0,
        spec: serde_json::from_value::<ModelDeploymentSpec>(spec).unwrap(),
        current: vec![],
        refused_pools: vec![],
    }
}

/// A keep step judges spread on the tier's view of the pools once the tier kept what it runs,
/// and may read no free devices of a pool it counts there. `spready` (spread by cluster, a
/// skew of one) runs both replicas in cluster `a`; while `high` (a higher tier, only on `b`) fills `b`,
/// no other domain can take a replica and both stay. Once `high` scales to zero, `b` is open:
/// the second replica in `a` would exceed the skew and moves to `b`. The re-plan must run
/// `spready`'s keep step again, though nothing it reads of the pools' free devices changed.
#[test]
fn a_domain_a_higher_tier_frees_reaches_a_keep_step_through_the_tiers_view() {
    let high = deployment("high", 100, 1, json!({"clusterSelector": {"matchLabels": {"site": "b"}}}));
    let mut spready = deployment("spready", 0, 2, json!({"spread": {"by": "cluster", "maxSkew": 1}}));
    spready.current = vec![runs_on("a", 2)];
    let before = FleetSnapshot {
        classes: h100_class(),
        clusters: vec![cluster("a", 2), cluster("b", 1)],
        deployments: vec![high, spready],
        quotas: Vec::new(),
    };
    let options = SolveOptions { max_improvement: 0, ..SolveOptions::default() };
    let where_spready = |plan: &Plan| placed_on(plan, "spready");
    let mut r = Replanner::new(&before, options.clone());
    assert_eq!(where_spready(r.plan()), vec![("a".to_string(), 2)]);
    let mut after = before.clone();
    after.deployments[0].spec.replicas = 0;
    let got = r.replan(&after).clone();
    assert!(!r.stats().full, "the frame is the same: a re-plan, not a solve");
    assert_eq!(json(&got), json(&solve(&after, &options)));
    assert_eq!(where_spready(&got), vec![("a".to_string(), 1), ("b".to_string(), 1)]);
}

/// The same through a deployment of the keep step's own tier: `other` (same priority as
/// `spready`, only on `b`) runs its replica on `b`, so the tier's view has no room there and
/// `spready` keeps both replicas in `a`. Once `other` stops, `b` is open in the view (the free
/// devices at the tier's start are the same: only what the tier keeps changed) and `spready`'s
/// second replica moves to `b`.
#[test]
fn a_domain_a_deployment_of_the_same_tier_frees_reaches_a_keep_step_through_the_tiers_view() {
    let mut other = deployment("other", 0, 1, json!({"clusterSelector": {"matchLabels": {"site": "b"}}}));
    other.current = vec![runs_on("b", 1)];
    let mut spready = deployment("spready", 0, 2, json!({"spread": {"by": "cluster", "maxSkew": 1}}));
    spready.current = vec![runs_on("a", 2)];
    let before = FleetSnapshot {
        classes: h100_class(),
        clusters: vec![cluster("a", 2), cluster("b", 1)],
        deployments: vec![other, spready],
        quotas: Vec::new(),
    };
    let options = SolveOptions { max_improvement: 0, ..SolveOptions::default() };
    let where_spready = |plan: &Plan| placed_on(plan, "spready");
    let mut r = Replanner::new(&before, options.clone());
    assert_eq!(where_spready(r.plan()), vec![("a".to_string(), 2)]);
    let mut after = before.clone();
    after.deployments[0].spec.replicas = 0;
    after.deployments[0].current.clear();
    let got = r.replan(&after).clone();
    assert!(!r.stats().full, "the frame is the same: a re-plan, not a solve");
    assert_eq!(json(&got), json(&solve(&after, &options)));
    assert_eq!(where_spready(&got), vec![("a".to_string(), 1), ("b".to_string(), 1)]);
    // And back: `other` runs on `b` again, which closes `b` in the view.
    let back = r.replan(&before).clone();
    assert!(!r.stats().full);
    assert_eq!(json(&back), json(&solve(&before, &options)));
    assert_eq!(where_spready(&back), vec![("a".to_string(), 2)]);
}

/// A fleet whose trace outgrows its limit is solved whole, untraced, from then on: the same
/// plans, and no memory held for re-plans (the controller's bound on a huge fleet).
#[test]
fn a_fleet_whose_trace_outgrows_its_limit_is_solved_whole() {
    let options = SolveOptions { max_improvement: 0, ..SolveOptions::default() };
    let snap = generate(&GenSpec { clusters: 10, deployments: 30, seed: 3 });
    let mut next = with_current(&snap, &solve(&snap, &options));
    next.deployments[0].spec.replicas += 1;
    let mut small = Replanner::with_limit(&snap, options.clone(), 10);
    assert_eq!(json(small.plan()), json(&solve(&snap, &options)));
    assert_eq!(json(small.replan(&next)), json(&solve(&next, &options)));
    assert!(small.stats().full);
    assert_eq!(small.stats().steps_run, 0, "solved whole without a trace: {:?}", small.stats());
    let mut ample = Replanner::with_limit(&snap, options.clone(), u64::MAX);
    assert_eq!(json(ample.replan(&next)), json(&solve(&next, &options)));
    assert!(!ample.stats().full);
}

/// With the improvement phase on (the default), a fleet that leaves replicas unplaced is still
/// re-planned incrementally: the greedy pass reuses its steps and the phase runs on its result,
/// giving `solve`'s plan.
#[test]
fn a_short_fleet_replans_incrementally_with_the_improvement_phase() {
    let options = SolveOptions::default();
    let (mut short, mut incremental) = (0, 0);
    for seed in 0..12u64 {
        let snap = generate(&GenSpec { clusters: 8 + seed as usize, deployments: 25, seed });
        let mut r = Replanner::new(&snap, options.clone());
        let mut next = with_current(&snap, r.plan());
        next.deployments[1].spec.replicas += 1;
        let got = json(r.replan(&next));
        assert_eq!(got, json(&solve(&next, &options)), "seed {seed}");
        if r.plan().deployments.iter().any(|p| p.unplaced > 0) {
            short += 1;
            incremental += usize::from(!r.stats().full);
        }
    }
    assert!(short >= 3, "the generated fleets leave replicas unplaced: {short}");
    assert_eq!(incremental, short, "every short fleet re-planned incrementally");
}

/// A quota's room is an input of the steps that read it. `first` and `second` (namespace `ml`,
/// one TP8 replica each, `first` solved first, on different clusters) under a quota of 16
/// devices: both placed. Once
/// `first` scales to 2, `second`'s room is gone and it is refused (`QuotaExceeded`), though
/// nothing of `second` nor of any pool it reads changed; once `first` scales back, `second` is
/// placed again. `other`, in a namespace without a quota and on a cluster of its own, is reused
/// throughout.
#[test]
fn a_changed_charge_reaches_the_later_steps_of_the_namespace() {
    // Apart (`first` on `a`, `second` on `b`): the quota is all that links them.
    let on = |site: &str| json!({"clusterSelector": {"matchLabels": {"site": site}}});
    let mut first = deployment("first", 0, 1, on("a"));
    first.created = 1;
    let mut second = deployment("second", 0, 1, on("b"));
    second.created = 2;
    let mut other = deployment("other", 0, 1, on("c"));
    other.namespace = "search".into();
    other.created = 3;
    let quota = QuotaView {
        namespace: "ml".into(),
        name: "gpus".into(),
        spec: serde_json::from_value(json!({"devices": [{"max": 16}]})).unwrap(),
    };
    let before = FleetSnapshot {
        classes: h100_class(),
        clusters: vec![cluster("a", 4), cluster("b", 4), cluster("c", 1)],
        deployments: vec![first, second, other],
        quotas: vec![quota],
    };
    for options in [SolveOptions { max_improvement: 0, ..SolveOptions::default() }, SolveOptions::default()] {
        let mut r = Replanner::new(&before, options.clone());
        assert_eq!(json(r.plan()), json(&solve(&before, &options)));
        assert_eq!(placed_on(r.plan(), "second").len(), 1);
        let mut after = before.clone();
        after.deployments[0].spec.replicas = 2;
        let got = r.replan(&after).clone();
        assert!(!r.stats().full, "quotas unchanged: a re-plan, not a solve");
        assert_eq!(json(&got), json(&solve(&after, &options)));
        assert!(placed_on(&got, "second").is_empty(), "the quota is used up by `first`");
        assert!(r.stats().steps_reused > 0, "`other` is reused: {:?}", r.stats());
        let back = r.replan(&before).clone();
        assert!(!r.stats().full);
        assert_eq!(json(&back), json(&solve(&before, &options)));
        assert_eq!(placed_on(&back, "second").len(), 1);
    }
}

/// With quotas that do not bind, one changed deployment runs few steps, as without quotas: a
/// later step of its namespace reads another usage, but every check it made still passes.
/// With a binding quota on the changed deployment's namespace, the re-plan is still
/// incremental and equal to `solve`.
#[test]
fn one_changed_deployment_with_quotas_runs_few_steps() {
    let options = SolveOptions { max_improvement: 0, ..SolveOptions::default() };
    let base = generate(&GenSpec { clusters: 60, deployments: 300, seed: 5 });
    for pct in [10_000, 60] {
        let draws: Vec<QuotaDraw> =
            (0..NAMESPACES.len()).map(|ns| QuotaDraw { ns, limits: Limits::Both, pct }).collect();
        let limited = with_quotas(base.clone(), &draws);
        let running = with_current(&limited, &solve(&limited, &options));
        let mut r = Replanner::new(&running, options.clone());
        let total = r.stats().steps_run;
        let mut changed = running.clone();
        let i = changed.deployments.iter().position(|d| d.spec.replicas > 0).unwrap();
        changed.deployments[i].spec.replicas += 1;
        let got = json(r.replan(&changed));
        assert_eq!(got, json(&solve(&changed, &options)), "pct {pct}");
        let s = r.stats();
        assert!(!s.full, "pct {pct}");
        assert_eq!(s.steps_run + s.steps_reused, total, "every step is either run or reused");
        if pct > 100 {
            assert!(s.steps_run * 10 < total, "{} of {total} steps ran", s.steps_run);
        }
        let back = json(r.replan(&running));
        assert_eq!(back, json(&solve(&running, &options)), "pct {pct}");
    }
}

/// The quota properties have teeth: over fixed seeds, re-plans with binding quotas are
/// incremental and some change a plan a quota refused replicas in.
#[test]
fn replans_with_binding_quotas_are_incremental() {
    let options = SolveOptions { max_improvement: 0, ..SolveOptions::default() };
    let changes = [Change::Running, Change::Scale(3, 2), Change::Scale(7, -1), Change::Stopped(2), Change::Running];
    let (mut incremental, mut refused) = (0, 0);
    for seed in 0..8u64 {
        let spec = GenSpec { clusters: 8 + seed as usize, deployments: 30, seed };
        let draws: Vec<QuotaDraw> =
            (0..NAMESPACES.len()).map(|ns| QuotaDraw { ns, limits: Limits::Devices, pct: 50 }).collect();
        let snap = with_quotas(generate(&spec), &draws);
        refused += usize::from(solve(&snap, &options).quotas.iter().any(|q| q.unplaced > 0));
        let (i, _) = check_snapshot(snap, &options, &changes).unwrap();
        incremental += i;
    }
    assert_eq!(incremental, 8 * changes.len(), "quotas unchanged: no re-plan solves whole");
    assert!(refused >= 4, "the quotas bind: {refused}");
}
