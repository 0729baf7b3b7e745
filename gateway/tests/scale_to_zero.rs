//! Requests for a model scaled to zero (`scaleToZero: true`, no Ready route): held by the
//! gateway until a route appears in the table, then served; a 503 with `Retry-After` when the
//! wait expires or the hold queue is full; a model not marked so is refused at once as before.

mod common;

use std::time::{Duration, Instant};

use common::{clusters_yaml, gateway, get, post, sim, write_atomic};
use serde_json::json;

fn table(url: &str, routes: &str, scale_to_zero: bool) -> String {
    format!(
        "{}models:\n  - {{name: m, scaleToZero: {scale_to_zero}, routes: [{routes}]}}\n",
        clusters_yaml(&[("eu1", url.to_string(), "EU")])
    )
}

fn body() -> serde_json::Value {
    json!({"model": "m", "messages": [{"role": "user", "content": "wake up"}], "max_tokens": 3})
}

fn metric(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

async fn wait_held(gw: &common::Gateway, n: usize) {
    let until = Instant::now() + Duration::from_secs(5);
    while gw.state.autoscale.activation.held("m") < n {
        assert!(Instant::now() < until, "{n} requests were never held");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn a_request_at_zero_is_held_and_served_once_a_replica_is_ready() {
    let eu1 = sim("eu1", &["m"], |_| {}).await;
    let gw = gateway(&table(&eu1.url(), "", true), |c| c.activation_timeout_ms = 10_000).await;
    // The model stays listed at zero replicas.
    let models = get(&gw.url("/v1/models")).await.json();
    assert_eq!(models["data"][0]["id"], "m");
    let started = Instant::now();
    let url = gw.url("/v1/chat/completions");
    let held = tokio::spawn(async move { post(&url, &body()).await });
    wait_held(&gw, 1).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!held.is_finished(), "held, not refused");
    assert_eq!(eu1.state.request_count(), 0);
    assert_eq!(metric(&gw.state.metrics.render(), "flotilla_gateway_held_requests{"), 1.0);
    // The replica becomes Ready: the table gains the route, the held request goes.
    write_atomic(&gw.table, &table(&eu1.url(), "{cluster: eu1}", true));
    let answer = held.await.unwrap();
    assert_eq!(answer.status, 200, "{}", answer.text);
    assert_eq!(answer.cluster(), "eu1");
    assert!(started.elapsed() >= Duration::from_millis(300));
    assert_eq!(eu1.state.request_count(), 1);
    let m = gw.state.metrics.render();
    assert_eq!(metric(&m, "flotilla_gateway_held_requests_ended_total{result=\"served\"}"), 1.0, "{m}");
    assert_eq!(metric(&m, "flotilla_gateway_cold_start_seconds_count"), 1.0, "{m}");
    assert_eq!(metric(&m, "flotilla_gateway_held_requests{"), 0.0);
    // With a Ready route nothing is held.
    assert_eq!(post(&gw.url("/v1/chat/completions"), &body()).await.status, 200);
    assert_eq!(metric(&gw.state.metrics.render(), "flotilla_gateway_held_requests_ended_total"), 1.0);
}

#[tokio::test]
async fn a_held_request_whose_wait_expires_gets_503_with_retry_after() {
    let eu1 = sim("eu1", &["m"], |_| {}).await;
    let gw = gateway(&table(&eu1.url(), "", true), |c| {
        c.activation_timeout_ms = 400;
        c.activation_retry_after_s = 7;
    })
    .await;
    let started = Instant::now();
    let answer = post(&gw.url("/v1/chat/completions"), &body()).await;
    assert!(started.elapsed() >= Duration::from_millis(400), "it waited");
    assert_eq!(answer.status, 503, "{}", answer.text);
    assert_eq!(answer.header("retry-after"), "7");
    let e = answer.json();
    assert_eq!(e["error"]["code"], "model_activating");
    assert_eq!(e["error"]["type"], "service_unavailable_error");
    let message = e["error"]["message"].as_str().unwrap();
    assert!(message.contains("starting from zero") && message.contains("--activation-timeout-ms"), "{message}");
    assert_eq!(eu1.state.request_count(), 0, "nothing reached the engine");
    let m = gw.state.metrics.render();
    assert_eq!(metric(&m, "flotilla_gateway_held_requests_ended_total{result=\"expired\"}"), 1.0, "{m}");
}

#[tokio::test]
async fn a_full_hold_queue_refuses_at_once_and_the_held_ones_are_served() {
    let eu1 = sim("eu1", &["m"], |_| {}).await;
    let gw = gateway(&table(&eu1.url(), "", true), |c| {
        c.activation_timeout_ms = 10_000;
        c.activation_queue = 2;
    })
    .await;
    let held: Vec<_> = (0..2)
        .map(|_| {
            let url = gw.url("/v1/chat/completions");
            tokio::spawn(async move { post(&url, &body()).await })
        })
        .collect();
    wait_held(&gw, 2).await;
    let started = Instant::now();
    let refused = post(&gw.url("/v1/chat/completions"), &body()).await;
    assert!(started.elapsed() < Duration::from_secs(2), "refused at once, not held");
    assert_eq!(refused.status, 503, "{}", refused.text);
    assert!(!refused.header("retry-after").is_empty());
    assert!(refused.json()["error"]["message"].as_str().unwrap().contains("--activation-queue"));
    write_atomic(&gw.table, &table(&eu1.url(), "{cluster: eu1}", true));
    for h in held {
        assert_eq!(h.await.unwrap().status, 200);
    }
    let m = gw.state.metrics.render();
    assert_eq!(metric(&m, "flotilla_gateway_held_requests_ended_total{result=\"queue_full\"}"), 1.0, "{m}");
    assert_eq!(metric(&m, "flotilla_gateway_held_requests_ended_total{result=\"served\"}"), 2.0, "{m}");
}

#[tokio::test]
async fn a_model_not_scaled_to_zero_is_refused_at_once_as_before() {
    let eu1 = sim("eu1", &["m"], |_| {}).await;
    let gw = gateway(&table(&eu1.url(), "", false), |c| c.activation_timeout_ms = 10_000).await;
    let started = Instant::now();
    let answer = post(&gw.url("/v1/chat/completions"), &body()).await;
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(answer.status, 503, "{}", answer.text);
    assert_eq!(answer.json()["error"]["code"], "no_healthy_cluster");
    assert_eq!(metric(&gw.state.metrics.render(), "flotilla_gateway_held_requests_ended_total"), 0.0);
}
