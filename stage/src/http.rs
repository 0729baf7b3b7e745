//! The HTTP client every source uses: hyper over rustls (native roots, ring), plain HTTP for
//! loopback endpoints. Credentials a request carries (`Authorization`, the S3 session token, …)
//! belong to one origin — scheme, host and port of the source's configured endpoint — and are
//! removed before any hop to another origin: a redirect to a CDN or blob store, a downgrade to
//! plain HTTP, or a request built for another host. It follows redirects, maps statuses to
//! [`StageError`]s, and retries what is retryable with capped exponential backoff.

use std::future::Future;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode, Uri, header};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper_util::client::legacy::{Client, connect::HttpConnector};
use hyper_util::rt::TokioExecutor;

use crate::error::StageError;

/// Redirects followed before giving up.
const MAX_REDIRECTS: usize = 10;
/// Largest listing or manifest body read into memory.
const MAX_SMALL_BODY: usize = 64 << 20;
/// Headers that carry credentials: never sent outside their origin.
const CREDENTIAL_HEADERS: [&str; 4] = ["authorization", "proxy-authorization", "cookie", "x-amz-security-token"];

/// Scheme, host and port: where credentials may go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Origin {
    scheme: String,
    host: String,
    port: u16,
}

impl Origin {
    /// The origin of an absolute URI (the port defaulted from the scheme).
    pub fn of(uri: &Uri) -> Option<Origin> {
        let scheme = uri.scheme_str()?.to_ascii_lowercase();
        let default = match scheme.as_str() {
            "http" => 80,
            "https" => 443,
            _ => return None,
        };
        let host = uri.host()?.to_ascii_lowercase();
        Some(Origin { port: uri.port_u16().unwrap_or(default), scheme, host })
    }

    /// The origin of an endpoint URL.
    pub fn parse(endpoint: &str) -> Result<Origin, StageError> {
        let uri: Uri = endpoint.parse().map_err(|e| StageError::InvalidSource(format!("endpoint {endpoint}: {e}")))?;
        Origin::of(&uri)
            .ok_or_else(|| StageError::InvalidSource(format!("endpoint {endpoint}: give an http:// or https:// URL")))
    }
}

impl std::fmt::Display for Origin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}://{}:{}", self.scheme, self.host, self.port)
    }
}

/// How often and how patiently to retry.
#[derive(Clone, Copy, Debug)]
pub struct RetryPolicy {
    /// Attempts after the first.
    pub retries: u32,
    /// Backoff before the first retry; doubles per retry up to 30 s.
    pub backoff: Duration,
    /// Longest wait for response headers or for the next piece of a body.
    pub read_timeout: Duration,
}

/// One GET to send: a URI and headers (the body is always empty).
#[derive(Clone, Debug)]
pub struct Req {
    /// Where.
    pub uri: Uri,
    /// With what.
    pub headers: HeaderMap,
    /// The origin the credential headers may go to; the request URI's own when unset.
    pub credentials_origin: Option<Origin>,
}

impl Req {
    /// A GET of `uri` with no headers.
    pub fn get(uri: &str) -> Result<Req, StageError> {
        let uri: Uri = uri.parse().map_err(|e| StageError::InvalidSource(format!("{uri}: {e}")))?;
        Ok(Req { uri, headers: HeaderMap::new(), credentials_origin: None })
    }

    /// Adds `Authorization: <value>`, to be sent only to `endpoint`'s origin.
    pub fn credential(mut self, endpoint: &str, value: &str) -> Result<Req, StageError> {
        self.credentials_origin = Some(Origin::parse(endpoint)?);
        self.header(header::AUTHORIZATION, value)
    }

    /// Adds a header; values that are not valid header text are an invalid source.
    pub fn header(mut self, name: header::HeaderName, value: &str) -> Result<Req, StageError> {
        let v = value.parse().map_err(|_| StageError::InvalidSource(format!("unusable {name} header value")))?;
        self.headers.insert(name, v);
        Ok(self)
    }
}

/// The shared client.
#[derive(Clone)]
pub struct Http {
    client: Client<hyper_rustls::HttpsConnector<HttpConnector>, Empty<Bytes>>,
    /// Retry and timeout settings.
    pub policy: RetryPolicy,
}

impl Http {
    /// A client trusting the system's root certificates (none needed for plain-HTTP endpoints).
    pub fn new(policy: RetryPolicy) -> Result<Http, StageError> {
        let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        roots.add_parsable_certificates(rustls_native_certs_load());
        let tls = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| StageError::unavailable("TLS setup", e))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        let mut http = HttpConnector::new();
        http.enforce_http(false);
        http.set_connect_timeout(Some(policy.read_timeout));
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls)
            .https_or_http()
            .enable_http1()
            .wrap_connector(http);
        Ok(Http { client: Client::builder(TokioExecutor::new()).build(connector), policy })
    }

    /// Sends one GET, following redirects; returns whatever final response arrived. Credential
    /// headers are removed before the first hop outside their origin, and stay removed.
    pub async fn send(&self, req: &Req) -> Result<Response<Incoming>, StageError> {
        let mut uri = req.uri.clone();
        let mut headers = req.headers.clone();
        let allowed = req.credentials_origin.clone().or_else(|| Origin::of(&req.uri));
        for _ in 0..=MAX_REDIRECTS {
            if Origin::of(&uri) != allowed {
                for name in CREDENTIAL_HEADERS {
                    headers.remove(name);
                }
            }
            let mut builder = Request::builder().method(Method::GET).uri(uri.clone());
            if let Some(h) = builder.headers_mut() {
                h.extend(headers.clone());
            }
            let request = builder.body(Empty::new()).map_err(|e| StageError::InvalidSource(format!("{uri}: {e}")))?;
            let response = tokio::time::timeout(self.policy.read_timeout, self.client.request(request))
                .await
                .map_err(|_| StageError::unavailable(redact(&uri), "no response within the read timeout"))?
                .map_err(|e| StageError::unavailable(redact(&uri), error_chain(&e)))?;
            if !response.status().is_redirection() || response.status() == StatusCode::NOT_MODIFIED {
                return Ok(response);
            }
            // A redirect without a Location (S3's PermanentRedirect for another region) is an answer.
            let Some(location) = response.headers().get(header::LOCATION).and_then(|v| v.to_str().ok()) else {
                return Ok(response);
            };
            let next = resolve_reference(&uri, location)
                .map_err(|e| StageError::unavailable(redact(&uri), format!("unusable redirect Location: {e}")))?;
            if next.authority() != uri.authority() {
                headers.remove(header::HOST);
            }
            uri = next;
        }
        Err(StageError::unavailable(redact(&req.uri), "too many redirects"))
    }

    /// Sends `make()` until it succeeds with a 2xx or fails for good; returns the whole (small) body.
    pub async fn get_bytes<F>(&self, make: F) -> Result<(HeaderMap, Bytes), StageError>
    where
        F: Fn() -> Result<Req, StageError>,
    {
        self.retry(|| async {
            let req = make()?;
            let response = self.send(&req).await?;
            let response = check_status(response, &req.uri).await?;
            let headers = response.headers().clone();
            let body = self.read_small(response, &req.uri).await?;
            Ok((headers, body))
        })
        .await
    }

    /// Reads a small body whole, with the read timeout and a size bound.
    pub async fn read_small(&self, response: Response<Incoming>, uri: &Uri) -> Result<Bytes, StageError> {
        let limited = http_body_util::Limited::new(response.into_body(), MAX_SMALL_BODY);
        let collected = tokio::time::timeout(self.policy.read_timeout, limited.collect())
            .await
            .map_err(|_| StageError::unavailable(redact(uri), "body not received within the read timeout"))?
            .map_err(|e| StageError::unavailable(redact(uri), e))?;
        Ok(collected.to_bytes())
    }

    /// Runs `attempt` until it succeeds, fails with a non-retryable error, or the retries run out.
    pub async fn retry<T, F, Fut>(&self, mut attempt: F) -> Result<T, StageError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, StageError>>,
    {
        let mut backoff = self.policy.backoff;
        let mut left = self.policy.retries;
        loop {
            match attempt().await {
                Err(e) if e.is_retryable() && left > 0 => {
                    eprintln!("flotilla-stage: {e}; retrying in {backoff:?} ({left} retries left)");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                    left -= 1;
                }
                other => return other,
            }
        }
    }
}

/// Maps a non-2xx response to its error (reading a little of the body for the message); 2xx passes.
pub async fn check_status(response: Response<Incoming>, uri: &Uri) -> Result<Response<Incoming>, StageError> {
    let status = response.status();
    if status.is_success() {
        return Ok(response);
    }
    let url = redact(uri);
    // Hugging Face answers 401 for a repository that does not exist or is private, and says which.
    let hf_code = response.headers().get("x-error-code").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let region_hint = response.headers().get("x-amz-bucket-region").and_then(|v| v.to_str().ok()).map(str::to_owned);
    let body: String = error_body(response).await.trim().chars().take(300).collect();
    let mut detail = if body.is_empty() { String::new() } else { format!(": {body}") };
    if let Some(region) = region_hint {
        detail.push_str(&format!("; the bucket is in region {region}: set --s3-region"));
    }
    Err(match (status.as_u16(), hf_code.as_deref()) {
        (_, Some("RepoNotFound" | "RevisionNotFound" | "EntryNotFound")) => {
            StageError::NotFound { what: format!("{url} (or it is private and the token has no access)") }
        }
        (_, Some("GatedRepo")) | (401 | 403, _) => StageError::unauthorized(url, status.as_u16()),
        (404, _) => StageError::NotFound { what: url },
        (408 | 429, _) | (500..=599, _) => StageError::unavailable(url, format!("HTTP {}{detail}", status.as_u16())),
        (s, _) => StageError::Rejected { url, status: s, detail },
    })
}

/// Up to 4 KiB of an error response's body, waiting at most 5 s (empty when none arrives).
pub async fn error_body(response: Response<Incoming>) -> String {
    tokio::time::timeout(Duration::from_secs(5), http_body_util::Limited::new(response.into_body(), 4096).collect())
        .await
        .ok()
        .and_then(Result::ok)
        .map(|c| String::from_utf8_lossy(&c.to_bytes()).into_owned())
        .unwrap_or_default()
}

/// The URI without its query (which may carry presigned credentials), for messages.
pub fn redact(uri: &Uri) -> String {
    match (uri.scheme_str(), uri.authority()) {
        (Some(s), Some(a)) => format!("{s}://{a}{}", uri.path()),
        _ => uri.path().to_string(),
    }
}

/// Resolves a reference (a redirect's `Location`, a `Link` target) against the URI it came from.
pub fn resolve_reference(base: &Uri, reference: &str) -> Result<Uri, String> {
    if reference.starts_with("http://") || reference.starts_with("https://") {
        return reference.parse().map_err(|e: http::uri::InvalidUri| e.to_string());
    }
    let scheme = base.scheme_str().unwrap_or("https");
    let authority = base.authority().map(|a| a.as_str()).unwrap_or_default();
    let path = if reference.starts_with('/') {
        reference.to_string()
    } else {
        let dir = base.path().rsplit_once('/').map(|(d, _)| d).unwrap_or_default();
        format!("{dir}/{reference}")
    };
    format!("{scheme}://{authority}{path}").parse().map_err(|e: http::uri::InvalidUri| e.to_string())
}

/// The error and its causes on one line.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        cur = c.source();
    }
    s
}

/// The system's root certificates; none (with a warning) when the system has none.
fn rustls_native_certs_load() -> Vec<rustls::pki_types::CertificateDer<'static>> {
    let result = rustls_native_certs::load_native_certs();
    if result.certs.is_empty() {
        eprintln!("flotilla-stage: no system root certificates found; https sources will fail verification");
    }
    result.certs
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn locations_resolve_against_the_answering_uri() {
        let base: Uri = "http://127.0.0.1:8080/org/m/resolve/abc/dir/f.bin?x=1".parse().unwrap();
        assert_eq!(resolve_reference(&base, "/cdn/f?sig=2").unwrap().to_string(), "http://127.0.0.1:8080/cdn/f?sig=2");
        assert_eq!(
            resolve_reference(&base, "g.bin").unwrap().to_string(),
            "http://127.0.0.1:8080/org/m/resolve/abc/dir/g.bin"
        );
        assert_eq!(resolve_reference(&base, "https://cdn.example/x").unwrap().to_string(), "https://cdn.example/x");
        assert_eq!(redact(&base), "http://127.0.0.1:8080/org/m/resolve/abc/dir/f.bin");
    }

    #[test]
    fn origins_are_scheme_host_and_port() {
        let o = |u: &str| Origin::of(&u.parse().unwrap());
        assert_eq!(o("https://HF.co/api"), o("https://hf.co:443/x"));
        assert_ne!(o("https://hf.co/api"), o("http://hf.co/api"), "a downgrade is another origin");
        assert_ne!(o("http://127.0.0.1:1/"), o("http://127.0.0.1:2/"), "so is another port");
        assert_ne!(o("https://hf.co/"), o("https://cdn.hf.co/"));
        assert_eq!(o("http://127.0.0.1:8080/x").unwrap().to_string(), "http://127.0.0.1:8080");
        assert!(Origin::parse("ftp://x").is_err() && Origin::parse("not a url").is_err());
    }
}
