//! The ModelDeployment controller on real API servers: a control cluster and three members
//! (two EU, one US) with kwok GPU nodes. Each member gets exactly the Deployments the plan
//! says and their pods go Running, with one PodDisruptionBudget per pool that the member's
//! disruption controller counts over exactly those pods (and none left after deletion, cluster
//! cleanup or the sweep); the EU-sovereign model has nothing in the US member; a
//! quiet fleet makes no writes, and its members' API servers count no LIST and no write of
//! Flotilla's resources in that minute (`apiserver_request_total`); a member Deployment edited by hand is restored with a
//! `DriftCorrected` event; a replica whose pod its member's scheduler refuses is placed on
//! another member with a `ReplicasUnschedulable` Warning (`e2e_deployment/unschedulable.rs`);
//! the members' schedulers pack replicas onto nodes as the plan counted them, so a whole-node
//! replica fits where the plan said (`e2e_deployment/packing.rs`);
//! a deployment scaled on a fully placed fleet is re-planned incrementally (the controller's
//! `solves_total{mode="Incremental"}`); a stopped member's replicas are re-placed in the EU with
//! make-before-break, its loss and return logged once each; poison objects (a deep selector, a
//! costly one, a class whose capacity overflows a Quantity) are refused naming their field
//! while the healthy ones stay Ready; a ModelDeployment in `kube-system` is refused and reaches
//! no member; deleting an InferenceCluster (`deletionPolicy: Cleanup`) removes Flotilla's
//! workloads from its member; deleting a ModelDeployment removes every member object it created
//! and nothing else, is not held up by an unrelated unreachable member, waits (naming it) for one
//! that holds its objects until annotated `flotilla.dev/orphan-on-unreachable=true`, and the
//! periodic sweep removes what was orphaned once that member answers again. Flotilla touches
//! only what it made (`e2e_deployment/ownership.rs`): someone else's Service under a
//! deployment's name is left alone, a 64-character name works, a second installation on its own
//! control cluster (`control2`) shares eu1 without either deleting the other's objects, a sweep
//! past its share bound is held until approved, and deleting InferenceCluster eu1 removes all of
//! its 250+ objects (more than one pass) before its finalizer goes, and nothing of another
//! InferenceCluster or installation. Run by `scripts/test-e2e.sh`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod harness;
#[path = "e2e_deployment/ownership.rs"]
mod ownership;
#[path = "e2e_deployment/packing.rs"]
mod packing;
#[path = "e2e_deployment/unschedulable.rs"]
mod unschedulable;

use std::collections::BTreeMap;
use std::time::Duration;

use flotilla_apis::ModelDeployment;
use futures_util::StreamExt;
use harness::apiserver::{apiserver_requests, flotilla_lists_and_writes, grown};
use harness::{ControllerProcess, Fleet, apply, install_crds, wait_for};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::json;

const CTL_ARGS: &[&str] = &[
    "--poll-seconds",
    "3",
    "--member-timeout-seconds",
    "8",
    "--sweep-seconds",
    "3",
    "--sweep-grace-seconds",
    "2",
    "--unschedulable-seconds",
    "5",
    // Every incremental re-plan is also solved whole and compared (none may differ: below).
    "--replan-check-every",
    "1",
];

const MEMBERS: [(&str, &str, &str); 3] =
    [("eu1", "eu-central-1", "EU"), ("eu2", "eu-west-3", "EU"), ("us1", "us-east-1", "US")];

async fn setup_control(fleet: &Fleet, control: &Client) {
    install_crds(control).await;
    for ns in ["flotilla-system", "ml"] {
        let n: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        Api::<Namespace>::all(control.clone()).create(&PostParams::default(), &n).await.unwrap();
    }
    apply(
        control,
        json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceClass", "metadata": {"name": "h100"},
        "spec": {"device": {"driver": "gpu.nvidia.com", "attributes": {"productName": {"string": "NVIDIA H100 80GB HBM3"},
                 "architecture": {"string": "Hopper"}}, "capacity": {"memory": "80Gi"}},
                 "devicesPerNode": 8, "pricePerNodeHour": {"onDemand": "98.32"}}}),
    )
    .await;
    for (name, region, jurisdiction) in MEMBERS {
        let secrets: Api<Secret> = Api::namespaced(control.clone(), "flotilla-system");
        let s: Secret = serde_json::from_value(
            json!({"metadata": {"name": format!("{name}-kubeconfig")}, "stringData": {"kubeconfig": fleet.member_kubeconfig_text(name)}}),
        )
        .unwrap();
        secrets.create(&PostParams::default(), &s).await.unwrap();
        apply(control, json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceCluster", "metadata": {"name": name},
            "spec": {"provider": {"sim": {"cloud": "e2e"}}, "region": region, "jurisdiction": jurisdiction,
                     "credentials": {"secretRef": {"namespace": "flotilla-system", "name": format!("{name}-kubeconfig")}},
                     "endpoint": format!("http://127.0.0.1:1/{name}"),
                     "pools": [{"name": "h100", "class": "h100", "maxNodes": 8, "capacityTypes": ["on-demand"]}]}}))
        .await;
    }
}

fn model(name: &str, replicas: i32, topology: serde_json::Value, placement: serde_json::Value) -> serde_json::Value {
    json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelDeployment", "metadata": {"name": name, "namespace": "ml"},
        "spec": {"model": {"name": name, "source": "hf://org/model"}, "replicas": replicas,
                 "engine": {"image": "vllm/vllm-openai:v0.11.0"}, "topology": topology,
                 "devices": {"alternatives": [{"class": "h100"}]}, "placement": placement}})
}

/// Flotilla's Deployments of one model in one member: name → spec.replicas.
async fn member_deployments(client: &Client, model: &str) -> BTreeMap<String, i32> {
    let lp = ListParams::default().labels(&format!("flotilla.dev/deployment=ml.{model}"));
    Api::<Deployment>::namespaced(client.clone(), "ml")
        .list(&lp)
        .await
        .map(|l| {
            l.items.iter().map(|d| (d.name_any(), d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(0))).collect()
        })
        .unwrap_or_default()
}

/// `Kind namespace/name (owner)` of every Deployment, Service, ResourceClaimTemplate and
/// PodDisruptionBudget with Flotilla's managed-by label, in every namespace of a member.
async fn flotilla_objects(client: &Client) -> Vec<String> {
    let lp = ListParams::default().labels("app.kubernetes.io/managed-by=flotilla");
    let describe = |kind: &str, m: &kube::api::ObjectMeta| {
        let owner = m.labels.as_ref().and_then(|l| l.get("flotilla.dev/deployment")).cloned().unwrap_or_default();
        format!("{kind} {}/{} ({owner})", m.namespace.clone().unwrap_or_default(), m.name.clone().unwrap_or_default())
    };
    let mut out: Vec<String> = Vec::new();
    for d in Api::<Deployment>::all(client.clone()).list_metadata(&lp).await.unwrap().items {
        out.push(describe("Deployment", &d.metadata));
    }
    for d in Api::<k8s_openapi::api::core::v1::Service>::all(client.clone()).list_metadata(&lp).await.unwrap().items {
        out.push(describe("Service", &d.metadata));
    }
    let rcts = Api::<k8s_openapi::api::resource::v1::ResourceClaimTemplate>::all(client.clone());
    for d in rcts.list_metadata(&lp).await.unwrap().items {
        out.push(describe("ResourceClaimTemplate", &d.metadata));
    }
    let pdbs = Api::<k8s_openapi::api::policy::v1::PodDisruptionBudget>::all(client.clone());
    for d in pdbs.list_metadata(&lp).await.unwrap().items {
        out.push(describe("PodDisruptionBudget", &d.metadata));
    }
    out
}

/// `model`'s pods in `ml` of a member, by the deployment label Flotilla puts on them.
async fn model_pods(client: &Client, model: &str) -> kube::Result<Vec<Pod>> {
    let lp = ListParams::default().labels(&format!("flotilla.dev/deployment=ml.{model}"));
    Ok(Api::<Pod>::namespaced(client.clone(), "ml").list(&lp).await?.items)
}

async fn running_pods(client: &Client, model: &str) -> usize {
    model_pods(client, model)
        .await
        .map(|pods| {
            pods.iter().filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).count()
        })
        .unwrap_or(0)
}

/// Waits for an event with `reason` about the ModelDeployment `name` in `ml`.
async fn event_about(
    control: &Client,
    reason: &str,
    name: &str,
    timeout: Duration,
) -> k8s_openapi::api::events::v1::Event {
    wait_for(&format!("a {reason} event about {name}"), timeout, || async {
        let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(control.clone(), "ml")
            .list(&ListParams::default())
            .await
            .ok()?;
        events.items.into_iter().find(|e| {
            e.reason.as_deref() == Some(reason) && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
        })
    })
    .await
}

async fn status_of(api: &Api<ModelDeployment>, name: &str) -> flotilla_apis::ModelDeploymentStatus {
    api.get(name).await.unwrap().status.unwrap_or_default()
}

/// Applies the poison objects and the healthy deployment beside them; returns once each poison
/// object reports `InvalidSpec` and the healthy one is Ready.
async fn poison(control: &Client, api: &Api<ModelDeployment>, members: &BTreeMap<&str, Client>) {
    apply(
        control,
        json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceClass", "metadata": {"name": "h100-poison"},
        "spec": {"device": {"driver": "gpu.nvidia.com", "attributes": {"productName": {"string": "NVIDIA H100 80GB HBM3"}},
                 "capacity": {"memory": "1e400"}}, "devicesPerNode": 8, "pricePerNodeHour": {"onDemand": "1.00"}}}),
    )
    .await;
    let clusters: Api<flotilla_apis::InferenceCluster> = Api::all(control.clone());
    let pools = json!({"spec": {"pools": [
        {"name": "h100", "class": "h100", "maxNodes": 8, "capacityTypes": ["on-demand"]},
        {"name": "poison", "class": "h100-poison", "maxNodes": 1, "capacityTypes": ["on-demand"]}]}});
    clusters.patch("us1", &PatchParams::default(), &Patch::Merge(&pools)).await.unwrap();
    let one = json!({"type": "Standalone", "devicesPerReplica": 1});
    let us = json!({"sovereignty": {"allowedJurisdictions": ["US"]}});
    let memory = r#"device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("80Gi")) >= 0"#;
    let deep = format!("{}true{}", "(".repeat(60), ")".repeat(60));
    let list = format!("[{}]", (0..1000).map(|i| i.to_string()).collect::<Vec<_>>().join(","));
    let costly = format!("{list}.all(a, {list}.all(b, a + b >= 0))");
    let with = |name: &str, alternative: serde_json::Value| {
        let mut m = model(name, 1, one.clone(), us.clone());
        m["spec"]["devices"]["alternatives"] = json!([alternative]);
        m
    };
    for (name, alternative) in [
        ("poison-deep", json!({"class": "h100", "selectors": [deep]})),
        ("poison-cost", json!({"class": "h100", "selectors": [costly]})),
        ("poison-quantity", json!({"class": "h100-poison", "selectors": [memory]})),
        ("sel-model", json!({"selectors": [memory]})),
    ] {
        apply(control, with(name, alternative)).await;
    }
    for name in ["poison-deep", "poison-cost"] {
        wait_for(&format!("{name} refused naming its selector"), Duration::from_secs(60), || async {
            let s = status_of(api, name).await;
            let c = s.conditions.get("Placed")?;
            (c.reason == "InvalidSpec" && c.message.contains("spec.devices.alternatives[0].selectors[0]")).then_some(())
        })
        .await;
    }
    // The poison in a class is the class's own InvalidSpec; the deployment that wants only that
    // class is valid, unplaced, and says why.
    let classes: Api<flotilla_apis::InferenceClass> = Api::all(control.clone());
    wait_for("h100-poison Ready=False InvalidSpec naming its capacity", Duration::from_secs(60), || async {
        let c = classes.get("h100-poison").await.ok()?.status?.conditions.get("Ready")?.clone();
        (c.status == "False" && c.reason == "InvalidSpec" && c.message.contains("spec.device.capacity.memory"))
            .then_some(())
    })
    .await;
    let healthy = classes.get("h100").await.unwrap().status.unwrap_or_default();
    assert!(healthy.conditions.is_true("Ready"), "the healthy class is Ready: {healthy:?}");
    wait_for("poison-quantity unplaced, naming the class's capacity", Duration::from_secs(60), || async {
        let s = status_of(api, "poison-quantity").await;
        let c = s.conditions.get("Placed")?;
        (c.status == "False" && c.message.contains("capacity.memory")).then_some(())
    })
    .await;
    wait_for("sel-model Ready 1/1 beside the poison", Duration::from_secs(60), || async {
        let s = status_of(api, "sel-model").await;
        (s.ready_replicas == 1 && s.conditions.is_true("Ready")).then_some(())
    })
    .await;
    for (member, client) in members {
        for name in ["poison-deep", "poison-cost", "poison-quantity"] {
            assert!(member_deployments(client, name).await.is_empty(), "{name} wrote nothing to {member}");
        }
    }
}

/// The controller's writes of member Deployment `name` that the member's audit log holds.
fn writes_of(fleet: &Fleet, member: &str, name: &str) -> usize {
    let log = fleet.audit_log(member).and_then(|p| std::fs::read_to_string(p).ok()).unwrap_or_default();
    let name = format!("\"name\":\"{name}\"");
    log.lines()
        .filter(|l| l.contains("\"verb\":\"patch\"") && l.contains("\"resource\":\"deployments\"") && l.contains(&name))
        .filter(|l| l.contains(flotilla_controllers::USER_AGENT))
        .count()
}

/// A member that keeps refusing a deployment's objects (an admission policy on us1 denies its
/// Deployment): the deployment says `ApplyFailed`, its writes to us1 back off (2 s, 4 s, 8 s, …
/// at most 12 polls, `deployment/retry.rs`) instead of one every 2 s, the deployments running
/// beside it on us1 stay Ready, and once the policy goes it runs. Deleted at the end.
async fn refusing_member(fleet: &Fleet, control: &Client, api: &Api<ModelDeployment>, us1: &Client) {
    let policy = json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
        "metadata": {"name": "no-refused"},
        "spec": {"failurePolicy": "Fail",
                 "matchConstraints": {"resourceRules": [{"apiGroups": ["apps"], "apiVersions": ["v1"],
                     "operations": ["CREATE", "UPDATE"], "resources": ["deployments"]}]},
                 "validations": [{"expression": "!object.metadata.name.startsWith('refused-')",
                                  "message": "no refused-* Deployments on this member"}]}});
    let binding = json!({"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicyBinding",
        "metadata": {"name": "no-refused"}, "spec": {"policyName": "no-refused", "validationActions": ["Deny"]}});
    apply(us1, policy).await;
    apply(us1, binding).await;
    // The API server enforces a new policy once its informer has it: try until it refuses.
    let probe: Deployment = serde_json::from_value(json!({"metadata": {"name": "refused-probe"},
        "spec": {"selector": {"matchLabels": {"app": "p"}},
                 "template": {"metadata": {"labels": {"app": "p"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}}))
    .unwrap();
    let probes = Api::<Deployment>::namespaced(us1.clone(), "default");
    wait_for("us1 enforces the policy", Duration::from_secs(30), || async {
        let dry = PostParams { dry_run: true, ..Default::default() };
        probes.create(&dry, &probe).await.is_err().then_some(())
    })
    .await;

    apply(
        control,
        model(
            "refused",
            1,
            json!({"type": "Standalone", "devicesPerReplica": 1}),
            json!({"sovereignty": {"allowedJurisdictions": ["US"]}}),
        ),
    )
    .await;
    wait_for("refused says ApplyFailed, naming us1", Duration::from_secs(60), || async {
        let s = status_of(api, "refused").await;
        let c = s.conditions.get("Degraded")?;
        (c.reason == "ApplyFailed" && c.message.contains("us1")).then_some(())
    })
    .await;
    let first = writes_of(fleet, "us1", "refused-h100");
    tokio::time::sleep(Duration::from_secs(30)).await;
    let tries = writes_of(fleet, "us1", "refused-h100") - first;
    eprintln!("refused: {first} writes of refused-h100 until ApplyFailed, {tries} in the next 30 s");
    // Every 2 s is 14 in 30 s (measured with the back-off off); doubling from 2 s is 3 to 5.
    assert!((1..=7).contains(&tries), "{tries} refused writes in 30 s: the retries back off, and do go on");
    for (name, n) in [("us-model", 3), ("sel-model", 1)] {
        let s = status_of(api, name).await;
        assert!(s.ready_replicas == n && s.conditions.is_true("Ready"), "{name} on us1 unaffected: {s:?}");
    }

    // The policy goes: the next try (at most 12 polls of 3 s later) runs it.
    let policies = kube::core::ApiResource::from_gvk(&kube::core::GroupVersionKind::gvk(
        "admissionregistration.k8s.io",
        "v1",
        "ValidatingAdmissionPolicyBinding",
    ));
    Api::<kube::core::DynamicObject>::all_with(us1.clone(), &policies)
        .delete("no-refused", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("refused Ready 1/1 once us1 takes it", Duration::from_secs(90), || async {
        let s = status_of(api, "refused").await;
        (s.ready_replicas == 1 && s.conditions.is_true("Ready")).then_some(())
    })
    .await;
    api.delete("refused", &DeleteParams::default()).await.unwrap();
    wait_for("refused deleted with its member objects", Duration::from_secs(60), || async {
        (api.get_opt("refused").await.ok()?.is_none() && member_deployments(us1, "refused").await.is_empty())
            .then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e harness; run by scripts/test-e2e.sh"]
async fn model_deployment_controller_on_real_api_servers() {
    let fleet = Fleet::up_audited("deploy", &["control", "eu1", "eu2", "us1", "control2"]);
    fleet.gpu_nodes("eu1", "h100", 3, "h100", "eu-central-1");
    fleet.gpu_nodes("eu2", "h100", 1, "h100", "eu-west-3");
    fleet.gpu_nodes("us1", "h100", 2, "h100", "us-east-1");
    let control = fleet.client("control").await;
    let members: BTreeMap<&str, Client> =
        futures_util::future::join_all(MEMBERS.iter().map(|(n, _, _)| async { (*n, fleet.client(n).await) }))
            .await
            .into_iter()
            .collect();
    setup_control(&fleet, &control).await;

    // Something Flotilla did not create, in a namespace it will use: it must survive everything.
    // (The member-rbac example applied in setup_control created the tenant namespace `ml`.)
    let bystander: Deployment = serde_json::from_value(json!({"metadata": {"name": "bystander", "labels": {"app": "bystander"}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "bystander"}},
                 "template": {"metadata": {"labels": {"app": "bystander"}}, "spec": {"containers": [{"name": "c", "image": "x"}]}}}}))
    .unwrap();
    Api::<Deployment>::namespaced(members["eu1"].clone(), "ml")
        .create(&PostParams::default(), &bystander)
        .await
        .unwrap();

    let tp4 = json!({"type": "TensorParallel", "devicesPerReplica": 4});
    apply(
        &control,
        model(
            "eu-model",
            4,
            tp4.clone(),
            json!({"sovereignty": {"allowedJurisdictions": ["EU"]},
        "spread": {"by": "region", "maxSkew": 1}}),
        ),
    )
    .await;
    apply(
        &control,
        model(
            "us-model",
            3,
            json!({"type": "Standalone", "devicesPerReplica": 1}),
            json!({"sovereignty": {"allowedJurisdictions": ["US"]}}),
        ),
    )
    .await;

    // A tenant's model in kube-system (protected): refused, and it must reach no member.
    let mut sys = model(
        "sys-model",
        1,
        json!({"type": "Standalone", "devicesPerReplica": 1}),
        json!({"sovereignty": {"allowedJurisdictions": ["US"]}}),
    );
    sys["metadata"]["namespace"] = json!("kube-system");
    apply(&control, sys).await;

    // Every member's own count of requests before the controller starts (namespaces below).
    let from_start: Vec<_> =
        futures_util::future::join_all(members.values().map(|c| async { apiserver_requests(c).await.unwrap() })).await;
    let mut ctl = ControllerProcess::start(&fleet, "control", "ctl-1", CTL_ARGS);
    let api: Api<ModelDeployment> = Api::namespaced(control.clone(), "ml");
    for (name, n) in [("eu-model", 4), ("us-model", 3)] {
        wait_for(&format!("{name} Ready {n}/{n}"), Duration::from_secs(90), || async {
            let s = status_of(&api, name).await;
            (s.ready_replicas == n && s.conditions.is_true("Ready")).then_some(())
        })
        .await;
    }

    // The kube-system model: InvalidSpec naming the namespace, and nothing of it in any namespace
    // of any member.
    let sys_api: Api<ModelDeployment> = Api::namespaced(control.clone(), "kube-system");
    wait_for("sys-model refused with InvalidSpec", Duration::from_secs(30), || async {
        let s = status_of(&sys_api, "sys-model").await;
        let (placed, ready) = (s.conditions.get("Placed")?, s.conditions.get("Ready")?);
        (placed.reason == "InvalidSpec"
            && ready.reason == "InvalidSpec"
            && placed.status == "False"
            && placed.message.contains("namespace kube-system is protected"))
        .then_some(())
    })
    .await;
    for (name, client) in &members {
        let objects = flotilla_objects(client).await;
        assert!(
            objects.iter().all(|o| !o.contains("kube-system")),
            "nothing of the kube-system model (nor anything in kube-system) in {name}: {objects:?}"
        );
    }
    assert!(status_of(&sys_api, "sys-model").await.placements.is_empty(), "a refused model is not placed");

    // Each member runs exactly what the status (the plan) says; pods Running through kwok.
    let s = status_of(&api, "eu-model").await;
    let placed: BTreeMap<String, i32> = s.placements.iter().map(|p| (p.cluster.clone(), p.desired)).collect();
    assert_eq!(placed, BTreeMap::from([("eu1".into(), 2), ("eu2".into(), 2)]), "spread by region, maxSkew 1");
    assert_eq!(member_deployments(&members["eu1"], "eu-model").await, BTreeMap::from([("eu-model-h100".into(), 2)]));
    assert_eq!(member_deployments(&members["eu2"], "eu-model").await, BTreeMap::from([("eu-model-h100".into(), 2)]));
    assert!(
        member_deployments(&members["us1"], "eu-model").await.is_empty(),
        "the EU model never reaches the US member"
    );
    assert_eq!(running_pods(&members["eu1"], "eu-model").await + running_pods(&members["eu2"], "eu-model").await, 4);
    // The members publish DRA devices: replicas hold ResourceClaims made from Flotilla's
    // template (class identity + the deployment's selectors), allocated by the scheduler.
    let claims = Api::<k8s_openapi::api::resource::v1::ResourceClaim>::namespaced(members["eu1"].clone(), "ml")
        .list(&ListParams::default().labels("flotilla.dev/deployment=ml.eu-model"))
        .await
        .unwrap();
    assert_eq!(claims.items.len(), 2, "one claim per eu1 replica");
    for c in &claims.items {
        let results = c
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref());
        assert_eq!(results.map_or(0, Vec::len), 4, "4 H100s allocated to {:?}", c.metadata.name);
    }
    assert_eq!(running_pods(&members["us1"], "eu-model").await, 0);
    // Each member running eu-model holds one PodDisruptionBudget for its pool: the default
    // budget (maxUnavailable 1) over exactly that pool's pods, as the member's own disruption
    // controller counts them: 2 expected, 2 healthy, 1 eviction allowed.
    for eu in ["eu1", "eu2"] {
        let pdbs = Api::<PodDisruptionBudget>::namespaced(members[eu].clone(), "ml");
        let pdb = wait_for(&format!("{eu}: the budget counts eu-model's 2 pods"), Duration::from_secs(60), || async {
            let p = pdbs.get_opt("eu-model-h100").await.ok()??;
            let s = p.status.clone()?;
            (s.expected_pods == 2 && s.current_healthy == 2 && s.disruptions_allowed == 1).then_some(p)
        })
        .await;
        let spec = pdb.spec.clone().unwrap();
        assert_eq!(spec.max_unavailable, Some(IntOrString::Int(1)), "the default budget");
        assert_eq!(spec.min_available, None);
        assert_eq!(spec.unhealthy_pod_eviction_policy.as_deref(), Some("AlwaysAllow"));
        let selector = spec.selector.and_then(|s| s.match_labels).unwrap_or_default();
        let want: BTreeMap<String, String> = [
            ("app.kubernetes.io/managed-by", "flotilla"),
            ("flotilla.dev/deployment", "ml.eu-model"),
            ("flotilla.dev/pool", "h100"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        assert_eq!(selector, want, "exactly the pool's pods");
        let names: Vec<String> = pdbs
            .list_metadata(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|p| p.metadata.name.unwrap_or_default())
            .collect();
        assert_eq!(names, ["eu-model-h100"], "one budget in {eu}, none for us-model");
    }
    assert!(
        Api::<PodDisruptionBudget>::namespaced(members["us1"].clone(), "ml")
            .get_opt("eu-model-h100")
            .await
            .unwrap()
            .is_none(),
        "no budget where the model does not run"
    );
    assert_eq!(member_deployments(&members["us1"], "us-model").await, BTreeMap::from([("us-model-h100".into(), 3)]));
    for eu in ["eu1", "eu2"] {
        assert!(member_deployments(&members[eu], "us-model").await.is_empty(), "the US model stays in the US");
    }
    packing::replicas_pack_as_planned(&control, &api, &members).await;

    // The fleet fully placed, one deployment scaled down and back: re-planned incrementally
    // (the solver runs the steps the change reaches and reuses the rest), not solved whole.
    let incremental = |ctl: &ControllerProcess| ctl.metric_sum("flotilla_controller_solves_total", "Incremental");
    let before = incremental(&ctl);
    for n in [2, 3] {
        api.patch("us-model", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"replicas": n}}))).await.unwrap();
        wait_for(&format!("us-model Ready {n}/{n}"), Duration::from_secs(60), || async {
            let s = status_of(&api, "us-model").await;
            (s.replicas == n && s.ready_replicas == n && s.conditions.is_true("Ready")).then_some(())
        })
        .await;
    }
    if incremental(&ctl) <= before {
        let all: Vec<_> = Api::<ModelDeployment>::all(control.clone())
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .map(|d| (d.name_any(), d.status.map(|s| (s.replicas, s.unplaced))))
            .collect();
        panic!("a scale of one deployment re-plans incrementally: {all:?}\n{}", ctl.metrics());
    }
    // Each of those re-plans was solved again whole off the reconciles' path, and agreed.
    let checks = |result: &str| ctl.metric_sum("flotilla_controller_replan_checks_total", result);
    wait_for("the re-plans checked against whole solves", Duration::from_secs(30), || async {
        (checks("Same") >= 1.0).then_some(())
    })
    .await;
    assert_eq!(checks("Diverged") + checks("Failed"), 0.0, "no re-plan differs from a whole solve\n{}", ctl.logs());

    // Poison next to the healthy: a selector nested 60 deep, one whose cost passes DRA's
    // budget, and one evaluated on a class whose capacity overflows a Quantity (a pool of it
    // added to us1), beside a healthy deployment whose selector runs on every class, that one
    // included. Each poison object is refused naming its field and gets nothing in any member;
    // the healthy ones are placed and stay Ready; the controller never restarts. They stay for
    // the rest of the test (the quiet-fleet check below covers them too).
    poison(&control, &api, &members).await;
    assert!(ctl.child.try_wait().unwrap().is_none(), "the controller survived the poison objects");
    for (name, n) in [("eu-model", 4), ("us-model", 3)] {
        let s = status_of(&api, name).await;
        assert!(s.ready_replicas == n && s.conditions.is_true("Ready"), "{name} unaffected by the poison: {s:?}");
    }

    // The controller's first sweep of each member lists what its caches do not hold, once: the
    // quiet minute starts after it (a fleet that settles faster than the sweep's period would
    // otherwise count it).
    wait_for("every member swept once", Duration::from_secs(60), || async {
        let logs = ctl.logs();
        let swept =
            |m: &str| logs.lines().any(|l| l.contains("sweep: first pass over the member done") && l.contains(m));
        MEMBERS.iter().all(|(m, _, _)| swept(m)).then_some(())
    })
    .await;

    // Steady state: 60 s without change → no ModelDeployment writes, no member spec writes.
    let generations = |c: Client| async move {
        Api::<Deployment>::namespaced(c, "ml")
            .list(&ListParams::default().labels("app.kubernetes.io/managed-by=flotilla"))
            .await
            .unwrap()
            .items
            .iter()
            .map(|d| (d.name_any(), d.metadata.generation.unwrap_or(0)))
            .collect::<BTreeMap<_, _>>()
    };
    let before: Vec<_> = futures_util::future::join_all(members.values().map(|c| generations(c.clone()))).await;
    // The member API servers count every request they serve: read between this test's own reads.
    let requests_before: Vec<_> =
        futures_util::future::join_all(members.values().map(|c| async { apiserver_requests(c).await.unwrap() })).await;
    let watch_api = api.clone();
    let writes = tokio::spawn(async move {
        let mut n: Vec<String> = Vec::new();
        let mut events = watcher(watch_api, watcher::Config::default()).boxed();
        let deadline = tokio::time::sleep(Duration::from_secs(60));
        tokio::pin!(deadline);
        let mut initial_done = false;
        loop {
            tokio::select! {
                _ = &mut deadline => return n,
                e = events.next() => match e {
                    Some(Ok(watcher::Event::InitDone)) => initial_done = true,
                    Some(Ok(watcher::Event::Apply(o))) if initial_done => {
                        n.push(format!("{} {}", o.name_any(), serde_json::to_string(&o.status).unwrap_or_default()));
                    }
                    _ => {}
                },
            }
        }
    })
    .await
    .unwrap();
    let requests_after: Vec<_> =
        futures_util::future::join_all(members.values().map(|c| async { apiserver_requests(c).await.unwrap() })).await;
    let after: Vec<_> = futures_util::future::join_all(members.values().map(|c| generations(c.clone()))).await;
    assert!(writes.is_empty(), "a quiet fleet writes no ModelDeployment, but saw: {writes:#?}");
    assert_eq!(before, after, "a quiet fleet writes no member workload");
    // Settled deployments cost their members nothing but watches: no LIST and no write of
    // Flotilla's resources in a minute, as the members' own API servers count them.
    for ((name, b), a) in members.keys().zip(&requests_before).zip(&requests_after) {
        let grown = grown(b, a);
        let total: f64 = grown.values().sum();
        let flotilla: f64 = grown
            .iter()
            .filter(|(k, _)| harness::apiserver::MEMBER_DEPLOYMENT_KINDS.iter().any(|r| k.ends_with(&format!(" {r}"))))
            .map(|(_, v)| v)
            .sum();
        eprintln!(
            "quiet minute, member {name}: {total} requests in all, {} on Flotilla's resources: {grown:?}",
            flotilla + 0.0
        );
        let bad = flotilla_lists_and_writes(&grown);
        if !bad.is_empty() {
            // Who sent them, from the member's audit log (LISTs and writes, with User-Agent).
            let audit = fleet.audit_log(name).and_then(|p| std::fs::read_to_string(p).ok()).unwrap_or_default();
            let lists: Vec<&str> = audit.lines().filter(|l| l.contains("\"verb\":\"list\"")).collect();
            panic!(
                "a settled fleet LISTs or writes Flotilla's resources on member {name}: {bad:?}\nits LISTs:\n{}",
                lists.join("\n")
            );
        }
    }

    // Drift: nothing was corrected while nobody touched the members (what the API server
    // defaults or leaves out is not drift: a false alarm would re-apply every reconcile).
    assert!(!ctl.logs().contains("drift corrected"), "no drift in a fleet nobody edited");
    // A hand edit of a member Deployment's image is undone, and said as a Warning event.
    let eu1_deps = Api::<Deployment>::namespaced(members["eu1"].clone(), "ml");
    let image = |d: &Deployment| {
        d.spec.as_ref().and_then(|s| s.template.spec.as_ref()).and_then(|p| p.containers.first()?.image.clone())
    };
    let edit =
        json!({"spec": {"template": {"spec": {"containers": [{"name": "engine", "image": "evil/engine:latest"}]}}}});
    eu1_deps
        .patch(
            "eu-model-h100",
            &PatchParams { field_manager: Some("by-hand".into()), ..Default::default() },
            &Patch::Strategic(&edit),
        )
        .await
        .unwrap();
    wait_for("the hand-edited image restored", Duration::from_secs(60), || async {
        let d = eu1_deps.get("eu-model-h100").await.ok()?;
        (image(&d).as_deref() == Some("vllm/vllm-openai:v0.11.0")).then_some(())
    })
    .await;
    let drift = event_about(&control, "DriftCorrected", "eu-model", Duration::from_secs(30)).await;
    assert_eq!(drift.type_.as_deref(), Some("Warning"));
    let note = drift.note.unwrap_or_default();
    assert!(
        note.contains("eu1") && note.contains("Deployment/eu-model-h100") && note.contains("containers[engine].image"),
        "the event names member, object and field: {note}"
    );
    wait_for("eu-model Ready 4/4 again after the correction", Duration::from_secs(60), || async {
        let s = status_of(&api, "eu-model").await;
        (s.ready_replicas == 4 && s.conditions.is_true("Ready")).then_some(())
    })
    .await;
    // A member's namespace is applied once, not with every workload write: since the start,
    // through placement, rollout, poison and the drift correction just made (a second write of
    // eu1's Deployment), each member counts at most one APPLY of a namespace.
    let until_now: Vec<_> =
        futures_util::future::join_all(members.values().map(|c| async { apiserver_requests(c).await.unwrap() })).await;
    for ((name, b), a) in members.keys().zip(&from_start).zip(&until_now) {
        let applied = grown(b, a).get("APPLY namespaces").copied().unwrap_or(0.0);
        assert!(applied <= 1.0, "member {name}: {applied} namespace applies since the start, want at most 1");
    }
    refusing_member(&fleet, &control, &api, &members["us1"]).await;

    // A replica the member's scheduler refuses moves to another member (unschedulable.rs).
    unschedulable::refused_replica_moves(&control, &api, &members).await;

    // Stop eu2: its replicas move to eu1 (still EU), never to the US; eu1's replicas stay up.
    fleet.stop("eu2");
    let min_eu1 = std::sync::Arc::new(std::sync::atomic::AtomicI32::new(i32::MAX));
    wait_for("eu-model re-placed on eu1", Duration::from_secs(90), || {
        let (api, eu1c, min_eu1) = (api.clone(), members["eu1"].clone(), min_eu1.clone());
        async move {
            let eu1 = member_deployments(&eu1c, "eu-model").await.get("eu-model-h100").copied().unwrap_or(0);
            min_eu1.fetch_min(eu1, std::sync::atomic::Ordering::Relaxed);
            let s = status_of(&api, "eu-model").await;
            let on_eu1 = s.placements.iter().find(|p| p.cluster == "eu1").map_or(0, |p| p.ready);
            (on_eu1 == 4).then_some(())
        }
    })
    .await;
    let min_eu1_replicas = min_eu1.load(std::sync::atomic::Ordering::Relaxed);
    // The member's loss is logged once at WARN, not once per poll or per request.
    let lost = |logs: &str| logs.lines().filter(|l| l.contains("member unreachable") && l.contains("eu2")).count();
    assert_eq!(lost(&ctl.logs()), 1, "one WARN for eu2 going away");
    assert!(!ctl.logs().contains("failed with error"), "no per-request ERROR lines from kube-client");
    assert!(min_eu1_replicas >= 2, "eu1 never went below its 2 serving replicas during the move");
    assert!(member_deployments(&members["us1"], "eu-model").await.is_empty(), "no spill-over to the US on failover");

    // No room left in the EU: the deployment says so, with the solver's reasons, and still
    // nothing goes to the US. eu1 has 3 nodes (6 TP4 replicas), eu2 is down.
    api.patch("eu-model", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"replicas": 9}}))).await.unwrap();
    let placed = wait_for("eu-model reports what it cannot place", Duration::from_secs(60), || async {
        let s = status_of(&api, "eu-model").await;
        let c = s.conditions.get("Placed")?.clone();
        (c.status == "False" && s.unplaced.as_ref().is_some_and(|u| u.replicas == 3)).then_some((c, s))
    })
    .await;
    let (cond, s) = placed;
    assert_eq!(cond.reason, "InsufficientCapacity", "{cond:?}");
    let reasons = &s.unplaced.unwrap().reasons;
    assert!(reasons.iter().any(|r| r.cluster == "us1" && r.reason == "JurisdictionNotAllowed"), "{reasons:?}");
    assert!(reasons.iter().any(|r| r.cluster == "eu2" && r.reason == "ClusterNotReady"), "{reasons:?}");
    assert!(member_deployments(&members["us1"], "eu-model").await.is_empty(), "no spill-over when the EU is full");
    api.patch("eu-model", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"replicas": 4}}))).await.unwrap();
    fleet.start("eu2");
    wait_for("eu2's return logged", Duration::from_secs(60), || async {
        ctl.logs().lines().any(|l| l.contains("member reachable again") && l.contains("eu2")).then_some(())
    })
    .await;
    let logs = ctl.logs();
    assert_eq!(lost(&logs), 1, "still one WARN for eu2 after it came back");
    let back = logs.lines().filter(|l| l.contains("member reachable again") && l.contains("eu2")).count();
    assert_eq!(back, 1, "one INFO for eu2 coming back");

    // Kill the controller mid-rollout and start another: the rollout completes, with exactly one
    // Flotilla Deployment for the model and nothing anywhere else.
    api.patch("us-model", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"replicas": 8}}))).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    ctl.kill();
    let mut ctl = ControllerProcess::start(&fleet, "control", "ctl-2", CTL_ARGS);
    wait_for("us-model Ready 8/8 after the restart", Duration::from_secs(90), || async {
        let s = status_of(&api, "us-model").await;
        (s.ready_replicas == 8 && s.conditions.is_true("Ready")).then_some(())
    })
    .await;
    assert_eq!(member_deployments(&members["us1"], "us-model").await, BTreeMap::from([("us-model-h100".into(), 8)]));
    for eu in ["eu1", "eu2"] {
        assert!(member_deployments(&members[eu], "us-model").await.is_empty(), "no orphan or duplicate in {eu}");
    }

    // An invalid edit (a selector that errors on every device) reports, and tears nothing down.
    let patch = json!({"spec": {"devices": {"alternatives": [{"selectors": ["device.attributes[\"gpu.nvidia.com\"].nosuch == 1"]}]}}});
    api.patch("us-model", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    wait_for("us-model says it cannot be placed", Duration::from_secs(30), || async {
        let s = status_of(&api, "us-model").await;
        let c = s.conditions.get("Placed")?;
        (c.status == "False" && c.message.contains("nosuch")).then_some(())
    })
    .await;
    assert_eq!(running_pods(&members["us1"], "us-model").await, 8, "running replicas are not torn down by the edit");
    // A selector no device satisfies: the same, naming it.
    let patch = json!({"spec": {"devices": {"alternatives": [{"selectors": ["device.attributes[\"gpu.nvidia.com\"].productName == \"NVIDIA B200\""]}]}}});
    api.patch("us-model", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    wait_for("us-model names the selector no device matches", Duration::from_secs(30), || async {
        let s = status_of(&api, "us-model").await;
        let c = s.conditions.get("Placed")?;
        (c.status == "False" && c.message.contains("NVIDIA B200")).then_some(())
    })
    .await;
    assert_eq!(
        running_pods(&members["us1"], "us-model").await,
        8,
        "nothing torn down by a selector that matches nothing"
    );
    // Placement changes were recorded as events on the ModelDeployment.
    let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(control.clone(), "ml")
        .list(&ListParams::default())
        .await
        .unwrap();
    assert!(
        events.items.iter().any(|e| e.reason.as_deref() == Some("PlacementChanged")
            && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("us-model")),
        "a PlacementChanged event for us-model"
    );

    // Flotilla touches only what it made (ownership.rs): a name someone else holds, a long
    // name, two names that meet, a second installation sharing eu1, a sweep past its share bound.
    let install = ownership::install_id(&control).await;
    ownership::name_taken_and_long_name(&control, &api, &members).await;
    ownership::colliding_names(&fleet, &control, &api, &members).await;
    ownership::second_installation(&fleet, &api, &members).await;
    ownership::sweep_held(&ctl, &control, &members, &install).await;

    // Deleting InferenceCluster eu1 (deletionPolicy Cleanup, the default) removes the workloads
    // this installation wrote through it from the member — more than one pass's 200 deletions —
    // before it goes; another InferenceCluster's and another installation's objects there, and
    // the bystander, stay.
    assert!(!member_deployments(&members["eu1"], "eu-model").await.is_empty(), "eu-model runs in eu1 before");
    ownership::plant(&members["eu1"], "bulk", 250, "ml.bulk", &install, "eu1").await;
    ownership::plant(&members["eu1"], "other-ic", 2, "ml.bulk", &install, "eu1-again").await;
    ownership::plant(&members["eu1"], "other-install", 2, "ml.bulk", "e2e-b", "eu1").await;
    let clusters: Api<flotilla_apis::InferenceCluster> = Api::all(control.clone());
    clusters.delete("eu1", &DeleteParams::default()).await.unwrap();
    wait_for("InferenceCluster eu1 gone", Duration::from_secs(90), || async {
        clusters.get_opt("eu1").await.unwrap().is_none().then_some(())
    })
    .await;
    let left = flotilla_objects(&members["eu1"]).await;
    assert_eq!(
        left,
        [
            "Service ml/other-ic-0 (ml.bulk)",
            "Service ml/other-ic-1 (ml.bulk)",
            "Service ml/other-install-0 (ml.bulk)",
            "Service ml/other-install-1 (ml.bulk)"
        ],
        "when the finalizer went, nothing of eu1's was left and nothing else was taken"
    );
    let deps = Api::<Deployment>::namespaced(members["eu1"].clone(), "ml");
    assert!(deps.get_opt("bystander").await.unwrap().is_some(), "objects Flotilla did not create are untouched");

    // us1 stops answering. Deleting eu-model, which never ran there, is not held up by it: every
    // member object of eu-model goes (its eu1 placement's cluster no longer exists).
    fleet.stop("us1");
    wait_for("us1 Reachable=False", Duration::from_secs(60), || async {
        let c = clusters.get("us1").await.ok()?;
        (c.status?.conditions.get("Reachable")?.status == "False").then_some(())
    })
    .await;
    api.delete("eu-model", &DeleteParams::default()).await.unwrap();
    wait_for("eu-model gone with its member objects while us1 is down", Duration::from_secs(60), || async {
        let gone = api.get_opt("eu-model").await.unwrap().is_none();
        (gone && member_deployments(&members["eu2"], "eu-model").await.is_empty()).then_some(())
    })
    .await;
    let svc = Api::<k8s_openapi::api::core::v1::Service>::namespaced(members["eu2"].clone(), "ml");
    assert!(svc.get_opt("eu-model").await.unwrap().is_none(), "the Service went too");

    // us-model runs in us1: its deletion waits, with a condition naming us1, until annotated.
    api.delete("us-model", &DeleteParams::default()).await.unwrap();
    let blocked = wait_for("us-model deletion blocked on us1", Duration::from_secs(60), || async {
        let md = api.get_opt("us-model").await.unwrap()?;
        let c = md.status?.conditions.get("Ready")?.clone();
        (c.reason == "CleanupBlocked").then_some(c)
    })
    .await;
    assert!(blocked.message.contains("us1") && blocked.message.contains("orphan-on-unreachable"), "{blocked:?}");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let md = api.get_opt("us-model").await.unwrap().expect("still there while us1 is down");
    assert_eq!(md.finalizers(), ["flotilla.dev/member-cleanup"], "it keeps its finalizer");
    let orphan = json!({"metadata": {"annotations": {"flotilla.dev/orphan-on-unreachable": "true"}}});
    api.patch("us-model", &PatchParams::default(), &Patch::Merge(&orphan)).await.unwrap();
    wait_for("us-model deleted once annotated", Duration::from_secs(60), || async {
        api.get_opt("us-model").await.unwrap().is_none().then_some(())
    })
    .await;

    // us1 answers again: the periodic sweep removes the objects no ModelDeployment owns now.
    fleet.start("us1");
    // sel-model, the healthy deployment beside the poison objects, still runs there.
    wait_for("the sweep removed us-model's objects from us1", Duration::from_secs(120), || async {
        let left = flotilla_objects(&members["us1"]).await;
        left.iter().all(|o| o.ends_with("(ml.sel-model)")).then_some(())
    })
    .await;
    assert!(
        flotilla_objects(&members["us1"]).await.iter().any(|o| o.ends_with("(ml.sel-model)")),
        "the sweep left the objects of a deployment that exists"
    );
    assert_eq!(flotilla_objects(&members["eu2"]).await, Vec::<String>::new(), "nothing left in eu2");

    ctl.kill();
    let logs = ctl.logs();
    assert!(!logs.contains("client-key-data"), "no credentials in logs");
}
