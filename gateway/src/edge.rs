//! What every request meets first. [`Edge`], a layer on every route of `http::app` (API or not,
//! wrong method and unknown path included): more than `--max-headers` header fields get 431
//! before any routing (the server's parser itself stops at twice the limit with a bare 431;
//! `--max-header-bytes` bounds the head), and every request gets a request id, the client's
//! `x-request-id` when valid, else a new one, which its answer carries back. [`Front`], the
//! service the server runs: a `POST` to an inference API goes through that same edge straight to
//! its handler (`http::infer`), everything else through `http::app`'s router. Both run on every
//! request, so neither boxes nor clones more than it must (docs/benchmarks.md, "Gateway beside
//! nginx").

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{SystemTime, UNIX_EPOCH};

use axum::extract::{Request, State};
use axum::http::{HeaderName, HeaderValue, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use tower::ServiceExt;

use crate::metrics::Endpoint;
use crate::pick::hash;
use crate::{AppState, GatewayError};

/// The request id of the request being served.
#[derive(Clone, Debug)]
pub struct RequestId(pub String);

/// The header every answer carries its request id in.
static REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// A new request id: 32 hex digits from the clock and a sequence number.
pub(crate) fn new_id() -> String {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let t = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or_default();
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let mut id = String::with_capacity(32);
    for h in [hash(t, &n.to_le_bytes()), hash(n, &t.to_le_bytes())] {
        for shift in (0..16).rev() {
            id.push(char::from(b"0123456789abcdef"[((h >> (shift * 4)) & 0xf) as usize]));
        }
    }
    id
}

/// The client's request id when it is one the gateway accepts (1 to 128 of `A-Za-z0-9-_.:`).
fn client_request_id(headers: &axum::http::HeaderMap) -> Option<(&HeaderValue, &str)> {
    let v = headers.get(&REQUEST_ID)?;
    let s = v.to_str().ok()?;
    let valid = !s.is_empty() && s.len() <= 128 && s.bytes().all(|c| c.is_ascii_alphanumeric() || b"-_.:".contains(&c));
    valid.then_some((v, s))
}

/// A request with more header fields than `--max-headers`, and its request id.
struct TooManyHeaders {
    count: usize,
    limit: usize,
    id: Option<HeaderValue>,
}

impl TooManyHeaders {
    /// Its answer: 431, with its request id.
    fn answer(self) -> Response {
        leave(GatewayError::TooManyHeaders { count: self.count, limit: self.limit }.into_response(), self.id)
    }
}

/// The edge going in: `req` gets its request id (as an extension, for the handler) and the
/// header value its answer carries; `Err` when it has too many header fields.
fn enter(req: &mut Request, max_headers: usize) -> Result<Option<HeaderValue>, TooManyHeaders> {
    let (id, header) = match client_request_id(req.headers()) {
        Some((v, s)) => (s.to_string(), Some(v.clone())),
        None => {
            let id = new_id();
            let header = HeaderValue::from_str(&id).ok();
            (id, header)
        }
    };
    let count = req.headers().len();
    if count > max_headers {
        return Err(TooManyHeaders { count, limit: max_headers, id: header });
    }
    req.extensions_mut().insert(RequestId(id));
    Ok(header)
}

/// The edge going out: the answer carries the request id.
fn leave(mut resp: Response, id: Option<HeaderValue>) -> Response {
    if let Some(v) = id {
        resp.headers_mut().insert(REQUEST_ID.clone(), v);
    }
    resp
}

/// The edge as a layer on every route of the router.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Edge {
    pub(crate) max_headers: usize,
}

impl<S> tower::Layer<S> for Edge {
    type Service = EdgeService<S>;
    fn layer(&self, inner: S) -> EdgeService<S> {
        EdgeService { inner, max_headers: self.max_headers }
    }
}

/// [`Edge`] around one route.
#[derive(Clone, Debug)]
pub(crate) struct EdgeService<S> {
    inner: S,
    max_headers: usize,
}

impl<S> tower::Service<Request> for EdgeService<S>
where
    S: tower::Service<Request, Response = Response, Error = Infallible>,
    S::Future: Unpin,
{
    type Response = Response;
    type Error = Infallible;
    type Future = EdgeFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        match enter(&mut req, self.max_headers) {
            Ok(id) => EdgeFuture { inner: Some(self.inner.call(req)), refused: None, id },
            Err(refused) => EdgeFuture { inner: None, refused: Some(refused.answer()), id: None },
        }
    }
}

/// The answer of an [`EdgeService`], its request id added.
pub(crate) struct EdgeFuture<F> {
    inner: Option<F>,
    refused: Option<Response>,
    id: Option<HeaderValue>,
}

impl<F: Future<Output = Result<Response, Infallible>> + Unpin> Future for EdgeFuture<F> {
    type Output = Result<Response, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        let resp = match (this.refused.take(), this.inner.as_mut()) {
            (Some(r), _) => r,
            (None, Some(f)) => match Pin::new(f).poll(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(r)) => r,
                Poll::Ready(Err(e)) => match e {},
            },
            // Polled again after it completed: nothing is left to answer.
            (None, None) => StatusCode::INTERNAL_SERVER_ERROR.into_response(),
        };
        this.inner = None;
        Poll::Ready(Ok(leave(resp, this.id.take())))
    }
}

/// The inference API a `POST` to `path` asks for, if any (the paths `http::app` routes to
/// `http::infer`).
fn inference(method: &Method, path: &str) -> Option<Endpoint> {
    if method != Method::POST {
        return None;
    }
    [Endpoint::chat_completions, Endpoint::completions, Endpoint::embeddings].into_iter().find(|e| e.path() == path)
}

/// The service the server runs: `http::app`'s router, except that a `POST` to an inference API
/// goes through the edge straight to its handler, as the router would send it.
#[derive(Clone, Debug)]
pub struct Front {
    st: Arc<AppState>,
    router: axum::Router,
}

impl Front {
    /// The server's service for `st`.
    pub fn new(st: Arc<AppState>) -> Self {
        Front { router: crate::http::app(st.clone()), st }
    }
}

impl tower::Service<Request> for Front {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, mut req: Request) -> Self::Future {
        let Some(endpoint) = inference(req.method(), req.uri().path()) else {
            return Box::pin(self.router.clone().oneshot(req));
        };
        let id = match enter(&mut req, self.st.cfg.max_headers) {
            Ok(id) => id,
            Err(refused) => return Box::pin(std::future::ready(Ok(refused.answer()))),
        };
        let st = self.st.clone();
        Box::pin(async move { Ok(leave(crate::http::infer(State(st), endpoint, req).await, id)) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_inference_apis_are_the_posts_to_their_paths() {
        assert_eq!(inference(&Method::POST, "/v1/chat/completions"), Some(Endpoint::chat_completions));
        assert_eq!(inference(&Method::POST, "/v1/completions"), Some(Endpoint::completions));
        assert_eq!(inference(&Method::POST, "/v1/embeddings"), Some(Endpoint::embeddings));
        assert_eq!(inference(&Method::GET, "/v1/chat/completions"), None, "the router answers 405");
        assert_eq!(inference(&Method::POST, "/v1/chat/completions/"), None, "the router answers 404");
        assert_eq!(inference(&Method::POST, "/v1/models"), None);
    }

    #[test]
    fn request_ids_are_the_clients_when_valid_else_new() {
        let mut h = axum::http::HeaderMap::new();
        assert!(client_request_id(&h).is_none());
        h.insert(&REQUEST_ID, HeaderValue::from_static("abc-1_2.3:4"));
        assert_eq!(client_request_id(&h).map(|(_, s)| s), Some("abc-1_2.3:4"));
        h.insert(&REQUEST_ID, HeaderValue::from_static("a b"));
        assert!(client_request_id(&h).is_none(), "a space is not accepted");
        h.insert(&REQUEST_ID, HeaderValue::from_str(&"x".repeat(129)).unwrap());
        assert!(client_request_id(&h).is_none(), "too long");
        let (a, b) = (new_id(), new_id());
        assert!(a.len() == 32 && a.bytes().all(|c| c.is_ascii_hexdigit()) && a != b, "{a} {b}");
    }
}
