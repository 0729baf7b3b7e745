//! Capacity intent end to end on real API servers: a control cluster and three members (eu1
//! with one H100 node, eu2 with none yet, us1 with one), `flotilla-controller` solving
//! CapacityClaims against a simulated cloud (`--sim-cloud`) whose nodes become kwok nodes.
//! An EU-only deployment that does not fit gets a claim; the simulated provider adds nodes to
//! eu2 (never the cheaper US region); the replicas become Ready there. A deployment that fits
//! gets no claim. The claim's nodes are tainted for the deployment and reported as reserved for
//! it. An impossible claim says why and stops writing. Deleting the deployment
//! releases the capacity and the nodes go. Then disruption intent: a claim with
//! `scaleDown: ApplicationDrainOnly` marks its nodes do-not-disrupt for node autoscalers,
//! keeps busy surplus nodes (`DrainRequired`) when it shrinks, gives back exactly the node the
//! application left, and, deleted, keeps its capacity until the last pod is gone. Run by
//! `scripts/test-e2e.sh`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod harness;

use std::time::Duration;

use flotilla_apis::{CapacityClaim, ModelDeployment};
use harness::{ControllerProcess, Fleet, apply, install_crds, wait_for};
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, Secret};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

const MEMBERS: [(&str, &str, &str); 3] =
    [("eu1", "eu-central-1", "EU"), ("eu2", "eu-west-3", "EU"), ("us1", "us-east-1", "US")];

const SIM_CLOUD: &str = r#"
name: sim
seed: 7
provisioningDelaySeconds: 3
regions:
- name: eu-west-3
  jurisdiction: EU
  cluster: eu2
  zones: [eu-west-3a]
  quotaNodes: 2
  offerings:
  - {instanceType: p5.48xlarge, class: h100, capacityType: on-demand, pricePerHour: "98.32", nodesPerZone: 2}
- name: us-east-1
  jurisdiction: US
  cluster: us1
  zones: [us-east-1a]
  offerings:
  - {instanceType: p5.48xlarge, class: h100, capacityType: on-demand, pricePerHour: "40.00", nodesPerZone: 8}
"#;

async fn setup(fleet: &Fleet, control: &Client) {
    install_crds(control).await;
    for ns in ["flotilla-system", "ml"] {
        let n: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        Api::<Namespace>::all(control.clone()).create(&PostParams::default(), &n).await.unwrap();
    }
    apply(
        control,
        json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceClass", "metadata": {"name": "h100"},
        "spec": {"device": {"driver": "gpu.nvidia.com", "attributes": {"productName": {"string": "NVIDIA H100 80GB HBM3"}},
                 "capacity": {"memory": "80Gi"}}, "devicesPerNode": 8, "pricePerNodeHour": {"onDemand": "98.32"}}}),
    )
    .await;
    for (name, region, jurisdiction) in MEMBERS {
        // --sim-cloud creates the nodes it "provisions": the rights only it needs.
        fleet.grant_member(name, "sim-cloud.yaml");
        let secrets: Api<Secret> = Api::namespaced(control.clone(), "flotilla-system");
        let s: Secret = serde_json::from_value(
            json!({"metadata": {"name": format!("{name}-kubeconfig")}, "stringData": {"kubeconfig": fleet.member_kubeconfig_text(name)}}),
        )
        .unwrap();
        secrets.create(&PostParams::default(), &s).await.unwrap();
        apply(control, json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceCluster", "metadata": {"name": name},
            "spec": {"provider": {"sim": {"cloud": "e2e"}}, "region": region, "jurisdiction": jurisdiction,
                     "credentials": {"secretRef": {"namespace": "flotilla-system", "name": format!("{name}-kubeconfig")}},
                     "pools": [{"name": "h100", "class": "h100", "maxNodes": 8, "capacityTypes": ["on-demand"]}]}}))
        .await;
    }
}

fn model(name: &str, replicas: i32, devices: u32) -> serde_json::Value {
    json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelDeployment", "metadata": {"name": name, "namespace": "ml"},
        "spec": {"model": {"name": name, "source": "hf://org/model"}, "replicas": replicas,
                 "engine": {"image": "vllm/vllm-openai:v0.11.0"},
                 "topology": {"type": if devices > 1 { "TensorParallel" } else { "Standalone" }, "devicesPerReplica": devices},
                 "devices": {"alternatives": [{"class": "h100"}]},
                 "placement": {"sovereignty": {"allowedJurisdictions": ["EU"]},
                               "capacityClaimTemplate": {"capacityTypes": ["on-demand"], "maxProvisioningLatency": "10m",
                                                         "disruption": {"consolidation": "WhenEmpty", "scaleDown": "Any"}}}}})
}

async fn claim_nodes(client: &Client) -> Vec<String> {
    let lp = ListParams::default().labels("flotilla.dev/claim");
    Api::<Node>::all(client.clone())
        .list(&lp)
        .await
        .map(|l| l.items.into_iter().filter_map(|n| n.metadata.name).collect())
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e harness; run by scripts/test-e2e.sh"]
async fn capacity_claims_on_real_api_servers() {
    let fleet = Fleet::up("claim", &["control", "eu1", "eu2", "us1"]);
    fleet.gpu_nodes("eu1", "h100", 1, "h100", "eu-central-1");
    fleet.gpu_nodes("us1", "h100", 1, "h100", "us-east-1");
    let control = fleet.client("control").await;
    let (eu2, us1) = (fleet.client("eu2").await, fleet.client("us1").await);
    setup(&fleet, &control).await;
    let sim_file = fleet.dir.join("sim-cloud.yaml");
    std::fs::write(&sim_file, SIM_CLOUD).unwrap();
    let _ctl = ControllerProcess::start(
        &fleet,
        "control",
        "ctl-1",
        &["--poll-seconds", "2", "--member-timeout-seconds", "8", "--sim-cloud", sim_file.to_str().unwrap()],
    );
    let mds: Api<ModelDeployment> = Api::namespaced(control.clone(), "ml");
    let claims: Api<CapacityClaim> = Api::namespaced(control.clone(), "ml");

    // A deployment that fits (one GPU of eu1's eight): no claim.
    apply(&control, model("small", 1, 1)).await;
    wait_for("small Ready", Duration::from_secs(60), || async {
        let s = mds.get("small").await.ok()?.status?;
        (s.ready_replicas == 1 && s.conditions.is_true("Ready")).then_some(())
    })
    .await;
    assert!(claims.get_opt("small").await.unwrap().is_none(), "a deployment that fits owns no claim");
    // Gone before `big` comes: placements rank but do not reserve, so two deployments of equal
    // priority competing for eu1 would make big's shortfall depend on the solver's order.
    mds.delete("small", &DeleteParams::default()).await.unwrap();
    wait_for("small deleted", Duration::from_secs(60), || async {
        mds.get_opt("small").await.ok()?.is_none().then_some(())
    })
    .await;

    // Three TP8 replicas, EU only: eu1's one node holds one, eu2 has no node: two are unplaced.
    apply(&control, model("big", 3, 8)).await;
    let claim = wait_for("a claim for big's unplaced replicas", Duration::from_secs(60), || async {
        claims.get_opt("big").await.ok()?
    })
    .await;
    let ps = &claim.spec.pod_sets[0];
    assert_eq!(ps.devices_per_pod, 8);
    assert_eq!(ps.count, 2, "{ps:?}");
    assert_eq!(claim.metadata.owner_references.as_ref().unwrap()[0].name, "big");
    let disruption = claim.spec.disruption.as_ref().expect("the template's disruption is the claim's");
    assert_eq!(format!("{:?}", disruption.scale_down), "Any");
    let placed = wait_for("big reports ClaimPending", Duration::from_secs(30), || async {
        let c = mds.get("big").await.ok()?.status?.conditions.get("Placed")?.clone();
        (c.reason == "ClaimPending").then_some(c)
    })
    .await;
    assert!(placed.message.contains("CapacityClaim ml/big"), "{}", placed.message);

    // The simulated provider adds two nodes to eu2; the replicas become Ready there.
    let claim = wait_for("the claim Fulfilled", Duration::from_secs(90), || async {
        let c = claims.get("big").await.ok()?;
        c.status.as_ref()?.conditions.is_true("Fulfilled").then_some(c)
    })
    .await;
    let status = claim.status.unwrap();
    assert!(status.allocations.iter().all(|a| a.cluster == "eu2"), "{:?}", status.allocations);
    assert!(
        status.attempts.iter().all(|a| format!("{a:?}").contains("eu-west-3")),
        "never asked the US: {:?}",
        status.attempts
    );
    wait_for("big Ready 3/3", Duration::from_secs(120), || async {
        let s = mds.get("big").await.ok()?.status?;
        (s.ready_replicas == 3 && s.conditions.is_true("Ready")).then_some(())
    })
    .await;
    let s = mds.get("big").await.unwrap().status.unwrap();
    assert!(s.placements.iter().any(|p| p.cluster == "eu2" && p.ready >= 1), "{:?}", s.placements);
    assert!(s.placements.iter().all(|p| p.cluster != "us1"), "{:?}", s.placements);
    assert_eq!(claim_nodes(&eu2).await.len(), 2);
    assert_eq!(
        claims.get("big").await.unwrap().spec.pod_sets[0].count,
        2,
        "the claim did not grow once its nodes came"
    );
    assert!(claim_nodes(&us1).await.is_empty(), "the cheaper US region got nothing");
    // The claim's nodes are big's: tainted for it, and eu2 reports them as reserved, not shared.
    for n in Api::<Node>::all(eu2.clone()).list(&ListParams::default().labels("flotilla.dev/claim")).await.unwrap() {
        let taints = n.spec.and_then(|s| s.taints).unwrap_or_default();
        assert!(
            taints.iter().any(|t| t.key == "flotilla.dev/claim"
                && t.value.as_deref() == Some("ml.big")
                && t.effect == "NoSchedule"),
            "{taints:?}"
        );
    }
    let clusters: Api<flotilla_apis::InferenceCluster> = Api::all(control.clone());
    let pool = wait_for("eu2 reports the reserved nodes", Duration::from_secs(30), || async {
        let p = clusters.get("eu2").await.ok()?.status?.pools.into_iter().next()?;
        (p.reserved.len() == 1 && p.reserved[0].nodes == 2).then_some(p)
    })
    .await;
    assert_eq!(pool.reserved[0].claim, "ml.big");
    assert_eq!((pool.nodes, pool.devices_free), (0, 0), "nothing of it is shared: {pool:?}");

    // An impossible claim (class a100 does not exist): it says why, and then writes nothing.
    apply(
        &control,
        json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "CapacityClaim",
        "metadata": {"name": "impossible", "namespace": "ml"},
        "spec": {"podSets": [{"name": "p", "count": 4, "devicesPerPod": 8}],
                 "capacity": {"capacityTypes": ["on-demand"], "deviceClasses": [{"class": "a100"}],
                              "sovereignty": {"allowedJurisdictions": ["EU"]}}}}),
    )
    .await;
    let cond = wait_for("the impossible claim's reason", Duration::from_secs(30), || async {
        let c = claims.get("impossible").await.ok()?.status?.conditions.get("Fulfilled")?.clone();
        (c.status == "False").then_some(c)
    })
    .await;
    eprintln!("impossible claim: {} — {}", cond.reason, cond.message);
    assert!(!cond.message.is_empty());
    let rv = claims.get("impossible").await.unwrap().metadata.resource_version;
    tokio::time::sleep(Duration::from_secs(20)).await;
    assert_eq!(
        claims.get("impossible").await.unwrap().metadata.resource_version,
        rv,
        "no status writes while nothing changes"
    );
    claims.delete("impossible", &DeleteParams::default()).await.unwrap();

    // A claim in a namespace tenants may not use (the controller's own): refused, and the
    // provider is asked for nothing, though eu2 has room for it (without the check the
    // simulated cloud fulfils it there).
    let protected: Api<CapacityClaim> = Api::namespaced(control.clone(), "flotilla-system");
    let nodes_before = (claim_nodes(&eu2).await, claim_nodes(&us1).await);
    apply(
        &control,
        json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "CapacityClaim",
        "metadata": {"name": "grab", "namespace": "flotilla-system"},
        "spec": {"podSets": [{"name": "p", "count": 1, "devicesPerPod": 8}],
                 "capacity": {"capacityTypes": ["on-demand"], "deviceClasses": [{"class": "h100"}],
                              "sovereignty": {"allowedJurisdictions": ["EU"]}}}}),
    )
    .await;
    let refused = wait_for("the protected claim refused", Duration::from_secs(30), || async {
        let s = protected.get("grab").await.ok()?.status?;
        let c = s.conditions.get("Fulfilled")?.clone();
        (c.reason == "InvalidSpec").then_some(s)
    })
    .await;
    let c = refused.conditions.get("Fulfilled").unwrap();
    assert!(c.message.contains("namespace flotilla-system is protected"), "{}", c.message);
    tokio::time::sleep(Duration::from_secs(5)).await;
    let s = protected.get("grab").await.unwrap().status.unwrap();
    assert!(s.attempts.is_empty() && s.allocations.is_empty(), "no provider was asked: {s:?}");
    let nodes_after = (claim_nodes(&eu2).await, claim_nodes(&us1).await);
    assert_eq!(nodes_after, nodes_before, "no node was provisioned for the refused claim");
    protected.delete("grab", &DeleteParams::default()).await.unwrap();
    wait_for("the refused claim gone", Duration::from_secs(30), || async {
        protected.get_opt("grab").await.ok()?.is_none().then_some(())
    })
    .await;

    // Deleting the deployment releases the claim's capacity: the claim and its nodes go.
    mds.delete("big", &DeleteParams::default()).await.unwrap();
    wait_for("the claim gone", Duration::from_secs(90), || async {
        claims.get_opt("big").await.ok()?.is_none().then_some(())
    })
    .await;
    wait_for("eu2's claim nodes removed", Duration::from_secs(30), || async {
        claim_nodes(&eu2).await.is_empty().then_some(())
    })
    .await;

    drain_before_release(&control, &claims, &eu2).await;
}

async fn surplus(
    claims: &Api<CapacityClaim>,
    name: &str,
) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    claims.get(name).await.ok()?.status?.conditions.get("Surplus").cloned()
}

/// A pod of the application on `node` (bound directly; kwok runs it).
async fn run_on(member: &Client, node: &str) -> String {
    let name = format!("app-{node}");
    let pod: Pod = serde_json::from_value(json!({"metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "engine", "image": "vllm/vllm-openai:v0.11.0"}]}}))
    .unwrap();
    Api::<Pod>::namespaced(member.clone(), "default").create(&PostParams::default(), &pod).await.unwrap();
    name
}

async fn stop(member: &Client, pod: &str) {
    let pods: Api<Pod> = Api::namespaced(member.clone(), "default");
    pods.delete(pod, &DeleteParams { grace_period_seconds: Some(0), ..Default::default() }).await.unwrap();
    wait_for("the pod gone", Duration::from_secs(30), || async {
        pods.get_opt(pod).await.ok()?.is_none().then_some(())
    })
    .await;
}

/// `scaleDown: ApplicationDrainOnly` on a claim of two nodes in eu2, each running a pod.
async fn drain_before_release(control: &Client, claims: &Api<CapacityClaim>, eu2: &Client) {
    let claim = |count: i32| {
        json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "CapacityClaim",
            "metadata": {"name": "drain", "namespace": "ml"},
            "spec": {"podSets": [{"name": "p", "count": count, "devicesPerPod": 8}],
                     "capacity": {"capacityTypes": ["on-demand"], "deviceClasses": [{"class": "h100"}],
                                  "sovereignty": {"allowedJurisdictions": ["EU"]}},
                     "disruption": {"consolidation": "WhenEmpty", "scaleDown": "ApplicationDrainOnly"}}})
    };
    apply(control, claim(2)).await;
    wait_for("the drain claim Fulfilled", Duration::from_secs(90), || async {
        claims.get("drain").await.ok()?.status?.conditions.is_true("Fulfilled").then_some(())
    })
    .await;
    let nodes = wait_for("its two nodes in eu2", Duration::from_secs(30), || async {
        let n = claim_nodes(eu2).await;
        (n.len() == 2).then_some(n)
    })
    .await;
    // Node autoscalers are told to leave them alone; the policy is on the nodes.
    let marked = wait_for("nodes marked do-not-disrupt", Duration::from_secs(30), || async {
        let all = Api::<Node>::all(eu2.clone())
            .list(&ListParams::default().labels("flotilla.dev/claim=ml.drain"))
            .await
            .ok()?;
        all.items
            .iter()
            .all(|n| {
                let a = n.metadata.annotations.clone().unwrap_or_default();
                a.get("karpenter.sh/do-not-disrupt").is_some_and(|v| v == "true")
                    && a.get("cluster-autoscaler.kubernetes.io/scale-down-disabled").is_some_and(|v| v == "true")
            })
            .then_some(all.items)
    })
    .await;
    let l = marked[0].metadata.labels.clone().unwrap_or_default();
    assert_eq!(l.get("flotilla.dev/scale-down").map(String::as_str), Some("ApplicationDrainOnly"));
    let (a, b) = (nodes[0].clone(), nodes[1].clone());
    let (pod_a, pod_b) = (run_on(eu2, &a).await, run_on(eu2, &b).await);

    // Shrunk to one pod while both nodes run the application: nothing is given back.
    apply(control, claim(1)).await;
    let c = wait_for("DrainRequired", Duration::from_secs(60), || async {
        surplus(claims, "drain").await.filter(|c| c.reason == "DrainRequired")
    })
    .await;
    assert!(c.message.contains(&a) && c.message.contains(&b), "names the nodes to drain: {}", c.message);
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert_eq!(claim_nodes(eu2).await, nodes, "busy nodes are kept");

    // The application leaves b: exactly b goes, a stays.
    stop(eu2, &pod_b).await;
    wait_for("b given back", Duration::from_secs(60), || async {
        (claim_nodes(eu2).await == [a.clone()]).then_some(())
    })
    .await;
    wait_for("no surplus left", Duration::from_secs(60), || async {
        surplus(claims, "drain").await.filter(|c| c.status == "False").map(|_| ())
    })
    .await;

    // Deleted while a still runs the application: the claim and its node stay until it leaves.
    claims.delete("drain", &DeleteParams::default()).await.unwrap();
    let c = wait_for("deleting waits for drain", Duration::from_secs(60), || async {
        surplus(claims, "drain").await.filter(|c| c.reason == "DrainRequired" && c.message.starts_with("Deleting"))
    })
    .await;
    assert!(c.message.contains(&a), "{}", c.message);
    tokio::time::sleep(Duration::from_secs(8)).await;
    assert!(claims.get_opt("drain").await.unwrap().is_some(), "not released while the application runs there");
    assert_eq!(claim_nodes(eu2).await, std::slice::from_ref(&a));
    stop(eu2, &pod_a).await;
    wait_for("the drained claim gone", Duration::from_secs(60), || async {
        claims.get_opt("drain").await.ok()?.is_none().then_some(())
    })
    .await;
    wait_for("its last node removed", Duration::from_secs(30), || async {
        claim_nodes(eu2).await.is_empty().then_some(())
    })
    .await;
}
