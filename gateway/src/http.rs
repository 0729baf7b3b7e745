//! The gateway's HTTP surface: `fn app(state) -> Router`. Client requests get a request id,
//! authentication, a body bounded in size and time, only then a concurrency slot, and a known
//! model here; then the proxy serves them. Also `/v1/models` (the routing table's models,
//! aliases and LoRA adapters with their `parent`), `/healthz`, `/readyz` (which names misconfigured clusters) and `/metrics`. Every error, a wrong method or an unknown
//! path included, leaves in the OpenAI error shape.

use std::borrow::Cow;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::extract::{Request, State};
use axum::http::{StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use crate::config::{RoutingMode, ms};
use crate::edge::{Edge, new_id};
use crate::keys::{ApiKey, Limit, Refusal};
use crate::limits::Refused;
use crate::metrics::{Endpoint, KeyRefusal, Outcome};
use crate::pick::prefix_key;
use crate::proxy::{self, Prepared};
use crate::table::Model;
use crate::{AppState, GatewayError};

pub use crate::edge::RequestId;

/// The gateway's router. The server runs it behind `edge::Front`, which sends a `POST` to an
/// inference API straight to [`infer`] through the same edge, as this router would.
pub fn app(st: Arc<AppState>) -> axum::Router {
    axum::Router::new()
        .route(
            "/v1/chat/completions",
            post(|s: State<Arc<AppState>>, r: Request| infer(s, Endpoint::chat_completions, r))
                .fallback(|r: Request| wrong_method(r, "POST")),
        )
        .route(
            "/v1/completions",
            post(|s: State<Arc<AppState>>, r: Request| infer(s, Endpoint::completions, r))
                .fallback(|r: Request| wrong_method(r, "POST")),
        )
        .route(
            "/v1/embeddings",
            post(|s: State<Arc<AppState>>, r: Request| infer(s, Endpoint::embeddings, r))
                .fallback(|r: Request| wrong_method(r, "POST")),
        )
        .route("/v1/models", get(models).fallback(|r: Request| wrong_method(r, "GET")))
        .route("/healthz", get(|| async { "ok" }).fallback(|r: Request| wrong_method(r, "GET")))
        .route("/readyz", get(readyz).fallback(|r: Request| wrong_method(r, "GET")))
        .route("/metrics", get(metrics).fallback(|r: Request| wrong_method(r, "GET")))
        .fallback(|uri: Uri| async move { GatewayError::NoRoute(uri.path().chars().take(200).collect()) })
        .layer(Edge { max_headers: st.cfg.max_headers })
        .with_state(st)
}

/// 405 in the OpenAI error shape, with `Allow`.
async fn wrong_method(req: Request, allow: &'static str) -> GatewayError {
    let path = req.uri().path().chars().take(200).collect();
    GatewayError::MethodNotAllowed { method: req.method().as_str().chars().take(20).collect(), path, allow }
}

fn outcome(status: StatusCode) -> Outcome {
    match status.as_u16() {
        200..=299 => Outcome::ok,
        429 => Outcome::rate_limited,
        503 => Outcome::unavailable,
        504 => Outcome::timeout,
        400..=499 => Outcome::client_error,
        _ => Outcome::upstream_error,
    }
}

pub(crate) async fn infer(State(st): State<Arc<AppState>>, endpoint: Endpoint, req: Request) -> Response {
    let started = Instant::now();
    let (label, result) = handle(&st, endpoint, req).await;
    let resp = result.unwrap_or_else(IntoResponse::into_response);
    let secs = started.elapsed().as_secs_f64();
    st.metrics.request(&label.name, label.meters.as_deref(), endpoint, outcome(resp.status()), secs);
    resp
}

/// The prompt text that prefix affinity hashes, cut short once it is `limit` bytes long (its
/// first `limit` bytes are the same as the whole text's).
fn prompt_text(endpoint: Endpoint, v: &Value, limit: usize) -> String {
    fn text(x: &Value) -> Cow<'_, str> {
        match x {
            Value::String(s) => Cow::Borrowed(s.as_str()),
            Value::Array(parts) => {
                Cow::Owned(parts.iter().filter_map(|p| p["text"].as_str().or(p.as_str())).collect::<Vec<_>>().join(" "))
            }
            _ => Cow::Borrowed(""),
        }
    }
    let mut out = String::new();
    match endpoint {
        Endpoint::chat_completions => {
            for (i, m) in v["messages"].as_array().into_iter().flatten().enumerate() {
                if out.len() >= limit {
                    break;
                }
                if i > 0 {
                    out.push('\n');
                }
                out.push_str(&text(&m["content"]));
            }
        }
        Endpoint::completions => out.push_str(&text(&v["prompt"])),
        Endpoint::embeddings => {}
    }
    out
}

/// The model a request is counted under: a name from the table (or `unknown`), and, for a model
/// of the table, its metrics' handles.
struct Label {
    name: String,
    meters: Option<Arc<crate::metrics::ModelMeters>>,
}

impl From<String> for Label {
    fn from(name: String) -> Self {
        Label { name, meters: None }
    }
}

async fn handle(st: &Arc<AppState>, endpoint: Endpoint, mut req: Request) -> (Label, Result<Response, GatewayError>) {
    let unknown = || Label::from("unknown".to_string());
    let key = match authenticate(st, req.headers()) {
        Ok(k) => k,
        Err(e) => return (unknown(), Err(e)),
    };
    let request_id = req.extensions_mut().remove::<RequestId>().map_or_else(new_id, |r| r.0);
    // The whole body arrives (bounded in size and time) before a concurrency slot is taken, so
    // a client that trickles its body holds only its own connection.
    let bytes = match read_body(st, req).await {
        Ok(b) => b,
        Err(e) => return (unknown(), Err(e)),
    };
    let Ok(permit) = st.limit.clone().try_acquire_owned() else {
        return (unknown(), Err(GatewayError::Overloaded(st.cfg.max_concurrency)));
    };
    let v: Value = match serde_json::from_slice(&bytes) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => return (unknown(), Err(GatewayError::BadRequest("the body must be a JSON object".into()))),
        Err(e) => return (unknown(), Err(GatewayError::BadRequest(format!("the body is not valid JSON: {e}")))),
    };
    let Some(name) = v["model"].as_str() else {
        return (
            unknown(),
            Err(GatewayError::BadRequest("`model` is required: name a model from GET /v1/models".into())),
        );
    };
    // Wrong JSON types are the client's to fix: refused before any engine sees them.
    if let Err(e) = crate::validate::check(endpoint, &v) {
        return (unknown(), Err(GatewayError::BadRequest(e)));
    }
    let table = st.table.load_full();
    let (model, meters) = match table.resolve(name) {
        Some(m) => {
            if let Some(k) = &key
                && let Err(e) = admit_key(st, k, m).await
            {
                return (m.name.clone().into(), Err(e));
            }
            (m.name.clone(), m.meters.get())
        }
        None => return (unknown(), Err(GatewayError::UnknownModel(name.chars().take(200).collect()))),
    };
    drop(table);
    // A model scaled to zero: held here, without a concurrency slot, until a replica is Ready
    // (or a 503).
    let permit = match crate::autoscale::activate::hold(st, &model, bytes.len(), permit).await {
        Ok(p) => p,
        Err(e) => return (Label { name: model, meters: Some(meters) }, Err(e)),
    };
    let stream = endpoint != Endpoint::embeddings && v["stream"].as_bool() == Some(true);
    let key_ref = key;
    let key = match st.cfg.routing {
        RoutingMode::Prefix => prefix_key(&prompt_text(endpoint, &v, st.cfg.prefix_bytes), st.cfg.prefix_bytes),
        _ => None,
    };
    let p = Prepared { endpoint, body: v, raw: bytes, stream, key, request_id, model: model.clone(), api_key: key_ref };
    (Label { name: model, meters: Some(meters) }, proxy::serve(st, p, permit).await)
}

/// Counts a request in `body_reads` while its body arrives.
struct Reading<'a>(&'a prometheus_client::metrics::gauge::Gauge);

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

/// The whole request body: at most `--max-body-bytes` (413, refused from `Content-Length`
/// before reading when it says so) within `--body-timeout-ms` of the head (408).
async fn read_body(st: &AppState, req: Request) -> Result<bytes::Bytes, GatewayError> {
    let limit = st.cfg.max_body_bytes;
    let announced = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if announced.is_some_and(|n| n > limit as u64) {
        return Err(GatewayError::TooLarge(limit));
    }
    let gauge = st.metrics.body_reads();
    gauge.inc();
    let _reading = Reading(gauge);
    let read = axum::body::to_bytes(req.into_body(), limit);
    match tokio::time::timeout(ms(st.cfg.body_timeout_ms), read).await {
        Err(_) => Err(GatewayError::BodyTimeout(st.cfg.body_timeout_ms)),
        Ok(Ok(b)) => Ok(b),
        Ok(Err(_)) => Err(GatewayError::TooLarge(limit)),
    }
}

/// The token of an `Authorization: Bearer <token>` header; the scheme is case-insensitive
/// (RFC 9110 §11.1).
fn bearer(value: &str) -> Option<&str> {
    let (scheme, token) = value.trim_start().split_once(' ')?;
    let token = token.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

/// The request's API key when keys are in use (`None` when they are not); 401 for a missing,
/// unknown or revoked one.
fn authenticate(st: &AppState, headers: &axum::http::HeaderMap) -> Result<Option<Arc<ApiKey>>, GatewayError> {
    if !st.cfg.auth_required() {
        return Ok(None);
    }
    let presented = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(bearer);
    match presented.and_then(|k| st.keys.load().authenticate(k)) {
        Some(k) => Ok(Some(k)),
        None => {
            st.metrics.refusal(KeyRefusal::unauthorized);
            Err(GatewayError::Unauthorized)
        }
    }
}

/// The key may use `m` (403 otherwise) and is within its limits (429 otherwise; 503 when the
/// shared limits store is unreachable and `--limits-store-unavailable closed` is set).
async fn admit_key(st: &AppState, k: &ApiKey, m: &Model) -> Result<(), GatewayError> {
    match k.authorize(m) {
        Ok(()) => {}
        Err(Refusal::Model) => {
            st.metrics.refusal(KeyRefusal::model);
            return Err(GatewayError::Forbidden {
                message: format!(
                    "API key `{}` may not use model `{}`: use a model the key lists, or ask for the model to be added to it",
                    k.id, m.name
                ),
                code: "model_not_allowed",
            });
        }
        Err(Refusal::Jurisdiction) => {
            st.metrics.refusal(KeyRefusal::jurisdiction);
            let theirs: Vec<&str> = m.sovereignty.allowed_jurisdictions.iter().map(|j| j.as_str()).collect();
            let mine: Vec<&str> = k.sovereignty.allowed_jurisdictions.iter().map(|j| j.as_str()).collect();
            return Err(GatewayError::Forbidden {
                message: format!(
                    "API key `{}` may only be served in {}, and model `{}` only in {}: use a key for those jurisdictions",
                    k.id,
                    mine.join(", "),
                    m.name,
                    theirs.join(", ")
                ),
                code: "jurisdiction_not_allowed",
            });
        }
    }
    let secs = |wait: std::time::Duration| wait.as_secs_f64().ceil().max(1.0) as u64;
    st.limiter.admit(k).await.map_err(|refused| match refused {
        Refused::Limit(limit, wait) => {
            let (what, n, refusal) = match limit {
                Limit::Requests => ("requests", k.requests_per_minute.map_or(0, u64::from), KeyRefusal::requests),
                Limit::Tokens => ("tokens", k.tokens_per_minute.unwrap_or(0), KeyRefusal::tokens),
            };
            st.metrics.refusal(refusal);
            GatewayError::KeyRateLimited { key: k.id.clone(), what, limit: n, retry_after: secs(wait) }
        }
        Refused::StoreUnavailable(wait) => {
            GatewayError::LimitsStoreUnavailable { key: k.id.clone(), retry_after: secs(wait) }
        }
    })
}

async fn models(State(st): State<Arc<AppState>>, headers: axum::http::HeaderMap) -> Response {
    let key = match authenticate(&st, &headers) {
        Ok(k) => k,
        Err(e) => return e.into_response(),
    };
    let table = st.table.load();
    let mut data = Vec::new();
    for m in table.models().filter(|m| key.as_ref().is_none_or(|k| k.authorize(m).is_ok())) {
        for id in std::iter::once(&m.name).chain(&m.aliases) {
            let mut entry = json!({"id": id, "object": "model", "created": 0, "owned_by": "flotilla", "root": m.name});
            // A LoRA adapter names its base model, as vLLM lists one.
            if let Some(parent) = &m.parent {
                entry["parent"] = json!(parent);
            }
            data.push(entry);
        }
    }
    Json(json!({"object": "list", "data": data})).into_response()
}

async fn readyz(State(st): State<Arc<AppState>>) -> Response {
    let table = st.table.load();
    let now = Instant::now();
    let serving =
        table.models().any(|m| table.allowed_routes(m, &[&m.sovereignty]).iter().any(|r| r.health.available(now)));
    let mut feed = st.feed.describe(now);
    // Misconfigured entry points are named with their reason and what to change.
    for c in table.clusters() {
        if let Some((reason, message)) = st.health.get(&c.name).fault() {
            let _ = write!(feed, "; cluster {} MISCONFIGURED ({reason:?}): {message}", c.name);
        }
    }
    if !st.feed.synced() {
        return (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {feed}")).into_response();
    }
    if serving {
        // A stale feed keeps the last good table serving: still ready, and said so.
        (StatusCode::OK, format!("ready; {feed}")).into_response()
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, format!("no model has an available cluster; {feed}")).into_response()
    }
}

async fn metrics(State(st): State<Arc<AppState>>) -> Response {
    let ct = "application/openmetrics-text; version=1.0.0; charset=utf-8";
    ([(header::CONTENT_TYPE, ct)], st.metrics.render()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        assert_eq!(bearer("Bearer k1"), Some("k1"));
        assert_eq!(bearer("bearer k2"), Some("k2"));
        assert_eq!(bearer("BEARER   k3 "), Some("k3"));
        assert_eq!(bearer("Basic k4"), None);
        assert_eq!(bearer("Bearer "), None);
        assert_eq!(bearer("Bearerk5"), None);
    }

    #[test]
    fn a_cut_short_prompt_has_the_whole_prompts_prefix_key() {
        let long = "word ".repeat(400);
        let v = json!({"messages": [
            {"role": "system", "content": long},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        ]});
        let whole = format!("{long}\na b");
        let cut = prompt_text(Endpoint::chat_completions, &v, 256);
        assert!(cut.len() < whole.len(), "the text is cut once it is long enough");
        assert_eq!(prefix_key(&cut, 256), prefix_key(&whole, 256));
        let short = json!({"messages": [{"content": "x"}, {"content": [{"text": "y"}, "z"]}]});
        assert_eq!(prompt_text(Endpoint::chat_completions, &short, 256), "x\ny z");
        assert_eq!(prompt_text(Endpoint::completions, &json!({"prompt": ["p", "q"]}), 256), "p q");
    }
}
