//! Per-key limits shared across gateway replicas, on real parts: a `redis-server` on a free
//! loopback port (scripts/setup.sh installs it; without it these tests fail and say so),
//! three `flotilla-gateway` processes and an engine simulator. One key with 60 requests a
//! minute gets 60 across the three (and 180 without the shared store: the same three
//! processes counting alone), tokens charged by one replica hold back the others with an
//! honest `Retry-After`, and the script keeps the in-process limiter's arithmetic (refill,
//! debt, waits) on the server's clock, with expiry so idle keys vanish. A `rediss://` URL
//! against a plain-text server is refused, never downgraded.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;
mod redis_server;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use flotilla_gateway::GatewayConfig;
use flotilla_gateway::keys::{ApiKey, Limit};
use flotilla_gateway::limits::{LimitStore, Refused, StoreUnavailable};
use flotilla_gateway::metrics::Metrics;
use redis_server::*;

/// One request's fate: (gateway index, status, Retry-After, error code, error type).
type Fate = (usize, u16, String, String, String);

/// `n` requests of `key`, request i to gateway i % 3, twelve at a time; and how long it took.
async fn burst(gws: &[GatewayProcess], key: &'static str, n: usize) -> (Vec<Fate>, Duration) {
    let urls: Vec<String> = gws.iter().map(|g| g.url("/v1/chat/completions")).collect();
    let started = Instant::now();
    let mut fates = Vec::new();
    for wave in (0..n).collect::<Vec<_>>().chunks(12) {
        let mut set = tokio::task::JoinSet::new();
        for &i in wave {
            let url = urls[i % urls.len()].clone();
            set.spawn(async move {
                let bearer = format!("Bearer {key}");
                let r = post_with(&url, &chat("m", &format!("q{i}")), &[("authorization", bearer.as_str())]).await;
                let (code, kind) = if r.status == 200 {
                    (String::new(), String::new())
                } else {
                    let e = &r.json()["error"];
                    (e["code"].as_str().unwrap_or("").to_string(), e["type"].as_str().unwrap_or("").to_string())
                };
                (i % 3, r.status, r.header("retry-after"), code, kind)
            });
        }
        while let Some(f) = set.join_next().await {
            fates.push(f.unwrap());
        }
    }
    (fates, started.elapsed())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_share_one_budget_not_three() {
    let store = RedisServer::start();
    let sim = sim("a", &["m"], |c| c.max_num_seqs = 64).await;
    let (table, keys) = fleet_files(sim.url());
    let url = store.url();
    let shared: Vec<GatewayProcess> = (0..3)
        .map(|i| GatewayProcess::start(&format!("shared-{i}"), &gateway_args(&table, &keys, Some((&url, 1000)), &[])))
        .collect();
    for g in &shared {
        wait_store(g, true).await;
    }

    let (fates, took) = burst(&shared, "sk-team", 200).await;
    let ok = fates.iter().filter(|f| f.1 == 200).count();
    // The bucket holds 60 and refills one a second: 60, plus what refilled while the burst ran.
    let refilled = took.as_secs() as usize;
    assert!(
        (60..=61 + refilled).contains(&ok),
        "{ok} of 200 admitted across three gateways in {took:?}: the key's 60 a minute must hold fleet-wide"
    );
    for (gw, status, retry_after, code, kind) in fates.iter().filter(|f| f.1 != 200) {
        assert_eq!(*status, 429, "gateway {gw}: only 429 besides 200");
        assert_eq!((code.as_str(), kind.as_str()), ("rate_limit_exceeded", "requests"));
        assert_eq!(retry_after, "1", "60 a minute: the next request fits in a second");
    }
    for gw in 0..3 {
        let mine = fates.iter().filter(|f| f.0 == gw && f.1 == 200).count();
        assert!(mine > 0, "gateway {gw} admitted none: the budget is shared, not owned by one replica");
    }
    assert_eq!(sim.state.request_count(), ok, "no refused request reached the engine");

    // The store holds one hash, named by the key's id (never the key), that expires.
    let names: Vec<String> = store.query(|c| redis::cmd("KEYS").arg("*").query(c));
    assert_eq!(names, ["flotilla:limits:team"]);
    let pttl: i64 = store.query(|c| redis::cmd("PTTL").arg("flotilla:limits:team").query(c));
    assert!(pttl > 0 && pttl <= 61_000, "expires once full again: PTTL {pttl} ms");

    // The same three processes without the shared store: each counts alone, 3 × 60.
    drop(shared);
    let alone: Vec<GatewayProcess> =
        (0..3).map(|i| GatewayProcess::start(&format!("alone-{i}"), &gateway_args(&table, &keys, None, &[]))).collect();
    let (fates, took) = burst(&alone, "sk-team", 200).await;
    let ok_alone = fates.iter().filter(|f| f.1 == 200).count();
    assert!(ok_alone >= 178, "in-process budgets: {ok_alone} of 200 admitted in {took:?}, about 3 × 60");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_charged_by_one_gateway_hold_back_the_others_with_an_honest_wait() {
    let store = RedisServer::start();
    let sim = sim("a", &["m"], |_| {}).await;
    let (table, keys) = fleet_files(sim.url());
    let url = store.url();
    let gws: Vec<GatewayProcess> = (0..3)
        .map(|i| GatewayProcess::start(&format!("tok-{i}"), &gateway_args(&table, &keys, Some((&url, 1000)), &[])))
        .collect();
    for g in &gws {
        wait_store(g, true).await;
    }
    // One answer of 40 tokens against 20 a minute: admitted (the bucket was full), then charged.
    let mut body = chat("m", "spend it all");
    body["max_tokens"] = 40.into();
    let charged = Instant::now();
    let r = ask(&gws[0], "sk-tok", &body).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let used = r.json()["usage"]["total_tokens"].as_f64().unwrap();
    assert!(used > 21.0, "{used} tokens");
    // The bucket is at 20 - used; one token is needed to go on: (used - 19) × 3 s.
    let honest = ((used - 19.0) * 60.0 / 20.0).ceil() as u64;
    for g in &gws[1..] {
        let r = ask(g, "sk-tok", &chat("m", "more?")).await;
        assert_eq!(r.status, 429, "another replica sees the charge: {}", r.text);
        assert_eq!(r.json()["error"]["type"], "tokens");
        // Less what refilled since the answer (a second a second): nothing on an idle machine.
        let wait: u64 = r.header("retry-after").parse().unwrap();
        let since = charged.elapsed().as_secs();
        assert!(
            wait <= honest && wait + 1 + since >= honest,
            "Retry-After {wait} s, the bucket refills in {honest} s ({since} s later)"
        );
    }
    assert_eq!(sim.state.request_count(), 1, "refused requests never reached the engine");
    // A key without limits is never counted: no hash for it.
    assert_eq!(ask(&gws[2], "sk-free", &chat("m", "free")).await.status, 200);
    let names: Vec<String> = store.query(|c| redis::cmd("KEYS").arg("*").query(c));
    assert_eq!(names, ["flotilla:limits:tok"]);
}

fn key(id: &str, rpm: Option<u32>, tpm: Option<u64>) -> ApiKey {
    ApiKey {
        id: id.into(),
        models: vec![],
        sovereignty: Default::default(),
        requests_per_minute: rpm,
        tokens_per_minute: tpm,
    }
}

/// Move a bucket's refill time `secs` into the past: as if that much time had gone by.
fn age(store: &RedisServer, hash: &str, field: &str, secs: f64) {
    let at: f64 = store.query(|c| redis::cmd("HGET").arg(hash).arg(field).query(c));
    store.query(|c| redis::cmd("HSET").arg(hash).arg(field).arg(format!("{:.6}", at - secs)).query::<i64>(c));
}

#[tokio::test]
async fn the_script_keeps_the_in_process_arithmetic_on_the_servers_clock() {
    let store = RedisServer::start();
    let metrics = Arc::new(Metrics::default());
    let mut cfg = GatewayConfig::with_table("unused.yaml");
    cfg.limits_store = Some(store.url().parse().unwrap());
    cfg.limits_store_unavailable = StoreUnavailable::Closed;
    cfg.limits_store_timeout_ms = 1000;
    let limits = LimitStore::from_config(&cfg, metrics.clone()).unwrap();
    eventually("the store answers", || metrics.render().contains(&format!("{STORE_UP} 1"))).await;
    assert!(limits.describe().contains("redis://127.0.0.1"), "{}", limits.describe());

    // The numbers of keys.rs' request_and_token_limits_refill_over_a_minute, time moved by
    // ageing the stored refill times instead of waiting.
    let k = key("eu-team", Some(2), Some(100));
    let hash = "flotilla:limits:eu-team";
    assert_eq!(limits.admit(&k).await, Ok(()));
    assert_eq!(limits.admit(&k).await, Ok(()));
    let Err(Refused::Limit(Limit::Requests, wait)) = limits.admit(&k).await else { panic!("third request admitted") };
    // 30 s less the time since the first request (a tiny bit on an idle machine).
    assert!(wait > Duration::from_secs(29) && wait <= Duration::from_secs(30), "{wait:?}");
    age(&store, hash, "rt", 30.0);
    assert_eq!(limits.admit(&k).await, Ok(()), "one more after 30 s");
    // 250 tokens against 100 a minute: 150 in debt; the hash lives until the bucket is full.
    limits.charge(&k, 250).await;
    let pttl: i64 = store.query(|c| redis::cmd("PTTL").arg(hash).query(c));
    assert!((149_000..=151_000).contains(&pttl), "150 s to refill 250 tokens, plus a second: {pttl} ms");
    age(&store, hash, "tt", 60.0);
    age(&store, hash, "rt", 60.0);
    let Err(Refused::Limit(Limit::Tokens, wait)) = limits.admit(&k).await else { panic!("admitted in debt") };
    // 50 tokens of debt after a minute, plus the one to go on: 51 × 0.6 s.
    assert!(wait > Duration::from_millis(29_600) && wait <= Duration::from_millis(30_600), "{wait:?}");
    age(&store, hash, "tt", 31.0);
    age(&store, hash, "rt", 31.0);
    assert_eq!(limits.admit(&k).await, Ok(()));

    // A key without limits leaves nothing in the store; an idle one vanishes once full again.
    assert_eq!(limits.admit(&key("free", None, None)).await, Ok(()));
    let fast = key("fast", Some(60_000), None);
    assert_eq!(limits.admit(&fast).await, Ok(()));
    let exists = |name: &str| store.query(|c| redis::cmd("EXISTS").arg(name).query::<i64>(c));
    assert_eq!((exists("flotilla:limits:free"), exists("flotilla:limits:fast")), (0, 1));
    eventually("the idle key's hash expires", || exists("flotilla:limits:fast") == 0).await;
}

#[tokio::test]
async fn a_rediss_url_is_never_served_over_plain_text() {
    // A server that speaks only plain text: the TLS handshake must fail, never fall back.
    let store = RedisServer::start();
    let metrics = Arc::new(Metrics::default());
    let mut cfg = GatewayConfig::with_table("unused.yaml");
    cfg.limits_store = Some(format!("rediss://127.0.0.1:{}/0", store.port).parse().unwrap());
    cfg.limits_store_unavailable = StoreUnavailable::Closed;
    let limits = LimitStore::from_config(&cfg, metrics.clone()).unwrap();
    // Three probes' worth of time (500 ms apart).
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert!(metrics.render().contains(&format!("{STORE_UP} 0")), "{}", metrics.render());
    let refused = limits.admit(&key("team", Some(60), None)).await;
    assert!(matches!(refused, Err(Refused::StoreUnavailable(_))), "{refused:?}");
    let names: Vec<String> = store.query(|c| redis::cmd("KEYS").arg("*").query(c));
    assert!(names.is_empty(), "nothing was counted over plain text: {names:?}");
}
