//! What a reconcile can fail with, and how a finalizer's failures map onto it.

use crate::member;

/// Errors of a reconcile. Transient ones are retried with per-object backoff.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The control cluster's API failed.
    #[error("control cluster API: {}", member::brief(.0))]
    Kube(#[from] kube::Error),
    /// The finalizer machinery failed.
    #[error("finalizer: {0}")]
    Finalizer(String),
    /// Member objects could not all be removed; the finalizer stays.
    #[error("cleanup incomplete: {0}")]
    Cleanup(String),
    /// The object changed between the read and a finalizer patch (its JSON-patch `test`
    /// failed, or a conflict): looked at again shortly, from the newer version.
    #[error("object changed meanwhile: {0}")]
    Stale(String),
    /// The fleet solve did not finish (it panicked): retried with back-off, nothing applied.
    #[error("fleet solve failed: {0}")]
    Solve(String),
}

/// A finalizer-wrapped reconcile's error as the reconcile's own: the inner error as it was, a
/// failed finalizer patch as a control-cluster API error.
pub(crate) fn from_finalizer(e: kube::runtime::finalizer::Error<Error>) -> Error {
    use kube::runtime::finalizer::Error as F;
    match e {
        F::ApplyFailed(e) | F::CleanupFailed(e) => e,
        F::AddFinalizer(kube::Error::Api(s)) | F::RemoveFinalizer(kube::Error::Api(s))
            if s.code == 409 || s.code == 422 =>
        {
            Error::Stale(s.message)
        }
        F::AddFinalizer(e) | F::RemoveFinalizer(e) => Error::Kube(e),
        other => Error::Finalizer(other.to_string()),
    }
}
