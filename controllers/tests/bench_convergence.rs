//! A benchmark, not a test: how long the controller takes to converge 200 ModelDeployments
//! over 5 member clusters (real API servers, kwok nodes), from "all applied" to "every
//! deployment Ready", and how many writes that took. Run by `scripts/bench-convergence.sh`;
//! it prints a Markdown row for `docs/benchmarks.md`. Ignored in the test command.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod harness;

use std::time::{Duration, Instant};

use flotilla_apis::ModelDeployment;
use harness::{ControllerProcess, Fleet, apply, install_crds, wait_for};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

const MEMBERS: usize = 5;
const DEPLOYMENTS: usize = 200;

async fn setup(fleet: &Fleet, control: &Client, members: &[String]) {
    install_crds(control).await;
    for ns in ["flotilla-system", "ml"] {
        let n: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        Api::<Namespace>::all(control.clone()).create(&PostParams::default(), &n).await.unwrap();
    }
    apply(control, json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceClass", "metadata": {"name": "h100"},
        "spec": {"device": {"driver": "gpu.nvidia.com", "attributes": {"productName": {"string": "NVIDIA H100 80GB HBM3"}}},
                 "devicesPerNode": 8, "pricePerNodeHour": {"onDemand": "98.32"}}}))
    .await;
    for (i, m) in members.iter().enumerate() {
        let s: Secret = serde_json::from_value(
            json!({"metadata": {"name": format!("{m}-kubeconfig")}, "stringData": {"kubeconfig": fleet.kubeconfig_text(m)}}),
        )
        .unwrap();
        Api::<Secret>::namespaced(control.clone(), "flotilla-system").create(&PostParams::default(), &s).await.unwrap();
        apply(control, json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceCluster", "metadata": {"name": m},
            "spec": {"provider": {"sim": {"cloud": "bench"}}, "region": format!("region-{i}"), "jurisdiction": if i < 3 { "EU" } else { "US" },
                     "credentials": {"secretRef": {"namespace": "flotilla-system", "name": format!("{m}-kubeconfig")}},
                     "pools": [{"name": "h100", "class": "h100", "maxNodes": 64, "capacityTypes": ["on-demand"]}]}}))
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark; run by scripts/bench-convergence.sh"]
async fn converge_200_deployments_over_5_members() {
    let members: Vec<String> = (1..=MEMBERS).map(|i| format!("m{i}")).collect();
    let mut names: Vec<&str> = vec!["control"];
    names.extend(members.iter().map(String::as_str));
    let fleet = Fleet::up("bench", &names);
    for (i, m) in members.iter().enumerate() {
        fleet.gpu_nodes(m, "h100", 20, "h100", &format!("region-{i}"));
    }
    let control = fleet.client("control").await;
    setup(&fleet, &control, &members).await;
    let mut ctl = ControllerProcess::start(&fleet, "control", "bench", &["--poll-seconds", "5"]);
    let api: Api<ModelDeployment> = Api::namespaced(control.clone(), "ml");
    let start = Instant::now();
    for i in 0..DEPLOYMENTS {
        let sovereignty = if i % 3 == 0 { json!({"allowedJurisdictions": ["EU"]}) } else { json!({}) };
        apply(&control, json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelDeployment",
            "metadata": {"name": format!("model-{i:03}"), "namespace": "ml"},
            "spec": {"model": {"name": format!("model-{i:03}"), "source": "hf://org/model"}, "replicas": 2,
                     "engine": {"image": "vllm/vllm-openai:v0.11.0"}, "topology": {"type": "Standalone", "devicesPerReplica": 1},
                     "devices": {"alternatives": [{"class": "h100"}]},
                     "placement": {"sovereignty": sovereignty, "spread": {"by": "cluster", "maxSkew": 1}}}}))
        .await;
    }
    let applied = start.elapsed();
    wait_for("every deployment Ready", Duration::from_secs(900), || async {
        let list = api.list(&ListParams::default()).await.ok()?;
        let ready =
            list.items.iter().filter(|d| d.status.as_ref().is_some_and(|s| s.conditions.is_true("Ready"))).count();
        (ready == DEPLOYMENTS).then_some(())
    })
    .await;
    let converged = start.elapsed();
    let writes = ctl.metric_sum("flotilla_controller_status_writes_total", "ModelDeployment");
    let reconciles = ctl.metric_sum("flotilla_controller_reconciles_total", "ModelDeployment");
    ctl.kill();
    println!(
        "| {DEPLOYMENTS} deployments × {MEMBERS} members (2 replicas each, 20 kwok H100 nodes per member) | applied in {:.1} s | all Ready after {:.1} s | {writes} status writes | {reconciles} reconciles |",
        applied.as_secs_f64(),
        converged.as_secs_f64()
    );
}
