//! What the staging program (`flotilla-stage`, run in a Job in each member cluster) hands back
//! to the ModelCache controller: the manifest of staged files with its canonical digest, the
//! final [`StageResult`] (written to `<dest>/.flotilla/result.json`, to the termination-message
//! file, and as the last line of stdout) and the progress lines printed while it runs. One set of
//! serde types, so the program and the controller cannot disagree on a field or a reason.
//!
//! Canonical manifest form (what [`manifest_digest`] hashes): the files sorted by path
//! (byte-wise order of the UTF-8 path), one line per file `<sha256 hex> <size> <path>\n`
//! (lowercase hex, size in decimal bytes, single spaces, path relative with `/` separators and
//! no newline); the digest is `sha256:` followed by the lowercase hex SHA-256 of those lines
//! concatenated. The source URL and revision are not part of it: the same bytes staged from a
//! mirror have the same digest.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::cache::CachePhase;
use crate::constants::reason;

/// Directory, relative to the staging destination, holding Flotilla's own files.
pub const STATE_DIR: &str = ".flotilla";
/// The manifest of a verified stage, relative to the destination; present only when Ready.
pub const MANIFEST_FILE: &str = ".flotilla/manifest.json";
/// The final result of the last run, relative to the destination.
pub const RESULT_FILE: &str = ".flotilla/result.json";
/// Upper bound of a result written as a Kubernetes termination message (the kubelet keeps 4096 bytes).
pub const TERMINATION_MESSAGE_LIMIT: usize = 4096;

/// Why staging failed. A closed set; the serialized name equals the `constants::reason` string.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
pub enum StageReason {
    /// The source URL (or a file name it lists) is not one the program accepts.
    InvalidSource,
    /// The source refused the credentials (HTTP 401/403).
    SourceUnauthorized,
    /// The source has no such model, revision, bucket, prefix or tag.
    SourceNotFound,
    /// The source did not answer, or answered 5xx/429, after every retry.
    SourceUnavailable,
    /// A file's SHA-256, or the manifest digest, differs from the expected one.
    DigestMismatch,
    /// A file's size differs from the size the source listed.
    SizeMismatch,
    /// The destination cannot be written (missing, read-only, disk full).
    StorageUnavailable,
}

impl StageReason {
    /// Every reason, for exhaustive tests and documentation.
    pub const ALL: [StageReason; 7] = [
        StageReason::InvalidSource,
        StageReason::SourceUnauthorized,
        StageReason::SourceNotFound,
        StageReason::SourceUnavailable,
        StageReason::DigestMismatch,
        StageReason::SizeMismatch,
        StageReason::StorageUnavailable,
    ];

    /// The reason string written into ModelCache status.
    pub fn as_str(self) -> &'static str {
        match self {
            StageReason::InvalidSource => reason::INVALID_SOURCE,
            StageReason::SourceUnauthorized => reason::SOURCE_UNAUTHORIZED,
            StageReason::SourceNotFound => reason::SOURCE_NOT_FOUND,
            StageReason::SourceUnavailable => reason::SOURCE_UNAVAILABLE,
            StageReason::DigestMismatch => reason::DIGEST_MISMATCH,
            StageReason::SizeMismatch => reason::SIZE_MISMATCH,
            StageReason::StorageUnavailable => reason::STORAGE_UNAVAILABLE,
        }
    }

    /// The process exit code for this reason (0 is Ready, 2 is a usage error).
    pub fn exit_code(self) -> i32 {
        match self {
            StageReason::InvalidSource => 10,
            StageReason::SourceUnauthorized => 11,
            StageReason::SourceNotFound => 12,
            StageReason::SourceUnavailable => 13,
            StageReason::DigestMismatch => 14,
            StageReason::SizeMismatch => 15,
            StageReason::StorageUnavailable => 16,
        }
    }

    /// The reason behind an exit code, for when no result could be read.
    pub fn from_exit_code(code: i32) -> Option<StageReason> {
        StageReason::ALL.into_iter().find(|r| r.exit_code() == code)
    }

    /// Whether running the Job again without changing anything may succeed.
    pub fn is_transient(self) -> bool {
        matches!(self, StageReason::SourceUnavailable | StageReason::StorageUnavailable)
    }
}

/// One staged file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ManifestFile {
    /// Path relative to the destination, `/`-separated.
    pub path: String,
    /// Size in bytes.
    pub size: u64,
    /// Lowercase hex SHA-256 of the file's bytes as read back from the volume.
    pub sha256: String,
}

/// Every file of a verified stage and the digest over them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StageManifest {
    /// The source as given (`hf://…`, `s3://…`, `oci://…`).
    pub source: String,
    /// What the source's revision or tag resolved to (HF commit, OCI manifest digest), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved: Option<String>,
    /// `sha256:<hex>` over the canonical form of `files` (see the module documentation).
    pub digest: String,
    /// Sum of the file sizes.
    pub total_bytes: u64,
    /// The files, sorted by path.
    pub files: Vec<ManifestFile>,
}

impl StageManifest {
    /// A manifest over `files` in any order: sorts them and computes the digest.
    pub fn new(source: String, resolved: Option<String>, mut files: Vec<ManifestFile>) -> StageManifest {
        files.sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
        let digest = manifest_digest(&files);
        let total_bytes = files.iter().map(|f| f.size).sum();
        StageManifest { source, resolved, digest, total_bytes, files }
    }

    /// Whether `digest` is what the files hash to (a manifest read back from disk is checked so).
    pub fn is_consistent(&self) -> bool {
        self.digest == manifest_digest(&self.files)
            && self.total_bytes == self.files.iter().map(|f| f.size).sum::<u64>()
    }
}

/// The canonical digest of a set of files, independent of their order.
pub fn manifest_digest(files: &[ManifestFile]) -> String {
    let mut sorted: Vec<&ManifestFile> = files.iter().collect();
    sorted.sort_by(|a, b| a.path.as_bytes().cmp(b.path.as_bytes()));
    let mut hasher = Sha256::new();
    for f in sorted {
        hasher.update(format!("{} {} {}\n", f.sha256, f.size, f.path).as_bytes());
    }
    format!("sha256:{}", hex(&hasher.finalize()))
}

/// Lowercase hex of some bytes.
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        s.push(char::from(DIGITS[usize::from(b >> 4)]));
        s.push(char::from(DIGITS[usize::from(b & 0xf)]));
    }
    s
}

/// Whether `s` is `sha256:` followed by 64 lowercase hex digits.
pub fn is_sha256_digest(s: &str) -> bool {
    s.strip_prefix("sha256:")
        .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)))
}

/// The outcome of one staging run. `phase` is `Ready` or `Failed`; Ready only when every file's
/// size and SHA-256 checked out, the manifest was written, and the expected digest (if any) matched.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StageResult {
    /// `Ready` or `Failed`.
    pub phase: CachePhase,
    /// Why it failed; absent when Ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<StageReason>,
    /// What happened and what to change.
    pub message: String,
    /// The source as given.
    pub source: String,
    /// The file a failure concerns, when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
    /// The manifest digest (Ready only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    /// The digest the run was asked to match, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_digest: Option<String>,
    /// What the revision or tag resolved to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resolved: Option<String>,
    /// Files verified.
    pub files: u64,
    /// Bytes verified.
    pub bytes: u64,
}

impl StageResult {
    /// The result as one JSON line that fits a termination message (the message is shortened if needed).
    pub fn to_line(&self) -> String {
        let mut r = self.clone();
        loop {
            let line = serde_json::to_string(&r).unwrap_or_default();
            if line.len() <= TERMINATION_MESSAGE_LIMIT || r.message.is_empty() {
                return line;
            }
            let keep = r.message.len().saturating_sub(line.len() - TERMINATION_MESSAGE_LIMIT + 3);
            let mut cut = keep;
            while cut > 0 && !r.message.is_char_boundary(cut) {
                cut -= 1;
            }
            r.message.truncate(cut);
            if keep > 0 {
                r.message.push('…');
            }
        }
    }
}

impl StageResult {
    /// Reads the result from a termination message: either the result JSON itself (what
    /// `--termination-log` writes) or, with `FallbackToLogsOnError`, a log tail whose last
    /// non-empty line is a `{"kind":"Result",…}` event. `None` when there is no result to read.
    pub fn from_termination_message(message: &str) -> Option<StageResult> {
        let last = message.lines().rev().map(str::trim).find(|l| !l.is_empty())?;
        match serde_json::from_str::<StageEvent>(last) {
            Ok(StageEvent::Result(r)) => Some(r),
            Ok(StageEvent::Progress(_)) => None,
            Err(_) => serde_json::from_str(last).ok(),
        }
    }

    /// What the controller may conclude for one cluster from this result, given the spec it
    /// staged for: `(phase, reason, message)`. Ready only when the result says Ready, was
    /// staged from `source`, carries a digest, and that digest equals `expected_digest` when
    /// one is given; anything else is Failed with a reason from `constants::reason`.
    pub fn verdict(&self, source: &str, expected_digest: Option<&str>) -> (CachePhase, &'static str, String) {
        let failed = |reason: &'static str, message: String| (CachePhase::Failed, reason, message);
        if self.source != source {
            return failed(reason::JOB_FAILED, format!("the staging result is for {}, not {source}", self.source));
        }
        match (self.phase, self.reason, self.digest.as_deref()) {
            (CachePhase::Ready, None, Some(digest)) => match expected_digest {
                Some(expected) if expected != digest => failed(
                    reason::DIGEST_MISMATCH,
                    format!("staged manifest digest {digest} does not match spec.digest {expected}"),
                ),
                _ => (CachePhase::Ready, reason::AS_EXPECTED, self.message.clone()),
            },
            (CachePhase::Failed, Some(r), _) => failed(r.as_str(), self.message.clone()),
            _ => failed(reason::JOB_FAILED, format!("inconsistent staging result: {}", self.message)),
        }
    }
}

/// Progress while staging runs: `Downloading` (after listing, after each file, and every few
/// seconds while a download runs) and `Verifying`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct StageProgress {
    /// `Downloading` or `Verifying`.
    pub phase: CachePhase,
    /// Bytes of the files verified so far.
    pub bytes: u64,
    /// Bytes received from the source in this run, files not finished yet included.
    #[serde(default)]
    pub received_bytes: u64,
    /// Bytes the source listed.
    pub total_bytes: u64,
    /// Files done so far.
    pub files: u64,
    /// Files the source listed.
    pub total_files: u64,
    /// The file just finished, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub file: Option<String>,
}

/// One line of the program's stdout: JSON tagged with `kind`. The last line is always a `Result`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(tag = "kind")]
pub enum StageEvent {
    /// A progress report.
    Progress(StageProgress),
    /// The final result.
    Result(StageResult),
}

#[cfg(test)]
#[path = "stage_tests.rs"]
mod tests;
