//! The member router's own calls to an engine, in vLLM's API: `POST /v1/load_lora_adapter`
//! (`{"lora_name","lora_path"}`; a 400 saying the adapter "has already been loaded" is a success,
//! one saying the engine is at its maximum is `Full`), `POST /v1/unload_lora_adapter`
//! (`{"lora_name"}`; a 404 means it is not loaded, which is what was wanted), and `GET /v1/models`
//! to learn which adapters an engine holds (cards with a `parent`). Answers are read up to 64 KiB
//! (the model list to 4 MiB); the caller bounds the time.

use bytes::Bytes;
use http::{HeaderValue, Method, StatusCode, header};
use http_body_util::{BodyExt, Full, Limited};
use serde_json::{Value, json};

use super::UpstreamClient;

/// Why an engine did not load (or unload) an adapter.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EngineError {
    /// The engine could not be reached, or the connection broke.
    #[error("the engine at {url} could not be reached: {why}")]
    Unreachable {
        /// The endpoint.
        url: String,
        /// What happened.
        why: String,
    },
    /// The engine holds as many adapters as it may (vLLM's `--max-loras`).
    #[error("the engine at {url} holds as many adapters as it may: {message}")]
    Full {
        /// The endpoint.
        url: String,
        /// The engine's message.
        message: String,
    },
    /// The engine answered with an error.
    #[error("the engine at {url} answered {status}: {message}")]
    Refused {
        /// The endpoint.
        url: String,
        /// Its status.
        status: u16,
        /// Its message.
        message: String,
    },
    /// The load (with the unloads before it) took longer than `--adapter-load-timeout-ms`.
    #[error("loading took longer than {ms} ms (the member router's --adapter-load-timeout-ms)")]
    TimedOut {
        /// The limit.
        ms: u64,
    },
}

/// The engine's error message: `error.message` of an OpenAI-shaped body, else the text.
fn message(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let v: Option<Value> = serde_json::from_slice(body).ok();
    let m = v.as_ref().and_then(|v| v["error"]["message"].as_str().or_else(|| v["message"].as_str()));
    let m = m.map_or_else(|| text.trim().to_string(), str::to_string);
    m.chars().take(300).collect()
}

async fn call(
    client: &UpstreamClient,
    url: &str,
    method: Method,
    path: &str,
    body: Option<Value>,
    auth: Option<&HeaderValue>,
    limit: usize,
) -> Result<(StatusCode, Bytes), EngineError> {
    let unreachable = |why: String| EngineError::Unreachable { url: url.to_string(), why };
    let uri: http::Uri = format!("{url}{path}").parse().map_err(|e| unreachable(format!("invalid URL: {e}")))?;
    let payload = body.map(|b| Bytes::from(b.to_string())).unwrap_or_default();
    let mut req = http::Request::new(Full::new(payload));
    *req.method_mut() = method;
    *req.uri_mut() = uri;
    req.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Some(a) = auth {
        req.headers_mut().insert(header::AUTHORIZATION, a.clone());
    }
    let resp = client.request(req).await.map_err(|e| unreachable(e.to_string()))?;
    let status = resp.status();
    let bytes = Limited::new(resp.into_body(), limit)
        .collect()
        .await
        .map_err(|e| unreachable(format!("reading the answer: {e}")))?
        .to_bytes();
    Ok((status, bytes))
}

/// Load adapter `name` from `path` on the engine at `url`.
pub async fn load(
    client: &UpstreamClient,
    url: &str,
    name: &str,
    path: &str,
    auth: Option<&HeaderValue>,
) -> Result<(), EngineError> {
    let body = json!({"lora_name": name, "lora_path": path});
    let (status, bytes) = call(client, url, Method::POST, "/v1/load_lora_adapter", Some(body), auth, 64 << 10).await?;
    if status.is_success() {
        return Ok(());
    }
    let message = message(&bytes);
    let lower = message.to_ascii_lowercase();
    if status == StatusCode::BAD_REQUEST && lower.contains("already been loaded") {
        return Ok(());
    }
    if status == StatusCode::BAD_REQUEST && lower.contains("maximum number") {
        return Err(EngineError::Full { url: url.to_string(), message });
    }
    Err(EngineError::Refused { url: url.to_string(), status: status.as_u16(), message })
}

/// Unload adapter `name` from the engine at `url` (not loaded there: done as well).
pub async fn unload(
    client: &UpstreamClient,
    url: &str,
    name: &str,
    auth: Option<&HeaderValue>,
) -> Result<(), EngineError> {
    let body = json!({"lora_name": name});
    let (status, bytes) =
        call(client, url, Method::POST, "/v1/unload_lora_adapter", Some(body), auth, 64 << 10).await?;
    if status.is_success() || status == StatusCode::NOT_FOUND {
        return Ok(());
    }
    Err(EngineError::Refused { url: url.to_string(), status: status.as_u16(), message: message(&bytes) })
}

/// The adapters the engine at `url` holds loaded: the cards of its `/v1/models` with a parent.
pub async fn loaded(
    client: &UpstreamClient,
    url: &str,
    auth: Option<&HeaderValue>,
) -> Result<Vec<String>, EngineError> {
    let (status, bytes) = call(client, url, Method::GET, "/v1/models", None, auth, 4 << 20).await?;
    if !status.is_success() {
        return Err(EngineError::Refused { url: url.to_string(), status: status.as_u16(), message: message(&bytes) });
    }
    let v: Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let cards = v["data"].as_array().map(Vec::as_slice).unwrap_or_default();
    Ok(cards
        .iter()
        .filter(|c| c["parent"].as_str().is_some_and(|p| !p.is_empty()))
        .filter_map(|c| c["id"].as_str().map(str::to_string))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_come_from_the_openai_shape_or_the_text() {
        assert_eq!(message(br#"{"error":{"message":"full","type":"x"}}"#), "full");
        assert_eq!(message(b"  plain text \n"), "plain text");
        assert_eq!(message(&[b'x'; 1000]).len(), 300);
    }
}
