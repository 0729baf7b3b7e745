//! The one error type of this crate. Every adapter maps what its cloud says into one of these
//! variants, each carrying the provider's own code and message, so the claim engine and the
//! controller decide on a closed set of kinds and never see an SDK type.

use flotilla_apis::constants::reason;

/// A provider refused or failed a request. `code` is the provider's own error code
/// (`InsufficientInstanceCapacity`), `message` its own words.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ProviderError {
    /// The provider has no capacity of that shape there now.
    #[error("insufficient capacity ({code}): {message}")]
    InsufficientCapacity {
        /// Provider code.
        code: String,
        /// Provider message.
        message: String,
    },
    /// An account quota or limit stopped the request.
    #[error("quota exceeded ({code}): {message}")]
    QuotaExceeded {
        /// Provider code.
        code: String,
        /// Provider message.
        message: String,
    },
    /// The named reservation does not fit the request (type, zone, size, dates, state).
    #[error("reservation mismatch ({code}): {message}")]
    ReservationMismatch {
        /// Provider code.
        code: String,
        /// Provider message.
        message: String,
    },
    /// The capacity type is not offered for that shape there.
    #[error("capacity type unavailable ({code}): {message}")]
    CapacityTypeUnavailable {
        /// Provider code.
        code: String,
        /// Provider message.
        message: String,
    },
    /// The provider throttled us, also after the adapter's own retries.
    #[error("throttled ({code}): {message}")]
    Throttled {
        /// Provider code.
        code: String,
        /// Provider message.
        message: String,
    },
    /// The credentials were refused or lack a permission.
    #[error("unauthorized ({code}): {message}")]
    Unauthorized {
        /// Provider code.
        code: String,
        /// Provider message.
        message: String,
    },
    /// The provider rejected the request as malformed or referring to something unknown.
    #[error("invalid request ({code}): {message}")]
    InvalidRequest {
        /// Provider code.
        code: String,
        /// Provider message.
        message: String,
    },
    /// The provider could not be reached or failed internally.
    #[error("provider unavailable ({code}): {message}")]
    Unavailable {
        /// Provider code.
        code: String,
        /// Provider message.
        message: String,
    },
}

/// The kind of a [`ProviderError`], without its payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ErrorKind {
    /// [`ProviderError::InsufficientCapacity`].
    InsufficientCapacity,
    /// [`ProviderError::QuotaExceeded`].
    QuotaExceeded,
    /// [`ProviderError::ReservationMismatch`].
    ReservationMismatch,
    /// [`ProviderError::CapacityTypeUnavailable`].
    CapacityTypeUnavailable,
    /// [`ProviderError::Throttled`].
    Throttled,
    /// [`ProviderError::Unauthorized`].
    Unauthorized,
    /// [`ProviderError::InvalidRequest`].
    InvalidRequest,
    /// [`ProviderError::Unavailable`].
    Unavailable,
}

impl ErrorKind {
    /// The kind's name, as recorded in `status.attempts[].result`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::InsufficientCapacity => "InsufficientCapacity",
            Self::QuotaExceeded => "QuotaExceeded",
            Self::ReservationMismatch => "ReservationMismatch",
            Self::CapacityTypeUnavailable => "CapacityTypeUnavailable",
            Self::Throttled => "Throttled",
            Self::Unauthorized => "Unauthorized",
            Self::InvalidRequest => "InvalidRequest",
            Self::Unavailable => "Unavailable",
        }
    }

    /// The CapacityClaim reason a failure of this kind leads to.
    pub fn claim_reason(self) -> &'static str {
        match self {
            Self::InsufficientCapacity | Self::CapacityTypeUnavailable => reason::CAPACITY_UNAVAILABLE,
            Self::QuotaExceeded => reason::QUOTA_EXCEEDED,
            Self::ReservationMismatch => reason::RESERVATION_MISMATCH,
            Self::Throttled | Self::Unavailable => reason::PROVIDER_UNAVAILABLE,
            Self::Unauthorized => reason::PROVIDER_UNAUTHORIZED,
            Self::InvalidRequest => reason::PROVIDER_REJECTED,
        }
    }

    /// Whether trying again later, unchanged, may succeed without anyone changing anything.
    pub fn is_transient(self) -> bool {
        matches!(self, Self::Throttled | Self::Unavailable)
    }
}

impl ProviderError {
    /// Builds an error of `kind`.
    pub fn new(kind: ErrorKind, code: impl Into<String>, message: impl Into<String>) -> Self {
        let (code, message) = (code.into(), message.into());
        match kind {
            ErrorKind::InsufficientCapacity => Self::InsufficientCapacity { code, message },
            ErrorKind::QuotaExceeded => Self::QuotaExceeded { code, message },
            ErrorKind::ReservationMismatch => Self::ReservationMismatch { code, message },
            ErrorKind::CapacityTypeUnavailable => Self::CapacityTypeUnavailable { code, message },
            ErrorKind::Throttled => Self::Throttled { code, message },
            ErrorKind::Unauthorized => Self::Unauthorized { code, message },
            ErrorKind::InvalidRequest => Self::InvalidRequest { code, message },
            ErrorKind::Unavailable => Self::Unavailable { code, message },
        }
    }

    /// The kind.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Self::InsufficientCapacity { .. } => ErrorKind::InsufficientCapacity,
            Self::QuotaExceeded { .. } => ErrorKind::QuotaExceeded,
            Self::ReservationMismatch { .. } => ErrorKind::ReservationMismatch,
            Self::CapacityTypeUnavailable { .. } => ErrorKind::CapacityTypeUnavailable,
            Self::Throttled { .. } => ErrorKind::Throttled,
            Self::Unauthorized { .. } => ErrorKind::Unauthorized,
            Self::InvalidRequest { .. } => ErrorKind::InvalidRequest,
            Self::Unavailable { .. } => ErrorKind::Unavailable,
        }
    }

    /// The provider's own code.
    pub fn code(&self) -> &str {
        self.parts().0
    }

    /// The provider's own message.
    pub fn message(&self) -> &str {
        self.parts().1
    }

    fn parts(&self) -> (&str, &str) {
        match self {
            Self::InsufficientCapacity { code, message }
            | Self::QuotaExceeded { code, message }
            | Self::ReservationMismatch { code, message }
            | Self::CapacityTypeUnavailable { code, message }
            | Self::Throttled { code, message }
            | Self::Unauthorized { code, message }
            | Self::InvalidRequest { code, message }
            | Self::Unavailable { code, message } => (code, message),
        }
    }
}
