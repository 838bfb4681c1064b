//! StageError <-> tonic::Status: the code, the message, `google.rpc.ErrorInfo` with the error's
//! machine-readable reason, and `google.rpc.BadRequest` field violations for INVALID_ARGUMENT.

use std::collections::HashMap;

use assay_domain::{ERROR_DOMAIN, FieldViolation, Reason, StageError};
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

/// Map a stage error to a gRPC status: its code, its message (capped), and
/// `google.rpc.ErrorInfo` with its [`Reason`] (domain [`ERROR_DOMAIN`]), from which
/// [`from_status`] makes the same error again. INVALID_ARGUMENT also carries
/// `google.rpc.BadRequest` details naming every field.
pub fn to_status(e: StageError) -> Status {
    let reason = e.reason();
    let mut details = ErrorDetails::new();
    details.set_error_info(reason.as_str(), ERROR_DOMAIN, HashMap::new());
    if let StageError::InvalidArgument(violations) = &e {
        for v in violations {
            details.add_bad_request_violation(v.field.clone(), v.description.clone());
        }
    }
    Status::with_error_details(code_of(reason), cap(e.message()), details)
}

/// The gRPC code of a reason.
pub fn code_of(reason: Reason) -> Code {
    match reason {
        Reason::InvalidInput => Code::InvalidArgument,
        Reason::NotFound => Code::NotFound,
        Reason::FailedPrecondition => Code::FailedPrecondition,
        Reason::ResourceExhausted | Reason::RateLimited | Reason::BudgetExhausted | Reason::UnpricedModel => {
            Code::ResourceExhausted
        }
        Reason::Unavailable | Reason::CircuitOpen => Code::Unavailable,
        Reason::DeadlineExceeded => Code::DeadlineExceeded,
        Reason::Cancelled => Code::Cancelled,
        Reason::Unimplemented => Code::Unimplemented,
        Reason::Internal => Code::Internal,
    }
}

/// Map a status from a downstream stage back to a stage error: the same error [`to_status`] was
/// given when the status carries Assay's `ErrorInfo` (its reason, not its message, decides), else
/// the error of its code (a status from tonic itself, a proxy or another server). Field
/// violations are kept.
pub fn from_status(s: Status) -> StageError {
    // What the failed call had already spent is charged to the caller's run.
    crate::spent::charge_spent(&s);
    let msg = s.message().to_string();
    let details = s.get_error_details();
    let violations: Vec<FieldViolation> = details
        .bad_request()
        .map(|b| b.field_violations.iter().map(|v| FieldViolation::new(&v.field, &v.description)).collect())
        .unwrap_or_default();
    let ours = details
        .error_info()
        .filter(|info| info.domain == ERROR_DOMAIN)
        .and_then(|info| Reason::from_wire(&info.reason))
        .filter(|reason| code_of(*reason) == s.code());
    if let Some(reason) = ours {
        return StageError::from_reason(reason, msg, violations);
    }
    if broken_connection(&s) {
        return StageError::Unavailable(format!("the connection to the stage broke during the call: {msg}"));
    }
    match s.code() {
        Code::InvalidArgument => StageError::from_reason(Reason::InvalidInput, msg, violations),
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

/// Whether `s` is the client's own report of a connection that broke under the call (the
/// stage's process died, or its connection was reset), not an answer of the stage: tonic says
/// UNKNOWN "transport error" with the transport's error as its source. The call may succeed on
/// another connection or replica, so it is UNAVAILABLE.
fn broken_connection(s: &Status) -> bool {
    if !matches!(s.code(), Code::Unknown | Code::Internal) {
        return false;
    }
    let mut cause = std::error::Error::source(s);
    while let Some(e) = cause {
        if e.is::<hyper::Error>() || e.is::<tonic::transport::Error>() {
            return true;
        }
        cause = e.source();
    }
    false
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

    /// One error of every reason.
    pub(crate) fn one_of_each() -> Vec<StageError> {
        use assay_domain::BudgetRefusal;
        vec![
            StageError::invalid("request.problem", "must not be empty"),
            StageError::NotFound("run r1".into()),
            StageError::FailedPrecondition("the run has finished".into()),
            StageError::ResourceExhausted("the gateway is full".into()),
            StageError::RateLimited("model backend rate limited: http 429".into()),
            StageError::BudgetExhausted(BudgetRefusal::spent("budget exhausted: 110 of 100 tokens used")),
            StageError::BudgetExhausted(BudgetRefusal::unpriced("budget exhausted: the model has no price")),
            StageError::Unavailable("model backend unavailable: http 503".into()),
            StageError::CircuitOpen("model backend unavailable: circuit open".into()),
            StageError::DeadlineExceeded("the call's deadline passed".into()),
            StageError::Cancelled("x".into()),
            StageError::Unimplemented("x".into()),
            StageError::Internal("x".into()),
        ]
    }

    #[test]
    fn every_reason_maps_both_ways_with_its_error_info() {
        let errors = one_of_each();
        let reasons: std::collections::HashSet<Reason> = errors.iter().map(StageError::reason).collect();
        assert_eq!(reasons.len(), Reason::ALL.len(), "one error of every reason");
        for e in errors {
            let s = to_status(e.clone());
            assert_eq!(s.code(), code_of(e.reason()), "{e}");
            let info = s.get_details_error_info().expect("error info");
            assert_eq!((info.reason.as_str(), info.domain.as_str()), (e.reason().as_str(), "assay"));
            assert_eq!(from_status(s), e);
        }
    }

    #[test]
    fn the_reason_decides_not_the_message() {
        // A budget refusal whose message says nothing of budgets is still one.
        let e = StageError::BudgetExhausted(assay_domain::BudgetRefusal::spent("no more, sorry"));
        assert!(matches!(from_status(to_status(e)), StageError::BudgetExhausted(_)));
        // A rate limit whose message talks of an exhausted budget is still a rate limit.
        let e = StageError::RateLimited("budget exhausted: the provider's, not ours".into());
        assert_eq!(from_status(to_status(e.clone())), e);
        // Without Assay's ErrorInfo (another server, a proxy, tonic itself): the code decides,
        // whatever the message says.
        let s = Status::resource_exhausted("budget exhausted: 10 of 5 tokens used");
        assert_eq!(from_status(s), StageError::ResourceExhausted("budget exhausted: 10 of 5 tokens used".into()));
        let s = Status::unavailable("circuit open");
        assert_eq!(from_status(s), StageError::Unavailable("circuit open".into()));
        // Another domain's reason, or ours on a code it does not go with, is not taken.
        let mut details = ErrorDetails::new();
        details.set_error_info("BUDGET_EXHAUSTED", "example.com", HashMap::new());
        let s = Status::with_error_details(Code::ResourceExhausted, "x", details);
        assert_eq!(from_status(s), StageError::ResourceExhausted("x".into()));
        let mut details = ErrorDetails::new();
        details.set_error_info("BUDGET_EXHAUSTED", ERROR_DOMAIN, HashMap::new());
        let s = Status::with_error_details(Code::Internal, "x", details);
        assert_eq!(from_status(s), StageError::Internal("x".into()));
    }

    #[test]
    fn long_messages_are_capped() {
        let s = to_status(StageError::Internal("x".repeat(5000)));
        assert!(s.message().len() <= MAX_MESSAGE + 3);
    }
}
