//! The request path after validation: the model's fallback chain, and for each model the
//! attempt loop — choose an allowed, available cluster, send, classify, and on a failure
//! before the first byte retry elsewhere (or the same cluster for a one-off 500 or a short
//! `Retry-After`) with jittered exponential backoff, a bounded number of attempts and one
//! deadline. Success turns into the client's response: a complete body, or a relayed stream.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use tokio::sync::{OwnedSemaphorePermit, mpsc};

use crate::config::ms;
use crate::health::AttemptGuard;
use crate::keys::{ApiKey, usage_tokens};
use crate::metrics::{AttemptResult, Endpoint, StreamEnd};
use crate::pick::{self, Candidate};
use crate::table::{Model, Route, RoutingTable};
use crate::upstream::{self, Failure, Outgoing, Success};
use crate::{AppState, GatewayError};

/// Header naming the cluster that served.
pub const CLUSTER_HEADER: &str = "x-flotilla-cluster";
/// Header naming the model that served (differs from the request's on fallback).
pub const MODEL_HEADER: &str = "x-flotilla-model";

/// A validated client request.
#[derive(Debug)]
pub struct Prepared {
    /// Which API.
    pub endpoint: Endpoint,
    /// The JSON body (its `model` is rewritten when it is not the serving model's name).
    pub body: serde_json::Value,
    /// The body as the client sent it, forwarded as is when `model` needs no rewrite.
    pub raw: Bytes,
    /// `stream: true`.
    pub stream: bool,
    /// Prefix-affinity key.
    pub key: Option<u64>,
    /// The request id.
    pub request_id: String,
    /// Canonical name of the requested model.
    pub model: String,
    /// The client's API key, when keys are in use.
    pub api_key: Option<Arc<ApiKey>>,
}

enum ModelError {
    /// The upstream rejected the request itself; `context_length` says whether a fallback may help.
    Client { response: Response, context_length: bool },
    /// No cluster of this model served it; `attempted`: some cluster was tried.
    Failed { error: GatewayError, attempted: bool },
}

#[derive(Debug, Default)]
struct Tried {
    attempts: u32,
    excluded: bool,
    not_before: Option<Instant>,
}

/// Serve `p` through the model's clusters and then its fallbacks.
pub async fn serve(st: &Arc<AppState>, p: Prepared, permit: OwnedSemaphorePermit) -> Result<Response, GatewayError> {
    let table = st.table.load_full();
    let origin = table.resolve(&p.model).ok_or_else(|| GatewayError::UnknownModel(p.model.clone()))?;
    let deadline = Instant::now() + ms(st.cfg.deadline_ms);
    // Fallbacks the key may not use are skipped; the key's jurisdictions bind them all.
    let chain: Vec<&Model> = std::iter::once(origin)
        .chain(
            origin
                .fallbacks
                .iter()
                .filter_map(|f| table.resolve(f))
                .filter(|m| p.api_key.as_ref().is_none_or(|k| k.authorize(m).is_ok())),
        )
        .collect();
    let mut permit = Some(permit);
    let mut last = None;
    for (i, m) in chain.iter().enumerate() {
        match try_model(st, &table, origin, m, &p, deadline, &mut permit).await {
            Ok(mut r) => {
                if i > 0 {
                    st.metrics.fallback(&origin.name);
                }
                if let Ok(v) = HeaderValue::from_str(&m.name) {
                    r.headers_mut().insert(MODEL_HEADER, v);
                }
                return Ok(r);
            }
            Err(ModelError::Client { response, context_length }) => {
                if !(context_length && i + 1 < chain.len()) {
                    return Ok(response);
                }
                tracing::info!(request_id = %p.request_id, model = %m.name, "context length exceeded; trying the fallback");
            }
            Err(ModelError::Failed { error, attempted }) => {
                tracing::info!(request_id = %p.request_id, model = %m.name, error = %error, "model could not serve");
                // The original error wins over a fallback that could not even be tried.
                if last.is_none() || attempted {
                    last = Some(error);
                }
                if Instant::now() >= deadline {
                    break;
                }
            }
        }
    }
    Err(last.unwrap_or_else(|| GatewayError::NoHealthyCluster {
        model: origin.name.clone(),
        reason: "the deadline passed".into(),
        retry_after: st.cfg.unavailable_retry_after_s,
    }))
}

fn is_context_length(body: &[u8]) -> bool {
    let text = String::from_utf8_lossy(body).to_ascii_lowercase();
    text.contains("context_length_exceeded") || text.contains("maximum context length")
}

/// The upstream's own client-error body when it is OpenAI-shaped, else ours.
fn client_error(status: StatusCode, body: Bytes, cluster: &str) -> Response {
    let shaped = serde_json::from_slice::<serde_json::Value>(&body).ok().filter(|v| v["error"].is_object());
    let body = shaped.map(|_| body).unwrap_or_else(|| {
        let e = GatewayError::BadRequest(format!("the model rejected the request ({status})"));
        Bytes::from(e.body().to_string())
    });
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    if let Ok(v) = HeaderValue::from_str(cluster) {
        r.headers_mut().insert(CLUSTER_HEADER, v);
    }
    r
}

async fn try_model(
    st: &Arc<AppState>,
    table: &RoutingTable,
    origin: &Model,
    m: &Model,
    p: &Prepared,
    deadline: Instant,
    permit: &mut Option<OwnedSemaphorePermit>,
) -> Result<Response, ModelError> {
    let cfg = &st.cfg;
    let mut policies = vec![&origin.sovereignty, &m.sovereignty];
    if let Some(k) = &p.api_key {
        policies.push(&k.sovereignty);
    }
    let routes = table.allowed_routes(m, &policies);
    let unavailable = |reason: String| GatewayError::NoHealthyCluster {
        model: origin.name.clone(),
        reason,
        retry_after: cfg.unavailable_retry_after_s,
    };
    if routes.is_empty() {
        let error = unavailable(format!("no ready cluster of `{}` is within its policy", m.name));
        return Err(ModelError::Failed { error, attempted: false });
    }
    let bytes = if p.body["model"].as_str() == Some(m.name.as_str()) {
        p.raw.clone()
    } else {
        let mut body = p.body.clone();
        body["model"] = serde_json::Value::String(m.name.clone());
        Bytes::from(body.to_string())
    };
    let mut tried: HashMap<&str, Tried> = HashMap::new();
    let (mut attempts, mut last, mut rate_after) = (0u32, None::<Failure>, Duration::ZERO);
    let name = |i: usize| routes[i].cluster.name.as_str();
    while attempts < cfg.max_attempts && Instant::now() < deadline {
        let now = Instant::now();
        let eligible: Vec<usize> = (0..routes.len())
            .filter(|&i| !tried.get(name(i)).is_some_and(|t| t.excluded) && routes[i].health.available(now))
            .collect();
        let ready_at = |i: usize| routes[i].health.cooling_until().max(tried.get(name(i)).and_then(|t| t.not_before));
        let ready_now: Vec<usize> =
            eligible.iter().copied().filter(|&i| ready_at(i).is_none_or(|t| t <= now)).collect();
        if ready_now.is_empty() {
            let Some(until) = eligible.iter().filter_map(|&i| ready_at(i)).min() else { break };
            if until >= deadline || until - now > ms(cfg.max_retry_after_ms) {
                break;
            }
            tokio::time::sleep_until(until.into()).await;
            continue;
        }
        let cands: Vec<Candidate> = ready_now
            .iter()
            .map(|&i| {
                let c = routes[i].health.cluster();
                Candidate {
                    name: name(i).to_string(),
                    weight: routes[i].weight,
                    inflight: c.inflight(),
                    queue_depth: c.scraped_load(cfg.kv_cache_weight),
                    ewma_ms: c.ewma_ms(),
                    tried: tried.contains_key(name(i)),
                }
            })
            .collect();
        let rr = st.next_rr();
        let Some(j) = pick::choose(&cands, p.key, cfg.routing, rr, cfg.load_factor) else { break };
        let i = ready_now[j];
        if attempts > 0 {
            let pause = st.backoff(attempts).min(deadline.saturating_duration_since(Instant::now()));
            tokio::time::sleep(pause).await;
        }
        let route = routes[i];
        // A half-open circuit admits one request at a time; another one already took it.
        let Some(mut guard) = AttemptGuard::begin(&route.health, Instant::now()) else { continue };
        attempts += 1;
        let budget = ms(if p.stream { cfg.ttft_timeout_ms } else { cfg.request_timeout_ms });
        let out = Outgoing {
            base: &route.cluster.url,
            path: p.endpoint.path(),
            body: bytes.clone(),
            request_id: &p.request_id,
            stream: p.stream,
            deadline: deadline.min(Instant::now() + budget),
            max_body: 64 << 20,
            max_event: cfg.max_event_bytes,
        };
        let sent = Instant::now();
        let failure = match upstream::attempt(&st.client, out).await {
            Ok(success) => {
                guard.success();
                st.metrics.attempt(name(i), AttemptResult::ok);
                st.stats.record(&m.name, name(i), Some(sent.elapsed()), Instant::now());
                let charge = Charge { key: p.api_key.clone(), prompt_bytes: p.raw.len() };
                return Ok(respond(st, success, guard, route, permit.take(), charge));
            }
            Err(f) => f,
        };
        st.metrics.attempt(name(i), failure.result());
        tracing::info!(request_id = %p.request_id, cluster = name(i), attempt = attempts, failure = %failure.describe(), "attempt failed");
        let t = tried.entry(name(i)).or_default();
        t.attempts += 1;
        match &failure {
            Failure::Status { status, retry_after, .. } if *status == StatusCode::TOO_MANY_REQUESTS => {
                guard.neutral();
                let wait = retry_after.unwrap_or_else(|| st.backoff(attempts));
                if wait > ms(cfg.max_retry_after_ms) || t.attempts >= 2 {
                    t.excluded = true;
                } else {
                    t.not_before = Some(Instant::now() + wait);
                }
                if let Some(ra) = retry_after {
                    route.health.cool_down(Instant::now() + *ra);
                }
                rate_after = rate_after.max(retry_after.unwrap_or(Duration::from_secs(1)));
            }
            Failure::Status { status, body, .. } if matches!(status.as_u16(), 400 | 413 | 422) => {
                guard.neutral();
                let context_length = is_context_length(body);
                return Err(ModelError::Client {
                    response: client_error(*status, body.clone(), name(i)),
                    context_length,
                });
            }
            Failure::Status { status, .. } if status.is_client_error() => {
                guard.neutral();
                t.excluded = true;
            }
            // The engine answered, badly: the model's own breaker on this cluster counts it.
            Failure::Status { status, .. } if *status == StatusCode::INTERNAL_SERVER_ERROR => {
                guard.model_failure();
                st.stats.record(&m.name, name(i), None, Instant::now());
                t.excluded = t.attempts >= 2;
            }
            Failure::Status { .. } | Failure::Malformed(_) => {
                guard.model_failure();
                st.stats.record(&m.name, name(i), None, Instant::now());
                t.excluded = true;
            }
            // The cluster did not answer: its breaker counts it, for every model on it.
            Failure::Connect(_) | Failure::Reset(_) | Failure::Timeout(_) => {
                guard.transport_failure();
                st.stats.record(&m.name, name(i), None, Instant::now());
                t.excluded = true;
            }
        }
        last = Some(failure);
    }
    let now = Instant::now();
    let open = |i: usize| tried.get(name(i)).is_some_and(|t| t.excluded) || !routes[i].health.available(now);
    let exhausted = (0..routes.len()).all(open);
    // Every route still open to this request is cooling down after a 429: that is the answer,
    // with the longest Retry-After the clusters gave (capped), never a 503.
    let cooling: Option<Duration> = (0..routes.len())
        .filter(|&i| !open(i))
        .map(|i| routes[i].health.cooling_until().filter(|t| *t > now).map(|t| t - now))
        .try_fold(Duration::ZERO, |longest, left| left.map(|l| longest.max(l)));
    let rate_limited = |wait: Duration| GatewayError::RateLimited {
        model: origin.name.clone(),
        retry_after: (wait.as_secs_f64().ceil() as u64).clamp(1, cfg.retry_after_cap_s.max(1)),
    };
    let error = match last {
        Some(Failure::Status { status, .. }) if status == StatusCode::TOO_MANY_REQUESTS => {
            rate_limited(rate_after.max(cooling.unwrap_or_default()))
        }
        None => match cooling {
            Some(wait) if !wait.is_zero() => rate_limited(wait),
            _ => unavailable(format!("every allowed cluster of `{}` has an open circuit or is cooling down", m.name)),
        },
        Some(f) if exhausted => {
            unavailable(format!("every allowed cluster of `{}` failed; last: {}", m.name, f.describe()))
        }
        Some(f @ Failure::Timeout(_)) => {
            GatewayError::UpstreamTimeout { model: origin.name.clone(), reason: f.describe() }
        }
        Some(f) => GatewayError::Upstream { model: origin.name.clone(), reason: f.describe() },
    };
    Err(ModelError::Failed { error, attempted: attempts > 0 })
}

/// Who pays for an answer's tokens.
struct Charge {
    key: Option<Arc<ApiKey>>,
    prompt_bytes: usize,
}

impl Charge {
    fn pay(&self, st: &AppState, tokens: u64) {
        if let Some(k) = &self.key {
            st.limiter.charge(k, tokens, Instant::now());
        }
    }
}

fn respond(
    st: &Arc<AppState>,
    success: Success,
    guard: AttemptGuard,
    route: &Route,
    permit: Option<OwnedSemaphorePermit>,
    charge: Charge,
) -> Response {
    let cluster = HeaderValue::from_str(&route.cluster.name).unwrap_or(HeaderValue::from_static("unknown"));
    let mut r = match success {
        Success::Full { status, body } => {
            if charge.key.is_some() {
                let used = serde_json::from_slice::<serde_json::Value>(&body).ok().and_then(|v| usage_tokens(&v));
                // Without `usage`, about four bytes of prompt make a token.
                charge.pay(st, used.unwrap_or((charge.prompt_bytes / 4) as u64));
            }
            let mut r = Response::new(Body::from(body));
            *r.status_mut() = status;
            r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
            r
        }
        Success::Stream { events, parser, body } => {
            let (tx, mut rx) = mpsc::channel::<Bytes>(32);
            let (idle, metrics, name) = (ms(st.cfg.idle_timeout_ms), st.metrics.clone(), route.cluster.name.clone());
            let st = st.clone();
            tokio::spawn(async move {
                let (end, tokens) = crate::sse::relay(events, parser, body, tx, idle).await;
                // A stream's `usage` chunk (when asked for) is exact; otherwise each content
                // chunk counts as a token and four bytes of prompt as one.
                charge.pay(&st, tokens.total.unwrap_or(tokens.chunks + (charge.prompt_bytes / 4) as u64));
                metrics.stream(&name, end);
                match end {
                    // The connection broke or went silent: the cluster's transport.
                    StreamEnd::cut | StreamEnd::stalled => guard.route().cluster().record_failure(Instant::now()),
                    // The engine sent a broken answer: the model on this cluster.
                    StreamEnd::malformed | StreamEnd::truncated | StreamEnd::oversized => {
                        guard.route().record_model_failure(Instant::now())
                    }
                    _ => {}
                }
                if end.broken() {
                    tracing::warn!(cluster = %name, end = ?end, "stream broke after the first byte; ended with an error event");
                }
                drop(guard);
                drop(permit);
            });
            let stream =
                futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|o| o.map(Ok::<_, std::io::Error>)));
            let mut r = Response::new(Body::from_stream(stream));
            let h = r.headers_mut();
            h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
            h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
            h.insert("x-accel-buffering", HeaderValue::from_static("no"));
            r
        }
    };
    r.headers_mut().insert(CLUSTER_HEADER, cluster);
    r
}
