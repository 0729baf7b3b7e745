//! Fetching one file resumably and proving it intact. Bytes go to
//! `<dest>/.flotilla/partial/<path>`; a later attempt (in this run or the next) continues from
//! the partial file's size with `Range: bytes=<size>-`, accepting only a `206` whose
//! `Content-Range` starts there (a `200` restarts from zero, a `416` discards the partial). Once
//! the body is complete the file is read back from the volume and its size and SHA-256 checked
//! (against the source's when it publishes one); only then is it renamed to `<dest>/<path>`. A
//! file already at its final path is re-hashed and kept only if it still checks out. Nothing is
//! read, written or renamed through a symbolic link below `<dest>` ([`crate::safe`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use flotilla_apis::stage::{ManifestFile, STATE_DIR, hex};
use http::{StatusCode, header};
use http_body_util::BodyExt;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use crate::error::StageError;
use crate::http::{Http, error_chain, redact};
use crate::safe::{self, Mode};
use crate::source::{RemoteFile, Source};

/// Where a file's partial download lives, relative to the destination.
pub fn partial_path(path: &str) -> PathBuf {
    Path::new(STATE_DIR).join("partial").join(path)
}

/// Downloads (or reuses) `file` under `dest` and returns its verified manifest entry.
/// Bytes received are added to `received` as they arrive.
pub async fn fetch(
    http: &Http,
    source: &Source,
    dest: &Path,
    file: &RemoteFile,
    received: &AtomicU64,
) -> Result<ManifestFile, StageError> {
    let rel = Path::new(&file.path);
    let target = safe::check(dest, rel).await?;
    if let Ok(meta) = tokio::fs::symlink_metadata(&target).await
        && meta.is_file()
        && meta.len() == file.size
    {
        let sha256 = hash_file(&target).await?;
        if file.sha256.as_ref().is_none_or(|s| *s == sha256) {
            return Ok(ManifestFile { path: file.path.clone(), size: file.size, sha256 });
        }
        eprintln!("flotilla-stage: {}: staged copy does not match the source; downloading again", file.path);
    }
    let partial_rel = partial_path(&file.path);
    for parent in [rel.parent(), partial_rel.parent()].into_iter().flatten() {
        safe::create_dirs(dest, parent).await?;
    }
    let partial = safe::check(dest, &partial_rel).await?;
    let mut fresh_retry_left = true;
    loop {
        let resumed = file_len(&partial).await > 0;
        http.retry(|| attempt(http, source, file, &partial, received)).await?;
        match verify(&partial, file).await {
            Ok(sha256) => {
                tokio::fs::rename(&partial, &target).await.map_err(|e| StageError::storage(&target, e))?;
                return Ok(ManifestFile { path: file.path.clone(), size: file.size, sha256 });
            }
            Err(e) => {
                remove(&partial).await?;
                // A partial file left by an earlier run may itself be what is wrong: one fresh try.
                if !(resumed && fresh_retry_left && matches!(e, StageError::FileDigest { .. })) {
                    return Err(e);
                }
                fresh_retry_left = false;
            }
        }
    }
}

/// One GET continuing the partial file; returns when the body ended (complete or not).
async fn attempt(
    http: &Http,
    source: &Source,
    file: &RemoteFile,
    partial: &Path,
    received: &AtomicU64,
) -> Result<(), StageError> {
    let mut start = file_len(partial).await;
    if start > file.size {
        remove(partial).await?;
        start = 0;
    }
    if start == file.size {
        if start == 0 {
            create(partial, false).await?;
        }
        return Ok(());
    }
    let req = source.request(file, start).await?;
    let response = http.send(&req).await?;
    let url = redact(&req.uri);
    let (response, append) = match response.status() {
        StatusCode::PARTIAL_CONTENT if start > 0 => {
            let from = response
                .headers()
                .get(header::CONTENT_RANGE)
                .and_then(|v| v.to_str().ok())
                .and_then(content_range)
                .ok_or_else(|| StageError::unavailable(&url, "206 without a usable Content-Range"))?;
            if from.0 != start {
                return Err(StageError::unavailable(
                    &url,
                    format!("asked for bytes from {start}, got from {}", from.0),
                ));
            }
            if let Some(total) = from.1
                && total != file.size
            {
                return Err(StageError::Size { file: file.path.clone(), expected: file.size, actual: total });
            }
            (response, true)
        }
        StatusCode::RANGE_NOT_SATISFIABLE if start > 0 => {
            remove(partial).await?;
            return Err(StageError::unavailable(&url, "the source refused to resume; starting over"));
        }
        // The object is no longer the version listed (S3 `If-Match`): its bytes so far are stale.
        StatusCode::PRECONDITION_FAILED => {
            remove(partial).await?;
            return Err(source
                .check(response, &req.uri)
                .await
                .err()
                .unwrap_or_else(|| StageError::unavailable(&url, "the object changed since it was listed")));
        }
        _ => (source.check(response, &req.uri).await?, false),
    };
    let mut out = create(partial, append).await?;
    let mut written = if append { start } else { 0 };
    let mut body = response.into_body();
    loop {
        // Every exit flushes first: the next attempt resumes from the file's length, so no write
        // may still be in flight when it looks.
        let Ok(frame) = tokio::time::timeout(http.policy.read_timeout, body.frame()).await else {
            flush(&mut out, partial).await?;
            return Err(StageError::unavailable(&url, format!("stalled after {written} bytes")));
        };
        let Some(frame) = frame else { break };
        let frame = match frame {
            Ok(f) => f,
            Err(e) => {
                flush(&mut out, partial).await?;
                return Err(StageError::unavailable(&url, format!("cut after {written} bytes: {}", error_chain(&e))));
            }
        };
        if let Ok(data) = frame.into_data() {
            written += data.len() as u64;
            if written > file.size {
                drop(out);
                remove(partial).await?;
                return Err(StageError::Size { file: file.path.clone(), expected: file.size, actual: written });
            }
            out.write_all(&data).await.map_err(|e| StageError::storage(partial, e))?;
            received.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
    }
    flush(&mut out, partial).await
}

/// Reads the file back and checks its size and published SHA-256; returns the SHA-256.
async fn verify(partial: &Path, file: &RemoteFile) -> Result<String, StageError> {
    let size = file_len(partial).await;
    if size != file.size {
        return Err(StageError::Size { file: file.path.clone(), expected: file.size, actual: size });
    }
    let sha256 = hash_file(partial).await?;
    match &file.sha256 {
        Some(expected) if *expected != sha256 => {
            Err(StageError::FileDigest { file: file.path.clone(), expected: expected.clone(), actual: sha256 })
        }
        _ => Ok(sha256),
    }
}

/// The SHA-256 of a file on the volume (not through a link), read in 1 MiB blocks off the async threads.
pub async fn hash_file(path: &Path) -> Result<String, StageError> {
    let owned = path.to_path_buf();
    let result = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
        use std::io::Read;
        let mut f = safe::open_read(&owned)?;
        let mut hasher = Sha256::new();
        let mut buf = vec![0u8; 1 << 20];
        loop {
            let n = f.read(&mut buf)?;
            if n == 0 {
                return Ok(hex(&hasher.finalize()));
            }
            hasher.update(&buf[..n]);
        }
    })
    .await
    .map_err(|e| StageError::storage(path, std::io::Error::other(e.to_string())))?;
    result.map_err(|e| StageError::storage(path, e))
}

/// `(first byte, total)` of `bytes <first>-<last>/<total|*>`.
fn content_range(v: &str) -> Option<(u64, Option<u64>)> {
    let (range, total) = v.strip_prefix("bytes ")?.split_once('/')?;
    let first = range.split_once('-')?.0.trim().parse().ok()?;
    Some((first, total.trim().parse().ok()))
}

async fn file_len(path: &Path) -> u64 {
    tokio::fs::symlink_metadata(path).await.map(|m| m.len()).unwrap_or(0)
}

async fn create(path: &Path, append: bool) -> Result<tokio::io::BufWriter<tokio::fs::File>, StageError> {
    let f = safe::open_write(path, if append { Mode::Append } else { Mode::Truncate }).await?;
    Ok(tokio::io::BufWriter::with_capacity(1 << 20, f))
}

async fn flush(out: &mut tokio::io::BufWriter<tokio::fs::File>, path: &Path) -> Result<(), StageError> {
    out.flush().await.map_err(|e| StageError::storage(path, e))?;
    out.get_mut().sync_all().await.map_err(|e| StageError::storage(path, e))
}

async fn remove(path: &Path) -> Result<(), StageError> {
    match tokio::fs::remove_file(path).await {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(StageError::storage(path, e)),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn reads_content_range() {
        assert_eq!(content_range("bytes 100-199/200"), Some((100, Some(200))));
        assert_eq!(content_range("bytes 5-9/*"), Some((5, None)));
        assert_eq!(content_range("items 1-2/3"), None);
    }
}
