//! The shared limits store down, on a real `redis-server` and `flotilla-gateway` processes:
//! with `--limits-store-unavailable local` (the default) each replica checks its share of each
//! limit (the limit divided by `--limits-store-replicas`) in its own process, so a key over its
//! share gets 429 while the other keys are served; `open`, chosen explicitly, still admits
//! everything. One call slower than the timeout decides its own request without the store but
//! does not mark the store down for every key (`--limits-store-failures` in a row do).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
mod redis_server;

use std::time::{Duration, Instant};

use common::*;
use redis_server::*;

fn outcome(o: &str) -> String {
    format!("flotilla_gateway_limits_store_unavailable_total{{outcome=\"{o}\"}}")
}

const TIMEOUTS: &str = "flotilla_gateway_limits_store_errors_total{reason=\"timeout\"}";

/// `n` requests of `key` one after the other: how many got 200, the refusals' (status, code,
/// Retry-After), and how long it took.
async fn send(gw: &GatewayProcess, key: &str, n: usize) -> (usize, Vec<(u16, String, String)>, Duration) {
    let started = Instant::now();
    let (mut ok, mut refused) = (0, Vec::new());
    for i in 0..n {
        let r = ask(gw, key, &chat("m", &format!("{key} {i}"))).await;
        if r.status == 200 {
            ok += 1;
        } else {
            let code = r.json()["error"]["code"].as_str().unwrap_or("").to_string();
            refused.push((r.status, code, r.header("retry-after")));
        }
    }
    (ok, refused, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_store_down_each_replica_enforces_its_share_and_open_still_admits() {
    let mut store = RedisServer::start();
    let sim = sim("a", &["m"], |_| {}).await;
    let (table, keys) = fleet_files(sim.url());
    let url = store.url();
    let local = GatewayProcess::start(
        "local",
        &gateway_args(&table, &keys, Some((&url, 1000)), &["--limits-store-replicas", "3"]),
    );
    let open = GatewayProcess::start(
        "open",
        &gateway_args(&table, &keys, Some((&url, 1000)), &["--limits-store-unavailable", "open"]),
    );
    for gw in [&local, &open] {
        wait_store(gw, true).await;
        assert_eq!(ask(gw, "sk-team", &chat("m", "hello")).await.status, 200);
    }
    store.kill();

    // sk-team: 60 a minute over 3 replicas, 20 on this one (plus what refills, one per 3 s).
    let (team, refused, took) = send(&local, "sk-team", 30).await;
    let refilled = took.as_secs() as usize / 3;
    assert!((20..=21 + refilled).contains(&team), "{team} of 30 admitted in {took:?}: the share is 20");
    assert!(!refused.is_empty());
    for (status, code, retry_after) in &refused {
        assert_eq!((*status, code.as_str()), (429, "rate_limit_exceeded"), "over its share: 429, never 503");
        let wait: u64 = retry_after.parse().unwrap();
        assert!((1..=3).contains(&wait), "one request refills in 3 s: Retry-After {wait}");
    }
    // The other keys are unaffected: sk-other's share is 200, sk-free has no limits.
    for key in ["sk-other", "sk-free"] {
        let (ok, refused, _) = send(&local, key, 30).await;
        assert_eq!(ok, 30, "{key}: {refused:?}");
    }
    wait_store(&local, false).await;
    assert!(metric(&local, &outcome("local_refused")).await >= refused.len() as f64);
    assert!(metric(&local, &outcome("local_admitted")).await >= 50.0);
    assert_eq!(metric(&local, &outcome("admitted")).await, 0.0, "nothing admitted unchecked");
    assert!(local.log().contains("checked against this replica's share"), "{}", local.log());

    // Fail-open, chosen explicitly, admits beyond the limit (70 > 60).
    let (ok, refused, _) = send(&open, "sk-team", 70).await;
    assert_eq!(ok, 70, "{refused:?}");
    assert!(metric(&open, &outcome("admitted")).await >= 70.0);
    assert_eq!(metric(&open, &outcome("local_refused")).await, 0.0);
    assert_eq!(sim.state.request_count(), team + 60 + 70 + 2, "no refused request reached the engine");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_slow_call_does_not_mark_the_store_down() {
    let store = RedisServer::start();
    let sim = sim("a", &["m"], |_| {}).await;
    let (table, keys) = fleet_files(sim.url());
    let url = store.url();
    let gw = GatewayProcess::start("slow", &gateway_args(&table, &keys, Some((&url, 300)), &[]));
    wait_store(&gw, true).await;
    assert_eq!(ask(&gw, "sk-team", &chat("m", "hello")).await.status, 200);
    // When the store last counted the key (the refill time its script writes on every admission).
    let counted = || store.query(|c| redis::cmd("HGET").arg("flotilla:limits:team").arg("rt").query::<f64>(c));
    let before = counted();

    // The store stops answering for one call: that request is decided here (within its share).
    store.pause();
    let r = ask(&gw, "sk-team", &chat("m", "slow")).await;
    store.resume();
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(metric(&gw, TIMEOUTS).await, 1.0);
    assert_eq!(metric(&gw, &outcome("local_admitted")).await, 1.0, "decided without the store");
    // Still up: the next requests of every key are counted in the store again.
    assert_eq!(metric(&gw, STORE_UP).await, 1.0, "one slow call marked the store down");
    assert_eq!(ask(&gw, "sk-team", &chat("m", "after")).await.status, 200);
    let after = counted();
    assert!(after > before, "counted in the store again: refilled at {before}, then at {after}");
    assert_eq!(metric(&gw, &outcome("local_admitted")).await, 1.0, "only the slow call's request");
    assert!(!gw.log().contains("limits store unreachable"), "{}", gw.log());
}
