//! How a verb ends, and the one place its ending becomes the process's exit code ([`exit_code`]):
//! every verb returns `Result<Ending, CliError>` and leaves the code to [`finish`].

use std::process::ExitCode;

// The exit codes of every verb (each verb's README section and `--help` say which it uses).

/// Exit code of a verb that failed ([`CliError::Failed`]): the run, the gateway, the connection,
/// or input refused by a verb that does not tell bad input apart.
pub const EXIT_FAILED: u8 = 1;
/// Exit code of `--fail-on-regression` when a candidate is significantly worse.
pub const EXIT_REGRESSION: u8 = 1;
/// Exit code of unusable input: a file, a line, an option, a request the gateway rejected, an
/// unknown run id, an unreachable gateway; and of a regression gate whose statistics are not
/// numbers (no verdict).
pub const EXIT_BAD_INPUT: u8 = 2;
/// Exit code when some records (or items, or problems) failed but the run produced results.
pub const EXIT_PARTIAL: u8 = 3;
/// Exit code of a best-effort refinement (full-auto below its thresholds).
pub const EXIT_BEST_EFFORT: u8 = 3;
/// Exit code of a refinement left waiting for a human (semi-auto escalation).
pub const EXIT_AWAITING_HUMAN: u8 = 4;
/// Exit code of `--fail-on-regression` when a responder could not be evaluated at all (every
/// response failed): no verdict, which is not a pass.
pub const EXIT_UNEVALUATED: u8 = 5;

/// Why a verb failed. The verb says which kind of failure it is; [`exit_code`] alone decides
/// the number.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CliError {
    /// The input, an option, or the request as the gateway judged it: a file, a line, an unknown
    /// run id, an unreachable gateway for the verbs that read runs ([`EXIT_BAD_INPUT`]).
    BadInput(String),
    /// The connection, the gateway, the event stream or the run failed, the run was cancelled, or
    /// the input was refused by a verb that does not tell bad input apart ([`EXIT_FAILED`]).
    Failed(String),
}

impl CliError {
    /// The error of a verb that does not tell bad input apart (`eval`, `score`, `generate`,
    /// `runs`): a failure, exit 1 either way.
    #[must_use]
    pub fn failed(self) -> Self {
        Self::Failed(self.into_message())
    }

    /// The error of a verb for which every error is bad input (`compare`, `power`, `agreement`:
    /// files, options, run ids and the gateway that holds them).
    #[must_use]
    pub fn bad_input(self) -> Self {
        Self::BadInput(self.into_message())
    }

    /// The error line, without the `assay:` prefix.
    pub fn into_message(self) -> String {
        match self {
            Self::BadInput(e) | Self::Failed(e) => e,
        }
    }

    /// The error line, without the `assay:` prefix.
    pub fn message(&self) -> &str {
        match self {
            Self::BadInput(e) | Self::Failed(e) => e,
        }
    }
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.message())
    }
}

impl std::error::Error for CliError {}

impl From<tonic::Status> for CliError {
    /// A request the gateway refuses as invalid is bad input; any other status a failure.
    fn from(s: tonic::Status) -> Self {
        if s.code() == tonic::Code::InvalidArgument {
            Self::BadInput(status_text(&s))
        } else {
            Self::Failed(status_text(&s))
        }
    }
}

impl From<std::io::Error> for CliError {
    /// A file or a stream that could not be read or written.
    fn from(e: std::io::Error) -> Self {
        Self::Failed(e.to_string())
    }
}

impl From<assay_config::ConfigError> for CliError {
    /// A configuration that cannot be used: the verb could not start.
    fn from(e: assay_config::ConfigError) -> Self {
        Self::Failed(e.to_string())
    }
}

impl From<assay_runtime::RuntimeError> for CliError {
    /// The mesh, a backend or a channel that could not be set up.
    fn from(e: assay_runtime::RuntimeError) -> Self {
        Self::Failed(e.to_string())
    }
}

/// How a verb ended when it did not fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    /// Done: every record, item or problem, a refinement accepted or detached.
    Done,
    /// Some records (items, problems) failed; the others were written ([`EXIT_PARTIAL`]).
    Partial,
    /// A refinement ended at its best iteration, below the thresholds ([`EXIT_BEST_EFFORT`]).
    BestEffort,
    /// A refinement waits for a human on the gateway ([`EXIT_AWAITING_HUMAN`]).
    AwaitingHuman,
    /// `--fail-on-regression`: the candidate is significantly worse; the verb said why
    /// ([`EXIT_REGRESSION`]).
    Regressed,
    /// `--fail-on-regression`: a responder could not be evaluated; the verb said why
    /// ([`EXIT_UNEVALUATED`]).
    Unevaluated,
}

/// What a verb returns.
pub type Outcome = Result<Ending, CliError>;

/// The exit code of every ending and every error, in one place.
pub fn exit_code(outcome: &Outcome) -> u8 {
    match outcome {
        Ok(Ending::Done) => 0,
        Ok(Ending::Partial) => EXIT_PARTIAL,
        Ok(Ending::BestEffort) => EXIT_BEST_EFFORT,
        Ok(Ending::AwaitingHuman) => EXIT_AWAITING_HUMAN,
        Ok(Ending::Regressed) => EXIT_REGRESSION,
        Ok(Ending::Unevaluated) => EXIT_UNEVALUATED,
        Err(CliError::BadInput(_)) => EXIT_BAD_INPUT,
        Err(CliError::Failed(_)) => EXIT_FAILED,
    }
}

/// The process's exit: the error, if any, on standard error after `who` (`assay`, or
/// `assay compare` for the verbs that name themselves), and its code.
pub fn finish(who: &str, outcome: Outcome) -> ExitCode {
    if let Err(e) = &outcome {
        eprintln!("{who}: {e}");
    }
    ExitCode::from(exit_code(&outcome))
}

/// A gRPC status as a one-line message.
pub fn status_text(s: &tonic::Status) -> String {
    let mut text = format!("{}: {}", assay_rpc::status::code_name(s.code()), s.message());
    use tonic_types::StatusExt;
    if let Some(details) = s.get_error_details().bad_request() {
        for v in &details.field_violations {
            let line = format!("{}: {}", v.field, v.description);
            // The message often says the first violation already.
            if !s.message().contains(&line) {
                text.push_str(&format!("\n  {line}"));
            }
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_ending_has_its_documented_code() {
        let code = |o: Outcome| exit_code(&o);
        assert_eq!(code(Ok(Ending::Done)), 0);
        assert_eq!(code(Ok(Ending::Regressed)), 1);
        assert_eq!(code(Err(CliError::Failed("x".into()))), 1);
        assert_eq!(code(Err(CliError::BadInput("x".into()))), 2);
        assert_eq!(code(Ok(Ending::Partial)), 3);
        assert_eq!(code(Ok(Ending::BestEffort)), 3);
        assert_eq!(code(Ok(Ending::AwaitingHuman)), 4);
        assert_eq!(code(Ok(Ending::Unevaluated)), 5);
    }

    #[test]
    fn an_invalid_request_is_bad_input_and_other_statuses_failures() {
        let bad = CliError::from(tonic::Status::invalid_argument("no records"));
        assert_eq!(bad, CliError::BadInput("INVALID_ARGUMENT: no records".into()));
        assert_eq!(bad.clone().failed(), CliError::Failed("INVALID_ARGUMENT: no records".into()));
        let down = CliError::from(tonic::Status::unavailable("gone"));
        assert!(matches!(down, CliError::Failed(_)), "{down:?}");
        assert_eq!(down.bad_input().to_string(), "UNAVAILABLE: gone");
    }
}
