//! Per-attempt timeouts derived from the latency the backend has shown, so that a hung connection
//! costs a few times the normal latency rather than the whole configured timeout.
//!
//! Latencies of successful attempts are kept per call class (endpoint, model and token limit:
//! calls of one phase look alike, calls of different phases need not). Once a class has
//! [`MIN_SAMPLES`] samples, an attempt's timeout is `multiplier x p95` of its recent latencies,
//! at least the floor, doubled on each retry, and never above the configured ceiling. The last
//! attempt a call may make always gets the ceiling, so a call that is slow for good reason still
//! completes exactly as it would without adaptive timeouts; only the time lost to a hang shrinks.

use std::collections::{HashMap, VecDeque};
use std::sync::Mutex;
use std::time::Duration;

use serde_json::Value;
use tokio::sync::watch;

/// Successful attempts a class needs before its timeout adapts (until then: the ceiling).
pub(super) const MIN_SAMPLES: usize = 8;
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
}

impl Default for AdaptiveTimeout {
    fn default() -> Self {
        Self { enabled: true, floor: Duration::from_secs(1), multiplier: 4.0 }
    }
}

/// The class of a call: endpoint path, model and token limit.
pub(super) fn class_of(url: &str, body: &Value) -> String {
    let model = body.get("model").and_then(Value::as_str).unwrap_or("");
    let limit = body.get("max_tokens").or_else(|| body.get("max_completion_tokens")).and_then(Value::as_u64);
    format!("{url}|{model}|{}", limit.map_or_else(String::new, |l| l.to_string()))
}

/// Recent latencies per call class.
pub(super) struct LatencyBook {
    classes: Mutex<HashMap<String, VecDeque<Duration>>>,
    /// Bumped on every sample, so attempts in flight can recompute their timeout.
    samples: watch::Sender<u64>,
}

impl Default for LatencyBook {
    fn default() -> Self {
        Self { classes: Mutex::default(), samples: watch::channel(0).0 }
    }
}

impl LatencyBook {
    /// Told each time a sample is recorded.
    pub(super) fn subscribe(&self) -> watch::Receiver<u64> {
        self.samples.subscribe()
    }

    /// Note a successful attempt's latency.
    pub(super) fn record(&self, class: &str, latency: Duration) {
        let Ok(mut classes) = self.classes.lock() else { return };
        if !classes.contains_key(class) && classes.len() >= MAX_CLASSES {
            classes.clear();
        }
        let window = classes.entry(class.to_owned()).or_default();
        if window.len() == WINDOW {
            window.pop_front();
        }
        window.push_back(latency);
        drop(classes);
        self.samples.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Whether a class has enough samples for its timeout to adapt.
    pub(super) fn is_warm(&self, class: &str) -> bool {
        self.classes.lock().is_ok_and(|c| c.get(class).is_some_and(|w| w.len() >= MIN_SAMPLES))
    }

    /// The p95 of a class's recent latencies, once it has enough samples.
    pub(super) fn p95(&self, class: &str) -> Option<Duration> {
        let classes = self.classes.lock().ok()?;
        let window = classes.get(class).filter(|w| w.len() >= MIN_SAMPLES)?;
        let mut sorted: Vec<Duration> = window.iter().copied().collect();
        sorted.sort_unstable();
        // Nearest rank: the smallest sample with at least 95% of the samples at or below it.
        let rank = (sorted.len() * 95).div_ceil(100).max(1);
        Some(sorted[rank - 1])
    }

    /// The timeout of attempt `attempt` (0 = first) of a call that may make `max_retries` retries.
    pub(super) fn attempt_timeout(
        &self,
        policy: &AdaptiveTimeout,
        class: &str,
        attempt: u32,
        max_retries: u32,
        ceiling: Duration,
    ) -> Duration {
        if !policy.enabled || attempt >= max_retries {
            return ceiling;
        }
        let Some(p95) = self.p95(class) else { return ceiling };
        let base = p95.mul_f64(policy.multiplier.max(1.0)).max(policy.floor);
        let scaled = base.saturating_mul(1u32.checked_shl(attempt).unwrap_or(u32::MAX));
        scaled.min(ceiling)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CEILING: Duration = Duration::from_secs(120);

    fn policy() -> AdaptiveTimeout {
        AdaptiveTimeout { enabled: true, floor: Duration::from_millis(100), multiplier: 4.0 }
    }

    fn book_with(class: &str, millis: &[u64]) -> LatencyBook {
        let book = LatencyBook::default();
        for m in millis {
            book.record(class, Duration::from_millis(*m));
        }
        book
    }

    #[test]
    fn the_ceiling_until_enough_samples() {
        let book = book_with("c", &[50; MIN_SAMPLES - 1]);
        assert_eq!(book.attempt_timeout(&policy(), "c", 0, 4, CEILING), CEILING);
        book.record("c", Duration::from_millis(50));
        assert_eq!(book.attempt_timeout(&policy(), "c", 0, 4, CEILING), Duration::from_millis(200));
    }

    #[test]
    fn p95_by_nearest_rank() {
        let millis: Vec<u64> = (1..=20).map(|i| i * 10).collect();
        let book = book_with("c", &millis);
        // 20 samples: rank 19 -> 190 ms.
        assert_eq!(book.p95("c"), Some(Duration::from_millis(190)));
    }

    #[test]
    fn doubles_per_retry_floors_caps_and_gives_the_last_attempt_the_ceiling() {
        let book = book_with("c", &[10; 10]);
        let p = policy();
        // 4 x 10 ms = 40 ms, raised to the 100 ms floor.
        assert_eq!(book.attempt_timeout(&p, "c", 0, 4, CEILING), Duration::from_millis(100));
        assert_eq!(book.attempt_timeout(&p, "c", 1, 4, CEILING), Duration::from_millis(200));
        assert_eq!(book.attempt_timeout(&p, "c", 3, 4, CEILING), Duration::from_millis(800));
        assert_eq!(book.attempt_timeout(&p, "c", 4, 4, CEILING), CEILING);
        assert_eq!(book.attempt_timeout(&p, "c", 2, 4, Duration::from_millis(300)), Duration::from_millis(300));
        assert_eq!(book.attempt_timeout(&p, "c", 40, 60, CEILING), CEILING, "no overflow on many retries");
    }

    #[test]
    fn classes_are_apart_and_the_window_forgets() {
        let book = book_with("slow", &[1000; 10]);
        assert_eq!(book.p95("fast"), None);
        for _ in 0..WINDOW {
            book.record("slow", Duration::from_millis(20));
        }
        assert_eq!(book.p95("slow"), Some(Duration::from_millis(20)));
    }

    #[test]
    fn disabled_means_the_ceiling() {
        let book = book_with("c", &[10; 10]);
        let p = AdaptiveTimeout { enabled: false, ..policy() };
        assert_eq!(book.attempt_timeout(&p, "c", 0, 4, CEILING), CEILING);
    }

    #[test]
    fn class_names_endpoint_model_and_limit() {
        let body = serde_json::json!({"model": "m", "max_tokens": 256});
        assert_eq!(class_of("http://h/v1/chat/completions", &body), "http://h/v1/chat/completions|m|256");
        let other = serde_json::json!({"model": "m", "max_completion_tokens": 512});
        assert_ne!(class_of("u", &body), class_of("u", &other));
    }
}
