//! The staging program against S3 as moto's server emulates it (started by the test on a free
//! loopback port; `scripts/setup.sh` installs it): SigV4-signed ListObjectsV2 across pages and
//! GetObject, prefix boundaries and directory markers, resuming a partial file with a signed
//! `Range`, and `SourceNotFound` for a missing bucket or an empty prefix. Fails, not skips, when
//! moto is missing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use flotilla_apis::cache::CachePhase;
use flotilla_apis::stage::{ManifestFile, StageReason, manifest_digest};
use flotilla_stage::Credentials;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;

/// moto_server, killed when the test ends.
struct Moto {
    child: Child,
    endpoint: String,
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

async fn moto() -> Moto {
    let bin = moto_bin();
    assert!(
        bin.exists(),
        "moto_server not found at {}: run scripts/setup.sh (or set FLOTILLA_MOTO_SERVER)",
        bin.display()
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let child = Command::new(&bin)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {}: {e}; run scripts/setup.sh", bin.display()));
    let moto = Moto { child, endpoint: format!("http://127.0.0.1:{port}") };
    for _ in 0..300 {
        if tokio::net::TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
            return moto;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("moto_server did not listen on port {port} within 30 s");
}

/// An unsigned PUT (moto does not check signatures unless told to).
async fn put(endpoint: &str, path: &str, body: &[u8]) {
    let client = Client::builder(TokioExecutor::new()).build_http::<Full<Bytes>>();
    let req = http::Request::put(format!("{endpoint}{path}")).body(Full::new(Bytes::copy_from_slice(body))).unwrap();
    let resp = client.request(req).await.unwrap();
    assert!(resp.status().is_success(), "PUT {path}: {}", resp.status());
}

fn objects() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("config.json", b"{\"layers\":2}".to_vec()),
        ("shards/model-00001.safetensors", (0..300_000u32).map(|i| (i % 241) as u8).collect()),
        ("shards/model 00002+x.safetensors", vec![42u8; 1234]),
    ]
}

async fn seeded(bucket: &str) -> Moto {
    let m = moto().await;
    put(&m.endpoint, &format!("/{bucket}"), b"").await;
    for (k, b) in objects() {
        let key: String = k.split('/').map(|s| s.replace(' ', "%20").replace('+', "%2B")).collect::<Vec<_>>().join("/");
        put(&m.endpoint, &format!("/{bucket}/llama/tiny/{key}"), &b).await;
    }
    // Neither a directory marker nor a sibling prefix that merely starts the same is staged.
    put(&m.endpoint, &format!("/{bucket}/llama/tiny/shards/"), b"").await;
    put(&m.endpoint, &format!("/{bucket}/llama/tinyother/extra.bin"), b"nope").await;
    m
}

fn s3_options(source: &str, m: &Moto, dest: &Path) -> flotilla_stage::Options {
    let mut o = options(source, "http://unused.invalid", dest);
    o.config.s3_endpoint = Some(m.endpoint.clone());
    o.config.s3_credentials =
        Some(Credentials { access_key_id: "testing".into(), secret_access_key: "testing".into(), session_token: None });
    o.config.s3_page_size = Some(2);
    o
}

fn expected() -> String {
    let files: Vec<ManifestFile> = objects()
        .iter()
        .map(|(p, b)| ManifestFile { path: p.to_string(), size: b.len() as u64, sha256: sha(b) })
        .collect();
    manifest_digest(&files)
}

#[tokio::test]
async fn stages_a_prefix_from_moto_s3_across_list_pages() {
    let m = seeded("flotilla-weights").await;
    let dir = tempfile::tempdir().unwrap();
    let mut opts = s3_options("s3://flotilla-weights/llama/tiny", &m, dir.path());
    opts.expected_digest = Some(expected());
    let result = run(&opts).await;
    assert_eq!(result.phase, CachePhase::Ready, "{result:?}");
    assert_eq!(result.files, 3, "no directory marker, nothing from llama/tinyother/");
    for (p, b) in objects() {
        assert_eq!(std::fs::read(dir.path().join(p)).unwrap(), b, "{p}");
    }
    assert!(!dir.path().join("extra.bin").exists());
    // Without credentials the requests go unsigned, and moto refuses to hand out the objects.
    let dir2 = tempfile::tempdir().unwrap();
    let mut anonymous = s3_options("s3://flotilla-weights/llama/tiny/", &m, dir2.path());
    anonymous.config.s3_credentials = None;
    let r = run(&anonymous).await;
    assert_eq!(r.reason, Some(StageReason::SourceUnauthorized), "{r:?}");
    assert_not_ready(dir2.path());
}

#[tokio::test]
async fn resumes_a_partial_object_with_a_range_request() {
    let m = seeded("flotilla-resume").await;
    let dir = tempfile::tempdir().unwrap();
    let big = "shards/model-00001.safetensors";
    let partial = dir.path().join(".flotilla/partial").join(big);
    std::fs::create_dir_all(partial.parent().unwrap()).unwrap();
    // A partial file whose first bytes are wrong: if the run re-downloaded from zero, the result
    // would be right; because it resumes after them, the damage shows in the manifest digest.
    std::fs::write(&partial, vec![0u8; 100_000]).unwrap();
    let mut opts = s3_options("s3://flotilla-resume/llama/tiny", &m, dir.path());
    opts.expected_digest = Some(expected());
    let first = run(&opts).await;
    assert_eq!(first.reason, Some(StageReason::DigestMismatch), "{first:?}");
    assert_not_ready(dir.path());
    assert!(!dir.path().join(big).exists(), "a file only checked by size is removed after a digest mismatch");
    assert!(!dir.path().join("config.json").exists(), "S3 publishes no sha256: every file goes");

    // With a correct partial prefix the resumed file is right, and the next run is Ready.
    let right = &objects()[1].1;
    std::fs::write(&partial, &right[..100_000]).unwrap();
    let second = run(&opts).await;
    assert_eq!(second.phase, CachePhase::Ready, "{second:?}");
    assert_eq!(std::fs::read(dir.path().join(big)).unwrap(), *right);
}

#[tokio::test]
async fn a_missing_bucket_or_an_empty_prefix_is_source_not_found() {
    let m = seeded("flotilla-present").await;
    for source in ["s3://flotilla-absent/llama", "s3://flotilla-present/llama/none"] {
        let dir = tempfile::tempdir().unwrap();
        let result = run(&s3_options(source, &m, dir.path())).await;
        assert_eq!(result.reason, Some(StageReason::SourceNotFound), "{source}: {result:?}");
        assert_not_ready(dir.path());
    }
}
