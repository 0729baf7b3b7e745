//! The per-model stream faults: each of cut, stall, malformed event and missing `[DONE]` after
//! N tokens, on the model it was set for only, one script entry per streamed request, with the
//! usage and the counters right. Time is tokio's paused clock; the cut is also checked on a
//! real connection.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::*;
use flotilla_enginesim::canonical::canonical_text;
use flotilla_enginesim::generate::Kind;
use flotilla_enginesim::streams::Script;
use http_body_util::BodyExt;
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[tokio::test(start_paused = true)]
async fn a_cut_closes_the_stream_after_n_tokens_for_that_model_only_and_once() {
    let s = sim(|c| c.streams.stream_faults = vec![("m".into(), "cut:3,none".parse().unwrap())]);
    let other = read_sse(post(&s, "/v1/chat/completions", &streamed(chat("other", "hi"))).await).await;
    assert!(other.done && !other.cut, "another model's stream is untouched: {other:?}");

    let body = streamed(chat("m", "hi"));
    let cut = read_sse(post(&s, "/v1/chat/completions", &body).await).await;
    assert!(cut.cut && !cut.done, "{cut:?}");
    assert_eq!((cut.token_chunks(), cut.finish(), cut.usage()), (3, None, None));
    let canonical = canonical_text(&s.config, Kind::Chat, &body);
    assert!(canonical.starts_with(&cut.text()));

    let clean = read_sse(post(&s, "/v1/chat/completions", &body).await).await;
    assert!(clean.done && !clean.cut, "the script's second entry is a clean stream: {clean:?}");
    assert_eq!(clean.text(), canonical);
    let c = s.model_counters("m");
    assert_eq!((c.requests, c.planned, c.stream_faults), (2, 2, 1));
    assert_eq!(s.model_counters("other").stream_faults, 0);
}

#[tokio::test(start_paused = true)]
async fn a_stall_holds_the_stream_for_t_after_n_tokens_then_finishes() {
    let s = sim(|_| {});
    s.set_stream_script("m", "stall:2:5000".parse().unwrap());
    let body = streamed(chat("m", "hi"));
    let mut r = post(&s, "/v1/chat/completions", &body).await.into_body();
    for _ in 0..2 {
        r.frame().await.unwrap().unwrap();
    }
    let early = tokio::time::timeout(Duration::from_millis(4_999), r.frame()).await;
    assert!(early.is_err(), "nothing arrives during the stall");
    let third = r.frame().await.unwrap().unwrap().into_data().unwrap();
    assert!(std::str::from_utf8(&third).unwrap().starts_with("data: {"), "the stream resumes after the stall");
    let rest = read_sse(axum::http::Response::new(r)).await;
    assert!(rest.done && !rest.cut);
    assert_eq!(rest.usage().unwrap()["completion_tokens"], 10);
}

#[tokio::test(start_paused = true)]
async fn one_malformed_event_after_n_tokens_and_the_answer_stays_whole() {
    let s = sim(|_| {});
    s.set_stream_script("m", "malformed:4".parse().unwrap());
    let body = streamed(chat("m", "hi"));
    let sse = read_sse(post(&s, "/v1/chat/completions", &body).await).await;
    assert_eq!(sse.malformed.len(), 1, "{sse:?}");
    assert!(sse.done);
    assert_eq!(sse.text(), canonical_text(&s.config, Kind::Chat, &body));
    assert_eq!(sse.usage().unwrap()["completion_tokens"], 10);
}

#[tokio::test(start_paused = true)]
async fn a_missing_done_ends_the_stream_cleanly_after_usage() {
    let s = sim(|_| {});
    s.set_stream_script("m", Script { faults: [Some("no-done".parse().unwrap())].into(), repeat_last: true });
    for _ in 0..2 {
        let body = streamed(json!({"model": "m", "prompt": "once upon", "max_tokens": 4}));
        let sse = read_sse(post(&s, "/v1/completions", &body).await).await;
        assert!(!sse.done && !sse.cut, "{sse:?}");
        assert_eq!(sse.finish(), Some("length"));
        let usage = sse.usage().unwrap();
        assert_eq!((usage["prompt_tokens"].as_u64(), usage["completion_tokens"].as_u64()), (Some(2), Some(4)));
    }
    assert_eq!(s.model_counters("m").stream_faults, 2, "a repeated entry applies to every stream");
}

#[tokio::test(start_paused = true)]
async fn faults_can_be_set_over_http_and_a_non_streamed_request_is_not_faulted() {
    let s = sim(|_| {});
    let r = post(&s, "/sim/streams", &json!({"model": "m", "faults": ["cut:1", null]})).await;
    assert_eq!(r.status(), 204);
    let plain = json_of(post(&s, "/v1/chat/completions", &chat("m", "hi")).await).await;
    assert_eq!(plain["usage"]["completion_tokens"], 10, "{plain}");
    let sse = read_sse(post(&s, "/v1/chat/completions", &streamed(chat("m", "hi"))).await).await;
    assert!(sse.cut && sse.token_chunks() == 1, "{sse:?}");
    let bad = post(&s, "/sim/streams", &json!({"model": "m", "faults": ["explode"]})).await;
    assert_eq!(bad.status(), 400);
    let counters = json_of(post_get(&s, "/sim/streams/m").await).await;
    assert_eq!((counters["requests"].as_u64(), counters["stream_faults"].as_u64()), (Some(2), Some(1)));
}

async fn post_get(
    s: &std::sync::Arc<flotilla_enginesim::SimState>,
    path: &str,
) -> axum::http::Response<axum::body::Body> {
    use tower::ServiceExt;
    let req = axum::http::Request::get(path).body(axum::body::Body::empty()).unwrap();
    flotilla_enginesim::api::router(s.clone()).oneshot(req).await.unwrap()
}

#[tokio::test]
async fn a_cut_closes_a_real_connection_without_the_chunked_terminator() {
    let mut c = flotilla_enginesim::SimConfig { ttft_ms: 0, itl_ms: 0, ..Default::default() };
    c.streams.stream_faults = vec![("sim-model".into(), "cut:2".parse().unwrap())];
    let sim = flotilla_enginesim::spawn(c).await.unwrap();
    let body = streamed(chat("sim-model", "hi")).to_string();
    let mut conn = tokio::net::TcpStream::connect(sim.addr).await.unwrap();
    let head = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        body.len()
    );
    conn.write_all(format!("{head}{body}").as_bytes()).await.unwrap();
    let mut got = Vec::new();
    conn.read_to_end(&mut got).await.unwrap(); // the server closes it: cut, or done (`connection: close`)
    let got = String::from_utf8_lossy(&got);
    assert!(got.starts_with("HTTP/1.1 200"), "{got}");
    assert_eq!(got.matches("\"content\":").count(), 2, "two tokens, then the cut: {got}");
    assert!(!got.contains("[DONE]") && !got.ends_with("0\r\n\r\n"), "no [DONE], no end of the chunked body: {got}");
}
