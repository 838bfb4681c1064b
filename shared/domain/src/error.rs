//! The closed error type every stage returns.

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
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StageError {
    #[error("invalid argument: {}", describe(.0))]
    InvalidArgument(Vec<FieldViolation>),
    #[error("not found: {0}")]
    NotFound(String),
    #[error("failed precondition: {0}")]
    FailedPrecondition(String),
    #[error("resource exhausted: {0}")]
    ResourceExhausted(String),
    #[error("unavailable: {0}")]
    Unavailable(String),
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
            | StageError::Unavailable(_)
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
