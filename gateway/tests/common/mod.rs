//! Test harness: engine simulators on loopback ports playing clusters, a routing table file
//! naming them, the gateway on a real listener, and a small HTTP client that reads streamed
//! bodies to the end (or to the break).

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod router;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use flotilla_enginesim::{SimConfig, SimHandle};
use flotilla_gateway::{AppState, GatewayConfig, config::RoutingMode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// A simulator with fast defaults.
pub async fn sim(name: &str, models: &[&str], tweak: impl FnOnce(&mut SimConfig)) -> SimHandle {
    let mut c = SimConfig {
        name: name.into(),
        models: models.iter().map(|m| m.to_string()).collect(),
        ttft_ms: 5,
        itl_ms: 1,
        ..SimConfig::default()
    };
    tweak(&mut c);
    flotilla_enginesim::spawn(c).await.unwrap()
}

/// A loopback URL where nothing listens.
pub async fn dead_url() -> String {
    let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    drop(l);
    format!("http://{addr}")
}

/// Gateway settings for tests: short timeouts and backoff, no scraping or probing, fast reload.
pub fn test_config(path: PathBuf) -> GatewayConfig {
    let mut c = GatewayConfig::with_table(path);
    c.listen = "127.0.0.1:0".into();
    c.connect_timeout_ms = 300;
    c.ttft_timeout_ms = 600;
    c.request_timeout_ms = 1000;
    c.idle_timeout_ms = 400;
    c.backoff_base_ms = 40;
    c.backoff_max_ms = 200;
    c.max_retry_after_ms = 1500;
    c.breaker_failures = 100;
    c.scrape_interval_ms = 0;
    // Tests that exercise probing turn it on; elsewhere circuits reopen on their own period.
    c.probe_interval_ms = 0;
    c.reload_interval_ms = 50;
    c.routing = RoutingMode::LeastLoad;
    c.drain_ms = 2000;
    // Tests that exercise keys give a key source; the rest serve anonymously on purpose.
    c.allow_anonymous = true;
    c
}

static SEQ: AtomicU64 = AtomicU64::new(0);

/// A unique temporary file path.
pub fn temp_path(stem: &str) -> PathBuf {
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("flotilla-gw-{stem}-{}-{n}.yaml", std::process::id()))
}

/// Write `text` to `path` atomically (write, then rename).
pub fn write_atomic(path: &PathBuf, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// A running gateway.
pub struct Gateway {
    pub addr: SocketAddr,
    pub state: Arc<AppState>,
    pub table: PathBuf,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Gateway {
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
    /// Graceful shutdown; waits for the drain.
    pub async fn shutdown(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.task.abort();
        let _ = std::fs::remove_file(&self.table);
    }
}

/// Start a gateway on `yaml`.
pub async fn gateway(yaml: &str, tweak: impl FnOnce(&mut GatewayConfig)) -> Gateway {
    let table = temp_path("table");
    write_atomic(&table, yaml);
    let mut cfg = test_config(table.clone());
    tweak(&mut cfg);
    let state = AppState::load(cfg).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let st = state.clone();
    let task = tokio::spawn(async move {
        flotilla_gateway::serve::run(listener, st, async {
            let _ = rx.await;
        })
        .await
        .unwrap();
    });
    Gateway { addr, state, table, stop: Some(tx), task }
}

/// `clusters:` YAML for `(name, url, jurisdiction)`.
pub fn clusters_yaml(clusters: &[(&str, String, &str)]) -> String {
    let mut s = String::from("clusters:\n");
    for (n, u, j) in clusters {
        s.push_str(&format!(
            "  - {{name: {n}, url: \"{u}\", jurisdiction: {j}, region: {}-region}}\n",
            j.to_lowercase()
        ));
    }
    s
}

/// One answer as the test client saw it.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub headers: http::HeaderMap,
    pub text: String,
    /// The body broke (connection error) rather than ending.
    pub broken: bool,
}

impl Answer {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.text).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.text))
    }
    pub fn header(&self, name: &str) -> String {
        self.headers.get(name).map(|v| v.to_str().unwrap().to_string()).unwrap_or_default()
    }
    pub fn cluster(&self) -> String {
        self.header("x-flotilla-cluster")
    }
    /// SSE data payloads.
    pub fn events(&self) -> Vec<String> {
        self.text.split("\n\n").filter_map(|e| e.strip_prefix("data: ")).map(str::to_string).collect()
    }
}

pub fn client() -> Client<HttpConnector, Full<Bytes>> {
    Client::builder(TokioExecutor::new()).build(HttpConnector::new())
}

/// POST `body` and read the whole answer.
pub async fn post(url: &str, body: &Value) -> Answer {
    post_with(url, body, &[]).await
}

/// POST with extra headers.
pub async fn post_with(url: &str, body: &Value, headers: &[(&str, &str)]) -> Answer {
    let mut req = hyper::Request::post(url).header("content-type", "application/json");
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let req = req.body(Full::new(Bytes::from(body.to_string()))).unwrap();
    let resp = client().request(req).await.unwrap();
    read(resp).await
}

pub async fn get(url: &str) -> Answer {
    get_with(url, &[]).await
}

/// GET with extra headers.
pub async fn get_with(url: &str, headers: &[(&str, &str)]) -> Answer {
    let mut req = hyper::Request::get(url);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    read(client().request(req.body(Full::new(Bytes::new())).unwrap()).await.unwrap()).await
}

async fn read(resp: hyper::Response<hyper::body::Incoming>) -> Answer {
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let mut body = resp.into_body();
    let mut bytes = Vec::new();
    let mut broken = false;
    while let Some(f) = body.frame().await {
        match f {
            Ok(f) => {
                if let Ok(d) = f.into_data() {
                    bytes.extend_from_slice(&d);
                }
            }
            Err(_) => {
                broken = true;
                break;
            }
        }
    }
    Answer { status, headers, text: String::from_utf8_lossy(&bytes).into_owned(), broken }
}

/// A chat request body.
pub fn chat(model: &str, prompt: &str) -> Value {
    serde_json::json!({"model": model, "messages": [{"role": "user", "content": prompt}]})
}

/// A streamed chat request body.
pub fn chat_stream(model: &str, prompt: &str, include_usage: bool) -> Value {
    let mut v = chat(model, prompt);
    v["stream"] = true.into();
    if include_usage {
        v["stream_options"] = serde_json::json!({"include_usage": true});
    }
    v
}

/// Wait (bounded) until `cond` holds.
pub async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    for _ in 0..200 {
        if cond() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("timed out waiting for: {what}");
}

/// Requests per simulator name.
pub fn counts(sims: &[&SimHandle]) -> BTreeMap<String, usize> {
    sims.iter().map(|s| (s.state.config.name.clone(), s.state.request_count())).collect()
}
