//! Per-attempt timeouts derived from the latency the backend has shown, so that a hung connection
//! costs a few times the normal latency rather than the whole configured timeout.
//!
//! Latencies of successful attempts are kept per call class (endpoint, model and token limit:
//! calls of one phase look alike, calls of different phases need not). Once a class has
//! [`MIN_SAMPLES`] samples, an attempt's timeout is `multiplier x p95` of its recent latencies,
//! at least the floor, doubled on each retry, and never above the configured ceiling.
//!
//! A class with fewer samples (cold) borrows a prior from the backend's other classes: the
//! largest p95 among them (a cold class is assumed no faster than any class seen) and, when no
//! class seen was allowed as many tokens, the p95 of the class with the nearest lower limit scaled
//! by the ratio of the limits, whichever is larger, times [`PRIOR_MARGIN`]. Its own few samples
//! count too. An embedding call (no generation) borrows from any class; a chat call never borrows
//! from embeddings, and one without a token limit only from other classes without one. Pipelines that make a handful of calls per
//! class (a debate, targeted refinement) would otherwise give every cold class's hang the whole
//! ceiling. The prior needs [`PRIOR_MIN_SAMPLES`] samples over the backend (one: a burst of three
//! calls of which one hangs must not leave it waiting for the ceiling; the margin, the multiplier,
//! the floor and the doubling per retry absorb a noisy estimate); with none (a backend that has
//! not answered yet) the timeout is the ceiling.
//!
//! The last attempt a call may make always gets the ceiling, so a call that is slow for good
//! reason still completes exactly as it would without adaptive timeouts; only the time lost to a
//! hang shrinks. (Once that attempt has gone unanswered for a first attempt's timeout, the
//! transport sends a duplicate beside it and takes the first success: a hung last attempt costs
//! about one adaptive timeout, not the ceiling.) With `hedge_factor` (default 2), every attempt
//! unanswered after that many times its class's p95 (a cold class: its siblings' pace, without
//! the prior's margin, since a duplicate cuts nothing; at least [`HEDGE_FLOOR`]) gets such a
//! duplicate, when a concurrency slot is free and the backend's [`HedgeBudget`] allows
//! ([`LatencyBook::hedge_delay`]). A duplicate the server refuses is replaced after the retry
//! backoff, outside the budget. At 50 ms a call, a hang then costs about 150 ms instead of the
//! 1 s timeout floor.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::watch;

/// The default [`AdaptiveTimeout::hedge_factor`].
pub const DEFAULT_HEDGE_FACTOR: f64 = 2.0;
/// Successful attempts a class needs before its timeout adapts from its own latencies.
pub(super) const MIN_SAMPLES: usize = 8;
/// Samples over the whole backend a cold class's prior needs (until then: the ceiling).
pub(super) const PRIOR_MIN_SAMPLES: usize = 1;
/// A prior is borrowed from other classes: it gets this factor on top of the multiplier.
pub(super) const PRIOR_MARGIN: f64 = 2.0;
/// Answers generating fewer completion tokens than this say little of the pace (a YES/NO).
pub(super) const PACE_MIN_TOKENS: u64 = 8;
/// Answers with a pace before [`LatencyBook::service_bound`] says anything.
pub(super) const PACE_MIN_SAMPLES: usize = 3;
/// A call may take this many times the time its token limit needs at the slowest recent pace:
/// the pace of a server that shares its cores among its slots swings with how many it serves and
/// with what else runs on the machine (1.5 cut all four calls in service at once when a build
/// started beside the server).
pub(super) const SERVICE_MARGIN: f64 = 3.0;
/// Recent latencies kept per class.
const WINDOW: usize = 64;
/// Classes kept (a backend sees a handful: one per phase and model); beyond this the oldest
/// samples are not worth a map that grows without bound.
const MAX_CLASSES: usize = 256;

/// How per-attempt timeouts are chosen.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdaptiveTimeout {
    /// Off: every attempt gets the ceiling (`request_timeout`).
    pub enabled: bool,
    /// The least timeout an attempt gets.
    pub floor: Duration,
    /// Times the p95 of recent latencies.
    pub multiplier: f64,
    /// An attempt still unanswered after this many times its class's expected latency (the
    /// p95, or a cold class's prior) gets a duplicate beside it, and the first success is taken
    /// (a hedged request); a duplicate unanswered in turn is replaced, up to three, each after
    /// twice the wait of the one before. No floor applies: a hedge cancels nothing, so an early
    /// one costs a duplicate call, never a result. Only stragglers beyond twice the p95 are
    /// duplicated (a few in a thousand calls of a healthy backend), never more than about one
    /// per ten answers ([`HedgeBudget`]), and only into a free concurrency slot. Default 2.
    /// 0 = hedge only the last attempt, after a first attempt's timeout.
    pub hedge_factor: f64,
}

impl Default for AdaptiveTimeout {
    fn default() -> Self {
        Self { enabled: true, floor: Duration::from_secs(1), multiplier: 4.0, hedge_factor: DEFAULT_HEDGE_FACTOR }
    }
}

/// The class of a call: endpoint path, model and token limit (the key), and the token limit
/// itself (to scale a prior borrowed from another class).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct CallClass {
    pub(super) key: String,
    pub(super) max_tokens: Option<u64>,
}

impl CallClass {
    #[cfg(test)]
    fn new(key: &str, max_tokens: Option<u64>) -> Self {
        Self { key: key.to_owned(), max_tokens }
    }
}

/// The class of a call: endpoint path, model and token limit. A call without `messages` (an
/// embedding) generates nothing: its token limit, for priors, is 0.
pub(super) fn class_of(url: &str, body: &Value) -> CallClass {
    let model = body.get("model").and_then(Value::as_str).unwrap_or("");
    // Ollama's native API carries the limit as `options.num_predict`.
    let limit = body
        .get("max_tokens")
        .or_else(|| body.get("max_completion_tokens"))
        .or_else(|| body.get("options").and_then(|o| o.get("num_predict")))
        .and_then(Value::as_u64);
    let key = format!("{url}|{model}|{}", limit.map_or_else(String::new, |l| l.to_string()));
    let generates = body.get("messages").is_some();
    CallClass { key, max_tokens: if generates { limit } else { Some(0) } }
}

/// Recent latencies of one class.
#[derive(Default)]
struct Samples {
    max_tokens: Option<u64>,
    window: VecDeque<Duration>,
}

/// The nearest-rank p95 of a non-empty window: the smallest sample with at least 95% of the
/// samples at or below it.
fn nearest_rank_p95(window: &VecDeque<Duration>) -> Option<Duration> {
    let mut sorted: Vec<Duration> = window.iter().copied().collect();
    sorted.sort_unstable();
    let rank = (sorted.len() * 95).div_ceil(100).max(1);
    sorted.get(rank - 1).copied()
}

/// `d x factor`, saturating (a token-limit ratio can be large).
fn times(d: Duration, factor: f64) -> Duration {
    Duration::try_from_secs_f64(d.as_secs_f64() * factor).unwrap_or(Duration::MAX)
}

/// Whether a class allowed `theirs` tokens says anything about one allowed `mine` (`Some(0)`: a
/// call that generates nothing, an embedding; `None`: no limit).
fn informs(mine: Option<u64>, theirs: Option<u64>) -> bool {
    match (mine, theirs) {
        // A call that generates nothing is no slower than any call seen.
        (Some(0), _) => true,
        // How long nothing takes to generate says nothing about generating; nor does a limited
        // class about an unlimited one.
        (_, Some(0)) | (None, Some(_)) => false,
        (Some(_), Some(_) | None) | (None, None) => true,
    }
}

/// Duplicates one backend's hedges may send: a token bucket (as gRPC's retry throttling) holding
/// at most [`HEDGE_BURST`] duplicates, refilled by one per [`ANSWERS_PER_HEDGE`] answered
/// attempts. Hedging a straggler is cheap insurance; when most calls straggle (a backend slowing
/// down for everyone) duplicates would add load exactly where it hurts, so they stop at about one
/// per ten answers.
pub(super) struct HedgeBudget {
    /// In answers' worth: a duplicate costs [`ANSWERS_PER_HEDGE`].
    credit: AtomicU32,
}

/// The least wait before a duplicate: a busy client's own scheduling stalls reach tens of
/// milliseconds, and a duplicate sent over one of them is a call paid for nothing. A model call
/// takes longer than this; a hang still costs a fraction of the 1 s timeout floor.
pub(super) const HEDGE_FLOOR: Duration = Duration::from_millis(100);

/// Duplicates a backend may send in a burst.
pub(super) const HEDGE_BURST: u32 = 10;
/// Answered attempts that earn one duplicate.
pub(super) const ANSWERS_PER_HEDGE: u32 = 10;

impl Default for HedgeBudget {
    fn default() -> Self {
        Self { credit: AtomicU32::new(HEDGE_BURST * ANSWERS_PER_HEDGE) }
    }
}

impl HedgeBudget {
    /// An attempt was answered: the budget grows.
    pub(super) fn answered(&self) {
        let cap = HEDGE_BURST * ANSWERS_PER_HEDGE;
        let _ = self.credit.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| (c < cap).then_some(c + 1));
    }

    /// Takes one duplicate from the budget; false when there is none left.
    pub(super) fn try_spend(&self) -> bool {
        self.credit.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |c| c.checked_sub(ANSWERS_PER_HEDGE)).is_ok()
    }
}

/// Recent latencies per call class.
pub(super) struct LatencyBook {
    classes: Mutex<HashMap<String, Samples>>,
    /// Seconds per completion token of recent answers that generated at least
    /// [`PACE_MIN_TOKENS`] (prompt time included: the pace errs slow).
    paces: Mutex<VecDeque<f64>>,
    /// Bumped on every sample, so attempts in flight can recompute their timeout.
    samples: watch::Sender<u64>,
}

impl Default for LatencyBook {
    fn default() -> Self {
        Self { classes: Mutex::default(), paces: Mutex::default(), samples: watch::channel(0).0 }
    }
}

impl LatencyBook {
    /// Told each time a sample is recorded.
    pub(super) fn subscribe(&self) -> watch::Receiver<u64> {
        self.samples.subscribe()
    }

    /// Note a successful attempt's latency.
    pub(super) fn record(&self, class: &CallClass, latency: Duration) {
        let Ok(mut classes) = self.classes.lock() else { return };
        if !classes.contains_key(&class.key) && classes.len() >= MAX_CLASSES {
            classes.clear();
        }
        let samples = classes.entry(class.key.clone()).or_default();
        samples.max_tokens = class.max_tokens;
        if samples.window.len() == WINDOW {
            samples.window.pop_front();
        }
        samples.window.push_back(latency);
        drop(classes);
        self.samples.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Note the pace of an answer that took `latency` for `completion_tokens`.
    pub(super) fn record_pace(&self, latency: Duration, completion_tokens: u64) {
        if completion_tokens < PACE_MIN_TOKENS {
            return;
        }
        let Ok(mut paces) = self.paces.lock() else { return };
        if paces.len() == WINDOW {
            paces.pop_front();
        }
        paces.push_back(latency.as_secs_f64() / completion_tokens as f64);
    }

    /// How long a call allowed `max_tokens` may take at the slowest recent pace of the backend,
    /// with [`SERVICE_MARGIN`]: a server that serves several calls at once on a few cores (llama.cpp's
    /// `llama-server`, four slots by default) generates each more slowly the more it serves, and a
    /// call running to its token limit there is slow for good reason, not hung. `None` until
    /// [`PACE_MIN_SAMPLES`] answers have shown a pace.
    pub(super) fn service_bound(&self, max_tokens: u64) -> Option<Duration> {
        let paces = self.paces.lock().ok()?;
        if paces.len() < PACE_MIN_SAMPLES {
            return None;
        }
        let slowest = paces.iter().copied().fold(0.0_f64, f64::max);
        Duration::try_from_secs_f64(slowest * max_tokens as f64 * SERVICE_MARGIN).ok()
    }

    /// Whether a class has enough samples for its timeout to adapt from its own latencies.
    pub(super) fn is_warm(&self, class: &CallClass) -> bool {
        self.classes.lock().is_ok_and(|c| c.get(&class.key).is_some_and(|s| s.window.len() >= MIN_SAMPLES))
    }

    /// The p95 of a class's recent latencies, once it has enough samples.
    pub(super) fn p95(&self, class: &CallClass) -> Option<Duration> {
        let classes = self.classes.lock().ok()?;
        nearest_rank_p95(&classes.get(&class.key).filter(|s| s.window.len() >= MIN_SAMPLES)?.window)
    }

    /// The latency a cold class is assumed to have, from every class's samples (see the module
    /// docs); `None` while the backend has fewer than [`PRIOR_MIN_SAMPLES`] usable samples.
    pub(super) fn prior(&self, class: &CallClass) -> Option<Duration> {
        self.prior_estimate(class).map(|estimate| times(estimate, PRIOR_MARGIN))
    }

    /// [`Self::prior`] before its margin: the pace a cold class's siblings set.
    fn prior_estimate(&self, class: &CallClass) -> Option<Duration> {
        let classes = self.classes.lock().ok()?;
        // An unlimited class counts as allowed the most tokens.
        let limit = |t: Option<u64>| t.unwrap_or(u64::MAX);
        let mine = limit(class.max_tokens);
        let mut pooled = 0usize;
        // The slowest class seen, unscaled; whether one was allowed as many tokens as this one;
        // the class allowed the most tokens below this one's limit.
        let mut slowest: Option<Duration> = None;
        let mut covered = false;
        let mut nearest_below: Option<(u64, Duration)> = None;
        for (key, other) in classes.iter() {
            if *key != class.key && !informs(class.max_tokens, other.max_tokens) {
                continue;
            }
            let Some(p95) = nearest_rank_p95(&other.window) else { continue };
            pooled += other.window.len();
            slowest = Some(slowest.map_or(p95, |s| s.max(p95)));
            let theirs = limit(other.max_tokens);
            if *key == class.key || theirs >= mine {
                covered = true;
            } else if nearest_below.is_none_or(|(t, d)| theirs > t || (theirs == t && p95 > d)) {
                nearest_below = Some((theirs, p95));
            }
        }
        if pooled < PRIOR_MIN_SAMPLES {
            return None;
        }
        let mut estimate = slowest?;
        if !covered && let Some((theirs, p95)) = nearest_below {
            // Extrapolate up from the nearest limit only: latency is not all generation, and
            // scaling a short class's latency to a long limit would over-estimate the most.
            estimate = estimate.max(times(p95, mine as f64 / theirs.max(1) as f64));
        }
        Some(estimate)
    }

    /// The latency a call of this class is expected to take: its own p95 once warm, else the
    /// prior borrowed from other classes; `None` while the backend has no usable sample.
    pub(super) fn expected(&self, class: &CallClass) -> Option<Duration> {
        self.p95(class).or_else(|| self.prior(class))
    }

    /// How long an attempt waits unanswered before a duplicate goes out beside it:
    /// `hedge_factor x` the class's p95, or its siblings' pace while cold, at least
    /// [`HEDGE_FLOOR`]; `None` when hedging is off or nothing is known yet.
    pub(super) fn hedge_delay(&self, policy: &AdaptiveTimeout, class: &CallClass) -> Option<Duration> {
        if !policy.enabled || policy.hedge_factor.is_nan() || policy.hedge_factor <= 0.0 {
            return None;
        }
        // A duplicate cuts nothing, so a cold class's is sent on its siblings' pace without the
        // prior's margin (which guards the timeout against cutting a slow answer).
        let pace = self.p95(class).or_else(|| self.prior_estimate(class))?;
        Some(times(pace, policy.hedge_factor).max(HEDGE_FLOOR))
    }

    /// The timeout of attempt `attempt` (0 = first) of a call that may make `max_retries` retries.
    pub(super) fn attempt_timeout(
        &self,
        policy: &AdaptiveTimeout,
        class: &CallClass,
        attempt: u32,
        max_retries: u32,
        ceiling: Duration,
    ) -> Duration {
        if !policy.enabled || attempt >= max_retries {
            return ceiling;
        }
        let Some(latency) = self.expected(class) else { return ceiling };
        let base = times(latency, policy.multiplier.max(1.0)).max(policy.floor);
        let scaled = base.saturating_mul(1u32.checked_shl(attempt).unwrap_or(u32::MAX));
        scaled.min(ceiling)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CEILING: Duration = Duration::from_secs(120);

    fn policy() -> AdaptiveTimeout {
        AdaptiveTimeout { enabled: true, floor: Duration::from_millis(100), multiplier: 4.0, hedge_factor: 2.0 }
    }

    fn class(key: &str) -> CallClass {
        CallClass::new(key, Some(256))
    }

    fn record_all(book: &LatencyBook, class: &CallClass, millis: &[u64]) {
        for m in millis {
            book.record(class, Duration::from_millis(*m));
        }
    }

    fn book_with(key: &str, millis: &[u64]) -> LatencyBook {
        let book = LatencyBook::default();
        record_all(&book, &class(key), millis);
        book
    }

    #[test]
    fn the_service_bound_is_the_token_limit_at_the_slowest_pace() {
        let book = LatencyBook::default();
        book.record_pace(Duration::from_millis(500), 10);
        book.record_pace(Duration::from_millis(100), 4); // too few tokens: no pace
        book.record_pace(Duration::from_millis(400), 10);
        assert_eq!(book.service_bound(100), None, "two paces so far");
        book.record_pace(Duration::from_secs(1), 10);
        // The slowest: 0.1 s a token, x 100 tokens x 3.
        let bound = book.service_bound(100).unwrap();
        assert!((bound.as_secs_f64() - 30.0).abs() < 1e-6, "{bound:?}");
    }

    #[test]
    fn the_ceiling_until_the_backend_has_samples() {
        let book = LatencyBook::default();
        assert_eq!(book.prior(&class("c")), None);
        assert_eq!(book.attempt_timeout(&policy(), &class("c"), 0, 4, CEILING), CEILING, "no samples at all");
        record_all(&book, &class("other"), &[50; PRIOR_MIN_SAMPLES]);
        // One answer of another class of the same limit: 50 ms x 2 (margin) x 4 (multiplier).
        assert_eq!(book.attempt_timeout(&policy(), &class("c"), 0, 4, CEILING), Duration::from_millis(400));
    }

    #[test]
    fn own_samples_once_warm() {
        let book = book_with("c", &[50; MIN_SAMPLES - 1]);
        assert!(!book.is_warm(&class("c")));
        // Cold: its own few samples as a prior, with the margin: 4 x 2 x 50 ms.
        assert_eq!(book.attempt_timeout(&policy(), &class("c"), 0, 4, CEILING), Duration::from_millis(400));
        book.record(&class("c"), Duration::from_millis(50));
        assert!(book.is_warm(&class("c")));
        assert_eq!(book.attempt_timeout(&policy(), &class("c"), 0, 4, CEILING), Duration::from_millis(200));
    }

    #[test]
    fn a_cold_class_borrows_from_other_classes_scaled_by_its_token_limit() {
        let book = LatencyBook::default();
        record_all(&book, &CallClass::new("short", Some(100)), &[40; 10]);
        record_all(&book, &CallClass::new("mid", Some(200)), &[50, 60, 70]);
        // A class allowed 400 tokens, more than any seen: the nearest limit below (mid, 200) scaled,
        // its 70 ms (p95 of three: the largest) x 2 = 140 ms, with the margin (x2) and the
        // multiplier (x4). Short's 40 ms is not scaled x4: the nearest class extrapolates least.
        let long = CallClass::new("long", Some(400));
        assert_eq!(book.prior(&long), Some(Duration::from_millis(280)));
        assert_eq!(book.attempt_timeout(&policy(), &long, 0, 4, CEILING), Duration::from_millis(1120));
        assert_eq!(book.attempt_timeout(&policy(), &long, 1, 4, CEILING), Duration::from_millis(2240));
        assert_eq!(book.attempt_timeout(&policy(), &long, 4, 4, CEILING), CEILING, "the last attempt: the ceiling");
        // A smaller limit is never scaled down: the slowest class seen (mid, 70 ms) x 2 x 4; so is
        // one between two limits seen (no extrapolation: mid was allowed more).
        let tiny = CallClass::new("tiny", Some(10));
        assert_eq!(book.attempt_timeout(&policy(), &tiny, 0, 4, CEILING), Duration::from_millis(560));
        assert_eq!(book.prior(&CallClass::new("between", Some(150))), Some(Duration::from_millis(140)));
        // Slow answers of a short class are not scaled up when a longer class covers the limit.
        record_all(&book, &CallClass::new("yes-no", Some(1)), &[90; 3]);
        assert_eq!(book.prior(&CallClass::new("between", Some(150))), Some(Duration::from_millis(180)));
        // The prior never exceeds the ceiling, and a huge ratio does not overflow.
        let huge = CallClass::new("huge", Some(u64::MAX));
        assert_eq!(book.attempt_timeout(&policy(), &huge, 0, 4, CEILING), CEILING);
    }

    #[test]
    fn a_class_without_a_token_limit_borrows_only_from_classes_without_one() {
        let book = LatencyBook::default();
        record_all(&book, &CallClass::new("limited", Some(100)), &[40; 10]);
        let unlimited = CallClass::new("unlimited", None);
        assert_eq!(book.prior(&unlimited), None);
        assert_eq!(book.attempt_timeout(&policy(), &unlimited, 0, 4, CEILING), CEILING);
        record_all(&book, &CallClass::new("other-unlimited", None), &[30; 3]);
        assert_eq!(book.prior(&unlimited), Some(Duration::from_millis(60)));
        // A limited class may borrow from an unlimited one, which covers any limit: no
        // extrapolation from the limited class, the slowest class seen (40 ms) x 2.
        assert_eq!(book.prior(&CallClass::new("x", Some(1000))), Some(Duration::from_millis(80)));
    }

    #[test]
    fn embeddings_borrow_from_any_class_and_lend_to_none_that_generates() {
        let book = LatencyBook::default();
        let embed = class_of("u/embeddings", &serde_json::json!({"model": "e", "input": ["a"]}));
        assert_eq!(embed.max_tokens, Some(0));
        record_all(&book, &CallClass::new("chat", Some(512)), &[300; 2]);
        // 300 ms x 2 x 4, unscaled by the chat class's 512 tokens.
        assert_eq!(book.attempt_timeout(&policy(), &embed, 0, 4, CEILING), Duration::from_millis(2400));
        let book = LatencyBook::default();
        record_all(&book, &embed, &[20; 5]);
        assert_eq!(book.prior(&CallClass::new("chat", Some(512))), None);
        assert_eq!(book.prior(&CallClass::new("unlimited", None)), None);
        assert_eq!(book.prior(&CallClass::new("other-embeddings", Some(0))), Some(Duration::from_millis(40)));
    }

    #[test]
    fn a_cold_class_is_hedged_on_its_siblings_pace_without_the_timeouts_margin() {
        let book = LatencyBook::default();
        let cold = class("cold");
        assert_eq!(book.hedge_delay(&policy(), &cold), None, "nothing known yet");
        record_all(&book, &class("other"), &[200; 3]);
        // 2 x 200 ms; the timeout keeps the prior's margin: 4 x 2 x 200 ms.
        assert_eq!(book.hedge_delay(&policy(), &cold), Some(Duration::from_millis(400)));
        assert_eq!(book.attempt_timeout(&policy(), &cold, 0, 4, CEILING), Duration::from_millis(1600));
        // Warm: its own p95, at least the floor.
        record_all(&book, &cold, &[30; MIN_SAMPLES]);
        assert_eq!(book.hedge_delay(&policy(), &cold), Some(HEDGE_FLOOR));
        let off = AdaptiveTimeout { hedge_factor: 0.0, ..policy() };
        assert_eq!(book.hedge_delay(&off, &cold), None);
    }

    #[test]
    fn the_hedge_budget_allows_a_burst_then_one_duplicate_per_ten_answers() {
        let budget = HedgeBudget::default();
        for _ in 0..HEDGE_BURST {
            assert!(budget.try_spend());
        }
        assert!(!budget.try_spend(), "the burst is spent");
        for _ in 0..9 {
            budget.answered();
        }
        assert!(!budget.try_spend(), "nine answers earn no duplicate");
        budget.answered();
        assert!(budget.try_spend(), "the tenth does");
        assert!(!budget.try_spend());
        for _ in 0..1000 {
            budget.answered();
        }
        let burst = std::iter::from_fn(|| budget.try_spend().then_some(())).count();
        assert_eq!(burst, HEDGE_BURST as usize, "never more saved than the burst");
    }

    #[test]
    fn p95_by_nearest_rank() {
        let millis: Vec<u64> = (1..=20).map(|i| i * 10).collect();
        let book = book_with("c", &millis);
        // 20 samples: rank 19 -> 190 ms.
        assert_eq!(book.p95(&class("c")), Some(Duration::from_millis(190)));
    }

    #[test]
    fn doubles_per_retry_floors_caps_and_gives_the_last_attempt_the_ceiling() {
        let book = book_with("c", &[10; 10]);
        let p = policy();
        let c = class("c");
        // 4 x 10 ms = 40 ms, raised to the 100 ms floor.
        assert_eq!(book.attempt_timeout(&p, &c, 0, 4, CEILING), Duration::from_millis(100));
        assert_eq!(book.attempt_timeout(&p, &c, 1, 4, CEILING), Duration::from_millis(200));
        assert_eq!(book.attempt_timeout(&p, &c, 3, 4, CEILING), Duration::from_millis(800));
        assert_eq!(book.attempt_timeout(&p, &c, 4, 4, CEILING), CEILING);
        assert_eq!(book.attempt_timeout(&p, &c, 2, 4, Duration::from_millis(300)), Duration::from_millis(300));
        assert_eq!(book.attempt_timeout(&p, &c, 40, 60, CEILING), CEILING, "no overflow on many retries");
    }

    #[test]
    fn classes_are_apart_and_the_window_forgets() {
        let book = book_with("slow", &[1000; 10]);
        assert_eq!(book.p95(&class("fast")), None);
        for _ in 0..WINDOW {
            book.record(&class("slow"), Duration::from_millis(20));
        }
        assert_eq!(book.p95(&class("slow")), Some(Duration::from_millis(20)));
    }

    #[test]
    fn disabled_means_the_ceiling() {
        let book = book_with("c", &[10; 10]);
        let p = AdaptiveTimeout { enabled: false, ..policy() };
        assert_eq!(book.attempt_timeout(&p, &class("c"), 0, 4, CEILING), CEILING);
        assert_eq!(book.attempt_timeout(&p, &class("cold"), 0, 4, CEILING), CEILING);
    }

    #[test]
    fn class_names_endpoint_model_and_limit() {
        let body = serde_json::json!({"model": "m", "messages": [], "max_tokens": 256});
        let c = class_of("http://h/v1/chat/completions", &body);
        assert_eq!(c.key, "http://h/v1/chat/completions|m|256");
        assert_eq!(c.max_tokens, Some(256));
        let other = serde_json::json!({"model": "m", "messages": [], "max_completion_tokens": 512});
        assert_ne!(class_of("u", &body), class_of("u", &other));
        assert_eq!(class_of("u", &other).max_tokens, Some(512));
        assert_eq!(class_of("u", &serde_json::json!({"model": "m", "messages": []})).max_tokens, None);
        let ollama = serde_json::json!({"model": "m", "messages": [], "options": {"num_predict": 64}});
        assert_eq!(class_of("u", &ollama).max_tokens, Some(64));
    }
}
