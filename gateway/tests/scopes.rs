//! Health in the right scope, against simulators on loopback: one model's 429 or 5xx never
//! blocks another model on the same cluster, a model's breaker opens on its own failures
//! whatever the others do, transport failures eject the whole cluster, a long `Retry-After`
//! reaches the client as 429 (never masked as 503, also when a fallback could not be tried),
//! and ejected routes come back through background probes without a user request spent on
//! them. Assertions count the requests each simulator saw.

mod common;

use std::time::{Duration, Instant};

use common::*;
use flotilla_enginesim::Fault;

fn one_cluster(url: String, models: &str) -> String {
    format!("{}models:\n{models}", clusters_yaml(&[("c", url, "EU")]))
}

async fn ask(gw: &Gateway, model: &str) -> Answer {
    post(&gw.url("/v1/chat/completions"), &chat(model, "hi")).await
}

#[tokio::test]
async fn one_models_429_leaves_its_neighbour_alone_and_keeps_its_retry_after() {
    let c = sim("c", &["busy", "calm"], |_| {}).await;
    c.state.set_model_fault("busy", Some(Fault::RateLimit(Some(30))), None);
    let models = "  - {name: busy, routes: [{cluster: c}]}\n  - {name: calm, routes: [{cluster: c}]}\n";
    let gw = gateway(&one_cluster(c.url(), models), |_| {}).await;

    let r = ask(&gw, "busy").await;
    assert_eq!((r.status, r.header("retry-after").as_str()), (429, "30"), "{}", r.text);
    assert_eq!(r.json()["error"]["code"], "rate_limit_exceeded");
    for _ in 0..3 {
        let r = ask(&gw, "calm").await;
        assert_eq!((r.status, r.cluster().as_str()), (200, "c"), "the healthy model is unaffected: {}", r.text);
    }
    assert_eq!(c.state.requests_for("calm"), 3);

    // While `busy` cools down, its clients hear the honest remaining wait, not 503 with 1 s.
    let r = ask(&gw, "busy").await;
    assert_eq!(r.status, 429, "{}", r.text);
    let after: u64 = r.header("retry-after").parse().unwrap();
    assert!((28..=30).contains(&after), "the cool-down's remaining Retry-After: {after}");
    assert_eq!(c.state.requests_for("busy"), 1, "a cooling route is not asked again");
}

#[tokio::test]
async fn the_original_429_wins_over_a_fallback_that_could_not_be_tried() {
    let c = sim("c", &["busy", "spare"], |_| {}).await;
    c.state.set_model_fault("spare", Some(Fault::Error503), None);
    let models =
        "  - {name: busy, fallbacks: [spare], routes: [{cluster: c}]}\n  - {name: spare, routes: [{cluster: c}]}\n";
    let gw = gateway(&one_cluster(c.url(), models), |g| g.breaker_failures = 1).await;
    let r = ask(&gw, "spare").await;
    assert_eq!(r.status, 503, "{}", r.text);
    assert!(gw.state.table.load().resolve("spare").unwrap().routes[0].health.model_circuit_open());

    c.state.set_model_fault("busy", Some(Fault::RateLimit(Some(30))), None);
    let r = ask(&gw, "busy").await;
    assert_eq!((r.status, r.header("retry-after").as_str()), (429, "30"), "{}", r.text);
    assert_eq!((c.state.requests_for("busy"), c.state.requests_for("spare")), (1, 1), "the fallback was not tried");
}

#[tokio::test]
async fn a_models_breaker_opens_on_its_own_failures_whatever_other_models_do() {
    let c = sim("c", &["bad", "good"], |_| {}).await;
    c.state.set_model_fault("bad", Some(Fault::Error500), None);
    let models = "  - {name: bad, routes: [{cluster: c}]}\n  - {name: good, routes: [{cluster: c}]}\n";
    let gw = gateway(&one_cluster(c.url(), models), |g| {
        g.breaker_failures = 3;
        g.max_attempts = 1;
        g.probe_interval_ms = 0;
    })
    .await;
    for _ in 0..3 {
        let r = ask(&gw, "bad").await;
        assert!(matches!(r.status, 502 | 503), "the engine's 500 (503 once it opened the breaker): {}", r.text);
        assert_eq!(ask(&gw, "good").await.status, 200, "successes of `good` between the failures");
    }
    let r = ask(&gw, "bad").await;
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (503, Some("no_healthy_cluster")), "{}", r.text);
    assert_eq!(c.state.requests_for("bad"), 3, "the breaker of `bad` opened after its own three failures");
    assert_eq!(ask(&gw, "good").await.status, 200, "and `good` still flows on the same cluster");
    assert_eq!(c.state.requests_for("good"), 4);
    assert!(!gw.state.health.get("c").circuit_open(), "the cluster itself is not ejected");
}

#[tokio::test]
async fn transport_failures_eject_the_cluster_for_every_model() {
    let t = sim("t", &["x", "y"], |_| {}).await;
    let u = sim("u", &["x", "y"], |_| {}).await;
    t.state.set_engine_down(Some(Duration::from_secs(600)));
    let yaml = format!(
        "{}models:\n  - {{name: x, routes: [{{cluster: t}}, {{cluster: u}}]}}\n  - {{name: y, routes: [{{cluster: t}}, {{cluster: u}}]}}\n",
        clusters_yaml(&[("t", t.url(), "EU"), ("u", u.url(), "EU")])
    );
    let gw = gateway(&yaml, |g| {
        g.breaker_failures = 2;
        g.probe_interval_ms = 0;
    })
    .await;
    for model in ["x", "y", "x", "y"] {
        let r = ask(&gw, model).await;
        assert_eq!((r.status, r.cluster().as_str()), (200, "u"), "{}", r.text);
    }
    assert_eq!(t.state.refused(), 2, "two resets (one per model) ejected the cluster for both");
    assert!(gw.state.health.get("t").circuit_open());
}

#[tokio::test]
async fn a_recovered_cluster_is_probed_back_into_use_without_spending_a_request() {
    let a = sim("a", &["m"], |_| {}).await;
    let b = sim("b", &["m"], |_| {}).await;
    a.state.set_engine_down(Some(Duration::from_secs(600)));
    let yaml = format!(
        "{}models:\n  - {{name: m, routes: [{{cluster: a}}, {{cluster: b}}]}}\n",
        clusters_yaml(&[("a", a.url(), "EU"), ("b", b.url(), "EU")])
    );
    // Open for a minute: only a probe can bring `a` back within this test.
    let gw = gateway(&yaml, |g| {
        g.breaker_failures = 1;
        g.breaker_open_ms = 60_000;
        g.probe_interval_ms = 100;
        g.probe_timeout_ms = 300;
    })
    .await;
    assert_eq!(ask(&gw, "m").await.cluster(), "b");
    assert_eq!(a.state.refused(), 1);
    let seen = a.state.probes();
    eventually("a is probed while down", || a.state.probes() >= seen + 2).await;
    for _ in 0..3 {
        assert_eq!(ask(&gw, "m").await.cluster(), "b");
    }
    assert_eq!(a.state.refused(), 1, "no user request was spent on the down cluster");
    assert!(!gw.state.health.get("a").breaker_available(Instant::now()), "failed probes keep it open");

    a.state.set_engine_down(None);
    eventually("a probe finds a back", || gw.state.health.get("a").breaker_available(Instant::now())).await;
    let r = ask(&gw, "m").await;
    assert_eq!((r.status, r.cluster().as_str()), (200, "a"), "the recovered cluster takes traffic again");
    assert!(!gw.state.health.get("a").circuit_open(), "and its circuit closed");
    assert_eq!(a.state.request_count(), 1);
    let m = get(&gw.url("/metrics")).await.text;
    assert!(m.contains("flotilla_gateway_probes_total{cluster=\"a\",kind=\"list\",result=\"failed\"}"), "{m}");
    assert!(m.contains("flotilla_gateway_probes_total{cluster=\"a\",kind=\"list\",result=\"ok\"}"), "{m}");
}

/// A gateway routing models `flap` and `steady` to `c`: one engine failure opens a model's
/// circuit for a minute, probes every 100 ms.
async fn flap_and_steady(c: &flotilla_enginesim::SimHandle) -> Gateway {
    let models = "  - {name: flap, routes: [{cluster: c}]}\n  - {name: steady, routes: [{cluster: c}]}\n";
    gateway(&one_cluster(c.url(), models), |g| {
        g.breaker_failures = 1;
        g.breaker_open_ms = 60_000;
        g.probe_interval_ms = 100;
        g.probe_timeout_ms = 300;
    })
    .await
}

#[tokio::test]
async fn a_flapping_model_stays_ejected_while_down_and_returns_when_listed_again() {
    let c = sim("c", &["flap", "steady"], |_| {}).await;
    let gw = flap_and_steady(&c).await;
    c.state.set_model_down("flap", Duration::from_millis(1500));
    assert_eq!(ask(&gw, "flap").await.status, 503, "the engine's 503 opened the model's breaker");
    let seen = c.state.probes();
    eventually("the model is probed while down", || c.state.probes() >= seen + 2).await;
    assert_eq!(ask(&gw, "flap").await.status, 503);
    // The probe asked the unlisted model for one token, each refused: no user request spent.
    let asked = probe_requests(&gw, "c").await;
    assert!(asked.get("failed").copied().unwrap_or(0) >= 1, "{asked:?}");
    assert_eq!(c.state.requests_for("flap") as u64, 1 + asked.values().sum::<u64>(), "{asked:?}");
    assert_eq!(ask(&gw, "steady").await.status, 200, "the other model on the cluster is served");

    let route = gw.state.table.load().resolve("flap").unwrap().routes[0].health.clone();
    eventually("the model is listed again", || route.available(Instant::now())).await;
    assert_eq!(ask(&gw, "flap").await.status, 200);
    assert!(!route.model_circuit_open());
}

/// `flotilla_gateway_probes_total{cluster,kind="request"}` by result.
async fn probe_requests(gw: &Gateway, cluster: &str) -> std::collections::BTreeMap<String, u64> {
    let text = get(&gw.url("/metrics")).await.text;
    let head = format!("flotilla_gateway_probes_total{{cluster=\"{cluster}\",kind=\"request\",result=\"");
    text.lines()
        .filter_map(|l| l.strip_prefix(&head))
        .filter_map(|rest| {
            let (result, value) = rest.split_once("\"} ")?;
            Some((result.to_string(), value.trim().parse().ok()?))
        })
        .collect()
}

#[tokio::test]
async fn a_recovered_model_its_engine_does_not_list_is_proven_by_one_token() {
    // `flap` is served but never listed (an engine listing a file path or a name of its own).
    let c = sim("c", &["flap", "steady"], |s| s.unlisted = vec!["flap".into()]).await;
    let gw = flap_and_steady(&c).await;
    c.state.set_model_down("flap", Duration::from_millis(1500));
    let started = Instant::now();
    assert_eq!(ask(&gw, "flap").await.status, 503, "the engine's 503 opened the model's breaker");
    let route = gw.state.table.load().resolve("flap").unwrap().routes[0].health.clone();
    assert!(route.model_circuit_open());
    // Down: every one-token probe is refused and keeps the circuit open.
    for i in 0.. {
        if probe_requests(&gw, "c").await.get("failed").copied().unwrap_or(0) >= 1 {
            break;
        }
        assert!(i < 200, "no one-token probe refused");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!route.available(Instant::now()), "still open while down");
    // Up again, still unlisted: a one-token answer reopens it long before its 60 s period.
    eventually("the unlisted model proven by one token", || route.available(Instant::now())).await;
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    assert!(probe_requests(&gw, "c").await.get("ok").copied().unwrap_or(0) >= 1);
    assert_eq!(ask(&gw, "flap").await.status, 200);
    assert!(!route.model_circuit_open(), "and its circuit closed");
}
