//! A streamed answer from first byte to end, continued elsewhere when it breaks. The upstream
//! stream is relayed through a [`Splice`] (which keeps the text sent, only when the route may
//! continue); when it is cut, stalls or sends broken events, the same chain of models and the
//! same attempt loop as any request (sovereignty, key policy, breakers, excluded routes) pick
//! another route, which gets the conversation plus the partial answer (prefill) or the request
//! again (regenerate), and its events are spliced into the client's stream. At most
//! `--max-continuations` times; otherwise, and whenever a regenerated answer does not begin with
//! the text sent, the stream ends with an error event, never `[DONE]`.

use std::sync::Arc;
use std::time::Instant;

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderValue, header};
use hyper::body::Incoming;
use tokio::sync::{OwnedSemaphorePermit, mpsc};

use crate::AppState;
use crate::attempts::{self, AfterStream};
use crate::config::{Continuation, GatewayConfig, ms};
use crate::health::AttemptGuard;
use crate::metrics::{AbandonReason, ContinuationResult, Endpoint, StreamEnd};
use crate::proxy::{self, Charge, Ended, Job, Prepared};
use crate::splice::{Splice, prefill_body};
use crate::sse::{self, Event, Parser, Progress, Relay};
use crate::table::{Model, Route, RoutingTable};
use crate::upstream::Success;

/// Whether `body` asks for a reproducible answer (`temperature` 0, or a `seed`): the same
/// request gives the same text, so a regeneration can be verified against the text sent and is
/// exactly the answer the client would have had without the break.
pub fn deterministic(body: &serde_json::Value) -> bool {
    body["temperature"].as_f64() == Some(0.0) || body["seed"].is_number()
}

/// Whether the client asked for the stream's `usage` chunk.
pub fn client_usage(body: &serde_json::Value) -> bool {
    body["stream_options"]["include_usage"].as_bool() == Some(true)
}

/// `body` (a JSON object) asking the engine for the stream's `usage` chunk, so what is charged
/// and spliced is the engine's own count; unchanged when it is not an object or already asks.
pub fn asking_usage(body: &Bytes) -> Bytes {
    match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(mut v) if v.is_object() && !client_usage(&v) => {
            if !v["stream_options"].is_object() {
                v["stream_options"] = serde_json::json!({});
            }
            v["stream_options"]["include_usage"] = true.into();
            Bytes::from(v.to_string())
        }
        _ => body.clone(),
    }
}

/// How `route` continues streams now: its declared capability (else the default), and a
/// prefill route that refused a prefill regenerates.
pub fn capability(cfg: &GatewayConfig, route: &Route) -> Continuation {
    match route.continuation.unwrap_or(cfg.continuation_default) {
        Continuation::Prefill if route.health.refuses_prefill() => Continuation::Regenerate,
        c => c,
    }
}

/// Whether a stream of `p` served by `route` keeps what it relays so it can be continued: only
/// with continuation on, for a streamed single-choice answer, on a route that takes part.
pub fn records(cfg: &GatewayConfig, p: &Prepared, route: &Route) -> bool {
    cfg.continuation
        && p.stream
        && p.endpoint != Endpoint::embeddings
        && p.body["n"].as_u64().is_none_or(|n| n <= 1)
        && capability(cfg, route) != Continuation::None
}

/// The body of a continuation attempt of `p` on `route` for model `m`, and whether it is a
/// prefill; `plain` is the request for `m` as is (what a regeneration sends). `None` when the
/// route cannot continue it or the body would exceed `--max-body-bytes`.
pub(crate) fn request(
    cfg: &GatewayConfig,
    p: &Prepared,
    m: &Model,
    route: &Route,
    splice: &Splice,
    plain: &Bytes,
) -> Option<(Bytes, bool)> {
    let chat = p.endpoint == Endpoint::chat_completions;
    let (body, prefill) = match capability(cfg, route) {
        Continuation::None => return None,
        // A reproducible request regenerates: verified against the text sent, it is the answer
        // the client would have had; a prefill continuation is another answer after the seam.
        Continuation::Prefill if deterministic(&p.body) => (asking_usage(plain), false),
        Continuation::Prefill => match prefill_body(chat, &p.body, &m.name, splice.text(), splice.tokens()) {
            Some(v) => (asking_usage(&Bytes::from(v.to_string())), true),
            // A prompt that cannot take the partial answer: the engine may still regenerate.
            None => (asking_usage(plain), false),
        },
        Continuation::Regenerate => (asking_usage(plain), false),
    };
    (body.len() <= cfg.max_body_bytes).then_some((body, prefill))
}

/// A client stream: what it needs to continue.
pub(crate) struct Stream {
    pub(crate) st: Arc<AppState>,
    pub(crate) table: Arc<RoutingTable>,
    /// The requested model (its policy binds every continuation).
    pub(crate) origin: String,
    /// The serving model, then the fallbacks after it.
    pub(crate) chain: Vec<String>,
    /// Keep the relayed text (see [`records`]).
    pub(crate) record: bool,
    pub(crate) p: Arc<Prepared>,
    pub(crate) charge: Charge,
    pub(crate) permit: OwnedSemaphorePermit,
}

/// One upstream stream being relayed.
pub(crate) struct Upstream {
    pub(crate) events: Vec<Event>,
    pub(crate) parser: Parser,
    pub(crate) body: Incoming,
    pub(crate) guard: AttemptGuard,
    pub(crate) route: Route,
    pub(crate) model: String,
}

/// The client's streamed response: events come from a task that relays (and continues) the
/// upstream stream.
pub(crate) fn respond(s: Stream, up: Upstream) -> Response {
    let (tx, mut rx) = mpsc::channel::<Bytes>(32);
    tokio::spawn(run(s, up, tx));
    let stream = futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx).map(|o| o.map(Ok::<_, std::io::Error>)));
    let mut r = Response::new(Body::from_stream(stream));
    let h = r.headers_mut();
    h.insert(header::CONTENT_TYPE, HeaderValue::from_static("text/event-stream"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-accel-buffering", HeaderValue::from_static("no"));
    r
}

async fn run(s: Stream, mut up: Upstream, tx: mpsc::Sender<Bytes>) {
    let (st, cfg) = (&s.st, &s.st.cfg);
    let relay = Relay { tx: &tx, idle: ms(cfg.idle_timeout_ms), max_malformed: cfg.max_malformed_events };
    let mut splice = Splice::new(s.record).client_usage(client_usage(&s.p.body));
    let mut progress = Progress::default();
    let mut skip: Vec<(String, String)> = Vec::new();
    let mut continued = 0u32;
    let end = loop {
        (progress.finished, progress.skipped) = (false, 0);
        let end = sse::relay(up.events, up.parser, up.body, &relay, &mut splice, &mut progress).await;
        settle(st, &up.guard, &up.route.cluster.name, &up.model, end, progress.skipped);
        drop(up.guard);
        match attempts::after_stream(end, s.record, splice.resumable(), continued, cfg.max_continuations) {
            AfterStream::End => break end,
            AfterStream::Abandon(reason) => {
                st.metrics.abandoned(reason);
                break end;
            }
            AfterStream::Continue => {}
        }
        skip.push((up.model.clone(), up.route.cluster.name.clone()));
        continued += 1;
        st.metrics.continuation(ContinuationResult::attempted);
        tracing::info!(request_id = %s.p.request_id, cluster = %up.route.cluster.name, end = ?end, continuation = continued, "stream broke mid-answer; continuing it elsewhere");
        let next = tokio::select! {
            () = tx.closed() => break StreamEnd::client_gone,
            n = next(&s, &splice, &skip) => n,
        };
        match next {
            Ok((n, prefill)) => {
                splice.resume(prefill);
                up = n;
            }
            Err(reason) => {
                st.metrics.abandoned(reason);
                break end;
            }
        }
    };
    if let Some(ev) = sse::broken_event(end) {
        tracing::warn!(request_id = %s.p.request_id, end = ?end, "stream broke after the first byte; ended with an error event");
        let _ = tx.send(ev).await;
    } else if continued > 0 && matches!(end, StreamEnd::complete | StreamEnd::finalised) {
        st.metrics.continuation(ContinuationResult::succeeded);
    }
    // A stream's `usage` chunk (asked of the engine for every recorded stream) is exact;
    // without one each content chunk counts as a token and four bytes of prompt as one.
    let t = progress.tokens;
    s.charge.pay(st, t.total.unwrap_or(t.chunks + (s.charge.prompt_bytes / 4) as u64)).await;
    drop(s.permit);
}

/// Record how one upstream stream ended: metrics, the scope's health, the `Serving` window.
fn settle(st: &AppState, guard: &AttemptGuard, cluster: &str, model: &str, end: StreamEnd, skipped: u32) {
    st.metrics.stream(cluster, end);
    st.metrics.skipped(cluster, skipped);
    let now = Instant::now();
    match end {
        // The connection broke or went silent: the cluster's transport.
        StreamEnd::cut | StreamEnd::stalled => guard.route().cluster().record_failure(now),
        // The engine sent a broken answer: the model on this cluster.
        StreamEnd::malformed | StreamEnd::truncated | StreamEnd::oversized => guard.route().record_model_failure(now),
        _ => {}
    }
    if end.broken() {
        st.stats.record_broken(model, cluster, now);
    }
}

/// Another route's stream continuing `splice`, and whether it was asked as a prefill.
async fn next(s: &Stream, splice: &Splice, skip: &[(String, String)]) -> Result<(Upstream, bool), AbandonReason> {
    let table = &s.table;
    let origin = table.resolve(&s.origin).ok_or(AbandonReason::no_route)?;
    let chain: Vec<&Model> = s.chain.iter().filter_map(|n| table.resolve(n)).collect();
    let deadline = Instant::now() + ms(s.st.cfg.deadline_ms);
    let job = Job::Resume { splice, skip };
    match proxy::run_chain(&s.st, table, origin, &chain, &s.p, &job, deadline).await {
        Ok((won, i)) => {
            let Success::Stream { events, parser, body } = won.success else { return Err(AbandonReason::no_route) };
            let model = chain[i].name.clone();
            let up = Upstream { events, parser, body, guard: won.guard, route: won.route.clone(), model };
            Ok((up, won.prefill))
        }
        Err(Ended::Client(_)) => Err(AbandonReason::rejected),
        Err(Ended::Failed(e)) => {
            tracing::info!(request_id = %s.p.request_id, error = %e, "no route could continue the stream");
            Err(AbandonReason::no_route)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::health::RouteHealth;
    use crate::table::Cluster;
    use serde_json::json;

    fn route(declared: Option<Continuation>) -> Route {
        let cluster = Cluster {
            name: "c".into(),
            url: "http://127.0.0.1:1".into(),
            jurisdiction: "EU".into(),
            region: String::new(),
            auth: None,
            tls: None,
            target: None,
        };
        Route {
            cluster: Arc::new(cluster),
            weight: 1,
            ready: true,
            continuation: declared,
            health: RouteHealth::detached(),
            deployment: 0,
            member_route: None,
            meters: Default::default(),
        }
    }

    fn prepared(endpoint: Endpoint, body: serde_json::Value) -> Prepared {
        let raw = Bytes::from(body.to_string());
        let (request_id, model) = ("r".to_string(), "m".to_string());
        Prepared { endpoint, body, raw, stream: true, key: None, request_id, model, api_key: None }
    }

    #[test]
    fn capability_is_declared_or_default_and_a_refused_prefill_regenerates() {
        let cfg = GatewayConfig::with_table("t.yaml");
        assert_eq!(capability(&cfg, &route(None)), Continuation::Regenerate, "the default");
        let cfg = GatewayConfig { continuation_default: Continuation::Prefill, ..cfg };
        assert_eq!(capability(&cfg, &route(None)), Continuation::Prefill);
        assert_eq!(capability(&cfg, &route(Some(Continuation::None))), Continuation::None);
        let r = route(None);
        r.health.learn_refuses_prefill();
        assert_eq!(capability(&cfg, &r), Continuation::Regenerate);
        let chat = prepared(Endpoint::chat_completions, json!({"model": "m", "messages": [], "stream": true}));
        assert!(records(&cfg, &chat, &route(None)));
        assert!(!records(&cfg, &chat, &route(Some(Continuation::None))), "a `none` route keeps nothing");
        let two = prepared(Endpoint::chat_completions, json!({"model": "m", "messages": [], "n": 2}));
        assert!(!records(&cfg, &two, &route(None)), "several choices are not continued");
        let off = GatewayConfig { continuation: false, ..cfg };
        assert!(!records(&off, &chat, &route(None)), "the switch");
    }

    #[test]
    fn continuation_requests_are_bounded_and_fall_back_to_regeneration() {
        let mut cfg = GatewayConfig::with_table("t.yaml");
        cfg.continuation_default = Continuation::Prefill;
        let m = Model {
            name: "m".into(),
            aliases: vec![],
            sovereignty: Default::default(),
            fallbacks: vec![],
            routes: vec![],
            deployments: vec![],
            scale_to_zero: false,
            parent: None,
            meters: Default::default(),
        };
        let mut splice = Splice::new(true);
        let chunk = Bytes::from_static(b"data: {\"choices\":[{\"delta\":{\"content\":\"the fleet \"}}]}\n\n");
        splice.data(chunk, "the fleet ", false, false);
        let chat =
            prepared(Endpoint::chat_completions, json!({"model": "m", "messages": [{"role": "user", "content": "q"}]}));
        let (body, prefill) = request(&cfg, &chat, &m, &route(None), &splice, &chat.raw).unwrap();
        assert!(prefill && std::str::from_utf8(&body).unwrap().contains("continue_final_message"));
        assert_eq!(
            request(&cfg, &chat, &m, &route(Some(Continuation::Regenerate)), &splice, &chat.raw),
            Some((asking_usage(&chat.raw), false))
        );
        assert_eq!(request(&cfg, &chat, &m, &route(Some(Continuation::None)), &splice, &chat.raw), None);
        let asked = |b: &Bytes| serde_json::from_slice::<serde_json::Value>(b).unwrap()["stream_options"].clone();
        assert_eq!(asked(&body), json!({"include_usage": true}), "the engine's own count is asked for");
        for det in [json!({"temperature": 0}), json!({"seed": 7}), json!({"temperature": 0.0, "seed": 1})] {
            let mut b = chat.body.clone();
            b.as_object_mut().unwrap().extend(det.as_object().unwrap().clone());
            let p = prepared(Endpoint::chat_completions, b);
            let (body, prefill) = request(&cfg, &p, &m, &route(None), &splice, &p.raw).unwrap();
            assert!(!prefill, "a reproducible request regenerates: {det}");
            assert!(!std::str::from_utf8(&body).unwrap().contains("continue_final_message"));
            assert_eq!(asked(&body), json!({"include_usage": true}));
        }
        let warm = prepared(Endpoint::chat_completions, json!({"model": "m", "messages": [], "temperature": 0.7}));
        assert!(request(&cfg, &warm, &m, &route(None), &splice, &warm.raw).unwrap().1, "sampled: prefill");
        let tokens = prepared(Endpoint::completions, json!({"model": "m", "prompt": [1, 2, 3]}));
        let (_, prefill) = request(&cfg, &tokens, &m, &route(None), &splice, &tokens.raw).unwrap();
        assert!(!prefill, "a prompt of token ids cannot take the text: regenerate");
        cfg.max_body_bytes = body.len() - 1;
        assert_eq!(request(&cfg, &chat, &m, &route(None), &splice, &chat.raw), None, "bounded like any request");
    }
}
