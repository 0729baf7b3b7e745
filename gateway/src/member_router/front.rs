//! The router's front door. A request carrying the routing header goes to `proxy`; one without
//! it may only ask for `/healthz`, `/readyz`, `/metrics` or `GET /v1/models` (the models of
//! routes with a ready endpoint, which the fleet gateway's health probe reads). Every refusal
//! leaves through `Refusal`, one mapping to an OpenAI-shaped body and status. The model list
//! also names the LoRA adapters those routes may load, each with its route's model as `parent`.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, Method, StatusCode, header};
use serde_json::json;

use super::MemberRouter;
use super::metrics::RequestResult;

/// Why a request for an adapter found no endpoint to serve it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AdapterFault {
    /// Every endpoint holds its maximum of adapters, all in use (503).
    Full,
    /// Its loads failed moments ago everywhere; not asked again yet (503).
    BackingOff,
    /// Loading it failed (502).
    LoadFailed,
    /// Loading it took too long (504).
    TimedOut,
}

/// Why a request is not proxied.
#[derive(Debug, thiserror::Error)]
pub enum Refusal {
    /// No routing header, on a path the router does not answer itself.
    #[error(
        "this is a Flotilla member router: send the `{header}` header naming the ModelDeployment (`<namespace>/<name>`); without it only GET /v1/models, /healthz, /readyz and /metrics are answered"
    )]
    NoHeader {
        /// The routing header.
        header: String,
    },
    /// Several different routing headers.
    #[error("the request carries several different `{header}` headers: send exactly one")]
    Ambiguous {
        /// The routing header.
        header: String,
    },
    /// No route serves the value.
    #[error(
        "no HTTPRoute parented to Gateway {gateway} serves `{header}: {value}`: check that ModelDeployment {value} exists and is placed on this cluster, and that its HTTPRoute is accepted (see the member router's log)"
    )]
    UnknownRoute {
        /// The routing header.
        header: String,
        /// Its value (cut short).
        value: String,
        /// The Gateway served.
        gateway: String,
    },
    /// The watches have not yet produced a first table.
    #[error(
        "this member router has not yet read the cluster's HTTPRoutes, Services and EndpointSlices (see its /readyz): retry shortly"
    )]
    NotSynced,
    /// The route has no ready endpoint.
    #[error(
        "ModelDeployment {value} has no ready endpoint here (HTTPRoute {source_route}): its pods are starting, failing their readiness probe or scaled to zero; retry later or on another cluster"
    )]
    NoEndpoint {
        /// The header value.
        value: String,
        /// The HTTPRoute.
        source_route: String,
    },
    /// The body is above the limit.
    #[error("the request body is larger than {0} bytes: send a smaller one (the member router's --max-body-bytes)")]
    TooLarge(usize),
    /// The body could not be read.
    #[error("the request body could not be read: {0}")]
    BadBody(String),
    /// A request for a LoRA adapter the route lists found no endpoint that has it or can load it.
    #[error("ModelDeployment {value}, adapter `{adapter}`: {reason}")]
    Adapter {
        /// The header value.
        value: String,
        /// The adapter (a name the route lists).
        adapter: String,
        /// Which way it failed.
        fault: AdapterFault,
        /// What happened.
        reason: String,
    },
    /// No endpoint could be reached, or the connection failed after the request was sent.
    #[error("ModelDeployment {value}: {reason}")]
    Unreachable {
        /// The header value.
        value: String,
        /// What happened.
        reason: String,
    },
}

impl Refusal {
    /// Status, OpenAI error `type`, `code`.
    pub fn kind(&self) -> (StatusCode, &'static str, &'static str) {
        match self {
            Refusal::NoHeader { .. } | Refusal::UnknownRoute { .. } => {
                (StatusCode::NOT_FOUND, "invalid_request_error", "route_not_found")
            }
            Refusal::Ambiguous { .. } => (StatusCode::BAD_REQUEST, "invalid_request_error", "ambiguous_route"),
            Refusal::NoEndpoint { .. } => {
                (StatusCode::SERVICE_UNAVAILABLE, "service_unavailable_error", "no_ready_endpoint")
            }
            Refusal::NotSynced => (StatusCode::SERVICE_UNAVAILABLE, "service_unavailable_error", "router_not_ready"),
            Refusal::TooLarge(_) => (StatusCode::PAYLOAD_TOO_LARGE, "invalid_request_error", "request_too_large"),
            Refusal::BadBody(_) => (StatusCode::BAD_REQUEST, "invalid_request_error", "invalid_request"),
            Refusal::Unreachable { .. } => (StatusCode::BAD_GATEWAY, "upstream_error", "upstream_unreachable"),
            Refusal::Adapter { fault, .. } => match fault {
                AdapterFault::Full => {
                    (StatusCode::SERVICE_UNAVAILABLE, "service_unavailable_error", "adapter_capacity")
                }
                AdapterFault::BackingOff => {
                    (StatusCode::SERVICE_UNAVAILABLE, "service_unavailable_error", "adapter_load_failed")
                }
                AdapterFault::LoadFailed => (StatusCode::BAD_GATEWAY, "upstream_error", "adapter_load_failed"),
                AdapterFault::TimedOut => (StatusCode::GATEWAY_TIMEOUT, "upstream_error", "adapter_load_timeout"),
            },
        }
    }

    /// The metric result, if the refusal is counted.
    pub fn result(&self) -> Option<RequestResult> {
        match self {
            Refusal::NoHeader { .. } | Refusal::UnknownRoute { .. } | Refusal::Ambiguous { .. } => {
                Some(RequestResult::no_route)
            }
            Refusal::NoEndpoint { .. } | Refusal::NotSynced => Some(RequestResult::no_endpoint),
            Refusal::TooLarge(_) => Some(RequestResult::too_large),
            Refusal::Unreachable { .. } => Some(RequestResult::unreachable),
            Refusal::Adapter { .. } => Some(RequestResult::adapter_unavailable),
            Refusal::BadBody(_) => None,
        }
    }

    /// The OpenAI-shaped body.
    pub fn body(&self) -> serde_json::Value {
        let (_, kind, code) = self.kind();
        json!({"error": {"message": self.to_string(), "type": kind, "param": null, "code": code}})
    }
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        let (status, _, _) = self.kind();
        let mut r = (status, Json(self.body())).into_response();
        match self {
            // The client may be mid-body: the connection will not be read further.
            Refusal::TooLarge(_) | Refusal::BadBody(_) => {
                r.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            Refusal::NoEndpoint { .. }
            | Refusal::NotSynced
            | Refusal::Adapter { fault: AdapterFault::Full | AdapterFault::BackingOff, .. } => {
                r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            _ => {}
        }
        r
    }
}

/// Count and answer a refusal.
pub fn refuse(st: &MemberRouter, r: Refusal) -> Response {
    if let Some(result) = r.result() {
        st.metrics.request(result);
    }
    r.into_response()
}

/// The router's HTTP application.
pub fn app(st: Arc<MemberRouter>) -> Router {
    Router::new().fallback(dispatch).with_state(st)
}

async fn dispatch(State(st): State<Arc<MemberRouter>>, req: Request) -> Response {
    let header = st.cfg.header.clone();
    let mut values = req.headers().get_all(&header).iter();
    let Some(first) = values.next() else { return local(&st, &req) };
    if values.any(|v| v != first) {
        return refuse(&st, Refusal::Ambiguous { header: header.to_string() });
    }
    let value = String::from_utf8_lossy(first.as_bytes()).trim().to_string();
    super::proxy::proxy(&st, &value, req).await
}

/// What the router answers itself (no routing header).
fn local(st: &MemberRouter, req: &Request) -> Response {
    match (req.method(), req.uri().path()) {
        (_, "/healthz") => (StatusCode::OK, "ok\n").into_response(),
        (_, "/readyz") => match st.sync.readiness() {
            Ok(m) => (StatusCode::OK, format!("{m}\n")).into_response(),
            Err(m) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {m}\n")).into_response(),
        },
        (_, "/metrics") => {
            let ct = "application/openmetrics-text; version=1.0.0; charset=utf-8";
            ([(header::CONTENT_TYPE, ct)], Body::from(st.metrics.render())).into_response()
        }
        (&Method::GET, "/v1/models") if !st.sync.has_table() => refuse(st, Refusal::NotSynced),
        (&Method::GET, "/v1/models") => {
            let live = st.live();
            let mut data: Vec<serde_json::Value> = live
                .table
                .ready_models()
                .into_iter()
                .map(|m| json!({"id": m, "object": "model", "created": 0, "owned_by": "flotilla"}))
                .collect();
            data.extend(live.table.ready_adapters().into_iter().map(|(a, parent)| {
                json!({"id": a, "object": "model", "created": 0, "owned_by": "flotilla", "parent": parent})
            }));
            Json(json!({"object": "list", "data": data})).into_response()
        }
        _ => refuse(st, Refusal::NoHeader { header: st.cfg.header.to_string() }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::member_router::{GatewayName, Route, RouterConfig, Table};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    fn router(table: Table) -> Arc<MemberRouter> {
        MemberRouter::with_table(RouterConfig::new(GatewayName::new("gw", "gw")), table)
    }

    async fn call(st: &Arc<MemberRouter>, req: http::Request<Body>) -> (StatusCode, String) {
        let r = app(st.clone()).oneshot(req).await.unwrap();
        let status = r.status();
        let body = r.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    }

    fn get(path: &str, route: Option<&str>) -> http::Request<Body> {
        let mut b = http::Request::get(path);
        if let Some(v) = route {
            b = b.header("x-flotilla-deployment", v);
        }
        b.body(Body::empty()).unwrap()
    }

    #[tokio::test]
    async fn local_paths_answer_only_without_the_header() {
        let st = router(Table::default().with("a/x", Route::new("mx", "a/x", &[])));
        assert_eq!(call(&st, get("/healthz", None)).await.0, StatusCode::OK);
        assert_eq!(call(&st, get("/readyz", None)).await.0, StatusCode::OK);
        let (s, text) = call(&st, get("/metrics", None)).await;
        assert_eq!(s, StatusCode::OK);
        assert!(text.contains("flotilla_member_router_routes 1"), "{text}");
        // With the header, /healthz is a request for the route (which has no endpoint).
        let (s, text) = call(&st, get("/healthz", Some("a/x"))).await;
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
        assert!(text.contains("no_ready_endpoint"), "{text}");
        assert_eq!(st.metrics.requests(RequestResult::no_endpoint), 1);
    }

    #[tokio::test]
    async fn without_the_header_other_paths_are_404_saying_what_to_send() {
        let st = router(Table::default());
        let (s, text) = call(&st, get("/v1/chat/completions", None)).await;
        assert_eq!(s, StatusCode::NOT_FOUND);
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(v["error"]["code"], "route_not_found");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(v["error"]["param"].is_null());
        assert!(v["error"]["message"].as_str().unwrap().contains("x-flotilla-deployment"));
        assert_eq!(st.metrics.requests(RequestResult::no_route), 1);
    }

    #[tokio::test]
    async fn two_different_routing_headers_are_refused() {
        let st = router(Table::default());
        let req = http::Request::get("/v1/models")
            .header("x-flotilla-deployment", "a/x")
            .header("x-flotilla-deployment", "b/y")
            .body(Body::empty())
            .unwrap();
        let (s, text) = call(&st, req).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{text}");
    }

    #[tokio::test]
    async fn a_watching_router_is_not_ready_until_built() {
        let st = MemberRouter::new(RouterConfig::new(GatewayName::new("gw", "gw")));
        assert_eq!(call(&st, get("/readyz", None)).await.0, StatusCode::SERVICE_UNAVAILABLE);
        // Before the first table, the model list and requests say so rather than "no such route".
        let (s, text) = call(&st, get("/v1/models", None)).await;
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
        assert!(text.contains("router_not_ready"), "{text}");
        assert_eq!(call(&st, get("/v1/models", Some("a/x"))).await.0, StatusCode::SERVICE_UNAVAILABLE);
        for w in super::super::Watched::ALL {
            st.sync.listed(w);
        }
        st.sync.failing(super::super::Watched::HttpRoutes, "the server could not find the requested resource".into());
        let (s, text) = call(&st, get("/readyz", None)).await;
        assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
        assert!(text.contains("HTTPRoutes"), "{text}");
        st.sync.recovered(super::super::Watched::HttpRoutes);
        st.sync.built();
        assert_eq!(call(&st, get("/readyz", None)).await.0, StatusCode::OK);
        assert_eq!(call(&st, get("/v1/models", None)).await.0, StatusCode::OK);
        assert_eq!(call(&st, get("/v1/models", Some("a/x"))).await.0, StatusCode::NOT_FOUND);
    }
}
