//! Streaming through the gateway: SSE passthrough with `include_usage`; after bytes reached
//! the client, every broken stream (cut, stall, malformed chunk, truncation) ends with an
//! OpenAI-style error event instead of looking complete; a clean stream without `[DONE]` is
//! finalised; and the client's disconnect cancels the upstream request.

mod common;

use std::time::Duration;

use common::*;
use flotilla_enginesim::Fault;
use serde_json::Value;

fn one(a: String) -> String {
    format!("{}models:\n  - {{name: m, routes: [{{cluster: a}}]}}\n", clusters_yaml(&[("a", a, "EU")]))
}

fn error_code(ev: &str) -> String {
    let v: Value = serde_json::from_str(ev).unwrap_or_default();
    v["error"]["code"].as_str().unwrap_or_default().to_string()
}

#[tokio::test]
async fn streams_pass_through_with_and_without_usage() {
    let a = sim("a", &["m"], |c| c.default_tokens = 5).await;
    let gw = gateway(&one(a.url()), |_| {}).await;
    let r = post(&gw.url("/v1/chat/completions"), &chat_stream("m", "tell me", true)).await;
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), "text/event-stream");
    assert_eq!(r.cluster(), "a");
    let ev = r.events();
    assert_eq!(ev.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = ev[..ev.len() - 1].iter().map(|e| serde_json::from_str(e).unwrap()).collect();
    let text: String = chunks.iter().filter_map(|c| c["choices"][0]["delta"]["content"].as_str()).collect();
    let full = post(&gw.url("/v1/chat/completions"), &chat("m", "tell me")).await.json();
    assert_eq!(text, full["choices"][0]["message"]["content"].as_str().unwrap(), "same seed, same answer");
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 5);
    let r = post(&gw.url("/v1/chat/completions"), &chat_stream("m", "tell me", false)).await;
    assert!(!r.text.contains("\"usage\""), "no usage chunk unless asked");
    let r = post(&gw.url("/v1/completions"), &serde_json::json!({"model": "m", "prompt": "p", "stream": true})).await;
    assert!(r.text.contains("\"text_completion\"") && r.text.ends_with("data: [DONE]\n\n"));
}

#[tokio::test]
async fn broken_streams_end_with_an_error_event_never_as_success() {
    let a = sim("a", &["m"], |c| c.default_tokens = 6).await;
    // One route: nowhere to continue. Malformed events are fatal here (skipping one is the default).
    let gw = gateway(&one(a.url()), |c| c.max_malformed_events = 0).await;
    let cases = [
        (Fault::Cut(2), "upstream_cut"),
        (Fault::Stall(2), "upstream_stalled"),
        (Fault::Malformed(2), "upstream_malformed"),
    ];
    for (fault, code) in cases {
        a.state.set_fault(Some(fault), Some(1));
        let r = post(&gw.url("/v1/chat/completions"), &chat_stream("m", "q", false)).await;
        assert_eq!(r.status, 200, "bytes were already sent when {fault:?} happened");
        assert!(!r.broken, "the gateway ends the stream itself");
        let ev = r.events();
        assert!(ev.len() >= 3, "{fault:?}: the first tokens reached the client: {ev:?}");
        assert_eq!(error_code(ev.last().unwrap()), code, "{fault:?}: {}", r.text);
        assert!(!r.text.contains("[DONE]"), "{fault:?}: a broken answer is never marked done");
        assert!(!r.text.contains("oops"), "{fault:?}: garbage is not forwarded");
    }
    let m = get(&gw.url("/metrics")).await.text;
    for end in ["cut", "stalled", "malformed"] {
        assert!(m.contains(&format!("flotilla_gateway_streams_total{{cluster=\"a\",end=\"{end}\"}} 1")), "{end}: {m}");
    }
}

#[tokio::test]
async fn a_single_malformed_event_is_skipped_and_counted() {
    let a = sim("a", &["m"], |c| c.default_tokens = 6).await;
    let gw = gateway(&one(a.url()), |_| {}).await;
    let clean = post(&gw.url("/v1/chat/completions"), &chat_stream("m", "q", true)).await;
    a.state.set_fault(Some(Fault::Malformed(2)), Some(1));
    let r = post(&gw.url("/v1/chat/completions"), &chat_stream("m", "q", true)).await;
    assert!(r.text.ends_with("data: [DONE]\n\n") && !r.text.contains("oops"), "{}", r.text);
    let text = |t: &str| -> String {
        t.split("\n\n")
            .filter_map(|e| serde_json::from_str::<Value>(e.strip_prefix("data: ")?).ok())
            .filter_map(|v| v["choices"][0]["delta"]["content"].as_str().map(str::to_string))
            .collect()
    };
    assert_eq!(text(&r.text), text(&clean.text), "the whole answer, the bad event left out");
    let m = get(&gw.url("/metrics")).await.text;
    assert!(m.contains("flotilla_gateway_stream_events_skipped_total{cluster=\"a\"} 1"), "{m}");
    assert!(m.contains("flotilla_gateway_streams_total{cluster=\"a\",end=\"complete\"} 2"), "{m}");
}

#[tokio::test]
async fn a_clean_stream_without_done_is_finalised() {
    let a = sim("a", &["m"], |c| c.fault = Some(Fault::NoDone)).await;
    let gw = gateway(&one(a.url()), |_| {}).await;
    let r = post(&gw.url("/v1/chat/completions"), &chat_stream("m", "q", true)).await;
    assert_eq!(r.status, 200);
    let ev = r.events();
    assert_eq!(ev.last().unwrap(), "[DONE]");
    assert!(ev.iter().all(|e| !e.contains("\"error\"")));
    assert!(ev[ev.len() - 2].contains("\"usage\""));
}

#[tokio::test]
async fn a_failure_before_the_first_token_fails_over_the_stream() {
    let a = sim("a", &["m"], |c| c.fault = Some(Fault::Malformed(0))).await;
    let b = sim("b", &["m"], |_| {}).await;
    let yaml = format!(
        "{}models:\n  - {{name: m, routes: [{{cluster: a}}, {{cluster: b}}]}}\n",
        clusters_yaml(&[("a", a.url(), "EU"), ("b", b.url(), "EU")])
    );
    let gw = gateway(&yaml, |_| {}).await;
    let r = post(&gw.url("/v1/chat/completions"), &chat_stream("m", "q", false)).await;
    assert_eq!((r.status, r.cluster().as_str()), (200, "b"));
    assert!(r.text.ends_with("data: [DONE]\n\n") && !r.text.contains("oops"));
    assert_eq!((a.state.request_count(), b.state.request_count()), (1, 1));
}

#[tokio::test]
async fn the_clients_disconnect_cancels_the_upstream_request() {
    let a = sim("a", &["m"], |c| {
        c.default_tokens = 2000;
        c.itl_ms = 5;
    })
    .await;
    let gw = gateway(&one(a.url()), |_| {}).await;
    let req = hyper::Request::post(gw.url("/v1/chat/completions"))
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(bytes::Bytes::from(chat_stream("m", "long", false).to_string())))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    let mut body = resp.into_body();
    use http_body_util::BodyExt;
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.is_data());
    eventually("the upstream is generating", || a.state.running() == 1).await;
    drop(body);
    eventually("the upstream request was cancelled", || a.state.cancelled() == 1).await;
    assert_eq!(a.state.running(), 0);
    assert_eq!(a.state.completed(), 0);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(gw.state.health.get("a").inflight(), 0, "the gateway released the attempt");
}

#[tokio::test]
async fn a_disconnect_also_cancels_a_non_streamed_request() {
    let a = sim("a", &["m"], |c| c.ttft_ms = 5000).await;
    let gw = gateway(&one(a.url()), |_| {}).await;
    let url = gw.url("/v1/chat/completions");
    let pending = tokio::spawn(async move { post(&url, &chat("m", "slow")).await });
    eventually("the upstream is working", || a.state.running() == 1).await;
    pending.abort();
    eventually("the upstream request was cancelled", || a.state.cancelled() == 1).await;
    assert_eq!(a.state.completed(), 0);
}
