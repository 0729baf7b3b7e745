//! Drives the simulator's router in-process (`oneshot`, so paused tokio time governs every
//! delay): posts a request body and reads an SSE answer event by event, noting whether the
//! stream ended cleanly, was cut, or ended without `[DONE]`.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use axum::body::Body;
use axum::http::{Request, Response};
use flotilla_enginesim::{SimConfig, SimState, api};
use http_body_util::BodyExt;
use serde_json::{Value, json};
use tower::ServiceExt;

/// A fast simulator serving `m` and `other`, seeded.
pub fn sim(tweak: impl FnOnce(&mut SimConfig)) -> Arc<SimState> {
    let mut c = SimConfig {
        models: vec!["m".into(), "other".into()],
        ttft_ms: 0,
        itl_ms: 0,
        prefill_ms_per_block: 0,
        default_tokens: 10,
        seed: 42,
        ..SimConfig::default()
    };
    tweak(&mut c);
    SimState::new(c)
}

pub async fn post(s: &Arc<SimState>, path: &str, body: &Value) -> Response<Body> {
    let req =
        Request::post(path).header("content-type", "application/json").body(Body::from(body.to_string())).unwrap();
    api::router(s.clone()).oneshot(req).await.unwrap()
}

pub async fn get(s: &Arc<SimState>, path: &str) -> Response<Body> {
    api::router(s.clone()).oneshot(Request::get(path).body(Body::empty()).unwrap()).await.unwrap()
}

pub async fn text_of(r: Response<Body>) -> String {
    String::from_utf8(r.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap()
}

pub async fn json_of(r: Response<Body>) -> Value {
    serde_json::from_slice(&r.into_body().collect().await.unwrap().to_bytes()).unwrap()
}

/// A streamed answer as read.
#[derive(Debug, Default)]
pub struct Sse {
    /// The `data:` payloads that parsed as JSON, in order.
    pub chunks: Vec<Value>,
    /// `data:` payloads that did not (neither JSON nor `[DONE]`).
    pub malformed: Vec<String>,
    pub done: bool,
    /// The body failed (the connection was cut).
    pub cut: bool,
}

impl Sse {
    /// The streamed text: chat deltas or completion texts.
    pub fn text(&self) -> String {
        self.chunks
            .iter()
            .filter_map(|c| c["choices"][0]["delta"]["content"].as_str().or(c["choices"][0]["text"].as_str()))
            .collect()
    }
    /// Chunks carrying a token.
    pub fn token_chunks(&self) -> usize {
        self.chunks
            .iter()
            .filter(|c| {
                c["choices"][0]["delta"]["content"].is_string()
                    || c["choices"][0]["text"].as_str().is_some_and(|t| !t.is_empty())
            })
            .count()
    }
    pub fn usage(&self) -> Option<&Value> {
        self.chunks.iter().find_map(|c| c.get("usage"))
    }
    pub fn finish(&self) -> Option<&str> {
        self.chunks.iter().find_map(|c| c["choices"][0]["finish_reason"].as_str())
    }
}

/// Reads the whole SSE body (to its end or its failure).
pub async fn read_sse(r: Response<Body>) -> Sse {
    let mut body = r.into_body();
    let mut sse = Sse::default();
    let mut buf = String::new();
    loop {
        match body.frame().await {
            None => break,
            Some(Err(_)) => {
                sse.cut = true;
                break;
            }
            Some(Ok(f)) => {
                if let Ok(d) = f.into_data() {
                    buf.push_str(std::str::from_utf8(&d).unwrap());
                }
            }
        }
        while let Some(i) = buf.find("\n\n") {
            let event: String = buf.drain(..i + 2).collect();
            let data = event.trim().strip_prefix("data: ").unwrap_or(event.trim()).to_string();
            if data == "[DONE]" {
                sse.done = true;
            } else {
                match serde_json::from_str(&data) {
                    Ok(v) => sse.chunks.push(v),
                    Err(_) => sse.malformed.push(data),
                }
            }
        }
    }
    sse
}

pub fn chat(model: &str, prompt: &str) -> Value {
    json!({"model": model, "messages": [{"role": "user", "content": prompt}]})
}

/// `body` streamed, with usage.
pub fn streamed(mut body: Value) -> Value {
    body["stream"] = json!(true);
    body["stream_options"] = json!({"include_usage": true});
    body
}

/// The chat continuation of `body` after `partial`, as a continuing client sends it.
pub fn continuation(body: &Value, partial: &str) -> Value {
    let mut b = body.clone();
    b["messages"].as_array_mut().unwrap().push(json!({"role": "assistant", "content": partial}));
    b["continue_final_message"] = json!(true);
    b["add_generation_prompt"] = json!(false);
    b
}
