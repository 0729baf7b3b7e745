//! Shared fixtures for the claim-engine tests on the simulated provider: two classes
//! (H200, H100), a three-region cloud (two EU, one US), claim builders and a driver that
//! steps a claim the way the controller would, on an injected clock.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use flotilla_apis::claim::{
    CapacityClaimSpec, CapacityClaimStatus, CapacityPolicy, ClaimDeviceClass, ClaimLatency, ClaimTopology, PodSet,
};
use flotilla_apis::class::{AwsProvisioning, InferenceClassSpec, Provisioning};
use flotilla_apis::common::{
    CapacityType, DeviceAttribute, DeviceSpec, JurisdictionCode, PricePerCapacityType, Sovereignty,
};
use flotilla_providers::{
    ClaimEngine, ClaimInput, ClaimStep, ManualClock, SimCloud, SimOffering, SimProvider, SimRegion,
};
use k8s_openapi::jiff::Timestamp;

pub fn t0() -> Timestamp {
    Timestamp::from_second(1_800_000_000).unwrap()
}

pub fn device(product: &str, memory: &str) -> DeviceSpec {
    let mut attributes = BTreeMap::new();
    attributes
        .insert("productName".to_string(), DeviceAttribute { string: Some(product.into()), ..Default::default() });
    let mut capacity = BTreeMap::new();
    capacity.insert("memory".to_string(), k8s_openapi::apimachinery::pkg::api::resource::Quantity(memory.to_string()));
    DeviceSpec { driver: "gpu.nvidia.com".into(), attributes, capacity }
}

pub fn h200() -> DeviceSpec {
    device("NVIDIA H200", "141Gi")
}

pub fn h100() -> DeviceSpec {
    device("NVIDIA H100 80GB HBM3", "80Gi")
}

pub fn classes() -> BTreeMap<String, InferenceClassSpec> {
    let class = |device: DeviceSpec, ty: &str, od: &str| InferenceClassSpec {
        device,
        devices_per_node: 8,
        provisioning: Provisioning { aws: Some(AwsProvisioning { instance_types: vec![ty.to_string()] }) },
        price_per_node_hour: PricePerCapacityType { on_demand: Some(od.into()), ..Default::default() },
    };
    BTreeMap::from([
        ("h200".to_string(), class(h200(), "p5e.48xlarge", "120.00")),
        ("h100".to_string(), class(h100(), "p5.48xlarge", "98.32")),
    ])
}

pub fn offering(class: &str, ct: CapacityType, price: u64, nodes: u32) -> SimOffering {
    let (ty, dev) = if class == "h200" { ("p5e.48xlarge", h200()) } else { ("p5.48xlarge", h100()) };
    SimOffering {
        instance_type: ty.into(),
        class: class.into(),
        device: dev,
        devices_per_node: 8,
        capacity_type: ct,
        zones: Vec::new(),
        price_micros: price * 1_000_000,
        nodes_per_zone: nodes,
        reservation_id: (ct == CapacityType::Reserved).then(|| format!("cr-{class}")),
        ends_at: None,
    }
}

pub fn region(name: &str, jurisdiction: &str, offerings: Vec<SimOffering>) -> SimRegion {
    SimRegion {
        name: name.into(),
        jurisdiction: jurisdiction.into(),
        cluster: format!("cl-{name}"),
        zones: vec![format!("{name}a"), format!("{name}b")],
        quota_nodes: None,
        offerings,
    }
}

pub fn cloud(regions: Vec<SimRegion>) -> SimCloud {
    SimCloud {
        name: "sim".into(),
        seed: 7,
        provisioning_delay: Duration::from_secs(30),
        provisioning_jitter: Duration::ZERO,
        regions,
    }
}

pub fn claim(pods: i32, cts: &[CapacityType], classes: &[&str], jurisdictions: &[&str]) -> CapacityClaimSpec {
    CapacityClaimSpec {
        pod_sets: vec![PodSet { name: "decode".into(), count: pods, devices_per_pod: 8 }],
        latency: Some(ClaimLatency { max_provisioning_latency: Some("15m".into()), warm: false }),
        topology: Some(ClaimTopology::default()),
        capacity: CapacityPolicy {
            capacity_types: cts.to_vec(),
            device_classes: classes
                .iter()
                .map(|c| ClaimDeviceClass { class: Some(c.to_string()), selectors: Vec::new() })
                .collect(),
            sovereignty: Some(Sovereignty {
                allowed_jurisdictions: jurisdictions.iter().map(|j| JurisdictionCode(j.to_string())).collect(),
                ..Default::default()
            }),
            reservation_ids: Vec::new(),
        },
        disruption: None,
    }
}

/// A claim, its status, and the provider and clock it runs against.
pub struct Harness {
    pub clock: ManualClock,
    pub sim: Arc<SimProvider>,
    pub engine: ClaimEngine,
    pub classes: BTreeMap<String, InferenceClassSpec>,
    pub spec: CapacityClaimSpec,
    pub status: CapacityClaimStatus,
    pub last: Option<ClaimStep>,
    /// The claim's nodes and pods as the members would show them.
    pub usage: flotilla_providers::ClaimUsage,
}

impl Harness {
    pub fn new(cloud: SimCloud, spec: CapacityClaimSpec) -> Self {
        let clock = ManualClock::new(t0());
        let sim = Arc::new(SimProvider::new(cloud, Arc::new(clock.clone())));
        Self {
            clock,
            sim,
            engine: ClaimEngine::default(),
            classes: classes(),
            spec,
            status: Default::default(),
            last: None,
            usage: Default::default(),
        }
    }

    /// What the controller would pass for this claim at the clock's time.
    pub fn input(&self) -> ClaimInput<'_> {
        ClaimInput {
            namespace: "ml",
            name: "llama",
            generation: Some(1),
            created: t0(),
            spec: &self.spec,
            status: &self.status,
            classes: &self.classes,
            usage: &self.usage,
            now: flotilla_providers::Clock::now(&self.clock),
        }
    }

    /// One reconcile at the clock's time; the new status is kept as the controller would.
    pub async fn step(&mut self) -> ClaimStep {
        let provider: Arc<dyn flotilla_providers::CapacityProvider> = self.sim.clone();
        let out = self.engine.step(self.input(), provider.as_ref()).await;
        self.status = out.status.clone();
        self.last = Some(out.clone());
        out
    }

    /// Steps, advancing the clock by each step's `requeue_after`, until `until` has passed.
    pub async fn run_for(&mut self, total: Duration) -> usize {
        let end = flotilla_providers::clock::add(flotilla_providers::Clock::now(&self.clock), total);
        let mut steps = 0;
        while flotilla_providers::Clock::now(&self.clock) < end {
            let out = self.step().await;
            steps += 1;
            self.clock.advance(out.requeue_after);
        }
        steps
    }

    pub fn condition(&self, type_: &str) -> (String, String, String) {
        let c = self.status.conditions.get(type_).unwrap_or_else(|| panic!("no condition {type_}"));
        (c.status.clone(), c.reason.clone(), c.message.clone())
    }

    pub fn results(&self) -> Vec<String> {
        self.status
            .attempts
            .iter()
            .map(|a| {
                format!("{} {} {} {}", a.capacity_type.map(|c| c.as_str()).unwrap_or("-"), a.class, a.region, a.result)
            })
            .collect()
    }
}
