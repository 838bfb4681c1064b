//! A record's stage call that failed transiently (rate limited or the backend unavailable, its
//! client's own retries spent) is tried again by the run, in further rounds after a backoff, before
//! the record fails: under a burst of 429s and 5xx a run keeps every record it can.

use std::future::Future;
use std::time::Duration;

use assay_domain::StageError;

/// Rounds after the first.
pub const MORE_ROUNDS: u32 = 2;
/// Wait before the second round, doubled for the next.
const ROUND_WAIT: Duration = Duration::from_millis(500);

/// Whether a stage call that failed with `e` may succeed when made again.
pub fn is_transient(e: &StageError) -> bool {
    match e {
        StageError::Unavailable(_)
        | StageError::CircuitOpen(_)
        | StageError::RateLimited(_)
        | StageError::ResourceExhausted(_) => true,
        StageError::BudgetExhausted(_)
        | StageError::InvalidArgument(_)
        | StageError::NotFound(_)
        | StageError::FailedPrecondition(_)
        | StageError::DeadlineExceeded(_)
        | StageError::Cancelled(_)
        | StageError::Unimplemented(_)
        | StageError::Internal(_) => false,
    }
}

/// `call`, made again up to [`MORE_ROUNDS`] times while it fails transiently.
pub async fn in_rounds<T, Fut>(what: &str, mut call: impl FnMut() -> Fut) -> Result<T, StageError>
where
    Fut: Future<Output = Result<T, StageError>>,
{
    let mut round = 0;
    let mut first: Option<StageError> = None;
    loop {
        match call().await {
            // The backend's circuit opened on the failures so far: it is down, and the failure
            // that says why is the earlier one.
            Err(e) if first.is_some() && is_circuit_open(&e) => return Err(first.unwrap_or(e)),
            Err(e) if round < MORE_ROUNDS && is_transient(&e) => {
                tracing::warn!(call = what, error = %e, round = round + 2, "stage call failed transiently, trying again");
                tokio::time::sleep(ROUND_WAIT.saturating_mul(1 << round)).await;
                round += 1;
                first.get_or_insert(e);
            }
            other => return other,
        }
    }
}

/// Whether the backend refused the call at once, its circuit breaker open.
fn is_circuit_open(e: &StageError) -> bool {
    matches!(e, StageError::CircuitOpen(_))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[tokio::test]
    async fn a_transient_failure_is_tried_again_and_a_lasting_one_is_not() {
        let made = AtomicU32::new(0);
        let out = in_rounds("x", || {
            let n = made.fetch_add(1, Ordering::SeqCst);
            async move { if n < 2 { Err(StageError::Unavailable("http 503".into())) } else { Ok(n) } }
        })
        .await;
        assert_eq!(out.unwrap(), 2);
        let made = AtomicU32::new(0);
        let out: Result<(), _> = in_rounds("x", || {
            made.fetch_add(1, Ordering::SeqCst);
            // Whatever its message says.
            async { Err(StageError::BudgetExhausted(assay_budget::BudgetRefusal::spent("rate limited"))) }
        })
        .await;
        assert!(out.is_err());
        assert_eq!(made.load(Ordering::SeqCst), 1, "a spent budget is not tried again");
        let made = AtomicU32::new(0);
        let out: Result<(), _> = in_rounds("x", || {
            made.fetch_add(1, Ordering::SeqCst);
            async { Err(StageError::RateLimited("budget exhausted".into())) }
        })
        .await;
        assert!(out.is_err());
        assert_eq!(made.load(Ordering::SeqCst), 1 + MORE_ROUNDS, "rate limited: every round");
    }

    #[tokio::test]
    async fn an_open_circuit_ends_the_rounds_with_the_failure_that_opened_it() {
        let made = AtomicU32::new(0);
        let out: Result<(), _> = in_rounds("x", || {
            let n = made.fetch_add(1, Ordering::SeqCst);
            async move {
                // The message does not say so: the variant does.
                Err(if n == 0 {
                    StageError::Unavailable("http 503".into())
                } else {
                    StageError::CircuitOpen("down".into())
                })
            }
        })
        .await;
        assert_eq!(out, Err(StageError::Unavailable("http 503".into())));
        assert_eq!(made.load(Ordering::SeqCst), 2);
    }
}
