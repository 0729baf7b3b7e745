//! Configuration that cannot mislead: a `/v1` suffix on a cluster URL is dropped and routes; a
//! wrong path (a bare upstream 404) or a refused upstream credential is a configuration fault
//! of the cluster (a health reason in `/readyz` and `cluster_misconfigured`, an honest 502
//! `upstream_misconfigured` without `Retry-After`), not an outage, while an engine's "unknown
//! model" 404 is not; the startup check finds a wrong URL before any request; per-cluster
//! upstream tokens reach the engine and the client's key never does; no key source needs
//! `--allow-anonymous`; an entry point without vLLM metrics is scraped rarely.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use common::*;
use flotilla_gateway::AppState;

fn one_model(clusters: &[(&str, String, &str)], routes: &str) -> String {
    format!("{}models:\n  - {{name: m, routes: [{routes}]}}\n", clusters_yaml(clusters))
}

fn metric(m: &str, line: &str) -> bool {
    m.lines().any(|l| l == line)
}

#[tokio::test]
async fn a_v1_suffix_is_dropped_and_the_cluster_routes() {
    let a = sim("a", &["m"], |_| {}).await;
    let yaml = one_model(&[("a", format!("{}/v1/", a.url()), "EU")], "{cluster: a}");
    let gw = gateway(&yaml, |_| {}).await;
    let r = post(&gw.url("/v1/chat/completions"), &chat("m", "hi")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(a.state.requests()[0].path, "/v1/chat/completions", "not /v1/v1/chat/completions");
}

#[tokio::test]
async fn a_wrong_path_is_a_configuration_fault_not_an_outage() {
    let a = sim("a", &["m"], |_| {}).await;
    // A base URL with a path the engine does not have: every API call 404s without an error body.
    let yaml = one_model(&[("a", format!("{}/api", a.url()), "EU")], "{cluster: a}");
    let gw = gateway(&yaml, |_| {}).await;
    let r = post(&gw.url("/v1/chat/completions"), &chat("m", "hi")).await;
    assert_eq!(r.status, 502, "{}", r.text);
    let e = r.json();
    assert_eq!(e["error"]["code"], "upstream_misconfigured");
    assert!(e["error"]["message"].as_str().unwrap().contains("a: UpstreamNotFound"), "{e}");
    assert!(r.headers.get("retry-after").is_none(), "retrying does not help: no Retry-After");
    let (reason, message) = gw.state.health.get("a").fault().expect("a health reason");
    assert_eq!(format!("{reason:?}"), "UpstreamNotFound");
    assert!(message.contains("/api/v1/chat/completions") && message.contains("no /v1"), "{message}");
    let m = get(&gw.url("/metrics")).await.text;
    assert!(metric(&m, "flotilla_gateway_cluster_misconfigured{cluster=\"a\",reason=\"UpstreamNotFound\"} 1"), "{m}");
    let ready = get(&gw.url("/readyz")).await;
    assert_eq!(ready.status, 503);
    assert!(ready.text.contains("cluster a MISCONFIGURED (UpstreamNotFound)"), "{}", ready.text);
    // The next request is answered at once, without another attempt on the misconfigured cluster.
    let r = post(&gw.url("/v1/chat/completions"), &chat("m", "again")).await;
    assert_eq!(r.json()["error"]["code"], "upstream_misconfigured");
    assert!(metric(&m, "flotilla_gateway_upstream_attempts_total{cluster=\"a\",result=\"client_error\"} 1"), "{m}");
    let m = get(&gw.url("/metrics")).await.text;
    assert!(metric(&m, "flotilla_gateway_upstream_attempts_total{cluster=\"a\",result=\"client_error\"} 1"), "{m}");
    assert_eq!(a.state.request_count(), 0, "nothing reached the engine's API");

    // Fixing the URL in the table clears the fault and the model serves.
    write_atomic(&gw.table, &one_model(&[("a", a.url(), "EU")], "{cluster: a}"));
    eventually("the fixed table in force", || gw.state.health.get("a").fault().is_none()).await;
    let r = post(&gw.url("/v1/chat/completions"), &chat("m", "fixed")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let m = get(&gw.url("/metrics")).await.text;
    assert!(metric(&m, "flotilla_gateway_cluster_misconfigured{cluster=\"a\",reason=\"UpstreamNotFound\"} 0"), "{m}");
}

#[tokio::test]
async fn a_misconfigured_cluster_is_skipped_for_a_healthy_one() {
    let a = sim("a", &["m"], |_| {}).await;
    let b = sim("b", &["m"], |_| {}).await;
    let yaml =
        one_model(&[("a", format!("{}/api", a.url()), "EU"), ("b", b.url(), "EU")], "{cluster: a}, {cluster: b}");
    let gw = gateway(&yaml, |_| {}).await;
    for i in 0..4 {
        let r = post(&gw.url("/v1/chat/completions"), &chat("m", &format!("q{i}"))).await;
        assert_eq!((r.status, r.cluster().as_str()), (200, "b"), "{}", r.text);
    }
    let m = get(&gw.url("/metrics")).await.text;
    assert!(metric(&m, "flotilla_gateway_upstream_attempts_total{cluster=\"a\",result=\"client_error\"} 1"), "{m}");
    assert_eq!(get(&gw.url("/readyz")).await.status, 200, "b serves");
}

#[tokio::test]
async fn an_engines_unknown_model_404_is_not_a_configuration_fault() {
    // The engine serves `other` only: its 404 for `m` carries an OpenAI error body.
    let a = sim("a", &["other"], |_| {}).await;
    let yaml = format!(
        "{}models:\n  - {{name: m, routes: [{{cluster: a}}]}}\n  - {{name: other, routes: [{{cluster: a}}]}}\n",
        clusters_yaml(&[("a", a.url(), "EU")])
    );
    let gw = gateway(&yaml, |_| {}).await;
    let r = post(&gw.url("/v1/chat/completions"), &chat("m", "hi")).await;
    assert_ne!(r.json()["error"]["code"], "upstream_misconfigured", "{}", r.text);
    assert!(gw.state.health.get("a").fault().is_none(), "a model problem does not mark the cluster");
    let m = get(&gw.url("/metrics")).await.text;
    assert!(!m.contains("flotilla_gateway_cluster_misconfigured{"), "{m}");
    let r = post(&gw.url("/v1/chat/completions"), &chat("other", "hi")).await;
    assert_eq!(r.status, 200, "the cluster's other model still serves: {}", r.text);
}

#[tokio::test]
async fn the_startup_check_finds_a_wrong_url_before_any_request() {
    let a = sim("a", &["m"], |_| {}).await;
    let b = sim("b", &["m"], |_| {}).await;
    let yaml =
        one_model(&[("a", format!("{}/api", a.url()), "EU"), ("b", b.url(), "EU")], "{cluster: a}, {cluster: b}");
    let gw = gateway(&yaml, |c| {
        c.probe_interval_ms = 100;
        c.probe_timeout_ms = 500;
    })
    .await;
    eventually("a's wrong URL found by the check", || gw.state.health.get("a").fault().is_some()).await;
    assert!(gw.state.health.get("b").fault().is_none(), "b answers its model list");
    let ready = get(&gw.url("/readyz")).await;
    assert!(ready.text.contains("cluster a MISCONFIGURED (UpstreamNotFound)") && ready.status == 200, "{}", ready.text);
    let m = get(&gw.url("/metrics")).await.text;
    assert!(!m.contains("flotilla_gateway_upstream_attempts_total{cluster=\"a\""), "no user request was spent: {m}");
}

#[tokio::test]
async fn a_clusters_token_reaches_its_engine_and_the_clients_key_never_does() {
    let a = sim("a", &["m"], |c| c.api_key = Some("engine-secret".into())).await;
    let token = temp_path("token");
    std::fs::write(&token, "engine-secret\n").unwrap();
    let yaml = format!(
        "clusters:\n  - {{name: a, url: \"{}\", jurisdiction: EU, tokenFile: \"{}\"}}\nmodels:\n  - {{name: m, routes: [{{cluster: a}}]}}\n",
        a.url(),
        token.display()
    );
    let gw = gateway(&yaml, |c| c.api_keys = vec!["client-key".into()]).await;
    let auth = [("authorization", "Bearer client-key")];
    let r = post_with(&gw.url("/v1/chat/completions"), &chat("m", "hi"), &auth).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let sent = &a.state.requests()[0].headers;
    let authz: Vec<&str> = sent.iter().filter(|(k, _)| k == "authorization").map(|(_, v)| v.as_str()).collect();
    assert_eq!(authz, ["Bearer engine-secret"], "exactly the cluster's token");
    assert!(!sent.iter().any(|(_, v)| v.contains("client-key")), "the client's key never reaches the engine");
    assert_eq!(a.state.unauthorized(), 0);
    let dbg = format!("{:?}", gw.state.table.load());
    assert!(!dbg.contains("engine-secret"), "the token is never printed");

    // Without the token the engine refuses: a configuration fault, said so.
    let yaml = one_model(&[("a", a.url(), "EU")], "{cluster: a}");
    write_atomic(&gw.table, &yaml);
    eventually("the table without a token", || gw.state.table.load().clusters().all(|c| c.auth.is_none())).await;
    let r = post_with(&gw.url("/v1/chat/completions"), &chat("m", "hi"), &auth).await;
    assert_eq!(r.status, 502, "{}", r.text);
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("a: UpstreamUnauthorized"), "{}", r.text);
    assert_eq!(a.state.unauthorized(), 1);
    let _ = std::fs::remove_file(&token);
}

#[tokio::test]
async fn no_key_source_needs_allow_anonymous() {
    let table = temp_path("anon");
    write_atomic(&table, "clusters: []\nmodels: []\n");
    let mut cfg = test_config(table.clone());
    cfg.allow_anonymous = false;
    let e = AppState::load(cfg.clone()).unwrap_err().to_string();
    assert!(e.contains("--allow-anonymous") && e.contains("--keys-file"), "{e}");
    cfg.allow_anonymous = true;
    assert!(AppState::load(cfg.clone()).is_ok());
    cfg.allow_anonymous = false;
    cfg.api_keys = vec!["k".into()];
    assert!(AppState::load(cfg).is_ok(), "a key source needs no flag");
    let _ = std::fs::remove_file(&table);
}

/// An upstream whose `/metrics` is vLLM's (`vllm`) or a 404; counts the scrapes.
async fn metrics_server(vllm: bool) -> (String, Arc<AtomicU64>) {
    let hits = Arc::new(AtomicU64::new(0));
    let h = hits.clone();
    let app = axum::Router::new().route(
        "/metrics",
        axum::routing::get(move || {
            let h = h.clone();
            async move {
                h.fetch_add(1, Ordering::Relaxed);
                if vllm {
                    (http::StatusCode::OK, "vllm:num_requests_waiting{model_name=\"m\"} 4\n")
                } else {
                    (http::StatusCode::NOT_FOUND, "")
                }
            }
        }),
    );
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(l, app).await.unwrap() });
    (url, hits)
}

#[tokio::test]
async fn an_entry_without_vllm_metrics_is_scraped_rarely() {
    let (engine, engine_hits) = metrics_server(true).await;
    let (other, other_hits) = metrics_server(false).await;
    let yaml = one_model(&[("engine", engine, "EU"), ("other", other, "EU")], "{cluster: engine}, {cluster: other}");
    let gw = gateway(&yaml, |c| {
        c.scrape_interval_ms = 20;
        c.scrape_quiet_after = 3;
    })
    .await;
    eventually("the engine scraped 30 times", || engine_hits.load(Ordering::Relaxed) >= 30).await;
    // 3 misses at 20 ms, then 40, 80, 160, 320 ms...: a handful over the engine's 30.
    let other = other_hits.load(Ordering::Relaxed);
    assert!((3..=8).contains(&other), "{other} scrapes of the entry without vLLM metrics");
    assert_eq!(gw.state.health.get("engine").queue_depth(), 4);
    let m = get(&gw.url("/metrics")).await.text;
    assert!(metric(&m, "flotilla_gateway_scrape_quiet{cluster=\"other\"} 1"), "{m}");
    assert!(!m.contains("flotilla_gateway_scrape_quiet{cluster=\"engine\"}"), "{m}");
}
