//! The simulator's HTTP surface: the vLLM OpenAI endpoints, `/health`, `/metrics`, and the
//! `/sim/*` control endpoints. An inference request is logged, meets its injected fault, is
//! planned for its model by [`crate::streams`], queues for a sequence slot, and is answered by
//! [`crate::generate`].

use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Json;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::cache::fnv;
use crate::generate::{self, Answer, Inflight, Kind, StreamPlan};
use crate::server::ConnKill;
use crate::{Fault, SimState, lock};

/// How long the `stall:N` fault stalls.
const STALL: Duration = Duration::from_secs(60);

/// The simulator's router.
pub fn router(state: Arc<SimState>) -> axum::Router {
    axum::Router::new()
        .route("/v1/chat/completions", post(chat))
        .route("/v1/completions", post(completions))
        .route(
            "/v1/embeddings",
            post(|State(s): State<Arc<SimState>>, req: Request| async move {
                let r = embeddings(s.clone(), req).await;
                with_extra_headers(&s, r)
            }),
        )
        .route("/v1/models", get(models))
        .route(
            "/health",
            get(|State(s): State<Arc<SimState>>| async move {
                s.count_probe();
                StatusCode::OK
            }),
        )
        .route("/metrics", get(|State(s): State<Arc<SimState>>| async move { crate::metrics::render(&s) }))
        .route("/sim/fault", post(set_fault).delete(clear_fault))
        .route("/sim/stats", get(stats))
        .route("/sim/model", post(crate::models::set_model))
        .merge(crate::streams::routes())
        .merge(crate::lora::routes())
        .layer(axum::middleware::from_fn_with_state(state.clone(), api_key))
        .with_state(state)
}

/// vLLM's `--api-key` check: `/v1/*` needs `Authorization: Bearer <key>` (401 otherwise).
async fn api_key(State(s): State<Arc<SimState>>, req: Request, next: axum::middleware::Next) -> Response {
    if let Some(key) = &s.config.api_key
        && req.uri().path().starts_with("/v1")
    {
        let sent = req.headers().get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
        if sent != Some(format!("Bearer {key}").as_str()) {
            s.count_unauthorized();
            return (StatusCode::UNAUTHORIZED, Json(json!({"error": "Unauthorized"}))).into_response();
        }
    }
    next.run(req).await
}

/// An OpenAI-shaped error body, its `code` also in the `x-sim-error` header.
pub(crate) fn error(status: StatusCode, kind: &str, code: &str, message: String) -> Response {
    let body = json!({"error": {"message": message, "type": kind, "param": null, "code": code}});
    (status, [("x-sim-error", code.to_string())], Json(body)).into_response()
}

async fn chat(State(s): State<Arc<SimState>>, req: Request) -> Response {
    let r = if s.config.fixed_response {
        fixed(&s, req, Kind::Chat).await
    } else {
        infer(s.clone(), req, Kind::Chat).await
    };
    with_extra_headers(&s, r)
}

async fn completions(State(s): State<Arc<SimState>>, req: Request) -> Response {
    let r = if s.config.fixed_response {
        fixed(&s, req, Kind::Completion).await
    } else {
        infer(s.clone(), req, Kind::Completion).await
    };
    with_extra_headers(&s, r)
}

/// `--response-header` values added to an inference response (appended, so a header the
/// simulator already set is sent twice).
fn with_extra_headers(s: &SimState, mut r: Response) -> Response {
    for h in &s.config.response_headers {
        let Some((name, value)) = h.split_once(':') else { continue };
        let name = header::HeaderName::from_bytes(name.trim().as_bytes());
        if let (Ok(n), Ok(v)) = (name, HeaderValue::from_str(value.trim())) {
            r.headers_mut().append(n, v);
        }
    }
    r
}

/// The `--fixed-response` answer: one token, no queueing, no log.
async fn fixed(s: &SimState, req: Request, kind: Kind) -> Response {
    let Ok(body) = axum::body::to_bytes(req.into_body(), 64 << 20).await else {
        return error(StatusCode::BAD_REQUEST, "BadRequestError", "bad_body", "unreadable body".into());
    };
    s.completed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let model = s.config.models.first().map(String::as_str).unwrap_or("sim-model");
    let key = b"\"stream\":";
    let stream = body
        .windows(key.len())
        .position(|w| w == key)
        .is_some_and(|i| body[i + key.len()..].trim_ascii_start().starts_with(b"true"));
    let (object, part, delta) = match kind {
        Kind::Chat => {
            ("chat.completion", r#""message":{"role":"assistant","content":"ok"}"#, r#""delta":{"content":"ok"}"#)
        }
        Kind::Completion => ("text_completion", r#""text":"ok""#, r#""text":"ok""#),
    };
    let usage = r#""usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}"#;
    if !stream {
        let body = format!(
            r#"{{"id":"fixed","object":"{object}","created":0,"model":"{model}","choices":[{{"index":0,{part},"finish_reason":"stop"}}],{usage}}}"#
        );
        return ([(header::CONTENT_TYPE, "application/json")], body).into_response();
    }
    let chunk = if kind == Kind::Chat { "chat.completion.chunk" } else { "text_completion" };
    let body = format!(
        "data: {{\"id\":\"fixed\",\"object\":\"{chunk}\",\"created\":0,\"model\":\"{model}\",\"choices\":[{{\"index\":0,{delta},\"finish_reason\":\"stop\"}}]}}\n\ndata: [DONE]\n\n"
    );
    ([(header::CONTENT_TYPE, "text/event-stream"), (header::CACHE_CONTROL, "no-cache")], body).into_response()
}

/// A request's headers as `(name, value)` pairs, in arrival order.
fn header_list(h: &header::HeaderMap) -> Vec<(String, String)> {
    h.iter().map(|(k, v)| (k.as_str().to_string(), String::from_utf8_lossy(v.as_bytes()).into_owned())).collect()
}

async fn read_json(s: &SimState, req: Request) -> Result<(Value, String, Vec<(String, String)>), Response> {
    let path = req.uri().path().to_string();
    let headers = header_list(req.headers());
    let body = axum::body::to_bytes(req.into_body(), 64 << 20)
        .await
        .map_err(|e| error(StatusCode::BAD_REQUEST, "BadRequestError", "bad_body", e.to_string()))?;
    let v: Value = serde_json::from_slice(&body)
        .map_err(|e| error(StatusCode::BAD_REQUEST, "BadRequestError", "invalid_json", e.to_string()))?;
    let model = v["model"].as_str().unwrap_or_default().to_string();
    // A loaded adapter is served like a base model; one that is not is unknown, as in vLLM.
    if !s.config.models.contains(&model) && !s.loras.count_request(&model) {
        s.record(&path, &model, String::new(), headers);
        let msg = format!("The model `{model}` does not exist.");
        return Err(error(StatusCode::NOT_FOUND, "NotFoundError", "model_not_found", msg));
    }
    Ok((v, path, headers))
}

/// The response for a fault that replaces the answer, if `fault` is one.
async fn fault_response(fault: Option<Fault>, kill: Option<ConnKill>, model: &str) -> Option<Response> {
    Some(match fault? {
        Fault::RateLimit(after) => {
            let mut r =
                error(StatusCode::TOO_MANY_REQUESTS, "RateLimitError", "rate_limited", "Too many requests".into());
            if let Some(secs) = after {
                r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
            }
            r
        }
        Fault::Error500 => {
            error(StatusCode::INTERNAL_SERVER_ERROR, "InternalServerError", "internal", "engine error".into())
        }
        Fault::Error503 => {
            error(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", "unavailable", "engine busy".into())
        }
        Fault::Reset => {
            if let Some(k) = kill {
                k.0.notify_one();
            }
            std::future::pending::<()>().await;
            return None;
        }
        Fault::NoResponse => {
            std::future::pending::<()>().await;
            return None;
        }
        Fault::ContextLength => context_error(model, 0),
        Fault::ContentPolicy => error(
            StatusCode::BAD_REQUEST,
            "BadRequestError",
            "content_policy_violation",
            "The prompt was rejected by the content policy.".into(),
        ),
        _ => return None,
    })
}

fn context_error(model: &str, requested: u64) -> Response {
    let msg = format!(
        "This model's maximum context length is exceeded: you requested {requested} tokens of `{model}`. Please reduce the length of the messages or completion."
    );
    error(StatusCode::BAD_REQUEST, "BadRequestError", "context_length_exceeded", msg)
}

async fn infer(s: Arc<SimState>, req: Request, kind: Kind) -> Response {
    let kill = req.extensions().get::<ConnKill>().cloned();
    let (v, path, headers) = match read_json(&s, req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let model = v["model"].as_str().unwrap_or_default().to_string();
    let prompt = crate::canonical::prompt_text(&v, kind);
    let head = prompt.split_whitespace().take(8).collect::<Vec<_>>().join(" ");
    s.record(&path, &model, head, headers);
    let fault = s.fault_for(&model);
    if let Some(r) = fault_response(fault, kill, &model).await {
        return r;
    }
    let streamed = v["stream"].as_bool() == Some(true);
    let planned = match crate::streams::turn(&s, kind, &v, streamed) {
        Ok(p) => p,
        Err(message) => return error(StatusCode::BAD_REQUEST, "BadRequestError", "bad_request", message),
    };
    let words: Vec<&str> = prompt.split_whitespace().collect();
    let limit = crate::canonical::limit(&v);
    let n = limit.unwrap_or(u64::from(s.config.default_tokens)).min(4096);
    let requested = words.len() as u64 + n;
    if requested > u64::from(s.config.max_model_len) {
        return context_error(&model, requested);
    }
    // Past `read_json`, a model that is not a base model is a loaded adapter.
    let adapter = !s.config.models.contains(&model);
    let waiting = adapter.then(|| crate::lora::Active::waiting(&s, &model));
    let Some(slot) = Inflight::start(&s).await else {
        return error(StatusCode::SERVICE_UNAVAILABLE, "ServiceUnavailable", "shutting_down", "engine stopping".into());
    };
    let slot = slot.on_adapter(waiting);
    let lookup = lock(&s.cache).lookup_insert(&words);
    s.prefix_queries.fetch_add(lookup.queried_tokens, std::sync::atomic::Ordering::Relaxed);
    s.prefix_hits.fetch_add(lookup.hit_tokens, std::sync::atomic::Ordering::Relaxed);
    let adapter_ttft = if adapter { Duration::from_millis(s.config.lora.lora_ttft_ms) } else { Duration::ZERO };
    let ttft = adapter_ttft
        + match fault {
            Some(Fault::SlowFirstToken(ms)) => Duration::from_millis(ms),
            _ => Duration::from_millis(s.config.ttft_ms + s.config.prefill_ms_per_block * lookup.missed_blocks),
        };
    let seq = s.request_count() as u64;
    let answer = Answer {
        id: format!("chatcmpl-{:016x}", fnv(s.config.seed ^ seq, prompt.as_bytes())),
        model,
        kind,
        tokens: planned.turn.tokens,
        prompt_tokens: words.len() as u64,
        finish: if limit.is_some() { "length" } else { "stop" },
        created: SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or_default(),
    };
    let itl = Duration::from_millis(s.config.itl_ms);
    let sim_name = HeaderValue::from_str(&s.config.name).unwrap_or(HeaderValue::from_static("sim"));
    if !streamed {
        let body = generate::complete(&answer, slot, ttft, itl).await;
        return ([("x-sim-name", sim_name)], Json(body)).into_response();
    }
    let include_usage = v["stream_options"]["include_usage"].as_bool() == Some(true);
    let (fault, stall) = match planned.fault.map(crate::streams::StreamFault::plan) {
        Some((f, stall)) => (Some(f), stall.unwrap_or(STALL)),
        None => (fault, STALL),
    };
    let plan = StreamPlan { ttft, itl, fault, stall, include_usage };
    let body = generate::stream(answer, slot, plan);
    let mut r = Response::new(body);
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-sim-name", sim_name);
    r
}

async fn embeddings(s: Arc<SimState>, req: Request) -> Response {
    let kill = req.extensions().get::<ConnKill>().cloned();
    let (v, path, headers) = match read_json(&s, req).await {
        Ok(x) => x,
        Err(r) => return r,
    };
    let model = v["model"].as_str().unwrap_or_default().to_string();
    let inputs: Vec<String> = match &v["input"] {
        Value::String(x) => vec![x.clone()],
        Value::Array(a) => a.iter().map(|x| x.as_str().map(str::to_string).unwrap_or_else(|| x.to_string())).collect(),
        _ => Vec::new(),
    };
    s.record(&path, &model, inputs.first().cloned().unwrap_or_default(), headers);
    if let Some(r) = fault_response(s.fault_for(&model), kill, &model).await {
        return r;
    }
    let mut tokens = 0u64;
    let data: Vec<Value> = inputs
        .iter()
        .enumerate()
        .map(|(i, text)| {
            tokens += text.split_whitespace().count() as u64;
            let mut rng = crate::cache::Rng::new(fnv(s.config.seed, text.as_bytes()));
            let e: Vec<f64> = (0..8).map(|_| (rng.next_u64() % 2000) as f64 / 1000.0 - 1.0).collect();
            json!({"object": "embedding", "index": i, "embedding": e})
        })
        .collect();
    if s.config.ttft_ms > 0 {
        tokio::time::sleep(Duration::from_millis(s.config.ttft_ms)).await;
    }
    s.completed.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    Json(json!({"object": "list", "data": data, "model": model, "usage": {"prompt_tokens": tokens, "total_tokens": tokens}}))
        .into_response()
}

/// The base models, then the loaded adapters as vLLM lists them: `root` their path, `parent`
/// their base model.
async fn models(State(s): State<Arc<SimState>>) -> Json<Value> {
    s.count_probe();
    let card = |id: &str, root: &str, parent: Option<&str>, max_model_len: Option<u32>| {
        json!({"id": id, "object": "model", "created": 0, "owned_by": "vllm", "root": root, "parent": parent,
            "max_model_len": max_model_len})
    };
    let mut data: Vec<Value> = s
        .config
        .models
        .iter()
        .filter(|m| !s.model_down(m) && !s.config.unlisted.contains(m))
        .map(|m| card(m, m, None, Some(s.config.max_model_len)))
        .collect();
    data.extend(s.loaded_loras().iter().map(|l| card(&l.name, &l.path, Some(&l.base), None)));
    Json(json!({"object": "list", "data": data}))
}

async fn set_fault(State(s): State<Arc<SimState>>, Json(v): Json<Value>) -> Response {
    let count = v["count"].as_u64().map(|c| u32::try_from(c).unwrap_or(u32::MAX));
    match v["fault"].as_str().map(str::parse::<Fault>) {
        Some(Ok(f)) => {
            s.set_fault(Some(f), count);
            StatusCode::NO_CONTENT.into_response()
        }
        Some(Err(e)) => error(StatusCode::BAD_REQUEST, "BadRequestError", "bad_fault", e.to_string()),
        None => {
            s.set_fault(None, None);
            StatusCode::NO_CONTENT.into_response()
        }
    }
}

async fn clear_fault(State(s): State<Arc<SimState>>) -> StatusCode {
    s.set_fault(None, None);
    StatusCode::NO_CONTENT
}

async fn stats(State(s): State<Arc<SimState>>) -> Json<Value> {
    let paths: Vec<Value> = s.requests().iter().map(|r| json!({"path": r.path, "model": r.model})).collect();
    Json(json!({
        "requests": s.request_count(), "completed": s.completed(), "cancelled": s.cancelled(),
        "running": s.running(), "log": paths, "loras": s.lora_stats(),
    }))
}
