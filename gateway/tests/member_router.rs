//! The member router on a real loopback listener with a table given directly (no API server),
//! in front of engine simulators playing two models' pods: each routing header reaches only its
//! own engine, streams arrive as SSE, a dead endpoint is skipped, refusals are OpenAI-shaped,
//! and `GET /v1/models` lists only the models that have a ready endpoint.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use axum::body::Body;
use bytes::Bytes;
use common::router::start;
use common::{chat, chat_stream, client, dead_url, eventually, get, get_with, post_with, sim};
use flotilla_gateway::member_router::metrics::RequestResult;
use flotilla_gateway::member_router::{Route, Table, app};
use http_body_util::{BodyExt, Full};
use serde_json::{Value, json};
use tower::ServiceExt;

const HDR: &str = "x-flotilla-deployment";

fn route(model: &str, source: &str, urls: &[&str]) -> Route {
    let eps: Vec<(&str, f64)> = urls.iter().map(|u| (*u, 1.0)).collect();
    Route::new(model, source, &eps)
}

#[tokio::test]
async fn each_header_reaches_only_its_own_engine() {
    let a = sim("engine-a", &["model-a"], |_| {}).await;
    let b = sim("engine-b", &["model-b"], |_| {}).await;
    let table = Table::default()
        .with("team-a/a", route("model-a", "team-a/a", &[&a.url()]))
        .with("team-b/b", route("model-b", "team-b/b", &[&b.url()]));
    let r = start(table, |_| {}).await;
    let url = r.url("/v1/chat/completions?trace=1");
    for _ in 0..3 {
        let ans = post_with(&url, &chat("model-a", "hello"), &[(HDR, "team-a/a")]).await;
        assert_eq!((ans.status, ans.header("x-sim-name").as_str()), (200, "engine-a"), "{}", ans.text);
    }
    let hop = [(HDR, "team-b/b"), ("connection", "x-hop"), ("x-hop", "secret"), ("x-end", "kept")];
    let ans = post_with(&url, &chat("model-b", "hello"), &hop).await;
    assert_eq!((ans.status, ans.header("x-sim-name").as_str()), (200, "engine-b"), "{}", ans.text);
    assert!(ans.json()["choices"][0]["message"]["content"].is_string());
    // Nothing crossed over.
    assert_eq!((a.state.request_count(), b.state.request_count()), (3, 1));
    assert!(a.state.requests().iter().all(|q| q.model == "model-a" && q.path == "/v1/chat/completions"));
    // Headers: end-to-end ones kept (the routing header too), hop-by-hop ones dropped, Host the engine's own.
    let seen = &b.state.requests()[0].headers;
    let get_h = |n: &str| seen.iter().find(|(k, _)| k == n).map(|(_, v)| v.clone());
    assert_eq!(get_h("x-end").as_deref(), Some("kept"));
    assert_eq!(get_h(HDR).as_deref(), Some("team-b/b"));
    assert_eq!(get_h("x-hop"), None);
    assert_eq!(get_h("host"), Some(b.addr.to_string()));
    assert_eq!(r.st.metrics.requests(RequestResult::proxied), 4);
}

#[tokio::test]
async fn a_stream_arrives_as_sse() {
    let a = sim("engine-a", &["model-a"], |c| c.default_tokens = 12).await;
    let r = start(Table::default().with("team-a/a", route("model-a", "team-a/a", &[&a.url()])), |_| {}).await;
    let ans =
        post_with(&r.url("/v1/chat/completions"), &chat_stream("model-a", "hi", false), &[(HDR, "team-a/a")]).await;
    assert_eq!(ans.status, 200, "{}", ans.text);
    assert!(ans.header("content-type").starts_with("text/event-stream"), "{:?}", ans.headers);
    let events = ans.events();
    assert!(events.len() > 3, "{events:?}");
    assert_eq!(events.last().map(String::as_str), Some("[DONE]"));
    assert!(!ans.broken);
}

#[tokio::test]
async fn the_clients_disconnect_cancels_the_upstream_stream() {
    let a = sim("engine-a", &["model-a"], |c| {
        c.default_tokens = 2000;
        c.itl_ms = 5;
    })
    .await;
    let r = start(Table::default().with("team-a/a", route("model-a", "team-a/a", &[&a.url()])), |_| {}).await;
    let req = hyper::Request::post(r.url("/v1/chat/completions"))
        .header(HDR, "team-a/a")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(chat_stream("model-a", "long", false).to_string())))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    let mut body = resp.into_body();
    let first = body.frame().await.unwrap().unwrap();
    assert!(first.is_data());
    eventually("the engine is generating", || a.state.running() == 1).await;
    drop(body);
    eventually("the engine's request was cancelled", || a.state.cancelled() == 1).await;
    assert_eq!(a.state.completed(), 0);
}

#[tokio::test]
async fn a_dead_endpoint_is_skipped_on_connect_failure() {
    let a = sim("engine-a", &["model-a"], |_| {}).await;
    let dead = dead_url().await;
    let table = Table::default()
        .with("team-a/a", route("model-a", "team-a/a", &[&dead, &a.url()]))
        .with("team-a/gone", route("model-gone", "team-a/gone", &[&dead]));
    let r = start(table, |_| {}).await;
    for _ in 0..6 {
        let ans = post_with(&r.url("/v1/chat/completions"), &chat("model-a", "x"), &[(HDR, "team-a/a")]).await;
        assert_eq!((ans.status, ans.header("x-sim-name").as_str()), (200, "engine-a"), "{}", ans.text);
    }
    assert_eq!(a.state.request_count(), 6);
    // Only dead endpoints: 502, said in the OpenAI shape.
    let ans = post_with(&r.url("/v1/chat/completions"), &chat("model-gone", "x"), &[(HDR, "team-a/gone")]).await;
    assert_eq!(ans.status, 502, "{}", ans.text);
    assert_eq!(ans.json()["error"]["code"], "upstream_unreachable");
    assert_eq!(r.st.metrics.requests(RequestResult::unreachable), 1);
    assert_eq!(r.st.metrics.requests(RequestResult::proxied), 6);
}

#[tokio::test]
async fn unknown_or_missing_headers_get_an_openai_shaped_404() {
    let a = sim("engine-a", &["model-a"], |_| {}).await;
    let r = start(Table::default().with("team-a/a", route("model-a", "team-a/a", &[&a.url()])), |_| {}).await;
    for headers in [vec![(HDR, "team-a/other")], vec![]] {
        let ans = post_with(&r.url("/v1/chat/completions"), &chat("model-a", "x"), &headers).await;
        assert_eq!(ans.status, 404, "{}", ans.text);
        let v = ans.json();
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], "route_not_found");
        assert_eq!(v["error"]["param"], Value::Null);
        assert!(v["error"]["message"].as_str().unwrap().contains(HDR), "{v}");
    }
    assert_eq!(a.state.request_count(), 0, "nothing reached the engine");
    // Known, but no ready endpoint: 503.
    r.st.set_table(Table::default().with("team-a/a", route("model-a", "team-a/a", &[])));
    let ans = post_with(&r.url("/v1/chat/completions"), &chat("model-a", "x"), &[(HDR, "team-a/a")]).await;
    assert_eq!(ans.status, 503, "{}", ans.text);
    assert_eq!(ans.json()["error"]["code"], "no_ready_endpoint");
    let m = get(&r.url("/metrics")).await.text;
    assert!(m.contains("flotilla_member_router_requests_total{result=\"no_route\"} 2"), "{m}");
    assert!(m.contains("flotilla_member_router_requests_total{result=\"no_endpoint\"} 1"), "{m}");
}

#[tokio::test]
async fn an_oversized_body_is_refused_with_413() {
    let a = sim("engine-a", &["model-a"], |_| {}).await;
    let table = Table::default().with("team-a/a", route("model-a", "team-a/a", &[&a.url()]));
    let r = start(table.clone(), |c| c.max_body_bytes = 1024).await;
    let big = chat("model-a", &"word ".repeat(1000));
    let ans = post_with(&r.url("/v1/chat/completions"), &big, &[(HDR, "team-a/a")]).await;
    assert_eq!(ans.status, 413, "{}", ans.text);
    assert_eq!(ans.json()["error"]["code"], "request_too_large");
    // A body without a declared length is cut at the limit too.
    let chunks = futures_util::stream::iter(
        (0..8).map(|_| Ok::<_, std::io::Error>(Bytes::from(vec![b' '; 512]))).collect::<Vec<_>>(),
    );
    let req =
        http::Request::post("/v1/chat/completions").header(HDR, "team-a/a").body(Body::from_stream(chunks)).unwrap();
    let resp = app(r.st.clone()).oneshot(req).await.unwrap();
    assert_eq!(resp.status(), 413);
    assert_eq!(a.state.request_count(), 0);
    assert_eq!(r.st.metrics.requests(RequestResult::too_large), 2);
    // Under the limit, it goes through.
    let ans = post_with(&r.url("/v1/chat/completions"), &chat("model-a", "short"), &[(HDR, "team-a/a")]).await;
    assert_eq!(ans.status, 200, "{}", ans.text);
}

#[tokio::test]
async fn models_lists_only_models_with_ready_endpoints() {
    let a = sim("engine-a", &["model-a"], |_| {}).await;
    let b = sim("engine-b", &["model-b"], |_| {}).await;
    let table = Table::default()
        .with("team-a/a", route("model-a", "team-a/a", &[&a.url()]))
        .with("team-a/a2", route("model-a", "team-a/a2", &[&a.url()]))
        .with("team-b/b", route("model-b", "team-b/b", &[&b.url()]))
        .with("team-c/c", route("model-c", "team-c/c", &[]));
    let r = start(table, |_| {}).await;
    let v = get(&r.url("/v1/models")).await.json();
    assert_eq!(v["object"], "list");
    let ids: Vec<&str> = v["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, ["model-a", "model-b"]);
    assert!(v["data"].as_array().unwrap().iter().all(|m| m["object"] == "model" && m["owned_by"] == "flotilla"));
    // With the header it is the engine's own list.
    let ans = get_with(&r.url("/v1/models"), &[(HDR, "team-b/b")]).await;
    assert_eq!(ans.status, 200, "{}", ans.text);
    let ids: Vec<Value> = ans.json()["data"].as_array().unwrap().iter().map(|m| m["id"].clone()).collect();
    assert_eq!(ids, [json!("model-b")], "engine-b's own list");
    // A swapped table is in force for the next request.
    r.st.set_table(Table::default().with("team-b/b", route("model-b", "team-b/b", &[&b.url()])));
    let v = get(&r.url("/v1/models")).await.json();
    assert_eq!(v["data"].as_array().unwrap().len(), 1);
    assert_eq!(get(&r.url("/readyz")).await.status, 200);
    assert_eq!(get(&r.url("/healthz")).await.status, 200);
}

/// An upstream that answers with the URI and headers it received, and a hop-by-hop header.
async fn echo() -> String {
    let app = axum::Router::new().fallback(|req: axum::extract::Request| async move {
        let headers: serde_json::Map<String, Value> =
            req.headers().iter().map(|(k, v)| (k.to_string(), json!(v.to_str().unwrap_or_default()))).collect();
        let body = json!({"method": req.method().as_str(), "uri": req.uri().to_string(), "headers": headers});
        ([("keep-alive", "timeout=5"), ("x-upstream", "echo")], axum::Json(body))
    });
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    format!("http://{addr}")
}

#[tokio::test]
async fn method_path_and_query_reach_the_endpoint_and_hop_by_hop_headers_do_not() {
    let up = echo().await;
    let r = start(Table::default().with("team-a/a", route("model-a", "team-a/a", &[&up])), |_| {}).await;
    let req = hyper::Request::put(r.url("/v1/some/path?x=1&y=two"))
        .header(HDR, "team-a/a")
        .header("expect", "100-continue")
        .header("te", "trailers")
        .header("proxy-authorization", "Basic eA==")
        .header("authorization", "Bearer engine-key")
        .body(Full::new(Bytes::from_static(b"{}")))
        .unwrap();
    let resp = client().request(req).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["x-upstream"], "echo");
    assert!(resp.headers().get("keep-alive").is_none(), "hop-by-hop answer headers are dropped");
    let v: Value = serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    assert_eq!(v["method"], "PUT");
    assert_eq!(v["uri"], "/v1/some/path?x=1&y=two");
    let h = &v["headers"];
    assert_eq!(h["authorization"], "Bearer engine-key");
    assert_eq!(h["host"], up.trim_start_matches("http://"));
    assert_eq!(h["content-length"], "2");
    for gone in ["expect", "te", "proxy-authorization"] {
        assert!(h.get(gone).is_none(), "{gone} was forwarded: {h}");
    }
}
