//! Requests held for models scaled to zero share the gateway fairly with warm models, on a real
//! listener and an engine simulator: a held request gives its concurrency slot back while it
//! waits (so a gateway with 4 slots keeps serving a warm model while 8 requests wait for two
//! cold ones), and the held requests and their body bytes are capped per model and in all,
//! each cap answering 503 `activation_queue_full` with `Retry-After` for the cold model only.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::{Gateway, clusters_yaml, gateway, post, sim, write_atomic};
use serde_json::{Value, json};

const WARM: &str = "gpt-oss-120b";

/// `WARM` on eu1; `cold-a` and `cold-b` scaled to zero, with a route on eu1 once `ready`.
fn table(url: &str, ready: &[&str]) -> String {
    let mut t = clusters_yaml(&[("eu1", url.to_string(), "EU")]);
    t.push_str(&format!("models:\n  - {{name: {WARM}, routes: [{{cluster: eu1}}]}}\n"));
    for m in ["cold-a", "cold-b"] {
        let routes = if ready.contains(&m) { "{cluster: eu1}" } else { "" };
        t.push_str(&format!("  - {{name: {m}, scaleToZero: true, routes: [{routes}]}}\n"));
    }
    t
}

fn body(model: &str, prompt: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 3})
}

fn metric(gw: &Gateway, series: &str) -> f64 {
    let text = gw.state.metrics.render();
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok()).unwrap_or(0.0)
}

/// Send `n` requests for `model` in the background and wait (at most 10 s) until they are held.
fn hold(gw: &Gateway, model: &str, n: usize) -> Vec<tokio::task::JoinHandle<common::Answer>> {
    (0..n)
        .map(|i| {
            let (url, b) = (gw.url("/v1/chat/completions"), body(model, &format!("wake {i}")));
            tokio::spawn(async move { post(&url, &b).await })
        })
        .collect()
}

async fn wait_held(gw: &Gateway, total: usize) {
    let until = Instant::now() + Duration::from_secs(10);
    while gw.state.autoscale.activation.held_total() < total {
        assert!(
            Instant::now() < until,
            "{total} requests were never held at once ({} are)",
            gw.state.autoscale.activation.held_total()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn warm_answers(gw: &Gateway, n: usize, phase: &str) {
    for i in 0..n {
        let r = post(&gw.url("/v1/chat/completions"), &body(WARM, &format!("{phase} {i}"))).await;
        assert_eq!(r.status, 200, "{phase}: the warm model must answer while cold ones wait: {}", r.text);
    }
}

#[tokio::test]
async fn requests_held_for_cold_models_leave_every_slot_to_warm_ones() {
    let eu1 = sim("eu1", &[WARM, "cold-a", "cold-b"], |_| {}).await;
    let gw = gateway(&table(&eu1.url(), &[]), |c| {
        c.max_concurrency = 4;
        c.activation_timeout_ms = 60_000;
    })
    .await;
    // As many held requests as the gateway has slots: the warm model still answers.
    let mut held = hold(&gw, "cold-a", 2);
    held.extend(hold(&gw, "cold-b", 2));
    wait_held(&gw, 4).await;
    warm_answers(&gw, 6, "4 held").await;
    // Twice as many: they are still held (not refused with gateway_overloaded), and the warm
    // model still answers.
    held.extend(hold(&gw, "cold-a", 2));
    held.extend(hold(&gw, "cold-b", 2));
    wait_held(&gw, 8).await;
    warm_answers(&gw, 6, "8 held").await;
    assert_eq!(eu1.state.request_count(), 12, "only the warm requests reached the engine");
    assert!(held.iter().all(|h| !h.is_finished()), "every cold request is still held");
    assert_eq!(metric(&gw, "flotilla_gateway_held_requests_ended_total{result=\"queue_full\"}"), 0.0);

    // One model at a time becomes Ready (four held requests fit the four slots): each held
    // request takes a slot again and is served.
    let (a, b): (Vec<_>, Vec<_>) = held.into_iter().enumerate().partition(|(i, _)| i % 4 < 2);
    write_atomic(&gw.table, &table(&eu1.url(), &["cold-a"]));
    for (_, h) in a {
        let r = h.await.unwrap();
        assert_eq!((r.status, r.header("x-flotilla-model")), (200, "cold-a".to_string()), "{}", r.text);
    }
    write_atomic(&gw.table, &table(&eu1.url(), &["cold-a", "cold-b"]));
    for (_, h) in b {
        let r = h.await.unwrap();
        assert_eq!((r.status, r.header("x-flotilla-model")), (200, "cold-b".to_string()), "{}", r.text);
    }
    assert_eq!(eu1.state.request_count(), 20);
    assert_eq!(gw.state.autoscale.activation.held_total(), 0);
    assert_eq!(gw.state.limit.available_permits(), 4, "every slot was given back");
}

#[tokio::test]
async fn a_full_hold_refuses_that_model_only_and_names_the_cap() {
    let eu1 = sim("eu1", &[WARM, "cold-a", "cold-b"], |_| {}).await;
    let gw = gateway(&table(&eu1.url(), &[]), |c| {
        c.activation_timeout_ms = 60_000;
        c.activation_retry_after_s = 7;
        c.activation_queue = 2;
        c.activation_queue_total = 3;
    })
    .await;
    let mut held = hold(&gw, "cold-a", 2);
    wait_held(&gw, 2).await;
    held.extend(hold(&gw, "cold-b", 1));
    wait_held(&gw, 3).await;
    let refused = |model: &'static str, flag: &'static str| {
        let url = gw.url("/v1/chat/completions");
        async move {
            let r = post(&url, &body(model, "one more")).await;
            assert_eq!(r.status, 503, "{model}: {}", r.text);
            assert_eq!(r.header("retry-after"), "7");
            let e = &r.json()["error"];
            assert_eq!(
                (e["code"].as_str(), e["type"].as_str()),
                (Some("activation_queue_full"), Some("service_unavailable_error"))
            );
            let message = e["message"].as_str().unwrap();
            assert!(message.contains(&format!("`{model}`")) && message.contains(&format!("({flag})")), "{message}");
        }
    };
    // cold-a has its 2; cold-b has room of its own, but the 3 held in all are the cap.
    refused("cold-a", "--activation-queue").await;
    refused("cold-b", "--activation-queue-total").await;
    warm_answers(&gw, 3, "caps reached").await;
    let cap = |c: &str| metric(&gw, &format!("flotilla_gateway_held_requests_refused_total{{cap=\"{c}\"}}"));
    assert_eq!(
        (cap("model_requests"), cap("total_requests"), cap("model_bytes"), cap("total_bytes")),
        (1.0, 1.0, 0.0, 0.0)
    );
    assert_eq!(metric(&gw, "flotilla_gateway_held_requests_ended_total{result=\"queue_full\"}"), 2.0);
    assert_eq!(gw.state.autoscale.activation.held_total(), 3, "the refused were never held");

    write_atomic(&gw.table, &table(&eu1.url(), &["cold-a", "cold-b"]));
    for h in held {
        assert_eq!(h.await.unwrap().status, 200);
    }
    assert_eq!(eu1.state.request_count(), 6, "3 warm and the 3 held; nothing refused reached the engine");
}

#[tokio::test]
async fn held_body_bytes_are_capped_per_model_and_in_all() {
    let eu1 = sim("eu1", &[WARM, "cold-a", "cold-b"], |_| {}).await;
    let gw = gateway(&table(&eu1.url(), &[]), |c| {
        c.activation_timeout_ms = 60_000;
        c.activation_queue_bytes = 3000;
        c.activation_queue_total_bytes = 4000;
    })
    .await;
    let big = |model: &str| body(model, &"x".repeat(1800));
    let size = |b: &Value| b.to_string().len() as f64;
    let url = gw.url("/v1/chat/completions");
    let first = {
        let (url, b) = (url.clone(), big("cold-a"));
        tokio::spawn(async move { post(&url, &b).await })
    };
    wait_held(&gw, 1).await;
    assert_eq!(metric(&gw, "flotilla_gateway_held_request_bytes"), size(&big("cold-a")));
    // A second big one for cold-a would pass 3000 bytes for the model.
    let r = post(&url, &big("cold-a")).await;
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (503, Some("activation_queue_full")), "{}", r.text);
    assert!(r.text.contains("--activation-queue-bytes") && !r.header("retry-after").is_empty(), "{}", r.text);
    // cold-b's big one fits (about 3700 of 4000 in all); a small one more would not (within
    // cold-b's own 3000, over the 4000 of every model).
    let second = {
        let (url, b) = (url.clone(), big("cold-b"));
        tokio::spawn(async move { post(&url, &b).await })
    };
    wait_held(&gw, 2).await;
    let r = post(&url, &body("cold-b", &"y".repeat(500))).await;
    assert_eq!(r.status, 503, "{}", r.text);
    assert!(r.text.contains("--activation-queue-total-bytes"), "{}", r.text);
    // A big body for the warm model is not held, so no hold cap applies to it.
    let r = post(&url, &big(WARM)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let cap = |c: &str| metric(&gw, &format!("flotilla_gateway_held_requests_refused_total{{cap=\"{c}\"}}"));
    assert_eq!((cap("model_bytes"), cap("total_bytes")), (1.0, 1.0));

    write_atomic(&gw.table, &table(&eu1.url(), &["cold-a", "cold-b"]));
    assert_eq!(first.await.unwrap().status, 200);
    assert_eq!(second.await.unwrap().status, 200);
    assert_eq!(metric(&gw, "flotilla_gateway_held_request_bytes"), 0.0, "every held byte was let go");
}
