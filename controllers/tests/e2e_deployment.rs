//! The ModelDeployment controller on real API servers: a control cluster and three members
//! (two EU, one US) with kwok GPU nodes. Each member gets exactly the Deployments the plan
//! says and their pods go Running; the EU-sovereign model has nothing in the US member; a
//! quiet fleet makes no writes; a member Deployment edited by hand is restored with a
//! `DriftCorrected` event; a stopped member's replicas are re-placed in the EU with
//! make-before-break, its loss and return logged once each; deleting a ModelDeployment removes every member object it created and
//! nothing else. Run by `scripts/test-e2e.sh`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod harness;

use std::collections::BTreeMap;
use std::time::Duration;

use flotilla_apis::ModelDeployment;
use futures_util::StreamExt;
use harness::{ControllerProcess, Fleet, apply, install_crds, wait_for};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Api, Client, ResourceExt};
use serde_json::json;

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
            json!({"metadata": {"name": format!("{name}-kubeconfig")}, "stringData": {"kubeconfig": fleet.kubeconfig_text(name)}}),
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

async fn running_pods(client: &Client, model: &str) -> usize {
    let lp = ListParams::default().labels(&format!("flotilla.dev/deployment=ml.{model}"));
    Api::<Pod>::namespaced(client.clone(), "ml")
        .list(&lp)
        .await
        .map(|l| {
            l.items.iter().filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")).count()
        })
        .unwrap_or(0)
}

async fn status_of(api: &Api<ModelDeployment>, name: &str) -> flotilla_apis::ModelDeploymentStatus {
    api.get(name).await.unwrap().status.unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e harness; run by scripts/test-e2e.sh"]
async fn model_deployment_controller_on_real_api_servers() {
    let fleet = Fleet::up("deploy", &["control", "eu1", "eu2", "us1"]);
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
    let ml: Namespace = serde_json::from_value(json!({"metadata": {"name": "ml"}})).unwrap();
    Api::<Namespace>::all(members["eu1"].clone()).create(&PostParams::default(), &ml).await.unwrap();
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

    let mut ctl =
        ControllerProcess::start(&fleet, "control", "ctl-1", &["--poll-seconds", "3", "--member-timeout-seconds", "8"]);
    let api: Api<ModelDeployment> = Api::namespaced(control.clone(), "ml");
    for (name, n) in [("eu-model", 4), ("us-model", 3)] {
        wait_for(&format!("{name} Ready {n}/{n}"), Duration::from_secs(90), || async {
            let s = status_of(&api, name).await;
            (s.ready_replicas == n && s.conditions.is_true("Ready")).then_some(())
        })
        .await;
    }

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
    assert_eq!(member_deployments(&members["us1"], "us-model").await, BTreeMap::from([("us-model-h100".into(), 3)]));
    for eu in ["eu1", "eu2"] {
        assert!(member_deployments(&members[eu], "us-model").await.is_empty(), "the US model stays in the US");
    }

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
    let after: Vec<_> = futures_util::future::join_all(members.values().map(|c| generations(c.clone()))).await;
    assert!(writes.is_empty(), "a quiet fleet writes no ModelDeployment, but saw: {writes:#?}");
    assert_eq!(before, after, "a quiet fleet writes no member workload");

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
    let drift = wait_for("a DriftCorrected event", Duration::from_secs(30), || async {
        let events = Api::<k8s_openapi::api::events::v1::Event>::namespaced(control.clone(), "ml")
            .list(&ListParams::default())
            .await
            .ok()?;
        events.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("DriftCorrected")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("eu-model")
        })
    })
    .await;
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
    let mut ctl =
        ControllerProcess::start(&fleet, "control", "ctl-2", &["--poll-seconds", "3", "--member-timeout-seconds", "8"]);
    wait_for("us-model Ready 8/8 after the restart", Duration::from_secs(90), || async {
        let s = status_of(&api, "us-model").await;
        (s.ready_replicas == 8 && s.conditions.is_true("Ready")).then_some(())
    })
    .await;
    assert_eq!(member_deployments(&members["us1"], "us-model").await, BTreeMap::from([("us-model-h100".into(), 8)]));
    for eu in ["eu1", "eu2"] {
        assert!(member_deployments(&members[eu], "us-model").await.is_empty(), "no orphan or duplicate in {eu}");
    }

    // Delete: every member object of eu-model goes; the bystander and us-model stay.
    api.delete("eu-model", &DeleteParams::default()).await.unwrap();
    wait_for("eu-model gone with its member objects", Duration::from_secs(90), || async {
        let gone = api.get_opt("eu-model").await.unwrap().is_none();
        let eu1 = member_deployments(&members["eu1"], "eu-model").await.is_empty();
        let eu2 = member_deployments(&members["eu2"], "eu-model").await.is_empty();
        (gone && eu1 && eu2).then_some(())
    })
    .await;
    let svc = Api::<k8s_openapi::api::core::v1::Service>::namespaced(members["eu1"].clone(), "ml");
    assert!(svc.get_opt("eu-model").await.unwrap().is_none(), "the Service went too");
    let deps = Api::<Deployment>::namespaced(members["eu1"].clone(), "ml");
    assert!(deps.get_opt("bystander").await.unwrap().is_some(), "objects Flotilla did not create are untouched");
    assert_eq!(member_deployments(&members["us1"], "us-model").await.len(), 1, "other deployments are untouched");

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
    ctl.kill();
    let logs = ctl.logs();
    assert!(!logs.contains("client-key-data"), "no credentials in logs");
}
