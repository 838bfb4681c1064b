//! Provider rate limits: requests per minute and tokens per minute, as token buckets in front of
//! the concurrency limit.
//!
//! Each limit is a bucket holding up to one minute's worth (the per-minute amount), refilled
//! continuously at amount / 60 per second, and full at the start: the windows providers publish
//! are per minute, so a full minute's burst is what they accept. Every HTTP attempt (retries and
//! hedges included: the provider counts each) takes one request and reserves its token estimate
//! ([`estimate_tokens`]: the request's `max_tokens` plus a quarter of the prompt's characters)
//! before it queues for a concurrency slot; once the reply is read the reservation is corrected
//! by the usage the reply reports (the difference given back or taken, the level may go below
//! zero). A failed attempt keeps its estimate: the provider may have counted it.
//!
//! Waiters queue first come, first served and wait asynchronously; a call whose estimate exceeds
//! the whole capacity waits for a full bucket and then goes (its debt delays the next ones). A
//! wait that cannot end before the request deadline fails at once with the deadline error, and a
//! waiter that is dropped (cancelled, or its deadline reached) holds nothing: a taken share is
//! given back until the request is sent. The wait is queueing, not latency: it happens before the
//! attempt's clock starts, so it feeds neither the adaptive timeout nor the concurrency limit's
//! latency samples. It is recorded in `assay.llm.rate_limit.wait` (s, by `assay.backend` and
//! `assay.limit`: `requests` or `tokens`).
//!
//! The buckets belong to one client (clones share them), i.e. to one backend in one process:
//! replicas do not share them, so each replica is configured with its share of the provider's
//! limit (a shared bucket would need a round trip to a shared store on every model call).
//!
//! Not the `governor` crate: its GCRA cannot give cells back nor go into debt (the correction by
//! actual usage needs both), `until_n_ready` refuses a request larger than the burst instead of
//! letting it wait for a full bucket, and its waiters poll rather than queue in order.

use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use opentelemetry::KeyValue;
use opentelemetry::metrics::Histogram;
use serde_json::Value;
use tokio::sync::Notify;

use super::wire;

/// The request deadline passes before the bucket allows the attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct WouldPassDeadline;

/// The per-minute limits of one backend (either may be off).
pub(super) struct RateLimits {
    backend: String,
    requests: Option<Arc<Bucket>>,
    tokens: Option<Arc<Bucket>>,
}

impl RateLimits {
    /// `requests_per_minute` / `tokens_per_minute`: 0 = no limit.
    pub(super) fn new(backend: &str, requests_per_minute: u32, tokens_per_minute: u64) -> Self {
        let bucket = |per_minute: u64| (per_minute > 0).then(|| Arc::new(Bucket::per_minute(per_minute)));
        Self {
            backend: backend.to_owned(),
            requests: bucket(u64::from(requests_per_minute)),
            tokens: bucket(tokens_per_minute),
        }
    }

    /// Whether any limit is set.
    pub(super) fn is_limited(&self) -> bool {
        self.requests.is_some() || self.tokens.is_some()
    }

    /// Wait (in order, asynchronously) for one request and `tokens` tokens. Fails at once when
    /// the wait cannot end before `deadline`, or when it is reached while waiting; then nothing
    /// is taken. The returned [`Admission`] gives its share back if dropped before
    /// [`Admission::sent`].
    pub(super) async fn admit(&self, tokens: u64, deadline: Option<Instant>) -> Result<Admission, WouldPassDeadline> {
        let mut admission = Admission::default();
        if let Some(bucket) = &self.requests {
            let started = Instant::now();
            bucket.take(1, deadline).await?;
            admission.requests = Some(Share::new(bucket, 1));
            waited(&self.backend, "requests", started);
        }
        if let Some(bucket) = &self.tokens {
            let started = Instant::now();
            bucket.take(tokens, deadline).await?;
            admission.tokens = Some(Share::new(bucket, tokens));
            waited(&self.backend, "tokens", started);
        }
        Ok(admission)
    }

    /// One request and `tokens` tokens if the buckets have them now and nobody is waiting (for a
    /// hedge, which never queues); `None` otherwise, with nothing taken.
    pub(super) fn try_admit(&self, tokens: u64) -> Option<Admission> {
        let mut admission = Admission::default();
        if let Some(bucket) = &self.requests {
            bucket.try_take(1)?;
            admission.requests = Some(Share::new(bucket, 1));
        }
        if let Some(bucket) = &self.tokens {
            bucket.try_take(tokens)?;
            admission.tokens = Some(Share::new(bucket, tokens));
        }
        Some(admission)
    }
}

/// What an attempt took from the buckets. Dropped before [`Admission::sent`], it gives it back.
#[derive(Default)]
pub(super) struct Admission {
    requests: Option<Share>,
    tokens: Option<Share>,
}

impl Admission {
    /// The request went out: what it took stays taken (the token estimate until
    /// [`Admission::settle`] corrects it).
    pub(super) fn sent(mut self) -> Sent {
        if let Some(share) = self.requests.as_mut() {
            share.keep = true;
        }
        if let Some(share) = self.tokens.as_mut() {
            share.keep = true;
        }
        Sent { tokens: self.tokens.take().map(|s| (s.bucket.clone(), s.amount)) }
    }
}

/// The token reservation of a request that went out.
pub(super) struct Sent {
    tokens: Option<(Arc<Bucket>, u64)>,
}

impl Sent {
    /// Correct the reservation by the tokens the reply reports (`None`: not reported, the
    /// estimate stands).
    pub(super) fn settle(self, used: Option<u64>) {
        if let (Some((bucket, reserved)), Some(used)) = (self.tokens, used) {
            bucket.adjust(i128::from(used) - i128::from(reserved));
        }
    }
}

/// An amount taken from a bucket, given back on drop unless kept.
struct Share {
    bucket: Arc<Bucket>,
    amount: u64,
    keep: bool,
}

impl Share {
    fn new(bucket: &Arc<Bucket>, amount: u64) -> Self {
        Self { bucket: bucket.clone(), amount, keep: false }
    }
}

impl Drop for Share {
    fn drop(&mut self) {
        if !self.keep {
            self.bucket.adjust(-i128::from(self.amount));
        }
    }
}

/// A token bucket: `capacity` at most, refilled at `per_second`; the level may go below zero (a
/// call larger than the capacity, or usage above its estimate), which delays later takers.
pub(crate) struct Bucket {
    capacity: f64,
    per_second: f64,
    level: Mutex<Level>,
    /// Waiters queue on this, first come first served (tokio's mutex is fair); the holder waits
    /// for the level.
    queue: tokio::sync::Mutex<()>,
    /// Woken when tokens are given back, so the waiting holder looks again.
    given_back: Notify,
}

struct Level {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// A full bucket of `per_minute`, refilled at `per_minute` / 60 per second.
    pub(crate) fn per_minute(per_minute: u64) -> Self {
        let capacity = per_minute as f64;
        Self {
            capacity,
            per_second: capacity / 60.0,
            level: Mutex::new(Level { tokens: capacity, at: Instant::now() }),
            queue: tokio::sync::Mutex::new(()),
            given_back: Notify::new(),
        }
    }

    /// The level now, after refilling.
    fn refilled(&self) -> std::sync::MutexGuard<'_, Level> {
        let mut level = self.level.lock().unwrap_or_else(PoisonError::into_inner);
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(level.at).as_secs_f64();
        level.tokens = (level.tokens + elapsed * self.per_second).min(self.capacity);
        level.at = now;
        level
    }

    /// How long until the level reaches `need` (zero when it has).
    fn wait_for(&self, level: &Level, need: f64) -> Duration {
        if level.tokens >= need {
            Duration::ZERO
        } else {
            Duration::from_secs_f64((need - level.tokens) / self.per_second)
        }
    }

    /// Take `n` once the level allows it: at least `n`, or a full bucket when `n` exceeds the
    /// capacity. Waiters are served in order. Fails as soon as the wait is known to end after
    /// `deadline` (or when it is reached), having taken nothing.
    pub(crate) async fn take(&self, n: u64, deadline: Option<Instant>) -> Result<(), WouldPassDeadline> {
        let need = (n as f64).min(self.capacity);
        let beyond = |wait: Duration| deadline.is_some_and(|d| Instant::now() + wait > d);
        // The wait is at least what the level alone asks (waiters ahead only add to it).
        if beyond(self.wait_for(&self.refilled(), need)) {
            return Err(WouldPassDeadline);
        }
        let turn = async {
            let _turn = self.queue.lock().await;
            loop {
                let given_back = self.given_back.notified();
                tokio::pin!(given_back);
                given_back.as_mut().enable();
                let wait = {
                    let mut level = self.refilled();
                    let wait = self.wait_for(&level, need);
                    if wait.is_zero() {
                        level.tokens -= n as f64;
                        return Ok(());
                    }
                    wait
                };
                if beyond(wait) {
                    return Err(WouldPassDeadline);
                }
                tokio::select! {
                    () = tokio::time::sleep(wait) => {}
                    () = &mut given_back => {}
                }
            }
        };
        match deadline {
            Some(d) => tokio::time::timeout_at(d.into(), turn).await.map_err(|_| WouldPassDeadline)?,
            None => turn.await,
        }
    }

    /// Take `n` if the level has it now and nobody is waiting.
    pub(crate) fn try_take(&self, n: u64) -> Option<()> {
        let _turn = self.queue.try_lock().ok()?;
        let mut level = self.refilled();
        if level.tokens >= (n as f64).min(self.capacity) {
            level.tokens -= n as f64;
            Some(())
        } else {
            None
        }
    }

    /// Take `delta` more (positive) or give `-delta` back (negative; never above the capacity).
    pub(crate) fn adjust(&self, delta: i128) {
        let mut level = self.refilled();
        level.tokens = (level.tokens - delta as f64).min(self.capacity);
        drop(level);
        if delta < 0 {
            self.given_back.notify_waiters();
        }
    }

    /// The level now (tokens available; negative when in debt).
    #[cfg(test)]
    fn level(&self) -> f64 {
        self.refilled().tokens
    }
}

/// The tokens a request is expected to use, reserved before it is sent: its `max_tokens` (or
/// `max_completion_tokens`) plus a quarter of the characters of its prompt (the messages, the
/// embedding input and the response format's schema), rounded up.
pub(super) fn estimate_tokens(body: &Value) -> u64 {
    let completion = ["max_tokens", "max_completion_tokens"].iter().find_map(|k| body.get(*k)?.as_u64()).unwrap_or(0);
    let chars: usize =
        ["messages", "input", "response_format"].iter().filter_map(|k| body.get(*k)).map(text_chars).sum();
    completion.saturating_add((chars as u64).div_ceil(4))
}

/// Characters of every string inside `value`.
fn text_chars(value: &Value) -> usize {
    match value {
        Value::String(s) => s.chars().count(),
        Value::Array(items) => items.iter().map(text_chars).sum(),
        Value::Object(fields) => fields.values().map(text_chars).sum(),
        Value::Null | Value::Bool(_) | Value::Number(_) => 0,
    }
}

/// A parsed reply that reports the tokens it used (prompt + completion).
pub(super) trait ReportsUsage {
    /// Prompt + completion tokens, when the reply reports them.
    fn tokens_used(&self) -> Option<u64>;

    /// Completion tokens, when the reply reports them (none for embeddings).
    fn completion_tokens(&self) -> Option<u64> {
        None
    }
}

fn usage_tokens(usage: Option<&wire::WireUsage>) -> Option<u64> {
    let usage = usage?;
    match (usage.prompt_tokens, usage.completion_tokens) {
        (None, None) => None,
        (p, c) => Some(p.unwrap_or(0).saturating_add(c.unwrap_or(0))),
    }
}

impl ReportsUsage for wire::ChatCompletion {
    fn tokens_used(&self) -> Option<u64> {
        usage_tokens(self.usage.as_ref())
    }

    fn completion_tokens(&self) -> Option<u64> {
        self.usage.as_ref().and_then(|u| u.completion_tokens)
    }
}

impl ReportsUsage for wire::EmbeddingList {
    fn tokens_used(&self) -> Option<u64> {
        usage_tokens(self.usage.as_ref())
    }
}

/// Record a wait for `limit` that began at `started`.
fn waited(backend: &str, limit: &'static str, started: Instant) {
    static WAIT: OnceLock<Histogram<f64>> = OnceLock::new();
    let histogram = WAIT.get_or_init(|| {
        assay_telemetry::meter()
            .f64_histogram("assay.llm.rate_limit.wait")
            .with_unit("s")
            .with_description("Time model-call attempts waited for the backend's per-minute limits")
            .with_boundaries(assay_telemetry::DURATION_BUCKETS.to_vec())
            .build()
    });
    histogram.record(
        started.elapsed().as_secs_f64(),
        &[KeyValue::new("assay.backend", backend.to_owned()), KeyValue::new("assay.limit", limit)],
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn estimate_is_max_tokens_plus_a_quarter_of_the_prompt() {
        let body = json!({"model": "m", "max_tokens": 100, "messages": [{"role": "user", "content": "12345678"}]});
        // "user" (4) + "12345678" (8) = 12 chars -> 3 tokens.
        assert_eq!(estimate_tokens(&body), 103);
        assert_eq!(estimate_tokens(&json!({"input": ["abcde"]})), 2);
    }

    #[tokio::test]
    async fn oversized_take_waits_for_a_full_bucket_then_goes_into_debt() {
        let bucket = Bucket::per_minute(60);
        bucket.take(200, None).await.unwrap();
        assert!(bucket.level() < -139.0);
        // A give-back never fills above the capacity.
        bucket.adjust(-1000);
        assert!((bucket.level() - 60.0).abs() < 1e-6);
    }

    #[tokio::test]
    async fn a_wait_past_the_deadline_fails_at_once_and_takes_nothing() {
        let bucket = Bucket::per_minute(60);
        bucket.take(60, None).await.unwrap();
        let deadline = Instant::now() + Duration::from_millis(200);
        assert_eq!(bucket.take(5, Some(deadline)).await, Err(WouldPassDeadline));
        assert!(Instant::now() < deadline);
        assert!(bucket.level() < 1.0);
        assert!(bucket.try_take(1).is_none());
    }

    #[tokio::test]
    async fn a_dropped_admission_gives_its_share_back() {
        let limits = RateLimits::new("b", 10, 1000);
        let admission = limits.admit(400, None).await.unwrap();
        drop(admission);
        let level = limits.tokens.as_ref().unwrap().level();
        assert!(level > 999.0, "{level}");
        let sent = limits.admit(400, None).await.unwrap().sent();
        sent.settle(Some(100));
        let level = limits.tokens.as_ref().unwrap().level();
        assert!((899.0..=901.0).contains(&level), "{level}");
    }
}
