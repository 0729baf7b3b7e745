//! The staging program against a tiny OCI registry on loopback: layers become files named by
//! their title annotation, the bearer-token challenge is answered, a blob whose bytes differ
//! from its digest fails naming the file, a pinned manifest digest is checked, and an unknown
//! tag is `SourceNotFound`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use flotilla_apis::cache::CachePhase;
use flotilla_apis::stage::{ManifestFile, StageReason, manifest_digest};

fn registry() -> State {
    let weights: Vec<u8> = (0..90_000u32).map(|i| (i * 7 % 256) as u8).collect();
    state(&[("config.json", b"{\"hidden\":8}"), ("weights/model.safetensors", &weights)])
}

#[tokio::test]
async fn stages_an_oci_artifact_through_the_token_flow() {
    let mut s = registry();
    s.oci_auth = true;
    s.cut_once = Some(("weights/model.safetensors".into(), 40_000));
    let files: Vec<ManifestFile> =
        s.files.iter().map(|(p, b)| ManifestFile { path: p.clone(), size: b.len() as u64, sha256: sha(b) }).collect();
    let manifest_sha = format!("sha256:{}", sha(&oci_manifest(&s)));
    let (endpoint, shared) = start(s).await;
    let dir = tempfile::tempdir().unwrap();
    let mut opts = options(&format!("oci://registry.example/{OCI_REPO}:{OCI_TAG}"), &endpoint, dir.path());
    opts.expected_digest = Some(manifest_digest(&files));
    let result = run(&opts).await;
    assert_eq!(result.phase, CachePhase::Ready, "{result:?}");
    assert_eq!(result.resolved.as_deref(), Some(manifest_sha.as_str()));
    assert_eq!(std::fs::read(dir.path().join("config.json")).unwrap(), b"{\"hidden\":8}");
    let served = shared.lock().unwrap().served.clone();
    let blobs: Vec<_> = served.iter().filter(|s| s.path == "weights/model.safetensors").collect();
    assert_eq!(blobs.len(), 2);
    assert_eq!(blobs[1].range.as_deref(), Some("bytes=40000-"), "blob downloads resume too");
    assert!(served.iter().all(|s| s.auth.as_deref() == Some(&format!("Bearer {OCI_TOKEN}"))), "{served:?}");

    // The same artifact pinned by manifest digest.
    let dir2 = tempfile::tempdir().unwrap();
    let pinned =
        run(&options(&format!("oci://registry.example/{OCI_REPO}@{manifest_sha}"), &endpoint, dir2.path())).await;
    assert_eq!(pinned.phase, CachePhase::Ready, "{pinned:?}");
    assert_eq!(pinned.digest, result.digest);
}

#[tokio::test]
async fn a_blob_that_does_not_match_its_digest_fails_naming_the_file() {
    let mut s = registry();
    s.oci_corrupt.insert("weights/model.safetensors".into());
    let (endpoint, _) = start(s).await;
    let dir = tempfile::tempdir().unwrap();
    let result = run(&options(&format!("oci://r.example/{OCI_REPO}:{OCI_TAG}"), &endpoint, dir.path())).await;
    assert_eq!(result.reason, Some(StageReason::DigestMismatch), "{result:?}");
    assert_eq!(result.file.as_deref(), Some("weights/model.safetensors"));
    assert_not_ready(dir.path());
    assert!(!dir.path().join("weights/model.safetensors").exists());
}

#[tokio::test]
async fn a_wrong_pinned_manifest_digest_or_an_unknown_tag_is_not_ready() {
    let (endpoint, _) = start(registry()).await;
    let dir = tempfile::tempdir().unwrap();
    let result = run(&options(&format!("oci://r.example/{OCI_REPO}:v2"), &endpoint, dir.path())).await;
    assert_eq!(result.reason, Some(StageReason::SourceNotFound), "{result:?}");
    assert_not_ready(dir.path());
    let wrong = format!("sha256:{}", "1".repeat(64));
    let result = run(&options(&format!("oci://r.example/{OCI_REPO}@{wrong}"), &endpoint, dir.path())).await;
    assert_eq!(result.reason, Some(StageReason::SourceNotFound), "the registry has no such manifest: {result:?}");

    // A registry that answers a digest reference with other bytes is caught.
    let mut s = registry();
    s.oci_any_digest = true;
    let (endpoint, shared) = start(s).await;
    let dir = tempfile::tempdir().unwrap();
    let result = run(&options(&format!("oci://r.example/{OCI_REPO}@{wrong}"), &endpoint, dir.path())).await;
    assert_eq!(result.reason, Some(StageReason::DigestMismatch), "{result:?}");
    assert!(result.message.contains(&wrong), "{}", result.message);
    assert_not_ready(dir.path());
    assert!(shared.lock().unwrap().served.is_empty(), "no blob is fetched for an unverified manifest");
}
