//! The fleet gateway fed by a real control cluster: a control cluster and three members (two
//! EU, one US) with kwok GPU nodes, `flotilla-controller` placing replicas, engine simulators
//! playing each member's entry point, and the gateway in control-cluster mode. Applying a
//! ModelDeployment makes its model routable; keys from a Secret narrow models and
//! jurisdictions and are limited and revoked without a restart; a failing entry point and
//! then a stopped member move traffic with zero failed requests while `Serving` says what
//! happened; deleting the deployment drops the model; a quiet fleet makes no writes. Two
//! deployments of one model name split its traffic by `spec.routing.weight`
//! (`e2e_gateway/weighted.rs`). Then on the same fleet, autoscaling and scale to zero
//! (`e2e_gateway/autoscale.rs`). Run by `scripts/test-e2e.sh`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "e2e_gateway/autoscale.rs"]
mod autoscale;
mod harness;
#[path = "e2e_gateway/weighted.rs"]
mod weighted;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use flotilla_apis::{InferenceCluster, ModelDeployment};
use flotilla_enginesim::{Fault, SimConfig, SimHandle};
use flotilla_gateway::keys::{hex, sha256};
use flotilla_gateway::{AppState, GatewayConfig, feed};
use harness::http::{self as reqwest_lite, Answer};
use harness::{ControllerProcess, Fleet, apply, install_crds, wait_for};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::api::{DeleteParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

const MEMBERS: [(&str, &str, &str); 3] =
    [("eu1", "eu-central-1", "EU"), ("eu2", "eu-west-3", "EU"), ("us1", "us-east-1", "US")];
const MODELS: [&str; 3] = ["chat-eu", "chat-us", "chat-any"];

async fn sim(name: &str) -> SimHandle {
    let c = SimConfig {
        name: name.into(),
        // The weighted model of `e2e_gateway/weighted.rs` and the autoscaled ones of
        // `e2e_gateway/autoscale.rs` too.
        models: MODELS.iter().chain([&weighted::MODEL, &"chat-auto", &"chat-zero"]).map(|m| m.to_string()).collect(),
        ttft_ms: 2,
        itl_ms: 1,
        ..SimConfig::default()
    };
    flotilla_enginesim::spawn(c).await.unwrap()
}

fn keys_secret(entries: &[(&str, &str, &str)]) -> Secret {
    let mut doc = String::from("keys:\n");
    for (id, key, extra) in entries {
        doc.push_str(&format!("  - {{id: {id}, sha256: {}{extra}}}\n", hex(&sha256(key.as_bytes()))));
    }
    serde_json::from_value(json!({"metadata": {"name": "gateway-keys", "namespace": "flotilla-system",
        "labels": {"flotilla.dev/api-keys": "true"}}, "stringData": {"keys.yaml": doc}}))
    .unwrap()
}

async fn setup_control(fleet: &Fleet, control: &Client, sims: &BTreeMap<&str, SimHandle>) {
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
    let secrets: Api<Secret> = Api::namespaced(control.clone(), "flotilla-system");
    for (name, region, jurisdiction) in MEMBERS {
        let s: Secret = serde_json::from_value(
            json!({"metadata": {"name": format!("{name}-kubeconfig")}, "stringData": {"kubeconfig": fleet.member_kubeconfig_text(name)}}),
        )
        .unwrap();
        secrets.create(&PostParams::default(), &s).await.unwrap();
        apply(control, json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceCluster", "metadata": {"name": name},
            "spec": {"provider": {"sim": {"cloud": "e2e"}}, "region": region, "jurisdiction": jurisdiction,
                     "credentials": {"secretRef": {"namespace": "flotilla-system", "name": format!("{name}-kubeconfig")}},
                     "endpoint": sims[name].url(),
                     "pools": [{"name": "h100", "class": "h100", "maxNodes": 8, "capacityTypes": ["on-demand"]}]}}))
        .await;
    }
    let keys = keys_secret(&[
        ("eu-team", "sk-eu", ", jurisdictions: [EU]"),
        ("small", "sk-small", ", models: [chat-any], requestsPerMinute: 3"),
        ("ops", "sk-ops", ""),
    ]);
    secrets.create(&PostParams::default(), &keys).await.unwrap();
}

fn model(name: &str, replicas: i32, placement: Value) -> Value {
    json!({"apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelDeployment", "metadata": {"name": name, "namespace": "ml"},
        "spec": {"model": {"name": name, "source": "hf://org/model"}, "replicas": replicas,
                 "engine": {"image": "vllm/vllm-openai:v0.11.0"}, "topology": {"type": "Standalone", "devicesPerReplica": 1},
                 "devices": {"alternatives": [{"class": "h100"}]}, "placement": placement}})
}

struct Gw {
    url: String,
    state: Arc<AppState>,
    control: Option<feed::ControlTasks>,
    server: tokio::task::JoinHandle<()>,
}

async fn gateway(fleet: &Fleet) -> Gw {
    gateway_with(fleet, |_| {}).await
}

async fn gateway_with(fleet: &Fleet, tweak: impl FnOnce(&mut GatewayConfig)) -> Gw {
    let mut cfg = GatewayConfig::with_table("unused");
    cfg.config = None;
    cfg.control_cluster = true;
    cfg.kubeconfig = Some(fleet.kubeconfig("control"));
    cfg.keys_namespace = Some("flotilla-system".into());
    cfg.identity = Some("gw-1".into());
    cfg.feedback_interval_ms = 2000;
    cfg.scrape_interval_ms = 500;
    cfg.connect_timeout_ms = 300;
    cfg.request_timeout_ms = 3000;
    cfg.backoff_base_ms = 20;
    cfg.breaker_failures = 3;
    cfg.breaker_open_ms = 2000;
    cfg.autoscale_interval_ms = 1000;
    tweak(&mut cfg);
    let state = AppState::load(cfg).unwrap();
    let client = feed::client(&state).await.unwrap();
    let control = feed::start_control(state.clone(), client).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let st = state.clone();
    let server = tokio::spawn(async move {
        flotilla_gateway::serve::run(listener, st, std::future::pending()).await.unwrap();
    });
    Gw { url, state, control: Some(control), server }
}

async fn call(http: &reqwest_lite::Client, url: &str, model: &str, key: Option<&str>) -> Answer {
    http.chat(url, model, key).await
}

async fn model_ids(http: &reqwest_lite::Client, url: &str) -> Vec<String> {
    let (status, text) = http.get(&format!("{url}/v1/models"), Some("sk-ops")).await;
    assert_eq!(status, 200, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    v["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_string()).collect()
}

async fn serving(api: &Api<ModelDeployment>, name: &str) -> Option<(String, String, String)> {
    let md = api.get(name).await.ok()?;
    let c = md.status?.conditions.get("Serving")?.clone();
    Some((c.status, c.reason, c.message))
}

fn requests_to(sims: &BTreeMap<&str, SimHandle>, name: &str, model: &str) -> usize {
    sims[name].state.requests().iter().filter(|r| r.model == model).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the e2e harness; run by scripts/test-e2e.sh"]
async fn gateway_fed_by_the_control_cluster() {
    let fleet = Fleet::up("gateway", &["control", "eu1", "eu2", "us1"]);
    fleet.gpu_nodes("eu1", "h100", 1, "h100", "eu-central-1");
    fleet.gpu_nodes("eu2", "h100", 1, "h100", "eu-west-3");
    fleet.gpu_nodes("us1", "h100", 1, "h100", "us-east-1");
    let control = fleet.client("control").await;
    let mut sims = BTreeMap::new();
    for (name, _, _) in MEMBERS {
        sims.insert(name, sim(name).await);
    }
    setup_control(&fleet, &control, &sims).await;
    let _ctl =
        ControllerProcess::start(&fleet, "control", "ctl-1", &["--poll-seconds", "3", "--member-timeout-seconds", "8"]);
    let mut gw = gateway(&fleet).await;
    let http = reqwest_lite::Client::new();
    let api: Api<ModelDeployment> = Api::namespaced(control.clone(), "ml");

    wait_for("the gateway's first sync", Duration::from_secs(30), || async {
        let (status, text) = http.get(&format!("{}/readyz", gw.url), None).await;
        (text.contains("in sync") || status == 200).then_some(())
    })
    .await;
    assert!(model_ids(&http, &gw.url).await.is_empty(), "nothing is deployed yet");
    // Every member observed before anything is placed: a deployment solved while a member has
    // no status yet goes elsewhere first and moves later (make-before-break), which this test
    // is not about (placement/tests/solver.rs: spread_rebalances_when_more_domains_become_eligible).
    let clusters: Api<InferenceCluster> = Api::all(control.clone());
    for (name, _, _) in MEMBERS {
        wait_for(&format!("{name} Ready"), Duration::from_secs(60), || async {
            let ic = clusters.get(name).await.ok()?;
            let ready = ic.status?.conditions.get("Ready")?.status == "True";
            ready.then_some(())
        })
        .await;
    }

    // Apply: routable within seconds of the replicas being Ready.
    let applied = Instant::now();
    apply(
        &control,
        model(
            "chat-eu",
            2,
            json!({"sovereignty": {"allowedJurisdictions": ["EU"]}, "spread": {"by": "cluster", "maxSkew": 1}}),
        ),
    )
    .await;
    apply(&control, model("chat-us", 1, json!({"sovereignty": {"allowedJurisdictions": ["US"]}}))).await;
    apply(&control, model("chat-any", 3, json!({"spread": {"by": "cluster", "maxSkew": 1}}))).await;
    for m in MODELS {
        wait_for(&format!("{m} routable through the gateway"), Duration::from_secs(90), || async {
            (call(&http, &gw.url, m, Some("sk-ops")).await.status == 200).then_some(())
        })
        .await;
    }
    eprintln!("all three models routable {:.1}s after apply", applied.elapsed().as_secs_f64());
    assert_eq!(model_ids(&http, &gw.url).await, ["chat-any", "chat-eu", "chat-us"]);
    for m in MODELS {
        wait_for(&format!("{m} Serving=True Routable"), Duration::from_secs(30), || async {
            serving(&api, m).await.filter(|(s, r, _)| s == "True" && r == "Routable")
        })
        .await;
    }
    // Spread by cluster: served through all three once each replica is Ready there.
    wait_for("chat-any Serving through eu1, eu2 and us1", Duration::from_secs(60), || async {
        let (_, _, msg) = serving(&api, "chat-any").await?;
        (msg.contains("eu1") && msg.contains("eu2") && msg.contains("us1")).then_some(())
    })
    .await;

    // Two deployments of one model name split its traffic 90/10 (e2e_gateway/weighted.rs).
    weighted::ninety_ten(&control, &api, &gw.url, &sims).await;

    // Keys from the Secret: the EU key is refused the US-only model, and its requests for an
    // unrestricted model never reach the US cluster.
    let us_before = requests_to(&sims, "us1", "chat-any");
    let r = call(&http, &gw.url, "chat-us", Some("sk-eu")).await;
    assert_eq!((r.status, r.body["error"]["code"].as_str()), (403, Some("jurisdiction_not_allowed")), "{:?}", r.body);
    for _ in 0..24 {
        let r = call(&http, &gw.url, "chat-any", Some("sk-eu")).await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert!(r.cluster.starts_with("eu"), "EU key served by {}", r.cluster);
    }
    assert_eq!(requests_to(&sims, "us1", "chat-any"), us_before, "the EU key never reached us1");
    assert_eq!(call(&http, &gw.url, "chat-eu", Some("sk-nope")).await.status, 401);
    assert_eq!(call(&http, &gw.url, "chat-eu", Some("sk-small")).await.status, 403);
    for _ in 0..3 {
        assert_eq!(call(&http, &gw.url, "chat-any", Some("sk-small")).await.status, 200);
    }
    let r = call(&http, &gw.url, "chat-any", Some("sk-small")).await;
    assert_eq!(r.status, 429, "{:?}", r.body);
    assert!(
        r.retry_after.as_deref().and_then(|s| s.parse::<u64>().ok()).is_some_and(|s| s >= 1),
        "{:?}",
        r.retry_after
    );
    // Revoke the EU key by rewriting the Secret: refused within seconds, no restart.
    let secrets: Api<Secret> = Api::namespaced(control.clone(), "flotilla-system");
    let rotated =
        keys_secret(&[("small", "sk-small", ", models: [chat-any], requestsPerMinute: 3"), ("ops", "sk-ops", "")]);
    secrets.replace("gateway-keys", &PostParams::default(), &rotated).await.unwrap();
    wait_for("the revoked key refused", Duration::from_secs(15), || async {
        (call(&http, &gw.url, "chat-eu", Some("sk-eu")).await.status == 401).then_some(())
    })
    .await;
    assert_eq!(call(&http, &gw.url, "chat-eu", Some("sk-ops")).await.status, 200);

    // Steady load on chat-eu while eu1's entry point fails, then while eu1 itself is stopped.
    let stop = Arc::new(AtomicBool::new(false));
    let (ok, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let mut load = Vec::new();
    for _ in 0..4 {
        let (stop, ok, failed, url) = (stop.clone(), ok.clone(), failed.clone(), gw.url.clone());
        load.push(tokio::spawn(async move {
            let http = reqwest_lite::Client::new();
            while !stop.load(Ordering::Relaxed) {
                let r = http.chat(&url, "chat-eu", Some("sk-ops")).await;
                if r.status == 200 { &ok } else { &failed }.fetch_add(1, Ordering::Relaxed);
                if r.status != 200 {
                    eprintln!("failed request: {} {:?}", r.status, r.body);
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }));
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    sims["eu1"].state.set_fault(Some(Fault::Reset), None);
    let degraded = wait_for("chat-eu Serving=True Degraded naming eu1", Duration::from_secs(30), || async {
        serving(&api, "chat-eu").await.filter(|(s, r, m)| s == "True" && r == "Degraded" && m.contains("eu1"))
    })
    .await;
    eprintln!("Serving while eu1's entry point fails: {degraded:?}");
    let eu2_before = requests_to(&sims, "eu2", "chat-eu");
    fleet.stop("eu1");
    // The controller sees eu1 unreachable; the table drops it; Serving names only eu2.
    let (_, _, msg) = wait_for("chat-eu Serving=True Routable through eu2 only", Duration::from_secs(90), || async {
        serving(&api, "chat-eu").await.filter(|(s, r, m)| s == "True" && r == "Routable" && !m.contains("eu1"))
    })
    .await;
    assert!(msg.contains("eu2"), "{msg}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, Ordering::Relaxed);
    for t in load {
        t.await.unwrap();
    }
    let (ok, failed) = (ok.load(Ordering::Relaxed), failed.load(Ordering::Relaxed));
    eprintln!("steady load through the failover: {ok} ok, {failed} failed");
    assert!(ok > 100, "the load ran ({ok} requests)");
    assert_eq!(failed, 0, "zero failed non-streaming requests through the failover");
    assert!(requests_to(&sims, "eu2", "chat-eu") > eu2_before, "eu2 took the traffic");
    assert_eq!(requests_to(&sims, "us1", "chat-eu"), 0, "the EU model never reached the US, not even on failover");

    // Delete: /v1/models drops the model within seconds.
    api.delete("chat-eu", &DeleteParams::default()).await.unwrap();
    wait_for("chat-eu gone from /v1/models", Duration::from_secs(20), || async {
        (!model_ids(&http, &gw.url).await.contains(&"chat-eu".to_string())).then_some(())
    })
    .await;
    assert_eq!(call(&http, &gw.url, "chat-eu", Some("sk-ops")).await.status, 404);

    // Quiet: no Serving writes and no ModelDeployment changes over 60 s.
    wait_for("chat-any settled after the failover", Duration::from_secs(90), || async {
        let md = api.get("chat-any").await.ok()?;
        let s = md.status?;
        (s.ready_replicas == 3 && s.conditions.is_true("Ready") && s.conditions.is_true("Serving")).then_some(())
    })
    .await;
    tokio::time::sleep(Duration::from_secs(5)).await;
    let writes = |st: &AppState| {
        st.metrics
            .render()
            .lines()
            .filter(|l| l.starts_with("flotilla_gateway_status_writes_total"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>()
    };
    let versions = || async {
        let mut v = BTreeMap::new();
        for m in ["chat-us", "chat-any"] {
            v.insert(m, api.get(m).await.unwrap().metadata.resource_version.unwrap());
        }
        v
    };
    let (w0, v0) = (writes(&gw.state), versions().await);
    tokio::time::sleep(Duration::from_secs(60)).await;
    let (w1, v1) = (writes(&gw.state), versions().await);
    assert!(w0 > 0.0, "the gateway did write Serving before");
    assert_eq!(w0, w1, "no Serving writes in 60 s of quiet");
    assert_eq!(v0, v1, "no ModelDeployment changed in 60 s of quiet");

    autoscale::scenario(&fleet, &control, &sims, &gw).await;

    gw.server.abort();
    if let Some(c) = gw.control.take() {
        c.stop().await;
    }
}
