//! The three kinds of source behind one enum: parse the URL, list the files (path, size, and the
//! SHA-256 the source publishes when it does), and build the GET for one file from a byte offset.
//! Also the checks every listed path must pass before it touches the volume.

use std::collections::BTreeSet;

use flotilla_apis::stage::STATE_DIR;
use http::{Response, Uri, header};
use hyper::body::Incoming;

use crate::error::StageError;
use crate::http::{Http, Req, check_status};
use crate::{hf::Hf, oci::Oci, s3::S3};

/// Endpoints and credentials, as given by flags and environment.
#[derive(Clone, Debug, Default)]
pub struct SourceConfig {
    /// `--revision`, for `hf://` (overrides none given in the URL; must agree with one given).
    pub revision: Option<String>,
    /// Bearer token (Hugging Face), or registry password / token (OCI).
    pub token: Option<String>,
    /// Hugging Face endpoint, `https://huggingface.co` when unset.
    pub hf_endpoint: Option<String>,
    /// S3 endpoint (path-style); AWS's regional virtual-hosted endpoint when unset.
    pub s3_endpoint: Option<String>,
    /// S3 region, `us-east-1` when unset.
    pub s3_region: Option<String>,
    /// Where S3 requests take credentials from: the AWS SDK's chain unless told otherwise.
    pub s3_auth: crate::aws_auth::S3Auth,
    /// Keys per ListObjectsV2 page (S3's default 1000 when unset).
    pub s3_page_size: Option<u32>,
    /// Registry base URL, `https://<registry>` when unset.
    pub oci_endpoint: Option<String>,
    /// Registry user name for the token flow (with `token` as the password).
    pub oci_username: Option<String>,
}

/// One file the source lists.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RemoteFile {
    /// Destination path, relative, `/`-separated, checked by [`check_path`].
    pub path: String,
    /// Size in bytes as listed.
    pub size: u64,
    /// Lowercase hex SHA-256 the source publishes (HF LFS oid, OCI layer digest), if any.
    pub sha256: Option<String>,
    /// Source-specific locator: HF path, S3 key, OCI blob digest.
    pub locator: String,
}

/// A source's files and what its revision or tag resolved to.
#[derive(Clone, Debug, Default)]
pub struct Listing {
    /// The files, in listing order.
    pub files: Vec<RemoteFile>,
    /// HF commit or OCI manifest digest.
    pub resolved: Option<String>,
}

/// A parsed source.
#[derive(Debug)]
pub enum Source {
    /// `hf://org/name[@revision]`
    Hf(Hf),
    /// `s3://bucket[/prefix]`
    S3(S3),
    /// `oci://registry/repo[:tag|@sha256:…]`
    Oci(Oci),
}

impl Source {
    /// Parses a source URL.
    pub fn parse(url: &str, config: &SourceConfig) -> Result<Source, StageError> {
        if let Some(rest) = url.strip_prefix("hf://") {
            Ok(Source::Hf(Hf::parse(rest, config)?))
        } else if let Some(rest) = url.strip_prefix("s3://") {
            Ok(Source::S3(S3::parse(rest, config)?))
        } else if let Some(rest) = url.strip_prefix("oci://") {
            Ok(Source::Oci(Oci::parse(rest, config)?))
        } else {
            Err(StageError::InvalidSource(format!(
                "{url}: give hf://org/name@revision, s3://bucket/prefix or oci://registry/repo:tag"
            )))
        }
    }

    /// Lists the files; every path is checked and duplicates are refused.
    pub async fn list(&mut self, http: &Http) -> Result<Listing, StageError> {
        let listing = match self {
            Source::Hf(s) => s.list(http).await?,
            Source::S3(s) => s.list(http).await?,
            Source::Oci(s) => s.list(http).await?,
        };
        let mut seen = BTreeSet::new();
        for f in &listing.files {
            check_path(&f.path)?;
            if !seen.insert(f.path.as_str()) {
                return Err(StageError::InvalidSource(format!("{}: listed twice", f.path)));
            }
        }
        Ok(listing)
    }

    /// The GET for `file` from byte `start` (a `Range` request when `start > 0`), with the
    /// credentials current now.
    pub async fn request(&self, file: &RemoteFile, start: u64) -> Result<Req, StageError> {
        let range = (start > 0).then(|| format!("bytes={start}-"));
        match self {
            Source::Hf(s) => with_range(s.request(file)?, range),
            Source::Oci(s) => with_range(s.request(file)?, range),
            // S3 signs the Range header, so it goes in before signing.
            Source::S3(s) => s.request(file, range.as_deref()).await,
        }
    }

    /// Passes a 2xx answer to a file GET; anything else becomes the error the source means.
    pub async fn check(&self, response: Response<Incoming>, uri: &Uri) -> Result<Response<Incoming>, StageError> {
        match self {
            Source::S3(s) => s.check(response, uri).await,
            Source::Hf(_) | Source::Oci(_) => check_status(response, uri).await,
        }
    }
}

fn with_range(req: Req, range: Option<String>) -> Result<Req, StageError> {
    match range {
        Some(r) => req.header(header::RANGE, &r),
        None => Ok(req),
    }
}

/// Refuses paths that could escape the destination or collide with Flotilla's own files.
pub fn check_path(path: &str) -> Result<(), StageError> {
    let bad = |why: &str| Err(StageError::InvalidSource(format!("file name {path:?} {why}")));
    if path.is_empty() || path.starts_with('/') {
        return bad("is empty or absolute");
    }
    if path.contains(['\\', '\n', '\r', '\0']) {
        return bad("contains a backslash, newline or NUL");
    }
    if path.split('/').any(|c| c.is_empty() || c == "." || c == "..") {
        return bad("has an empty, `.` or `..` component");
    }
    if path.split('/').next() == Some(STATE_DIR) {
        return bad("is inside the staging state directory .flotilla");
    }
    Ok(())
}

/// RFC 3986 percent-encoding of everything but unreserved characters (and `/` when `keep_slash`).
pub fn encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') || (keep_slash && b == b'/') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// An endpoint without a trailing slash.
pub fn trim_endpoint(e: &str) -> String {
    e.trim_end_matches('/').to_string()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn unsafe_paths_are_refused() {
        for p in ["", "/etc/passwd", "a/../b", "..", "a//b", "./a", "a\nb", ".flotilla/result.json", "a\\b"] {
            assert!(matches!(check_path(p), Err(StageError::InvalidSource(_))), "{p:?}");
        }
        for p in ["config.json", "a/b/c.safetensors", ".gitattributes", "x..y", ".flotillax"] {
            check_path(p).unwrap();
        }
    }

    #[test]
    fn encoding_keeps_unreserved_only() {
        assert_eq!(encode("a b/c~d+e", false), "a%20b%2Fc~d%2Be");
        assert_eq!(encode("a b/c", true), "a%20b/c");
    }

    #[test]
    fn unknown_schemes_are_invalid() {
        assert!(matches!(Source::parse("http://x", &SourceConfig::default()), Err(StageError::InvalidSource(_))));
    }
}
