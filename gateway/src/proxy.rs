//! The request path after validation: the model's fallback chain, and for each model the
//! attempt loop — choose an allowed, available cluster, send, classify, and on a failure
//! before the first byte retry elsewhere (or the same cluster for a one-off 500 or a short
//! `Retry-After`) with jittered exponential backoff, a bounded number of attempts and one
//! deadline. Success turns into the client's response: a complete body, or a stream relayed
//! (and, should it break, continued elsewhere) by `continuation`, which runs the same chain and
//! attempt loop for a [`Job::Resume`].

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use tokio::sync::OwnedSemaphorePermit;

use crate::config::Continuation;
use crate::config::ms;
use crate::continuation;
use crate::health::AttemptGuard;
use crate::keys::{ApiKey, usage_tokens};
use crate::member::{self, ConfigReason};
use crate::metrics::{AttemptResult, Endpoint};
use crate::pick::{self, Candidate};
use crate::splice::Splice;
use crate::split;
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

/// What an attempt loop is for.
#[derive(Debug)]
pub(crate) enum Job<'a> {
    /// The client's request.
    Fresh,
    /// Continuing a broken stream: `skip` holds the (model, cluster) pairs that broke it.
    Resume {
        /// What the client was sent.
        splice: &'a Splice,
        /// Routes not to use again.
        skip: &'a [(String, String)],
    },
}

/// An attempt that got a usable answer.
pub(crate) struct Won<'t> {
    pub(crate) success: Success,
    pub(crate) guard: AttemptGuard,
    pub(crate) route: &'t Route,
    /// A continuation sent as a prefill (else a regeneration).
    pub(crate) prefill: bool,
}

/// Why a chain of models did not serve.
pub(crate) enum Ended {
    /// The upstream rejected the request itself (its own response).
    Client(Response),
    /// No cluster served.
    Failed(GatewayError),
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
    let (won, i) = match run_chain(st, &table, origin, &chain, &p, &Job::Fresh, deadline).await {
        Ok(w) => w,
        Err(Ended::Client(r)) => return Ok(r),
        Err(Ended::Failed(e)) => return Err(e),
    };
    if i > 0 {
        st.metrics.fallback(&origin.name);
    }
    let m = chain[i];
    let charge = Charge { key: p.api_key.clone(), prompt_bytes: p.raw.len() };
    let cluster = HeaderValue::from_str(&won.route.cluster.name).unwrap_or(HeaderValue::from_static("unknown"));
    let mut r = match won.success {
        Success::Full { status, body } => full(st, status, body, &charge).await,
        Success::Stream { events, parser, body } => {
            let stream = continuation::Stream {
                st: st.clone(),
                table: table.clone(),
                origin: origin.name.clone(),
                chain: chain[i..].iter().map(|m| m.name.clone()).collect(),
                record: continuation::records(&st.cfg, &p, won.route),
                p: Arc::new(p),
                charge,
                permit,
            };
            let up = continuation::Upstream {
                events,
                parser,
                body,
                guard: won.guard,
                route: won.route.clone(),
                model: m.name.clone(),
            };
            continuation::respond(stream, up)
        }
    };
    r.headers_mut().insert(CLUSTER_HEADER, cluster);
    if let Ok(v) = HeaderValue::from_str(&m.name) {
        r.headers_mut().insert(MODEL_HEADER, v);
    }
    Ok(r)
}

/// Try `chain` in order (a model's fallbacks after it): the winning attempt and the index of
/// the model that won.
pub(crate) async fn run_chain<'t>(
    st: &Arc<AppState>,
    table: &'t RoutingTable,
    origin: &Model,
    chain: &[&'t Model],
    p: &Prepared,
    job: &Job<'_>,
    deadline: Instant,
) -> Result<(Won<'t>, usize), Ended> {
    let mut last = None;
    for (i, m) in chain.iter().enumerate() {
        match try_model(st, table, origin, m, p, job, deadline).await {
            Ok(won) => return Ok((won, i)),
            Err(ModelError::Client { response, context_length }) => {
                if !(context_length && i + 1 < chain.len()) {
                    return Err(Ended::Client(response));
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
    Err(Ended::Failed(last.unwrap_or_else(|| GatewayError::NoHealthyCluster {
        model: origin.name.clone(),
        reason: "the deadline passed".into(),
        retry_after: st.cfg.unavailable_retry_after_s,
    })))
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

async fn try_model<'t>(
    st: &Arc<AppState>,
    table: &'t RoutingTable,
    origin: &Model,
    m: &'t Model,
    p: &Prepared,
    job: &Job<'_>,
    deadline: Instant,
) -> Result<Won<'t>, ModelError> {
    let cfg = &st.cfg;
    let mut policies = vec![&origin.sovereignty, &m.sovereignty];
    if let Some(k) = &p.api_key {
        policies.push(&k.sovereignty);
    }
    let mut routes = table.allowed_routes(m, &policies);
    if let Job::Resume { skip, .. } = job {
        // A continuation goes only where it can, and never back to a route that broke it.
        routes.retain(|r| {
            continuation::capability(cfg, r) != Continuation::None
                && !skip.iter().any(|(sm, sc)| *sm == m.name && *sc == r.cluster.name)
        });
    }
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
    // A model split between deployments: each attempt goes to the routes of one (`split`).
    let split_key = (!m.deployments.is_empty()).then(|| split::key(cfg.routing, p.key, st.next_rr()));
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
        let ready_now = match split_key {
            Some(k) => split::narrow(m, &routes, ready_now, |i| tried.contains_key(name(i)), k),
            None => ready_now,
        };
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
        let (body, prefill, collect) = match job {
            Job::Fresh if continuation::records(cfg, p, route) => (continuation::asking_usage(&bytes), false, true),
            Job::Fresh => (bytes.clone(), false, false),
            Job::Resume { splice, .. } => match continuation::request(cfg, p, m, route, splice, &bytes) {
                Some((body, prefill)) => (body, prefill, true),
                None => {
                    tried.entry(name(i)).or_default().excluded = true;
                    continue;
                }
            },
        };
        // A half-open circuit admits one request at a time; another one already took it.
        let Some(mut guard) = AttemptGuard::begin(&route.health, Instant::now()) else { continue };
        attempts += 1;
        let budget = ms(if p.stream { cfg.ttft_timeout_ms } else { cfg.request_timeout_ms });
        let out = Outgoing {
            base: &route.cluster.url,
            auth: route.cluster.auth.as_ref(),
            member_route: route.member_route.as_ref(),
            path: p.endpoint.path(),
            body,
            collect,
            request_id: &p.request_id,
            stream: p.stream,
            deadline: deadline.min(Instant::now() + budget),
            max_body: 64 << 20,
            max_event: cfg.max_event_bytes,
        };
        let sent = Instant::now();
        let failure = match upstream::attempt(st.conn(&route.cluster), out).await {
            Ok(success) => {
                guard.success();
                st.metrics.attempt(name(i), AttemptResult::ok);
                st.stats.record(&m.name, name(i), Some(sent.elapsed()), Instant::now());
                if let Some(d) = m.deployments.get(route.deployment) {
                    st.shares.record(&m.name, &d.name, Some(sent.elapsed()), Instant::now());
                }
                return Ok(Won { success, guard, route, prefill });
            }
            Err(f) => f,
        };
        st.metrics.attempt(name(i), failure.result());
        tracing::info!(request_id = %p.request_id, cluster = name(i), attempt = attempts, failure = %failure.describe(), "attempt failed");
        let t = tried.entry(name(i)).or_default();
        t.attempts += 1;
        let (url, path) = (&route.cluster.url, p.endpoint.path());
        let fault = match &failure {
            Failure::Status { status, body, .. } => {
                member::config_fault(*status, body).map(|r| (r, format!("answered {status} on {url}{path}")))
            }
            Failure::Tls(e) => Some((ConfigReason::UpstreamTls, format!("TLS handshake with {url} failed: {e}"))),
            _ => None,
        };
        match &failure {
            // A wrong path, a refused credential or certificate: a configuration fault of the
            // cluster's entry point, not an outage. Reported (once) and kept off the route until
            // a probe or a new table clears it; the request goes elsewhere.
            _ if fault.is_some() => {
                guard.neutral();
                t.excluded = true;
                if let Some((reason, what)) = fault {
                    let message = format!("cluster `{}` {what}: {}", name(i), reason.advice());
                    if route.health.cluster().set_fault(reason, message.clone()) {
                        tracing::error!(cluster = name(i), reason = ?reason, %message, "cluster entry point misconfigured");
                    }
                }
            }
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
            // An engine without prefill continuation: learnt, and the route regenerates instead.
            Failure::Status { status, body, .. }
                if prefill && matches!(status.as_u16(), 400 | 422) && !is_context_length(body) =>
            {
                guard.neutral();
                route.health.learn_refuses_prefill();
                tracing::info!(request_id = %p.request_id, cluster = name(i), "the engine refused a prefill continuation; it regenerates from now on");
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
            Failure::Connect(_) | Failure::Tls(_) | Failure::Reset(_) | Failure::Timeout(_) => {
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
    // Every allowed cluster is misconfigured: say so, without a Retry-After.
    let faults: Vec<String> = routes
        .iter()
        .filter_map(|r| r.health.cluster().fault().map(|(reason, _)| format!("{}: {reason:?}", r.cluster.name)))
        .collect();
    if faults.len() == routes.len() {
        let error = GatewayError::UpstreamMisconfigured { model: origin.name.clone(), detail: faults.join(", ") };
        return Err(ModelError::Failed { error, attempted: attempts > 0 });
    }
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
pub(crate) struct Charge {
    key: Option<Arc<ApiKey>>,
    pub(crate) prompt_bytes: usize,
}

impl Charge {
    /// Charge the key (in this process or the shared store; bounded by the store's timeout).
    pub(crate) async fn pay(&self, st: &AppState, tokens: u64) {
        if let Some(k) = &self.key {
            st.limiter.charge(k, tokens).await;
        }
    }
}

/// A whole answer, charged before it is handed over, so a client that waits for it never
/// outruns its token budget.
async fn full(st: &AppState, status: StatusCode, body: Bytes, charge: &Charge) -> Response {
    if charge.key.is_some() {
        let used = serde_json::from_slice::<serde_json::Value>(&body).ok().and_then(|v| usage_tokens(&v));
        // Without `usage`, about four bytes of prompt make a token.
        charge.pay(st, used.unwrap_or((charge.prompt_bytes / 4) as u64)).await;
    }
    let mut r = Response::new(Body::from(body));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}
