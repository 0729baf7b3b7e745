//! Slow and hostile peers hold only their own connection: clients that trickle their body
//! take no concurrency slot and get 408 after the body timeout, while good requests keep
//! being served; wrong methods and unknown paths get OpenAI-shaped errors; an upstream event
//! without an end is cut at `--max-event-bytes` (an in-band error mid-stream, a failover
//! before the first byte) and counted. Raw TCP sockets on both sides.

#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

fn one(url: String) -> String {
    format!("{}models:\n  - {{name: m, routes: [{{cluster: a}}]}}\n", clusters_yaml(&[("a", url, "EU")]))
}

/// A request head announcing a 1,000-byte body, then one byte of it.
async fn slow_body(addr: std::net::SocketAddr) -> TcpStream {
    let mut s = TcpStream::connect(addr).await.unwrap();
    let head = "POST /v1/chat/completions HTTP/1.1\r\nhost: gw\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{";
    s.write_all(head.as_bytes()).await.unwrap();
    s
}

/// Everything the server sends until it closes: status and body.
async fn read_answer(s: &mut TcpStream) -> (u16, String) {
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).await.unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default();
    (status, body)
}

fn body_reads(gw: &Gateway) -> i64 {
    gw.state.metrics.body_reads().get()
}

#[tokio::test]
async fn clients_trickling_their_body_do_not_starve_the_gateway() {
    let a = sim("a", &["m"], |_| {}).await;
    let gw = gateway(&one(a.url()), |c| {
        c.max_concurrency = 8;
        c.body_timeout_ms = 120_000;
    })
    .await;
    let mut slow = Vec::new();
    for _ in 0..12 {
        slow.push(slow_body(gw.addr).await);
    }
    // Enough slow bodies in transit to hold every slot if a body held one.
    eventually("8 slow bodies are being read", || body_reads(&gw) >= 8).await;
    for i in 0..10 {
        let r = post(&gw.url("/v1/chat/completions"), &chat("m", &format!("good {i}"))).await;
        assert_eq!(r.status, 200, "request {i} beside 12 slow bodies: {}", r.text);
    }
    assert_eq!(a.state.request_count(), 10);
    eventually("the slow clients are all still connected, holding only their connections", || body_reads(&gw) == 12)
        .await;
    assert_eq!(gw.state.limit.available_permits(), 8, "no concurrency slot is held by a body in transit");
    drop(slow);
}

#[tokio::test]
async fn a_body_slower_than_the_body_timeout_gets_408_in_the_openai_shape() {
    let a = sim("a", &["m"], |_| {}).await;
    let gw = gateway(&one(a.url()), |c| c.body_timeout_ms = 200).await;
    let mut s = slow_body(gw.addr).await;
    let (status, body) = read_answer(&mut s).await;
    assert_eq!(status, 408, "{body}");
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "request_timeout");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(v["error"]["message"].as_str().unwrap().contains("--body-timeout-ms"));
    assert_eq!(a.state.request_count(), 0);
    assert_eq!(body_reads(&gw), 0);

    // A body announced above the size limit is refused from its head, without reading it.
    let gw = gateway(&one(a.url()), |c| c.max_body_bytes = 100).await;
    let mut s = slow_body(gw.addr).await;
    let (status, body) = read_answer(&mut s).await;
    assert_eq!(status, 413, "{body}");
}

#[tokio::test]
async fn wrong_methods_and_unknown_paths_get_openai_errors() {
    let a = sim("a", &["m"], |_| {}).await;
    let gw = gateway(&one(a.url()), |_| {}).await;
    let shape = |v: &Value| {
        let e = &v["error"];
        e["message"].is_string() && e["type"].is_string() && e.get("param").is_some() && e["code"].is_string()
    };
    let r = get(&gw.url("/v1/chat/completions")).await;
    assert_eq!(r.status, 405);
    assert!(shape(&r.json()), "{}", r.text);
    assert_eq!(r.json()["error"]["code"], "method_not_allowed");
    assert_eq!(r.header("allow"), "POST");
    let r = post(&gw.url("/v1/models"), &chat("m", "x")).await;
    assert_eq!((r.status, r.header("allow").as_str()), (405, "GET"));
    assert!(shape(&r.json()), "{}", r.text);
    let r = post(&gw.url("/v2/nothing"), &chat("m", "x")).await;
    assert_eq!(r.status, 404);
    assert!(shape(&r.json()), "{}", r.text);
    assert_eq!(a.state.request_count(), 0);
}

/// An upstream on loopback answering every request with a stream: `first` (bytes) then
/// `rest` bytes of one event that never ends, then silence (the connection stays open).
async fn endless_event_upstream(first: &'static str, rest: usize) -> String {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((mut s, _)) = l.accept().await else { return };
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let _ = s.read(&mut buf).await;
                let head = "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\nconnection: close\r\n\r\n";
                let _ = s.write_all(head.as_bytes()).await;
                let _ = s.write_all(first.as_bytes()).await;
                let _ = s.write_all(b"data: {\"choices\":[{\"delta\":{\"content\":\"").await;
                let chunk = vec![b'x'; 8192];
                for _ in 0..rest / chunk.len() {
                    if s.write_all(&chunk).await.is_err() {
                        return;
                    }
                }
                tokio::time::sleep(Duration::from_secs(30)).await;
            });
        }
    });
    format!("http://{addr}")
}

#[tokio::test]
async fn an_upstream_event_without_an_end_is_cut_at_the_cap() {
    let first = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"hi\"},\"finish_reason\":null}]}\n\n";
    let url = endless_event_upstream(first, 1 << 20).await;
    let gw = gateway(&one(url), |c| {
        c.max_event_bytes = 64 << 10;
        c.idle_timeout_ms = 20_000;
    })
    .await;
    let r = post(&gw.url("/v1/chat/completions"), &chat_stream("m", "q", false)).await;
    assert_eq!(r.status, 200);
    let ev = r.events();
    assert_eq!(ev.len(), 2, "the first event, then the error: {:?}", &r.text[..r.text.len().min(300)]);
    let err: Value = serde_json::from_str(ev[1].trim()).unwrap();
    assert_eq!(err["error"]["code"], "upstream_event_too_large");
    assert!(!r.text.contains("[DONE]") && !r.text.contains("xxxx"), "nothing of the giant event is forwarded");
    let m = get(&gw.url("/metrics")).await.text;
    assert!(m.contains("flotilla_gateway_streams_total{cluster=\"a\",end=\"oversized\"} 1"), "{m}");
}

#[tokio::test]
async fn a_giant_first_event_fails_over_before_the_first_byte() {
    let giant = endless_event_upstream("", 1 << 20).await;
    let b = sim("b", &["m"], |_| {}).await;
    let yaml = format!(
        "{}models:\n  - {{name: m, routes: [{{cluster: a}}, {{cluster: b}}]}}\n",
        clusters_yaml(&[("a", giant, "EU"), ("b", b.url(), "EU")])
    );
    let gw = gateway(&yaml, |c| c.max_event_bytes = 64 << 10).await;
    let r = post(&gw.url("/v1/chat/completions"), &chat_stream("m", "q", false)).await;
    assert_eq!((r.status, r.cluster().as_str()), (200, "b"), "{}", r.text);
    assert!(r.text.ends_with("data: [DONE]\n\n"));
    let m = get(&gw.url("/metrics")).await.text;
    assert!(m.contains("flotilla_gateway_upstream_attempts_total{cluster=\"a\",result=\"malformed\"} 1"), "{m}");
}
