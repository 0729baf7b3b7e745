//! The member router placing requests for LoRA adapters on engine simulators (vLLM's adapter
//! API): the first request loads the adapter on one replica and the next ones go there; a full
//! replica evicts its least recently used idle adapter; a failed load moves the request to another
//! replica, and failing everywhere ends in an OpenAI-shaped error; concurrent first requests share
//! one load; an adapter the route does not list is never loaded anywhere; base-model requests go
//! on as before; `/v1/models` lists the adapters under their base model. No timing assertions.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::router::{Running, start};
use common::{Answer, chat, chat_stream, get, post_with, sim};
use flotilla_enginesim::SimHandle;
use flotilla_enginesim::config::LoadFailure;
use flotilla_gateway::member_router::metrics::{AdapterEvent, RequestResult};
use flotilla_gateway::member_router::{Route, Table};
use serde_json::Value;

const HDR: &str = "x-flotilla-deployment";
const BASE: &str = "base";
const ADAPTERS: [(&str, &str); 3] = [("a", "/adapters/a"), ("b", "/adapters/b"), ("c", "/adapters/c")];

/// Asks the router for a chat completion of `model` on `route`.
async fn ask(r: &Running, route: &str, model: &str) -> Answer {
    post_with(&r.url("/v1/chat/completions"), &chat(model, "hello"), &[(HDR, route)]).await
}

/// The router's count of `e` for `adapter`.
fn counted(r: &Running, adapter: &str, e: AdapterEvent) -> u64 {
    r.st.metrics.adapters.get(adapter, e)
}

/// `n` simulators serving `base`, each holding at most `max_loras` adapters.
async fn replicas(n: usize, max_loras: usize) -> Vec<SimHandle> {
    let mut sims = Vec::new();
    for i in 0..n {
        sims.push(sim(&format!("replica-{i}"), &[BASE], |c| c.lora.max_loras = max_loras).await);
    }
    sims
}

/// Route `team-a/llama` over `sims`, allowed adapters a, b and c, `max` at once.
fn table(sims: &[SimHandle], max: usize) -> Table {
    let urls: Vec<String> = sims.iter().map(SimHandle::url).collect();
    let eps: Vec<(&str, f64)> = urls.iter().map(|u| (u.as_str(), 1.0)).collect();
    Table::default().with("team-a/llama", Route::new(BASE, "team-a/llama", &eps).with_adapters(&ADAPTERS, max))
}

fn loads(sims: &[SimHandle], adapter: &str) -> Vec<u64> {
    sims.iter().map(|s| s.state.lora_counters(adapter).loads).collect()
}

fn loaded(s: &SimHandle) -> Vec<String> {
    s.state.loaded_loras().into_iter().map(|l| l.name).collect()
}

#[tokio::test]
async fn after_the_first_load_requests_for_an_adapter_go_where_it_is_loaded() {
    let sims = replicas(3, 4).await;
    let r = start(table(&sims, 4), |_| {}).await;
    let mut served_by = Vec::new();
    for _ in 0..6 {
        let ans = ask(&r, "team-a/llama", "a").await;
        assert_eq!(ans.status, 200, "{}", ans.text);
        assert_eq!(ans.json()["model"], "a", "the adapter answered");
        served_by.push(ans.header("x-sim-name"));
    }
    assert!(served_by.iter().all(|s| *s == served_by[0]), "one replica served them all: {served_by:?}");
    assert_eq!(loads(&sims, "a").iter().sum::<u64>(), 1, "loaded once: {:?}", loads(&sims, "a"));
    let home = sims.iter().find(|s| s.state.config.name == served_by[0]).unwrap();
    assert_eq!(loaded(home), ["a"]);
    assert_eq!(home.state.lora_counters("a").requests, 6);
    let loaded_with = &home.state.loaded_loras()[0];
    assert_eq!((loaded_with.path.as_str(), loaded_with.base.as_str()), ("/adapters/a", BASE));
    assert_eq!((counted(&r, "a", AdapterEvent::Miss), counted(&r, "a", AdapterEvent::Hit)), (1, 5));
    assert_eq!(counted(&r, "a", AdapterEvent::Load), 1);
    let m = get(&r.url("/metrics")).await.text;
    assert!(m.contains("flotilla_member_router_adapter_affinity_hits_total{adapter=\"a\"} 5"), "{m}");
    assert!(m.contains("flotilla_member_router_adapter_loads_total{adapter=\"a\"} 1"), "{m}");
}

#[tokio::test]
async fn a_full_replica_unloads_its_least_recently_used_adapter() {
    let sims = replicas(1, 2).await;
    let r = start(table(&sims, 2), |_| {}).await;
    for model in ["a", "b", "a", "c"] {
        let ans = ask(&r, "team-a/llama", model).await;
        assert_eq!((ans.status, ans.json()["model"].as_str()), (200, Some(model)), "{}", ans.text);
    }
    // b was the least recently used when c came.
    assert_eq!(loaded(&sims[0]), ["a", "c"]);
    let (a, b) = (sims[0].state.lora_counters("a"), sims[0].state.lora_counters("b"));
    assert_eq!((a.loads, a.unloads, b.loads, b.unloads), (1, 0, 1, 1));
    assert_eq!(counted(&r, "b", AdapterEvent::Eviction), 1);
    // Now a is the oldest.
    assert_eq!(ask(&r, "team-a/llama", "b").await.status, 200);
    assert_eq!(loaded(&sims[0]), ["b", "c"]);
    assert_eq!(counted(&r, "a", AdapterEvent::Eviction), 1);
    let refused: u64 = ["a", "b", "c"].iter().map(|n| sims[0].state.lora_counters(n).load_refused).sum();
    assert_eq!(refused, 0, "the router never asked a full engine to load");
}

#[tokio::test]
async fn a_failed_load_moves_the_request_to_another_replica() {
    let sims = replicas(2, 4).await;
    let r = start(table(&sims, 4), |_| {}).await;
    // Loading `a` fails on the replica asked first (both are idle: the first in the route).
    sims[0].state.set_lora_load_failure("a", Some(LoadFailure::Error), None);
    let ans = ask(&r, "team-a/llama", "a").await;
    assert_eq!((ans.status, ans.header("x-sim-name").as_str()), (200, "replica-1"), "{}", ans.text);
    assert_eq!(sims[0].state.lora_counters("a").load_failures, 1);
    assert_eq!(loads(&sims, "a"), [0, 1]);
    assert_eq!((counted(&r, "a", AdapterEvent::LoadFailure), counted(&r, "a", AdapterEvent::Load)), (1, 1));
    // The next one goes where it is loaded.
    assert_eq!(ask(&r, "team-a/llama", "a").await.header("x-sim-name"), "replica-1");

    // Failing everywhere: an OpenAI-shaped 502, then 503 while both back off.
    for s in &sims {
        s.state.set_lora_load_failure("b", Some(LoadFailure::NotFound), None);
    }
    let ans = ask(&r, "team-a/llama", "b").await;
    assert_eq!(ans.status, 502, "{}", ans.text);
    let v = ans.json();
    assert_eq!(
        (v["error"]["type"].as_str(), v["error"]["code"].as_str()),
        (Some("upstream_error"), Some("adapter_load_failed"))
    );
    assert!(v["error"]["param"].is_null());
    assert!(v["error"]["message"].as_str().unwrap().contains("No adapter found"), "{v}");
    assert_eq!(sims.iter().map(|s| s.state.lora_counters("b").load_failures).sum::<u64>(), 2);
    let ans = ask(&r, "team-a/llama", "b").await;
    assert_eq!((ans.status, ans.header("retry-after").as_str()), (503, "1"), "{}", ans.text);
    assert_eq!(ans.json()["error"]["code"], "adapter_load_failed");
    assert_eq!(sims.iter().map(|s| s.state.lora_counters("b").load_failures).sum::<u64>(), 2, "not asked again yet");
    assert_eq!(r.st.metrics.requests(RequestResult::adapter_unavailable), 2);
    assert_eq!(sims.iter().map(|s| s.state.lora_counters("b").requests).sum::<u64>(), 0);
}

#[tokio::test]
async fn concurrent_first_requests_share_one_load() {
    let mut sims = Vec::new();
    for i in 0..2 {
        sims.push(
            sim(&format!("replica-{i}"), &[BASE], |c| {
                c.lora.max_loras = 4;
                c.lora.lora_load_ms = 300;
            })
            .await,
        );
    }
    let r = start(table(&sims, 4), |_| {}).await;
    let answers = futures_util::future::join_all((0..3).map(|_| ask(&r, "team-a/llama", "a"))).await;
    for a in &answers {
        assert_eq!(a.status, 200, "{}", a.text);
    }
    assert_eq!(loads(&sims, "a").iter().sum::<u64>(), 1, "{:?}", loads(&sims, "a"));
    let refused: u64 = sims.iter().map(|s| s.state.lora_counters("a").load_refused).sum();
    assert_eq!(refused, 0, "no second load was sent");
    assert_eq!(counted(&r, "a", AdapterEvent::Miss), 3);
}

#[tokio::test]
async fn an_adapter_the_engine_already_holds_is_used_as_loaded() {
    // The router starts with an empty record while the engine holds `a` (a router restart).
    let s = sim("replica-0", &[BASE], |c| {
        c.lora.max_loras = 4;
        c.lora.loras = vec!["a=base".parse().unwrap()];
    })
    .await;
    let sims = vec![s];
    let r = start(table(&sims, 4), |_| {}).await;
    let ans = ask(&r, "team-a/llama", "a").await;
    assert_eq!((ans.status, ans.json()["model"].as_str()), (200, Some("a")), "{}", ans.text);
    assert_eq!(sims[0].state.lora_counters("a").load_refused, 1, "the engine said it had it");
    assert_eq!(counted(&r, "a", AdapterEvent::LoadFailure), 0);
    assert_eq!(ask(&r, "team-a/llama", "a").await.status, 200);
    assert_eq!(sims[0].state.lora_counters("a").load_refused, 1, "not asked again");
}

#[tokio::test]
async fn an_adapter_the_route_does_not_list_is_never_loaded() {
    let sims = replicas(2, 4).await;
    let other = replicas(1, 4).await;
    let other_url = other[0].url();
    let table = table(&sims, 4).with("team-b/plain", Route::new(BASE, "team-b/plain", &[(other_url.as_str(), 1.0)]));
    let r = start(table, |_| {}).await;
    for model in ["z", "../a", "a "] {
        for _ in 0..2 {
            let ans = ask(&r, "team-a/llama", model).await;
            assert_eq!(ans.status, 404, "forwarded, and the engine does not know it: {}", ans.text);
        }
    }
    // `a` is listed by team-a's route, not by team-b's: there it is just an unknown model.
    for _ in 0..2 {
        assert_eq!(ask(&r, "team-b/plain", "a").await.status, 404);
    }
    let everyone: Vec<&SimHandle> = sims.iter().chain(&other).collect();
    for s in &everyone {
        for n in ["z", "../a", "a ", "a"] {
            let c = s.state.lora_counters(n);
            assert_eq!((c.loads, c.load_refused, c.load_failures), (0, 0, 0), "{n} on {}", s.state.config.name);
        }
        assert!(loaded(s).is_empty());
    }
    assert_eq!(sims.iter().map(|s| s.state.request_count()).sum::<usize>(), 6, "forwarded as base requests");
    assert_eq!(other[0].state.request_count(), 2);
    let m = get(&r.url("/metrics")).await.text;
    assert!(!m.contains("adapter=\"z\"") && !m.contains("adapter=\"a\""), "no label from a request: {m}");
}

#[tokio::test]
async fn base_model_requests_go_on_as_before() {
    let sims = replicas(3, 4).await;
    let r = start(table(&sims, 4), |_| {}).await;
    for _ in 0..6 {
        let ans = ask(&r, "team-a/llama", BASE).await;
        assert_eq!((ans.status, ans.json()["model"].as_str()), (200, Some(BASE)), "{}", ans.text);
    }
    let stream =
        post_with(&r.url("/v1/chat/completions"), &chat_stream(BASE, "hi", false), &[(HDR, "team-a/llama")]).await;
    assert_eq!(stream.events().last().map(String::as_str), Some("[DONE]"));
    // Not JSON at all: forwarded untouched (the engine answers it).
    let raw = hyper::Request::post(r.url("/v1/chat/completions"))
        .header(HDR, "team-a/llama")
        .body(http_body_util::Full::new(bytes::Bytes::from_static(b"not json")))
        .unwrap();
    let status = common::client().request(raw).await.unwrap().status();
    assert_eq!(status, 400);
    let counts: Vec<usize> = sims.iter().map(|s| s.state.request_count()).collect();
    assert!(counts.iter().all(|c| *c >= 2), "spread over the replicas as before: {counts:?}");
    for s in &sims {
        assert!(loaded(s).is_empty(), "nothing was loaded");
        assert!(ADAPTERS.iter().all(|(n, _)| s.state.lora_counters(n) == Default::default()));
    }
    assert_eq!(r.st.metrics.requests(RequestResult::proxied), 8);
}

#[tokio::test]
async fn without_affinity_the_adapter_is_loaded_wherever_the_request_lands() {
    let sims = replicas(3, 4).await;
    let r = start(table(&sims, 4), |c| c.adapter_affinity = false).await;
    for _ in 0..3 {
        assert_eq!(ask(&r, "team-a/llama", "a").await.status, 200);
    }
    assert_eq!(loads(&sims, "a"), [1, 1, 1], "round robin: each replica loaded it");
    assert_eq!((counted(&r, "a", AdapterEvent::Miss), counted(&r, "a", AdapterEvent::Hit)), (3, 0));
}

#[tokio::test]
async fn models_lists_the_adapters_under_their_base_model() {
    let sims = replicas(1, 4).await;
    let t =
        table(&sims, 4).with("team-c/idle", Route::new("idle", "team-c/idle", &[]).with_adapters(&[("d", "/d")], 1));
    let r = start(t, |_| {}).await;
    let v = get(&r.url("/v1/models")).await.json();
    let cards: Vec<(String, Value)> = v["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| (c["id"].as_str().unwrap().to_string(), c["parent"].clone()))
        .collect();
    let want: Vec<(String, Value)> = [(BASE, Value::Null), ("a", BASE.into()), ("b", BASE.into()), ("c", BASE.into())]
        .into_iter()
        .map(|(id, p)| (id.to_string(), p))
        .collect();
    assert_eq!(cards, want, "the idle route's adapter is not listed");
    assert!(loaded(&sims[0]).is_empty(), "listing loads nothing");
}

#[tokio::test]
async fn loads_carry_the_requests_credentials_to_an_engine_with_an_api_key() {
    let s = sim("replica-0", &[BASE], |c| {
        c.lora.max_loras = 4;
        c.api_key = Some("engine-key".into());
    })
    .await;
    let sims = vec![s];
    let r = start(table(&sims, 4), |_| {}).await;
    let auth = [(HDR, "team-a/llama"), ("authorization", "Bearer engine-key")];
    let ans = post_with(&r.url("/v1/chat/completions"), &chat("a", "hi"), &auth).await;
    assert_eq!((ans.status, ans.json()["model"].as_str()), (200, Some("a")), "{}", ans.text);
    assert_eq!(sims[0].state.lora_counters("a").loads, 1);
}
