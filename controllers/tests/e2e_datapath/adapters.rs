//! LoRA adapters end to end (docs/gateway.md, adapters): one base deployment with a replica in
//! eu1 (EU) and one in us1 (US), and two adapters, `support-eu` (EU only) and `support-all`,
//! each staged by its own ModelCache (the test plays the staging program, `harness::staging`).
//! Asserted: the EU-only adapter's cache is never staged in us1, and us1's rendered workload and
//! route carry no trace of it; `status.adapters` says where each adapter is served and why not
//! elsewhere; requests for an adapter reach a replica that loads and serves it, the EU-only one
//! only in eu1 — and when eu1's engine is saturated and then down, its requests fail with an
//! error instead of going to us1, whose engine never loads or serves it (asked directly, us1's
//! member router refuses to load it too); the base model and the other adapter keep answering.

use flotilla_apis::deployment::AdapterWaitReason;
use flotilla_enginesim::config::Fault;
use harness::staging;
use k8s_openapi::api::apps::v1::Deployment;

use super::*;

const DIGEST_EU: &str = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
const DIGEST_ALL: &str = "sha256:2222222222222222222222222222222222222222222222222222222222222222";

fn adapter_cache(name: &str, digest: &str) -> Value {
    json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelCache", "metadata": {"name": name, "namespace": "ml"},
        "spec": {"source": format!("hf://org/{name}"), "size": "1Gi", "digest": digest,
                 "targets": {"deployments": ["chat"]}}})
}

/// `chat`, one replica per member, with its two adapters.
fn chat_with_adapters() -> Value {
    let mut md = model("chat", 2, json!({"spread": {"by": "cluster", "maxSkew": 1}}));
    md["spec"]["adapters"] = json!([
        {"name": "support-eu", "cacheRef": "support-eu", "sovereignty": {"allowedJurisdictions": ["EU"]}},
        {"name": "support-all", "cacheRef": "support-all"}
    ]);
    md
}

/// The member Deployment of `chat`, once its pod template mounts exactly `adapters` and its
/// rollout is done.
async fn rolled_out_with(fleet: &Fleet, member: &str, adapters: &[&str]) -> Deployment {
    let api: Api<Deployment> = Api::namespaced(fleet.client(member).await, "ml");
    let lp = ListParams::default().labels("flotilla.dev/deployment=ml.chat");
    wait_for(&format!("chat in {member} rolled out mounting {adapters:?}"), Duration::from_secs(120), || async {
        let d = api.list(&lp).await.ok()?.items.into_iter().next()?;
        let text = serde_json::to_string(&d.spec.as_ref()?.template).ok()?;
        let mounted = ["support-eu", "support-all"].into_iter().filter(|a| text.contains(&format!("/adapters/{a}")));
        let status = d.status.as_ref()?;
        let done = status.updated_replicas == Some(1) && status.replicas == Some(1) && status.ready_replicas == Some(1);
        (done && mounted.collect::<Vec<_>>() == adapters).then_some(d)
    })
    .await
}

/// `(served clusters, waiting (cluster, reason))` of one adapter in the deployment's status.
async fn adapter_status(
    api: &Api<ModelDeployment>,
    name: &str,
) -> Option<(Vec<String>, Vec<(String, AdapterWaitReason)>)> {
    let status = api.get("chat").await.ok()?.status?;
    let a = status.adapters.into_iter().find(|a| a.name == name)?;
    Some((a.clusters, a.waiting.into_iter().map(|w| (w.cluster, w.reason)).collect()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e harness; run by scripts/test-e2e.sh"]
async fn an_eu_only_adapter_is_staged_loaded_and_served_only_in_the_eu() {
    let _range = LocalPodRange::add();
    let fleet = Fleet::up("adapters", &["control", "eu1", "us1"]);
    let routers = members_with_routers(&fleet).await;
    let control = control_with_members(&fleet, &routers).await;
    apply(&control, adapter_cache("support-eu", DIGEST_EU)).await;
    apply(&control, adapter_cache("support-all", DIGEST_ALL)).await;
    let _ctl =
        ControllerProcess::start(&fleet, "control", "ctl-1", &["--poll-seconds", "3", "--member-timeout-seconds", "8"]);
    let (gw, _state, control_tasks) = fleet_gateway(&fleet).await;
    let http = harness::http::Client::new();
    apply(&control, chat_with_adapters()).await;

    // Staging: the shared adapter in both members, the EU-only one in eu1 alone.
    let (eu1, us1) = (fleet.client("eu1").await, fleet.client("us1").await);
    staging::stage_ready(&eu1, "support-eu", "hf://org/support-eu", DIGEST_EU).await;
    staging::stage_ready(&eu1, "support-all", "hf://org/support-all", DIGEST_ALL).await;
    staging::stage_ready(&us1, "support-all", "hf://org/support-all", DIGEST_ALL).await;
    let mds: Api<ModelDeployment> = Api::namespaced(control.clone(), "ml");
    wait_for("status.adapters says where each adapter is served", Duration::from_secs(90), || async {
        let eu = adapter_status(&mds, "support-eu").await?;
        let all = adapter_status(&mds, "support-all").await?;
        (eu == (vec!["eu1".to_string()], vec![("us1".to_string(), AdapterWaitReason::OutsidePolicy)])
            && all == (vec!["eu1".to_string(), "us1".to_string()], vec![]))
            .then_some(())
    })
    .await;
    assert!(staging::jobs(&us1, "support-eu").await.is_empty(), "the EU-only adapter is never staged in us1");

    // Each member's workload mounts what it may load; us1's carries no trace of support-eu.
    rolled_out_with(&fleet, "eu1", &["support-eu", "support-all"]).await;
    let us_workload = rolled_out_with(&fleet, "us1", &["support-all"]).await;
    assert!(!serde_json::to_string(&us_workload).unwrap().contains("support-eu"), "{us_workload:?}");
    for (member, client, want) in [("eu1", &eu1, vec!["support-all", "support-eu"]), ("us1", &us1, vec!["support-all"])]
    {
        let route = httproutes(client, "ml").get("chat").await.unwrap();
        let annotations = route.metadata.annotations.clone().unwrap_or_default();
        let listed: BTreeMap<String, String> =
            serde_json::from_str(annotations.get("flotilla.dev/adapters").map(String::as_str).unwrap_or("{}")).unwrap();
        assert_eq!(listed.keys().map(String::as_str).collect::<Vec<_>>(), want, "{member}'s route");
    }

    let mut engines = BTreeMap::new();
    engines_for_pods(&fleet, "eu1", "chat", 1, &mut engines).await;
    engines_for_pods(&fleet, "us1", "chat", 1, &mut engines).await;
    let sim_in =
        |member: &str| engines.values().find(|(m, _, _)| m == member).map(|(_, _, s)| s.state.clone()).unwrap();
    let (eu_sim, us_sim) = (sim_in("eu1"), sim_in("us1"));

    for m in ["chat", "support-eu", "support-all"] {
        wait_for(&format!("{m} answered through the fleet gateway"), Duration::from_secs(120), || async {
            (chat(&http, &gw, m).await.0 == 200).then_some(())
        })
        .await;
    }
    for _ in 0..6 {
        for m in ["chat", "support-eu", "support-all"] {
            let (status, body) = chat(&http, &gw, m).await;
            assert_eq!(status, 200, "{m}: {body}");
        }
    }
    let eu_counters = eu_sim.lora_counters("support-eu");
    assert!(eu_counters.requests >= 6 && eu_counters.loads >= 1, "eu1 loaded and served support-eu: {eu_counters:?}");
    assert!(us_sim.lora_counters("support-all").requests + eu_sim.lora_counters("support-all").requests >= 6);

    // The fleet's model list names each adapter with its base.
    let (status, list) = http.get_with(&format!("{gw}/v1/models"), &[]).await;
    assert_eq!(status, 200, "{list}");
    let models: Value = serde_json::from_str(&list).unwrap();
    let parent =
        |id: &str| models["data"].as_array().unwrap().iter().find(|m| m["id"] == id).map(|m| m["parent"].clone());
    assert_eq!(parent("support-eu"), Some(json!("chat")), "{list}");
    assert_eq!(parent("support-all"), Some(json!("chat")), "{list}");

    // eu1 saturated (every request gets 429), then down: the EU-only adapter fails, never to us1.
    eu_sim.set_fault(Some(Fault::RateLimit(Some(1))), None);
    for _ in 0..4 {
        let (status, body) = chat(&http, &gw, "support-eu").await;
        assert_ne!(status, 200, "support-eu answered while its only allowed engine is saturated: {body}");
    }
    eu_sim.set_fault(None, None);
    eu_sim.set_engine_down(Some(Duration::from_secs(600)));
    for _ in 0..4 {
        let (status, body) = chat(&http, &gw, "support-eu").await;
        assert_ne!(status, 200, "support-eu answered while its only allowed engine is down: {body}");
    }
    for m in ["chat", "support-all"] {
        wait_for(&format!("{m} still answered, from us1"), Duration::from_secs(60), || async {
            (chat(&http, &gw, m).await.0 == 200).then_some(())
        })
        .await;
    }
    assert!(
        us_sim.requests().iter().all(|r| r.model != "support-eu"),
        "no request for support-eu ever reached us1's engine through the fleet gateway"
    );
    // Asked directly (past the fleet gateway), us1's member router does not load an adapter its
    // route does not list: the engine, which has no such adapter, refuses the request.
    let direct = routers["us1"].url.clone();
    let body = json!({"model": "support-eu", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2});
    let (status, answer) =
        http.post_json_with(&format!("{direct}/v1/chat/completions"), &body, &[(HEADER, "ml/chat")]).await;
    assert_ne!(status, 200, "us1's router served the EU-only adapter: {answer}");
    let us = us_sim.lora_counters("support-eu");
    assert_eq!((us.loads, us.requests, us.load_failures, us.load_refused), (0, 0, 0, 0), "us1 never loaded support-eu");
    assert!(us_sim.loaded_loras().iter().all(|l| l.name != "support-eu"));
    assert!(staging::jobs(&us1, "support-eu").await.is_empty(), "still never staged in us1");
    for (member, router) in &routers {
        let log = std::fs::read_to_string(&router.log).unwrap_or_default();
        assert!(!log.contains("panicked"), "router {member} panicked:\n{log}");
    }
    control_tasks.stop().await;
}
