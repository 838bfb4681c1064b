//! The closed error type every stage returns, and the machine-readable reasons it carries.

/// One invalid field of a request.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct FieldViolation {
    /// Path of the field, e.g. `targets[2].target`.
    pub field: String,
    /// What is wrong, with the limit when there is one.
    pub description: String,
}

impl FieldViolation {
    pub fn new(field: impl Into<String>, description: impl Into<String>) -> Self {
        Self { field: field.into(), description: description.into() }
    }
}

/// Errors of stage logic. Closed: adapters map every variant explicitly.
///
/// Each variant has one gRPC code and one machine-readable [`Reason`], which crosses the wire as
/// `google.rpc.ErrorInfo` (domain [`ERROR_DOMAIN`]): a remote stage's error decodes into the same
/// value as a local one, so callers match on the variant (or [`StageError::reason`]), never on
/// the message. Several variants share a code (RESOURCE_EXHAUSTED: [`StageError::ResourceExhausted`],
/// [`StageError::RateLimited`], [`StageError::BudgetExhausted`]; UNAVAILABLE:
/// [`StageError::Unavailable`], [`StageError::CircuitOpen`]); their reasons tell them apart.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StageError {
    #[error("invalid argument: {}", describe(.0))]
    InvalidArgument(Vec<FieldViolation>),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("failed precondition: {0}")]
    FailedPrecondition(String),
    /// A limit that frees up with time (a full gateway, a watcher that fell behind): a later
    /// call may pass.
    #[error("resource exhausted: {0}")]
    ResourceExhausted(String),
    /// A model backend's rate limit, its client's retries spent: a later call may pass.
    #[error("resource exhausted: {0}")]
    RateLimited(String),
    /// The work's budget cannot pay for the call (or a spend cap is reached): never retried, the
    /// work starts no more calls.
    #[error("resource exhausted: {0}")]
    BudgetExhausted(BudgetRefusal),
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// A model backend's circuit breaker is open: the call failed at once, without reaching it.
    #[error("unavailable: {0}")]
    CircuitOpen(String),
    #[error("deadline exceeded: {0}")]
    DeadlineExceeded(String),
    #[error("cancelled: {0}")]
    Cancelled(String),
    #[error("unimplemented: {0}")]
    Unimplemented(String),
    #[error("internal: {0}")]
    Internal(String),
}

fn describe(v: &[FieldViolation]) -> String {
    v.iter().map(|f| format!("{}: {}", f.field, f.description)).collect::<Vec<_>>().join("; ")
}

/// How every budget refusal's message starts (for people: code matches on
/// [`StageError::BudgetExhausted`] and [`Exhaustion`], never on this text).
pub const EXHAUSTED: &str = "budget exhausted";

/// A model call the work's budget could not pay for: why (machine-readable) and the message
/// people read (it starts with [`EXHAUSTED`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct BudgetRefusal {
    pub cause: Exhaustion,
    pub message: String,
}

/// Why a budget refused a call.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Exhaustion {
    /// Its tokens or dollars are spent, a call needs more than is left, or a ceiling (a
    /// backend's daily spend cap) is reached.
    Spent,
    /// A dollar limit cannot count a model without a price (the call's, or one called before):
    /// configure `backends.<name>.prices`.
    Unpriced,
}

impl BudgetRefusal {
    pub fn new(cause: Exhaustion, message: impl Into<String>) -> Self {
        Self { cause, message: message.into() }
    }

    /// A budget spent: `message` says how.
    pub fn spent(message: impl Into<String>) -> Self {
        Self::new(Exhaustion::Spent, message)
    }

    /// A model without a price under a dollar limit: `message` says which.
    pub fn unpriced(message: impl Into<String>) -> Self {
        Self::new(Exhaustion::Unpriced, message)
    }
}

/// The `google.rpc.ErrorInfo.domain` of Assay's errors.
pub const ERROR_DOMAIN: &str = "assay";

/// Why a stage call failed, machine-readable: one per [`StageError`] variant, and per
/// [`Exhaustion`] of a budget refusal. Sent as `google.rpc.ErrorInfo.reason`
/// ([`Reason::as_str`]: `BUDGET_EXHAUSTED`, ...), so clients in any language can match on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// INVALID_ARGUMENT: the request is wrong; the field violations say where
    /// (`google.rpc.BadRequest`).
    InvalidInput,
    /// NOT_FOUND.
    NotFound,
    /// FAILED_PRECONDITION: the state or the configuration does not allow the call (a finished
    /// run resumed, a backend that refused the request or its credentials).
    FailedPrecondition,
    /// RESOURCE_EXHAUSTED: a limit that frees up with time (a full gateway).
    ResourceExhausted,
    /// RESOURCE_EXHAUSTED: a model backend's rate limit.
    RateLimited,
    /// RESOURCE_EXHAUSTED: the work's budget (or a spend cap) is spent.
    BudgetExhausted,
    /// RESOURCE_EXHAUSTED: a dollar limit cannot count a model without a price.
    UnpricedModel,
    /// UNAVAILABLE: a backend (model server, run store, stage) failed or could not be reached.
    Unavailable,
    /// UNAVAILABLE: a model backend's circuit breaker is open.
    CircuitOpen,
    /// DEADLINE_EXCEEDED: the call's own deadline passed.
    DeadlineExceeded,
    /// CANCELLED.
    Cancelled,
    /// UNIMPLEMENTED.
    Unimplemented,
    /// INTERNAL.
    Internal,
}

impl Reason {
    /// Every reason.
    pub const ALL: [Reason; 13] = [
        Reason::InvalidInput,
        Reason::NotFound,
        Reason::FailedPrecondition,
        Reason::ResourceExhausted,
        Reason::RateLimited,
        Reason::BudgetExhausted,
        Reason::UnpricedModel,
        Reason::Unavailable,
        Reason::CircuitOpen,
        Reason::DeadlineExceeded,
        Reason::Cancelled,
        Reason::Unimplemented,
        Reason::Internal,
    ];

    /// The wire name (`google.rpc.ErrorInfo.reason`: UPPER_SNAKE_CASE).
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::InvalidInput => "INVALID_INPUT",
            Reason::NotFound => "NOT_FOUND",
            Reason::FailedPrecondition => "FAILED_PRECONDITION",
            Reason::ResourceExhausted => "RESOURCE_EXHAUSTED",
            Reason::RateLimited => "RATE_LIMITED",
            Reason::BudgetExhausted => "BUDGET_EXHAUSTED",
            Reason::UnpricedModel => "UNPRICED_MODEL",
            Reason::Unavailable => "UNAVAILABLE",
            Reason::CircuitOpen => "CIRCUIT_OPEN",
            Reason::DeadlineExceeded => "DEADLINE_EXCEEDED",
            Reason::Cancelled => "CANCELLED",
            Reason::Unimplemented => "UNIMPLEMENTED",
            Reason::Internal => "INTERNAL",
        }
    }

    /// The reason of a wire name, if it is one.
    pub fn from_wire(name: &str) -> Option<Reason> {
        Reason::ALL.into_iter().find(|r| r.as_str() == name)
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl StageError {
    /// Rewrite the field paths of an INVALID_ARGUMENT (e.g. to prefix a stage's fields with where
    /// they sit in a pipeline request); other errors pass through unchanged.
    pub fn map_fields(self, mut f: impl FnMut(String) -> String) -> Self {
        match self {
            StageError::InvalidArgument(vs) => StageError::InvalidArgument(
                vs.into_iter().map(|v| FieldViolation { field: f(v.field), description: v.description }).collect(),
            ),
            other @ (StageError::NotFound(_)
            | StageError::FailedPrecondition(_)
            | StageError::ResourceExhausted(_)
            | StageError::RateLimited(_)
            | StageError::BudgetExhausted(_)
            | StageError::Unavailable(_)
            | StageError::CircuitOpen(_)
            | StageError::DeadlineExceeded(_)
            | StageError::Cancelled(_)
            | StageError::Unimplemented(_)
            | StageError::Internal(_)) => other,
        }
    }

    /// One invalid field.
    pub fn invalid(field: impl Into<String>, description: impl Into<String>) -> Self {
        StageError::InvalidArgument(vec![FieldViolation::new(field, description)])
    }

    /// Why the call failed, machine-readable.
    pub fn reason(&self) -> Reason {
        match self {
            StageError::InvalidArgument(_) => Reason::InvalidInput,
            StageError::NotFound(_) => Reason::NotFound,
            StageError::FailedPrecondition(_) => Reason::FailedPrecondition,
            StageError::ResourceExhausted(_) => Reason::ResourceExhausted,
            StageError::RateLimited(_) => Reason::RateLimited,
            StageError::BudgetExhausted(r) => match r.cause {
                Exhaustion::Spent => Reason::BudgetExhausted,
                Exhaustion::Unpriced => Reason::UnpricedModel,
            },
            StageError::Unavailable(_) => Reason::Unavailable,
            StageError::CircuitOpen(_) => Reason::CircuitOpen,
            StageError::DeadlineExceeded(_) => Reason::DeadlineExceeded,
            StageError::Cancelled(_) => Reason::Cancelled,
            StageError::Unimplemented(_) => Reason::Unimplemented,
            StageError::Internal(_) => Reason::Internal,
        }
    }

    /// The message without the code in front (what a status carries): the violations of an
    /// INVALID_ARGUMENT, `field: description` joined by `; `.
    pub fn message(&self) -> String {
        match self {
            StageError::InvalidArgument(v) => describe(v),
            StageError::BudgetExhausted(r) => r.message.clone(),
            StageError::NotFound(m)
            | StageError::FailedPrecondition(m)
            | StageError::ResourceExhausted(m)
            | StageError::RateLimited(m)
            | StageError::Unavailable(m)
            | StageError::CircuitOpen(m)
            | StageError::DeadlineExceeded(m)
            | StageError::Cancelled(m)
            | StageError::Unimplemented(m)
            | StageError::Internal(m) => m.clone(),
        }
    }

    /// The error of `reason` with `message` (how an error comes back from the wire). An
    /// INVALID_INPUT holds `violations`, or the message as a violation of `request` when none
    /// came with it.
    pub fn from_reason(reason: Reason, message: String, violations: Vec<FieldViolation>) -> StageError {
        match reason {
            Reason::InvalidInput if violations.is_empty() => StageError::invalid("request", message),
            Reason::InvalidInput => StageError::InvalidArgument(violations),
            Reason::NotFound => StageError::NotFound(message),
            Reason::FailedPrecondition => StageError::FailedPrecondition(message),
            Reason::ResourceExhausted => StageError::ResourceExhausted(message),
            Reason::RateLimited => StageError::RateLimited(message),
            Reason::BudgetExhausted => StageError::BudgetExhausted(BudgetRefusal::spent(message)),
            Reason::UnpricedModel => StageError::BudgetExhausted(BudgetRefusal::unpriced(message)),
            Reason::Unavailable => StageError::Unavailable(message),
            Reason::CircuitOpen => StageError::CircuitOpen(message),
            Reason::DeadlineExceeded => StageError::DeadlineExceeded(message),
            Reason::Cancelled => StageError::Cancelled(message),
            Reason::Unimplemented => StageError::Unimplemented(message),
            Reason::Internal => StageError::Internal(message),
        }
    }
}

impl From<BudgetRefusal> for StageError {
    fn from(r: BudgetRefusal) -> Self {
        StageError::BudgetExhausted(r)
    }
}

/// Why a model's reply cannot be used: what the stage reading it found wrong. Only ever shown:
/// to the model when it is asked again, in a result's record, in a stage's UNAVAILABLE.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UnusableReply(pub String);

impl UnusableReply {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<String> for UnusableReply {
    fn from(why: String) -> Self {
        UnusableReply(why)
    }
}

impl From<UnusableReply> for String {
    fn from(why: UnusableReply) -> String {
        why.0
    }
}

impl From<&str> for UnusableReply {
    fn from(why: &str) -> Self {
        UnusableReply(why.to_string())
    }
}

/// Collects field violations while validating a request.
#[derive(Debug, Default)]
pub struct Violations(Vec<FieldViolation>);

impl Violations {
    pub fn new() -> Self {
        Self::default()
    }
    pub fn push(&mut self, field: impl Into<String>, description: impl Into<String>) {
        self.0.push(FieldViolation::new(field, description));
    }
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
    /// `Ok(())` when nothing was pushed, else INVALID_ARGUMENT with every violation.
    pub fn into_result(self) -> Result<(), StageError> {
        if self.0.is_empty() { Ok(()) } else { Err(StageError::InvalidArgument(self.0)) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_has_one_wire_name() {
        for r in Reason::ALL {
            assert_eq!(Reason::from_wire(r.as_str()), Some(r));
        }
        let names: std::collections::HashSet<&str> = Reason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names.len(), Reason::ALL.len());
        assert_eq!(Reason::from_wire("budget exhausted"), None);
    }

    #[test]
    fn a_reason_and_message_make_the_same_error_again() {
        let errors = [
            StageError::invalid("checklist.items", "must not be empty"),
            StageError::NotFound("run r1".into()),
            StageError::FailedPrecondition("x".into()),
            StageError::ResourceExhausted("x".into()),
            StageError::RateLimited("x".into()),
            StageError::BudgetExhausted(BudgetRefusal::spent("x")),
            StageError::BudgetExhausted(BudgetRefusal::unpriced("x")),
            StageError::Unavailable("x".into()),
            StageError::CircuitOpen("x".into()),
            StageError::DeadlineExceeded("x".into()),
            StageError::Cancelled("x".into()),
            StageError::Unimplemented("x".into()),
            StageError::Internal("x".into()),
        ];
        assert_eq!(errors.len(), Reason::ALL.len());
        for e in errors {
            let violations = if let StageError::InvalidArgument(v) = &e { v.clone() } else { Vec::new() };
            assert_eq!(StageError::from_reason(e.reason(), e.message(), violations), e);
        }
    }

    #[test]
    fn a_budget_refusal_is_classified_by_its_cause_not_its_text() {
        // No "budget exhausted" anywhere in the message: still a budget refusal.
        let e: StageError = BudgetRefusal::spent("the run may spend no more").into();
        assert_eq!(e.reason(), Reason::BudgetExhausted);
        assert!(matches!(e, StageError::BudgetExhausted(_)));
        assert_eq!(StageError::BudgetExhausted(BudgetRefusal::unpriced("?")).reason(), Reason::UnpricedModel);
        // A rate limit that talks about budgets is still a rate limit.
        assert_eq!(StageError::RateLimited("budget exhausted".into()).reason(), Reason::RateLimited);
        assert_eq!(e.to_string(), "resource exhausted: the run may spend no more");
    }
}
