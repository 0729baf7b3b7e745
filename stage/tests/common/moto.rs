//! moto's server for the S3 tests, started on a loopback port of its own choosing (`scripts/setup.sh`
//! installs it; the tests fail, not skip, without it), with what the tests need around it:
//! PUTs to seed buckets, IAM/STS query calls to create users, roles and sessions,
//! switching moto to checking signatures and IAM policies (`/moto-api/reset-auth`), and a
//! recording proxy in front of it that notes every request (path, `Authorization`, session
//! token, body) and every answer's body, and forwards them unchanged.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Body;
use axum::http::Request;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

#[path = "../../../providers/tests/moto/port.rs"]
mod port;

/// moto_server, killed when the test ends.
pub struct Moto {
    child: Child,
    pub endpoint: String,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn moto_bin() -> PathBuf {
    if let Ok(p) = std::env::var("FLOTILLA_MOTO_SERVER") {
        return p.into();
    }
    let cache = std::env::var("FLOTILLA_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap()).join(".cache/flotilla"));
    cache.join("venv/bin/moto_server")
}

pub async fn moto() -> Moto {
    let bin = moto_bin();
    assert!(
        bin.exists(),
        "moto_server not found at {}: run scripts/setup.sh (or set FLOTILLA_MOTO_SERVER)",
        bin.display()
    );
    // moto binds a port of its own choosing (`-p 0`) and names it on stderr: a port picked
    // here and released could be taken by another test's listener before moto binds it, and
    // this test would then talk to that one (and find it gone when that test ends).
    let mut child = Command::new(&bin)
        .args(["-H", "127.0.0.1", "-p", "0"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}; run scripts/setup.sh", bin.display()));
    let rx = port::announced(child.stderr.take().expect("moto's stderr"));
    let port = tokio::task::spawn_blocking(move || rx.recv_timeout(Duration::from_secs(30)))
        .await
        .unwrap()
        .unwrap_or_else(|_| panic!("moto_server did not say which port it listens on within 30 s"));
    Moto { child, endpoint: format!("http://127.0.0.1:{port}") }
}

async fn send(req: http::Request<Full<Bytes>>) -> (u16, String) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let resp = client.request(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// A PUT with a made-up signature (moto does not check signatures until told to, but lets
/// only "signed" requests overwrite a private object), with extra headers.
pub async fn put_with(endpoint: &str, path: &str, body: &[u8], headers: &[(&str, &str)]) {
    let mut req = http::Request::put(format!("{endpoint}{path}")).header("authorization", fake_auth("s3"));
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let (status, text) = send(req.body(Full::new(Bytes::copy_from_slice(body))).unwrap()).await;
    assert!((200..300).contains(&status), "PUT {path}: {status} {text}");
}

/// A PUT.
pub async fn put(endpoint: &str, path: &str, body: &[u8]) {
    put_with(endpoint, path, body, &[]).await;
}

/// The model every S3 test stages (under `llama/tiny/`): keys with a space, a `+`, and the
/// characters XML escapes in listings (`&`, `<`, `>`, `'`).
pub fn weights() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("config.json", b"{\"layers\":2}".to_vec()),
        ("shards/model-00001.safetensors", (0..300_000u32).map(|i| (i % 241) as u8).collect()),
        ("shards/model 00002+x.safetensors", vec![42u8; 1234]),
        ("R&D <v2>/it's.json", b"{}".to_vec()),
    ]
}

/// The manifest digest of [`weights`].
pub fn weights_digest() -> String {
    let files: Vec<flotilla_apis::stage::ManifestFile> = weights()
        .iter()
        .map(|(p, b)| flotilla_apis::stage::ManifestFile {
            path: p.to_string(),
            size: b.len() as u64,
            sha256: super::sha(b),
        })
        .collect();
    flotilla_apis::stage::manifest_digest(&files)
}

/// Creates `bucket` with [`weights`] under `llama/tiny/`, a directory marker, and a sibling
/// prefix that merely starts the same; `headers` go with every object PUT (e.g. a public ACL).
pub async fn seed(endpoint: &str, bucket: &str, headers: &[(&str, &str)]) {
    put(endpoint, &format!("/{bucket}"), b"").await;
    for (k, b) in weights() {
        let key = k.split('/').map(urlencode).collect::<Vec<_>>().join("/");
        put_with(endpoint, &format!("/{bucket}/llama/tiny/{key}"), &b, headers).await;
    }
    put(endpoint, &format!("/{bucket}/llama/tiny/shards/"), b"").await;
    put_with(endpoint, &format!("/{bucket}/llama/tinyother/extra.bin"), b"nope", headers).await;
}

/// An IAM or STS query call; the fake `Authorization` only tells moto which service is meant.
pub async fn query(endpoint: &str, service: &str, params: &[(&str, &str)]) -> String {
    let form: String = params
        .iter()
        .map(|(k, v)| format!("{k}={}", urlencode(v)))
        .chain(std::iter::once(format!("Version={}", if service == "iam" { "2010-05-08" } else { "2011-06-15" })))
        .collect::<Vec<_>>()
        .join("&");
    let req = http::Request::post(format!("{endpoint}/"))
        .header("content-type", "application/x-www-form-urlencoded")
        .header("authorization", fake_auth(service))
        .body(Full::new(Bytes::from(form)))
        .unwrap();
    let (status, text) = send(req).await;
    assert_eq!(status, 200, "{service} {params:?}: {text}");
    text
}

/// An `Authorization` whose scope names `service`: how moto routes a request on loopback.
fn fake_auth(service: &str) -> String {
    format!(
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20260101/us-east-1/{service}/aws4_request, SignedHeaders=host, Signature=00"
    )
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

/// The text of the first `<tag>` element.
pub fn xml_text(xml: &str, tag: &str) -> String {
    let open = format!("<{tag}>");
    let start = xml.find(&open).unwrap_or_else(|| panic!("no <{tag}> in {xml}")) + open.len();
    let end = xml[start..].find(&format!("</{tag}>")).unwrap() + start;
    xml[start..end].to_string()
}

pub const ACCOUNT: &str = "123456789012";
const S3_READ_POLICY: &str = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":["s3:GetObject","s3:ListBucket"],"Resource":"*"}]}"#;
const TRUST_ANYONE: &str = r#"{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"Federated":"arn:aws:iam::123456789012:oidc-provider/oidc.eks.example"},"Action":"sts:AssumeRoleWithWebIdentity"},{"Effect":"Allow","Principal":{"AWS":"*"},"Action":"sts:AssumeRole"}]}"#;

/// An IAM user allowed to read S3, and one access key of it: `(access key id, secret)`.
pub async fn iam_user(endpoint: &str, name: &str) -> (String, String) {
    query(endpoint, "iam", &[("Action", "CreateUser"), ("UserName", name)]).await;
    query(
        endpoint,
        "iam",
        &[("Action", "PutUserPolicy"), ("UserName", name), ("PolicyName", "read"), ("PolicyDocument", S3_READ_POLICY)],
    )
    .await;
    let key = query(endpoint, "iam", &[("Action", "CreateAccessKey"), ("UserName", name)]).await;
    (xml_text(&key, "AccessKeyId"), xml_text(&key, "SecretAccessKey"))
}

/// An IAM role allowed to read S3; returns its ARN.
pub async fn iam_role(endpoint: &str, name: &str) -> String {
    query(endpoint, "iam", &[("Action", "CreateRole"), ("RoleName", name), ("AssumeRolePolicyDocument", TRUST_ANYONE)])
        .await;
    query(
        endpoint,
        "iam",
        &[("Action", "PutRolePolicy"), ("RoleName", name), ("PolicyName", "read"), ("PolicyDocument", S3_READ_POLICY)],
    )
    .await;
    format!("arn:aws:iam::{ACCOUNT}:role/{name}")
}

/// Temporary credentials of a role session, as STS AssumeRole hands them out.
#[derive(Clone, Debug)]
pub struct Session {
    pub access_key_id: String,
    pub secret_access_key: String,
    pub session_token: String,
}

pub async fn assume_role(endpoint: &str, role_arn: &str, session: &str) -> Session {
    let x =
        query(endpoint, "sts", &[("Action", "AssumeRole"), ("RoleArn", role_arn), ("RoleSessionName", session)]).await;
    Session {
        access_key_id: xml_text(&x, "AccessKeyId"),
        secret_access_key: xml_text(&x, "SecretAccessKey"),
        session_token: xml_text(&x, "SessionToken"),
    }
}

/// From now on moto lets `free` more requests through, then checks every request's signature
/// against the IAM users' and role sessions' keys, and their policies.
pub async fn enforce_auth(endpoint: &str, free: u32) {
    let req = http::Request::post(format!("{endpoint}/moto-api/reset-auth"))
        .body(Full::new(Bytes::from(free.to_string())))
        .unwrap();
    let (status, text) = send(req).await;
    assert_eq!(status, 200, "reset-auth: {text}");
}

/// One request through the proxy.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: String,
    pub path_and_query: String,
    pub authorization: Option<String>,
    pub security_token: Option<String>,
    pub body: String,
    pub status: u16,
    pub response: String,
}

impl Seen {
    /// The access key id of a SigV4 `Authorization`.
    pub fn access_key(&self) -> Option<&str> {
        let a = self.authorization.as_deref()?;
        a.split("Credential=").nth(1)?.split('/').next()
    }
}

pub type Log = Arc<Mutex<Vec<Seen>>>;

/// A proxy on a free loopback port forwarding everything to `upstream` as it came (the `Host`
/// header too, so signatures still verify) and recording it; runs until the test ends.
pub async fn recording_proxy(upstream: &str) -> (String, Log) {
    let log: Log = Arc::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (l, upstream) = (log.clone(), upstream.to_string());
    let app = axum::Router::new().fallback(move |req: Request<Body>| {
        let (log, upstream) = (l.clone(), upstream.clone());
        async move {
            let (parts, body) = req.into_parts();
            let body = body.collect().await.unwrap().to_bytes();
            let path_and_query = parts.uri.path_and_query().map(|p| p.to_string()).unwrap_or_default();
            let header = |n: &str| parts.headers.get(n).and_then(|v| v.to_str().ok()).map(str::to_owned);
            let mut fwd =
                http::Request::builder().method(parts.method.clone()).uri(format!("{upstream}{path_and_query}"));
            for (k, v) in &parts.headers {
                fwd = fwd.header(k, v);
            }
            let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
            let resp = client.request(fwd.body(Full::new(body.clone())).unwrap()).await.unwrap();
            let (mut rparts, rbody) = resp.into_parts();
            for hop in ["transfer-encoding", "connection", "keep-alive"] {
                rparts.headers.remove(hop);
            }
            let rbody = rbody.collect().await.unwrap().to_bytes();
            log.lock().unwrap().push(Seen {
                method: parts.method.to_string(),
                path_and_query,
                authorization: header("authorization"),
                security_token: header("x-amz-security-token"),
                body: String::from_utf8_lossy(&body).into_owned(),
                status: rparts.status.as_u16(),
                response: String::from_utf8_lossy(&rbody).into_owned(),
            });
            http::Response::from_parts(rparts, Body::from(rbody))
        }
    });
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    (format!("http://{addr}"), log)
}
