//! The shared limits store failing under two `flotilla-gateway` processes, one for each of
//! `--limits-store-unavailable open` and `closed` (the default, `local`, is in
//! limits_store_fallback.rs), on a real `redis-server`: paused (it accepts connections
//! and never answers), killed (connections refused) and started again empty. While it is
//! down, `open` admits limited keys (counted and logged), `closed` answers them 503
//! `limits_store_unavailable` with `Retry-After`; keys without limits and the gateway itself
//! are served in both, and no request waits longer than the store's timeout. When the store is
//! back, both count against it again (the script loaded again into the empty server).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
mod redis_server;

use std::time::Duration;

use common::*;
use redis_server::*;

/// Await `f`, failing the test if it takes longer than 5 s: the store's timeout is 300 ms,
/// and a down store is not asked at all.
async fn bounded<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(Duration::from_secs(5), f).await {
        Ok(v) => v,
        Err(_) => panic!("{what} stalled for 5 s behind the limits store (its timeout is 300 ms)"),
    }
}

const ERRORS: [&str; 3] = [
    "flotilla_gateway_limits_store_errors_total{reason=\"timeout\"}",
    "flotilla_gateway_limits_store_errors_total{reason=\"connection\"}",
    "flotilla_gateway_limits_store_errors_total{reason=\"server\"}",
];

async fn errors(gw: &GatewayProcess) -> f64 {
    let mut n = 0.0;
    for e in ERRORS {
        n += metric(gw, e).await;
    }
    n
}

fn unavailable(outcome: &str) -> String {
    format!("flotilla_gateway_limits_store_unavailable_total{{outcome=\"{outcome}\"}}")
}

/// The store is down: what each mode answers, promptly, and what it counts.
async fn while_down(open: &GatewayProcess, closed: &GatewayProcess, phase: &str) {
    let (admitted, refused) =
        (metric(open, &unavailable("admitted")).await, metric(closed, &unavailable("refused")).await);
    for i in 0..5 {
        let q = chat("m", &format!("{phase} {i}"));
        let r = bounded("a limited key on the open gateway", ask(open, "sk-team", &q)).await;
        assert_eq!(r.status, 200, "{phase}: open admits: {}", r.text);
        let r = bounded("another limited key on the open gateway", ask(open, "sk-other", &q)).await;
        assert_eq!(r.status, 200, "{phase}: {}", r.text);
        for k in ["sk-team", "sk-other"] {
            let r = bounded("a limited key on the closed gateway", ask(closed, k, &q)).await;
            assert_eq!(r.status, 503, "{phase}: closed refuses {k}: {}", r.text);
            let e = &r.json()["error"];
            assert_eq!(
                (e["code"].as_str(), e["type"].as_str()),
                (Some("limits_store_unavailable"), Some("service_unavailable_error"))
            );
            assert!(e["message"].as_str().unwrap().contains("--limits-store-unavailable closed"), "{}", r.text);
            assert_eq!(r.header("retry-after"), "1");
        }
        for gw in [open, closed] {
            let r = bounded("a key without limits", ask(gw, "sk-free", &q)).await;
            assert_eq!(r.status, 200, "{phase}: keys without limits never wait for the store: {}", r.text);
            assert_eq!(bounded("/healthz", get(&gw.url("/healthz"))).await.status, 200);
        }
    }
    assert!(metric(open, &unavailable("admitted")).await >= admitted + 10.0, "{phase}: counted as admitted unchecked");
    assert!(metric(closed, &unavailable("refused")).await >= refused + 10.0, "{phase}: counted as refused");
    assert_eq!(metric(closed, &unavailable("admitted")).await, 0.0, "closed never admits unchecked");
    assert_eq!(metric(open, &unavailable("refused")).await, 0.0, "open never refuses for the store");
    for gw in [open, closed] {
        assert_eq!(metric(gw, STORE_UP).await, 0.0, "{phase}");
        assert!(gw.log().contains("limits store unreachable"), "{phase}: the outage is logged:\n{}", gw.log());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_or_dead_store_admits_or_refuses_as_configured_and_holds_up_nothing() {
    let mut store = RedisServer::start();
    let sim = sim("a", &["m"], |_| {}).await;
    let (table, keys) = fleet_files(sim.url());
    let url = store.url();
    // 300 ms: short enough to bound every request, long enough for a loaded machine's healthy calls.
    let mode = |m: &str| gateway_args(&table, &keys, Some((&url, 300)), &["--limits-store-unavailable", m]);
    let open = GatewayProcess::start("open", &mode("open"));
    let closed = GatewayProcess::start("closed", &mode("closed"));
    for gw in [&open, &closed] {
        wait_store(gw, true).await;
        assert_eq!(ask(gw, "sk-team", &chat("m", "hello")).await.status, 200);
        assert_eq!(errors(gw).await, 0.0);
    }
    let team: i64 = store.query(|c| redis::cmd("HEXISTS").arg("flotilla:limits:team").arg("r").query(c));
    assert_eq!(team, 1, "both count in the store");

    // Paused: every call times out; three in a row (--limits-store-failures) mark the store
    // down, and then requests do not ask it.
    store.pause();
    while_down(&open, &closed, "paused").await;
    for gw in [&open, &closed] {
        assert!(metric(gw, ERRORS[0]).await >= 1.0, "a timeout was counted");
        assert!(metric(gw, ERRORS[0]).await <= 3.0, "a down store is not asked again by requests");
    }
    // In open mode the budget is not kept while the store is down (documented): 70 > 60.
    for i in 0..70 {
        assert_eq!(bounded("open", ask(&open, "sk-team", &chat("m", &format!("x{i}")))).await.status, 200);
    }
    store.resume();
    for gw in [&open, &closed] {
        wait_store(gw, true).await;
        assert_eq!(ask(gw, "sk-team", &chat("m", "back")).await.status, 200);
        assert!(gw.log().contains("limits store answering again"), "{}", gw.log());
    }

    // Killed: connections refused.
    store.kill();
    let before = (errors(&open).await, errors(&closed).await);
    while_down(&open, &closed, "killed").await;
    assert!(errors(&open).await > before.0 && errors(&closed).await > before.1, "the failure was counted");

    // Started again, empty (its script cache too): both count against it again.
    store.restart();
    for gw in [&open, &closed] {
        wait_store(gw, true).await;
    }
    assert_eq!(ask(&closed, "sk-team", &chat("m", "again")).await.status, 200);
    let left: i64 =
        store.query(|c| redis::cmd("HGET").arg("flotilla:limits:team").arg("r").query::<f64>(c)).floor() as i64;
    assert_eq!(left, 59, "a fresh bucket of 60, one taken");
    assert_eq!(ask(&open, "sk-team", &chat("m", "and here")).await.status, 200);
    let left: f64 = store.query(|c| redis::cmd("HGET").arg("flotilla:limits:team").arg("r").query(c));
    assert_eq!(left.floor(), 58.0, "the open gateway counts there too: {left}");
}
