//! The request path after validation: the model's fallback chain, and for each model the
//! attempt loop — choose an allowed, available cluster, send, classify, and on a failure
//! before the first byte retry elsewhere (or the same cluster for a one-off 500 or a short
//! `Retry-After`) with jittered exponential backoff, a bounded number of attempts and one
//! deadline. The loop's decisions are the pure state machine in `attempts`; this file does their
//! I/O. Success turns into the client's response: a complete body, or a stream relayed (and,
//! should it break, continued elsewhere) by `continuation`, which runs the same chain and attempt
//! loop for a [`Job::Resume`].

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, StatusCode, header};
use tokio::sync::OwnedSemaphorePermit;

use crate::attempts::{Attempts, GaveUp, Reaction, RouteView, Skip, Step};
use crate::config::{Continuation, GatewayConfig, ms};
use crate::continuation;
use crate::health::AttemptGuard;
use crate::keys::{ApiKey, usage_tokens};
use crate::member::ConfigReason;
use crate::metrics::Endpoint;
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
static CLUSTER: HeaderName = HeaderName::from_static(CLUSTER_HEADER);
static MODEL: HeaderName = HeaderName::from_static(MODEL_HEADER);

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
    /// No cluster of this model served it.
    Failed(GaveUp),
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
    r.headers_mut().insert(CLUSTER.clone(), cluster);
    if let Ok(v) = HeaderValue::from_str(&m.name) {
        r.headers_mut().insert(MODEL.clone(), v);
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
            Err(ModelError::Failed(GaveUp { error, attempted })) => {
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
        r.headers_mut().insert(CLUSTER.clone(), v);
    }
    r
}

/// One model's attempt loop: the routes the request may use, then, until an answer or the
/// machine ([`Attempts`]) gives up, the step it decides, that step's I/O, and the outcome fed
/// back.
async fn try_model<'t>(
    st: &Arc<AppState>,
    table: &'t RoutingTable,
    origin: &Model,
    m: &'t Model,
    p: &Prepared,
    job: &Job<'_>,
    deadline: Instant,
) -> Result<Won<'t>, ModelError> {
    let routes = routes_for(&st.cfg, table, origin, m, p, job);
    let clusters = routes.iter().map(|r| r.cluster.name.as_str()).collect();
    let names = (origin.name.as_str(), m.name.as_str());
    let mut machine =
        Attempts::new(&st.cfg, names, clusters, deadline, |n| st.backoff(n)).map_err(ModelError::Failed)?;
    // A model split between deployments: each attempt goes to the routes of one (`split`).
    let split_key = (!m.deployments.is_empty()).then(|| split::key(st.cfg.routing, p.key, st.next_rr()));
    let t = Trying { st, p, job, m, bytes: model_body(p, m), routes, split_key, deadline };
    loop {
        let now = Instant::now();
        let (i, pause) = match machine.next(now, &t.views(now), |ready, tried| t.pick(ready, tried)) {
            Step::Send { route, pause } => (route, pause),
            Step::Wait(until) => {
                tokio::time::sleep_until(until.into()).await;
                continue;
            }
            Step::GiveUp => break,
        };
        if let Some(pause) = pause {
            tokio::time::sleep(pause).await;
        }
        let route = t.routes[i];
        let Sent { result, guard, prefill, at } = match t.send(route).await {
            Ok(sent) => sent,
            Err(skip) => {
                machine.skipped(i, skip);
                continue;
            }
        };
        match result {
            Ok(success) => {
                machine.answered();
                return Ok(t.won(route, success, guard, prefill, at));
            }
            Err(failure) => {
                let reaction = machine.failed(i, &failure, prefill, Instant::now());
                if let Some(end) = t.settle(route, guard, &failure, reaction, machine.attempts()) {
                    return Err(end);
                }
            }
        }
    }
    let now = Instant::now();
    Err(ModelError::Failed(machine.verdict(now, &t.views(now))))
}

/// The routes of `m` the request may use: within the requested model's policy, `m`'s own and
/// the API key's; a continuation goes only where it can, and never back to a route that broke it.
fn routes_for<'t>(
    cfg: &GatewayConfig,
    table: &'t RoutingTable,
    origin: &Model,
    m: &'t Model,
    p: &Prepared,
    job: &Job<'_>,
) -> Vec<&'t Route> {
    let mut policies = vec![&origin.sovereignty, &m.sovereignty];
    if let Some(k) = &p.api_key {
        policies.push(&k.sovereignty);
    }
    let mut routes = table.allowed_routes(m, &policies);
    if let Job::Resume { skip, .. } = job {
        routes.retain(|r| {
            continuation::capability(cfg, r) != Continuation::None
                && !skip.iter().any(|(sm, sc)| *sm == m.name && *sc == r.cluster.name)
        });
    }
    routes
}

/// The request's body for `m`: as the client sent it, or with `model` rewritten to `m`'s name.
fn model_body(p: &Prepared, m: &Model) -> Bytes {
    if p.body["model"].as_str() == Some(m.name.as_str()) {
        p.raw.clone()
    } else {
        let mut body = p.body.clone();
        body["model"] = serde_json::Value::String(m.name.clone());
        Bytes::from(body.to_string())
    }
}

/// An attempt that went out.
struct Sent {
    result: Result<Success, Failure>,
    guard: AttemptGuard,
    /// It was a prefill continuation.
    prefill: bool,
    /// When it was sent.
    at: Instant,
}

/// What every step of one model's attempt loop works with.
struct Trying<'a, 't> {
    st: &'a Arc<AppState>,
    p: &'a Prepared,
    job: &'a Job<'a>,
    m: &'t Model,
    /// `p`'s body for `m`.
    bytes: Bytes,
    routes: Vec<&'t Route>,
    split_key: Option<u64>,
    deadline: Instant,
}

impl<'t> Trying<'_, 't> {
    /// What the machine sees of each route at `now`.
    fn views(&self, now: Instant) -> Vec<RouteView> {
        let view = |r: &&Route| RouteView {
            available: r.health.available(now),
            cooling_until: r.health.cooling_until(),
            fault: r.health.cluster().fault().map(|(reason, _)| reason),
        };
        self.routes.iter().map(view).collect()
    }

    /// The route to try among those `ready` now: for a split model those of one deployment
    /// first (`split`), then the cluster by load, latency and affinity (`pick`).
    fn pick(&self, ready: Vec<usize>, tried: &dyn Fn(usize) -> bool) -> Option<usize> {
        let ready = match self.split_key {
            Some(k) => split::narrow(self.m, &self.routes, ready, tried, k),
            None => ready,
        };
        let cfg = &self.st.cfg;
        let candidate = |i: usize| {
            let (r, c) = (self.routes[i], self.routes[i].health.cluster());
            Candidate {
                name: r.cluster.name.as_str(),
                weight: r.weight,
                inflight: c.inflight(),
                queue_depth: c.scraped_load(cfg.kv_cache_weight),
                ewma_ms: c.ewma_ms(),
                tried: tried(i),
            }
        };
        let cands: Vec<Candidate> = ready.iter().map(|&i| candidate(i)).collect();
        let rr = self.st.next_rr();
        pick::choose(&cands, self.p.key, cfg.routing, rr, cfg.load_factor).map(|j| ready[j])
    }

    /// The body of an attempt on `route`, whether it is a prefill, and whether the stream's text
    /// is kept (it may be continued); `None` when a continuation cannot be sent there.
    fn body(&self, route: &Route) -> Option<(Bytes, bool, bool)> {
        let (cfg, p) = (&self.st.cfg, self.p);
        match self.job {
            Job::Fresh if continuation::records(cfg, p, route) => {
                Some((continuation::asking_usage(&self.bytes), false, true))
            }
            Job::Fresh => Some((self.bytes.clone(), false, false)),
            Job::Resume { splice, .. } => continuation::request(cfg, p, self.m, route, splice, &self.bytes)
                .map(|(body, prefill)| (body, prefill, true)),
        }
    }

    /// Send one attempt to `route`, or say why none could be sent.
    async fn send(&self, route: &Route) -> Result<Sent, Skip> {
        let (cfg, p) = (&self.st.cfg, self.p);
        let (body, prefill, collect) = self.body(route).ok_or(Skip::Unusable)?;
        // A half-open circuit admits one request at a time; another one already took it.
        let guard = AttemptGuard::begin(&route.health, Instant::now()).ok_or(Skip::ProbeTaken)?;
        let budget = ms(if p.stream { cfg.ttft_timeout_ms } else { cfg.request_timeout_ms });
        let out = Outgoing {
            base: &route.cluster.url,
            target: route.cluster.target.as_ref(),
            auth: route.cluster.auth.as_ref(),
            member_route: route.member_route.as_ref(),
            path: p.endpoint.path(),
            body,
            collect,
            request_id: &p.request_id,
            stream: p.stream,
            deadline: self.deadline.min(Instant::now() + budget),
            max_body: 64 << 20,
            max_event: cfg.max_event_bytes,
        };
        let at = Instant::now();
        let result = upstream::attempt(self.st.conn(&route.cluster), out).await;
        Ok(Sent { result, guard, prefill, at })
    }

    /// A usable answer: both circuits close, and the `Serving` windows count it.
    fn won(&self, route: &'t Route, success: Success, mut guard: AttemptGuard, prefill: bool, at: Instant) -> Won<'t> {
        let (st, m, name) = (self.st, self.m, route.cluster.name.as_str());
        guard.success();
        st.metrics.attempt_ok(name, &route.meters);
        st.stats.record(&m.name, name, Some(at.elapsed()), Instant::now());
        if let Some(d) = m.deployments.get(route.deployment) {
            st.shares.record(&m.name, &d.name, Some(at.elapsed()), Instant::now());
        }
        Won { success, guard, route, prefill }
    }

    /// Apply the machine's judgement of a failed attempt: metrics, the log and the route's health
    /// (the breaker of the scope that failed, if any). `Some` when it ends the loop: the upstream
    /// rejected the request itself, and the client gets its answer.
    fn settle(
        &self,
        route: &Route,
        mut guard: AttemptGuard,
        failure: &Failure,
        reaction: Reaction,
        attempt: u32,
    ) -> Option<ModelError> {
        let (st, name, request_id) = (self.st, route.cluster.name.as_str(), &self.p.request_id);
        st.metrics.attempt(name, failure.result());
        tracing::info!(%request_id, cluster = name, attempt, failure = %failure.describe(), "attempt failed");
        match reaction {
            Reaction::Misconfigured(reason) => {
                guard.neutral();
                self.report_fault(route, failure, reason);
            }
            Reaction::RateLimited { cool_down } => {
                guard.neutral();
                if let Some(ra) = cool_down {
                    route.health.cool_down(Instant::now() + ra);
                }
            }
            Reaction::RefusesPrefill => {
                guard.neutral();
                route.health.learn_refuses_prefill();
                tracing::info!(%request_id, cluster = name, "the engine refused a prefill continuation; it regenerates from now on");
            }
            Reaction::Rejected { status, body, context_length } => {
                guard.neutral();
                return Some(ModelError::Client { response: client_error(status, body, name), context_length });
            }
            Reaction::ClientError => guard.neutral(),
            // The engine answered, badly: the model's own breaker on this cluster counts it.
            Reaction::ServerError | Reaction::EngineFailure => {
                guard.model_failure();
                st.stats.record(&self.m.name, name, None, Instant::now());
            }
            // The cluster did not answer: its breaker counts it, for every model on it.
            Reaction::TransportFailure => {
                guard.transport_failure();
                st.stats.record(&self.m.name, name, None, Instant::now());
            }
        }
        None
    }

    /// A wrong path, a refused credential or certificate: a configuration fault of the cluster's
    /// entry point, not an outage. Reported (logged once) and kept off the route until a probe or
    /// a new table clears it.
    fn report_fault(&self, route: &Route, failure: &Failure, reason: ConfigReason) {
        let (name, url) = (route.cluster.name.as_str(), &route.cluster.url);
        let what = match failure {
            Failure::Tls(e) => format!("TLS handshake with {url} failed: {e}"),
            Failure::Status { status, .. } => format!("answered {status} on {url}{}", self.p.endpoint.path()),
            other => format!("failed on {url}: {}", other.describe()),
        };
        let message = format!("cluster `{name}` {what}: {}", reason.advice());
        if route.health.cluster().set_fault(reason, message.clone()) {
            tracing::error!(cluster = name, reason = ?reason, %message, "cluster entry point misconfigured");
        }
    }
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
