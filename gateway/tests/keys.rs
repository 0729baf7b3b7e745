//! API keys against simulators on loopback and the gateway on a real port: stored as digests,
//! 401 for a missing, unknown or revoked key, 403 for a model or jurisdiction the key may not
//! use, a key's jurisdictions narrowing where a request goes (never widening), request and
//! token limits answered with 429 and `Retry-After`, and rotation without a restart.

mod common;

use common::*;
use flotilla_gateway::keys::{hex, sha256};

fn key_doc(entries: &[(&str, &str, &str)]) -> String {
    let mut s = String::from("keys:\n");
    for (id, key, extra) in entries {
        s.push_str(&format!("  - {{id: {id}, sha256: {}{extra}}}\n", hex(&sha256(key.as_bytes()))));
    }
    s
}

#[tokio::test]
async fn keys_narrow_models_and_jurisdictions_and_limit_requests_and_tokens() {
    let eu = sim("eu", &["open", "eu-only", "us-only"], |_| {}).await;
    let us = sim("us", &["open", "eu-only", "us-only"], |_| {}).await;
    let yaml = format!(
        "{}models:\n  - {{name: open, routes: [{{cluster: eu}}, {{cluster: us}}]}}\n  - {{name: eu-only, sovereignty: {{allowedJurisdictions: [EU]}}, routes: [{{cluster: eu}}]}}\n  - {{name: us-only, sovereignty: {{allowedJurisdictions: [US]}}, routes: [{{cluster: us}}]}}\n",
        clusters_yaml(&[("eu", eu.url(), "EU"), ("us", us.url(), "US")])
    );
    let keys = temp_path("keys");
    write_atomic(
        &keys,
        &key_doc(&[
            ("eu-team", "sk-eu", ", jurisdictions: [EU]"),
            ("limited", "sk-small", ", models: [open], requestsPerMinute: 3"),
            ("tokens", "sk-tok", ", tokensPerMinute: 20"),
        ]),
    );
    let k = keys.clone();
    let gw = gateway(&yaml, move |c| c.keys_file = Some(k)).await;
    let url = gw.url("/v1/chat/completions");
    let bearer = |k: &'static str| [("authorization", Box::leak(format!("Bearer {k}").into_boxed_str()) as &str)];

    // No key, an unknown key, and the digest itself: 401, OpenAI-shaped.
    for headers in [&[][..], &bearer("sk-nope")[..], &[("authorization", "Bearer sk-eu ")][..]] {
        let r = post_with(&url, &chat("open", "hi"), headers).await;
        if headers.first().is_some_and(|h| h.1 == "Bearer sk-eu ") {
            assert_eq!(r.status, 200, "surrounding spaces are not part of the key");
            continue;
        }
        assert_eq!(r.status, 401, "{}", r.text);
        assert_eq!(r.json()["error"]["type"], "authentication_error");
    }
    let digest = format!("Bearer {}", hex(&sha256(b"sk-eu")));
    assert_eq!(post_with(&url, &chat("open", "hi"), &[("authorization", digest.as_str())]).await.status, 401);

    // The EU key: a US-only model is refused with 403 before any upstream is asked.
    let before = us.state.request_count();
    let r = post_with(&url, &chat("us-only", "hi"), &bearer("sk-eu")).await;
    assert_eq!(r.status, 403, "{}", r.text);
    assert_eq!(r.json()["error"]["code"], "jurisdiction_not_allowed");
    assert!(r.json()["error"]["message"].as_str().unwrap().contains("eu-team"));
    // An unrestricted model: the key's EU binds it, whatever the load — never the US cluster.
    for i in 0..20 {
        let r = post_with(&url, &chat("open", &format!("prompt {i}")), &bearer("sk-eu")).await;
        assert_eq!((r.status, r.cluster().as_str()), (200, "eu"), "{}", r.text);
    }
    assert_eq!(us.state.request_count(), before, "the EU key never reached the US cluster");
    // When the EU cluster is down, the EU key gets 503 rather than the US cluster.
    eu.state.set_fault(Some(flotilla_enginesim::Fault::Error503), None);
    let r = post_with(&url, &chat("open", "fail over?"), &bearer("sk-eu")).await;
    assert_eq!(r.status, 503, "{}", r.text);
    assert_eq!(us.state.request_count(), before, "no failover out of the key's jurisdiction");
    eu.state.set_fault(None, None);
    // Without the key's restriction the same model may use the US cluster.
    let r = post_with(&url, &chat("open", "x"), &bearer("sk-tok")).await;
    assert_eq!(r.status, 200);

    // /v1/models lists what the key may use.
    let ids = |a: Answer| -> Vec<String> {
        a.json()["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap().to_string()).collect()
    };
    assert_eq!(ids(get_with(&gw.url("/v1/models"), &bearer("sk-small")).await), ["open"]);
    assert_eq!(ids(get_with(&gw.url("/v1/models"), &bearer("sk-eu")).await), ["eu-only", "open"]);
    assert_eq!(get(&gw.url("/v1/models")).await.status, 401);

    // A model the key does not list: 403.
    let r = post_with(&url, &chat("eu-only", "hi"), &bearer("sk-small")).await;
    assert_eq!((r.status, r.json()["error"]["code"].as_str()), (403, Some("model_not_allowed")));
    // Three requests a minute, then 429 with Retry-After (about 20 s for the next one).
    for _ in 0..3 {
        assert_eq!(post_with(&url, &chat("open", "hi"), &bearer("sk-small")).await.status, 200);
    }
    let r = post_with(&url, &chat("open", "hi"), &bearer("sk-small")).await;
    assert_eq!(r.status, 429, "{}", r.text);
    assert_eq!(r.json()["error"]["code"], "rate_limit_exceeded");
    assert_eq!(r.json()["error"]["type"], "requests");
    let retry: u64 = r.header("retry-after").parse().unwrap();
    assert!((15..=20).contains(&retry), "retry-after {retry}");

    // Tokens: 20 a minute; the simulator's answers report their usage, which is charged.
    let mut refused = None;
    for i in 0..10 {
        let r = post_with(&url, &chat("open", &"many words in this prompt ".repeat(3)), &bearer("sk-tok")).await;
        if r.status == 429 {
            refused = Some((i, r));
            break;
        }
        assert_eq!(r.status, 200, "{}", r.text);
    }
    let (i, r) = refused.expect("the token limit was never hit");
    assert!(i >= 1, "the first request is admitted");
    assert_eq!(r.json()["error"]["type"], "tokens");
    assert!(r.header("retry-after").parse::<u64>().unwrap() >= 1);

    // Rotation without restart: the EU key is revoked, a new one issued.
    write_atomic(&keys, &key_doc(&[("eu-team-2", "sk-eu-new", ", jurisdictions: [EU]")]));
    let gone = std::time::Instant::now();
    loop {
        let r = post_with(&url, &chat("open", "hi"), &bearer("sk-eu")).await;
        if r.status == 401 {
            break;
        }
        assert!(gone.elapsed().as_secs() < 5, "a revoked key still works");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(post_with(&url, &chat("open", "hi"), &bearer("sk-eu-new")).await.status, 200);
    // A broken file keeps the keys in force.
    write_atomic(&keys, "keys: [this is not: valid");
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(post_with(&url, &chat("open", "hi"), &bearer("sk-eu-new")).await.status, 200);
    let metrics = get(&gw.url("/metrics")).await.text;
    for reason in ["unauthorized", "jurisdiction", "model", "requests", "tokens"] {
        assert!(metrics.contains(&format!("flotilla_gateway_key_refusals_total{{reason=\"{reason}\"}}")), "{reason}");
    }
    assert!(!metrics.contains("sk-"), "no key in the metrics");
    let _ = std::fs::remove_file(&keys);
}

#[tokio::test]
async fn the_bearer_scheme_is_case_insensitive() {
    let a = sim("a", &["m"], |_| {}).await;
    let yaml =
        format!("{}models:\n  - {{name: m, routes: [{{cluster: a}}]}}\n", clusters_yaml(&[("a", a.url(), "EU")]));
    let gw = gateway(&yaml, |c| c.api_keys = vec!["sk-1".into()]).await;
    let url = gw.url("/v1/chat/completions");
    for scheme in ["Bearer", "bearer", "BEARER", "bEaReR"] {
        let auth = format!("{scheme} sk-1");
        let r = post_with(&url, &chat("m", "hi"), &[("authorization", &auth)]).await;
        assert_eq!(r.status, 200, "{scheme}: {}", r.text);
        let r = get_with(&gw.url("/v1/models"), &[("authorization", &auth)]).await;
        assert_eq!(r.status, 200, "{scheme}: {}", r.text);
    }
    for refused in ["Basic sk-1", "Bearersk-1", "bearer sk-2"] {
        let r = post_with(&url, &chat("m", "hi"), &[("authorization", refused)]).await;
        assert_eq!(r.status, 401, "{refused}");
    }
    assert_eq!(a.state.request_count(), 4);
}
