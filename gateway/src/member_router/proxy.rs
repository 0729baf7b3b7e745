//! One proxied request: the route is looked up in the table in force, the body read whole (up to
//! `--max-body-bytes`, so that it can be sent again), then each attempt picks an endpoint not yet
//! tried and sends method, path, query, headers (hop-by-hop ones, `Host` and `Expect` removed)
//! and body.
//! Only a failure to connect moves on to another endpoint; once an endpoint has the request its
//! answer, or its failure, is final. On a route that lists LoRA adapters, a body whose `model`
//! is one of them is placed by adapter (`to_adapter`): loaded where needed first, and a failed
//! load moves on too. The answer's body is relayed frame by frame as it arrives
//! (SSE streams included), and the endpoint stays counted as busy until the body is done.
//! Dropping the response (the client went away) drops the upstream request with it.

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use tokio::time::Instant;

use super::MemberRouter;
use super::adapters::{NoPlace, Policy};
use super::engine::EngineError;
use super::front::{AdapterFault, Refusal, refuse};
use super::metrics::{AdapterEvent, RequestResult};
use super::pick::Live;

/// Headers that concern one connection only (RFC 9110 §7.6.1), never forwarded.
const HOP_BY_HOP: [HeaderName; 7] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    header::PROXY_AUTHORIZATION,
];

/// `headers` without hop-by-hop ones: the fixed list, any `Proxy-*`, and those `Connection`
/// names.
pub fn end_to_end(headers: &HeaderMap) -> HeaderMap {
    let named: Vec<String> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect();
    let mut out = HeaderMap::with_capacity(headers.len());
    for (name, value) in headers {
        let n = name.as_str();
        if HOP_BY_HOP.contains(name) || n.starts_with("proxy-") || named.iter().any(|t| t == n) {
            continue;
        }
        out.append(name.clone(), value.clone());
    }
    out
}

fn short(s: &str) -> String {
    let mut cut: String = s.chars().take(200).collect();
    if cut.len() < s.len() {
        cut.push('…');
    }
    cut
}

/// Serve a request for header value `value`.
pub async fn proxy(st: &MemberRouter, value: &str, req: Request) -> Response {
    let live = st.live();
    let Some(route) = live.route(value) else {
        if !st.sync.has_table() {
            return refuse(st, Refusal::NotSynced);
        }
        return refuse(
            st,
            Refusal::UnknownRoute {
                header: st.cfg.header.to_string(),
                value: short(value),
                gateway: st.cfg.gateway.to_string(),
            },
        );
    };
    if route.endpoints.is_empty() {
        return refuse(st, Refusal::NoEndpoint { value: value.into(), source_route: route.source.clone() });
    }
    let max = st.cfg.max_body_bytes;
    let declared = req.headers().get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return refuse(st, Refusal::TooLarge(max));
    }
    let (parts, body) = req.into_parts();
    let body = match Limited::new(body, max).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => return refuse(st, Refusal::TooLarge(max)),
        Err(e) => return refuse(st, Refusal::BadBody(e.to_string())),
    };
    let mut headers = end_to_end(&parts.headers);
    // The body is read whole: its length is set anew, and the client's `Expect: 100-continue`
    // was answered here already.
    headers.remove(header::HOST);
    headers.remove(header::CONTENT_LENGTH);
    headers.remove(header::EXPECT);
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let out = Outgoing { parts: &parts, headers: &headers, body: &body, path };
    // Only a route that lists adapters has its body read for `model`; a name it does not list
    // (the base model, or anything else) goes on as a base-model request: never loaded.
    if !route.adapters.is_empty()
        && let Some(adapter) = requested_model(&body).filter(|m| route.adapters.contains_key(m.as_str()))
    {
        return to_adapter(st, &live, value, &adapter, &out).await;
    }
    let mut tried: Vec<usize> = Vec::new();
    let mut last = String::from("no endpoint was tried");
    for _ in 0..st.cfg.attempts.max(1) {
        let Some((i, url, hold)) = live.pick(value, &tried) else { break };
        tried.push(i);
        match send(st, value, &route.source, url, &out, hold).await {
            Sent::Answer(resp, _) | Sent::Broken(resp) => return resp,
            Sent::NotConnected(why) => last = why,
        }
    }
    let reason = format!("no endpoint could be reached ({} tried); last: {last}", tried.len());
    tracing::warn!(route = %route.source, %reason, "request not delivered");
    refuse(st, Refusal::Unreachable { value: value.into(), reason })
}

/// The request as it goes to every endpoint tried.
struct Outgoing<'a> {
    parts: &'a http::request::Parts,
    headers: &'a HeaderMap,
    body: &'a Bytes,
    path: &'a str,
}

/// How one attempt ended.
enum Sent {
    /// The endpoint answered (with this status); the answer streams back.
    Answer(Response, StatusCode),
    /// The connection failed after the request was sent: the refusal to answer with.
    Broken(Response),
    /// It could not be connected to: why.
    NotConnected(String),
}

/// The `model` a JSON request body names, if any.
fn requested_model(body: &[u8]) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Named {
        model: Option<String>,
    }
    serde_json::from_slice::<Named>(body).ok()?.model
}

/// One attempt: send the request to `url`; `busy` (the endpoint's hold, and the adapter's)
/// lives as long as the answer's body.
async fn send(
    st: &MemberRouter,
    value: &str,
    source: &str,
    url: &str,
    out: &Outgoing<'_>,
    busy: impl Send + 'static,
) -> Sent {
    let uri: Uri = match format!("{url}{}", out.path).parse() {
        Ok(u) => u,
        Err(e) => return Sent::NotConnected(format!("endpoint {url} makes an invalid URL: {e}")),
    };
    let mut req = http::Request::new(Full::new(out.body.clone()));
    *req.method_mut() = out.parts.method.clone();
    *req.uri_mut() = uri;
    *req.headers_mut() = out.headers.clone();
    match st.client.request(req).await {
        Ok(resp) => {
            st.metrics.request(RequestResult::proxied);
            let (mut head, incoming) = resp.into_parts();
            head.headers = end_to_end(&head.headers);
            let status = head.status;
            // The hold lives as long as the body: a stream keeps its endpoint busy.
            let body = incoming.map_frame(move |f| {
                let _busy = &busy;
                f
            });
            Sent::Answer(Response::from_parts(head, Body::new(body)), status)
        }
        Err(e) if e.is_connect() => {
            let why = chain(&e);
            tracing::debug!(route = %source, endpoint = %url, error = %why, "connect failed; trying another endpoint");
            Sent::NotConnected(format!("connecting to {url} failed: {why}"))
        }
        Err(e) => {
            let why = chain(&e);
            tracing::debug!(route = %source, endpoint = %url, error = %why, "request failed after it was sent");
            let reason = format!("the connection to {url} failed after the request was sent (not retried): {why}");
            Sent::Broken(refuse(st, Refusal::Unreachable { value: value.into(), reason }))
        }
    }
}

/// A request for `adapter`, one the route lists: each attempt places it on an endpoint
/// (`adapters::Book::place`), waits for the adapter to be loaded there if it is not, and sends
/// it. A load that fails, or an endpoint that cannot be connected to, moves it on to another
/// endpoint, up to `--attempts` in all.
async fn to_adapter(st: &MemberRouter, live: &Live, value: &str, adapter: &str, out: &Outgoing<'_>) -> Response {
    let policy = Policy { affinity: st.cfg.adapter_affinity, saturation: f64::from(st.cfg.adapter_saturation) };
    let auth = out.parts.headers.get(header::AUTHORIZATION).cloned();
    let source = live.route(value).map(|r| r.source.clone()).unwrap_or_default();
    let mut tried: Vec<usize> = Vec::new();
    let (mut load_failed, mut not_connected): (Option<EngineError>, Option<String>) = (None, None);
    let mut stop = NoPlace::Exhausted;
    for _ in 0..st.cfg.attempts.max(1) {
        let placed = match st.adapters.place(live, value, adapter, &tried, policy, Instant::now()) {
            Ok(p) => p,
            Err(why) => {
                stop = why;
                break;
            }
        };
        tried.push(placed.index);
        let url = placed.url;
        if let Some(job) = placed.job {
            tokio::spawn(st.loader().run(job, auth.clone()));
        }
        let hit = placed.wait.is_none();
        if let Some(mut rx) = placed.wait {
            let outcome = match rx.wait_for(Option::is_some).await {
                Ok(o) => o.clone().unwrap_or(Ok(())),
                Err(_) => Err(EngineError::Unreachable { url: url.into(), why: "the load was abandoned".into() }),
            };
            if let Err(e) = outcome {
                tracing::debug!(route = %source, endpoint = %url, %adapter, error = %e, "adapter not loaded; trying another endpoint");
                load_failed = Some(e);
                continue;
            }
        }
        match send(st, value, &source, url, out, (placed.hold, placed.in_flight)).await {
            Sent::Answer(resp, status) => {
                st.metrics.adapters.count(adapter, if hit { AdapterEvent::Hit } else { AdapterEvent::Miss });
                if status == StatusCode::NOT_FOUND {
                    // The engine does not know it after all: load it again next time.
                    st.adapters.forget(url, adapter);
                }
                return resp;
            }
            Sent::Broken(resp) => return resp,
            Sent::NotConnected(why) => not_connected = Some(why),
        }
    }
    let refusal = match (load_failed, not_connected, stop) {
        (Some(e), _, _) => {
            let fault = if matches!(e, EngineError::TimedOut { .. }) {
                AdapterFault::TimedOut
            } else {
                AdapterFault::LoadFailed
            };
            let reason = format!("it could not be loaded ({} endpoints tried); last: {e}", tried.len());
            Refusal::Adapter { value: value.into(), adapter: adapter.into(), fault, reason }
        }
        (None, Some(why), _) => {
            let reason = format!("no endpoint could be reached ({} tried); last: {why}", tried.len());
            Refusal::Unreachable { value: value.into(), reason }
        }
        (None, None, NoPlace::Full) => Refusal::Adapter {
            value: value.into(),
            adapter: adapter.into(),
            fault: AdapterFault::Full,
            reason: "every endpoint holds as many adapters as it may, all of them in use: retry shortly".into(),
        },
        (None, None, NoPlace::BackingOff) => Refusal::Adapter {
            value: value.into(),
            adapter: adapter.into(),
            fault: AdapterFault::BackingOff,
            reason: "loading it failed moments ago on every endpoint (see the member router's log): retry later".into(),
        },
        (None, None, NoPlace::Exhausted) => {
            Refusal::Unreachable { value: value.into(), reason: "no endpoint was left to try".into() }
        }
    };
    tracing::warn!(route = %source, %adapter, reason = %refusal, "adapter request not delivered");
    refuse(st, refusal)
}

/// An error with its causes, `a: b: c`.
fn chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut src = e.source();
    while let Some(s) = src {
        let t = s.to_string();
        if !text.contains(&t) {
            text = format!("{text}: {t}");
        }
        src = s.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn hop_by_hop_headers_are_dropped() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("connection", "keep-alive, X-Secret-Hop"),
            ("keep-alive", "timeout=5"),
            ("proxy-authorization", "Basic x"),
            ("proxy-connection", "keep-alive"),
            ("te", "trailers"),
            ("trailer", "x"),
            ("transfer-encoding", "chunked"),
            ("upgrade", "h2c"),
            ("x-secret-hop", "1"),
            ("authorization", "Bearer k"),
            ("x-flotilla-deployment", "a/x"),
            ("accept", "text/event-stream"),
        ] {
            h.append(HeaderName::from_static(k), HeaderValue::from_static(v));
        }
        let out = end_to_end(&h);
        let mut names: Vec<&str> = out.keys().map(HeaderName::as_str).collect();
        names.sort_unstable();
        assert_eq!(names, ["accept", "authorization", "x-flotilla-deployment"]);
    }

    #[test]
    fn long_values_are_cut_in_messages() {
        assert_eq!(short("a/b"), "a/b");
        assert_eq!(short(&"x".repeat(500)).chars().count(), 201);
    }
}
