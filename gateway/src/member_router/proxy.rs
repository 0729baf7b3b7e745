//! One proxied request: the route is looked up in the table in force, the body read whole (up to
//! `--max-body-bytes`, so that it can be sent again), then each attempt picks an endpoint not yet
//! tried and sends method, path, query, headers (hop-by-hop ones, `Host` and `Expect` removed)
//! and body.
//! Only a failure to connect moves on to another endpoint; once an endpoint has the request its
//! answer, or its failure, is final. The answer's body is relayed frame by frame as it arrives
//! (SSE streams included), and the endpoint stays counted as busy until the body is done.
//! Dropping the response (the client went away) drops the upstream request with it.

use axum::body::Body;
use axum::extract::Request;
use axum::response::Response;
use http::{HeaderMap, HeaderName, Uri, header};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};

use super::MemberRouter;
use super::front::{Refusal, refuse};
use super::metrics::RequestResult;

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
    let mut tried: Vec<usize> = Vec::new();
    let mut last = String::from("no endpoint was tried");
    for _ in 0..st.cfg.attempts.max(1) {
        let Some((i, url, hold)) = live.pick(value, &tried) else { break };
        tried.push(i);
        let uri: Uri = match format!("{url}{path}").parse() {
            Ok(u) => u,
            Err(e) => {
                last = format!("endpoint {url} makes an invalid URL: {e}");
                continue;
            }
        };
        let mut out = http::Request::new(Full::new(body.clone()));
        *out.method_mut() = parts.method.clone();
        *out.uri_mut() = uri;
        *out.headers_mut() = headers.clone();
        match st.client.request(out).await {
            Ok(resp) => {
                st.metrics.request(RequestResult::proxied);
                let (mut head, incoming) = resp.into_parts();
                head.headers = end_to_end(&head.headers);
                // The hold lives as long as the body: a stream keeps its endpoint busy.
                let body = incoming.map_frame(move |f| {
                    let _busy = &hold;
                    f
                });
                return Response::from_parts(head, Body::new(body));
            }
            Err(e) if e.is_connect() => {
                let why = chain(&e);
                tracing::debug!(route = %route.source, endpoint = %url, error = %why, "connect failed; trying another endpoint");
                last = format!("connecting to {url} failed: {why}");
            }
            Err(e) => {
                let why = chain(&e);
                tracing::debug!(route = %route.source, endpoint = %url, error = %why, "request failed after it was sent");
                let reason = format!("the connection to {url} failed after the request was sent (not retried): {why}");
                return refuse(st, Refusal::Unreachable { value: value.into(), reason });
            }
        }
    }
    let reason = format!("no endpoint could be reached ({} tried); last: {last}", tried.len());
    tracing::warn!(route = %route.source, %reason, "request not delivered");
    refuse(st, Refusal::Unreachable { value: value.into(), reason })
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
