//! One staging run from start to verdict: clear the previous verdict, list the source, fetch
//! and verify every file, build the manifest, compare the expected digest, and only then write
//! the manifest (temp file + rename). Every outcome becomes a [`StageResult`]; [`write_result`]
//! puts it at `<dest>/.flotilla/result.json` the same atomic way. Nothing goes through a
//! symbolic link below the destination ([`crate::safe`]).

use std::path::{Path, PathBuf};

use flotilla_apis::cache::CachePhase;
use flotilla_apis::stage::{
    MANIFEST_FILE, RESULT_FILE, STATE_DIR, StageManifest, StageProgress, StageResult, is_sha256_digest,
};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::io::AsyncWriteExt;

use crate::download;
use crate::error::StageError;
use crate::http::{Http, RetryPolicy};
use crate::safe::{self, Mode};
use crate::source::{Source, SourceConfig};

/// Everything one run needs.
#[derive(Clone, Debug)]
pub struct Options {
    /// `hf://…`, `s3://…` or `oci://…`.
    pub source: String,
    /// The directory to stage into (the mounted volume).
    pub dest: PathBuf,
    /// `sha256:<hex>` the manifest digest must equal.
    pub expected_digest: Option<String>,
    /// Endpoints and credentials.
    pub config: SourceConfig,
    /// Retries and timeouts.
    pub policy: RetryPolicy,
    /// Files downloaded at the same time (at least 1).
    pub concurrency: usize,
    /// Time between progress reports while downloads run (besides one per finished file).
    pub progress_interval: Duration,
}

/// Stages the source and returns the verdict (Ready or Failed with a reason); reports progress.
pub async fn run(opts: &Options, progress: &mut (dyn FnMut(StageProgress) + Send)) -> StageResult {
    let mut resolved = None;
    match stage(opts, progress, &mut resolved).await {
        Ok(m) => StageResult {
            phase: CachePhase::Ready,
            reason: None,
            message: format!(
                "{} files, {} bytes staged and verified; manifest {}",
                m.files.len(),
                m.total_bytes,
                m.digest
            ),
            source: opts.source.clone(),
            file: None,
            digest: Some(m.digest),
            expected_digest: opts.expected_digest.clone(),
            resolved: m.resolved,
            files: m.files.len() as u64,
            bytes: m.total_bytes,
        },
        Err(e) => StageResult {
            phase: CachePhase::Failed,
            reason: Some(e.reason()),
            message: e.to_string(),
            source: opts.source.clone(),
            file: e.file().map(str::to_owned),
            digest: None,
            expected_digest: opts.expected_digest.clone(),
            resolved,
            files: 0,
            bytes: 0,
        },
    }
}

async fn stage(
    opts: &Options,
    progress: &mut (dyn FnMut(StageProgress) + Send),
    resolved: &mut Option<String>,
) -> Result<StageManifest, StageError> {
    if let Some(d) = &opts.expected_digest
        && !is_sha256_digest(d)
    {
        return Err(StageError::InvalidSource(format!("expected digest {d:?} is not sha256:<64 lowercase hex>")));
    }
    let state = safe::create_dirs(&opts.dest, Path::new(STATE_DIR)).await?;
    // No verdict of an earlier run survives into this one.
    for stale in [MANIFEST_FILE, RESULT_FILE] {
        let path = opts.dest.join(stale);
        match tokio::fs::remove_file(&path).await {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(StageError::storage(&path, e)),
            _ => {}
        }
    }
    let mut source = Source::parse(&opts.source, &opts.config)?;
    let http = Http::new(opts.policy)?;
    let listing = source.list(&http).await?;
    resolved.clone_from(&listing.resolved);
    let total_bytes = listing.files.iter().map(|f| f.size).sum();
    let total_files = listing.files.len() as u64;
    let received = AtomicU64::new(0);
    let mut report = |phase, bytes, files, file: Option<&str>| {
        let received_bytes = received.load(Ordering::Relaxed);
        progress(StageProgress {
            phase,
            bytes,
            received_bytes,
            total_bytes,
            files,
            total_files,
            file: file.map(str::to_owned),
        })
    };
    report(CachePhase::Downloading, 0, 0, None);
    let mut staged = Vec::with_capacity(listing.files.len());
    let mut bytes = 0;
    // Files finish in any order; the manifest sorts them. The first failure drops the downloads
    // still in flight (their partial files stay, to be resumed).
    let source = &source;
    let mut downloads = futures_util::stream::iter(&listing.files)
        .map(|file| {
            let (http, received) = (&http, &received);
            async move { download::fetch(http, source, &opts.dest, file, received).await }
        })
        .buffer_unordered(opts.concurrency.max(1));
    let mut tick =
        tokio::time::interval_at(tokio::time::Instant::now() + opts.progress_interval, opts.progress_interval);
    loop {
        tokio::select! {
            entry = downloads.next() => {
                let Some(entry) = entry else { break };
                let entry = entry?;
                bytes += entry.size;
                let path = entry.path.clone();
                staged.push(entry);
                report(CachePhase::Downloading, bytes, staged.len() as u64, Some(&path));
            }
            _ = tick.tick() => report(CachePhase::Downloading, bytes, staged.len() as u64, None),
        }
    }
    drop(downloads);
    report(CachePhase::Verifying, bytes, staged.len() as u64, None);
    let manifest = StageManifest::new(opts.source.clone(), listing.resolved, staged);
    if let Some(expected) = &opts.expected_digest
        && *expected != manifest.digest
    {
        // Files the source publishes no SHA-256 for were checked by size only (and may have been
        // resumed from a damaged partial file): remove them so the next run fetches them afresh.
        for file in listing.files.iter().filter(|f| f.sha256.is_none()) {
            let removed = match safe::check(&opts.dest, Path::new(&file.path)).await {
                Ok(path) => tokio::fs::remove_file(&path).await.map_err(|e| StageError::storage(&path, e)),
                Err(e) => Err(e),
            };
            if let Err(e) = removed {
                eprintln!("flotilla-stage: not removed: {e}");
            }
        }
        return Err(StageError::ManifestDigest { expected: expected.clone(), actual: manifest.digest });
    }
    let json =
        serde_json::to_vec_pretty(&manifest).map_err(|e| StageError::storage(&state, std::io::Error::other(e)))?;
    write_atomic(&opts.dest.join(MANIFEST_FILE), &json).await?;
    let partial = state.join("partial");
    if tokio::fs::metadata(&partial).await.is_ok() {
        tokio::fs::remove_dir_all(&partial).await.map_err(|e| StageError::storage(&partial, e))?;
    }
    Ok(manifest)
}

/// Writes the result to `<dest>/.flotilla/result.json` (temp file + rename); a result that is not
/// Ready also removes any manifest, so a manifest on the volume always goes with a Ready result.
pub async fn write_result(dest: &Path, result: &StageResult) -> Result<(), StageError> {
    safe::create_dirs(dest, Path::new(STATE_DIR)).await?;
    if result.phase != CachePhase::Ready {
        let manifest = dest.join(MANIFEST_FILE);
        match tokio::fs::remove_file(&manifest).await {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(StageError::storage(&manifest, e)),
            _ => {}
        }
    }
    let path = dest.join(RESULT_FILE);
    let json = serde_json::to_vec_pretty(result).map_err(|e| StageError::storage(&path, std::io::Error::other(e)))?;
    write_atomic(&path, &json).await
}

/// Writes `bytes` to a new temporary file beside `path` (removing a stale one, never opening
/// through a link), syncs it, renames it over `path`, syncs the directory. The directory must
/// already have been checked ([`safe::create_dirs`]).
pub async fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), StageError> {
    let tmp = path.with_extension(format!("tmp-{}", std::process::id()));
    match tokio::fs::remove_file(&tmp).await {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(StageError::storage(&tmp, e)),
        _ => {}
    }
    let mut f = safe::open_write(&tmp, Mode::New).await?;
    f.write_all(bytes).await.map_err(|e| StageError::storage(&tmp, e))?;
    f.sync_all().await.map_err(|e| StageError::storage(&tmp, e))?;
    drop(f);
    tokio::fs::rename(&tmp, path).await.map_err(|e| StageError::storage(path, e))?;
    if let Some(dir) = path.parent()
        && let Ok(d) = tokio::fs::File::open(dir).await
    {
        // Best effort: not every filesystem lets a directory be synced.
        let _ = d.sync_all().await;
    }
    Ok(())
}
