//! The adapters' HTTP surface: vLLM's `POST /v1/load_lora_adapter` and
//! `POST /v1/unload_lora_adapter`, their bodies checked field by field and every refusal answered
//! with vLLM's status, error type and message, and the simulator's `POST /sim/loras` knob.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Map, Value, json};

use crate::SimState;
use crate::api::error;
use crate::config::LoadFailure;

/// `POST /v1/load_lora_adapter`, `POST /v1/unload_lora_adapter` and `POST /sim/loras`
/// (`{"lora_name", "fail_load": "error" | "not-found" | null, "count"}`).
pub fn routes() -> axum::Router<Arc<SimState>> {
    axum::Router::new()
        .route("/v1/load_lora_adapter", post(load))
        .route("/v1/unload_lora_adapter", post(unload))
        .route("/sim/loras", post(configure))
}

/// Why a load or unload is answered with an error, and vLLM's answer to it.
#[derive(Debug)]
pub(super) enum Refusal {
    /// The body is not a JSON object of the right fields (vLLM's request validation).
    BadBody(String),
    /// vLLM's `InvalidUserInput`, e.g. an empty `lora_name`.
    Invalid(String),
    AlreadyLoaded(String),
    /// `--max-loras` reached: name, path, limit.
    Full(String, String, usize),
    NotLoaded(String),
    /// An injected `not-found` failure: name, path.
    NoAdapter(String, String),
    /// An injected `error` failure: path.
    LoadFailed(String),
}

impl Refusal {
    fn response(self) -> Response {
        let bad = StatusCode::BAD_REQUEST;
        match self {
            Refusal::BadBody(m) => error(bad, "Bad Request", "bad_body", m),
            Refusal::Invalid(m) => error(bad, "InvalidUserInput", "invalid_user_input", m),
            Refusal::AlreadyLoaded(name) => {
                let m = format!(
                    "The lora adapter '{name}' has already been loaded. If you want to load the adapter in place, set 'load_inplace' to True."
                );
                error(bad, "InvalidUserInput", "lora_already_loaded", m)
            }
            Refusal::Full(name, path, max) => {
                let m = format!(
                    "Cannot load LoRA adapter {name} at path {path}. Maximum number of loaded LoRA adapters is {max}. Please unload some LoRA adapters before loading new ones."
                );
                error(bad, "BadRequestError", "lora_limit", m)
            }
            Refusal::NotLoaded(name) => {
                let m = format!("The lora adapter '{name}' cannot be found.");
                error(StatusCode::NOT_FOUND, "NotFoundError", "lora_not_found", m)
            }
            Refusal::NoAdapter(name, path) => {
                let m = format!("Loading lora {name} failed: No adapter found for {path}");
                error(StatusCode::NOT_FOUND, "NotFoundError", "lora_not_found", m)
            }
            Refusal::LoadFailed(path) => {
                let m = format!("Loading lora {path} failed");
                error(StatusCode::INTERNAL_SERVER_ERROR, "InternalServerError", "lora_load_failed", m)
            }
        }
    }
}

/// A load request, checked: a name and a path, in place or not, and its base model.
#[derive(Clone, Debug)]
pub(super) struct LoadRequest {
    pub(super) name: String,
    pub(super) path: String,
    pub(super) inplace: bool,
    pub(super) base: String,
}

impl LoadRequest {
    pub(super) fn full(&self, max: usize) -> Refusal {
        Refusal::Full(self.name.clone(), self.path.clone(), max)
    }
}

/// vLLM without `--enable-lora` has no such route: FastAPI's 404.
fn disabled(s: &SimState) -> Option<Response> {
    (s.config.lora.max_loras == 0)
        .then(|| (StatusCode::NOT_FOUND, Json(json!({"detail": "Not Found"}))).into_response())
}

/// The 200 vLLM answers with: the message as a body with no content type.
fn success(message: String) -> Response {
    Response::new(Body::from(message))
}

async fn body_of(req: Request) -> Result<Map<String, Value>, Refusal> {
    let content_type = req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or_default();
    let media = content_type.split(';').next().unwrap_or_default().trim().to_ascii_lowercase();
    if media != "application/json" {
        return Err(Refusal::BadBody("Unsupported Media Type: Only 'application/json' is allowed".into()));
    }
    let bytes = axum::body::to_bytes(req.into_body(), 1 << 20)
        .await
        .map_err(|e| Refusal::BadBody(format!("the body could not be read: {e}")))?;
    match serde_json::from_slice(&bytes) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(Refusal::BadBody("the body must be a JSON object".into())),
        Err(e) => Err(Refusal::BadBody(format!("the body is not valid JSON: {e}"))),
    }
}

/// A string field of the body (`required`: absent or null is an error naming it).
fn string_field(m: &Map<String, Value>, field: &str, required: bool) -> Result<Option<String>, Refusal> {
    match m.get(field) {
        None | Some(Value::Null) if required => Err(Refusal::BadBody(format!("`{field}`: Field required"))),
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(Refusal::BadBody(format!("`{field}`: Input should be a valid string, got {other}"))),
    }
}

/// The load request in `m`: `lora_name` and `lora_path` (non-empty), `load_inplace`, and
/// `base_model_name` (a simulator extension, like vLLM's `--lora-modules` JSON form; absent:
/// the first `--model`).
fn load_request(s: &SimState, m: &Map<String, Value>) -> Result<LoadRequest, Refusal> {
    let name = string_field(m, "lora_name", true)?.unwrap_or_default();
    let path = string_field(m, "lora_path", true)?.unwrap_or_default();
    let inplace = match m.get("load_inplace") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(other) => {
            return Err(Refusal::BadBody(format!("`load_inplace`: Input should be a valid boolean, got {other}")));
        }
    };
    if name.is_empty() || path.is_empty() {
        return Err(Refusal::Invalid("Both 'lora_name' and 'lora_path' must be provided.".into()));
    }
    if s.config.models.contains(&name) {
        return Err(Refusal::Invalid(format!("`lora_name`: `{name}` is a base model served by this engine")));
    }
    let base = match string_field(m, "base_model_name", false)? {
        Some(b) if s.config.models.contains(&b) => b,
        Some(b) => {
            let served = s.config.models.join(", ");
            return Err(Refusal::Invalid(format!("`base_model_name`: `{b}` is not served here (served: {served})")));
        }
        None => s.config.models.first().cloned().unwrap_or_default(),
    };
    Ok(LoadRequest { name, path, inplace, base })
}

/// Takes a slot, waits `--lora-load-ms`, then loads (or fails). The wait runs in a task of its
/// own, so a client that goes away does not leave a slot taken.
async fn load_adapter(s: &Arc<SimState>, req: LoadRequest) -> Result<String, Refusal> {
    let max = s.config.lora.max_loras;
    s.loras.begin(&req, max)?;
    let delay = Duration::from_millis(s.config.lora.lora_load_ms);
    let path = req.path.clone();
    let state = s.clone();
    let task = tokio::spawn(async move {
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        state.loras.finish(&req, max)
    });
    task.await.unwrap_or(Err(Refusal::LoadFailed(path)))
}

async fn load(State(s): State<Arc<SimState>>, req: Request) -> Response {
    if let Some(r) = disabled(&s) {
        return r;
    }
    let loaded = match body_of(req).await.and_then(|m| load_request(&s, &m)) {
        Ok(req) => load_adapter(&s, req).await,
        Err(r) => Err(r),
    };
    loaded.map_or_else(Refusal::response, success)
}

async fn unload(State(s): State<Arc<SimState>>, req: Request) -> Response {
    if let Some(r) = disabled(&s) {
        return r;
    }
    let unloaded = body_of(req).await.and_then(|m| {
        let name = string_field(&m, "lora_name", true)?.unwrap_or_default();
        if name.is_empty() {
            return Err(Refusal::Invalid("'lora_name' needs to be provided to unload a LoRA adapter.".into()));
        }
        s.loras.unload(&name)
    });
    unloaded.map_or_else(Refusal::response, success)
}

/// `POST /sim/loras {"lora_name": "a", "fail_load": "error", "count": 1}`: the next `count`
/// loads of `a` fail (absent `count`: every one); `fail_load` null clears it.
async fn configure(State(s): State<Arc<SimState>>, Json(v): Json<Value>) -> Response {
    let Some(name) = v["lora_name"].as_str() else {
        return (StatusCode::BAD_REQUEST, "`lora_name` is required").into_response();
    };
    let count = v["count"].as_u64().map(|c| u32::try_from(c).unwrap_or(u32::MAX));
    match v.get("fail_load") {
        None => {}
        Some(Value::Null) => s.set_lora_load_failure(name, None, None),
        Some(Value::String(kind)) => match kind.parse::<LoadFailure>() {
            Ok(f) => s.set_lora_load_failure(name, Some(f), count),
            Err(e) => return (StatusCode::BAD_REQUEST, format!("`fail_load`: {e}")).into_response(),
        },
        Some(other) => {
            let m = format!("`fail_load`: expected \"error\", \"not-found\" or null, got {other}");
            return (StatusCode::BAD_REQUEST, m).into_response();
        }
    }
    StatusCode::NO_CONTENT.into_response()
}
