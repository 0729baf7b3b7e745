//! Cluster health and table changes under traffic: the circuit opens after consecutive
//! failures, a half-open probe closes it once the cluster recovers (and a failed probe
//! re-opens it); prefix affinity keeps a prompt prefix on one cluster within a load bound;
//! the routing table is hot-reloaded under load with zero failed requests; the concurrency
//! limit and graceful shutdown.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use common::*;
use flotilla_enginesim::Fault;
use flotilla_gateway::config::RoutingMode;

fn two(a: String, b: String) -> String {
    format!(
        "{}models:\n  - {{name: m, routes: [{{cluster: a}}, {{cluster: b}}]}}\n",
        clusters_yaml(&[("a", a, "EU"), ("b", b, "EU")])
    )
}

async fn ask(gw: &Gateway, prompt: &str) -> String {
    let r = post(&gw.url("/v1/chat/completions"), &chat("m", prompt)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    r.cluster()
}

#[tokio::test]
async fn circuit_opens_probes_and_closes_when_the_cluster_recovers() {
    let a = sim("a", &["m"], |c| c.fault = Some(Fault::Reset)).await;
    let b = sim("b", &["m"], |_| {}).await;
    let gw = gateway(&two(a.url(), b.url()), |c| {
        c.breaker_failures = 2;
        c.breaker_open_ms = 500;
    })
    .await;
    for _ in 0..2 {
        assert_eq!(ask(&gw, "x").await, "b");
    }
    assert_eq!(a.state.request_count(), 2);
    for _ in 0..3 {
        assert_eq!(ask(&gw, "x").await, "b");
    }
    assert_eq!(a.state.request_count(), 2, "open circuit: no traffic to a");
    let m = get(&gw.url("/metrics")).await.text;
    assert!(m.contains("flotilla_gateway_circuit_open{cluster=\"a\"} 1"), "{m}");

    tokio::time::sleep(Duration::from_millis(550)).await;
    assert_eq!(ask(&gw, "x").await, "b", "the probe to a failed, b served");
    assert_eq!(a.state.request_count(), 3, "exactly one probe");
    assert_eq!(ask(&gw, "x").await, "b");
    assert_eq!(a.state.request_count(), 3, "re-opened for a longer period (1 s)");

    a.state.set_fault(None, None);
    tokio::time::sleep(Duration::from_millis(1050)).await;
    assert_eq!(ask(&gw, "x").await, "a", "the probe succeeded");
    assert!(!gw.state.health.get("a").circuit_open(), "and closed the circuit");
    b.state.set_fault(Some(Fault::Error503), None);
    assert_eq!(ask(&gw, "y").await, "a", "a takes traffic again");
    let m = get(&gw.url("/metrics")).await.text;
    assert!(m.contains("flotilla_gateway_circuit_open{cluster=\"a\"} 0"), "{m}");
}

fn prompt(k: usize, q: usize) -> String {
    format!("System: you are assistant {k}. {} Question {q}?", "Keep answers short and cite sources. ".repeat(8))
}

#[tokio::test]
async fn prefix_affinity_keeps_a_prefix_on_one_cluster() {
    let sims = [sim("a", &["m"], |_| {}).await, sim("b", &["m"], |_| {}).await, sim("c", &["m"], |_| {}).await];
    let yaml = format!(
        "{}models:\n  - {{name: m, routes: [{{cluster: a}}, {{cluster: b}}, {{cluster: c}}]}}\n",
        clusters_yaml(&[("a", sims[0].url(), "EU"), ("b", sims[1].url(), "EU"), ("c", sims[2].url(), "EU")])
    );
    let gw = gateway(&yaml, |c| c.routing = RoutingMode::Prefix).await;
    let mut homes = std::collections::BTreeSet::new();
    for k in 0..8 {
        let first = ask(&gw, &prompt(k, 0)).await;
        for q in 1..4 {
            assert_eq!(ask(&gw, &prompt(k, q)).await, first, "prefix {k} moved");
        }
        homes.insert(first);
    }
    assert!(homes.len() >= 2, "different prefixes spread: {homes:?}");
}

#[tokio::test]
async fn prefix_affinity_is_bounded_by_load() {
    for (factor, spread) in [(1.25, true), (1000.0, false)] {
        let a = sim("a", &["m"], |c| c.ttft_ms = 300).await;
        let b = sim("b", &["m"], |c| c.ttft_ms = 300).await;
        let gw = Arc::new(
            gateway(&two(a.url(), b.url()), |c| {
                c.routing = RoutingMode::Prefix;
                c.load_factor = factor;
            })
            .await,
        );
        let mut tasks = Vec::new();
        for q in 0..8 {
            let gw = gw.clone();
            tasks.push(tokio::spawn(async move { ask(&gw, &prompt(1, q)).await }));
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        for t in tasks {
            t.await.unwrap();
        }
        let (na, nb) = (a.state.request_count(), b.state.request_count());
        assert_eq!(na + nb, 8);
        if spread {
            assert!(na >= 2 && nb >= 2, "load bound spills a hot prefix: a={na} b={nb}");
        } else {
            assert!(na == 8 || nb == 8, "without the bound the prefix stays home: a={na} b={nb}");
        }
    }
}

#[tokio::test]
async fn hot_reload_under_load_drops_nothing() {
    let a = sim("a", &["m"], |c| c.ttft_ms = 40).await;
    let b = sim("b", &["m"], |c| c.ttft_ms = 40).await;
    let clusters = clusters_yaml(&[("a", a.url(), "EU"), ("b", b.url(), "EU")]);
    let v1 = format!("{clusters}models:\n  - {{name: m, routes: [{{cluster: a}}]}}\n");
    let v2 = format!("{clusters}models:\n  - {{name: m, routes: [{{cluster: b}}]}}\n");
    let gw = Arc::new(gateway(&v1, |_| {}).await);
    let stop = Arc::new(AtomicBool::new(false));
    let failed = Arc::new(AtomicUsize::new(0));
    let mut workers = Vec::new();
    for w in 0..4 {
        let (gw, stop, failed) = (gw.clone(), stop.clone(), failed.clone());
        workers.push(tokio::spawn(async move {
            let mut served = Vec::new();
            while !stop.load(Ordering::Relaxed) {
                let body = if w % 2 == 0 { chat("m", "hi") } else { chat_stream("m", "hi", true) };
                let r = post(&gw.url("/v1/chat/completions"), &body).await;
                let ok = r.status == 200 && (w % 2 == 0 || r.text.ends_with("data: [DONE]\n\n"));
                if !ok {
                    failed.fetch_add(1, Ordering::Relaxed);
                }
                served.push(r.cluster());
            }
            served
        }));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    write_atomic(&gw.table, &v2);
    eventually("the new table is in force", || b.state.request_count() > 0).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    write_atomic(&gw.table, "clusters: [oops");
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.store(true, Ordering::Relaxed);
    for w in workers {
        let served = w.await.unwrap();
        assert_eq!(served.last().map(String::as_str), Some("b"), "every worker ends on the new table");
    }
    assert_eq!(failed.load(Ordering::Relaxed), 0, "no request failed across two reloads");
    assert!(a.state.request_count() > 0);
    assert_eq!(a.state.cancelled(), 0, "in-flight requests on the old table completed");
    let m = get(&gw.url("/metrics")).await.text;
    assert!(m.contains("flotilla_gateway_table_reloads_total{result=\"invalid\"} 1"), "{m}");
    assert!(m.contains("flotilla_gateway_table_reloads_total{result=\"applied\"} 2"), "{m}");
}

#[tokio::test]
async fn concurrency_limit_and_graceful_shutdown() {
    let a = sim("a", &["m"], |c| {
        c.ttft_ms = 300;
        c.default_tokens = 20;
        c.itl_ms = 10;
    })
    .await;
    let gw = gateway(
        &format!("{}models:\n  - {{name: m, routes: [{{cluster: a}}]}}\n", clusters_yaml(&[("a", a.url(), "EU")])),
        |c| c.max_concurrency = 1,
    )
    .await;
    let url = gw.url("/v1/chat/completions");
    let first = tokio::spawn({
        let url = url.clone();
        async move { post(&url, &chat_stream("m", "long", false)).await }
    });
    eventually("the first request is upstream", || a.state.request_count() == 1).await;
    let r = post(&url, &chat("m", "second")).await;
    assert_eq!(r.status, 503);
    assert_eq!(r.json()["error"]["code"], "gateway_overloaded");
    assert_eq!(r.header("retry-after"), "1");
    gw.shutdown().await;
    let r = first.await.unwrap();
    assert_eq!(r.status, 200);
    assert!(r.text.ends_with("data: [DONE]\n\n"), "the in-flight stream finished during the drain");
    assert_eq!(a.state.request_count(), 1);
}

#[tokio::test]
async fn scraped_queue_depth_steers_traffic_away_from_a_busy_cluster() {
    // `a` is saturated by traffic that does not pass through this gateway: one slot, long answers.
    let a = sim("a", &["m"], |c| {
        c.max_num_seqs = 1;
        c.ttft_ms = 5000;
    })
    .await;
    let b = sim("b", &["m"], |_| {}).await;
    let gw = gateway(&two(a.url(), b.url()), |c| c.scrape_interval_ms = 50).await;
    let direct = a.url() + "/v1/chat/completions";
    let mut others = Vec::new();
    for _ in 0..3 {
        let url = direct.clone();
        others.push(tokio::spawn(async move { post(&url, &chat("m", "elsewhere")).await }));
    }
    eventually("a's queue is scraped", || gw.state.health.get("a").queue_depth() == 2).await;
    for _ in 0..4 {
        assert_eq!(ask(&gw, "x").await, "b", "least load counts a's waiting queue");
    }
    assert_eq!(a.state.request_count(), 3, "only the outside traffic reached a");
    for t in others {
        t.abort();
    }
}
