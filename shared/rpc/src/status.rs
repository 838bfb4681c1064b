//! StageError <-> tonic::Status, with BadRequest field violations for INVALID_ARGUMENT.

use assay_domain::{FieldViolation, StageError};
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

/// Longest message put in a status.
const MAX_MESSAGE: usize = 1024;

fn cap(mut s: String) -> String {
    if s.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push_str("...");
    }
    s
}

/// Map a stage error to a gRPC status. INVALID_ARGUMENT carries `google.rpc.BadRequest` details
/// naming every field.
pub fn to_status(e: StageError) -> Status {
    match e {
        StageError::InvalidArgument(violations) => {
            let message = cap(violations
                .iter()
                .map(|v| format!("{}: {}", v.field, v.description))
                .collect::<Vec<_>>()
                .join("; "));
            let mut details = ErrorDetails::new();
            for v in &violations {
                details.add_bad_request_violation(v.field.clone(), v.description.clone());
            }
            Status::with_error_details(Code::InvalidArgument, message, details)
        }
        StageError::NotFound(m) => Status::not_found(cap(m)),
        StageError::FailedPrecondition(m) => Status::failed_precondition(cap(m)),
        StageError::ResourceExhausted(m) => Status::resource_exhausted(cap(m)),
        StageError::Unavailable(m) => Status::unavailable(cap(m)),
        StageError::DeadlineExceeded(m) => Status::deadline_exceeded(cap(m)),
        StageError::Cancelled(m) => Status::cancelled(cap(m)),
        StageError::Unimplemented(m) => Status::unimplemented(cap(m)),
        StageError::Internal(m) => Status::internal(cap(m)),
    }
}

/// Map a status from a downstream stage back to a stage error (field violations preserved).
pub fn from_status(s: Status) -> StageError {
    // What the failed call had already spent is charged to the caller's run.
    crate::context::charge_spent(&s);
    let msg = s.message().to_string();
    match s.code() {
        Code::InvalidArgument => {
            let violations: Vec<FieldViolation> = s
                .get_details_bad_request()
                .map(|b| b.field_violations.into_iter().map(|v| FieldViolation::new(v.field, v.description)).collect())
                .unwrap_or_default();
            if violations.is_empty() {
                StageError::InvalidArgument(vec![FieldViolation::new("request", msg)])
            } else {
                StageError::InvalidArgument(violations)
            }
        }
        Code::NotFound => StageError::NotFound(msg),
        Code::FailedPrecondition | Code::AlreadyExists | Code::Aborted | Code::OutOfRange => {
            StageError::FailedPrecondition(msg)
        }
        Code::ResourceExhausted => StageError::ResourceExhausted(msg),
        Code::Unavailable => StageError::Unavailable(msg),
        Code::DeadlineExceeded => StageError::DeadlineExceeded(msg),
        Code::Cancelled => StageError::Cancelled(msg),
        Code::Unimplemented => StageError::Unimplemented(msg),
        Code::Unauthenticated | Code::PermissionDenied => {
            StageError::FailedPrecondition(format!("upstream refused: {msg}"))
        }
        Code::Ok | Code::Unknown | Code::Internal | Code::DataLoss => StageError::Internal(msg),
    }
}

/// The canonical name of a gRPC status code (`INVALID_ARGUMENT`), as grpcurl and the gRPC docs
/// spell it.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_argument_round_trips_with_fields() {
        let e = StageError::InvalidArgument(vec![
            FieldViolation::new("checklist.items", "must not be empty"),
            FieldViolation::new("targets[0].target", "must not be empty"),
        ]);
        let s = to_status(e.clone());
        assert_eq!(s.code(), Code::InvalidArgument);
        assert!(s.message().contains("checklist.items"));
        let bad = s.get_details_bad_request().expect("bad request details");
        assert_eq!(bad.field_violations.len(), 2);
        assert_eq!(from_status(s), e);
    }

    #[test]
    fn codes_map_both_ways() {
        for e in [
            StageError::NotFound("x".into()),
            StageError::FailedPrecondition("x".into()),
            StageError::ResourceExhausted("x".into()),
            StageError::Unavailable("x".into()),
            StageError::DeadlineExceeded("x".into()),
            StageError::Cancelled("x".into()),
            StageError::Unimplemented("x".into()),
            StageError::Internal("x".into()),
        ] {
            assert_eq!(from_status(to_status(e.clone())), e);
        }
    }

    #[test]
    fn long_messages_are_capped() {
        let s = to_status(StageError::Internal("x".repeat(5000)));
        assert!(s.message().len() <= MAX_MESSAGE + 3);
    }
}
