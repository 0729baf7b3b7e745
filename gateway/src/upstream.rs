//! One attempt against one cluster: the request goes out with the hop-by-hop-free headers the
//! gateway chooses, and what comes back is classified before any byte reaches the client —
//! a complete body, an open stream with its first events, or a failure the retry loop can
//! reason about (connect error, reset, timeout, status with `Retry-After`, garbage).

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client as HyperClient;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use flotilla_apis::constants::DEPLOYMENT_HEADER;

use crate::metrics::AttemptResult;
use crate::sse::{Event, Parser};

/// The upstream HTTP client.
pub type Client = HyperClient<HttpConnector, Full<Bytes>>;

/// The client for one cluster: the shared plain one, or the cluster's own TLS one.
#[derive(Clone, Copy, Debug)]
pub enum Conn<'a> {
    /// `http://`.
    Plain(&'a Client),
    /// `https://`, with the cluster's CA bundle and client certificate.
    Tls(&'a crate::tls::TlsClient),
}

impl Conn<'_> {
    /// Send `req`.
    pub fn request(self, req: Request<Full<Bytes>>) -> hyper_util::client::legacy::ResponseFuture {
        match self {
            Conn::Plain(c) => c.request(req),
            Conn::Tls(c) => c.request(req),
        }
    }
}

/// A pooled HTTP/1 client with a connect timeout.
pub fn client(connect_timeout: Duration) -> Client {
    let mut c = HttpConnector::new();
    c.set_connect_timeout(Some(connect_timeout));
    c.set_nodelay(true);
    HyperClient::builder(TokioExecutor::new()).pool_idle_timeout(Duration::from_secs(30)).build(c)
}

/// Where one cluster's requests go, worked out once when its table is loaded: the request target
/// of each API and the `Host` header (as the client would set it), so that an attempt neither
/// formats nor parses a URL.
#[derive(Clone, Debug, PartialEq)]
pub struct Target {
    /// One per API, in [`Endpoint::path`](crate::metrics::Endpoint::path)'s order.
    uris: [(&'static str, Uri); 3],
    host: HeaderValue,
}

impl Target {
    /// The targets under `base` (a cluster's URL without a trailing slash); `None` when it does
    /// not parse (the attempt then parses it itself and reports the error).
    pub fn new(base: &str) -> Option<Self> {
        use crate::metrics::Endpoint;
        let uri = |e: Endpoint| format!("{base}{}", e.path()).parse::<Uri>().ok().map(|u| (e.path(), u));
        let uris = [uri(Endpoint::chat_completions)?, uri(Endpoint::completions)?, uri(Endpoint::embeddings)?];
        let u = &uris[0].1;
        let host = u.host()?;
        // A port is named unless it is the scheme's default, as hyper's client writes `Host`.
        let secure = matches!(u.scheme_str(), Some("https" | "wss"));
        let host = match u.port() {
            Some(p) if !matches!((p.as_u16(), secure), (443, true) | (80, false)) => {
                HeaderValue::from_str(&format!("{host}:{}", p.as_str())).ok()?
            }
            _ => HeaderValue::from_str(host).ok()?,
        };
        Some(Target { uris, host })
    }

    fn uri(&self, path: &str) -> Option<&Uri> {
        self.uris.iter().find(|(p, _)| *p == path).map(|(_, u)| u)
    }
}

/// The request id header sent upstream.
static REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Why an attempt failed.
#[derive(Debug)]
pub enum Failure {
    /// TCP connect failed.
    Connect(String),
    /// The TLS handshake failed: the member's certificate is not trusted, names another host,
    /// or the member refused the gateway's client certificate (rustls' words).
    Tls(String),
    /// The connection closed or broke before a complete answer.
    Reset(String),
    /// Nothing arrived in time; the route is treated as silent.
    Timeout(&'static str),
    /// A non-success status.
    Status {
        /// The status.
        status: StatusCode,
        /// Upstream `Retry-After`, if any.
        retry_after: Option<Duration>,
        /// Upstream body (bounded).
        body: Bytes,
    },
    /// A 2xx answer that is not what the API promises.
    Malformed(String),
}

impl Failure {
    /// The metric label.
    pub fn result(&self) -> AttemptResult {
        match self {
            Failure::Connect(_) => AttemptResult::connect_error,
            Failure::Tls(_) => AttemptResult::tls_error,
            Failure::Reset(_) => AttemptResult::reset,
            Failure::Timeout(_) => AttemptResult::timeout,
            Failure::Status { status, .. } if *status == StatusCode::TOO_MANY_REQUESTS => AttemptResult::rate_limited,
            Failure::Status { status, .. } if status.is_server_error() => AttemptResult::server_error,
            Failure::Status { .. } => AttemptResult::client_error,
            Failure::Malformed(_) => AttemptResult::malformed,
        }
    }

    /// A short description for logs and error messages.
    pub fn describe(&self) -> String {
        match self {
            Failure::Connect(e) => format!("connect failed: {e}"),
            Failure::Tls(e) => format!("TLS handshake failed: {e}"),
            Failure::Reset(e) => format!("connection closed early: {e}"),
            Failure::Timeout(what) => format!("no {what} in time"),
            Failure::Status { status, .. } => format!("upstream answered {status}"),
            Failure::Malformed(e) => format!("malformed answer: {e}"),
        }
    }
}

/// A usable answer.
#[derive(Debug)]
pub enum Success {
    /// A complete non-streamed body.
    Full {
        /// Status (2xx).
        status: StatusCode,
        /// Body.
        body: Bytes,
    },
    /// An open stream whose first events arrived.
    Stream {
        /// Events read so far (at least one).
        events: Vec<Event>,
        /// The parser with any partial event.
        parser: Parser,
        /// The rest of the upstream body.
        body: Incoming,
    },
}

/// What one attempt sends.
#[derive(Debug)]
pub struct Outgoing<'a> {
    /// Cluster base URL.
    pub base: &'a str,
    /// The cluster's targets, when its table worked them out.
    pub target: Option<&'a Target>,
    /// The cluster's upstream credential (`Authorization`), if it has one.
    pub auth: Option<&'a HeaderValue>,
    /// The route's `x-flotilla-deployment` value, which the member's routing matches on.
    pub member_route: Option<&'a HeaderValue>,
    /// Path.
    pub path: &'static str,
    /// JSON body.
    pub body: Bytes,
    /// Request id to propagate.
    pub request_id: &'a str,
    /// Streamed request.
    pub stream: bool,
    /// Deadline for the response head and first event (stream) or the whole body.
    pub deadline: Instant,
    /// Largest non-streamed body accepted.
    pub max_body: usize,
    /// Largest stream event accepted.
    pub max_event: usize,
    /// Collect each stream event's text (a stream that may be continued).
    pub collect: bool,
}

fn retry_after(h: &http::HeaderMap) -> Option<Duration> {
    h.get(header::RETRY_AFTER)?
        .to_str()
        .ok()?
        .trim()
        .parse::<f64>()
        .ok()
        .filter(|s| *s >= 0.0)
        .map(Duration::from_secs_f64)
}

fn classify(e: &hyper_util::client::legacy::Error) -> Failure {
    if let Some(tls) = crate::tls::tls_fault(e) {
        return Failure::Tls(tls);
    }
    let mut text = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(s) = src {
        text = format!("{text}: {s}");
        src = s.source();
    }
    if e.is_connect() { Failure::Connect(text) } else { Failure::Reset(text) }
}

/// Send one attempt and classify the answer.
pub async fn attempt(client: Conn<'_>, out: Outgoing<'_>) -> Result<Success, Failure> {
    let target = out.target.and_then(|t| Some((t.uri(out.path)?, &t.host)));
    let uri = match target {
        Some((u, _)) => u.clone(),
        None => format!("{}{}", out.base, out.path).parse::<Uri>().map_err(|e| Failure::Connect(e.to_string()))?,
    };
    let accept = if out.stream { "text/event-stream" } else { "application/json" };
    let request_id = HeaderValue::from_str(out.request_id).map_err(|e| Failure::Connect(e.to_string()))?;
    // Only these headers go upstream: the client's own `Authorization` (the gateway's key)
    // never reaches the engine; the cluster's credential does. No client header is forwarded,
    // so a client cannot name another deployment to the member's routing.
    // Built in place (a `Request::builder` moves itself through every header it is given).
    let mut req = Request::new(Full::new(out.body));
    *req.method_mut() = Method::POST;
    *req.uri_mut() = uri;
    let headers = req.headers_mut();
    headers.reserve(6);
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    headers.insert(header::ACCEPT, HeaderValue::from_static(accept));
    headers.insert(REQUEST_ID.clone(), request_id);
    if let Some((_, host)) = target {
        headers.insert(header::HOST, host.clone());
    }
    if let Some(auth) = out.auth {
        headers.insert(header::AUTHORIZATION, auth.clone());
    }
    if let Some(route) = out.member_route {
        headers.insert(DEPLOYMENT_HEADER, route.clone());
    }
    let deadline = tokio::time::Instant::from_std(out.deadline);
    let what = if out.stream { "first token" } else { "answer" };
    let resp = match tokio::time::timeout_at(deadline, client.request(req)).await {
        Err(_) => return Err(Failure::Timeout(what)),
        Ok(Err(e)) => return Err(classify(&e)),
        Ok(Ok(r)) => r,
    };
    let status = resp.status();
    if !status.is_success() {
        let ra = retry_after(resp.headers());
        let body = tokio::time::timeout(Duration::from_secs(2), Limited::new(resp.into_body(), 64 << 10).collect())
            .await
            .ok()
            .and_then(Result::ok)
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        return Err(Failure::Status { status, retry_after: ra, body });
    }
    if !out.stream {
        let body = match tokio::time::timeout_at(deadline, Limited::new(resp.into_body(), out.max_body).collect()).await
        {
            Err(_) => return Err(Failure::Timeout(what)),
            Ok(Err(e)) => return Err(Failure::Reset(e.to_string())),
            Ok(Ok(c)) => c.to_bytes(),
        };
        // Valid JSON whose first token is `{`, checked without building a tree.
        let object = body.trim_ascii_start().first() == Some(&b'{');
        if object && serde_json::from_slice::<serde::de::IgnoredAny>(&body).is_ok() {
            return Ok(Success::Full { status, body });
        }
        return Err(Failure::Malformed("the body is not a JSON object".into()));
    }
    let mut body = resp.into_body();
    let mut parser = Parser::new(out.max_event).collecting(out.collect);
    loop {
        let frame = match tokio::time::timeout_at(deadline, body.frame()).await {
            Err(_) => return Err(Failure::Timeout(what)),
            Ok(None) => return Err(Failure::Reset("the stream ended before its first event".into())),
            Ok(Some(Err(e))) => return Err(Failure::Reset(e.to_string())),
            Ok(Some(Ok(f))) => f,
        };
        let Ok(data) = frame.into_data() else { continue };
        let events = parser.push(&data);
        match events.first() {
            Some(Event::Malformed) => return Err(Failure::Malformed("the first stream event does not parse".into())),
            Some(Event::Oversized) => {
                return Err(Failure::Malformed(format!(
                    "the first stream event is longer than {} bytes",
                    out.max_event
                )));
            }
            _ => {}
        }
        if !events.is_empty() {
            return Ok(Success::Stream { events, parser, body });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_target_names_each_api_and_the_host_as_the_client_would() {
        let t = Target::new("http://10.0.0.1:8000").unwrap();
        assert_eq!(t.uri("/v1/chat/completions").unwrap(), "http://10.0.0.1:8000/v1/chat/completions");
        assert_eq!(t.uri("/v1/embeddings").unwrap(), "http://10.0.0.1:8000/v1/embeddings");
        assert_eq!(t.uri("/v1/other"), None, "only the APIs the gateway serves");
        assert_eq!(t.host, "10.0.0.1:8000");
        let prefixed = Target::new("https://gw.example/inference").unwrap();
        assert_eq!(prefixed.uri("/v1/completions").unwrap(), "https://gw.example/inference/v1/completions");
        assert_eq!(prefixed.host, "gw.example");
        // The scheme's own port is left out, another one kept, as hyper's client does.
        assert_eq!(Target::new("http://e:80").unwrap().host, "e");
        assert_eq!(Target::new("https://e:443").unwrap().host, "e");
        assert_eq!(Target::new("https://e:80").unwrap().host, "e:80");
        assert_eq!(Target::new("http://[::1]:9").unwrap().host, "[::1]:9");
        assert!(Target::new("not a url").is_none(), "the attempt parses it and reports the error");
    }
}
