//! Flotilla touches only what it made. A Service someone else created under a ModelDeployment's
//! Service name is left alone byte for byte — the deployment says `NameConflict` naming it, and
//! deleting the deployment leaves it; a 64-character ModelDeployment name works (names and label
//! values within 63). A second installation (its own control cluster `control2`, its own
//! `--install-id`) shares member eu1 with the first: its ModelDeployment of the same
//! namespace/name is refused the first's Service (`NameConflict`, another installation), and
//! neither its prune, its sweep, its deletion of that deployment nor the `Cleanup` deletion of its
//! own InferenceCluster `eu1` touches the first's objects, while the first's sweep leaves the
//! second's. A sweep that would delete most of a member's objects is held (`SweepHeld` event,
//! `member_sweeps_total{outcome="Held"}`) until `flotilla.dev/approve-sweep` approves it. Two
//! deployments whose names meet in one member (`pair` on pool `x-zz`, `pair-x` on `zz`) both
//! serve: the younger's workloads end in its `status.workloadSuffix`, and keep it when the older goes.

use k8s_openapi::api::core::v1::Service;

use super::*;

/// The first installation's id: its control cluster's `kube-system` UID (the default).
pub async fn install_id(control: &Client) -> String {
    Api::<Namespace>::all(control.clone()).get("kube-system").await.unwrap().metadata.uid.unwrap()
}

/// Creates `n` Services `<prefix>-<i>` in `ml` of a member, labelled as Flotilla's objects of
/// ModelDeployment `owner`, written by installation `install` through InferenceCluster `cluster`.
pub async fn plant(member: &Client, prefix: &str, n: usize, owner: &str, install: &str, cluster: &str) {
    let svc = Api::<Service>::namespaced(member.clone(), "ml");
    let work = (0..n).map(|i| {
        let svc = svc.clone();
        async move {
            let s: Service = serde_json::from_value(json!({"metadata": {"name": format!("{prefix}-{i}"),
                "labels": {"app.kubernetes.io/managed-by": "flotilla", "flotilla.dev/deployment": owner,
                           "flotilla.dev/install": install, "flotilla.dev/cluster": cluster},
                "annotations": {"flotilla.dev/rendered-hash": "0"}},
                "spec": {"clusterIP": "None", "selector": {"flotilla.dev/deployment": owner}, "ports": [{"port": 80}]}}))
            .unwrap();
            svc.create(&PostParams::default(), &s).await.unwrap();
        }
    });
    // A few at a time: one member API server serves them all.
    let mut work = futures_util::stream::iter(work).buffer_unordered(16);
    while work.next().await.is_some() {}
}

/// How many Services `<prefix>-*` a member's `ml` holds.
pub async fn planted(member: &Client, prefix: &str) -> usize {
    let l = Api::<Service>::namespaced(member.clone(), "ml").list_metadata(&ListParams::default()).await.unwrap();
    l.items.iter().filter(|s| s.metadata.name.as_deref().is_some_and(|n| n.starts_with(&format!("{prefix}-")))).count()
}

/// `uid/resourceVersion` of an object: unchanged means not written.
fn version(m: &kube::api::ObjectMeta) -> String {
    format!("{}/{}", m.uid.clone().unwrap_or_default(), m.resource_version.clone().unwrap_or_default())
}

async fn condition(
    api: &Api<ModelDeployment>,
    name: &str,
    type_: &str,
) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    api.get_opt(name).await.ok()??.status?.conditions.get(type_).cloned()
}

/// Someone else's Service under the deployment's Service name; a 64-character name.
pub async fn name_taken_and_long_name(control: &Client, api: &Api<ModelDeployment>, members: &BTreeMap<&str, Client>) {
    let eu = json!({"sovereignty": {"allowedJurisdictions": ["EU"]}});
    let one = json!({"type": "Standalone", "devicesPerReplica": 1});
    // Another team's Service named like the deployment, in both EU members (either may get it).
    let mut before = BTreeMap::new();
    for m in ["eu1", "eu2"] {
        let s: Service = serde_json::from_value(json!({"metadata": {"name": "taken", "labels": {"team": "search"}},
            "spec": {"selector": {"app": "search"}, "ports": [{"name": "grpc", "port": 9000}]}}))
        .unwrap();
        let s = Api::<Service>::namespaced(members[m].clone(), "ml").create(&PostParams::default(), &s).await.unwrap();
        before.insert(m, (version(&s.metadata), serde_json::to_value(&s).unwrap()));
    }
    apply(control, model("taken", 1, one.clone(), eu.clone())).await;
    let c = wait_for("taken says NameConflict naming the Service", Duration::from_secs(60), || async {
        let c = condition(api, "taken", "Ready").await?;
        (c.reason == "NameConflict").then_some(c)
    })
    .await;
    assert_eq!(c.status, "False", "someone else's Service serves nothing of it: {c:?}");
    assert!(c.message.contains("Service ml/taken") && c.message.contains("not created by Flotilla"), "{c:?}");
    let degraded = condition(api, "taken", "Degraded").await.unwrap();
    assert_eq!((degraded.status.as_str(), degraded.reason.as_str()), ("True", "NameConflict"));
    // Its other objects were written: the replica runs where it was placed.
    let placed = status_of(api, "taken").await.placements.first().map(|p| p.cluster.clone()).unwrap();
    assert_eq!(member_deployments(&members[placed.as_str()], "taken").await.len(), 1, "its Deployment runs");
    api.delete("taken", &DeleteParams::default()).await.unwrap();
    wait_for("taken deleted with its own objects", Duration::from_secs(60), || async {
        let gone = api.get_opt("taken").await.unwrap().is_none();
        (gone && member_deployments(&members[placed.as_str()], "taken").await.is_empty()).then_some(())
    })
    .await;
    for (m, (v, whole)) in &before {
        let s = Api::<Service>::namespaced(members[m].clone(), "ml").get("taken").await.unwrap();
        assert_eq!(&version(&s.metadata), v, "the other team's Service in {m} was never written");
        assert_eq!(&serde_json::to_value(&s).unwrap(), whole, "byte for byte");
        Api::<Service>::namespaced(members[m].clone(), "ml").delete("taken", &DeleteParams::default()).await.unwrap();
    }
    // The neighbour is unharmed (it may still be settling from the outage phases before: wait).
    wait_for("the neighbour eu-model Ready", Duration::from_secs(90), || async {
        status_of(api, "eu-model").await.conditions.is_true("Ready").then_some(())
    })
    .await;

    // A 64-character name (a valid Kubernetes name; a label value may hold 63).
    let long = format!("long-{}", "n".repeat(59));
    assert_eq!(long.len(), 64);
    apply(control, model(&long, 1, one, eu)).await;
    wait_for("the 64-character deployment Ready 1/1", Duration::from_secs(60), || async {
        let s = status_of(api, &long).await;
        (s.ready_replicas == 1 && s.conditions.is_true("Ready")).then_some(())
    })
    .await;
    let placed = status_of(api, &long).await.placements.first().map(|p| p.cluster.clone()).unwrap();
    let objects: Vec<String> =
        flotilla_objects(&members[placed.as_str()]).await.into_iter().filter(|o| o.contains("long-nnn")).collect();
    assert_eq!(objects.len(), 4, "Deployment, Service, claim template and budget: {objects:?}");
    for o in &objects {
        let name = o.split_whitespace().nth(1).unwrap().split('/').nth(1).unwrap();
        // The claim template is `<workload>-gpus`, a DNS subdomain.
        let max = if o.starts_with("ResourceClaimTemplate") { 68 } else { 63 };
        assert!(name.len() <= max, "{o}");
    }
    api.delete(&long, &DeleteParams::default()).await.unwrap();
    wait_for("the 64-character deployment gone with its objects", Duration::from_secs(60), || async {
        let gone = api.get_opt(&long).await.unwrap().is_none();
        let left = flotilla_objects(&members[placed.as_str()]).await.into_iter().any(|o| o.contains("long-nnn"));
        (gone && !left).then_some(())
    })
    .await;
}

/// `pair` on pool `x-zz` and, younger, `pair-x` on pool `zz` (each pool with its own node and
/// class, so nothing else moves), both in eu2: both would write `pair-x-zz`.
pub async fn colliding_names(
    fleet: &Fleet,
    control: &Client,
    api: &Api<ModelDeployment>,
    members: &BTreeMap<&str, Client>,
) {
    let eu2 = &members["eu2"];
    for (pool, class) in [("x-zz", "h100x"), ("zz", "h100y")] {
        fleet.gpu_nodes("eu2", "h100", 1, pool, "eu-west-3");
        apply(control, json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceClass", "metadata": {"name": class},
            "spec": {"device": {"driver": "gpu.nvidia.com", "attributes": {"productName": {"string": "NVIDIA H100 80GB HBM3"},
                     "architecture": {"string": "Hopper"}}, "capacity": {"memory": "80Gi"}},
                     "devicesPerNode": 8, "pricePerNodeHour": {"onDemand": "98.32"}}}))
        .await;
    }
    let clusters: Api<flotilla_apis::InferenceCluster> = Api::all(control.clone());
    let patch = json!({"metadata": {"labels": {"e2e/pair": "here"}}, "spec": {"pools": [
        {"name": "h100", "class": "h100", "maxNodes": 8, "capacityTypes": ["on-demand"]},
        {"name": "x-zz", "class": "h100x", "maxNodes": 1, "capacityTypes": ["on-demand"]},
        {"name": "zz", "class": "h100y", "maxNodes": 1, "capacityTypes": ["on-demand"]}]}});
    clusters.patch("eu2", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    let one = json!({"type": "Standalone", "devicesPerReplica": 1});
    let here = json!({"clusterSelector": {"matchLabels": {"e2e/pair": "here"}}});
    let mut pair = model("pair", 1, one.clone(), here.clone());
    pair["spec"]["devices"]["alternatives"] = json!([{"class": "h100x"}]);
    apply(control, pair).await;
    wait_for("pair Ready 1/1", Duration::from_secs(60), || async {
        let s = status_of(api, "pair").await;
        (s.ready_replicas == 1 && s.conditions.is_true("Ready")).then_some(())
    })
    .await;
    let mut pair_x = model("pair-x", 1, one, here);
    pair_x["spec"]["devices"]["alternatives"] = json!([{"class": "h100y"}]);
    apply(control, pair_x).await;
    let suffix = wait_for("pair-x Ready 1/1 with a suffix", Duration::from_secs(60), || async {
        let s = status_of(api, "pair-x").await;
        (s.ready_replicas == 1 && s.conditions.is_true("Ready")).then_some(s.workload_suffix?)
    })
    .await;
    assert_eq!(suffix.len(), 8, "{suffix}");
    assert_eq!(status_of(api, "pair").await.workload_suffix, None, "the older keeps its names");
    let older = member_deployments(eu2, "pair").await;
    let younger = member_deployments(eu2, "pair-x").await;
    assert_eq!(older.keys().collect::<Vec<_>>(), ["pair-x-zz"], "{older:?}");
    let suffixed = format!("pair-x-zz-{suffix}");
    assert_eq!(younger.keys().collect::<Vec<_>>(), [&suffixed], "{younger:?}");
    // The older goes; the younger's workloads keep their names (the same objects).
    let kept = versions(eu2, "pair-x").await;
    api.delete("pair", &DeleteParams::default()).await.unwrap();
    wait_for("pair gone with its objects", Duration::from_secs(60), || async {
        let gone = api.get_opt("pair").await.unwrap().is_none();
        (gone && member_deployments(eu2, "pair").await.is_empty()).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await; // reconciles after the change
    assert_eq!(status_of(api, "pair-x").await.workload_suffix.as_deref(), Some(suffix.as_str()));
    let uids = |m: &BTreeMap<String, String>| -> BTreeMap<String, String> {
        m.iter().map(|(k, v)| (k.clone(), v.split('/').next().unwrap().to_string())).collect()
    };
    assert_eq!(uids(&versions(eu2, "pair-x").await), uids(&kept), "nothing of pair-x renamed or re-created");
    api.delete("pair-x", &DeleteParams::default()).await.unwrap();
    wait_for("pair-x gone with its objects", Duration::from_secs(60), || async {
        let gone = api.get_opt("pair-x").await.unwrap().is_none();
        (gone && versions(eu2, "pair-x").await.is_empty()).then_some(())
    })
    .await;
    let patch =
        json!({"spec": {"pools": [{"name": "h100", "class": "h100", "maxNodes": 8, "capacityTypes": ["on-demand"]}]}});
    clusters.patch("eu2", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
}

/// Member objects of ModelDeployment `ml.<model>` in `ml` of a member: `Kind/name` →
/// `uid/resourceVersion`.
async fn versions(member: &Client, model: &str) -> BTreeMap<String, String> {
    let lp = ListParams::default().labels(&format!("flotilla.dev/deployment=ml.{model}"));
    let mut out = BTreeMap::new();
    for d in Api::<Deployment>::namespaced(member.clone(), "ml").list_metadata(&lp).await.unwrap().items {
        out.insert(format!("Deployment/{}", d.name_any()), version(&d.metadata));
    }
    for s in Api::<Service>::namespaced(member.clone(), "ml").list_metadata(&lp).await.unwrap().items {
        out.insert(format!("Service/{}", s.name_any()), version(&s.metadata));
    }
    for p in Api::<PodDisruptionBudget>::namespaced(member.clone(), "ml").list_metadata(&lp).await.unwrap().items {
        out.insert(format!("PodDisruptionBudget/{}", p.name_any()), version(&p.metadata));
    }
    out
}

/// A second installation on its own control cluster shares member eu1 with the first.
pub async fn second_installation(fleet: &Fleet, api: &Api<ModelDeployment>, members: &BTreeMap<&str, Client>) {
    let eu1 = &members["eu1"];
    // One node of its own in eu1 (pool b: the first installation's pool h100 does not see it).
    fleet.gpu_nodes("eu1", "h100", 1, "b", "eu-central-1");
    let control2 = fleet.client("control2").await;
    install_crds(&control2).await;
    for ns in ["flotilla-system", "ml"] {
        let n: Namespace = serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap();
        Api::<Namespace>::all(control2.clone()).create(&PostParams::default(), &n).await.unwrap();
    }
    apply(&control2, json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceClass", "metadata": {"name": "h100"},
        "spec": {"device": {"driver": "gpu.nvidia.com", "attributes": {"productName": {"string": "NVIDIA H100 80GB HBM3"},
                 "architecture": {"string": "Hopper"}}, "capacity": {"memory": "80Gi"}},
                 "devicesPerNode": 8, "pricePerNodeHour": {"onDemand": "98.32"}}}))
    .await;
    let s: Secret = serde_json::from_value(
        json!({"metadata": {"name": "eu1-kubeconfig"}, "stringData": {"kubeconfig": fleet.kubeconfig_text("eu1")}}),
    )
    .unwrap();
    Api::<Secret>::namespaced(control2.clone(), "flotilla-system").create(&PostParams::default(), &s).await.unwrap();
    // The same InferenceCluster name, the same ModelDeployment namespace/name as the first's.
    apply(
        &control2,
        json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceCluster", "metadata": {"name": "eu1"},
        "spec": {"provider": {"sim": {"cloud": "e2e"}}, "region": "eu-central-1", "jurisdiction": "EU",
                 "credentials": {"secretRef": {"namespace": "flotilla-system", "name": "eu1-kubeconfig"}},
                 "endpoint": "http://127.0.0.1:1/eu1",
                 "pools": [{"name": "b", "class": "h100", "maxNodes": 1, "capacityTypes": ["on-demand"]}]}}),
    )
    .await;
    let one = json!({"type": "Standalone", "devicesPerReplica": 1});
    for m in ["eu-model", "b-model"] {
        apply(&control2, model(m, 1, one.clone(), json!({}))).await;
    }
    let before = versions(eu1, "eu-model").await;
    assert!(before.contains_key("Service/eu-model"), "the first installation's eu-model runs in eu1: {before:?}");
    let mut args = CTL_ARGS.to_vec();
    args.extend(["--install-id", "e2e-b"]);
    let mut ctl_b = ControllerProcess::start(fleet, "control2", "ctl-b", &args);
    let api2: Api<ModelDeployment> = Api::namespaced(control2.clone(), "ml");
    wait_for("the second installation's b-model Ready 1/1", Duration::from_secs(90), || async {
        let s = status_of(&api2, "b-model").await;
        (s.ready_replicas == 1 && s.conditions.is_true("Ready")).then_some(())
    })
    .await;
    let c = wait_for("its eu-model refused the first's Service", Duration::from_secs(60), || async {
        let c = condition(&api2, "eu-model", "Ready").await?;
        (c.reason == "NameConflict").then_some(c)
    })
    .await;
    assert!(c.message.contains("Service ml/eu-model") && c.message.contains("another Flotilla installation"), "{c:?}");
    assert!(member_deployments(eu1, "eu-model").await.contains_key("eu-model-b"), "its own Deployment is written");
    let b_objects = versions(eu1, "b-model").await;
    assert_eq!(b_objects.len(), 3, "{b_objects:?}");
    // Its eu-model deleted: its prune takes its own objects only.
    api2.delete("eu-model", &DeleteParams::default()).await.unwrap();
    wait_for("the second's eu-model gone", Duration::from_secs(60), || async {
        let gone = api2.get_opt("eu-model").await.unwrap().is_none();
        (gone && !member_deployments(eu1, "eu-model").await.contains_key("eu-model-b")).then_some(())
    })
    .await;
    // Several sweep periods of both installations (3 s, grace 2 s): neither takes the other's.
    tokio::time::sleep(Duration::from_secs(10)).await;
    let after: BTreeMap<String, String> =
        versions(eu1, "eu-model").await.into_iter().filter(|(k, _)| !k.ends_with("-b")).collect();
    let before: BTreeMap<String, String> = before.into_iter().filter(|(k, _)| !k.ends_with("-b")).collect();
    for (k, v) in &before {
        // uid kept: never deleted (the first installation may have re-applied, not the second).
        assert_eq!(after.get(k).map(|a| a.split('/').next()), Some(v.split('/').next()), "{k} of the first kept");
    }
    assert_eq!(
        versions(eu1, "b-model").await.keys().collect::<Vec<_>>(),
        b_objects.keys().collect::<Vec<_>>(),
        "the first installation's sweep left the second's b-model"
    );
    wait_for("the first's eu-model Ready", Duration::from_secs(90), || async {
        status_of(api, "eu-model").await.conditions.is_true("Ready").then_some(())
    })
    .await;
    // The second deletes its InferenceCluster eu1 (Cleanup): its objects go, the first's stay.
    Api::<flotilla_apis::InferenceCluster>::all(control2.clone())
        .delete("eu1", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the second's eu1 gone with its b-model objects", Duration::from_secs(60), || async {
        let gone =
            Api::<flotilla_apis::InferenceCluster>::all(control2.clone()).get_opt("eu1").await.unwrap().is_none();
        (gone && versions(eu1, "b-model").await.is_empty()).then_some(())
    })
    .await;
    let kept = versions(eu1, "eu-model").await;
    for k in before.keys() {
        assert!(kept.contains_key(k), "{k} of the first installation kept after the second's cluster cleanup");
    }
    ctl_b.kill();
    assert!(!ctl_b.logs().contains("client-key-data"), "no credentials in logs");
}

/// Planted orphans past the share bound: held, said, approved, swept; the owned ones stay.
pub async fn sweep_held(ctl: &ControllerProcess, control: &Client, members: &BTreeMap<&str, Client>, install: &str) {
    let eu1 = &members["eu1"];
    let owned = versions(eu1, "eu-model").await;
    plant(eu1, "ghost", 12, "ml.ghost", install, "eu1").await;
    let events = Api::<k8s_openapi::api::events::v1::Event>::all(control.clone());
    // A pass may see part of the burst first (creation times have whole seconds, the grace
    // period starts from them): its event says fewer; the one for all twelve follows, its own.
    let held = wait_for("a SweepHeld event on InferenceCluster eu1 for all 12", Duration::from_secs(60), || async {
        events.list(&ListParams::default()).await.ok()?.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("SweepHeld")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("eu1")
                && e.note.as_deref().is_some_and(|n| n.contains("delete 12 of the"))
        })
    })
    .await;
    let note = held.note.unwrap_or_default();
    assert!(note.contains("delete 12 of the") && note.contains("flotilla.dev/approve-sweep=12"), "{note}");
    assert!(ctl.metric_sum("flotilla_controller_member_sweeps_total", "outcome=\"Held\"") >= 1.0);
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(planted(eu1, "ghost").await, 12, "held: nothing deleted");
    let clusters: Api<flotilla_apis::InferenceCluster> = Api::all(control.clone());
    let approve = json!({"metadata": {"annotations": {"flotilla.dev/approve-sweep": "12"}}});
    clusters.patch("eu1", &PatchParams::default(), &Patch::Merge(&approve)).await.unwrap();
    wait_for("the approved sweep removed the orphans", Duration::from_secs(30), || async {
        (planted(eu1, "ghost").await == 0).then_some(())
    })
    .await;
    assert!(ctl.metric_sum("flotilla_controller_member_sweeps_total", "outcome=\"Approved\"") >= 1.0);
    let unapprove = json!({"metadata": {"annotations": {"flotilla.dev/approve-sweep": null}}});
    clusters.patch("eu1", &PatchParams::default(), &Patch::Merge(&unapprove)).await.unwrap();
    let now = versions(eu1, "eu-model").await;
    for k in owned.keys() {
        assert!(now.contains_key(k), "{k}, owned, kept by the sweep");
    }
}
