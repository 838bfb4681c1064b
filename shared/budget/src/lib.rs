//! Budgets that travel with the work, the way a deadline does, and hold with every call at once.
//!
//! A pipeline run may carry a [`Limits`] (tokens and/or US dollars). Spend is **reserved before
//! a call is sent and settled when it returns**, never charged after the fact only:
//! - every model call reserves its worst case ([`Cost`]: prompt tokens estimated plus its
//!   `max_tokens`, at the price table) from the budget it runs under ([`current`]) before it is
//!   sent ([`Budget::reserve`]), and settles to the reported usage when it returns
//!   ([`Hold::settle`]). A call whose reservation does not fit waits while other holds may give
//!   money back, and is refused (a [`BudgetRefusal`]) when it cannot fit even then: never sent;
//! - a stage call does not carry "the remainder": the gateway reserves a slice of the run's
//!   budget for it ([`Budget::reserve_up_to`]), sends the slice as the call's limits in metadata
//!   ([`TOKENS_HEADER`], [`USD_HEADER`]), the stage serves the call inside [`scope`] with a fresh
//!   [`Budget`] of those limits, and what the stage call did not use goes back to the run;
//! - a hold dropped without being settled (the call was cancelled, timed out or failed before
//!   reporting) gives its reservation back at once, so a budget is never exhausted by money that
//!   was not spent.
//!
//! A refused call records what it needed ([`Budget::refused_need`], sent back to the caller in
//! [`NEED_HEADER`]), so the gateway learns how large a slice a stage call needs.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard};

use assay_domain::Usage;
use tokio::sync::Notify;

/// Metadata header: tokens (prompt + completion) left, a decimal integer.
pub const TOKENS_HEADER: &str = "assay-budget-tokens";
/// Metadata header: US dollars left, a decimal number.
pub const USD_HEADER: &str = "assay-budget-usd";
/// Metadata header on the error status of a stage call refused for lack of budget: the largest
/// reservation one of its model calls needed, `<tokens> <nano-dollars>`, plus what the call had
/// spent before it; the caller asks for a larger slice next time.
pub const NEED_HEADER: &str = "assay-budget-need";
/// Binary metadata on the error status of a stage call that failed after its model calls spent
/// something: that usage (`assay.common.v1.Usage`, protobuf), so the caller charges what was paid
/// for ([`charge_failed_call`]).
pub const SPENT_HEADER: &str = "assay-spent-bin";
/// How every budget refusal's message (and a run record's reason) starts: for people; code
/// matches on [`BudgetRefusal::cause`] and `StageError::BudgetExhausted`, never on the text.
pub use assay_domain::EXHAUSTED;
pub use assay_domain::{BudgetRefusal, Exhaustion};

const NANO: f64 = 1e9;

/// US dollars as nano-dollars (1e-9 USD), rounded up (never below zero).
pub fn nano_of(usd: f64) -> u64 {
    if usd.is_finite() && usd > 0.0 { (usd * NANO).ceil().min(u64::MAX as f64) as u64 } else { 0 }
}

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
            // Rounded down: the receiver never gets more than was reserved for it.
            out.push((USD_HEADER, format!("{:.9}", (u * NANO).floor() / NANO)));
        }
        out
    }
}

/// An amount of spend: tokens and nano-dollars. `unpriced`: the dollars are unknown (a model
/// without a price), which no dollar limit can hold.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Cost {
    pub tokens: u64,
    pub nano_usd: u64,
    pub unpriced: bool,
}

impl Cost {
    pub fn new(tokens: u64, nano_usd: u64) -> Cost {
        Cost { tokens, nano_usd, unpriced: false }
    }

    /// What `usage` spent.
    pub fn of(usage: &Usage) -> Cost {
        Cost { tokens: usage.tokens(), nano_usd: nano_of(usage.cost_usd), unpriced: usage.unpriced_calls > 0 }
    }

    /// The larger of each quantity.
    pub fn max(self, other: Cost) -> Cost {
        Cost {
            tokens: self.tokens.max(other.tokens),
            nano_usd: self.nano_usd.max(other.nano_usd),
            unpriced: self.unpriced || other.unpriced,
        }
    }

    /// Each quantity added.
    pub fn plus(self, other: Cost) -> Cost {
        Cost {
            tokens: self.tokens.saturating_add(other.tokens),
            nano_usd: self.nano_usd.saturating_add(other.nano_usd),
            unpriced: self.unpriced || other.unpriced,
        }
    }

    /// Each quantity times `f` (rounded up).
    pub fn times(self, f: f64) -> Cost {
        let m = |v: u64| ((v as f64) * f).ceil().min(u64::MAX as f64) as u64;
        Cost { tokens: m(self.tokens), nano_usd: m(self.nano_usd), unpriced: self.unpriced }
    }

    /// `tokens nano` (the need header's value).
    pub fn header_value(&self) -> String {
        format!("{} {}", self.tokens, self.nano_usd)
    }

    /// Parse [`Cost::header_value`].
    pub fn from_header(value: &str) -> Option<Cost> {
        let mut parts = value.split_whitespace();
        let tokens = parts.next()?.parse().ok()?;
        let nano_usd = parts.next()?.parse().ok()?;
        Some(Cost::new(tokens, nano_usd))
    }
}

/// Whether a reservation fits a budget now.
enum Fit {
    /// It fits: this much is granted.
    Grant(Cost),
    /// Only once holds out now give money back.
    Wait,
    /// Never: why.
    Never(BudgetRefusal),
}

#[derive(Debug, Default)]
struct State {
    /// Charged so far.
    spent: Cost,
    /// Reserved by holds not yet settled.
    held: Cost,
    /// A charged call had no price: a cost limit can no longer be checked exactly.
    unpriced: bool,
    /// A ceiling set from outside the run: no more than this many nano-dollars in all, and why.
    ceiling: Option<(u64, String)>,
    /// Everything charged, summed.
    usage: Usage,
    /// The largest reservation refused for not fitting (plus what was spent before it).
    refused: Option<Cost>,
    /// Per kind of stage call: the largest slice one needed (learned from usage and refusals).
    learned: HashMap<String, Cost>,
    /// Why the work may start no more calls, once a call it needed could not be paid for.
    stopped: Option<BudgetRefusal>,
}

/// A budget being spent: its limits, what was charged, and what is held, by any number of tasks
/// at once.
#[derive(Debug, Default)]
pub struct Budget {
    limits: Limits,
    state: Mutex<State>,
    /// Woken whenever a hold gives money back or the ceiling moves.
    released: Notify,
}

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

    fn state(&self) -> MutexGuard<'_, State> {
        // The state is a few counters, consistent after every statement: a poisoned lock (a
        // panic elsewhere while holding it) leaves it usable.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether anything limits this budget (its own limits or a ceiling).
    pub fn is_limited(&self) -> bool {
        self.limits.is_limited() || self.state().ceiling.is_some()
    }

    /// Whether dollars are limited (own limit or ceiling).
    pub fn limits_dollars(&self) -> bool {
        self.limits.max_cost_usd.is_some() || self.state().ceiling.is_some()
    }

    /// Charge the usage of finished calls (outside any hold).
    pub fn charge(&self, usage: &Usage) {
        {
            let mut s = self.state();
            Self::charge_locked(&mut s, usage);
        }
        self.released.notify_waiters();
    }

    fn charge_locked(s: &mut State, usage: &Usage) {
        s.usage.add(usage);
        s.spent = s.spent.plus(Cost { unpriced: false, ..Cost::of(usage) });
        if usage.unpriced_calls > 0 {
            s.unpriced = true;
        }
    }

    /// Everything charged so far.
    pub fn spent(&self) -> Usage {
        self.state().usage.clone()
    }

    /// Tokens charged so far.
    pub fn spent_tokens(&self) -> u64 {
        self.state().spent.tokens
    }

    /// US dollars charged so far (priced calls only).
    pub fn spent_usd(&self) -> f64 {
        self.state().spent.nano_usd as f64 / NANO
    }

    /// What holds not yet settled reserve.
    pub fn held(&self) -> Cost {
        self.state().held
    }

    /// Let the work spend at most `remaining_usd` more from now on, whatever its own limits;
    /// `reason` says what the ceiling is when it stops the work. Replaces the previous ceiling.
    pub fn set_ceiling(&self, remaining_usd: f64, reason: String) {
        let at = {
            let s = self.state();
            s.spent.nano_usd.saturating_add(s.held.nano_usd).saturating_add(nano_of(remaining_usd))
        };
        self.set_ceiling_nano(at, reason);
    }

    /// Let the work spend at most `at_usd` in all (what it was charged counts against it).
    pub fn set_ceiling_at(&self, at_usd: f64, reason: String) {
        self.set_ceiling_nano(nano_of(at_usd), reason);
    }

    fn set_ceiling_nano(&self, at: u64, reason: String) {
        self.state().ceiling = Some((at, reason));
        self.released.notify_waiters();
    }

    /// The dollar limit in nano-dollars (own limit and ceiling, the lower), if any.
    fn nano_limit(&self, s: &State) -> Option<u64> {
        let own = self.limits.max_cost_usd.map(|m| (m.max(0.0) * NANO).floor() as u64);
        match (own, s.ceiling.as_ref().map(|c| c.0)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// What is left for new holds, per limited quantity (never below zero): the limits less what
    /// was charged and what is held.
    pub fn remaining(&self) -> Limits {
        let s = self.state();
        let committed = s.spent.plus(s.held);
        Limits {
            max_tokens: self.limits.max_tokens.map(|m| m.saturating_sub(committed.tokens)),
            max_cost_usd: self.nano_limit(&s).map(|m| m.saturating_sub(committed.nano_usd) as f64 / NANO),
        }
    }

    /// Why no new model call may start (its budget is spent), or None while one may. A cost
    /// limit with an unpriced call charged stops the work too: its cost can no longer be known.
    pub fn exhaustion(&self) -> Option<BudgetRefusal> {
        let s = self.state();
        self.exhausted_locked(&s)
    }

    /// [`Budget::exhaustion`]'s message (a run record's reason).
    pub fn exhausted(&self) -> Option<String> {
        self.exhaustion().map(|r| r.message)
    }

    fn exhausted_locked(&self, s: &State) -> Option<BudgetRefusal> {
        if let Some(why) = &s.stopped {
            return Some(why.clone());
        }
        if let Some(max) = self.limits.max_tokens
            && s.spent.tokens >= max
        {
            return Some(BudgetRefusal::spent(format!("{EXHAUSTED}: {} of {max} tokens used", s.spent.tokens)));
        }
        if let Some(max) = self.limits.max_cost_usd {
            let spent = s.spent.nano_usd as f64 / NANO;
            if spent >= max {
                return Some(BudgetRefusal::spent(format!("{EXHAUSTED}: ${spent:.4} of ${max:.4} spent")));
            }
        }
        if self.nano_limit(s).is_some() && s.unpriced {
            return Some(BudgetRefusal::unpriced(format!(
                "{EXHAUSTED}: a model without a price was called, so the cost limit cannot be kept \
                 (configure backends.<name>.prices)"
            )));
        }
        if let Some((at, why)) = &s.ceiling
            && s.spent.nano_usd >= *at
        {
            return Some(BudgetRefusal::spent(format!("{EXHAUSTED}: {why}")));
        }
        None
    }

    /// Whether `min` (at least) fits now; what is granted, up to `want`.
    fn fit(&self, s: &State, min: Cost, want: Cost) -> Fit {
        if let Some(why) = self.exhausted_locked(s) {
            return Fit::Never(why);
        }
        let nano_limit = self.nano_limit(s);
        if min.unpriced && nano_limit.is_some() {
            return Fit::Never(unpriced_model(None));
        }
        let mut grant = want.max(min);
        let mut wait = false;
        let dims = [
            (self.limits.max_tokens, s.spent.tokens, s.held.tokens, min.tokens, &mut grant.tokens),
            (nano_limit, s.spent.nano_usd, s.held.nano_usd, min.nano_usd, &mut grant.nano_usd),
        ];
        for (limit, spent, held, at_least, grant) in dims {
            let Some(limit) = limit else { continue };
            let left = limit.saturating_sub(spent);
            if at_least > left {
                return Fit::Never(self.refusal(s, min));
            }
            let free = left.saturating_sub(held);
            if at_least > free {
                wait = true;
            }
            *grant = (*grant).min(free).max(at_least);
        }
        if wait { Fit::Wait } else { Fit::Grant(grant) }
    }

    fn refusal(&self, s: &State, need: Cost) -> BudgetRefusal {
        let (mut needs, mut left) = (Vec::new(), Vec::new());
        if let Some(max) = self.limits.max_tokens {
            needs.push(format!("{} tokens", need.tokens));
            left.push(format!("{} of {max} tokens", max.saturating_sub(s.spent.tokens)));
        }
        if let Some(max) = self.nano_limit(s) {
            needs.push(format!("${:.4}", need.nano_usd as f64 / NANO));
            left.push(format!(
                "${:.4} of ${:.4}",
                max.saturating_sub(s.spent.nano_usd) as f64 / NANO,
                max as f64 / NANO
            ));
        }
        let mut why = format!("{EXHAUSTED}: a call needs up to {}, {} left", needs.join(" and "), left.join(" and "));
        if let Some((at, reason)) = &s.ceiling
            && self.limits.max_cost_usd.is_none_or(|m| (*at as f64 / NANO) < m)
        {
            why.push_str(&format!(" ({reason})"));
        }
        BudgetRefusal::spent(why)
    }

    /// Reserve `worst` before a call is sent: waits while holds out now may give money back,
    /// refused when it cannot fit even then.
    pub async fn reserve(self: &Arc<Self>, worst: Cost) -> Result<Hold, BudgetRefusal> {
        self.reserve_up_to(worst, worst).await
    }

    /// Reserve at least `min` and up to `want` (what is free of the limits): waits while `min`
    /// fits only once holds out now give money back; refused when it cannot fit even then.
    pub async fn reserve_up_to(self: &Arc<Self>, min: Cost, want: Cost) -> Result<Hold, BudgetRefusal> {
        loop {
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            {
                let mut s = self.state();
                match self.fit(&s, min, want) {
                    Fit::Grant(cost) => {
                        s.held = s.held.plus(Cost { unpriced: false, ..cost });
                        return Ok(Hold { budget: self.clone(), cost, done: false });
                    }
                    Fit::Never(why) => {
                        // What the work needed: what it spent, and this reservation on top.
                        let need = s.spent.plus(Cost { unpriced: false, ..min });
                        s.refused = Some(s.refused.map_or(need, |r| r.max(need)));
                        return Err(why);
                    }
                    Fit::Wait => {}
                }
            }
            released.await;
        }
    }

    /// Start no more calls under this budget: a call the work needed could not be paid for
    /// (`why`). The first reason is kept.
    pub fn stop(&self, why: BudgetRefusal) {
        self.state().stopped.get_or_insert(why);
        self.released.notify_waiters();
    }

    /// Why the work was stopped ([`Budget::stop`]), if it was: the refusal's message (a run
    /// record's reason).
    pub fn stopped(&self) -> Option<String> {
        self.state().stopped.as_ref().map(|r| r.message.clone())
    }

    /// The largest reservation this budget refused for not fitting, if any.
    pub fn refused_need(&self) -> Option<Cost> {
        self.state().refused
    }

    /// Record that a call under this budget needed `need` and was refused (reported by a stage).
    pub fn note_refused(&self, need: Cost) {
        let mut s = self.state();
        s.refused = Some(s.refused.map_or(need, |r| r.max(need)));
    }

    /// What one stage call of `kind` was seen to need, if any yet.
    pub fn learned(&self, kind: &str) -> Option<Cost> {
        self.state().learned.get(kind).copied()
    }

    /// The most any kind of stage call was seen to need, if any was measured yet.
    pub fn largest_learned(&self) -> Option<Cost> {
        self.state().learned.values().copied().reduce(Cost::max)
    }

    /// A stage call of `kind` needed (at least) `need`.
    pub fn learn(&self, kind: &str, need: Cost) {
        let mut s = self.state();
        let entry = s.learned.entry(kind.to_string()).or_default();
        *entry = entry.max(need);
    }

    /// Limits for a slice of this budget of `cost`: the quantities this budget limits.
    pub fn slice_limits(&self, cost: Cost) -> Limits {
        Limits {
            max_tokens: self.limits.max_tokens.map(|_| cost.tokens),
            max_cost_usd: self.limits_dollars().then(|| cost.nano_usd as f64 / NANO),
        }
    }

    /// What is free for new holds now, per quantity (`u64::MAX` where not limited).
    pub fn free(&self) -> Cost {
        let s = self.state();
        let committed = s.spent.plus(s.held);
        Cost::new(
            self.limits.max_tokens.map_or(u64::MAX, |m| m.saturating_sub(committed.tokens)),
            self.nano_limit(&s).map_or(u64::MAX, |m| m.saturating_sub(committed.nano_usd)),
        )
    }

    /// What is left of the limits less what was charged (holds not counted), per quantity
    /// (`u64::MAX` where not limited).
    pub fn left(&self) -> Cost {
        let s = self.state();
        Cost::new(
            self.limits.max_tokens.map_or(u64::MAX, |m| m.saturating_sub(s.spent.tokens)),
            self.nano_limit(&s).map_or(u64::MAX, |m| m.saturating_sub(s.spent.nano_usd)),
        )
    }

    fn release(&self, cost: Cost, usage: Option<&Usage>) {
        {
            let mut s = self.state();
            s.held.tokens = s.held.tokens.saturating_sub(cost.tokens);
            s.held.nano_usd = s.held.nano_usd.saturating_sub(cost.nano_usd);
            if let Some(u) = usage {
                Self::charge_locked(&mut s, u);
            }
        }
        self.released.notify_waiters();
    }
}

/// Money reserved from a [`Budget`] for one call. Settle it with what the call spent; dropped
/// unsettled (cancelled, timed out, failed) it gives the whole reservation back at once.
#[derive(Debug)]
pub struct Hold {
    budget: Arc<Budget>,
    cost: Cost,
    done: bool,
}

impl Hold {
    /// What is reserved.
    pub fn cost(&self) -> Cost {
        self.cost
    }

    /// The budget this hold is of.
    pub fn budget(&self) -> &Arc<Budget> {
        &self.budget
    }

    /// Give back all but `to` of the reservation (each quantity at most its present value).
    pub fn shrink(&mut self, to: Cost) {
        let give =
            Cost::new(self.cost.tokens.saturating_sub(to.tokens), self.cost.nano_usd.saturating_sub(to.nano_usd));
        self.cost = Cost::new(self.cost.tokens - give.tokens, self.cost.nano_usd - give.nano_usd);
        self.budget.release(give, None);
    }

    /// The call returned having spent `usage`: charged, and the reservation released, at once.
    pub fn settle(mut self, usage: &Usage) {
        self.done = true;
        self.budget.release(self.cost, Some(usage));
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        if !self.done {
            self.budget.release(self.cost, None);
        }
    }
}

/// Where the usage of failed stage calls goes ([`with_sink`]).
pub type Sink = Arc<dyn Fn(&Usage) + Send + Sync>;

tokio::task_local! {
    static CURRENT: Arc<Budget>;
    static SINK: Sink;
}

/// Run `fut` with `sink` taking the usage of the stage calls it makes that fail after spending
/// (the usage a failed call's status carries, [`SPENT_HEADER`]): a run charges it as it charges
/// the usage a successful call returns.
pub async fn with_sink<F: Future>(sink: Sink, fut: F) -> F::Output {
    SINK.scope(sink, fut).await
}

/// The current sink of failed calls' usage, if any.
pub fn current_sink() -> Option<Sink> {
    SINK.try_with(Arc::clone).ok()
}

/// Charge the usage a failed stage call reported to the current sink, if any.
pub fn charge_failed_call(usage: &Usage) {
    let _ = SINK.try_with(|sink| sink(usage));
}

/// Run `fut` with `budget` as the current one (model calls made by it reserve from it).
pub async fn scope<F: Future>(budget: Arc<Budget>, fut: F) -> F::Output {
    CURRENT.scope(budget, fut).await
}

/// The budget of the work being done, if it has one.
pub fn current() -> Option<Arc<Budget>> {
    CURRENT.try_with(Arc::clone).ok()
}

/// The refusal of a call whose model has no price under a dollar limit, naming the model and its
/// backend when known (`(model, backend)`).
pub fn unpriced_model(named: Option<(&str, &str)>) -> BudgetRefusal {
    let (model, prices) = match named {
        Some((model, backend)) => {
            (format!("model {model:?} of backend {backend}"), format!("backends.{backend}.prices"))
        }
        None => ("the model".to_string(), "backends.<name>.prices".to_string()),
    };
    BudgetRefusal::unpriced(format!(
        "{EXHAUSTED}: {model} has no price, so the cost limit cannot be kept (configure {prices} for it)"
    ))
}

#[cfg(test)]
mod tests;
