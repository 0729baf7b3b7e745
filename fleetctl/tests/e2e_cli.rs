//! fleetctl against a real control cluster: a control cluster and two members (eu1 in the EU
//! with 2 H100 nodes, us1 in the US with 1), the CRDs, `flotilla-controller` placing three
//! deployments (one that no cluster can hold). Then `fleetctl get` shows readiness and the
//! conditions with their reasons, and `fleetctl plan -f <one changed file> --live` shows
//! exactly the changed deployment with the right numbers — exit 0 when it fits, exit 2 with
//! the reasons when it does not — and `explain --live` explains a live deployment. Last, a
//! FleetQuota stops a replica with `QuotaExceeded` and releases it when raised. Run by
//! `scripts/test-e2e.sh` (set `FLOTILLA_E2E_DIR` to choose where the clusters live).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod harness;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use flotilla_apis::{FleetQuota, ModelDeployment};
use harness::{ControllerProcess, Fleet, apply, install_crds, wait_for};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

const MEMBERS: [(&str, &str, &str); 2] = [("eu1", "eu-central-1", "EU"), ("us1", "us-east-1", "US")];

fn class(name: &str, product: &str) -> Value {
    json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceClass", "metadata": {"name": name},
        "spec": {"device": {"driver": "gpu.nvidia.com", "attributes": {"productName": {"string": product}}, "capacity": {"memory": "80Gi"}},
                 "devicesPerNode": 8, "pricePerNodeHour": {"onDemand": "98.32"}}})
}

fn model(name: &str, replicas: i32, per_replica: u32, class: &str, jurisdiction: &str) -> Value {
    let kind = if per_replica > 1 { "TensorParallel" } else { "Standalone" };
    json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelDeployment", "metadata": {"name": name, "namespace": "ml"},
        "spec": {"model": {"name": name, "source": "hf://org/model"}, "replicas": replicas,
                 "engine": {"image": "vllm/vllm-openai:v0.11.0"}, "topology": {"type": kind, "devicesPerReplica": per_replica},
                 "devices": {"alternatives": [{"class": class}]},
                 "placement": {"sovereignty": {"allowedJurisdictions": [jurisdiction]}}}})
}

async fn setup(fleet: &Fleet, control: &Client) {
    install_crds(control).await;
    for ns in ["flotilla-system", "ml"] {
        let n: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        Api::<Namespace>::all(control.clone()).create(&PostParams::default(), &n).await.unwrap();
    }
    apply(control, class("h100", "NVIDIA H100 80GB HBM3")).await;
    apply(control, class("a100", "NVIDIA A100-SXM4-80GB")).await;
    for (name, region, jurisdiction) in MEMBERS {
        let s: Secret = serde_json::from_value(json!({"metadata": {"name": format!("{name}-kubeconfig")},
            "stringData": {"kubeconfig": fleet.member_kubeconfig_text(name)}}))
        .unwrap();
        Api::<Secret>::namespaced(control.clone(), "flotilla-system").create(&PostParams::default(), &s).await.unwrap();
        apply(control, json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceCluster", "metadata": {"name": name},
            "spec": {"provider": {"sim": {"cloud": "e2e"}}, "region": region, "jurisdiction": jurisdiction,
                     "credentials": {"secretRef": {"namespace": "flotilla-system", "name": format!("{name}-kubeconfig")}},
                     "endpoint": format!("http://127.0.0.1:1/{name}"),
                     "pools": [{"name": "h100", "class": "h100", "maxNodes": 8, "capacityTypes": ["on-demand"]}]}}))
        .await;
    }
    // Fits: 2 x 4 devices on eu1. Fits: 2 x 1 device on us1. Cannot fit: no member has A100s.
    apply(control, model("eu-model", 2, 4, "h100", "EU")).await;
    apply(control, model("us-model", 2, 1, "h100", "US")).await;
    apply(control, model("stuck-model", 1, 1, "a100", "EU")).await;
}

fn fleetctl(fleet: &Fleet, args: &[&str]) -> Output {
    let kubeconfig = fleet.kubeconfig("control");
    Command::new(env!("CARGO_BIN_EXE_fleetctl"))
        .args(args)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .current_dir(harness::repo())
        .output()
        .unwrap()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn row<'a>(table: &'a str, first: &str) -> &'a str {
    table
        .lines()
        .find(|l| l.split_whitespace().next() == Some(first))
        .unwrap_or_else(|| panic!("no row {first}:\n{table}"))
}

/// One file: the live eu-model's spec with another replica count.
fn change_dir(fleet: &Fleet, replicas: i32) -> std::path::PathBuf {
    let dir = fleet.dir.join(format!("change-{replicas}"));
    std::fs::create_dir_all(&dir).unwrap();
    let yaml = serde_yaml_ng::to_string(&model("eu-model", replicas, 4, "h100", "EU")).unwrap();
    std::fs::write(dir.join("eu-model.yaml"), yaml).unwrap();
    dir
}

fn plan_live(fleet: &Fleet, dir: &Path, output: &str) -> Output {
    fleetctl(fleet, &["plan", "-f", dir.to_str().unwrap(), "--live", "-o", output])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e harness; run by scripts/test-e2e.sh"]
async fn fleetctl_against_a_live_fleet() {
    let fleet = Fleet::up("cli", &["control", "eu1", "us1"]);
    fleet.gpu_nodes("eu1", "h100", 2, "h100", "eu-central-1");
    fleet.gpu_nodes("us1", "h100", 1, "h100", "us-east-1");
    let control = fleet.client("control").await;
    setup(&fleet, &control).await;
    let ctl = ControllerProcess::start(&fleet, "control", &["--poll-seconds", "3", "--member-timeout-seconds", "8"]);

    let api: Api<ModelDeployment> = Api::namespaced(control.clone(), "ml");
    for name in ["eu-model", "us-model"] {
        wait_for(&format!("{name} Ready 2/2"), Duration::from_secs(120), || async {
            let s = api.get(name).await.ok()?.status?;
            (s.ready_replicas == 2 && s.conditions.is_true("Ready")).then_some(())
        })
        .await;
    }
    let stuck = wait_for("stuck-model Placed=False", Duration::from_secs(60), || async {
        let s = api.get("stuck-model").await.ok()?.status?;
        let c = s.conditions.get("Placed")?.clone();
        (c.status == "False" && s.conditions.get("Ready").is_some()).then_some(s)
    })
    .await;
    let placed_reason = stuck.conditions.get("Placed").unwrap().reason.clone();
    let ready_reason = stuck.conditions.get("Ready").unwrap().reason.clone();

    // get deployments: readiness and the conditions with their reasons.
    let out = fleetctl(&fleet, &["get", "deployments", "-n", "ml"]);
    assert_eq!(out.status.code(), Some(0), "{}\n{}", text(&out), ctl.logs());
    let table = String::from_utf8_lossy(&out.stdout).to_string();
    let eu = row(&table, "eu-model");
    assert!(eu.contains("2/2") && eu.contains("eu1:2/2") && eu.contains("Ready=True(AllReplicasReady)"), "{table}");
    let st = row(&table, "stuck-model");
    assert!(st.contains(&format!("Ready=False({ready_reason})")), "{table}");
    assert!(st.contains(&format!("Placed=False({placed_reason})")), "{table}");
    // -o wide: every condition's message, and why each cluster refused the stuck model.
    let out = fleetctl(&fleet, &["get", "md", "-A", "-o", "wide"]);
    let wide = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(wide.starts_with("NAMESPACE"), "{wide}");
    let message = &stuck.conditions.get("Placed").unwrap().message;
    assert!(wide.contains(message.as_str()), "{wide}");
    assert!(wide.lines().any(|l| l.contains("us1") && l.contains("JurisdictionNotAllowed")), "{wide}");
    // get clusters: both members Ready, with their devices.
    let out = fleetctl(&fleet, &["get", "clusters"]);
    let clusters = String::from_utf8_lossy(&out.stdout).to_string();
    assert!(row(&clusters, "eu1").contains("Ready=True(AsExpected)"), "{clusters}");
    assert!(row(&clusters, "us1").split_whitespace().any(|w| w == "8"), "8 devices on us1:\n{clusters}");
    // A name that does not exist: exit 1.
    assert_eq!(fleetctl(&fleet, &["get", "md", "nope", "-n", "ml"]).status.code(), Some(1));

    // plan --live with the files as they are live: nothing changes.
    let same = change_dir(&fleet, 2);
    let out = plan_live(&fleet, &same, "table");
    assert!(text(&out).contains("No changes: all 3 deployment(s) keep their placement."), "{}", text(&out));
    assert_eq!(out.status.code(), Some(2), "stuck-model stays unplaced: exit 2");

    // replicas 2 -> 4: exactly eu-model changes, eu1 2 -> 4.
    let four = change_dir(&fleet, 4);
    let out = plan_live(&fleet, &four, "table");
    let t = text(&out);
    assert!(t.contains("ml/eu-model: replicas 2 -> 4"), "{t}");
    let eu1 = row(&t, "eu1");
    assert_eq!(eu1.split_whitespace().collect::<Vec<_>>(), ["eu1", "h100", "h100", "2", "2", "4", "+2"], "{t}");
    assert!(t.contains("1 deployment(s) change, 2 unchanged: 2 replica(s) added, 0 removed, 0 newly unplaced"), "{t}");
    assert!(!t.contains("us-model") && !t.contains("stuck-model"), "{t}");
    let out = plan_live(&fleet, &four, "json");
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["replaced"], json!(["ModelDeployment/ml/eu-model"]));
    let changed = doc["diff"]["changed"].as_array().unwrap();
    assert_eq!(changed.len(), 1, "{doc:#}");
    assert_eq!(
        changed[0]["pools"],
        json!([{"cluster": "eu1", "pool": "h100", "class": "h100", "current": 2, "ready": 2, "planned": 4}])
    );

    // replicas 2 -> 5: eu1 is full at 4; one replica is newly unplaced, us1 refuses it (EU only).
    let five = change_dir(&fleet, 5);
    let out = plan_live(&fleet, &five, "table");
    let t = text(&out);
    assert_eq!(out.status.code(), Some(2), "{t}");
    assert!(t.contains("ml/eu-model: replicas 2 -> 5"), "{t}");
    assert!(t.contains("ml/eu-model: 1 of 5 replicas unplaced (now 0)"), "{t}");
    assert!(t.lines().any(|l| l.trim_start().starts_with("us1") && l.contains("JurisdictionNotAllowed")), "{t}");
    assert!(t.contains("1 deployment(s) change, 2 unchanged: 2 replica(s) added, 0 removed, 1 newly unplaced"), "{t}");

    // explain --live: the live deployment's filters and candidates.
    let out = fleetctl(&fleet, &["explain", "--live", "md/eu-model", "-n", "ml"]);
    let t = text(&out);
    assert_eq!(out.status.code(), Some(0), "{t}");
    assert!(t.starts_with("ml/eu-model (model eu-model): 2 of 2 replicas placed"), "{t}");
    assert!(t.lines().any(|l| l.contains("JurisdictionNotAllowed")), "{t}");

    // The live examples of --help, verbatim, from a directory with control.kubeconfig and a
    // fleet/ directory, KUBECONFIG naming the control cluster (explain's names a deployment of
    // examples/fleet, which this fleet does not have: the same command ran above on eu-model).
    std::fs::create_dir_all(fleet.dir.join("fleet")).unwrap();
    std::fs::copy(same.join("eu-model.yaml"), fleet.dir.join("fleet/eu-model.yaml")).unwrap();
    for sub in ["get", "plan"] {
        let help = String::from_utf8(
            Command::new(env!("CARGO_BIN_EXE_fleetctl")).args([sub, "--help"]).output().unwrap().stdout,
        )
        .unwrap();
        let live: Vec<&str> = help
            .lines()
            .map(str::trim)
            .filter(|l| l.starts_with("fleetctl ") && (l.contains("--live") || l.starts_with("fleetctl get")))
            .collect();
        assert!(!live.is_empty(), "{help}");
        for example in live {
            let out = Command::new(env!("CARGO_BIN_EXE_fleetctl"))
                .args(example.split_whitespace().skip(1))
                .current_dir(&fleet.dir)
                .env("KUBECONFIG", fleet.kubeconfig("control"))
                .output()
                .unwrap();
            assert!(matches!(out.status.code(), Some(0 | 2)), "{example}: {}", text(&out));
            assert!(!out.stdout.is_empty(), "{example}: {}", text(&out));
        }
    }

    // Nothing above wrote to the control cluster: eu-model still wants 2 replicas.
    assert_eq!(api.get("eu-model").await.unwrap().spec.replicas, 2);

    fleet_quota(&control, &api).await;
}

/// A FleetQuota on `ml` at what the namespace holds (eu-model 2 × 4 and us-model 2 × 1 H100
/// devices): one more eu-model replica is refused with `QuotaExceeded` although eu1 has room,
/// no other replica moves, the quota's status says so; raised, the replica is placed.
async fn fleet_quota(control: &Client, api: &Api<ModelDeployment>) {
    let quotas: Api<FleetQuota> = Api::namespaced(control.clone(), "ml");
    let quota = |max: u32| {
        json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "FleetQuota", "metadata": {"name": "gpus", "namespace": "ml"},
               "spec": {"devices": [{"class": "h100", "max": max}]}})
    };
    apply(control, quota(10)).await;
    let exhausted = |s: &flotilla_apis::FleetQuotaStatus| s.conditions.get("Exhausted").map(|c| c.reason.clone());
    wait_for("the quota at its limit: 10/10, AtLimit", Duration::from_secs(60), || async {
        let s = quotas.get("gpus").await.ok()?.status?;
        (s.devices.first()?.used == 10 && exhausted(&s).as_deref() == Some("AtLimit")).then_some(())
    })
    .await;
    let us_before = api.get("us-model").await.unwrap().status.unwrap().placements;
    let scale = |n: i32| json!({"spec": {"replicas": n}});
    api.patch("eu-model", &PatchParams::default(), &Patch::Merge(&scale(3))).await.unwrap();
    let short = wait_for("eu-model's third replica refused by the quota", Duration::from_secs(60), || async {
        let s = api.get("eu-model").await.ok()?.status?;
        let placed = s.conditions.get("Placed")?;
        (placed.status == "False" && placed.reason == "QuotaExceeded").then_some(s)
    })
    .await;
    let reasons = &short.unplaced.as_ref().unwrap().reasons;
    let eu1 = reasons.iter().find(|r| r.cluster == "eu1").expect("eu1 refused");
    assert_eq!(eu1.reason, "QuotaExceeded", "{reasons:?}");
    assert!(eu1.message.starts_with("FleetQuota ml/gpus: h100 devices 10 of 10 used"), "{}", eu1.message);
    assert_eq!(short.ready_replicas, 2, "the two running replicas stay");
    let s = wait_for("the quota says why", Duration::from_secs(60), || async {
        let s = quotas.get("gpus").await.ok()?.status?;
        (exhausted(&s).as_deref() == Some("QuotaExceeded")).then_some(s)
    })
    .await;
    assert_eq!((s.unplaced_replicas, s.summary.as_deref()), (Some(1), Some("h100 10/10")));
    // Absence: no CapacityClaim asks for what the quota holds back, and us-model did not move.
    let claims: Api<flotilla_apis::CapacityClaim> = Api::namespaced(control.clone(), "ml");
    assert!(claims.get_opt("eu-model").await.unwrap().is_none());
    assert_eq!(api.get("us-model").await.unwrap().status.unwrap().placements, us_before);

    // Raised by one replica's devices: placed, and the quota at its new limit.
    apply(control, quota(14)).await;
    wait_for("eu-model Ready 3/3 once the quota is raised", Duration::from_secs(120), || async {
        let s = api.get("eu-model").await.ok()?.status?;
        (s.ready_replicas == 3 && s.conditions.is_true("Placed") && s.conditions.is_true("Ready")).then_some(())
    })
    .await;
    wait_for("the quota at 14/14", Duration::from_secs(60), || async {
        let s = quotas.get("gpus").await.ok()?.status?;
        (s.devices.first()?.used == 14 && s.unplaced_replicas == Some(0)).then_some(())
    })
    .await;
    assert_eq!(api.get("us-model").await.unwrap().status.unwrap().placements, us_before);
}
