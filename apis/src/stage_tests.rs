//! Unit tests of the staging manifest digest (canonical form, order independence, sensitivity to
//! every field), the reason names and exit codes, and the result line's size bound.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use super::*;

fn file(path: &str, size: u64, sha: &str) -> ManifestFile {
    ManifestFile { path: path.into(), size, sha256: sha.into() }
}

const A: &str = "2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"; // sha256("foo")
const B: &str = "fcde2b2edba56bf408601fb721fe9b5c338d10ee429ea04fae5511b68fbf8fb9"; // sha256("bar")

#[test]
fn digest_is_sha256_of_the_documented_canonical_lines() {
    let files = vec![file("b/weights.safetensors", 3, B), file("a.json", 3, A)];
    let canonical = format!("{A} 3 a.json\n{B} 3 b/weights.safetensors\n");
    let expected = format!("sha256:{}", hex(&Sha256::digest(canonical.as_bytes())));
    assert_eq!(manifest_digest(&files), expected);
    // Pinned (computed independently with Python's hashlib), so a change of the canonical form is a
    // visible, deliberate break.
    assert_eq!(expected, "sha256:fc626c6ca46d29aa5d86b0b3ff96a16835aa9ffe8180bd265583f7f28c4df4a1");
    assert!(is_sha256_digest(&expected));
}

#[test]
fn digest_is_independent_of_download_order() {
    let files = vec![file("config.json", 3, A), file("model-00001.safetensors", 3, B), file("Z.txt", 0, A)];
    let mut reversed = files.clone();
    reversed.reverse();
    let mut rotated = files.clone();
    rotated.rotate_left(1);
    assert_eq!(manifest_digest(&files), manifest_digest(&reversed));
    assert_eq!(manifest_digest(&files), manifest_digest(&rotated));
    let m1 = StageManifest::new("hf://a/b".into(), None, reversed);
    let m2 = StageManifest::new("s3://mirror/a".into(), Some("abc".into()), rotated);
    assert_eq!(m1.digest, m2.digest, "source and revision are not part of the digest");
    assert_eq!(m1.files, m2.files, "files are stored sorted");
    assert_eq!(m1.files[0].path, "Z.txt", "byte-wise order: uppercase before lowercase");
    assert_eq!(m1.total_bytes, 6);
    assert!(m1.is_consistent());
}

#[test]
fn digest_changes_with_every_field_and_with_the_file_set() {
    let base = vec![file("a", 3, A), file("b", 3, B)];
    let d = manifest_digest(&base);
    assert_ne!(d, manifest_digest(&[file("a", 3, A), file("c", 3, B)]), "path");
    assert_ne!(d, manifest_digest(&[file("a", 4, A), file("b", 3, B)]), "size");
    assert_ne!(d, manifest_digest(&[file("a", 3, B), file("b", 3, B)]), "sha256");
    assert_ne!(d, manifest_digest(&[file("a", 3, A)]), "a missing file");
    assert_ne!(d, manifest_digest(&[file("a", 3, A), file("b", 3, B), file("c", 0, A)]), "an extra file");
    // Two files cannot be merged into one line's worth of text.
    assert_ne!(manifest_digest(&[file("a b", 3, A)]), manifest_digest(&[file("a", 3, A), file("b", 3, A)]));
}

#[test]
fn a_tampered_manifest_is_not_consistent() {
    let mut m = StageManifest::new("hf://a/b".into(), None, vec![file("a", 3, A)]);
    m.files[0].size = 2;
    assert!(!m.is_consistent());
}

#[test]
fn empty_manifest_digest_is_sha256_of_nothing() {
    assert_eq!(manifest_digest(&[]), "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
}

#[test]
fn reasons_serialize_as_their_constants_and_exit_codes_round_trip() {
    let mut codes = std::collections::BTreeSet::new();
    for r in StageReason::ALL {
        assert_eq!(serde_json::to_value(r).unwrap(), serde_json::Value::String(r.as_str().into()));
        assert_eq!(StageReason::from_exit_code(r.exit_code()), Some(r));
        assert!(codes.insert(r.exit_code()), "exit codes are distinct");
        assert!(r.exit_code() > 2);
    }
    assert_eq!(StageReason::from_exit_code(0), None);
    assert_eq!(StageReason::SourceUnauthorized.as_str(), "SourceUnauthorized");
}

#[test]
fn result_line_fits_a_termination_message_and_round_trips() {
    let r = StageResult {
        phase: CachePhase::Failed,
        reason: Some(StageReason::SourceUnavailable),
        message: "é\"x".repeat(3000),
        source: "hf://a/b".into(),
        file: Some("f".into()),
        digest: None,
        expected_digest: None,
        resolved: None,
        files: 0,
        bytes: 0,
    };
    let line = r.to_line();
    assert!(line.len() <= TERMINATION_MESSAGE_LIMIT, "{}", line.len());
    let back: StageResult = serde_json::from_str(&line).unwrap();
    assert_eq!(back.reason, Some(StageReason::SourceUnavailable));
    assert!(back.message.ends_with('…'));
    let short = StageResult { message: "ok".into(), ..r };
    assert_eq!(serde_json::from_str::<StageResult>(&short.to_line()).unwrap(), short);
}

#[test]
fn events_are_tagged_by_kind() {
    let p = StageEvent::Progress(StageProgress {
        phase: CachePhase::Downloading,
        bytes: 1,
        received_bytes: 2,
        total_bytes: 2,
        files: 1,
        total_files: 2,
        file: Some("a".into()),
    });
    let v = serde_json::to_value(&p).unwrap();
    assert_eq!(v["kind"], "Progress");
    assert_eq!(v["phase"], "Downloading");
    assert_eq!(v["totalBytes"], 2);
}

fn ready(source: &str, digest: &str) -> StageResult {
    StageResult {
        phase: CachePhase::Ready,
        reason: None,
        message: "ok".into(),
        source: source.into(),
        file: None,
        digest: Some(digest.into()),
        expected_digest: None,
        resolved: None,
        files: 1,
        bytes: 3,
    }
}

#[test]
fn the_verdict_is_ready_only_for_this_source_and_the_expected_digest() {
    let d = format!("sha256:{}", "a".repeat(64));
    let other = format!("sha256:{}", "b".repeat(64));
    let r = ready("hf://a/b", &d);
    assert_eq!(r.verdict("hf://a/b", None).0, CachePhase::Ready);
    assert_eq!(r.verdict("hf://a/b", Some(&d)).0, CachePhase::Ready);
    assert_eq!(r.verdict("hf://a/b", Some(&other)).1, "DigestMismatch");
    assert_eq!(
        r.verdict("hf://a/c", None),
        (CachePhase::Failed, "JobFailed", "the staging result is for hf://a/b, not hf://a/c".into())
    );
    let no_digest = StageResult { digest: None, ..r.clone() };
    assert_eq!(no_digest.verdict("hf://a/b", None).1, "JobFailed", "Ready without a digest is not evidence");
    let failed =
        StageResult { phase: CachePhase::Failed, reason: Some(StageReason::SourceNotFound), digest: None, ..r };
    assert_eq!(failed.verdict("hf://a/b", None).1, "SourceNotFound");
}

#[test]
fn results_are_read_from_termination_messages_and_log_tails() {
    let r = ready("hf://a/b", &format!("sha256:{}", "a".repeat(64)));
    assert_eq!(StageResult::from_termination_message(&r.to_line()), Some(r.clone()));
    let progress = StageEvent::Progress(StageProgress {
        phase: CachePhase::Downloading,
        bytes: 0,
        received_bytes: 0,
        total_bytes: 3,
        files: 0,
        total_files: 1,
        file: None,
    });
    let log = format!(
        "{}\nretrying\n{}\n\n",
        serde_json::to_string(&progress).unwrap(),
        serde_json::to_string(&StageEvent::Result(r.clone())).unwrap()
    );
    assert_eq!(StageResult::from_termination_message(&log), Some(r));
    assert_eq!(StageResult::from_termination_message(&serde_json::to_string(&progress).unwrap()), None);
    assert_eq!(StageResult::from_termination_message("killed\n"), None);
    assert_eq!(StageResult::from_termination_message(""), None);
}
