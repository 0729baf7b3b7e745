//! The gateway's one error type and its one mapping to HTTP: every failure a client can hit
//! leaves here as an OpenAI-shaped body (`{"error":{"message","type","param","code"}}`) with
//! the status code CONVENTIONS.md assigns to it.

use axum::Json;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

/// Everything that can go wrong in the gateway.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    /// The routing table file is unreadable or invalid; the previous table stays in force.
    #[error("routing table {path}: {message}")]
    Table {
        /// The file.
        path: String,
        /// What is wrong and what to change.
        message: String,
    },
    /// The API keys file or Secret is unreadable or does not parse; the keys in force stay.
    #[error("API keys {origin}: {message}")]
    Keys {
        /// The file or Secret.
        origin: String,
        /// What is wrong and what to change.
        message: String,
    },
    /// The command line or environment asks for something the gateway will not do.
    #[error("configuration: {0}")]
    Config(String),
    /// The control cluster could not be reached or read.
    #[error("control cluster: {0}")]
    Control(String),
    /// The request is not valid JSON or misses a field.
    #[error("{0}")]
    BadRequest(String),
    /// The request body is above the limit.
    #[error("request body is larger than {0} bytes: send a shorter prompt or raise --max-body-bytes")]
    TooLarge(usize),
    /// The request body did not arrive within the body timeout.
    #[error(
        "the request body did not arrive within {0} ms: send the whole body promptly (the gateway's --body-timeout-ms)"
    )]
    BodyTimeout(u64),
    /// The path exists, but not for this method.
    #[error("{method} is not allowed on {path}: use {allow}")]
    MethodNotAllowed {
        /// The method used.
        method: String,
        /// The path (cut short).
        path: String,
        /// The methods the path takes.
        allow: &'static str,
    },
    /// The request has more header fields than the limit.
    #[error(
        "the request has {count} header fields, more than the gateway accepts ({limit}): send fewer headers or raise --max-headers"
    )]
    TooManyHeaders {
        /// Header fields received.
        count: usize,
        /// The limit.
        limit: usize,
    },
    /// No or a wrong API key.
    #[error(
        "missing, unknown or revoked API key: send `Authorization: Bearer <key>` with a key issued for this gateway"
    )]
    Unauthorized,
    /// The key may not use the model, or not where the model may be served.
    #[error("{message}")]
    Forbidden {
        /// What is refused and what to ask for.
        message: String,
        /// `model_not_allowed` or `jurisdiction_not_allowed`.
        code: &'static str,
    },
    /// The key is over one of its per-minute limits.
    #[error("API key `{key}` is over its {what} per minute limit ({limit}): retry after {retry_after} s")]
    KeyRateLimited {
        /// The key's id (never the key).
        key: String,
        /// `requests` or `tokens`.
        what: &'static str,
        /// The limit.
        limit: u64,
        /// Seconds to wait.
        retry_after: u64,
    },
    /// The key has limits, the shared store that counts them cannot be asked, and the gateway
    /// is set to refuse then (`--limits-store-unavailable closed`).
    #[error(
        "API key `{key}` has limits, and the shared limits store that counts them cannot be reached: this gateway refuses limited keys until it answers again (--limits-store-unavailable closed); retry after {retry_after} s"
    )]
    LimitsStoreUnavailable {
        /// The key's id (never the key).
        key: String,
        /// Seconds to wait.
        retry_after: u64,
    },
    /// The model is not in the routing table.
    #[error("model `{0}` is not served by this fleet: GET /v1/models lists the models and aliases")]
    UnknownModel(String),
    /// No route for the path.
    #[error("no such endpoint: {0}")]
    NoRoute(String),
    /// Every allowed cluster is rate limiting.
    #[error("every cluster allowed to serve `{model}` is rate limiting: retry after {retry_after} s")]
    RateLimited {
        /// Requested model.
        model: String,
        /// Seconds to wait.
        retry_after: u64,
    },
    /// No cluster that the model's policy allows can take the request.
    #[error("no cluster allowed to serve `{model}` can take the request now ({reason}): retry after {retry_after} s")]
    NoHealthyCluster {
        /// Requested model.
        model: String,
        /// Why.
        reason: String,
        /// Seconds to wait.
        retry_after: u64,
    },
    /// The model is scaled to zero and its held request could not wait longer (or the hold
    /// queue is full).
    #[error(
        "model `{model}` is starting from zero replicas and cannot take this request now: {why}; retry after {retry_after} s"
    )]
    Activating {
        /// Requested model.
        model: String,
        /// Why the request was not held further.
        why: String,
        /// Seconds to wait.
        retry_after: u64,
    },
    /// The model is scaled to zero and a cap on held requests (or their bytes) is reached:
    /// refused at once, for this model only.
    #[error(
        "model `{model}` is starting from zero replicas and no more requests for it can be held now: {why}; retry after {retry_after} s"
    )]
    ActivationQueueFull {
        /// Requested model.
        model: String,
        /// Which cap, and its flag.
        why: String,
        /// Seconds to wait.
        retry_after: u64,
    },
    /// The gateway is at its concurrency limit.
    #[error("the gateway is at its concurrency limit ({0} requests): retry shortly")]
    Overloaded(usize),
    /// Upstream clusters failed and the attempt budget ran out.
    #[error("upstream failure serving `{model}`: {reason}")]
    Upstream {
        /// Requested model.
        model: String,
        /// The last failure.
        reason: String,
    },
    /// Every allowed cluster's entry point is misconfigured (wrong URL, refused credential):
    /// an operator must fix the configuration; retrying does not help.
    #[error(
        "model `{model}` cannot be served: the entry point of every cluster allowed to serve it is misconfigured ({detail}); the gateway's operator must fix it (see the gateway's /readyz and log)"
    )]
    UpstreamMisconfigured {
        /// Requested model.
        model: String,
        /// Cluster names and reasons (`a: UpstreamNotFound`).
        detail: String,
    },
    /// Upstream clusters timed out and the attempt budget ran out.
    #[error("upstream timeout serving `{model}`: {reason}")]
    UpstreamTimeout {
        /// Requested model.
        model: String,
        /// The last failure.
        reason: String,
    },
    /// Listening or accepting failed.
    #[error("network: {0}")]
    Io(#[from] std::io::Error),
}

impl GatewayError {
    /// The HTTP status this error is answered with.
    pub fn status(&self) -> StatusCode {
        match self {
            GatewayError::BadRequest(_) => StatusCode::BAD_REQUEST,
            GatewayError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            GatewayError::BodyTimeout(_) => StatusCode::REQUEST_TIMEOUT,
            GatewayError::MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            GatewayError::TooManyHeaders { .. } => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            GatewayError::Unauthorized => StatusCode::UNAUTHORIZED,
            GatewayError::Forbidden { .. } => StatusCode::FORBIDDEN,
            GatewayError::KeyRateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            GatewayError::UnknownModel(_) | GatewayError::NoRoute(_) => StatusCode::NOT_FOUND,
            GatewayError::RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            GatewayError::NoHealthyCluster { .. }
            | GatewayError::Activating { .. }
            | GatewayError::ActivationQueueFull { .. }
            | GatewayError::Overloaded(_)
            | GatewayError::LimitsStoreUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            GatewayError::Upstream { .. } | GatewayError::UpstreamMisconfigured { .. } => StatusCode::BAD_GATEWAY,
            GatewayError::UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            GatewayError::Table { .. }
            | GatewayError::Keys { .. }
            | GatewayError::Config(_)
            | GatewayError::Control(_)
            | GatewayError::Io(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// `(type, code)` of the OpenAI error body.
    pub fn kind(&self) -> (&'static str, &'static str) {
        match self {
            GatewayError::BadRequest(_) => ("invalid_request_error", "invalid_request"),
            GatewayError::TooLarge(_) => ("invalid_request_error", "request_too_large"),
            GatewayError::BodyTimeout(_) => ("invalid_request_error", "request_timeout"),
            GatewayError::MethodNotAllowed { .. } => ("invalid_request_error", "method_not_allowed"),
            GatewayError::TooManyHeaders { .. } => ("invalid_request_error", "too_many_headers"),
            GatewayError::Unauthorized => ("authentication_error", "invalid_api_key"),
            GatewayError::Forbidden { code, .. } => ("permission_error", code),
            GatewayError::KeyRateLimited { what, .. } => (what, "rate_limit_exceeded"),
            GatewayError::UnknownModel(_) => ("invalid_request_error", "model_not_found"),
            GatewayError::NoRoute(_) => ("invalid_request_error", "unknown_url"),
            GatewayError::RateLimited { .. } => ("rate_limit_error", "rate_limit_exceeded"),
            GatewayError::NoHealthyCluster { .. } => ("service_unavailable_error", "no_healthy_cluster"),
            GatewayError::Activating { .. } => ("service_unavailable_error", "model_activating"),
            GatewayError::ActivationQueueFull { .. } => ("service_unavailable_error", "activation_queue_full"),
            GatewayError::Overloaded(_) => ("service_unavailable_error", "gateway_overloaded"),
            GatewayError::LimitsStoreUnavailable { .. } => ("service_unavailable_error", "limits_store_unavailable"),
            GatewayError::Upstream { .. } => ("upstream_error", "upstream_failed"),
            GatewayError::UpstreamMisconfigured { .. } => ("upstream_error", "upstream_misconfigured"),
            GatewayError::UpstreamTimeout { .. } => ("upstream_error", "upstream_timeout"),
            GatewayError::Table { .. }
            | GatewayError::Keys { .. }
            | GatewayError::Config(_)
            | GatewayError::Control(_)
            | GatewayError::Io(_) => ("server_error", "internal_error"),
        }
    }

    fn retry_after(&self) -> Option<u64> {
        match self {
            GatewayError::RateLimited { retry_after, .. }
            | GatewayError::NoHealthyCluster { retry_after, .. }
            | GatewayError::Activating { retry_after, .. }
            | GatewayError::ActivationQueueFull { retry_after, .. }
            | GatewayError::KeyRateLimited { retry_after, .. }
            | GatewayError::LimitsStoreUnavailable { retry_after, .. } => Some(*retry_after),
            GatewayError::Overloaded(_) => Some(1),
            _ => None,
        }
    }

    /// The OpenAI-shaped body.
    pub fn body(&self) -> serde_json::Value {
        let (kind, code) = self.kind();
        let param = matches!(self, GatewayError::UnknownModel(_) | GatewayError::Forbidden { .. }).then_some("model");
        json!({"error": {"message": self.to_string(), "type": kind, "param": param, "code": code}})
    }
}

impl IntoResponse for GatewayError {
    fn into_response(self) -> Response {
        let mut r = (self.status(), Json(self.body())).into_response();
        if let Some(secs) = self.retry_after() {
            r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        match self {
            GatewayError::MethodNotAllowed { allow, .. } => {
                r.headers_mut().insert(header::ALLOW, HeaderValue::from_static(allow));
            }
            // The client may be mid-body: tell it the connection will not be read further.
            GatewayError::BodyTimeout(_) | GatewayError::TooLarge(_) => {
                r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            _ => {}
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_conventional_statuses_and_openai_bodies() {
        let e = GatewayError::NoHealthyCluster { model: "m".into(), reason: "all down".into(), retry_after: 2 };
        assert_eq!(e.status(), StatusCode::SERVICE_UNAVAILABLE);
        let r = e.into_response();
        assert_eq!(r.headers()[header::RETRY_AFTER], "2");
        assert_eq!(GatewayError::UnknownModel("x".into()).status(), StatusCode::NOT_FOUND);
        assert_eq!(GatewayError::UnknownModel("x".into()).body()["error"]["param"], "model");
        assert_eq!(GatewayError::Unauthorized.status(), StatusCode::UNAUTHORIZED);
        let headers = GatewayError::TooManyHeaders { count: 101, limit: 100 };
        assert_eq!(headers.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
        assert_eq!(headers.body()["error"]["code"], "too_many_headers");
        let up = GatewayError::Upstream { model: "m".into(), reason: "reset".into() };
        assert_eq!(up.status(), StatusCode::BAD_GATEWAY);
        assert_eq!(up.body()["error"]["code"], "upstream_failed");
        let mis = GatewayError::UpstreamMisconfigured { model: "m".into(), detail: "a: UpstreamNotFound".into() };
        assert_eq!(mis.status(), StatusCode::BAD_GATEWAY);
        assert_eq!(mis.body()["error"]["code"], "upstream_misconfigured");
        assert!(mis.into_response().headers().get(header::RETRY_AFTER).is_none(), "retrying does not help");
        let slow = GatewayError::BodyTimeout(10).into_response();
        assert_eq!(slow.status(), StatusCode::REQUEST_TIMEOUT);
        let wrong = GatewayError::MethodNotAllowed { method: "GET".into(), path: "/v1/x".into(), allow: "POST" };
        assert_eq!(wrong.body()["error"]["code"], "method_not_allowed");
        assert_eq!(wrong.into_response().headers()[header::ALLOW], "POST");
        let full = GatewayError::ActivationQueueFull { model: "m".into(), why: "x".into(), retry_after: 30 };
        assert_eq!(
            (full.status(), full.body()["error"]["code"].as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, Some("activation_queue_full"))
        );
        assert_eq!(full.into_response().headers()[header::RETRY_AFTER], "30");
        let store = GatewayError::LimitsStoreUnavailable { key: "team".into(), retry_after: 1 };
        assert_eq!(
            (store.status(), store.body()["error"]["code"].as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, Some("limits_store_unavailable"))
        );
        assert_eq!(store.into_response().headers()[header::RETRY_AFTER], "1");
    }
}
