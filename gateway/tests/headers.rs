//! Request heads at the edge: the header-count limit (431 with an OpenAI-shaped body before
//! anything reaches a cluster), and hop-by-hop headers, which stop at the gateway in both
//! directions — the simulator records what it received and adds hop-by-hop headers of its own.

#![allow(clippy::unwrap_used)]

mod common;

use common::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The hop-by-hop headers of RFC 9110 §7.6.1 plus the legacy ones proxies still strip.
const HOP_BY_HOP: [&str; 10] = [
    "connection",
    "keep-alive",
    "proxy-authenticate",
    "proxy-authorization",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "x-hop-custom",
];

/// One raw HTTP/1.1 exchange on a fresh connection (the request must ask to close it):
/// the status, the head's header names (lower case) and the body.
async fn raw(addr: std::net::SocketAddr, request: &str) -> (u16, Vec<(String, String)>, String) {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(request.as_bytes()).await.unwrap();
    let mut buf = Vec::new();
    tokio::time::timeout(std::time::Duration::from_secs(5), s.read_to_end(&mut buf)).await.unwrap().unwrap();
    let text = String::from_utf8_lossy(&buf).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status = lines.next().unwrap().split(' ').nth(1).unwrap().parse().unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, body.to_string())
}

fn request_with_headers(n: usize) -> String {
    let body = chat("m", "hi").to_string();
    // Host, Content-Type, Content-Length and Connection are four of the `n`.
    let mut r = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for i in 0..n.saturating_sub(4) {
        r.push_str(&format!("X-Filler-{i}: {i}\r\n"));
    }
    r + "\r\n" + &body
}

#[tokio::test]
async fn more_header_fields_than_the_limit_get_431_with_an_openai_body() {
    let a = sim("a", &["m"], |_| {}).await;
    let yaml =
        format!("{}models:\n  - {{name: m, routes: [{{cluster: a}}]}}\n", clusters_yaml(&[("a", a.url(), "EU")]));
    let gw = gateway(&yaml, |c| c.max_headers = 100).await;

    let (status, _, _) = raw(gw.addr, &request_with_headers(100)).await;
    assert_eq!(status, 200, "exactly the limit is accepted");
    assert_eq!(a.state.request_count(), 1);

    let (status, headers, body) = raw(gw.addr, &request_with_headers(101)).await;
    assert_eq!(status, 431);
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["error"]["code"], "too_many_headers");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(v["error"]["message"].as_str().unwrap().contains("--max-headers"));
    assert!(headers.iter().any(|(k, _)| k == "x-request-id"), "the error carries a request id");

    // Far above the limit the server's parser answers 431 itself.
    let (status, _, _) = raw(gw.addr, &request_with_headers(5000)).await;
    assert_eq!(status, 431);
    assert_eq!(a.state.request_count(), 1, "no over-limit request reached the cluster");
}

#[tokio::test]
async fn hop_by_hop_headers_from_the_client_are_not_forwarded() {
    let a = sim("a", &["m"], |_| {}).await;
    let yaml =
        format!("{}models:\n  - {{name: m, routes: [{{cluster: a}}]}}\n", clusters_yaml(&[("a", a.url(), "EU")]));
    let gw = gateway(&yaml, |_| {}).await;
    let body = chat("m", "hello hop").to_string();
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: gw\r\nContent-Type: application/json\r\n\
         Connection: close, X-Hop-Custom\r\nKeep-Alive: timeout=5\r\n\
         Proxy-Authorization: Basic Zm9vOmJhcg==\r\nProxy-Connection: keep-alive\r\nTE: trailers\r\n\
         Trailer: X-Checksum\r\nUpgrade: websocket\r\nX-Hop-Custom: secret\r\nX-Request-Id: hop-test-1\r\n\
         Transfer-Encoding: chunked\r\n\r\n{:x}\r\n{body}\r\n0\r\n\r\n",
        body.len()
    );
    let (status, _, answer) = raw(gw.addr, &request).await;
    assert_eq!(status, 200, "{answer}");

    let seen = a.state.requests();
    assert_eq!(seen.len(), 1);
    let names: Vec<&str> = seen[0].headers.iter().map(|(k, _)| k.as_str()).collect();
    for h in HOP_BY_HOP {
        if h == "connection" {
            // The gateway's own hop may say keep-alive; it never carries the client's value.
            let v = seen[0].headers.iter().find(|(k, _)| k == h).map(|(_, v)| v.to_ascii_lowercase());
            assert!(v.as_ref().is_none_or(|v| !v.contains("x-hop-custom") && !v.contains("close")), "{v:?}");
            continue;
        }
        assert!(!names.contains(&h), "`{h}` reached the cluster: {:?}", seen[0].headers);
    }
    assert!(seen[0].headers.iter().any(|(k, v)| k == "x-request-id" && v == "hop-test-1"), "end-to-end ids pass");
    assert!(names.contains(&"content-length"), "the gateway frames its own hop: {names:?}");
}

#[tokio::test]
async fn hop_by_hop_headers_from_the_cluster_are_not_returned() {
    let hop = [
        "connection: keep-alive, x-hop-custom",
        "keep-alive: timeout=5, max=100",
        "proxy-authenticate: Basic realm=fleet",
        "proxy-connection: keep-alive",
        "te: trailers",
        "trailer: x-checksum",
        "upgrade: h2c",
        "x-hop-custom: secret",
    ];
    let a = sim("a", &["m"], |c| c.response_headers = hop.iter().map(|h| h.to_string()).collect()).await;
    let yaml =
        format!("{}models:\n  - {{name: m, routes: [{{cluster: a}}]}}\n", clusters_yaml(&[("a", a.url(), "EU")]));
    let gw = gateway(&yaml, |_| {}).await;

    // The simulator really sends them (straight to it, without the gateway).
    let direct = post(&format!("{}/v1/chat/completions", a.url()), &chat("m", "direct")).await;
    assert_eq!(direct.header("x-hop-custom"), "secret");
    assert_eq!(direct.header("upgrade"), "h2c");

    let r = post(&gw.url("/v1/chat/completions"), &chat("m", "plain")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    for h in HOP_BY_HOP {
        assert!(r.headers.get(h).is_none(), "`{h}` came back to the client: {:?}", r.headers);
    }
    assert!(r.headers.get("content-length").is_some(), "a complete answer has the gateway's own framing");

    let r = post(&gw.url("/v1/chat/completions"), &chat_stream("m", "streamed", false)).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.events().last().map(String::as_str), Some("[DONE]"));
    for h in HOP_BY_HOP.iter().filter(|h| **h != "transfer-encoding") {
        assert!(r.headers.get(*h).is_none(), "`{h}` came back to the client: {:?}", r.headers);
    }
    // A stream is chunked by the gateway's own hop, not copied from the cluster's.
    assert_eq!(r.header("transfer-encoding"), "chunked");
}

#[tokio::test]
async fn a_route_names_its_deployment_to_the_member_and_a_client_cannot() {
    let a = sim("a", &["m", "n"], |_| {}).await;
    let yaml = format!(
        "{}models:\n  - {{name: m, routes: [{{cluster: a, memberRoute: team-a/m}}]}}\n  - {{name: n, routes: [{{cluster: a}}]}}\n",
        clusters_yaml(&[("a", a.url(), "EU")])
    );
    let gw = gateway(&yaml, |_| {}).await;
    // A client naming another tenant's deployment is not heard: the route's own value goes.
    let r = post_with(&gw.url("/v1/chat/completions"), &chat("m", "hi"), &[("x-flotilla-deployment", "team-b/secret")])
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let r = post_with(&gw.url("/v1/chat/completions"), &chat("n", "hi"), &[("x-flotilla-deployment", "team-b/secret")])
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let seen = a.state.requests();
    let values = |i: usize| -> Vec<String> {
        seen[i].headers.iter().filter(|(k, _)| k == "x-flotilla-deployment").map(|(_, v)| v.clone()).collect()
    };
    assert_eq!(values(0), ["team-a/m"], "the route's deployment, once");
    assert!(values(1).is_empty(), "a route without one sends none, whatever the client sent");
}
