//! What a tenant's ModelCache may make the controller do, on real API servers, each hostile
//! case beside a healthy neighbour in the same fleet and namespace. `credentialsRef` naming
//! another namespace (the member kubeconfigs') is refused by the CRD; a cache written before the
//! CRD refused it (the rule is lifted for the create, then restored) is refused by the controller
//! with `CredentialsOutsideNamespace`, and no Secret, Job or volume of it appears in any
//! namespace of any member — while the neighbour, whose Secret is in its own namespace, gets its
//! copy and stages to Ready, its staging container with `AWS_EC2_METADATA_DISABLED=true`. Then
//! m3 stops answering: deleting the neighbour (never staged in m3) completes; a cache staged in
//! m3 waits with `CleanupBlocked` naming m3 until annotated
//! `flotilla.dev/orphan-on-unreachable=true`.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use super::harness::try_apply;
use super::*;

const STOLEN: &str = "m1-kubeconfig";

fn with_credentials(name: &str, selector: serde_json::Value, credentials: serde_json::Value) -> serde_json::Value {
    let mut c = cache(name, json!({"clusterSelector": selector}), None);
    c["spec"]["credentialsRef"] = credentials;
    c
}

/// The ModelCache CRD as an older release installed it: `credentialsRef.namespace` allowed.
async fn crd_without_the_namespace_rule(control: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(control.clone());
    let crd = flotilla_apis::crd::all().into_iter().find(|c| c.spec.names.kind == "ModelCache").unwrap();
    let mut v = serde_json::to_value(&crd).unwrap();
    let node = &mut v["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]["credentialsRef"];
    assert!(node["x-kubernetes-validations"].is_array(), "the rule is there to lift: {node}");
    node.as_object_mut().unwrap().remove("x-kubernetes-validations");
    let name = crd.metadata.name.clone().unwrap();
    crds.patch(&name, &PatchParams::apply("flotilla-e2e").force(), &Patch::Apply(&v)).await.unwrap();
}

/// Every Secret in every namespace of a member: `namespace/name` → its data values, decoded.
async fn member_secrets(client: &Client) -> BTreeMap<String, Vec<String>> {
    let all = Api::<Secret>::all(client.clone()).list(&ListParams::default()).await.unwrap();
    all.items
        .into_iter()
        .map(|s| {
            let key = format!("{}/{}", s.namespace().unwrap_or_default(), s.name_any());
            let data = s.data.unwrap_or_default().into_values().map(|b| String::from_utf8_lossy(&b.0).into_owned());
            (key, data.collect())
        })
        .collect()
}

async fn condition(
    api: &Api<ModelCache>,
    name: &str,
    type_: &str,
) -> Option<k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition> {
    api.get(name).await.ok()?.status?.conditions.get(type_).cloned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e harness; run by scripts/test-e2e.sh"]
async fn a_tenants_cache_reaches_only_its_own_rights() {
    let fleet = Fleet::up("cache-trust", &["control", "m1", "m2", "m3"]);
    let control = fleet.client("control").await;
    let mut members: BTreeMap<&str, Client> = BTreeMap::new();
    for m in MEMBERS {
        members.insert(m, fleet.client(m).await);
    }
    setup_control(&fleet, &control).await;
    let token: Secret =
        serde_json::from_value(json!({"metadata": {"name": "hf-token"}, "stringData": {"token": "hf_neighbour"}}))
            .unwrap();
    Api::<Secret>::namespaced(control.clone(), "ml").create(&PostParams::default(), &token).await.unwrap();
    let mut ctl = ControllerProcess::start(
        &fleet,
        "control",
        "ctl",
        &["--poll-seconds", "2", "--member-timeout-seconds", "4", "--tenant-namespaces", "ml"],
    );
    let caches: Api<ModelCache> = Api::namespaced(control.clone(), "ml");
    let stolen = json!({"namespace": "flotilla-system", "name": STOLEN, "key": "kubeconfig"});
    let everywhere = json!({"matchExpressions": [{"key": "tier", "operator": "Exists"}]});

    // 1. The CRD refuses credentialsRef.namespace, naming the field and the fix.
    let refused = try_apply(&control, with_credentials("thief", everywhere.clone(), stolen.clone())).await.unwrap_err();
    assert!(refused.to_string().contains("remove credentialsRef.namespace"), "{refused}");
    assert!(caches.get_opt("thief").await.unwrap().is_none());

    // 2. Written before the CRD refused it: the controller refuses it, reads and copies nothing.
    crd_without_the_namespace_rule(&control).await;
    wait_for("the old CRD takes the cache", Duration::from_secs(30), || async {
        try_apply(&control, with_credentials("thief", everywhere.clone(), stolen.clone())).await.ok()
    })
    .await;
    install_crds(&control).await; // the rule is back; the stored object stays
    apply(
        &control,
        with_credentials("neighbour", json!({"matchLabels": {"tier": "premium"}}), json!({"name": "hf-token"})),
    )
    .await;
    // The neighbour (its Secret in its own namespace) gets its copy and its Job in m1.
    let (job, pod) = staging_pod(&members["m1"], "neighbour").await;
    let copy = Api::<Secret>::namespaced(members["m1"].clone(), "ml").get("flotilla-stage-neighbour-credentials").await;
    assert_eq!(copy.unwrap().data.unwrap()["token"].0, b"hf_neighbour");
    // Its staging container cannot fall back to the node's IAM role.
    let env = job.spec.unwrap().template.spec.unwrap().containers[0].env.clone().unwrap_or_default();
    assert!(env.iter().any(|e| e.name == "AWS_EC2_METADATA_DISABLED" && e.value.as_deref() == Some("true")), "{env:?}");
    // The thief was reconciled (status written, refused or not), several times, before looking.
    wait_for("the thief reconciled", Duration::from_secs(30), || async {
        caches.get("thief").await.ok()?.status.map(|_| ())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(6)).await;
    // What the tenant tried to steal: the member kubeconfig the control cluster holds for m1.
    let stolen_secret = Api::<Secret>::namespaced(control.clone(), "flotilla-system").get(STOLEN).await.unwrap();
    let kubeconfig = String::from_utf8_lossy(&stolen_secret.data.unwrap()["kubeconfig"].0).into_owned();
    assert!(kubeconfig.contains("token:"), "the member identity's kubeconfig: {kubeconfig}");
    for (m, client) in &members {
        let secrets = member_secrets(client).await;
        assert!(
            !secrets.keys().any(|k| k.contains("thief")),
            "{m}: no Secret of the refused cache in any namespace: {:?}",
            secrets.keys()
        );
        for (k, values) in &secrets {
            assert!(!values.iter().any(|v| v == &kubeconfig), "{m}: {k} holds the control cluster's member kubeconfig");
        }
        assert!(jobs(client, "thief").await.is_empty(), "{m}: no staging Job of the refused cache");
        let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), "ml");
        assert!(pvcs.get_opt("flotilla-cache-thief").await.unwrap().is_none(), "{m}: no volume of the refused cache");
    }
    // And says why, and what to change.
    let accepted = wait_for("thief refused", Duration::from_secs(10), || async {
        condition(&caches, "thief", "Accepted").await.filter(|c| c.reason == "CredentialsOutsideNamespace")
    })
    .await;
    assert_eq!(accepted.status, "False");
    assert!(accepted.message.contains("flotilla-system is not the cache's namespace ml"), "{accepted:?}");
    assert_eq!(condition(&caches, "thief", "Ready").await.unwrap().reason, "CredentialsOutsideNamespace");

    set_container(
        &members["m1"],
        &pod,
        terminated(0, &ready_result(&format!("sha256:{}", "a".repeat(64)))),
        "Succeeded",
    )
    .await;
    wait_phase(&caches, "neighbour", "m1", CachePhase::Ready).await;

    // 3. A cache staged in m2 and m3 (Jobs there), then m3 stops answering.
    apply(&control, cache("basic", json!({"clusterSelector": {"matchLabels": {"tier": "basic"}}}), None)).await;
    staging_pod(&members["m2"], "basic").await;
    staging_pod(&members["m3"], "basic").await;
    wait_for("basic lists m2 and m3", Duration::from_secs(30), || async {
        let s = caches.get("basic").await.ok()?.status?;
        (s.clusters.len() == 2).then_some(())
    })
    .await;
    fleet.stop("m3");
    let ics = Api::<flotilla_apis::InferenceCluster>::all(control.clone());
    wait_for("m3 Reachable=False", Duration::from_secs(60), || async {
        (ics.get("m3").await.ok()?.status?.conditions.get("Reachable")?.status == "False").then_some(())
    })
    .await;

    // Deleting the neighbour, which never held anything in m3, completes and cleans m1.
    caches.delete("neighbour", &DeleteParams::default()).await.unwrap();
    wait_for("neighbour gone while m3 is down", Duration::from_secs(45), || async {
        let gone = caches.get_opt("neighbour").await.ok()?.is_none();
        (gone && jobs(&members["m1"], "neighbour").await.is_empty()).then_some(())
    })
    .await;
    let left = member_secrets(&members["m1"]).await;
    assert!(!left.contains_key("ml/flotilla-stage-neighbour-credentials"), "its credentials copy went too");
    // So does the refused cache, which never held anything anywhere.
    caches.delete("thief", &DeleteParams::default()).await.unwrap();
    wait_for("thief gone", Duration::from_secs(45), || async {
        caches.get_opt("thief").await.ok()?.is_none().then_some(())
    })
    .await;

    // The cache staged in m3 waits, naming m3 and the way out, until annotated.
    caches.delete("basic", &DeleteParams::default()).await.unwrap();
    let blocked = wait_for("basic deletion blocked on m3", Duration::from_secs(45), || async {
        condition(&caches, "basic", "Ready").await.filter(|c| c.reason == "CleanupBlocked")
    })
    .await;
    assert!(blocked.message.contains("m3") && blocked.message.contains("orphan-on-unreachable"), "{blocked:?}");
    assert!(!blocked.message.contains("m2"), "m2 was cleaned: {blocked:?}");
    assert!(jobs(&members["m2"], "basic").await.is_empty(), "the reachable member is cleaned meanwhile");
    let orphan = json!({"metadata": {"annotations": {"flotilla.dev/orphan-on-unreachable": "true"}}});
    caches.patch("basic", &PatchParams::default(), &Patch::Merge(&orphan)).await.unwrap();
    wait_for("basic deleted once annotated", Duration::from_secs(45), || async {
        caches.get_opt("basic").await.ok()?.is_none().then_some(())
    })
    .await;
    ctl.kill();
}
