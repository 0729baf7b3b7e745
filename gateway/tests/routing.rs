//! Routing by model name and alias, `/v1/models`, request ids, the error mapping, and the
//! sovereignty invariant (an EU-only model never reaches a US cluster, even when every EU
//! cluster fails), all against simulators on loopback and the gateway on a real port.

mod common;

use common::*;
use serde_json::json;

#[tokio::test]
async fn routes_by_model_name_and_alias_and_lists_models() {
    let a = sim("a", &["llama"], |_| {}).await;
    let b = sim("b", &["mistral"], |_| {}).await;
    let yaml = format!(
        "{}models:\n  - {{name: llama, aliases: [llama-70b], routes: [{{cluster: a}}]}}\n  - {{name: mistral, routes: [{{cluster: b}}]}}\n",
        clusters_yaml(&[("a", a.url(), "EU"), ("b", b.url(), "EU")])
    );
    let gw = gateway(&yaml, |_| {}).await;
    let r = post(&gw.url("/v1/chat/completions"), &chat("llama-70b", "hello there")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.cluster(), "a");
    assert_eq!(r.header("x-flotilla-model"), "llama");
    assert_eq!(r.json()["model"], "llama", "the alias is resolved before the request goes upstream");
    assert_eq!(r.header("x-request-id").len(), 32);
    let r = post(&gw.url("/v1/completions"), &json!({"model": "mistral", "prompt": "once upon"})).await;
    assert_eq!((r.status, r.cluster().as_str()), (200, "b"));
    assert_eq!(r.json()["object"], "text_completion");
    let r = post(&gw.url("/v1/embeddings"), &json!({"model": "mistral", "input": ["x", "y"]})).await;
    assert_eq!(r.json()["data"].as_array().unwrap().len(), 2);
    assert_eq!(a.state.requests().iter().map(|r| r.model.as_str()).collect::<Vec<_>>(), ["llama"]);
    assert_eq!(b.state.request_count(), 2);

    let models = get(&gw.url("/v1/models")).await.json();
    let ids: Vec<&str> = models["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["llama", "llama-70b", "mistral"]);
    let r = get(&gw.url("/healthz")).await;
    assert_eq!(r.status, 200);
    assert!(!r.header("x-request-id").is_empty());
    assert_eq!(get(&gw.url("/readyz")).await.status, 200);
}

#[tokio::test]
async fn errors_are_openai_shaped_with_conventional_statuses() {
    let a = sim("a", &["m"], |_| {}).await;
    let yaml =
        format!("{}models:\n  - {{name: m, routes: [{{cluster: a}}]}}\n", clusters_yaml(&[("a", a.url(), "EU")]));
    let gw = gateway(&yaml, |c| {
        c.api_keys = vec!["sekret".into()];
        c.max_body_bytes = 4096;
    })
    .await;
    let auth = [("authorization", "Bearer sekret")];
    let r = post(&gw.url("/v1/chat/completions"), &chat("m", "hi")).await;
    assert_eq!(r.status, 401);
    assert_eq!(r.json()["error"]["code"], "invalid_api_key");
    let r = post_with(&gw.url("/v1/chat/completions"), &chat("nope", "hi"), &auth).await;
    assert_eq!(r.status, 404);
    assert_eq!(r.json()["error"]["code"], "model_not_found");
    assert_eq!(r.json()["error"]["param"], "model");
    let r = post_with(&gw.url("/v1/chat/completions"), &json!({"messages": []}), &auth).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["type"], "invalid_request_error");
    let big = "word ".repeat(2000);
    let r = post_with(&gw.url("/v1/chat/completions"), &chat("m", &big), &auth).await;
    assert_eq!(r.status, 413);
    assert_eq!(r.json()["error"]["code"], "request_too_large");
    let r = post_with(&gw.url("/v1/nothing"), &chat("m", "hi"), &auth).await;
    assert_eq!(r.status, 404);
    let r = post_with(&gw.url("/v1/chat/completions"), &chat("m", "hi"), &[auth[0], ("x-request-id", "abc-123")]).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("x-request-id"), "abc-123", "a client's request id is kept");
    assert_eq!(a.state.request_count(), 1, "only the valid request reached the cluster");
}

fn sovereign_yaml(eu1: String, eu2: String, us: String) -> String {
    format!(
        "{}models:
  - name: eu-model
    sovereignty: {{allowedJurisdictions: [EU]}}
    fallbacks: [global-model]
    routes: [{{cluster: eu-1}}, {{cluster: eu-2}}, {{cluster: us-1}}]
  - name: global-model
    routes: [{{cluster: us-1}}]
",
        clusters_yaml(&[("eu-1", eu1, "EU"), ("eu-2", eu2, "EU"), ("us-1", us, "US")])
    )
}

#[tokio::test]
async fn an_eu_only_model_never_reaches_a_us_cluster_even_when_every_eu_cluster_fails() {
    let models = ["eu-model", "global-model"];
    let eu1 = sim("eu-1", &models, |_| {}).await;
    let eu2 = sim("eu-2", &models, |_| {}).await;
    let us = sim("us-1", &models, |_| {}).await;
    let gw = gateway(&sovereign_yaml(eu1.url(), eu2.url(), us.url()), |_| {}).await;
    for i in 0..6 {
        let r = post(&gw.url("/v1/chat/completions"), &chat("eu-model", &format!("request {i}"))).await;
        assert_eq!(r.status, 200);
        assert!(r.cluster().starts_with("eu-"), "served by {}", r.cluster());
    }
    // The US cluster is the least loaded and the fallback model lives there: still nothing goes.
    eu1.state.set_fault(Some(flotilla_enginesim::Fault::Reset), None);
    eu2.state.set_fault(Some(flotilla_enginesim::Fault::Error503), None);
    let before = (eu1.state.request_count(), eu2.state.request_count());
    let r = post(&gw.url("/v1/chat/completions"), &chat("eu-model", "all down")).await;
    assert_eq!(r.status, 503, "{}", r.text);
    assert_eq!(r.header("retry-after"), "1");
    assert_eq!(r.json()["error"]["code"], "no_healthy_cluster");
    assert_eq!((eu1.state.request_count(), eu2.state.request_count()), (before.0 + 1, before.1 + 1));
    let s = post(&gw.url("/v1/chat/completions"), &chat_stream("eu-model", "all down", true)).await;
    assert_eq!(s.status, 503);
    assert_eq!(us.state.request_count(), 0, "the US cluster saw no request of the EU-only model");
    // The global model itself may use the US cluster.
    let r = post(&gw.url("/v1/chat/completions"), &chat("global-model", "hi")).await;
    assert_eq!((r.status, r.cluster().as_str()), (200, "us-1"));
}

#[tokio::test]
async fn a_fixed_response_simulator_serves_plain_and_streamed_answers_through_the_gateway() {
    // The benchmarks' upstream: it must be a valid answer for the gateway, or they measure errors.
    let a = sim("a", &["m"], |c| c.fixed_response = true).await;
    let yaml =
        format!("{}models:\n  - {{name: m, routes: [{{cluster: a}}]}}\n", clusters_yaml(&[("a", a.url(), "EU")]));
    let gw = gateway(&yaml, |_| {}).await;
    let r = post(&gw.url("/v1/chat/completions"), &chat("m", "hi")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.json()["choices"][0]["message"]["content"], "ok");
    let r = post(&gw.url("/v1/chat/completions"), &chat_stream("m", "hi", false)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.events().last().map(String::as_str), Some("[DONE]"));
    assert!(!r.text.contains("upstream_"), "the stream ends cleanly: {}", r.text);
    let r = post(&gw.url("/v1/completions"), &serde_json::json!({"model": "m", "prompt": "x", "stream": true})).await;
    assert_eq!(r.events().last().map(String::as_str), Some("[DONE]"));
    assert_eq!(a.state.completed(), 3);
    assert_eq!(a.state.request_count(), 0, "the fixed answer skips the request log");
}
