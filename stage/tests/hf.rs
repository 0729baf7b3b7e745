//! The staging program against a fake Hugging Face Hub on loopback: a verified manifest for a
//! paginated, partly-LFS repository; resume with `Range` after a cut connection (within a run
//! and across runs); and every failure — unauthorized, not found, wrong digest, wrong or short
//! size, unwritable volume — ends Failed with its reason and never with a manifest.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use flotilla_apis::cache::CachePhase;
use flotilla_apis::stage::{ManifestFile, StageManifest, StageReason, manifest_digest};

fn files() -> Vec<(&'static str, Vec<u8>)> {
    vec![
        ("config.json", br#"{"model_type":"llama"}"#.to_vec()),
        ("model-00001-of-00002.safetensors", (0..200_000u32).map(|i| (i % 251) as u8).collect()),
        ("model-00002-of-00002.safetensors", (0..50_000u32).map(|i| (i % 13) as u8).collect()),
        ("sub/tokenizer.json", b"{\"vocab\":{}}".to_vec()),
    ]
}

fn hub() -> State {
    let f = files();
    let refs: Vec<(&str, &[u8])> = f.iter().map(|(p, b)| (*p, b.as_slice())).collect();
    let mut s = state(&refs);
    s.lfs.insert("model-00001-of-00002.safetensors".into());
    s.lfs.insert("model-00002-of-00002.safetensors".into());
    s
}

fn expected_digest() -> String {
    let entries: Vec<ManifestFile> = files()
        .iter()
        .map(|(p, b)| ManifestFile { path: p.to_string(), size: b.len() as u64, sha256: sha(b) })
        .collect();
    manifest_digest(&entries)
}

const BIG: &str = "model-00001-of-00002.safetensors";

#[tokio::test]
async fn stages_a_repository_with_a_verified_manifest() {
    let mut s = hub();
    s.token = Some("hf_secret".into());
    s.page_size = 2; // the tree API is paginated with Link headers
    let (endpoint, shared) = start(s).await;
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(&format!("hf://{REPO}@main"), &endpoint, dir.path());
    opts.config.token = Some("hf_secret".into());
    opts.expected_digest = Some(expected_digest());
    let result = run(&opts).await;
    assert_eq!(result.phase, CachePhase::Ready, "{result:?}");
    assert_eq!(result.digest.as_deref(), Some(expected_digest().as_str()));
    assert_eq!(result.resolved.as_deref(), Some(COMMIT));
    assert_eq!(result.files, 4);
    for (p, b) in files() {
        assert_eq!(std::fs::read(dir.path().join(p)).unwrap(), b, "{p}");
    }
    let manifest: StageManifest =
        serde_json::from_slice(&std::fs::read(dir.path().join(".flotilla/manifest.json")).unwrap()).unwrap();
    assert!(manifest.is_consistent());
    assert_eq!(manifest.digest, expected_digest());
    assert_eq!(
        manifest.files.iter().map(|f| f.path.as_str()).collect::<Vec<_>>(),
        files().iter().map(|f| f.0).collect::<Vec<_>>()
    );
    assert!(!dir.path().join(".flotilla/partial").exists(), "partial downloads are cleaned up");
    let st = shared.lock().unwrap();
    assert_eq!(st.served.len(), 4, "each file fetched once: {:?}", st.served);
    for s in &st.served {
        assert!(s.range.is_none());
        if s.path.ends_with(".safetensors") {
            assert_eq!(s.auth, None, "the token is not sent on to the CDN (another host) after a redirect to it");
        } else {
            assert_eq!(s.auth.as_deref(), Some("Bearer hf_secret"));
        }
    }
}

#[tokio::test]
async fn a_second_run_reuses_verified_files_and_replaces_a_tampered_one() {
    let (endpoint, shared) = start(hub()).await;
    let dir = tempfile::tempdir().unwrap();
    let opts = options(&format!("hf://{REPO}"), &endpoint, dir.path());
    assert_eq!(run(&opts).await.phase, CachePhase::Ready);
    std::fs::write(dir.path().join(BIG), vec![0u8; 200_000]).unwrap(); // same size, wrong bytes
    shared.lock().unwrap().served.clear();
    let again = run(&opts).await;
    assert_eq!(again.phase, CachePhase::Ready, "{again:?}");
    assert_eq!(again.digest, Some(expected_digest()));
    let served: Vec<String> = shared.lock().unwrap().served.iter().map(|s| s.path.clone()).collect();
    assert_eq!(served, vec![BIG.to_string()], "only the tampered file is fetched again");
}

#[tokio::test]
async fn resumes_with_range_in_the_next_run_after_a_cut_connection() {
    let mut s = hub();
    s.cut_once = Some((BIG.into(), 70_000));
    let (endpoint, shared) = start(s).await;
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(&format!("hf://{REPO}"), &endpoint, dir.path());
    opts.policy.retries = 0;
    let first = run(&opts).await;
    assert_eq!(first.reason, Some(StageReason::SourceUnavailable), "{first:?}");
    assert_not_ready(dir.path());
    assert!(!dir.path().join(BIG).exists(), "a partial file is never at its final path");
    let partial = dir.path().join(".flotilla/partial").join(BIG);
    assert_eq!(std::fs::metadata(&partial).unwrap().len(), 70_000, "the bytes before the cut are kept");

    let second = run(&opts).await;
    assert_eq!(second.phase, CachePhase::Ready, "{second:?}");
    assert_eq!(second.digest, Some(expected_digest()), "the resumed file hashes right as a whole");
    let big: Vec<Served> = shared.lock().unwrap().served.iter().filter(|s| s.path == BIG).cloned().collect();
    assert_eq!(big.len(), 2, "{big:?}");
    assert_eq!((big[0].range.as_deref(), big[0].bytes), (None, 70_000));
    assert_eq!(big[1].range.as_deref(), Some("bytes=70000-"), "the second run resumes where the first stopped");
    assert_eq!(big[1].bytes, 130_000, "nothing before the cut is downloaded again");
}

#[tokio::test]
async fn resumes_within_one_run_when_retries_are_left() {
    let mut s = hub();
    s.cut_once = Some((BIG.into(), 123_456));
    let (endpoint, shared) = start(s).await;
    let dir = tempfile::tempdir().unwrap();
    let result = run(&options(&format!("hf://{REPO}"), &endpoint, dir.path())).await;
    assert_eq!(result.phase, CachePhase::Ready, "{result:?}");
    let ranges: Vec<Option<String>> =
        shared.lock().unwrap().served.iter().filter(|s| s.path == BIG).map(|s| s.range.clone()).collect();
    assert_eq!(ranges, vec![None, Some("bytes=123456-".into())]);
}

#[tokio::test]
async fn a_file_cut_short_every_time_is_never_ready() {
    let mut s = hub();
    s.short = Some((BIG.into(), 150_000)); // Content-Length promises 200000, the body stops at 150000
    let (endpoint, shared) = start(s).await;
    let dir = tempfile::tempdir().unwrap();
    let result = run(&options(&format!("hf://{REPO}"), &endpoint, dir.path())).await;
    assert_eq!(result.reason, Some(StageReason::SourceUnavailable), "{result:?}");
    assert!(result.message.contains(BIG), "{}", result.message);
    assert_not_ready(dir.path());
    assert!(!dir.path().join(BIG).exists());
    let tries = shared.lock().unwrap().served.iter().filter(|s| s.path == BIG).count();
    assert_eq!(tries, 3, "first try and two retries");
}

#[tokio::test]
async fn a_source_that_lies_about_a_size_is_never_ready() {
    for listed in [250_000u64, 150_000] {
        let mut s = hub();
        s.lfs.remove(BIG);
        s.listed_size.insert(BIG.into(), listed);
        let (endpoint, _) = start(s).await;
        let dir = tempfile::tempdir().unwrap();
        let result = run(&options(&format!("hf://{REPO}"), &endpoint, dir.path())).await;
        assert_eq!(result.reason, Some(StageReason::SizeMismatch), "listed {listed}: {result:?}");
        assert_eq!(result.file.as_deref(), Some(BIG));
        assert_not_ready(dir.path());
        assert!(!dir.path().join(BIG).exists());
    }
}

#[tokio::test]
async fn a_file_whose_sha256_differs_fails_naming_it() {
    let mut s = hub();
    s.wrong_sha.insert(BIG.into(), "ab".repeat(32));
    let (endpoint, _) = start(s).await;
    let dir = tempfile::tempdir().unwrap();
    let result = run(&options(&format!("hf://{REPO}"), &endpoint, dir.path())).await;
    assert_eq!(result.reason, Some(StageReason::DigestMismatch), "{result:?}");
    assert_eq!(result.file.as_deref(), Some(BIG));
    assert!(result.message.contains(BIG) && result.message.contains(&"ab".repeat(32)), "{}", result.message);
    assert_not_ready(dir.path());
    assert!(!dir.path().join(BIG).exists());
}

#[tokio::test]
async fn an_expected_digest_that_differs_fails_and_a_stale_ready_verdict_is_removed() {
    let (endpoint, _) = start(hub()).await;
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(&format!("hf://{REPO}"), &endpoint, dir.path());
    assert_eq!(run(&opts).await.phase, CachePhase::Ready);
    assert!(dir.path().join(".flotilla/manifest.json").exists());
    let wrong = format!("sha256:{}", "0".repeat(64));
    opts.expected_digest = Some(wrong.clone());
    let result = run(&opts).await;
    assert_eq!(result.reason, Some(StageReason::DigestMismatch), "{result:?}");
    assert!(result.message.contains(&wrong) && result.message.contains(&expected_digest()), "{}", result.message);
    assert_not_ready(dir.path());
}

#[tokio::test]
async fn a_refused_token_is_source_unauthorized() {
    let mut s = hub();
    s.token = Some("hf_right".into());
    let (endpoint, _) = start(s).await;
    for token in [None, Some("hf_wrong")] {
        let dir = tempfile::tempdir().unwrap();
        let mut opts = options(&format!("hf://{REPO}"), &endpoint, dir.path());
        opts.config.token = token.map(str::to_owned);
        let result = run(&opts).await;
        assert_eq!(result.reason, Some(StageReason::SourceUnauthorized), "{token:?}: {result:?}");
        assert!(result.message.contains("credentials"), "{}", result.message);
        assert_not_ready(dir.path());
    }
}

#[tokio::test]
async fn a_missing_repository_or_revision_is_source_not_found() {
    let (endpoint, shared) = start(hub()).await;
    for source in ["hf://acme/no-such-model", &format!("hf://{REPO}@no-such-branch")] {
        let dir = tempfile::tempdir().unwrap();
        let result = run(&options(source, &endpoint, dir.path())).await;
        assert_eq!(result.reason, Some(StageReason::SourceNotFound), "{source}: {result:?}");
        assert_not_ready(dir.path());
    }
    assert!(shared.lock().unwrap().served.is_empty(), "no file was fetched");
}

#[tokio::test]
async fn invalid_sources_and_unwritable_volumes_are_named() {
    let (endpoint, _) = start(hub()).await;
    let dir = tempfile::tempdir().unwrap();
    let result = run(&options("hf://../etc", &endpoint, dir.path())).await;
    assert_eq!(result.reason, Some(StageReason::InvalidSource), "{result:?}");

    let file = dir.path().join("not-a-directory");
    std::fs::write(&file, b"x").unwrap();
    let mut progress = Vec::new();
    let result = flotilla_stage::run(&options(&format!("hf://{REPO}"), &endpoint, &file.join("dest")), &mut |p| {
        progress.push(p)
    })
    .await;
    assert_eq!(result.reason, Some(StageReason::StorageUnavailable), "{result:?}");
    assert!(progress.is_empty());
}

#[tokio::test]
async fn progress_is_reported_while_a_file_downloads() {
    let mut s = hub();
    s.pause = Some((BIG.into(), 60_000, std::time::Duration::from_millis(600)));
    let (endpoint, _) = start(s).await;
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(&format!("hf://{REPO}"), &endpoint, dir.path());
    opts.concurrency = 1;
    opts.progress_interval = std::time::Duration::from_millis(100);
    let mut progress = Vec::new();
    let result = flotilla_stage::run(&opts, &mut |p| progress.push(p)).await;
    assert_eq!(result.phase, CachePhase::Ready, "{result:?}");
    let mid: Vec<_> = progress
        .iter()
        .filter(|p| p.file.is_none() && p.phase == CachePhase::Downloading && p.received_bytes > 0)
        .collect();
    assert!(!mid.is_empty(), "{progress:?}");
    assert!(mid.iter().any(|p| p.received_bytes > p.bytes), "bytes of the unfinished file are counted: {mid:?}");
    let last = progress.last().unwrap();
    assert_eq!(
        (last.phase, last.bytes, last.received_bytes),
        (CachePhase::Verifying, last.total_bytes, last.total_bytes)
    );
}

#[tokio::test]
async fn a_stalled_download_times_out_and_resumes() {
    let mut s = hub();
    s.pause = Some((BIG.into(), 80_000, std::time::Duration::from_secs(5)));
    let (endpoint, shared) = start(s).await;
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(&format!("hf://{REPO}"), &endpoint, dir.path());
    opts.policy.read_timeout = std::time::Duration::from_millis(500);
    let result = run(&opts).await;
    assert_eq!(result.phase, CachePhase::Ready, "{result:?}");
    assert_eq!(result.digest, Some(expected_digest()));
    let ranges: Vec<Option<String>> =
        shared.lock().unwrap().served.iter().filter(|s| s.path == BIG).map(|s| s.range.clone()).collect();
    assert_eq!(ranges, vec![None, Some("bytes=80000-".into())], "the bytes before the stall are kept");
}

#[tokio::test]
async fn a_server_that_ignores_range_restarts_the_file_from_zero() {
    let mut s = hub();
    s.cut_once = Some((BIG.into(), 70_000));
    s.ignore_range = true;
    let (endpoint, shared) = start(s).await;
    let dir = tempfile::tempdir().unwrap();
    let result = run(&options(&format!("hf://{REPO}"), &endpoint, dir.path())).await;
    assert_eq!(result.phase, CachePhase::Ready, "{result:?}");
    assert_eq!(
        result.digest,
        Some(expected_digest()),
        "the 200 body replaced the partial file instead of being appended"
    );
    let big: Vec<Served> = shared.lock().unwrap().served.iter().filter(|s| s.path == BIG).cloned().collect();
    assert_eq!(big.len(), 2);
    assert_eq!((big[1].range.as_deref(), big[1].status, big[1].bytes), (Some("bytes=70000-"), 200, 200_000));
}
