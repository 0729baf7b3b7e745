//! AWS error codes → typed `ProviderError`s. EC2, EKS and EC2 Auto Scaling answer with codes
//! (`InsufficientInstanceCapacity`, `VcpuLimitExceeded`, `RequestLimitExceeded`, …); this
//! table is the only place that knows them. SDK failures without a code (timeouts, dispatch
//! failures) become `Unavailable`. The table is documented in docs/providers.md.

use aws_sdk_ec2::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};

use crate::error::{ErrorKind, ProviderError};

/// The typed kind of an AWS error code.
pub fn kind_of(code: &str) -> ErrorKind {
    match code {
        "InsufficientInstanceCapacity"
        | "InsufficientHostCapacity"
        | "InsufficientCapacity"
        | "InsufficientReservedInstanceCapacity"
        | "InsufficientCapacityOnHost"
        | "SpotMaxPriceTooLow"
        | "CapacityNotAvailableException"
        | "AsgInstanceLaunchFailures"
        | "Ec2InsufficientCapacity" => ErrorKind::InsufficientCapacity,
        "VcpuLimitExceeded"
        | "InstanceLimitExceeded"
        | "MaxSpotInstanceCountExceeded"
        | "ResourceLimitExceeded"
        | "ResourceLimitExceededException"
        | "ServiceQuotaExceededException"
        | "PlacementGroupLimitExceeded"
        | "ReservationCapacityExceeded" => ErrorKind::QuotaExceeded,
        "Unsupported" | "UnsupportedOperation" | "UnsupportedAvailabilityZoneException" => {
            ErrorKind::CapacityTypeUnavailable
        }
        "RequestLimitExceeded"
        | "Throttling"
        | "ThrottlingException"
        | "TooManyRequestsException"
        | "RequestThrottled"
        | "RequestThrottledException"
        | "EC2ThrottledException"
        // EC2 Auto Scaling: another scaling activity or update holds the group; try again.
        | "ScalingActivityInProgress"
        | "ResourceContention" => ErrorKind::Throttled,
        "UnauthorizedOperation"
        | "AuthFailure"
        | "AccessDenied"
        | "AccessDeniedException"
        | "UnrecognizedClientException"
        | "InvalidClientTokenId"
        | "ExpiredToken"
        | "ExpiredTokenException"
        | "SignatureDoesNotMatch"
        | "OptInRequired"
        | "Blocked" => ErrorKind::Unauthorized,
        "InternalError"
        | "InternalFailure"
        | "ServerException"
        | "ServiceUnavailable"
        | "ServiceUnavailableException"
        | "Unavailable" => ErrorKind::Unavailable,
        c if c.starts_with("InvalidCapacityReservation")
            || c.starts_with("CapacityReservation")
            || c.starts_with("InvalidCapacityBlock")
            || c == "ReservationMismatch" =>
        {
            ErrorKind::ReservationMismatch
        }
        _ => ErrorKind::InvalidRequest,
    }
}

/// A typed error from an AWS code and message.
pub fn from_code(code: &str, message: &str) -> ProviderError {
    ProviderError::new(kind_of(code), code, message)
}

/// A typed error from any SDK error; `operation` names the call in the message.
pub(crate) fn from_sdk<E, R>(operation: &str, err: &SdkError<E, R>) -> ProviderError
where
    E: ProvideErrorMetadata + std::error::Error + 'static,
    R: std::fmt::Debug,
{
    if let Some(code) = err.code() {
        return from_code(code, &format!("{operation}: {}", err.message().unwrap_or("no message")));
    }
    let (kind, code) = match err {
        SdkError::ConstructionFailure(_) => (ErrorKind::InvalidRequest, "ConstructionFailure"),
        SdkError::TimeoutError(_) => (ErrorKind::Unavailable, "Timeout"),
        SdkError::DispatchFailure(_) => (ErrorKind::Unavailable, "DispatchFailure"),
        SdkError::ResponseError(_) => (ErrorKind::Unavailable, "ResponseError"),
        _ => (ErrorKind::Unavailable, "Unknown"),
    };
    ProviderError::new(kind, code, format!("{operation}: {}", DisplayErrorContext(err)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_map_to_kinds() {
        for (code, kind) in [
            ("InsufficientInstanceCapacity", ErrorKind::InsufficientCapacity),
            ("VcpuLimitExceeded", ErrorKind::QuotaExceeded),
            ("InstanceLimitExceeded", ErrorKind::QuotaExceeded),
            ("MaxSpotInstanceCountExceeded", ErrorKind::QuotaExceeded),
            ("InvalidCapacityReservationId.NotFound", ErrorKind::ReservationMismatch),
            ("InvalidCapacityReservationId.Malformed", ErrorKind::ReservationMismatch),
            ("Unsupported", ErrorKind::CapacityTypeUnavailable),
            ("RequestLimitExceeded", ErrorKind::Throttled),
            ("ThrottlingException", ErrorKind::Throttled),
            ("ScalingActivityInProgress", ErrorKind::Throttled),
            ("ResourceContention", ErrorKind::Throttled),
            ("UnauthorizedOperation", ErrorKind::Unauthorized),
            ("AuthFailure", ErrorKind::Unauthorized),
            ("AccessDeniedException", ErrorKind::Unauthorized),
            ("InternalError", ErrorKind::Unavailable),
            ("InvalidParameterValue", ErrorKind::InvalidRequest),
            ("ResourceNotFoundException", ErrorKind::InvalidRequest),
        ] {
            assert_eq!(kind_of(code), kind, "{code}");
        }
    }
}
