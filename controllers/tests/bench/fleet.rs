//! The benchmark's fleet, from environment variables with defaults (the scale: 1,000
//! deployments over 20 members of 50 GPU nodes). Members: 40 % EU (at least one), the rest
//! US, two per region; each has an H100 pool (3/5 of its nodes) and an A100 pool. Deployments
//! cycle through sizes (1, 2, 4 or 8 devices per replica, 1–2 replicas: about 40 % of the
//! fleet's devices in all), alternate their fallback order (H100 → A100 or A100 → H100); every
//! third is EU-only, every fourth spreads by cluster and the next by region.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use flotilla_apis::ModelDeployment;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::PostParams;
use kube::{Api, Client, ResourceExt};
use serde_json::json;

use crate::harness::{Fleet, apply, install_crds};

fn env_or(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(v) => v.parse().unwrap_or_else(|_| panic!("{name}={v}: expected a whole number")),
        Err(_) => default,
    }
}

/// What to run.
pub struct Params {
    /// `FLOTILLA_BENCH_MEMBERS` (20).
    pub members: usize,
    /// `FLOTILLA_BENCH_DEPLOYMENTS` (1000).
    pub deployments: usize,
    /// `FLOTILLA_BENCH_NODES`: GPU nodes per member (50).
    pub nodes: u32,
    /// `FLOTILLA_BENCH_STEADY_SECONDS`: the steady window (300).
    pub steady_seconds: u64,
    /// `FLOTILLA_BENCH_SETTLE_SECONDS`: wait after all Ready before the steady window (30).
    pub settle_seconds: u64,
    /// `FLOTILLA_BENCH_POLL_SECONDS`: the controller's `--poll-seconds` (10, its default).
    pub poll_seconds: u64,
    /// `FLOTILLA_BENCH_TIMEOUT_SECONDS`: give up waiting for a phase after this (900).
    pub timeout_seconds: u64,
    /// `FLOTILLA_BENCH_DEPLOYMENT_CONCURRENCY`: the controller's `--deployment-concurrency` (32,
    /// its default).
    pub deployment_concurrency: u64,
    /// `FLOTILLA_BENCH_CACHES`: ModelCaches staged before the steady window, two members each (4).
    pub caches: usize,
    /// `FLOTILLA_BENCH_CHURN_MEMBERS`: members whose inventory churns in the steady window (2).
    pub churn_members: usize,
    /// `FLOTILLA_BENCH_CHURN_SECONDS`: the churn's period (5).
    pub churn_seconds: u64,
}

const DEVICES: [u32; 8] = [1, 1, 2, 1, 4, 1, 2, 8];
const REPLICAS: [i32; 4] = [1, 2, 2, 1];

impl Params {
    pub fn from_env() -> Self {
        let p = Params {
            members: env_or("FLOTILLA_BENCH_MEMBERS", 20) as usize,
            deployments: env_or("FLOTILLA_BENCH_DEPLOYMENTS", 1000) as usize,
            nodes: env_or("FLOTILLA_BENCH_NODES", 50) as u32,
            steady_seconds: env_or("FLOTILLA_BENCH_STEADY_SECONDS", 300),
            settle_seconds: env_or("FLOTILLA_BENCH_SETTLE_SECONDS", 30),
            poll_seconds: env_or("FLOTILLA_BENCH_POLL_SECONDS", 10),
            timeout_seconds: env_or("FLOTILLA_BENCH_TIMEOUT_SECONDS", 900),
            deployment_concurrency: env_or("FLOTILLA_BENCH_DEPLOYMENT_CONCURRENCY", 32),
            caches: env_or("FLOTILLA_BENCH_CACHES", 4) as usize,
            churn_members: env_or("FLOTILLA_BENCH_CHURN_MEMBERS", 2) as usize,
            churn_seconds: env_or("FLOTILLA_BENCH_CHURN_SECONDS", 5).max(1),
        };
        assert!(p.members >= 3, "FLOTILLA_BENCH_MEMBERS must be at least 3 (one EU, two US: one of them is stopped)");
        assert!(p.nodes >= 2, "FLOTILLA_BENCH_NODES must be at least 2 (one per pool)");
        p
    }

    pub fn member_names(&self) -> Vec<String> {
        (1..=self.members).map(|i| format!("m{i}")).collect()
    }

    pub fn eu_members(&self) -> usize {
        (self.members * 2 / 5).max(1)
    }

    pub fn is_eu(&self, i: usize) -> bool {
        i < self.eu_members()
    }

    /// Two members per region.
    pub fn region(&self, i: usize) -> String {
        if self.is_eu(i) { format!("eu-{}", i / 2) } else { format!("us-{}", (i - self.eu_members()) / 2) }
    }

    /// (pool, profile, nodes) of member `i`.
    pub fn pools(&self, _i: usize) -> [(&'static str, &'static str, u32); 2] {
        let h100 = (self.nodes * 3).div_ceil(5).min(self.nodes - 1);
        [("h100", "h100", h100), ("a100", "a100", self.nodes - h100)]
    }

    fn demand(&self) -> u64 {
        (0..self.deployments).map(|i| u64::from(DEVICES[i % 8]) * REPLICAS[i % 4] as u64).sum()
    }

    pub fn describe(&self) -> String {
        let capacity = self.members as u64 * u64::from(self.nodes) * 8;
        format!(
            "{} deployments × {} members ({} EU), {} GPU nodes each ({} in all, {capacity} devices; the deployments ask for {}), steady window {} s ({} ModelCaches, inventory churn on {} members every {} s), poll {} s, deployment concurrency {}",
            self.deployments,
            self.members,
            self.eu_members(),
            self.nodes,
            self.members as u32 * self.nodes,
            self.demand(),
            self.steady_seconds,
            self.caches,
            self.churn_members.min(self.members),
            self.churn_seconds,
            self.poll_seconds,
            self.deployment_concurrency
        )
    }

    pub fn describe_short(&self) -> String {
        format!(
            "{} deployments × {} members, {} GPU nodes ({} devices asked of {})",
            self.deployments,
            self.members,
            self.members as u32 * self.nodes,
            self.demand(),
            self.members as u64 * u64::from(self.nodes) * 8
        )
    }

    /// The `i`-th ModelDeployment.
    pub fn deployment(&self, i: usize) -> serde_json::Value {
        let devices = DEVICES[i % 8];
        let topology = if devices == 1 {
            json!({"type": "Standalone", "devicesPerReplica": 1})
        } else {
            json!({"type": "TensorParallel", "devicesPerReplica": devices})
        };
        let alternatives = if i.is_multiple_of(2) {
            json!([{"class": "h100"}, {"class": "a100"}])
        } else {
            json!([{"class": "a100"}, {"class": "h100"}])
        };
        let mut placement = json!({});
        if i.is_multiple_of(3) {
            placement["sovereignty"] = json!({"allowedJurisdictions": ["EU"]});
        }
        match i % 4 {
            0 => placement["spread"] = json!({"by": "cluster", "maxSkew": 1}),
            1 => placement["spread"] = json!({"by": "region", "maxSkew": 1}),
            _ => {}
        }
        let name = format!("model-{i:04}");
        json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": name, "namespace": "ml"},
            "spec": {"model": {"name": name, "source": "hf://org/model"}, "replicas": REPLICAS[i % 4],
                     "engine": {"image": "vllm/vllm-openai:v0.11.0"}, "topology": topology,
                     "devices": {"alternatives": alternatives}, "placement": placement}})
    }
}

/// CRDs, namespaces, the two classes, and one kubeconfig Secret and InferenceCluster per member.
pub async fn setup(fleet: &Fleet, control: &Client, p: &Params) {
    install_crds(control).await;
    for ns in ["flotilla-system", "ml"] {
        let n: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        Api::<Namespace>::all(control.clone()).create(&PostParams::default(), &n).await.unwrap();
    }
    for (name, product, arch, price) in
        [("h100", "NVIDIA H100 80GB HBM3", "Hopper", "98.32"), ("a100", "NVIDIA A100-SXM4-80GB", "Ampere", "40.96")]
    {
        apply(control, json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceClass", "metadata": {"name": name},
            "spec": {"device": {"driver": "gpu.nvidia.com", "attributes": {"productName": {"string": product}, "architecture": {"string": arch}},
                                "capacity": {"memory": "80Gi"}},
                     "devicesPerNode": 8, "pricePerNodeHour": {"onDemand": price}}}))
        .await;
    }
    for (i, m) in p.member_names().iter().enumerate() {
        let s: Secret = serde_json::from_value(
            json!({"metadata": {"name": format!("{m}-kubeconfig")}, "stringData": {"kubeconfig": fleet.member_kubeconfig_text(m)}}),
        )
        .unwrap();
        Api::<Secret>::namespaced(control.clone(), "flotilla-system").create(&PostParams::default(), &s).await.unwrap();
        let pools: Vec<serde_json::Value> = p
            .pools(i)
            .iter()
            .map(|(pool, _, n)| json!({"name": pool, "class": pool, "maxNodes": n, "capacityTypes": ["on-demand"]}))
            .collect();
        let region = p.region(i);
        apply(
            control,
            json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceCluster", "metadata": {"name": m},
            "spec": {"provider": {"sim": {"cloud": "bench"}}, "region": region, "zones": [format!("{region}a")],
                     "jurisdiction": if p.is_eu(i) { "EU" } else { "US" },
                     "credentials": {"secretRef": {"namespace": "flotilla-system", "name": format!("{m}-kubeconfig")}},
                     "endpoint": format!("http://127.0.0.1:1/{m}"), "pools": pools}}),
        )
        .await;
    }
}

/// What the deployments that are not Ready say (the first few), for a run that did not converge.
pub fn report_stuck(state: &[Arc<ModelDeployment>]) {
    let stuck: Vec<_> =
        state.iter().filter(|d| !d.status.as_ref().is_some_and(|s| s.conditions.is_true("Ready"))).collect();
    println!("# {} deployments not Ready; the first ones:", stuck.len());
    for d in stuck.iter().take(10) {
        let s = d.status.clone().unwrap_or_default();
        let conds: Vec<String> =
            s.conditions.0.iter().map(|c| format!("{}={} {}: {}", c.type_, c.status, c.reason, c.message)).collect();
        println!("#   {}: ready {}/{}; {conds:?}", d.name_any(), s.ready_replicas, d.spec.replicas);
    }
}
