//! Budgets that travel with the work, the way a deadline does.
//!
//! A pipeline run may carry a [`Limits`] (tokens and/or US dollars). The gateway holds the run's
//! [`Budget`] and charges it with the usage every stage call reports; each outgoing stage call
//! carries what is left in its metadata ([`TOKENS_HEADER`], [`USD_HEADER`]); the stage serves the
//! call inside [`scope`] with a fresh [`Budget`] of those limits, and every model call it makes
//! checks [`current`] first: once the budget is spent no new model call starts (calls already in
//! flight finish and are charged), and the call fails with a typed "budget exhausted" reason
//! ([`EXHAUSTED`]) the stage reports with what it has.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use assay_domain::Usage;

/// Metadata header: tokens (prompt + completion) left, a decimal integer.
pub const TOKENS_HEADER: &str = "assay-budget-tokens";
/// Metadata header: US dollars left, a decimal number.
pub const USD_HEADER: &str = "assay-budget-usd";
/// Binary metadata on the error status of a stage call that failed after its model calls spent
/// something: that usage (`assay.common.v1.Usage`, protobuf), so the caller charges what was paid
/// for ([`charge_failed_call`]).
pub const SPENT_HEADER: &str = "assay-spent-bin";
/// How every "budget exhausted" error and record reason starts.
pub const EXHAUSTED: &str = "budget exhausted";

/// What a budget allows; `None` = no limit on that quantity.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Limits {
    pub max_tokens: Option<u64>,
    pub max_cost_usd: Option<f64>,
}

impl Limits {
    /// Whether any quantity is limited.
    pub fn is_limited(&self) -> bool {
        self.max_tokens.is_some() || self.max_cost_usd.is_some()
    }

    /// Limits read from the two metadata values (absent or unparsable: no limit on that one;
    /// negative dollars count as none left).
    pub fn from_headers(tokens: Option<&str>, usd: Option<&str>) -> Limits {
        Limits {
            max_tokens: tokens.and_then(|t| t.trim().parse().ok()),
            max_cost_usd: usd.and_then(|u| u.trim().parse::<f64>().ok()).filter(|u| u.is_finite()).map(|u| u.max(0.0)),
        }
    }

    /// The metadata values of these limits: `(header, value)` for each limited quantity.
    pub fn headers(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let Some(t) = self.max_tokens {
            out.push((TOKENS_HEADER, t.to_string()));
        }
        if let Some(u) = self.max_cost_usd {
            out.push((USD_HEADER, format!("{u:.9}")));
        }
        out
    }
}

/// A budget being spent: its limits and what was charged so far (by any number of tasks at once).
#[derive(Debug, Default)]
pub struct Budget {
    limits: Limits,
    tokens: AtomicU64,
    /// Charged cost in nano-dollars (1e-9 USD), so it can be added atomically.
    nano_usd: AtomicU64,
    /// A charged call had no price: a cost limit can no longer be checked exactly.
    unpriced: AtomicBool,
    /// A ceiling set from outside the run (a backend's daily spend cap): no new model call once
    /// the charged cost reaches this many nano-dollars, plus one (0 = none set), and why.
    ceiling: AtomicU64,
    ceiling_reason: Mutex<String>,
    /// Everything charged, summed.
    spent: Mutex<Usage>,
}

const NANO: f64 = 1e9;

impl Budget {
    /// A budget of `limits` with nothing spent.
    pub fn new(limits: Limits) -> Arc<Budget> {
        Arc::new(Budget { limits, ..Budget::default() })
    }

    /// A budget of `limits` of which `spent` was already used (a run resumed after a restart).
    pub fn resumed(limits: Limits, spent: &Usage) -> Arc<Budget> {
        let b = Budget::new(limits);
        b.charge(spent);
        b
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Charge the usage of finished calls.
    pub fn charge(&self, usage: &Usage) {
        if let Ok(mut s) = self.spent.lock() {
            s.add(usage);
        }
        self.tokens.fetch_add(usage.tokens(), Ordering::Relaxed);
        let nano = (usage.cost_usd.max(0.0) * NANO).round() as u64;
        self.nano_usd.fetch_add(nano, Ordering::Relaxed);
        if usage.unpriced_calls > 0 {
            self.unpriced.store(true, Ordering::Relaxed);
        }
    }

    /// Everything charged so far.
    pub fn spent(&self) -> Usage {
        self.spent.lock().map(|s| s.clone()).unwrap_or_default()
    }

    /// Tokens charged so far.
    pub fn spent_tokens(&self) -> u64 {
        self.tokens.load(Ordering::Relaxed)
    }

    /// US dollars charged so far (priced calls only).
    pub fn spent_usd(&self) -> f64 {
        self.nano_usd.load(Ordering::Relaxed) as f64 / NANO
    }

    /// Let the work spend at most `remaining_usd` more from now on, whatever its own limits
    /// (a backend's daily spend cap, as the run store last reported it); `reason` says what the
    /// ceiling is when it stops the work. Each call replaces the previous ceiling.
    pub fn set_ceiling(&self, remaining_usd: f64, reason: String) {
        self.set_ceiling_at(self.spent_usd() + remaining_usd.max(0.0), reason);
    }

    /// Let the work spend at most `at_usd` in all (what it was charged counts against it).
    pub fn set_ceiling_at(&self, at_usd: f64, reason: String) {
        let at = (at_usd.max(0.0) * NANO).round() as u64;
        if let Ok(mut r) = self.ceiling_reason.lock() {
            *r = reason;
        }
        // Stored plus one: 0 means none.
        self.ceiling.store(at.saturating_add(1), Ordering::Relaxed);
    }

    /// The ceiling's remaining dollars, if one is set.
    fn ceiling_left(&self) -> Option<f64> {
        match self.ceiling.load(Ordering::Relaxed) {
            0 => None,
            at => Some((at - 1).saturating_sub(self.nano_usd.load(Ordering::Relaxed)) as f64 / NANO),
        }
    }

    /// What is left, per limited quantity (never below zero); dollars also under the ceiling.
    pub fn remaining(&self) -> Limits {
        let own = self.limits.max_cost_usd.map(|m| (m - self.spent_usd()).max(0.0));
        let max_cost_usd = match (own, self.ceiling_left()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        Limits { max_tokens: self.limits.max_tokens.map(|m| m.saturating_sub(self.spent_tokens())), max_cost_usd }
    }

    /// Why no new model call may start, or None while the budget allows one. A cost limit with
    /// an unpriced call charged stops the work too: its cost can no longer be known.
    pub fn exhausted(&self) -> Option<String> {
        if let Some(max) = self.limits.max_tokens {
            let spent = self.spent_tokens();
            if spent >= max {
                return Some(format!("{EXHAUSTED}: {spent} of {max} tokens used"));
            }
        }
        if let Some(max) = self.limits.max_cost_usd {
            let spent = self.spent_usd();
            if spent >= max {
                return Some(format!("{EXHAUSTED}: ${spent:.4} of ${max:.4} spent"));
            }
            if self.unpriced.load(Ordering::Relaxed) {
                return Some(format!(
                    "{EXHAUSTED}: a model without a price was called, so the ${max:.4} cost limit cannot be kept \
                     (configure backends.<name>.prices)"
                ));
            }
        }
        if self.ceiling_left().is_some_and(|left| left <= 0.0) {
            let why = self.ceiling_reason.lock().map(|r| r.clone()).unwrap_or_default();
            return Some(format!("{EXHAUSTED}: {why}"));
        }
        None
    }
}

tokio::task_local! {
    static CURRENT: Arc<Budget>;
    static SINK: Arc<dyn Fn(&Usage) + Send + Sync>;
}

/// Run `fut` with `sink` taking the usage of the stage calls it makes that fail after spending
/// (the usage a failed call's status carries, [`SPENT_HEADER`]): a run charges it as it charges
/// the usage a successful call returns.
pub async fn with_sink<F: Future>(sink: Arc<dyn Fn(&Usage) + Send + Sync>, fut: F) -> F::Output {
    SINK.scope(sink, fut).await
}

/// Charge the usage a failed stage call reported to the current sink, if any.
pub fn charge_failed_call(usage: &Usage) {
    let _ = SINK.try_with(|sink| sink(usage));
}

/// Run `fut` with `budget` as the current one (model calls made by it check and charge it).
pub async fn scope<F: Future>(budget: Arc<Budget>, fut: F) -> F::Output {
    CURRENT.scope(budget, fut).await
}

/// The budget of the work being done, if it has one.
pub fn current() -> Option<Arc<Budget>> {
    CURRENT.try_with(Arc::clone).ok()
}

/// Whether an error message is a budget refusal.
pub fn is_exhausted(message: &str) -> bool {
    message.contains(EXHAUSTED)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(tokens: u64, cost: f64, unpriced: u32) -> Usage {
        Usage { calls: 1, prompt_tokens: tokens, cost_usd: cost, unpriced_calls: unpriced, ..Usage::default() }
    }

    #[test]
    fn tokens_and_dollars_run_out_and_say_so() {
        let b = Budget::new(Limits { max_tokens: Some(100), max_cost_usd: Some(0.01) });
        b.charge(&usage(60, 0.004, 0));
        assert_eq!(b.exhausted(), None);
        assert_eq!(b.remaining().max_tokens, Some(40));
        assert!((b.remaining().max_cost_usd.unwrap() - 0.006).abs() < 1e-12);
        b.charge(&usage(50, 0.001, 0));
        assert_eq!(b.exhausted().unwrap(), "budget exhausted: 110 of 100 tokens used");
        assert_eq!(b.remaining().max_tokens, Some(0));
        let c = Budget::new(Limits { max_tokens: None, max_cost_usd: Some(0.01) });
        c.charge(&usage(10, 0.02, 0));
        assert!(c.exhausted().unwrap().contains("$0.0200 of $0.0100"));
    }

    #[test]
    fn an_unpriced_call_stops_a_cost_budget_but_not_a_token_budget() {
        let cost = Budget::new(Limits { max_tokens: None, max_cost_usd: Some(1.0) });
        cost.charge(&usage(10, 0.0, 1));
        assert!(cost.exhausted().unwrap().contains("without a price"));
        let tokens = Budget::new(Limits { max_tokens: Some(1000), max_cost_usd: None });
        tokens.charge(&usage(10, 0.0, 1));
        assert_eq!(tokens.exhausted(), None);
    }

    #[test]
    fn headers_round_trip() {
        let l = Limits { max_tokens: Some(1234), max_cost_usd: Some(0.5) };
        let h = l.headers();
        let get = |k: &str| h.iter().find(|(n, _)| *n == k).map(|(_, v)| v.as_str());
        assert_eq!(Limits::from_headers(get(TOKENS_HEADER), get(USD_HEADER)), l);
        assert_eq!(Limits::from_headers(None, Some("x")), Limits::default());
        assert_eq!(Limits::from_headers(None, Some("-1")).max_cost_usd, Some(0.0));
    }

    #[test]
    fn a_ceiling_caps_what_is_left_and_stops_the_work_with_its_reason() {
        let b = Budget::new(Limits { max_tokens: None, max_cost_usd: Some(1.0) });
        b.charge(&usage(10, 0.25, 0));
        b.set_ceiling(0.5, "backend openai reached its daily spend cap".into());
        assert!((b.remaining().max_cost_usd.unwrap() - 0.5).abs() < 1e-12, "{:?}", b.remaining());
        b.charge(&usage(10, 0.3, 0));
        assert!((b.remaining().max_cost_usd.unwrap() - 0.2).abs() < 1e-12, "own limit 0.45, ceiling 0.2");
        assert_eq!(b.exhausted(), None);
        b.charge(&usage(10, 0.2, 0));
        assert_eq!(b.exhausted().unwrap(), "budget exhausted: backend openai reached its daily spend cap");
        assert_eq!(b.remaining().max_cost_usd, Some(0.0));
        // A ceiling alone limits dollars; a later one replaces it.
        let c = Budget::new(Limits::default());
        assert_eq!(c.remaining().max_cost_usd, None);
        c.set_ceiling(0.0, "spent".into());
        assert!(c.exhausted().is_some());
        c.set_ceiling(2.0, "cap".into());
        assert_eq!((c.exhausted(), c.remaining().max_cost_usd), (None, Some(2.0)));
    }

    #[tokio::test]
    async fn current_is_the_scoped_budget() {
        assert!(current().is_none());
        let b = Budget::new(Limits { max_tokens: Some(5), max_cost_usd: None });
        let seen = scope(b.clone(), async { current().map(|c| Arc::ptr_eq(&c, &b)) }).await;
        assert_eq!(seen, Some(true));
    }
}
