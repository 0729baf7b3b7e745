//! Mid-stream continuation against engine simulators on loopback: a stream cut, stalled or
//! broken by a malformed event after its first tokens is finished on another allowed route,
//! and the client receives one answer — the simulator's canonical text byte for byte, one id,
//! usage that adds up — or, when that cannot be guaranteed (a regeneration that does not begin
//! with the text sent, every allowed route broken, the bound reached), an error event and never
//! `[DONE]`. Each test also counts the attempts every simulator saw.

mod common;

use std::time::Instant;

use common::*;
use flotilla_enginesim::SimHandle;
use flotilla_enginesim::canonical::canonical_text;
use flotilla_enginesim::generate::Kind;
use serde_json::{Value, json};

const PROMPT: &str = "tell me about fleets";
/// Route `a` is chosen first while every cluster is idle (least load per weight).
const A: &str = ", weight: 2";

async fn engine(name: &str) -> SimHandle {
    sim(name, &["m"], |c| c.default_tokens = 10).await
}

/// Model `m` on `routes` (`(cluster, extra route fields)`), clusters in the EU unless named `us…`.
fn table(sims: &[&SimHandle], routes: &[(&str, &str)], model_extra: &str) -> String {
    let clusters: Vec<(&str, String, &str)> = sims
        .iter()
        .map(|s| {
            let n = s.state.config.name.as_str();
            (n, s.url(), if n.starts_with("us") { "US" } else { "EU" })
        })
        .collect();
    let routes: Vec<String> = routes.iter().map(|(c, x)| format!("{{cluster: {c}{x}}}")).collect();
    format!("{}models:\n  - {{name: m{model_extra}, routes: [{}]}}\n", clusters_yaml(&clusters), routes.join(", "))
}

/// The data events that are JSON.
fn chunks(r: &Answer) -> Vec<Value> {
    r.events().iter().filter_map(|e| serde_json::from_str(e).ok()).collect()
}

/// The answer's text as the client assembles it.
fn text(r: &Answer) -> String {
    chunks(r)
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().or(c["choices"][0]["text"].as_str()))
        .collect()
}

fn error_code(r: &Answer) -> String {
    let last = chunks(r).pop().unwrap_or_default();
    last["error"]["code"].as_str().unwrap_or_default().to_string()
}

/// A complete answer: `[DONE]` last, no error, every chunk with the first chunk's identity.
fn assert_one_answer(r: &Answer) {
    assert_eq!(r.status, 200);
    assert!(r.text.ends_with("data: [DONE]\n\n"), "{}", r.text);
    assert!(!r.text.contains("\"error\""), "{}", r.text);
    let cs = chunks(r);
    for c in &cs {
        for k in ["id", "model", "created"] {
            assert_eq!(c[k], cs[0][k], "{k} of {c}");
        }
    }
    let roles = cs.iter().filter(|c| c["choices"][0]["delta"].get("role").is_some()).count();
    assert!(roles <= 1, "one assistant turn: {}", r.text);
}

fn metric(m: &str, line: &str) -> bool {
    m.lines().any(|l| l == line)
}

#[tokio::test]
async fn a_cut_stream_is_finished_by_prefill_on_another_cluster() {
    let (a, b) = (engine("a").await, engine("b").await);
    a.state.set_stream_script("m", "cut:4".parse().unwrap());
    let gw = gateway(&table(&[&a, &b], &[("a", A), ("b", ", continuation: prefill")], ""), |_| {}).await;
    let body = chat_stream("m", PROMPT, true);
    let r = post(&gw.url("/v1/chat/completions"), &body).await;
    assert_one_answer(&r);
    assert_eq!(text(&r), canonical_text(&a.state.config, Kind::Chat, &body));
    let usage = chunks(&r).last().unwrap()["usage"].clone();
    assert_eq!(usage["prompt_tokens"], 4, "the partial answer is not the client's prompt");
    assert_eq!(usage["completion_tokens"], 10, "4 tokens from a, 6 from b");
    assert_eq!(usage["total_tokens"], 14);
    let (ca, cb) = (a.state.model_counters("m"), b.state.model_counters("m"));
    assert_eq!((ca.requests, ca.stream_faults), (1, 1));
    assert_eq!((cb.requests, cb.continuations, cb.diverged), (1, 1, 0));
    let m = get(&gw.url("/metrics")).await.text;
    assert!(metric(&m, "flotilla_gateway_continuations_total{result=\"attempted\"} 1"), "{m}");
    assert!(metric(&m, "flotilla_gateway_continuations_total{result=\"succeeded\"} 1"), "{m}");
    assert!(metric(&m, "flotilla_gateway_streams_total{cluster=\"a\",end=\"cut\"} 1"), "{m}");
    let seen = gw.state.stats.observe("m", "a", Instant::now());
    assert_eq!((seen.failed, seen.broken), (1, 1), "the Serving window counts the broken stream");
}

#[tokio::test]
async fn a_cut_completion_is_finished_by_extending_the_prompt() {
    let (a, b) = (engine("a").await, engine("b").await);
    a.state.set_stream_script("m", "cut:3".parse().unwrap());
    let gw = gateway(&table(&[&a, &b], &[("a", A), ("b", ", continuation: prefill")], ""), |_| {}).await;
    let body = json!({"model": "m", "prompt": "Once upon a time ", "stream": true, "max_tokens": 7});
    let r = post(&gw.url("/v1/completions"), &body).await;
    assert_one_answer(&r);
    assert_eq!(text(&r), canonical_text(&a.state.config, Kind::Completion, &body));
    assert_eq!(text(&r).split_whitespace().count(), 7, "max_tokens holds across the splice");
    assert_eq!((a.state.model_counters("m").requests, b.state.model_counters("m").continuations), (1, 1));
}

#[tokio::test]
async fn a_stalled_stream_is_finished_elsewhere() {
    let (a, b) = (engine("a").await, engine("b").await);
    a.state.set_stream_script("m", "stall:5:60000".parse().unwrap());
    let gw = gateway(&table(&[&a, &b], &[("a", A), ("b", ", continuation: prefill")], ""), |_| {}).await;
    let body = chat_stream("m", PROMPT, false);
    let r = post(&gw.url("/v1/chat/completions"), &body).await;
    assert_one_answer(&r);
    assert_eq!(text(&r), canonical_text(&a.state.config, Kind::Chat, &body));
    assert_eq!((a.state.model_counters("m").requests, b.state.model_counters("m").continuations), (1, 1));
    eventually("the stalled upstream request was dropped", || a.state.cancelled() == 1).await;
}

#[tokio::test]
async fn a_malformed_event_is_skipped_or_when_fatal_continued() {
    let (a, b) = (engine("a").await, engine("b").await);
    let yaml = table(&[&a, &b], &[("a", A), ("b", ", continuation: prefill")], "");
    let body = chat_stream("m", PROMPT, true);
    let canonical = canonical_text(&a.state.config, Kind::Chat, &body);
    let skipping = gateway(&yaml, |_| {}).await;
    a.state.set_stream_script("m", "malformed:3".parse().unwrap());
    let r = post(&skipping.url("/v1/chat/completions"), &body).await;
    assert_one_answer(&r);
    assert_eq!(text(&r), canonical);
    assert_eq!(b.state.model_counters("m").requests, 0, "skipped, not continued");
    let fatal = gateway(&yaml, |c| c.max_malformed_events = 0).await;
    a.state.set_stream_script("m", "malformed:3".parse().unwrap());
    let r = post(&fatal.url("/v1/chat/completions"), &body).await;
    assert_one_answer(&r);
    assert_eq!(text(&r), canonical);
    assert_eq!(chunks(&r).last().unwrap()["usage"]["completion_tokens"], 10);
    assert_eq!((a.state.model_counters("m").requests, b.state.model_counters("m").continuations), (2, 1));
}

#[tokio::test]
async fn a_route_that_refuses_prefill_regenerates_and_is_remembered() {
    let (a, b) = (engine("a").await, engine("b").await);
    b.state.set_refuse_prefill("m", true);
    let gw = gateway(&table(&[&a, &b], &[("a", A), ("b", ", continuation: prefill")], ""), |_| {}).await;
    let body = chat_stream("m", PROMPT, true);
    let canonical = canonical_text(&a.state.config, Kind::Chat, &body);
    for round in 1..=2u64 {
        a.state.set_stream_script("m", "cut:4".parse().unwrap());
        let r = post(&gw.url("/v1/chat/completions"), &body).await;
        assert_one_answer(&r);
        assert_eq!(text(&r), canonical, "round {round}");
        let usage = chunks(&r).last().unwrap()["usage"].clone();
        assert_eq!((usage["prompt_tokens"].as_u64(), usage["completion_tokens"].as_u64()), (Some(4), Some(10)));
        let c = b.state.model_counters("m");
        // Round 1: a refused prefill, then the regeneration; round 2: the regeneration only.
        assert_eq!((c.requests, c.prefill_refused, c.continuations), (round + 1, 1, 0), "round {round}");
    }
    assert_eq!(a.state.model_counters("m").requests, 2);
}

#[tokio::test]
async fn a_nondeterministic_regeneration_ends_with_an_error_event_not_a_wrong_answer() {
    let (a, b) = (engine("a").await, engine("b").await);
    b.state.set_nondeterministic("m", true);
    let gw = gateway(&table(&[&a, &b], &[("a", A), ("b", ", continuation: regenerate")], ""), |_| {}).await;
    a.state.set_stream_script("m", "cut:4".parse().unwrap());
    let body = chat_stream("m", PROMPT, false);
    let canonical = canonical_text(&a.state.config, Kind::Chat, &body);
    let r = post(&gw.url("/v1/chat/completions"), &body).await;
    assert_eq!(error_code(&r), "continuation_diverged", "{}", r.text);
    assert!(!r.text.contains("[DONE]"));
    let got = text(&r);
    assert_eq!(got.split_inclusive(' ').count(), 4, "only what a sent: {got}");
    assert!(canonical.starts_with(&got));
    let c = b.state.model_counters("m");
    assert_eq!((c.requests, c.continuations, c.prefill_refused), (1, 0, 0), "a regeneration, not a prefill");
    let m = get(&gw.url("/metrics")).await.text;
    assert!(metric(&m, "flotilla_gateway_continuations_abandoned_total{reason=\"diverged\"} 1"), "{m}");
    // A route that declares nothing regenerates too: a prefill would have been relayed unchecked.
    let undeclared = gateway(&table(&[&a, &b], &[("a", A), ("b", "")], ""), |_| {}).await;
    a.state.set_stream_script("m", "cut:4".parse().unwrap());
    let r = post(&undeclared.url("/v1/chat/completions"), &body).await;
    assert_eq!(error_code(&r), "continuation_diverged", "{}", r.text);
    assert!(canonical.starts_with(&text(&r)));
    let c = b.state.model_counters("m");
    assert_eq!((c.requests, c.continuations, c.diverged), (2, 0, 0), "no prefill was asked");
}

#[tokio::test]
async fn an_engine_that_silently_ignores_prefill_never_repeats_the_text_sent() {
    // b takes `continue_final_message` with a 200 and answers from the start; the gateway drops
    // the repeated start, so the client has the answer once.
    let (a, b) = (engine("a").await, engine("b").await);
    b.state.set_ignore_prefill("m", true);
    let gw = gateway(&table(&[&a, &b], &[("a", A), ("b", ", continuation: prefill")], ""), |_| {}).await;
    a.state.set_stream_script("m", "cut:4".parse().unwrap());
    let body = chat_stream("m", PROMPT, true);
    let r = post(&gw.url("/v1/chat/completions"), &body).await;
    assert_one_answer(&r);
    assert_eq!(text(&r), canonical_text(&a.state.config, Kind::Chat, &body), "no text twice");
    let c = b.state.model_counters("m");
    assert_eq!((c.requests, c.prefill_ignored, c.continuations), (1, 1, 0));
}

#[tokio::test]
async fn a_reproducible_request_regenerates_on_a_prefill_route_with_the_engines_usage() {
    let (a, b) = (engine("a").await, engine("b").await);
    let gw = gateway(&table(&[&a, &b], &[("a", A), ("b", ", continuation: prefill")], ""), |_| {}).await;
    for usage in [true, false] {
        a.state.set_stream_script("m", "cut:4".parse().unwrap());
        let mut body = chat_stream("m", PROMPT, usage);
        body["seed"] = 3.into();
        let r = post(&gw.url("/v1/chat/completions"), &body).await;
        assert_one_answer(&r);
        assert_eq!(text(&r), canonical_text(&a.state.config, Kind::Chat, &body), "the uninterrupted answer");
        let reported: Vec<Value> =
            chunks(&r).into_iter().filter(|c| c["usage"].is_object()).map(|c| c["usage"].clone()).collect();
        if usage {
            // b's own count of the whole answer: the original prompt, every token once.
            assert_eq!(reported, [json!({"prompt_tokens": 4, "completion_tokens": 10, "total_tokens": 14})]);
        } else {
            assert!(reported.is_empty(), "usage the gateway asked for is not passed on: {}", r.text);
        }
    }
    let c = b.state.model_counters("m");
    assert_eq!((c.requests, c.continuations), (2, 0), "regenerated, never a prefill");
}

#[tokio::test]
async fn an_eu_model_whose_eu_clusters_all_break_never_continues_in_the_us() {
    let (eu1, eu2, us) = (engine("eu1").await, engine("eu2").await, engine("us1").await);
    for s in [&eu1, &eu2] {
        s.state.set_stream_script("m", "cut:2".parse().unwrap());
    }
    let p = ", continuation: prefill";
    let routes = [("eu1", p), ("eu2", p), ("us1", p)];
    let yaml = table(&[&eu1, &eu2, &us], &routes, ", sovereignty: {allowedJurisdictions: [EU]}");
    let gw = gateway(&yaml, |_| {}).await;
    let r = post(&gw.url("/v1/chat/completions"), &chat_stream("m", PROMPT, false)).await;
    assert_eq!(error_code(&r), "upstream_cut", "{}", r.text);
    assert!(!r.text.contains("[DONE]"));
    assert_eq!(text(&r).split_whitespace().count(), 4, "2 tokens from each EU cluster");
    assert_eq!(eu1.state.model_counters("m").requests + eu2.state.model_counters("m").requests, 2);
    assert_eq!(us.state.request_count(), 0, "the US simulator saw nothing");
    let m = get(&gw.url("/metrics")).await.text;
    assert!(metric(&m, "flotilla_gateway_continuations_abandoned_total{reason=\"no_route\"} 1"), "{m}");
}

#[tokio::test]
async fn continuations_are_bounded_and_can_be_switched_off() {
    let sims = [engine("a").await, engine("b").await, engine("c").await];
    let yaml = table(&[&sims[0], &sims[1], &sims[2]], &[("a", A), ("b", ""), ("c", "")], "");
    let once = gateway(&yaml, |c| c.max_continuations = 1).await;
    for s in &sims[..2] {
        s.state.set_stream_script("m", "cut:3".parse().unwrap());
    }
    let r = post(&once.url("/v1/chat/completions"), &chat_stream("m", PROMPT, false)).await;
    assert_eq!(error_code(&r), "upstream_cut", "{}", r.text);
    assert_eq!(sims[2].state.request_count(), 0, "one continuation (to b), no second one");
    let m = get(&once.url("/metrics")).await.text;
    assert!(metric(&m, "flotilla_gateway_continuations_abandoned_total{reason=\"limit\"} 1"), "{m}");
    let off = gateway(&yaml, |c| c.continuation = false).await;
    sims[0].state.set_stream_script("m", "cut:3".parse().unwrap());
    let r = post(&off.url("/v1/chat/completions"), &chat_stream("m", PROMPT, false)).await;
    assert_eq!(error_code(&r), "upstream_cut");
    let later: u64 = sims[1..].iter().map(|s| s.state.model_counters("m").requests).sum();
    assert_eq!(later, 1, "switched off: nothing beyond the first gateway's continuation");
}

#[tokio::test]
async fn an_uninterrupted_stream_is_relayed_byte_for_byte() {
    // Two fresh simulators with the same seed answer their first request identically (the
    // `created` second aside, so a pair that straddles a second is drawn again).
    for _ in 0..3 {
        let (direct, behind) = (engine("d").await, engine("a").await);
        let gw = gateway(&table(&[&behind], &[("a", "")], ""), |_| {}).await;
        let body = chat_stream("m", PROMPT, true);
        let want = post(&format!("{}/v1/chat/completions", direct.url()), &body).await;
        let got = post(&gw.url("/v1/chat/completions"), &body).await;
        if chunks(&want)[0]["created"] != chunks(&got)[0]["created"] {
            continue;
        }
        assert!(gw.state.cfg.continuation, "with continuation on");
        assert_eq!(got.text, want.text);
        return;
    }
    panic!("three pairs straddled a second");
}

#[tokio::test]
async fn an_eu_key_keeps_the_continuation_in_the_eu() {
    let (eu, us) = (engine("eu1").await, engine("us1").await);
    let keys = temp_path("keys");
    let digest = flotilla_gateway::keys::hex(&flotilla_gateway::keys::sha256(b"sk-eu"));
    write_atomic(&keys, &format!("keys:\n  - {{id: eu, sha256: {digest}, jurisdictions: [EU]}}\n"));
    let k = keys.clone();
    let yaml = table(&[&eu, &us], &[("eu1", A), ("us1", ", continuation: prefill")], "");
    let gw = gateway(&yaml, move |c| {
        c.keys_file = Some(k);
        c.api_keys = vec!["sk-any".into()];
    })
    .await;
    let body = chat_stream("m", PROMPT, false);
    eu.state.set_stream_script("m", "cut:3".parse().unwrap());
    let r = post_with(&gw.url("/v1/chat/completions"), &body, &[("authorization", "Bearer sk-eu")]).await;
    assert_eq!(error_code(&r), "upstream_cut", "{}", r.text);
    assert_eq!(us.state.request_count(), 0, "the key's EU binds the continuation too");
    // A key without a jurisdiction may be continued in the US: the policy above is what held.
    eu.state.set_stream_script("m", "cut:3".parse().unwrap());
    let r = post_with(&gw.url("/v1/chat/completions"), &body, &[("authorization", "Bearer sk-any")]).await;
    assert_one_answer(&r);
    assert_eq!(text(&r), canonical_text(&eu.state.config, Kind::Chat, &body));
    assert_eq!(us.state.model_counters("m").continuations, 1);
}

#[tokio::test]
async fn the_model_continues_on_its_other_clusters_before_its_fallbacks() {
    let both = |name: &'static str| sim(name, &["m", "m2"], |c| c.default_tokens = 10);
    let (a, b, c) = (both("a").await, both("b").await, both("c").await);
    let yaml = format!(
        "{}models:\n  - {{name: m, fallbacks: [m2], routes: [{{cluster: a{A}}}, {{cluster: c, continuation: prefill}}]}}\n  - {{name: m2, routes: [{{cluster: b, continuation: prefill}}]}}\n",
        clusters_yaml(&[("a", a.url(), "EU"), ("b", b.url(), "EU"), ("c", c.url(), "EU")])
    );
    let gw = gateway(&yaml, |_| {}).await;
    let body = chat_stream("m", PROMPT, false);
    let canonical = canonical_text(&a.state.config, Kind::Chat, &body);
    a.state.set_stream_script("m", "cut:3".parse().unwrap());
    let r = post(&gw.url("/v1/chat/completions"), &body).await;
    assert_one_answer(&r);
    assert_eq!(text(&r), canonical);
    assert_eq!((c.state.model_counters("m").continuations, b.state.request_count()), (1, 0), "c, not the fallback");
    // Both clusters of m break: the fallback model takes over the text sent so far.
    a.state.set_stream_script("m", "cut:3".parse().unwrap());
    c.state.set_stream_script("m", "cut:3".parse().unwrap());
    let r = post(&gw.url("/v1/chat/completions"), &body).await;
    assert!(r.text.ends_with("data: [DONE]\n\n"), "{}", r.text);
    assert_eq!(r.header("x-flotilla-model"), "m", "the model that began the answer");
    let sent: String = canonical.split_inclusive(' ').take(6).collect();
    assert!(text(&r).starts_with(&sent), "3 tokens from a, 3 from c: {}", text(&r));
    assert_eq!(b.state.model_counters("m2").requests, 1);
}
