//! A deterministic fleet generator for benchmarks and property tests: from a size and a seed
//! to typed fleet objects (classes, clusters with declared and observed pools, deployments),
//! and from those to a [`FleetSnapshot`] through [`FleetSnapshot::from_objects`], exactly as
//! `fleetctl plan` builds it from YAML. Pure: a small SplitMix64 stream, no I/O, no clock.
//! Each cluster and each deployment draws from its own stream, so a fleet with more
//! deployments keeps the same clusters, and deployment `i` is the same in every size.

use std::collections::BTreeMap;

use flotilla_apis::cluster::{
    AwsCluster, ClusterCredentials, ClusterProvider, NodePool, PoolStatus, SimCluster, StaticCluster,
};
use flotilla_apis::common::{
    ClusterTaint, ClusterToleration, Conditions, DeviceAttribute, DeviceSpec, JurisdictionCode, PricePerCapacityType,
    SecretRef, Sovereignty, TaintEffect, TolerationOperator,
};
use flotilla_apis::deployment::{
    CelExpression, DeviceAlternative, DeviceRequest, Engine, ModelSource, PlacementPolicy, RoleName, SplitStrategy,
    Spread, SpreadDomain, Topology, TopologyRole, TopologyType,
};
use flotilla_apis::{
    CapacityType, FleetObject, InferenceClass, InferenceClassSpec, InferenceCluster, InferenceClusterSpec,
    InferenceClusterStatus, ModelDeployment, ModelDeploymentSpec,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, LabelSelectorRequirement, Time};

use crate::plan::Plan;
use crate::snapshot::FleetSnapshot;

/// What to generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GenSpec {
    /// Member clusters.
    pub clusters: usize,
    /// ModelDeployments.
    pub deployments: usize,
    /// Seed: the same spec always gives the same fleet.
    pub seed: u64,
}

/// The fleet's objects: classes, then clusters, then deployments.
pub fn generate_objects(spec: &GenSpec) -> Vec<FleetObject> {
    objects_of(spec, cluster, deployment)
}

/// Draws cluster `i` (or deployment `i`) of a seed from the classes the seed has.
pub(crate) type Draw<T> = fn(u64, usize, &[&'static str]) -> T;

/// The classes of `spec`'s seed, then its clusters and deployments drawn by `cluster` and
/// `deployment`.
pub(crate) fn objects_of(
    spec: &GenSpec,
    cluster: Draw<InferenceCluster>,
    deployment: Draw<ModelDeployment>,
) -> Vec<FleetObject> {
    let classes = classes(spec.seed);
    let names: Vec<&'static str> = classes.iter().map(|c| c.0).collect();
    let mut out: Vec<FleetObject> = classes.into_iter().map(|(_, c)| FleetObject::Class(c)).collect();
    out.extend((0..spec.clusters).map(|i| FleetObject::Cluster(cluster(spec.seed, i, &names))));
    out.extend((0..spec.deployments).map(|i| FleetObject::Deployment(deployment(spec.seed, i, &names))));
    out
}

/// The fleet's snapshot, as the solver sees it.
pub fn generate(spec: &GenSpec) -> FleetSnapshot {
    FleetSnapshot::from_objects(&generate_objects(spec))
}

/// A copy of `snapshot` whose deployments currently run where `plan` put them (for re-plans).
pub fn with_current(snapshot: &FleetSnapshot, plan: &Plan) -> FleetSnapshot {
    let mut next = snapshot.clone();
    let by_name: BTreeMap<(&str, &str), &crate::plan::DeploymentPlan> =
        plan.deployments.iter().map(|d| ((d.namespace.as_str(), d.name.as_str()), d)).collect();
    for d in &mut next.deployments {
        let Some(p) = by_name.get(&(d.namespace.as_str(), d.name.as_str())) else { continue };
        d.current = p.assignments.iter().map(|a| a.to_placement(a.replicas as i32)).collect();
    }
    next
}

/// SplitMix64: tiny, fast, and good enough to draw fleets from.
#[derive(Clone, Debug)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn stream(seed: u64, stream: u64, index: u64) -> Self {
        let mut r = Rng(seed ^ stream.wrapping_mul(0xA076_1D64_78BD_642F));
        r.0 ^= r.next().wrapping_add(index.wrapping_mul(0xE703_7ED1_A0B4_28DB));
        r
    }
    pub(crate) fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..=hi`.
    pub(crate) fn range(&mut self, lo: u32, hi: u32) -> u32 {
        lo + (self.next() % u64::from(hi - lo + 1)) as u32
    }
    /// True with `percent` % probability.
    pub(crate) fn chance(&mut self, percent: u32) -> bool {
        self.next() % 100 < u64::from(percent)
    }
    pub(crate) fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[(self.next() % items.len() as u64) as usize]
    }
}

const H200: &str = "h200-141g";
const H100: &str = "h100-sxm-80g";
const A100: &str = "a100-sxm-80g";
const L40S: &str = "l40s-48g";
const L4: &str = "l4-24g";
const MI300X: &str = "mi300x-192g";

const NV: &str = "gpu.nvidia.com";
const AMD_DRIVER: &str = "gpu.amd.com";

/// name, driver, product, architecture, compute capability (gfx version on AMD), memory
/// bandwidth GB/s, memory, NVLink, devices per node, $/node-hour reserved / on-demand / spot.
pub(crate) type ClassRow = (Str, Str, Str, Str, Str, i64, Str, bool, u32, [Str; 3]);
pub(crate) type Str = &'static str;
pub(crate) const CLASSES: [ClassRow; 6] = [
    (H200, NV, "NVIDIA H200", "Hopper", "9.0.0", 4800, "141Gi", true, 8, ["60.50", "84.80", "38.00"]),
    (H100, NV, "NVIDIA H100 80GB HBM3", "Hopper", "9.0.0", 3350, "80Gi", true, 8, ["62.00", "98.32", "39.00"]),
    (A100, NV, "NVIDIA A100-SXM4-80GB", "Ampere", "8.0.0", 2039, "80Gi", true, 8, ["27.00", "40.97", "15.10"]),
    (L40S, NV, "NVIDIA L40S", "Ada Lovelace", "8.9.0", 864, "48Gi", false, 4, ["6.60", "10.49", "4.20"]),
    (L4, NV, "NVIDIA L4", "Ada Lovelace", "8.9.0", 300, "24Gi", false, 4, ["3.10", "4.60", "1.90"]),
    (MI300X, AMD_DRIVER, "AMD Instinct MI300X", "CDNA3", "9.4.2", 5300, "192Gi", false, 8, ["48.00", "70.00", ""]),
];

/// Four classes always, plus L4 and MI300X on some seeds.
fn classes(seed: u64) -> Vec<(&'static str, InferenceClass)> {
    let mut rng = Rng::stream(seed, 1, 0);
    let (with_l4, with_mi300x) = (rng.chance(70), rng.chance(50));
    CLASSES
        .iter()
        .filter(|(name, ..)| (*name != L4 || with_l4) && (*name != MI300X || with_mi300x))
        .map(|&(name, driver, product, arch, cc, bw, mem, nvlink, per_node, [reserved, on_demand, spot])| {
            let attr = DeviceAttribute::default;
            let mut attributes = BTreeMap::from([
                ("productName".to_string(), DeviceAttribute { string: Some(product.into()), ..attr() }),
                ("architecture".to_string(), DeviceAttribute { string: Some(arch.into()), ..attr() }),
                ("memoryBandwidthGBps".to_string(), DeviceAttribute { int: Some(bw), ..attr() }),
            ]);
            let version = DeviceAttribute { version: Some(cc.into()), ..attr() };
            if driver == NV {
                attributes.insert("computeCapability".into(), version);
                attributes.insert("nvlink".into(), DeviceAttribute { bool: Some(nvlink), ..attr() });
            } else {
                attributes.insert("gfxVersion".into(), version);
            }
            let price = |p: &str| (!p.is_empty()).then(|| p.to_string());
            let spec = InferenceClassSpec {
                device: DeviceSpec {
                    driver: driver.into(),
                    attributes,
                    capacity: BTreeMap::from([("memory".to_string(), Quantity(mem.into()))]),
                },
                devices_per_node: per_node,
                provisioning: Default::default(),
                price_per_node_hour: PricePerCapacityType {
                    reserved: price(reserved),
                    on_demand: price(on_demand),
                    spot: price(spot),
                },
            };
            (name, InferenceClass::new(name, spec))
        })
        .collect()
}

/// (jurisdiction, region, country, zones)
const REGIONS: [(&str, &str, &str, u32); 14] = [
    ("EU", "eu-central-1", "DE", 3),
    ("EU", "eu-west-1", "IE", 3),
    ("EU", "eu-west-3", "FR", 3),
    ("EU", "eu-north-1", "SE", 3),
    ("EU", "eu-south-1", "IT", 3),
    ("UK", "eu-west-2", "GB", 3),
    ("US", "us-east-1", "US", 6),
    ("US", "us-east-2", "US", 3),
    ("US", "us-west-2", "US", 4),
    ("US", "us-west-1", "US", 2),
    ("APAC", "ap-northeast-1", "JP", 3),
    ("APAC", "ap-southeast-1", "SG", 3),
    ("APAC", "ap-southeast-2", "AU", 3),
    ("APAC", "ap-south-1", "IN", 3),
];

fn cluster(seed: u64, index: usize, classes: &[&'static str]) -> InferenceCluster {
    let mut rng = Rng::stream(seed, 2, index as u64);
    let &(jurisdiction, region, country, zone_count) = rng.pick(&REGIONS);
    let name = format!("c{index:04}-{region}");
    let zones: Vec<String> = {
        let first = rng.range(0, zone_count - 1);
        let n = rng.range(1, zone_count.min(3));
        (0..n).map(|k| format!("{region}{}", (b'a' + ((first + k) % zone_count) as u8) as char)).collect()
    };
    let mut provider = ClusterProvider { aws: None, static_: None, sim: None };
    match rng.range(0, 9) {
        0 => provider.static_ = Some(StaticCluster { site: Some(format!("colo-{region}")) }),
        1 => provider.sim = Some(SimCluster { cloud: "simcloud".into() }),
        _ => {
            let eks_cluster = format!("inference-{index}");
            provider.aws = Some(AwsCluster { eks_cluster, region: region.into(), role_arn: None });
        }
    }
    let size = rng.range(0, 9); // 0-4 small, 5-8 medium, 9 large
    let (pool_lo, pool_hi, node_scale) = match size {
        0..=4 => (1, 2, 1),
        5..=8 => (2, 3, 2),
        _ => (3, 4, 4),
    };
    let mut pools: Vec<NodePool> = Vec::new();
    for _ in 0..rng.range(pool_lo, pool_hi) {
        let class = match rng.range(0, 99) {
            0..=14 => H200,
            15..=44 => H100,
            45..=64 => A100,
            65..=84 => L40S,
            85..=94 => L4,
            _ => MI300X,
        };
        let class = if classes.contains(&class) { class } else { H100 };
        let caps: &[CapacityType] = match rng.range(0, 5) {
            0 => &[CapacityType::Reserved],
            1 | 2 => &[CapacityType::Reserved, CapacityType::OnDemand],
            3 => &[CapacityType::OnDemand],
            4 => &[CapacityType::Spot, CapacityType::OnDemand],
            _ => &[CapacityType::Spot],
        };
        let short = class.split('-').next().unwrap_or(class);
        let pool_name = match caps[0] {
            CapacityType::Spot => format!("{short}-spot"),
            _ => short.to_string(),
        };
        if pools.iter().any(|p| p.name == pool_name) {
            continue;
        }
        let base = if class == H200 { rng.range(1, 3) } else { rng.range(1, 8) };
        let nodes = (base * node_scale) as i32;
        let reservations = caps.contains(&CapacityType::Reserved) && provider.aws.is_some();
        pools.push(NodePool {
            name: pool_name,
            class: class.into(),
            min_nodes: 0,
            max_nodes: nodes * 2,
            nodes: Some(nodes),
            capacity_types: caps.to_vec(),
            reservation_ids: if reservations { vec![format!("cr-{:017x}", rng.next() >> 4)] } else { vec![] },
        });
    }
    let mut taints = Vec::new();
    match rng.range(0, 99) {
        0..=9 => taints.push(taint("dedicated", Some("research"), TaintEffect::NoSchedule)),
        10..=12 => taints.push(taint("maintenance", None, TaintEffect::NoExecute)),
        13..=18 => taints.push(taint("flotilla.dev/cost", Some("high"), TaintEffect::PreferNoSchedule)),
        _ => {}
    }
    let env = match rng.range(0, 9) {
        0..=5 => "prod",
        6..=7 => "staging",
        _ => "dev",
    };
    let tier = *rng.pick(&["premium", "standard", "standard", "batch"]);
    let mut labels = BTreeMap::from([("flotilla.dev/env".to_string(), env.to_string()), ("tier".into(), tier.into())]);
    if rng.chance(20) {
        labels.insert("gpu-sharing".into(), "enabled".into());
    }
    let cordoned = rng.chance(3);
    let status = match rng.range(0, 99) {
        0..=5 => Some(cluster_status(false, &pools, &mut rng)),
        6..=45 => Some(cluster_status(true, &pools, &mut rng)),
        _ => None,
    };
    let spec = InferenceClusterSpec {
        provider,
        region: region.into(),
        zones,
        jurisdiction: JurisdictionCode(jurisdiction.into()),
        country: Some(country.into()),
        credentials: Some(ClusterCredentials {
            secret_ref: SecretRef {
                namespace: Some("flotilla-system".into()),
                name: format!("{name}-kubeconfig"),
                key: None,
            },
        }),
        cluster_profile_ref: None,
        endpoint: Some(format!("https://inference.{name}.example.com")),
        pools,
        taints,
        cordoned,
        cache_storage_class_name: None,
        deletion_policy: None,
        endpoint_auth: None,
        gateway_ref: None,
    };
    let mut c = InferenceCluster::new(&name, spec);
    c.metadata.labels = Some(labels);
    c.status = status;
    c
}

fn taint(key: &str, value: Option<&str>, effect: TaintEffect) -> ClusterTaint {
    ClusterTaint { key: key.into(), value: value.map(Into::into), effect }
}

/// Observed status: Ready with some devices already allocated, or not Ready.
pub(crate) fn cluster_status(ready: bool, pools: &[NodePool], rng: &mut Rng) -> InferenceClusterStatus {
    let time = Time(k8s_openapi::jiff::Timestamp::from_second(1_767_225_600).unwrap_or_default());
    let (status, reason, message) = if ready {
        ("True", "AsExpected", "member API server reachable; capacity observed")
    } else {
        ("False", "Unreachable", "member API server did not answer within 10s")
    };
    let condition = Condition {
        type_: "Ready".into(),
        status: status.into(),
        reason: reason.into(),
        message: message.into(),
        last_transition_time: time,
        observed_generation: Some(1),
    };
    let observed: Vec<PoolStatus> = pools
        .iter()
        .filter(|_| ready)
        .map(|p| {
            let per_node = CLASSES.iter().find(|row| row.0 == p.class).map_or(8, |row| row.8);
            let nodes = (p.nodes.unwrap_or(0) - i32::from(rng.chance(20))).max(0);
            let total = i64::from(nodes) * i64::from(per_node);
            let allocated = (total * i64::from(rng.range(0, 60))) / 100;
            PoolStatus {
                name: p.name.clone(),
                class: p.class.clone(),
                nodes,
                devices_total: total,
                devices_allocated: allocated,
                devices_free: total - allocated,
                devices_managed: 0,
                node_devices: Vec::new(),
                reserved: Vec::new(),
            }
        })
        .collect();
    InferenceClusterStatus {
        observed_generation: Some(1),
        conditions: Conditions(vec![condition]),
        pools: observed,
        ..Default::default()
    }
}

const HOPPER: &str = r#"device.attributes["gpu.nvidia.com"].architecture == "Hopper""#;
const MEM_80: &str = r#"device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("80Gi")) >= 0"#;
const MEM_40: &str = r#"device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0"#;
const MEM_24: &str = r#"device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("24Gi")) >= 0"#;
const CC_89: &str = r#"device.attributes["gpu.nvidia.com"].computeCapability.compareTo(semver("8.9.0")) >= 0"#;
const CC_80: &str = r#"device.attributes["gpu.nvidia.com"].computeCapability.compareTo(semver("8.0.0")) >= 0"#;
const NVLINK: &str = r#"device.attributes["gpu.nvidia.com"].nvlink"#;
const BW_3000: &str = r#"device.attributes["gpu.nvidia.com"].memoryBandwidthGBps >= 3000"#;
const AMD: &str = r#"device.driver == "gpu.amd.com""#;
const AMD_192: &str = r#"device.capacity["gpu.amd.com"].memory.compareTo(quantity("192Gi")) >= 0"#;
const NVIDIA_H: &str = r#"device.attributes["gpu.nvidia.com"].productName.startsWith("NVIDIA H")"#;
const HOPPER_OR_AMPERE: &str = r#"device.attributes["gpu.nvidia.com"].architecture in ["Hopper", "Ampere"]"#;

pub(crate) fn alt(class: Option<&str>, selectors: &[&str]) -> DeviceAlternative {
    DeviceAlternative {
        class: class.map(Into::into),
        selectors: selectors.iter().map(|s| CelExpression((*s).into())).collect(),
        min_replicas: None,
        max_replicas: None,
    }
}

/// An alternative with `minReplicas` / `maxReplicas`.
fn limits(mut a: DeviceAlternative, min: Option<i32>, max: Option<i32>) -> DeviceAlternative {
    (a.min_replicas, a.max_replicas) = (min, max);
    a
}

pub(crate) fn topology(type_: TopologyType, devices: u32, nodes: Option<u32>, roles: Vec<TopologyRole>) -> Topology {
    Topology { type_, devices_per_replica: devices, nodes_per_replica: nodes, roles }
}

type Model = (&'static str, &'static str, Topology, Vec<DeviceAlternative>, (u32, u32), u64);

/// A model: (name, Hugging Face repo, topology, alternatives, replica range, typical $/device-hour).
fn model(rng: &mut Rng, classes: &[&str]) -> Model {
    let has = |c: &str| classes.contains(&c);
    let small = if has(L4) { L4 } else { L40S };
    let one = topology(TopologyType::Standalone, 1, None, vec![]);
    let tp = |n| topology(TopologyType::TensorParallel, n, None, vec![]);
    match rng.range(0, 9) {
        0 => {
            let alts = vec![alt(Some(small), &[]), limits(alt(None, &[MEM_40]), None, Some(4))];
            ("llama-3.1-8b-instruct", "meta-llama/Llama-3.1-8B-Instruct", one, alts, (1, 16), 2)
        }
        1 => (
            "mistral-7b-instruct",
            "mistralai/Mistral-7B-Instruct-v0.3",
            one,
            vec![alt(None, &[MEM_24, CC_89])],
            (1, 12),
            2,
        ),
        2 => {
            let first = limits(alt(Some(H200), &[]), Some(rng.range(0, 2) as i32), None);
            let alts = vec![first, alt(None, &[HOPPER, MEM_80]), limits(alt(Some(A100), &[CC_80]), None, Some(4))];
            ("gpt-oss-120b", "openai/gpt-oss-120b", one, alts, (2, 12), 10)
        }
        3 => {
            let alts = vec![alt(Some(H200), &[]), alt(None, &[MEM_80])];
            ("llama-3.3-70b-instruct", "meta-llama/Llama-3.3-70B-Instruct", tp(4), alts, (1, 8), 10)
        }
        4 => {
            let mut alts = vec![alt(Some(H200), &[]), alt(Some(H100), &[])];
            alts.extend(has(MI300X).then(|| alt(Some(MI300X), &[AMD_192])));
            ("llama-3.1-405b-instruct", "meta-llama/Llama-3.1-405B-Instruct-FP8", tp(8), alts, (1, 3), 10)
        }
        5 => {
            let mut alts = vec![alt(None, &[HOPPER, NVLINK])];
            alts.extend(has(MI300X).then(|| alt(None, &[AMD])));
            let t = topology(TopologyType::MultiNode, 8, Some(2), vec![]);
            ("deepseek-v3", "deepseek-ai/DeepSeek-V3", t, alts, (1, 2), 10)
        }
        6 => {
            let n = if rng.chance(50) { 4 } else { 2 };
            let roles = vec![
                TopologyRole { name: RoleName::Prefill, pods: 1, devices_per_pod: n },
                TopologyRole { name: RoleName::Decode, pods: 2, devices_per_pod: n },
            ];
            let t = topology(TopologyType::Disaggregated, 4, None, roles);
            let alts = vec![alt(None, &[HOPPER, NVLINK])];
            ("qwen3-235b-a22b-instruct", "Qwen/Qwen3-235B-A22B-Instruct-2507-FP8", t, alts, (1, 3), 10)
        }
        7 => {
            let alts = vec![alt(Some(small), &[]), alt(Some(L40S), &[MEM_24]), alt(None, &[CC_80])];
            ("bge-m3", "BAAI/bge-m3", one, alts, (1, 8), 2)
        }
        8 => {
            let any = alt(None, &[HOPPER_OR_AMPERE]);
            let alts = vec![alt(None, &[NVIDIA_H]), alt(None, &[HOPPER_OR_AMPERE, BW_3000]), any];
            ("mixtral-8x22b-instruct", "mistralai/Mixtral-8x22B-Instruct-v0.1", tp(2), alts, (1, 6), 8)
        }
        _ => {
            let alts = vec![alt(None, &[MEM_80]), alt(None, &[MEM_40])];
            ("qwen2.5-coder-32b-instruct", "Qwen/Qwen2.5-Coder-32B-Instruct", tp(2), alts, (1, 10), 6)
        }
    }
}

fn deployment(seed: u64, index: usize, classes: &[&'static str]) -> ModelDeployment {
    let mut rng = Rng::stream(seed, 3, index as u64);
    let (model_name, repo, topology, alternatives, (lo, hi), dollars_per_device) = model(&mut rng, classes);
    let replicas = if rng.chance(3) { 0 } else { rng.range(lo, hi) };
    let mut alternatives = alternatives;
    let mut min_left = replicas as i32;
    for a in &mut alternatives {
        if let Some(m) = &mut a.min_replicas {
            *m = (*m).min(min_left);
            min_left -= *m;
        }
    }
    let cluster_selector = match rng.range(0, 9) {
        0..=2 => Some(selector(&[("flotilla.dev/env", "prod")], &[])),
        3 => Some(selector(&[("tier", "premium")], &[("flotilla.dev/env", "In", &["prod", "staging"])])),
        4 => Some(selector(&[], &[("tier", "NotIn", &["batch"]), ("flotilla.dev/env", "NotIn", &["dev"])])),
        5 => Some(selector(&[], &[("gpu-sharing", "Exists", &[])])),
        6 => Some(selector(&[], &[("flotilla.dev/country", "In", &["DE", "FR", "IE", "US"])])),
        _ => None,
    };
    let sovereignty = match rng.range(0, 9) {
        0 | 1 => Some(sov_policy(&["EU"], &[], &[])),
        2 => Some(sov_policy(&["US"], &[], &[])),
        3 => Some(sov_policy(&["EU", "UK"], &[], &[])),
        4 => Some(sov_policy(&[], &["eu-central-1", "eu-west-1", "eu-west-3"], &[])),
        5 => Some(sov_policy(&["US"], &[], &["us-west-2"])),
        6 => Some(sov_policy(&[], &[], &["ap-south-1", "us-east-1"])),
        _ => None,
    };
    let mut p = PlacementPolicy { cluster_selector, sovereignty, ..Default::default() };
    if rng.chance(50) {
        let by = *rng.pick(&[SpreadDomain::Region, SpreadDomain::Zone, SpreadDomain::Cluster]);
        p.spread = Some(Spread { by, max_skew: rng.range(1, 3) as i32 });
    }
    if rng.chance(15) {
        p.split = Some(SplitStrategy::Proportional);
    }
    p.capacity_types = match rng.range(0, 5) {
        0 | 1 => vec![],
        2 => vec![CapacityType::Reserved, CapacityType::OnDemand],
        3 => vec![CapacityType::Spot, CapacityType::OnDemand],
        4 => vec![CapacityType::Reserved, CapacityType::Spot, CapacityType::OnDemand],
        _ => vec![CapacityType::OnDemand],
    };
    if rng.chance(40) {
        // A ceiling between 40% and 150% of an on-demand estimate: some bind, most do not.
        let devices = u64::from(topology.devices_per_replica_total()) * u64::from(replicas.max(1));
        let cents = devices * dollars_per_device * 100 * u64::from(rng.range(40, 150)) / 100;
        p.max_cost_per_hour = Some(format!("{}.{:02}", cents / 100, cents % 100));
    }
    p.priority = match rng.range(0, 9) {
        0 => Some(500),
        1 => Some(100),
        2 => Some(-100),
        _ => None,
    };
    let (equal, exists) = (Some(TolerationOperator::Equal), Some(TolerationOperator::Exists));
    p.tolerations = match rng.range(0, 9) {
        0 | 1 => vec![toleration(Some("dedicated"), equal, Some("research"), Some(TaintEffect::NoSchedule))],
        2 => vec![toleration(Some("maintenance"), exists, None, None)],
        3 => vec![toleration(None, exists, None, None)],
        _ => vec![],
    };
    let namespace = *rng.pick(&["ml", "search", "assistants", "research"]);
    let short = model_name.split('-').take(3).collect::<Vec<_>>().join("-").replace('.', "-");
    let model =
        ModelSource { name: model_name.into(), aliases: vec![], source: format!("hf://{repo}"), cache_ref: None };
    model_deployment((namespace, &format!("{short}-{index:05}")), model, replicas, topology, alternatives, p)
}

/// A ModelDeployment `namespace/name` served by vLLM, with everything the generators draw.
pub(crate) fn model_deployment(
    (namespace, name): (&str, &str),
    model: ModelSource,
    replicas: u32,
    topology: Topology,
    alternatives: Vec<DeviceAlternative>,
    placement: PlacementPolicy,
) -> ModelDeployment {
    let spec = ModelDeploymentSpec {
        model,
        replicas: replicas as i32,
        engine: Engine {
            image: "vllm/vllm-openai:v0.11.0".into(),
            args: vec![],
            env: vec![],
            port: Some(8000),
            max_loaded_adapters: None,
        },
        topology,
        devices: DeviceRequest { alternatives },
        placement,
        routing: None,
        disruption_budget: None,
        autoscaling: None,
        adapters: Vec::new(),
    };
    let mut d = ModelDeployment::new(name, spec);
    d.metadata.namespace = Some(namespace.into());
    d
}

fn strings(items: &[&str]) -> Vec<String> {
    items.iter().map(|v| (*v).to_string()).collect()
}

fn selector(labels: &[(&str, &str)], exprs: &[(&str, &str, &[&str])]) -> LabelSelector {
    let requirement = |&(key, op, values): &(&str, &str, &[&str])| LabelSelectorRequirement {
        key: key.into(),
        operator: op.into(),
        values: (!values.is_empty()).then(|| strings(values)),
    };
    LabelSelector {
        match_labels: (!labels.is_empty())
            .then(|| labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
        match_expressions: (!exprs.is_empty()).then(|| exprs.iter().map(requirement).collect()),
    }
}

pub(crate) fn sov_policy(jurisdictions: &[&str], allowed: &[&str], denied: &[&str]) -> Sovereignty {
    Sovereignty {
        allowed_jurisdictions: jurisdictions.iter().map(|c| JurisdictionCode((*c).into())).collect(),
        allowed_regions: strings(allowed),
        denied_regions: strings(denied),
    }
}

fn toleration(
    key: Option<&str>,
    operator: Option<TolerationOperator>,
    value: Option<&str>,
    effect: Option<TaintEffect>,
) -> ClusterToleration {
    ClusterToleration { key: key.map(Into::into), operator, value: value.map(Into::into), effect }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_fleet_and_sizes_share_a_prefix() {
        let fleet = |clusters, deployments, seed| format!("{:?}", generate(&GenSpec { clusters, deployments, seed }));
        assert_eq!(fleet(12, 30, 7), fleet(12, 30, 7));
        assert_ne!(fleet(12, 30, 7), fleet(12, 30, 8));
        let (small, big) = (
            generate(&GenSpec { clusters: 12, deployments: 30, seed: 7 }),
            generate(&GenSpec { clusters: 12, deployments: 40, seed: 7 }),
        );
        assert_eq!(format!("{:?}", small.clusters), format!("{:?}", big.clusters));
        assert_eq!(format!("{:?}", small.deployments), format!("{:?}", &big.deployments[..30]));
    }
}
