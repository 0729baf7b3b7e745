//! LoRA adapters through the fleet gateway, against simulators that serve the adapter on every
//! cluster: an EU-only adapter is answered in the EU and never reaches the US cluster — not when
//! the EU clusters fail, are down or saturated, not even though the routing file lists the US
//! cluster for it and its base model's failover and fallback go there. `/v1/models` lists
//! adapters with their `parent`, an API key allows one only by its own name, and the request
//! metric names a declared adapter and nothing else.

mod common;

use std::time::Duration;

use common::*;
use flotilla_enginesim::config::StaticLora;
use flotilla_enginesim::{Fault, SimHandle};
use flotilla_gateway::keys::{hex, sha256};
use flotilla_gateway::{RoutingTable, fleet};
use serde_json::json;

const ADAPTER: &str = "sql-lora";

/// A simulator serving `llama` (and `llama-us`), with the adapters loaded on `llama`: any
/// cluster could answer any adapter, so only the gateway keeps them where they belong.
async fn engine(name: &str) -> SimHandle {
    sim(name, &["llama", "llama-us"], |c| {
        c.lora.loras = [ADAPTER, "chat-lora", "new-lora"]
            .iter()
            .map(|a| StaticLora { name: a.to_string(), base: "llama".into() })
            .collect();
    })
    .await
}

/// The base may be served anywhere and falls back to a US model; the adapter is EU only, yet the
/// file lists the US cluster among its routes (as its parent's).
fn table(eu1: &SimHandle, eu2: &SimHandle, us: &SimHandle) -> String {
    format!(
        "{}models:
  - {{name: llama, fallbacks: [llama-us], routes: [{{cluster: eu1}}, {{cluster: eu2}}, {{cluster: us1}}]}}
  - {{name: llama-us, routes: [{{cluster: us1}}]}}
  - {{name: {ADAPTER}, parent: llama, sovereignty: {{allowedJurisdictions: [EU]}}, routes: [{{cluster: eu1}}, {{cluster: eu2}}, {{cluster: us1}}]}}
",
        clusters_yaml(&[("eu1", eu1.url(), "EU"), ("eu2", eu2.url(), "EU"), ("us1", us.url(), "US")])
    )
}

/// Nothing of the adapter reached `us`: no logged request, none served, none refused.
fn untouched(us: &SimHandle) {
    let leaked: Vec<String> =
        us.state.requests().iter().filter(|r| r.model != "llama").map(|r| r.model.clone()).collect();
    assert!(leaked.iter().all(|m| m == "llama-us"), "the US engine saw {leaked:?}");
    assert!(!leaked.iter().any(|m| m == ADAPTER), "the EU adapter reached the US");
    assert_eq!(us.state.lora_counters(ADAPTER).requests, 0, "the US engine served the adapter");
    assert_eq!(us.state.refused(), 0);
}

#[tokio::test]
async fn an_eu_adapter_never_reaches_the_us_even_when_the_eu_fails_is_down_or_saturated() {
    let (eu1, eu2, us) = (engine("eu1").await, engine("eu2").await, engine("us1").await);
    let gw = gateway(&table(&eu1, &eu2, &us), |c| c.routing = flotilla_gateway::config::RoutingMode::RoundRobin).await;
    let url = gw.url("/v1/chat/completions");

    // Healthy: answered in the EU, the body forwarded as the client sent it.
    for i in 0..12 {
        let body =
            if i % 2 == 0 { chat(ADAPTER, &format!("q {i}")) } else { chat_stream(ADAPTER, &format!("q {i}"), false) };
        let r = post(&url, &body).await;
        assert_eq!(r.status, 200, "{}", r.text);
        assert!(["eu1", "eu2"].contains(&r.cluster().as_str()), "{}", r.cluster());
        assert_eq!(r.header("x-flotilla-model"), ADAPTER);
    }
    let served = eu1.state.lora_counters(ADAPTER).requests + eu2.state.lora_counters(ADAPTER).requests;
    assert_eq!(served, 12, "each EU engine served the adapter by its name");
    assert!(eu1.state.requests().iter().chain(&eu2.state.requests()).all(|r| r.model == ADAPTER));
    untouched(&us);

    // Every EU engine fails: the adapter gets an error, the base fails over to the US.
    for s in [&eu1, &eu2] {
        s.state.set_fault(Some(Fault::Error503), None);
    }
    for body in [chat(ADAPTER, "failing"), chat_stream(ADAPTER, "failing", true)] {
        let r = post(&url, &body).await;
        assert!(r.status == 502 || r.status == 503, "{}: {}", r.status, r.text);
        let message = r.json()["error"]["message"].as_str().unwrap_or_default().to_string();
        assert!(message.contains(ADAPTER), "the error names the adapter: {message}");
        assert!(r.cluster().is_empty());
    }
    let r = post(&url, &chat("llama", "failing")).await;
    assert_eq!((r.status, r.cluster().as_str()), (200, "us1"), "the base's failover goes to the US: {}", r.text);
    untouched(&us);

    // Every EU engine down (connections closed): the same.
    for s in [&eu1, &eu2] {
        s.state.set_fault(None, None);
        s.state.set_engine_down(Some(Duration::from_secs(60)));
    }
    let r = post(&url, &chat(ADAPTER, "down")).await;
    assert!(r.status == 502 || r.status == 503, "{}: {}", r.status, r.text);
    assert!(eu1.state.refused() + eu2.state.refused() >= 1, "the EU was tried");
    untouched(&us);

    // Every EU engine saturated (429, Retry-After beyond the bound): 429 for the client.
    for s in [&eu1, &eu2] {
        s.state.set_engine_down(None);
        s.state.set_fault(Some(Fault::RateLimit(Some(30))), None);
    }
    let r = post(&url, &chat(ADAPTER, "busy")).await;
    assert_eq!(r.status, 429, "{}", r.text);
    assert!(!r.header("retry-after").is_empty());
    let r = post(&url, &chat("llama", "busy")).await;
    assert_eq!((r.status, r.cluster().as_str()), (200, "us1"), "{}", r.text);
    untouched(&us);
    assert!(us.state.requests().iter().any(|r| r.model == "llama"), "the US engine was up and reachable throughout");
}

fn inference_cluster(
    name: &str,
    juris: &str,
    url: &str,
) -> serde_json::Result<flotilla_apis::cluster::InferenceCluster> {
    let v = json!({
        "apiVersion": "flotilla.dev/v1alpha1", "kind": "InferenceCluster", "metadata": {"name": name},
        "spec": {"provider": {"static": {"site": "lab"}}, "region": format!("{}-1", juris.to_lowercase()),
                 "jurisdiction": juris, "endpoint": url, "pools": []},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "X", "message": "m",
                    "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    });
    serde_json::from_value(v)
}

/// `ml/llama`, served anywhere and falling back to `llama-us`, Ready on every cluster; its EU
/// adapter's status (stale) lists the US cluster too, `chat-lora` is staged on eu1 only and
/// `new-lora` nowhere yet.
fn llama_deployment() -> serde_json::Result<flotilla_apis::deployment::ModelDeployment> {
    let placements: Vec<serde_json::Value> = ["eu1", "eu2", "us1"]
        .iter()
        .map(|c| json!({"cluster": c, "pool": "p", "class": "h100", "capacityType": "on-demand", "fallbackRank": 1, "desired": 1, "ready": 1}))
        .collect();
    let v = json!({
        "apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelDeployment",
        "metadata": {"name": "llama", "namespace": "ml", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"model": {"name": "llama", "source": "hf://o/m"}, "replicas": 3, "engine": {"image": "vllm"},
                 "topology": {"type": "Standalone", "devicesPerReplica": 1}, "devices": {"alternatives": [{"class": "h100"}]},
                 "routing": {"fallbackModels": ["llama-us"]},
                 "adapters": [{"name": ADAPTER, "cacheRef": "c1", "sovereignty": {"allowedJurisdictions": ["EU"]}},
                              {"name": "chat-lora", "cacheRef": "c2"}, {"name": "new-lora", "cacheRef": "c3"}]},
        "status": {"placements": placements, "adapters": [
            {"name": ADAPTER, "clusters": ["eu1", "eu2", "us1"]}, {"name": "chat-lora", "clusters": ["eu1"]}]}
    });
    serde_json::from_value(v)
}

#[tokio::test]
async fn from_the_fleet_an_adapter_goes_only_where_it_is_staged_and_allowed() {
    let (eu1, eu2, us) = (engine("eu1").await, engine("eu2").await, engine("us1").await);
    let us_model = json!({
        "apiVersion": "flotilla.dev/v1alpha1", "kind": "ModelDeployment",
        "metadata": {"name": "llama-us", "namespace": "ml", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {"model": {"name": "llama-us", "source": "hf://o/m"}, "replicas": 1, "engine": {"image": "vllm"},
                 "topology": {"type": "Standalone", "devicesPerReplica": 1}, "devices": {"alternatives": [{"class": "h100"}]}},
        "status": {"placements": [{"cluster": "us1", "pool": "p", "class": "h100", "capacityType": "on-demand",
                                   "fallbackRank": 1, "desired": 1, "ready": 1}]}
    });
    let clusters = [
        inference_cluster("eu1", "EU", &eu1.url()).unwrap(),
        inference_cluster("eu2", "EU", &eu2.url()).unwrap(),
        inference_cluster("us1", "US", &us.url()).unwrap(),
    ];
    let deployments = [llama_deployment().unwrap(), serde_json::from_value(us_model).unwrap()];
    let (file, _, problems) = fleet::table_file(&clusters, &deployments, &|_, n, _| Err(format!("no Secret {n}")));
    let gw = gateway(&table(&eu1, &eu2, &us), |c| c.routing = flotilla_gateway::config::RoutingMode::RoundRobin).await;
    gw.state.set_table(RoutingTable::from_file("fleet", file).unwrap());
    let url = gw.url("/v1/chat/completions");

    for i in 0..6 {
        let r = post(&url, &chat(ADAPTER, &format!("q {i}"))).await;
        assert_eq!(r.status, 200, "{}", r.text);
        assert!(["eu1", "eu2"].contains(&r.cluster().as_str()));
        let r = post(&url, &chat("chat-lora", &format!("q {i}"))).await;
        assert_eq!((r.status, r.cluster().as_str()), (200, "eu1"), "staged on eu1 only: {}", r.text);
    }
    // The member's routing finds the base deployment's pods by the usual header.
    let header = |s: &SimHandle| {
        s.state
            .requests()
            .iter()
            .all(|r| r.headers.iter().any(|(k, v)| k == "x-flotilla-deployment" && v == "ml/llama"))
    };
    assert!(header(&eu1) && header(&eu2));
    let r = post(&url, &chat("new-lora", "not staged")).await;
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (503, Some("no_healthy_cluster")), "{}", r.text);

    // The EU fails: the EU adapter gets an error, chat-lora is not sent to eu2 nor the US, and the
    // base fails over (and would fall back) to the US.
    for s in [&eu1, &eu2] {
        s.state.set_fault(Some(Fault::Error503), None);
    }
    let before = eu2.state.requests().len();
    for name in [ADAPTER, "chat-lora"] {
        let r = post(&url, &chat_stream(name, "failing", false)).await;
        assert!(r.status == 502 || r.status == 503, "{name}: {}: {}", r.status, r.text);
    }
    assert_eq!(
        eu2.state.requests()[before..].iter().filter(|r| r.model == "chat-lora").count(),
        0,
        "chat-lora never leaves the clusters it is staged on"
    );
    let r = post(&url, &chat("llama", "failing")).await;
    assert_eq!((r.status, r.cluster().as_str()), (200, "us1"), "{}", r.text);
    untouched(&us);
    assert_eq!(us.state.lora_counters("chat-lora").requests + us.state.lora_counters("new-lora").requests, 0);
    assert!(us.state.requests().iter().all(|r| r.model == "llama" || r.model == "llama-us"));
    // The stale status is said, not followed.
    assert!(problems.iter().any(|p| p.contains("status.adapters[sql-lora] lists cluster us1")), "{problems:?}");
}

/// What `/v1/models` lists for `key`.
async fn listed(gw: &Gateway, key: &str) -> Vec<serde_json::Value> {
    let a = get_with(&gw.url("/v1/models"), &[("authorization", &format!("Bearer {key}"))]).await;
    a.json()["data"].as_array().cloned().unwrap_or_default()
}

#[tokio::test]
async fn adapters_are_listed_with_their_parent_and_allowed_by_their_own_name() {
    let (eu1, eu2, us) = (engine("eu1").await, engine("eu2").await, engine("us1").await);
    let keys = temp_path("keys");
    let entry = |id: &str, key: &str, models: &str| {
        format!("  - {{id: {id}, sha256: {}, models: {models}}}\n", hex(&sha256(key.as_bytes())))
    };
    let doc = format!(
        "keys:\n{}{}{}",
        entry("base-team", "sk-base", "[llama]"),
        entry("sql-team", "sk-sql", &format!("[{ADAPTER}]")),
        entry("all", "sk-all", "[]")
    );
    write_atomic(&keys, &doc);
    let k = keys.clone();
    let gw = gateway(&table(&eu1, &eu2, &us), move |c| c.keys_file = Some(k)).await;
    let auth = |k: &str| format!("Bearer {k}");
    let all = listed(&gw, "sk-all").await;
    let adapter = all.iter().find(|m| m["id"] == ADAPTER).unwrap();
    assert_eq!((adapter["parent"].as_str(), adapter["object"].as_str()), (Some("llama"), Some("model")));
    let base = all.iter().find(|m| m["id"] == "llama").unwrap();
    assert!(base.get("parent").is_none(), "a model has no parent: {base}");
    let ids = |v: Vec<serde_json::Value>| v.iter().map(|m| m["id"].as_str().unwrap().to_string()).collect::<Vec<_>>();
    assert_eq!(ids(listed(&gw, "sk-base").await), ["llama"], "the base's scope does not list its adapters");
    assert_eq!(ids(listed(&gw, "sk-sql").await), [ADAPTER]);

    let url = gw.url("/v1/chat/completions");
    let r = post_with(&url, &chat(ADAPTER, "hi"), &[("authorization", &auth("sk-base"))]).await;
    assert_eq!(r.status, 403, "{}", r.text);
    assert_eq!(r.json()["error"]["code"], "model_not_allowed");
    assert_eq!(eu1.state.request_count() + eu2.state.request_count() + us.state.request_count(), 0);
    let r = post_with(&url, &chat(ADAPTER, "hi"), &[("authorization", &auth("sk-sql"))]).await;
    assert_eq!((r.status, r.header("x-flotilla-model").as_str()), (200, ADAPTER), "{}", r.text);
    let r = post_with(&url, &chat("other-lora", "hi"), &[("authorization", &auth("sk-all"))]).await;
    assert_eq!(r.status, 404, "an adapter the table does not declare is an unknown model");

    // The model label: a declared adapter by name, anything else `unknown`.
    let metrics = get(&gw.url("/metrics")).await.text;
    assert!(metrics.contains(&format!("model=\"{ADAPTER}\"")), "{metrics}");
    assert!(!metrics.contains("other-lora"), "a name from a request never becomes a label");
    untouched(&us);
    let _ = std::fs::remove_file(&keys);
}

#[tokio::test]
async fn a_broken_adapter_stream_is_continued_in_the_eu_only() {
    let (eu1, eu2, us) = (engine("eu1").await, engine("eu2").await, engine("us1").await);
    // eu1 is chosen first while every cluster is idle (least load per weight).
    let yaml = format!(
        "{}models:
  - {{name: llama, routes: [{{cluster: eu1}}, {{cluster: eu2}}, {{cluster: us1}}]}}
  - {{name: {ADAPTER}, parent: llama, sovereignty: {{allowedJurisdictions: [EU]}}, routes: [{{cluster: eu1, weight: 2, continuation: prefill}}, {{cluster: eu2, continuation: prefill}}, {{cluster: us1, continuation: prefill}}]}}
",
        clusters_yaml(&[("eu1", eu1.url(), "EU"), ("eu2", eu2.url(), "EU"), ("us1", us.url(), "US")])
    );
    let gw = gateway(&yaml, |_| {}).await;
    let url = gw.url("/v1/chat/completions");
    let mut body = chat_stream(ADAPTER, "tell me about fleets", true);
    body["max_tokens"] = 10.into();

    eu1.state.set_stream_script(ADAPTER, "cut:3".parse().unwrap());
    let r = post(&url, &body).await;
    assert_eq!((r.status, r.cluster().as_str()), (200, "eu1"), "{}", r.text);
    assert!(r.text.ends_with("data: [DONE]\n\n") && !r.text.contains("\"error\""), "{}", r.text);
    assert_eq!(eu1.state.model_counters(ADAPTER).stream_faults, 1);
    assert_eq!(eu2.state.model_counters(ADAPTER).continuations, 1, "finished in the EU, as the adapter");
    untouched(&us);

    // Both EU clusters break it: an error event, never the US.
    for s in [&eu1, &eu2] {
        s.state.set_stream_script(ADAPTER, "cut:3*".parse().unwrap());
    }
    let r = post(&url, &body).await;
    assert_eq!(r.status, 200, "the stream had begun");
    assert!(!r.text.contains("[DONE]") && r.text.contains("\"error\""), "{}", r.text);
    untouched(&us);
}
