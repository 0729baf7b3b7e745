//! A tiny HTTP/1 client on hyper for the e2e tests that talk to gateways (the workspace has no
//! reqwest): GETs with optional headers, and chat completions whose answer keeps the status,
//! the serving cluster (`x-flotilla-cluster`), `Retry-After` and the JSON body.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// A chat completion's answer.
pub struct Answer {
    pub status: u16,
    pub cluster: String,
    pub retry_after: Option<String>,
    pub body: Value,
}

pub struct Client(hyper_util::client::legacy::Client<HttpConnector, Full<Bytes>>);

impl Client {
    pub fn new() -> Self {
        Client(hyper_util::client::legacy::Client::builder(TokioExecutor::new()).build_http())
    }

    /// GET with an API key (`Authorization: Bearer`), if given.
    pub async fn get(&self, url: &str, key: Option<&str>) -> (u16, String) {
        let auth = key.map(|k| format!("Bearer {k}"));
        match &auth {
            Some(a) => self.get_with(url, &[("authorization", a)]).await,
            None => self.get_with(url, &[]).await,
        }
    }

    /// GET with these headers.
    pub async fn get_with(&self, url: &str, headers: &[(&str, &str)]) -> (u16, String) {
        let mut req = hyper::Request::get(url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let (resp, body) = bounded(url, async {
            let resp = self.0.request(req.body(Full::new(Bytes::new())).unwrap()).await.unwrap();
            let (parts, body) = resp.into_parts();
            (parts, body.collect().await.unwrap().to_bytes())
        })
        .await;
        let status = resp.status.as_u16();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    /// POSTs `body` as JSON to `url` with `headers`: the status and the body as text.
    pub async fn post_json_with(&self, url: &str, body: &Value, headers: &[(&str, &str)]) -> (u16, String) {
        let mut req = hyper::Request::post(url).header("content-type", "application/json");
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let (resp, bytes) = bounded(url, async {
            let resp = self.0.request(req.body(Full::new(Bytes::from(body.to_string()))).unwrap()).await.unwrap();
            let (parts, body) = resp.into_parts();
            (parts, body.collect().await.unwrap().to_bytes())
        })
        .await;
        (resp.status.as_u16(), String::from_utf8_lossy(&bytes).into_owned())
    }

    pub async fn chat(&self, url: &str, model: &str, key: Option<&str>) -> Answer {
        self.chat_prompt(url, model, key, "hello fleet").await
    }

    pub async fn chat_prompt(&self, url: &str, model: &str, key: Option<&str>, prompt: &str) -> Answer {
        let body =
            serde_json::json!({"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": 4});
        let mut req =
            hyper::Request::post(format!("{url}/v1/chat/completions")).header("content-type", "application/json");
        if let Some(k) = key {
            req = req.header("authorization", format!("Bearer {k}"));
        }
        let (resp, bytes) = bounded(url, async {
            let resp = self.0.request(req.body(Full::new(Bytes::from(body.to_string()))).unwrap()).await.unwrap();
            let (parts, body) = resp.into_parts();
            (parts, body.collect().await.unwrap().to_bytes())
        })
        .await;
        let status = resp.status.as_u16();
        let header = |n: &str| resp.headers.get(n).and_then(|v| v.to_str().ok()).map(str::to_string);
        let (cluster, retry_after) = (header("x-flotilla-cluster").unwrap_or_default(), header("retry-after"));
        let body = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        Answer { status, cluster, retry_after, body }
    }
}

/// Every request the tests make is answered within a minute, or the test fails naming the URL
/// (a gateway that never answers must fail the test, not hang it).
async fn bounded<T>(url: &str, f: impl std::future::Future<Output = T>) -> T {
    match tokio::time::timeout(std::time::Duration::from_secs(60), f).await {
        Ok(v) => v,
        Err(_) => panic!("no answer from {url} within 60 s"),
    }
}
