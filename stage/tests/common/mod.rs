//! A loopback server the staging tests start themselves: a fake Hugging Face Hub (revision,
//! paginated tree and resolve APIs with LFS redirects to a "CDN" path) and a tiny OCI registry
//! (manifest, blobs, optional bearer-token flow), with knobs to cut a connection mid-file, send
//! fewer bytes than promised, lie about sizes or digests, demand a token, and point its
//! next-page links at another server. It records every file request (path, `Range`,
//! `Authorization`, bytes it sent) and every request's path and `Authorization`, so tests can
//! assert on them.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod moto;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use flotilla_apis::stage::{StageResult, hex};
use flotilla_stage::{Options, RetryPolicy, SourceConfig};
use sha2::{Digest, Sha256};

pub const REPO: &str = "acme/tiny-llm";
pub const COMMIT: &str = "0123456789abcdef0123456789abcdef01234567";
pub const OCI_REPO: &str = "models/tiny";
pub const OCI_TAG: &str = "v1";
pub const OCI_TOKEN: &str = "oci-secret";

pub fn sha(bytes: &[u8]) -> String {
    hex(&Sha256::digest(bytes))
}

/// One file request the server answered.
#[derive(Clone, Debug)]
pub struct Served {
    pub path: String,
    pub range: Option<String>,
    pub auth: Option<String>,
    pub status: u16,
    pub bytes: usize,
}

#[derive(Default)]
pub struct State {
    /// HF files by path (also the OCI layers, by title).
    pub files: BTreeMap<String, Vec<u8>>,
    /// Files listed as LFS (with their SHA-256) and redirected to the CDN path.
    pub lfs: BTreeSet<String>,
    /// LFS SHA-256 to list instead of the true one.
    pub wrong_sha: BTreeMap<String, String>,
    /// Size to list instead of the true one.
    pub listed_size: BTreeMap<String, u64>,
    /// Bearer token the HF API and resolve demand.
    pub token: Option<String>,
    /// Cut the connection after this many bytes of this file, on its first GET only.
    pub cut_once: Option<(String, usize)>,
    /// Never send bytes of this file past this offset (Content-Length still promises all).
    pub short: Option<(String, usize)>,
    /// Send this many bytes of this file, then pause this long before the rest.
    pub pause: Option<(String, usize, Duration)>,
    /// Ignore `Range` headers (answer 200 with the whole file), as some servers do.
    pub ignore_range: bool,
    /// Tree entries per page.
    pub page_size: usize,
    /// Base URL the tree's `Link: rel="next"` points at (this server when unset).
    pub next_page_base: Option<String>,
    /// The OCI registry demands a token from its /token endpoint.
    pub oci_auth: bool,
    /// OCI layer titles whose blob is served with different bytes than the digest says.
    pub oci_corrupt: BTreeSet<String>,
    /// Answer any `sha256:` manifest reference with the tag's manifest (a misbehaving registry).
    pub oci_any_digest: bool,
    pub served: Vec<Served>,
    /// Every request received: path and `Authorization`, whatever was asked for.
    pub seen: Vec<(String, Option<String>)>,
    pub addr: Option<SocketAddr>,
}

pub type Shared = Arc<Mutex<State>>;

pub fn state(files: &[(&str, &[u8])]) -> State {
    State {
        files: files.iter().map(|(p, b)| (p.to_string(), b.to_vec())).collect(),
        page_size: 100,
        ..State::default()
    }
}

/// Starts the server; it runs until the test's runtime ends.
pub async fn start(state: State) -> (String, Shared) {
    let shared = Arc::new(Mutex::new(state));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    shared.lock().unwrap().addr = Some(addr);
    let s = shared.clone();
    let app = axum::Router::new().fallback(move |req: Request<Body>| {
        let s = s.clone();
        async move { handle(&s, req) }
    });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), shared)
}

fn handle(s: &Shared, req: Request<Body>) -> Response<Body> {
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    let headers = req.headers().clone();
    let mut st = s.lock().unwrap();
    let auth = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).map(str::to_owned);
    st.seen.push((path.clone(), auth));
    if let Some(rest) = path.strip_prefix("/v2/") {
        return oci(&mut st, rest, &headers);
    }
    if path == "/token" {
        return json(StatusCode::OK, &serde_json::json!({ "token": OCI_TOKEN }));
    }
    let authorized = st.token.as_ref().is_none_or(|t| bearer(&headers).as_deref() == Some(t.as_str()));
    if let Some(rest) = path.strip_prefix("/cdn/") {
        // Presigned CDN URL: no token needed, and none should be sent to another host.
        return serve_file(&mut st, rest, &headers);
    }
    if let Some(rest) = path.strip_prefix("/api/models/") {
        let Some(rest) = rest.strip_prefix(&format!("{REPO}/")) else {
            // Like the Hub: an unknown (or private) repository is a 401 with an error code.
            return error(StatusCode::UNAUTHORIZED, Some("RepoNotFound"));
        };
        if !authorized {
            return error(StatusCode::UNAUTHORIZED, None);
        }
        if let Some(rev) = rest.strip_prefix("revision/") {
            if rev != "main" && rev != COMMIT {
                return error(StatusCode::NOT_FOUND, Some("RevisionNotFound"));
            }
            return json(StatusCode::OK, &serde_json::json!({ "id": REPO, "sha": COMMIT, "siblings": [] }));
        }
        if rest == format!("tree/{COMMIT}") {
            assert!(query.contains("recursive=true"), "{query}");
            let cursor: usize =
                query.split('&').find_map(|p| p.strip_prefix("cursor=")).map_or(0, |c| c.parse().unwrap());
            let entries: Vec<_> = st
                .files
                .iter()
                .map(|(p, b)| {
                    let size = st.listed_size.get(p).copied().unwrap_or(b.len() as u64);
                    let mut e = serde_json::json!({ "type": "file", "oid": "deadbeef", "size": size, "path": p });
                    if st.lfs.contains(p) {
                        let oid = st.wrong_sha.get(p).cloned().unwrap_or_else(|| sha(b));
                        e["lfs"] = serde_json::json!({ "oid": oid, "size": size, "pointerSize": 134 });
                    }
                    e
                })
                .collect();
            let mut all = vec![serde_json::json!({ "type": "directory", "oid": "x", "size": 0, "path": "sub" })];
            all.extend(entries);
            let page: Vec<_> = all.iter().skip(cursor).take(st.page_size).cloned().collect();
            let mut r = json(StatusCode::OK, &serde_json::Value::Array(page));
            if cursor + st.page_size < all.len() {
                let base = st.next_page_base.clone().unwrap_or_else(|| format!("http://{}", st.addr.unwrap()));
                let next = format!(
                    "<{base}/api/models/{REPO}/tree/{COMMIT}?recursive=true&cursor={}>; rel=\"next\"",
                    cursor + st.page_size
                );
                r.headers_mut().insert(header::LINK, HeaderValue::from_str(&next).unwrap());
            }
            return r;
        }
        return error(StatusCode::NOT_FOUND, Some("EntryNotFound"));
    }
    if let Some(rest) = path.strip_prefix(&format!("/{REPO}/resolve/{COMMIT}/")) {
        if !authorized {
            return error(StatusCode::UNAUTHORIZED, None);
        }
        if st.lfs.contains(rest) {
            // Another authority (same server): the client must not carry the token there.
            let cdn = format!("http://localhost:{}/cdn/{rest}?X-Amz-Signature=abc", st.addr.unwrap().port());
            let mut r = Response::new(Body::empty());
            *r.status_mut() = StatusCode::FOUND;
            r.headers_mut().insert(header::LOCATION, HeaderValue::from_str(&cdn).unwrap());
            return r;
        }
        return serve_file(&mut st, rest, &headers);
    }
    error(StatusCode::NOT_FOUND, None)
}

fn bearer(h: &HeaderMap) -> Option<String> {
    h.get(header::AUTHORIZATION)?.to_str().ok()?.strip_prefix("Bearer ").map(str::to_owned)
}

fn json(status: StatusCode, v: &serde_json::Value) -> Response<Body> {
    let mut r = Response::new(Body::from(v.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn error(status: StatusCode, code: Option<&'static str>) -> Response<Body> {
    let mut r = json(status, &serde_json::json!({ "error": "nope" }));
    if let Some(c) = code {
        r.headers_mut().insert("x-error-code", HeaderValue::from_static(c));
    }
    r
}

/// Serves a file (or a range of it) with the configured misbehaviour, and records it.
fn serve_file(st: &mut State, path: &str, headers: &HeaderMap) -> Response<Body> {
    let Some(bytes) = st.files.get(path).cloned() else { return error(StatusCode::NOT_FOUND, None) };
    serve_bytes(st, path, bytes, headers)
}

fn serve_bytes(st: &mut State, path: &str, bytes: Vec<u8>, headers: &HeaderMap) -> Response<Body> {
    let asked = headers.get(header::RANGE).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let range = if st.ignore_range { None } else { asked.clone() };
    let auth = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok()).map(str::to_owned);
    let start: usize =
        range.as_deref().and_then(|r| r.strip_prefix("bytes=")?.strip_suffix('-')?.parse().ok()).unwrap_or(0);
    let len = bytes.len();
    if start > len || (start == len && range.is_some()) {
        st.served.push(Served { path: path.into(), range, auth, status: 416, bytes: 0 });
        return error(StatusCode::RANGE_NOT_SATISFIABLE, None);
    }
    let promised = len - start;
    let mut send = promised;
    let mut cut = false;
    if let Some((p, n)) = st.cut_once.clone()
        && p == path
    {
        st.cut_once = None;
        send = n.saturating_sub(start).min(promised);
        cut = true;
    }
    if let Some((p, n)) = &st.short
        && p == path
    {
        send = send.min(n.saturating_sub(start));
    }
    let status = if range.is_some() { StatusCode::PARTIAL_CONTENT } else { StatusCode::OK };
    st.served.push(Served { path: path.into(), range: asked, auth, status: status.as_u16(), bytes: send });
    let chunk = bytes::Bytes::copy_from_slice(&bytes[start..start + send]);
    let mut items: Vec<(Duration, Result<bytes::Bytes, std::io::Error>)> = vec![(Duration::ZERO, Ok(chunk))];
    if let Some((p, n, pause)) = st.pause.clone()
        && p == path
        && n > start
        && n < start + send
    {
        let all = items.remove(0).1.unwrap();
        items.push((Duration::ZERO, Ok(all.slice(..n - start))));
        items.push((pause, Ok(all.slice(n - start..))));
    }
    if cut {
        // The pause lets hyper flush the headers and the first bytes before the connection is cut.
        items.push((Duration::from_millis(100), Err(std::io::Error::other("connection cut by the test"))));
    }
    let stream = futures_util::StreamExt::then(futures_util::stream::iter(items), |(pause, item)| async move {
        tokio::time::sleep(pause).await;
        item
    });
    let body = Body::from_stream(stream);
    let mut r = Response::new(body);
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_LENGTH, HeaderValue::from(promised));
    if range.is_some() {
        let v = format!("bytes {start}-{}/{len}", len - 1);
        r.headers_mut().insert(header::CONTENT_RANGE, HeaderValue::from_str(&v).unwrap());
    }
    r
}

/// The OCI image manifest of the registry's one tag: every file a layer titled by its path.
pub fn oci_manifest(st: &State) -> Vec<u8> {
    let layers: Vec<_> = st
        .files
        .iter()
        .map(|(p, b)| {
            serde_json::json!({
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": format!("sha256:{}", sha(b)),
                "size": b.len(),
                "annotations": { "org.opencontainers.image.title": p }
            })
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "artifactType": "application/vnd.flotilla.model.v1",
        "config": { "mediaType": "application/vnd.oci.empty.v1+json", "digest": format!("sha256:{}", sha(b"{}")), "size": 2 },
        "layers": layers
    }))
    .unwrap()
}

fn oci(st: &mut State, rest: &str, headers: &HeaderMap) -> Response<Body> {
    if st.oci_auth && bearer(headers).as_deref() != Some(OCI_TOKEN) {
        let mut r = error(StatusCode::UNAUTHORIZED, None);
        let challenge = format!(
            "Bearer realm=\"http://{}/token\",service=\"fake\",scope=\"repository:{OCI_REPO}:pull\"",
            st.addr.unwrap()
        );
        r.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_str(&challenge).unwrap());
        return r;
    }
    let Some(rest) = rest.strip_prefix(&format!("{OCI_REPO}/")) else { return error(StatusCode::NOT_FOUND, None) };
    let manifest = oci_manifest(st);
    if let Some(reference) = rest.strip_prefix("manifests/") {
        let digest = format!("sha256:{}", sha(&manifest));
        if reference != OCI_TAG && reference != digest && !(st.oci_any_digest && reference.starts_with("sha256:")) {
            return error(StatusCode::NOT_FOUND, None);
        }
        let mut r = Response::new(Body::from(manifest));
        r.headers_mut()
            .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/vnd.oci.image.manifest.v1+json"));
        r.headers_mut().insert("docker-content-digest", HeaderValue::from_str(&digest).unwrap());
        return r;
    }
    if let Some(digest) = rest.strip_prefix("blobs/sha256:") {
        let Some((title, bytes)) = st.files.iter().find(|(_, b)| sha(b) == digest).map(|(p, b)| (p.clone(), b.clone()))
        else {
            return error(StatusCode::NOT_FOUND, None);
        };
        let bytes = if st.oci_corrupt.contains(&title) { bytes.iter().map(|b| b ^ 1).collect() } else { bytes };
        return serve_bytes(st, &title, bytes, headers);
    }
    error(StatusCode::NOT_FOUND, None)
}

/// Options for a test run against `endpoint`, staging into `dest`.
pub fn options(source: &str, endpoint: &str, dest: &Path) -> Options {
    Options {
        source: source.into(),
        dest: dest.to_path_buf(),
        expected_digest: None,
        config: SourceConfig {
            hf_endpoint: Some(endpoint.into()),
            oci_endpoint: Some(endpoint.into()),
            ..SourceConfig::default()
        },
        policy: RetryPolicy { retries: 2, backoff: Duration::from_millis(10), read_timeout: Duration::from_secs(10) },
        concurrency: 3,
        progress_interval: Duration::from_secs(3600),
    }
}

/// Runs a stage, collecting progress, and writes the result file as the binary does.
pub async fn run(opts: &Options) -> StageResult {
    let mut progress = Vec::new();
    let result = flotilla_stage::run(opts, &mut |p| progress.push(p)).await;
    flotilla_stage::write_result(&opts.dest, &result).await.unwrap();
    result
}

/// Asserts a run left no manifest and a Failed result file, and returns that result.
pub fn assert_not_ready(dest: &Path) -> StageResult {
    assert!(!dest.join(".flotilla/manifest.json").exists(), "a failed run must leave no manifest");
    let r: StageResult = serde_json::from_slice(&std::fs::read(dest.join(".flotilla/result.json")).unwrap()).unwrap();
    assert_eq!(r.phase, flotilla_apis::cache::CachePhase::Failed, "{r:?}");
    assert!(r.digest.is_none());
    r
}
