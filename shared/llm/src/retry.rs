//! Retry policy pieces: which failures are retried, full-jitter backoff, `Retry-After`, and the
//! deadline cap. Pure functions so they can be tested without a server.

use std::time::{Duration, Instant};

use rand::Rng;

/// Full-jitter exponential backoff: the wait before retry number `attempt` (0-based) is uniform in
/// `[0, min(max, base * 2^attempt)]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub max: Duration,
}

impl Backoff {
    /// Upper bound of the wait before retry `attempt`.
    pub fn ceiling(&self, attempt: u32) -> Duration {
        let factor = 1u32.checked_shl(attempt.min(31)).unwrap_or(u32::MAX);
        self.base.checked_mul(factor).unwrap_or(self.max).min(self.max)
    }

    /// A random wait in `[0, ceiling(attempt)]`.
    pub fn jittered(&self, attempt: u32, rng: &mut impl Rng) -> Duration {
        let ceiling = self.ceiling(attempt).as_millis().min(u128::from(u64::MAX)) as u64;
        Duration::from_millis(rng.random_range(0..=ceiling))
    }
}

/// What to do after a transient failure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitPlan {
    /// Sleep this long, then retry.
    Sleep(Duration),
    /// Waiting would cross the deadline: give up with the last error.
    GiveUp,
    /// The deadline has already passed.
    DeadlinePassed,
}

/// Combine the jittered backoff with a server's `Retry-After` (a minimum, honoured up to
/// `max_retry_after`: a server asking for a longer wait gets no retry, the call gives up at once
/// rather than sit through it) and the caller's deadline (a hard cap: a wait that would end at or
/// after the deadline is not started).
pub fn plan_wait(
    jitter: Duration,
    retry_after: Option<Duration>,
    max_retry_after: Duration,
    now: Instant,
    deadline: Option<Instant>,
) -> WaitPlan {
    if retry_after.is_some_and(|asked| asked > max_retry_after) {
        return WaitPlan::GiveUp;
    }
    let wait = retry_after.map_or(jitter, |minimum| jitter.max(minimum));
    match deadline {
        None => WaitPlan::Sleep(wait),
        Some(deadline) if now >= deadline => WaitPlan::DeadlinePassed,
        Some(deadline) => match now.checked_add(wait) {
            Some(wake) if wake < deadline => WaitPlan::Sleep(wait),
            _ => WaitPlan::GiveUp,
        },
    }
}

/// Parse a `Retry-After` value given in seconds (`"3"`, also `"1.5"`). HTTP dates are not
/// understood and yield `None` (the jittered backoff applies then).
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    let value = value.trim();
    if let Ok(secs) = value.parse::<u64>() {
        return Some(Duration::from_secs(secs));
    }
    let secs = value.parse::<f64>().ok()?;
    (0.0..1e9).contains(&secs).then(|| Duration::from_secs_f64(secs))
}

/// How an HTTP status is treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StatusClass {
    Success,
    /// 408, 429 and 5xx except the deterministic ones: retried.
    Transient,
    /// Everything else: returned at once.
    Permanent,
}

/// Classify a status. `deterministic_5xx` lists server errors that would fail again the same way
/// (by default 501 Not Implemented and 505 HTTP Version Not Supported).
pub fn classify_status(status: u16, deterministic_5xx: &[u16]) -> StatusClass {
    match status {
        200..=299 => StatusClass::Success,
        408 | 429 => StatusClass::Transient,
        500..=599 if deterministic_5xx.contains(&status) => StatusClass::Permanent,
        500..=599 => StatusClass::Transient,
        _ => StatusClass::Permanent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CAP: Duration = Duration::from_secs(30);

    #[test]
    fn ceiling_grows_and_caps() {
        let b = Backoff { base: Duration::from_millis(200), max: Duration::from_secs(8) };
        assert_eq!(b.ceiling(0), Duration::from_millis(200));
        assert_eq!(b.ceiling(1), Duration::from_millis(400));
        assert_eq!(b.ceiling(3), Duration::from_millis(1600));
        assert_eq!(b.ceiling(10), Duration::from_secs(8));
        assert_eq!(b.ceiling(200), Duration::from_secs(8));
    }

    #[test]
    fn jitter_stays_within_ceiling() {
        let b = Backoff { base: Duration::from_millis(100), max: Duration::from_secs(2) };
        let mut rng = rand::rng();
        for attempt in 0..40 {
            for _ in 0..50 {
                assert!(b.jittered(attempt, &mut rng) <= b.ceiling(attempt));
            }
        }
    }

    #[test]
    fn retry_after_parsing() {
        assert_eq!(parse_retry_after("1"), Some(Duration::from_secs(1)));
        assert_eq!(parse_retry_after(" 30 "), Some(Duration::from_secs(30)));
        assert_eq!(parse_retry_after("0"), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("1.5"), Some(Duration::from_millis(1500)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
        assert_eq!(parse_retry_after("-1"), None);
        assert_eq!(parse_retry_after(""), None);
        assert_eq!(parse_retry_after("soon"), None);
    }

    #[test]
    fn retry_after_is_a_minimum() {
        let now = Instant::now();
        let plan = plan_wait(Duration::from_millis(10), Some(Duration::from_secs(1)), CAP, now, None);
        assert_eq!(plan, WaitPlan::Sleep(Duration::from_secs(1)));
        let plan = plan_wait(Duration::from_secs(2), Some(Duration::from_secs(1)), CAP, now, None);
        assert_eq!(plan, WaitPlan::Sleep(Duration::from_secs(2)));
    }

    #[test]
    fn a_retry_after_beyond_the_cap_gives_up_at_once() {
        let now = Instant::now();
        let asked = Some(Duration::from_secs(31));
        assert_eq!(plan_wait(Duration::ZERO, asked, CAP, now, None), WaitPlan::GiveUp);
        assert_eq!(
            plan_wait(Duration::ZERO, Some(CAP), CAP, now, None),
            WaitPlan::Sleep(CAP),
            "the cap itself is honoured"
        );
    }

    #[test]
    fn deadline_caps_waits() {
        let now = Instant::now();
        let deadline = now + Duration::from_secs(1);
        assert_eq!(
            plan_wait(Duration::ZERO, Some(Duration::from_secs(30)), CAP, now, Some(deadline)),
            WaitPlan::GiveUp
        );
        assert_eq!(
            plan_wait(Duration::from_millis(100), None, CAP, now, Some(deadline)),
            WaitPlan::Sleep(Duration::from_millis(100))
        );
        assert_eq!(plan_wait(Duration::ZERO, None, CAP, deadline, Some(deadline)), WaitPlan::DeadlinePassed);
    }

    #[test]
    fn backoff_never_sleeps_past_the_deadline() {
        let b = Backoff { base: Duration::from_millis(50), max: Duration::from_secs(8) };
        let mut rng = rand::rng();
        let start = Instant::now();
        for budget_ms in [0u64, 1, 10, 100, 1000, 5000] {
            let deadline = start + Duration::from_millis(budget_ms);
            // Simulate a retry loop in virtual time: every wait must end before the deadline.
            let mut now = start;
            for attempt in 0..20 {
                let retry_after = (attempt % 3 == 0).then(|| Duration::from_millis(u64::from(attempt) * 30));
                match plan_wait(b.jittered(attempt, &mut rng), retry_after, CAP, now, Some(deadline)) {
                    WaitPlan::Sleep(wait) => {
                        now += wait;
                        assert!(now < deadline, "slept past the deadline");
                    }
                    WaitPlan::GiveUp | WaitPlan::DeadlinePassed => break,
                }
            }
        }
    }

    #[test]
    fn status_classes() {
        let det = [501, 505];
        assert_eq!(classify_status(200, &det), StatusClass::Success);
        for s in [408, 429, 500, 502, 503, 504, 599] {
            assert_eq!(classify_status(s, &det), StatusClass::Transient, "{s}");
        }
        for s in [400, 401, 403, 404, 409, 422, 501, 505, 302] {
            assert_eq!(classify_status(s, &det), StatusClass::Permanent, "{s}");
        }
    }
}
