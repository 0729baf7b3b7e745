//! Failure handling before the first response byte: failover on connect errors, resets,
//! 5xx and silence; the same cluster for a one-off 500 or a bounded `Retry-After`; jittered
//! backoff between attempts; a bounded number of attempts; client errors not retried; and
//! fallback models for context-length errors or when no cluster of the model can serve.
//! Each test asserts the attempts each simulator saw and the time between them.

mod common;

use std::time::Duration;

use common::*;
use flotilla_enginesim::Fault;
use serde_json::json;

fn two(a: String, b: String) -> String {
    format!(
        "{}models:\n  - {{name: m, fallbacks: [], routes: [{{cluster: a}}, {{cluster: b}}]}}\n",
        clusters_yaml(&[("a", a, "EU"), ("b", b, "EU")])
    )
}

fn gap(s: &flotilla_enginesim::SimHandle, i: usize) -> Duration {
    let r = s.state.requests();
    r[i + 1].at - r[i].at
}

#[tokio::test]
async fn connect_failures_resets_and_503s_fail_over_to_another_cluster() {
    let b = sim("b", &["m"], |_| {}).await;
    // Least-load ties break by name, so `a` is always tried first.
    let gw = gateway(&two(dead_url().await, b.url()), |_| {}).await;
    let r = post(&gw.url("/v1/chat/completions"), &chat("m", "hi")).await;
    assert_eq!((r.status, r.cluster().as_str()), (200, "b"));

    for fault in [Fault::Reset, Fault::Error503] {
        let a = sim("a", &["m"], |c| c.fault = Some(fault)).await;
        let b = sim("b", &["m"], |_| {}).await;
        let gw = gateway(&two(a.url(), b.url()), |_| {}).await;
        for stream in [false, true] {
            let mut body = chat("m", "hi");
            body["stream"] = stream.into();
            let r = post(&gw.url("/v1/chat/completions"), &body).await;
            assert_eq!((r.status, r.cluster().as_str()), (200, "b"), "{fault:?}: {}", r.text);
        }
        assert_eq!(counts(&[&a, &b]).into_values().collect::<Vec<_>>(), [2, 2], "{fault:?}: one attempt each");
    }
}

#[tokio::test]
async fn a_one_off_500_is_retried_on_the_same_cluster_after_a_backoff() {
    let a = sim("a", &["m"], |c| {
        c.fault = Some(Fault::Error500);
        c.fault_count = Some(1);
    })
    .await;
    let yaml =
        format!("{}models:\n  - {{name: m, routes: [{{cluster: a}}]}}\n", clusters_yaml(&[("a", a.url(), "EU")]));
    let gw = gateway(&yaml, |_| {}).await;
    let r = post(&gw.url("/v1/chat/completions"), &chat("m", "hi")).await;
    assert_eq!((r.status, r.cluster().as_str()), (200, "a"));
    assert_eq!(a.state.request_count(), 2);
    assert!(
        gap(&a, 0) >= Duration::from_millis(20),
        "backoff (base 40 ms, equal jitter) between attempts: {:?}",
        gap(&a, 0)
    );
}

#[tokio::test]
async fn persistent_500s_stop_after_the_attempt_budget() {
    let a = sim("a", &["m"], |c| c.fault = Some(Fault::Error500)).await;
    let b = sim("b", &["m"], |c| c.fault = Some(Fault::Error500)).await;
    let gw = gateway(&two(a.url(), b.url()), |_| {}).await;
    let r = post(&gw.url("/v1/chat/completions"), &chat("m", "hi")).await;
    assert_eq!(r.status, 502, "{}", r.text);
    assert_eq!(r.json()["error"]["code"], "upstream_failed");
    let total = a.state.request_count() + b.state.request_count();
    assert_eq!(total, 3, "max_attempts = 3: the gateway does not hammer failing clusters");
    assert!(a.state.request_count() >= 1 && b.state.request_count() >= 1, "the retry went to the other cluster");
}

#[tokio::test]
async fn rate_limits_honour_retry_after_and_are_bounded() {
    // With Retry-After: 1 the same (only) cluster is retried after a second.
    let a = sim("a", &["m"], |c| {
        c.fault = Some(Fault::RateLimit(Some(1)));
        c.fault_count = Some(1);
    })
    .await;
    let yaml =
        format!("{}models:\n  - {{name: m, routes: [{{cluster: a}}]}}\n", clusters_yaml(&[("a", a.url(), "EU")]));
    let gw = gateway(&yaml, |_| {}).await;
    let r = post(&gw.url("/v1/chat/completions"), &chat("m", "hi")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(a.state.request_count(), 2);
    assert!(gap(&a, 0) >= Duration::from_millis(990), "Retry-After honoured: {:?}", gap(&a, 0));

    // Without Retry-After: one retry after a backoff, then a 429 for the client with Retry-After.
    a.state.set_fault(Some(Fault::RateLimit(None)), None);
    let r = post(&gw.url("/v1/chat/completions"), &chat("m", "again")).await;
    assert_eq!(r.status, 429, "{}", r.text);
    assert_eq!(r.json()["error"]["code"], "rate_limit_exceeded");
    assert!(!r.header("retry-after").is_empty());
    assert_eq!(a.state.request_count(), 4, "two attempts, no more");
    assert!(gap(&a, 2) >= Duration::from_millis(20), "backoff between 429s: {:?}", gap(&a, 2));

    // A Retry-After above the bound is not waited for: 429 at once, one attempt.
    a.state.set_fault(Some(Fault::RateLimit(Some(30))), None);
    let r = post(&gw.url("/v1/chat/completions"), &chat("m", "later")).await;
    assert_eq!((r.status, r.header("retry-after").as_str()), (429, "30"));
    assert_eq!(a.state.request_count(), 5);
}

#[tokio::test]
async fn a_silent_cluster_is_not_retried_and_its_request_fails_over() {
    let a = sim("a", &["m"], |c| c.fault = Some(Fault::NoResponse)).await;
    let b = sim("b", &["m"], |_| {}).await;
    let gw = gateway(&two(a.url(), b.url()), |_| {}).await;
    let r = post(&gw.url("/v1/chat/completions"), &chat("m", "hi")).await;
    assert_eq!((r.status, r.cluster().as_str()), (200, "b"));
    assert_eq!(a.state.request_count(), 1, "the silent route is not retried");
    let gap_ab = b.state.requests()[0].at - a.state.requests()[0].at;
    assert!(gap_ab >= Duration::from_millis(1000), "failover after the request timeout: {gap_ab:?}");

    // Streaming: a slow first token triggers failover after the TTFT timeout.
    a.state.set_fault(Some(Fault::SlowFirstToken(5000)), None);
    let r = post(&gw.url("/v1/chat/completions"), &chat_stream("m", "stream", false)).await;
    assert_eq!((r.status, r.cluster().as_str()), (200, "b"));
    assert!(r.text.ends_with("data: [DONE]\n\n"));
    assert_eq!(a.state.request_count(), 2);
    let gap_ab = b.state.requests()[1].at - a.state.requests()[1].at;
    assert!(gap_ab >= Duration::from_millis(600), "failover after the TTFT timeout: {gap_ab:?}");
}

#[tokio::test]
async fn client_errors_are_not_retried() {
    let a = sim("a", &["m"], |c| c.max_model_len = 20).await;
    let b = sim("b", &["m"], |c| c.max_model_len = 20).await;
    let gw = gateway(&two(a.url(), b.url()), |_| {}).await;
    let long = "word ".repeat(40);
    let r = post(&gw.url("/v1/chat/completions"), &chat("m", &long)).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], "context_length_exceeded");
    a.state.set_fault(Some(Fault::ContentPolicy), None);
    let r = post(&gw.url("/v1/chat/completions"), &chat("m", "forbidden")).await;
    assert_eq!(r.status, 400);
    assert_eq!(r.json()["error"]["code"], "content_policy_violation");
    assert_eq!((a.state.request_count(), b.state.request_count()), (2, 0), "one attempt each, no retry");
}

#[tokio::test]
async fn fallback_models_serve_context_length_errors_and_unservable_models() {
    let small = sim("small-1", &["small"], |c| c.max_model_len = 30).await;
    let big = sim("big-1", &["big"], |c| c.max_model_len = 4096).await;
    let yaml = format!(
        "{}models:\n  - {{name: small, fallbacks: [big], routes: [{{cluster: small-1}}]}}\n  - {{name: big, routes: [{{cluster: big-1}}]}}\n",
        clusters_yaml(&[("small-1", small.url(), "EU"), ("big-1", big.url(), "EU")])
    );
    let gw = gateway(&yaml, |_| {}).await;
    let r = post(&gw.url("/v1/chat/completions"), &chat("small", "short")).await;
    assert_eq!((r.status, r.header("x-flotilla-model").as_str()), (200, "small"));
    let long = "word ".repeat(100);
    let r = post(&gw.url("/v1/chat/completions"), &chat("small", &long)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!((r.cluster().as_str(), r.header("x-flotilla-model").as_str()), ("big-1", "big"));
    assert_eq!(r.json()["model"], "big", "the response names the model that served");
    assert_eq!(r.json()["usage"]["prompt_tokens"], 100, "and carries its usage");
    small.state.set_fault(Some(Fault::Reset), None);
    let r = post(&gw.url("/v1/chat/completions"), &chat_stream("small", "short", true)).await;
    assert_eq!((r.status, r.header("x-flotilla-model").as_str()), (200, "big"));
    assert!(r.text.contains("\"model\":\"big\""));
    assert_eq!(small.state.request_count(), 3);
    assert_eq!(big.state.request_count(), 2);
    let m = get(&gw.url("/metrics")).await.text;
    assert!(m.contains("flotilla_gateway_fallbacks_total{model=\"small\"} 2"), "{m}");
}

#[tokio::test]
async fn the_total_deadline_bounds_retries() {
    let a = sim("a", &["m"], |c| c.fault = Some(Fault::NoResponse)).await;
    let b = sim("b", &["m"], |c| c.fault = Some(Fault::NoResponse)).await;
    let gw = gateway(&two(a.url(), b.url()), |c| {
        c.deadline_ms = 700;
        c.request_timeout_ms = 500;
    })
    .await;
    let r = post(&gw.url("/v1/completions"), &json!({"model": "m", "prompt": "x"})).await;
    // Both clusters were tried once and went silent: no allowed cluster can serve.
    assert_eq!(r.status, 503, "{}", r.text);
    assert_eq!(
        a.state.request_count() + b.state.request_count(),
        2,
        "one attempt per silent cluster, then the deadline"
    );
}
