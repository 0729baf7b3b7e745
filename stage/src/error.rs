//! The one error type of the staging library. Every variant maps to exactly one
//! [`StageReason`] (what the controller writes into ModelCache status) and says whether trying
//! again in the same run can help (only network trouble, 5xx and 429 can).

use flotilla_apis::stage::StageReason;

/// What to check when a token source (Hugging Face, OCI) refuses the request.
pub const TOKEN_HINT: &str = "check the token Secret and its access";

/// Why a staging step failed.
#[derive(Debug, thiserror::Error)]
pub enum StageError {
    /// The source URL or a file name it lists is unusable.
    #[error("invalid source: {0}")]
    InvalidSource(String),
    /// HTTP 401/403, or a gated repository.
    #[error("{url}: the source refused the credentials (HTTP {status}); {hint}")]
    Unauthorized {
        /// What was asked for.
        url: String,
        /// The HTTP status.
        status: u16,
        /// What the source said and what to check ([`TOKEN_HINT`] for token sources).
        hint: String,
    },
    /// A credential provider that is configured (its variables are set) did not give
    /// credentials; the providers after it are not tried.
    #[error("S3 credentials from {provider} failed: {detail}; {hint}")]
    Credentials {
        /// The provider and how it is configured.
        provider: String,
        /// What went wrong.
        detail: String,
        /// What to change.
        hint: &'static str,
        /// Network trouble or throttling: another attempt may succeed.
        transient: bool,
    },
    /// HTTP 404 or an empty listing.
    #[error("{what}: not found; check the source name, revision, bucket, prefix or tag")]
    NotFound {
        /// What was asked for.
        what: String,
    },
    /// Network failure, timeout, 5xx or 429; retried until the attempts run out.
    #[error("{what}: {detail}")]
    Unavailable {
        /// What was asked for.
        what: String,
        /// What went wrong.
        detail: String,
    },
    /// Another HTTP status the program cannot act on; not retried.
    #[error("{url}: unexpected HTTP {status}{detail}")]
    Rejected {
        /// What was asked for.
        url: String,
        /// The HTTP status.
        status: u16,
        /// Error text from the source, prefixed by `: `, when it sent some.
        detail: String,
    },
    /// A file's SHA-256 differs from the one the source published.
    #[error("{file}: sha256 {actual} does not match the source's {expected}")]
    FileDigest {
        /// The file.
        file: String,
        /// Published by the source.
        expected: String,
        /// Read back from the volume.
        actual: String,
    },
    /// The manifest digest differs from the expected one.
    #[error(
        "manifest digest {actual} does not match the expected {expected}; the source's files changed or the expected digest is wrong (files without a published sha256 were removed so the next run fetches them again)"
    )]
    ManifestDigest {
        /// `--expected-digest`.
        expected: String,
        /// Computed over the staged files.
        actual: String,
    },
    /// A file is shorter or longer than listed.
    #[error(
        "{file}: {actual} bytes received where the source listed {expected}; the download is incomplete or the source is inconsistent"
    )]
    Size {
        /// The file.
        file: String,
        /// Listed by the source.
        expected: u64,
        /// On the volume.
        actual: u64,
    },
    /// A symbolic link inside the destination, where staging writes and trusts only real files
    /// and directories.
    #[error(
        "{path} is a symbolic link inside the destination; staging never writes or reads through a link (it creates none): remove it"
    )]
    Symlink {
        /// The link.
        path: String,
    },
    /// The destination cannot be written.
    #[error("cannot write {path}: {error}; check the volume (mounted, writable, large enough)")]
    Storage {
        /// The path.
        path: String,
        /// The I/O error.
        error: std::io::Error,
    },
}

impl StageError {
    /// The reason written into the result.
    pub fn reason(&self) -> StageReason {
        match self {
            StageError::InvalidSource(_) => StageReason::InvalidSource,
            StageError::Unauthorized { .. } | StageError::Credentials { transient: false, .. } => {
                StageReason::SourceUnauthorized
            }
            StageError::Credentials { transient: true, .. } => StageReason::SourceUnavailable,
            StageError::NotFound { .. } => StageReason::SourceNotFound,
            StageError::Unavailable { .. } | StageError::Rejected { .. } => StageReason::SourceUnavailable,
            StageError::FileDigest { .. } | StageError::ManifestDigest { .. } => StageReason::DigestMismatch,
            StageError::Size { .. } => StageReason::SizeMismatch,
            StageError::Storage { .. } | StageError::Symlink { .. } => StageReason::StorageUnavailable,
        }
    }

    /// The staged file the failure concerns, if any.
    pub fn file(&self) -> Option<&str> {
        match self {
            StageError::FileDigest { file, .. } | StageError::Size { file, .. } => Some(file),
            _ => None,
        }
    }

    /// Whether another attempt in the same run may succeed.
    pub fn is_retryable(&self) -> bool {
        matches!(self, StageError::Unavailable { .. } | StageError::Credentials { transient: true, .. })
    }

    /// A storage error for `path`.
    pub fn storage(path: &std::path::Path, error: std::io::Error) -> StageError {
        StageError::Storage { path: path.display().to_string(), error }
    }

    /// A token source's refusal of `url`.
    pub fn unauthorized(url: impl std::fmt::Display, status: u16) -> StageError {
        StageError::Unauthorized { url: url.to_string(), status, hint: TOKEN_HINT.to_string() }
    }

    /// A network-level failure for `what`.
    pub fn unavailable(what: impl std::fmt::Display, detail: impl std::fmt::Display) -> StageError {
        StageError::Unavailable { what: what.to_string(), detail: detail.to_string() }
    }
}
