//! Classification of failures: what an HTTP status, a transport error or an unusable body means
//! for one attempt (retry, retry once, give up), which [`LlmError`] it becomes, and how a failed
//! call counts for the circuit breaker.

use std::time::{Duration, Instant};

use super::format::complains_about_schema;
use super::reply::UnusableBody;
use crate::breaker::Outcome;
use crate::retry::{StatusClass, classify_status};
use crate::types::LlmError;

/// One failed attempt.
#[derive(Debug)]
pub(super) struct AttemptError {
    pub(super) error: LlmError,
    pub(super) status: Option<u16>,
    pub(super) retry_after: Option<Duration>,
    pub(super) kind: AttemptKind,
}

impl AttemptError {
    /// The request deadline was reached.
    pub(super) fn deadline() -> Self {
        Self::permanent(LlmError::DeadlineExceeded)
    }

    /// The attempt got no answer within its timeout (`adaptive`: one set from observed latency,
    /// below the configured ceiling): transient, retried.
    pub(super) fn timed_out(timeout: Duration, adaptive: bool) -> Self {
        let how = if adaptive { " (adaptive, from observed latency)" } else { "" };
        Self {
            error: LlmError::Unavailable(format!("timed out after {} ms{how}", timeout.as_millis())),
            status: None,
            retry_after: None,
            kind: AttemptKind::TimedOut,
        }
    }

    /// A failure without a status that is not worth retrying.
    pub(super) fn permanent(error: LlmError) -> Self {
        Self { error, status: None, retry_after: None, kind: AttemptKind::Permanent }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AttemptKind {
    Transient,
    /// No answer within the attempt's timeout: retried as a transient failure.
    TimedOut,
    /// No connection could be made (refused, no route, a failed handshake): retried as a transient
    /// failure, but no sign of load for the concurrency limit (a backend that is down or
    /// restarting is the circuit breaker's business; cutting the limit for it left one slot for
    /// the whole run once the backend was back).
    Unreachable,
    /// A 200 whose body could not be used: retried once.
    Malformed,
    Permanent,
}

/// A failed call (after retries).
#[derive(Debug)]
pub(super) struct CallError {
    pub(super) error: LlmError,
    pub(super) status: Option<u16>,
    pub(super) retries: u32,
}

/// Whether a server error says the calls it serves at once outgrew its memory for them:
/// llama.cpp's `llama-server` ("Context size has been exceeded" for every call in service when
/// its slots' sequences outgrow the KV cache they share; "failed to find free space in the KV
/// cache").
pub(super) fn out_of_room(message: &str) -> bool {
    let text = message.to_ascii_lowercase();
    text.contains("context size has been exceeded") || text.contains("free space in the kv cache")
}

const BODY_SNIPPET: usize = 300;

fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let one_line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match one_line.char_indices().nth(BODY_SNIPPET) {
        Some((cut, _)) => format!("{}...", &one_line[..cut]),
        None => one_line,
    }
}

/// An error and its sources, `: `-separated.
pub(super) fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

pub(super) fn deadline_passed(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

fn status_error(status: u16, body: &[u8]) -> LlmError {
    let detail = format!("http {status}: {}", snippet(body));
    match status {
        401 | 403 => LlmError::Unauthorized(detail),
        429 => LlmError::RateLimited(detail),
        500..=599 => LlmError::Unavailable(detail),
        _ => LlmError::InvalidRequest(detail),
    }
}

/// Whether an error body says the server or its model cannot compute embeddings at all.
fn cannot_embed(body: &[u8]) -> bool {
    let text = String::from_utf8_lossy(body).to_ascii_lowercase();
    text.contains("embedding=true")
        || [
            "not support embedding",
            "embeddings are not supported",
            "embedding is not supported",
            "not an embedding model",
        ]
        .iter()
        .any(|p| text.contains(p))
}

/// How a failed call counts for the circuit breaker.
pub(super) fn breaker_outcome(error: &LlmError) -> Outcome {
    match error {
        LlmError::InvalidRequest(_) | LlmError::Unauthorized(_) | LlmError::Unsupported(_) => Outcome::Healthy,
        LlmError::RateLimited(_) | LlmError::Unavailable(_) | LlmError::MalformedReply(_) => Outcome::Failed,
        // A call refused by the open breaker never reached the backend.
        LlmError::DeadlineExceeded | LlmError::BudgetExhausted(_) | LlmError::CircuitOpen => Outcome::Neutral,
    }
}

/// A transport error of one attempt (timeouts are the caller's: see [`AttemptError::timed_out`]).
pub(super) fn transport_error(e: reqwest::Error, deadline: Option<Instant>) -> AttemptError {
    if deadline_passed(deadline) {
        return AttemptError::deadline();
    }
    let e = e.without_url();
    let (error, kind) = if e.is_builder() {
        (LlmError::InvalidRequest(format!("building request: {}", error_chain(&e))), AttemptKind::Permanent)
    } else if e.is_connect() {
        (LlmError::Unavailable(format!("connect error: {}", error_chain(&e))), AttemptKind::Unreachable)
    } else {
        (LlmError::Unavailable(format!("transport error: {}", error_chain(&e))), AttemptKind::Transient)
    };
    AttemptError { error, status: None, retry_after: None, kind }
}

/// The outcome of an attempt that got an HTTP answer: the parsed body on success, else the
/// classified failure. `sent_response_format`: the request carried a `response_format`.
pub(super) fn classify_reply<T>(
    status: u16,
    bytes: &[u8],
    retry_after: Option<Duration>,
    sent_response_format: bool,
    deterministic_statuses: &[u16],
    parse: &impl Fn(&[u8]) -> Result<T, UnusableBody>,
) -> Result<T, AttemptError> {
    match classify_status(status, deterministic_statuses) {
        StatusClass::Success => parse(bytes).map_err(|why| AttemptError {
            error: LlmError::MalformedReply(format!("{why} (body: {})", snippet(bytes))),
            status: Some(status),
            retry_after: None,
            kind: AttemptKind::Malformed,
        }),
        // Some servers (llama-cpp-python) answer an unsupported response_format with a 500
        // that names it: not transient, and the caller falls back to the prompt form.
        StatusClass::Transient if sent_response_format && complains_about_schema(bytes) => Err(AttemptError {
            error: status_error(status, bytes),
            status: Some(status),
            retry_after: None,
            kind: AttemptKind::Permanent,
        }),
        // A server whose model cannot embed (llama-cpp-python: a 500 "must be created with
        // embedding=True") says so every time: not transient, never retried, and the caller
        // learns the backend cannot do it.
        StatusClass::Transient if cannot_embed(bytes) => Err(AttemptError {
            error: LlmError::Unsupported(format!("http {status}: {}", snippet(bytes))),
            status: Some(status),
            retry_after: None,
            kind: AttemptKind::Permanent,
        }),
        StatusClass::Transient => Err(AttemptError {
            error: status_error(status, bytes),
            status: Some(status),
            retry_after,
            kind: AttemptKind::Transient,
        }),
        StatusClass::Permanent => {
            let error = if deterministic_statuses.contains(&status) {
                LlmError::Unsupported(format!("http {status}: {}", snippet(bytes)))
            } else {
                status_error(status, bytes)
            };
            Err(AttemptError { error, status: Some(status), retry_after: None, kind: AttemptKind::Permanent })
        }
    }
}
