//! The staging program against S3 as moto's server emulates it (started by the test on a free
//! loopback port; `scripts/setup.sh` installs it): SigV4-signed ListObjectsV2 across pages and
//! GetObject, prefix boundaries and directory markers, resuming a partial file with a signed
//! `Range`, keys with characters XML escapes, an object replaced between listing and download
//! (refused through `If-Match`, its partial bytes dropped), and `SourceNotFound` for a missing
//! bucket or an empty prefix. Fails, not skips, when moto is missing. How the credentials are
//! found is `s3_credentials.rs`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;

use common::moto::{Moto, moto, put, seed, weights, weights_digest};
use common::*;
use flotilla_apis::cache::CachePhase;
use flotilla_apis::stage::StageReason;
use flotilla_stage::{Credentials, S3Auth};

async fn seeded(bucket: &str) -> Moto {
    let m = moto().await;
    seed(&m.endpoint, bucket, &[]).await;
    m
}

fn s3_options(source: &str, m: &Moto, dest: &Path) -> flotilla_stage::Options {
    let mut o = options(source, "http://unused.invalid", dest);
    o.config.s3_endpoint = Some(m.endpoint.clone());
    o.config.s3_auth = S3Auth::Static(Credentials {
        access_key_id: "testing".into(),
        secret_access_key: "testing".into(),
        session_token: None,
    });
    o.config.s3_page_size = Some(2);
    o
}

#[tokio::test]
async fn stages_a_prefix_from_moto_s3_across_list_pages() {
    let m = seeded("flotilla-weights").await;
    let dir = tempfile::tempdir().unwrap();
    let mut opts = s3_options("s3://flotilla-weights/llama/tiny", &m, dir.path());
    opts.expected_digest = Some(weights_digest());
    let result = run(&opts).await;
    assert_eq!(result.phase, CachePhase::Ready, "{result:?}");
    assert_eq!(result.files, 4, "no directory marker, nothing from llama/tinyother/");
    for (p, b) in weights() {
        assert_eq!(std::fs::read(dir.path().join(p)).unwrap(), b, "{p}");
    }
    assert!(!dir.path().join("extra.bin").exists());
    // Without credentials the requests go unsigned, and moto refuses to hand out the objects.
    let dir2 = tempfile::tempdir().unwrap();
    let mut anonymous = s3_options("s3://flotilla-weights/llama/tiny/", &m, dir2.path());
    anonymous.config.s3_auth = S3Auth::Anonymous;
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
    opts.expected_digest = Some(weights_digest());
    let first = run(&opts).await;
    assert_eq!(first.reason, Some(StageReason::DigestMismatch), "{first:?}");
    assert_not_ready(dir.path());
    assert!(!dir.path().join(big).exists(), "a file only checked by size is removed after a digest mismatch");
    assert!(!dir.path().join("config.json").exists(), "S3 publishes no sha256: every file goes");

    // With a correct partial prefix the resumed file is right, and the next run is Ready.
    let right = &weights()[1].1;
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

#[tokio::test]
async fn an_object_replaced_after_listing_is_refused_and_its_partial_bytes_dropped() {
    use std::sync::atomic::AtomicU64;
    let m = seeded("flotilla-changed").await;
    let dir = tempfile::tempdir().unwrap();
    let opts = s3_options("s3://flotilla-changed/llama/tiny", &m, dir.path());
    let mut source = flotilla_stage::source::Source::parse(&opts.source, &opts.config).unwrap();
    let http = flotilla_stage::http::Http::new(opts.policy).unwrap();
    let listing = source.list(&http).await.unwrap();
    let big = listing.files.iter().find(|f| f.path == "shards/model-00001.safetensors").unwrap();
    let partial = dir.path().join(flotilla_stage::download::partial_path(&big.path));
    std::fs::create_dir_all(partial.parent().unwrap()).unwrap();
    std::fs::write(&partial, &weights()[1].1[..1000]).unwrap();
    // Same size, other bytes: only the ETag tells the versions apart.
    put(&m.endpoint, "/flotilla-changed/llama/tiny/shards/model-00001.safetensors", &vec![7u8; 300_000]).await;
    let e = flotilla_stage::download::fetch(&http, &source, dir.path(), big, &AtomicU64::new(0)).await.unwrap_err();
    assert!(e.to_string().contains("changed since it was listed"), "{e}");
    assert_eq!(e.reason(), StageReason::SourceUnavailable, "the Job's next attempt lists again");
    assert!(!partial.exists(), "bytes of the old version are not resumed from");
    assert!(!dir.path().join(&big.path).exists());
}
