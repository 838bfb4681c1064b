//! Every stage call of a run with a budget or a capped backend runs on a **slice** of the run's
//! budget, reserved before the call is sent and settled when it returns ([`metered`]):
//!
//! 1. the slice is reserved from the run's budget (at least what the stage call was seen to need,
//!    up to a little more; a kind of call not seen yet takes a quarter of what is free) and, when
//!    the run uses a backend with a daily cap, held on the cap in the run store, atomically with
//!    every other run and gateway;
//! 2. the call carries the slice as its limits (the stage's model calls reserve within it);
//! 3. what it spent settles the run's budget and the caps' holds; the rest goes back at once;
//! 4. a stage call refused for lack of slice (its stage says what a model call needed) is asked
//!    again with a slice that fits, once the run's other holds leave room: the run ends "budget
//!    exhausted" only when what it has left cannot pay for the call.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;

use assay_budget::{Budget, BudgetRefusal, Cost, Limits};
use assay_domain::{StageError, Usage};

use crate::spend::SpendCaps;

/// What meters the stage calls of one run.
pub(crate) struct RunMeter {
    pub(crate) run_id: String,
    pub(crate) budget: Arc<Budget>,
    /// The daily caps and the capped backends the run uses.
    pub(crate) caps: Option<(Arc<SpendCaps>, BTreeSet<String>)>,
    /// Per kind of stage call not measured yet: held by the one call that measures it.
    pub(crate) probes: std::sync::Mutex<std::collections::HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    /// Stores what the run's stage calls hold, for the next process should this one die with
    /// calls in flight (a stored run; none for one kept in memory).
    pub(crate) held_log: Option<HeldLog>,
}

/// Queue the store write of what the run's stage calls hold now; the future is its ack.
pub(crate) type HeldLog =
    Arc<dyn Fn() -> std::pin::Pin<Box<dyn Future<Output = Result<(), StageError>> + Send>> + Send + Sync>;

impl RunMeter {
    pub(crate) fn new(run_id: String, budget: Arc<Budget>, caps: Option<(Arc<SpendCaps>, BTreeSet<String>)>) -> Self {
        Self { run_id, budget, caps, probes: std::sync::Mutex::default(), held_log: None }
    }

    fn probe_lock(&self, kind: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut probes = self.probes.lock().unwrap_or_else(|p| p.into_inner());
        probes.entry(kind.to_string()).or_default().clone()
    }
}

tokio::task_local! {
    static METER: Arc<RunMeter>;
}

/// Run `fut` (a pipeline) with `meter` metering its stage calls.
pub(crate) async fn scope<F: Future>(meter: Arc<RunMeter>, fut: F) -> F::Output {
    METER.scope(meter, fut).await
}

/// How many times a stage call refused for lack of slice is asked again.
const MAX_ATTEMPTS: u32 = 12;

/// Margin over what a kind of stage call was seen to need.
const MARGIN: f64 = 1.25;

/// Run one stage call of `kind` on a slice of the current run's budget (module docs); outside a
/// metered run the call goes straight through. `usage_of` reads what a successful call spent.
pub async fn metered<T, Fut>(
    kind: &str,
    usage_of: impl Fn(&T) -> Usage,
    mut call: impl FnMut() -> Fut,
) -> Result<T, StageError>
where
    Fut: Future<Output = Result<T, StageError>>,
{
    let Ok(meter) = METER.try_with(Arc::clone) else { return call().await };
    let budget = meter.budget.clone();
    let caps = meter.caps.as_ref().filter(|(c, b)| c.free(b).is_some());
    if !budget.is_limited() && caps.is_none() {
        // Nothing limits the run: its spend is only counted.
        let out = call().await;
        if let Ok(v) = &out {
            budget.charge(&usage_of(v));
        }
        return out;
    }
    let outer_sink = assay_budget::current_sink();
    // The first call of a kind measures what one needs, on what is free; the others wait for it,
    // then each starts only with a slice of what that kind was seen to need (a crumb of budget
    // spread over many calls would leave every one of them unfinished).
    let mut probe = None;
    if budget.learned(kind).is_none() {
        let lock = meter.probe_lock(kind);
        let guard = lock.lock_owned().await;
        if budget.learned(kind).is_none() {
            probe = Some(guard);
        }
    }
    let mut min = budget.learned(kind).unwrap_or(Cost::new(1, 1));
    let mut attempt = 0;
    loop {
        attempt += 1;
        let want = match budget.learned(kind) {
            Some(seen) => seen.times(MARGIN),
            None => {
                let mut free = budget.free();
                if let Some((c, b)) = caps {
                    free.nano_usd = free.nano_usd.min(c.free(b).unwrap_or(u64::MAX));
                }
                Cost::new(free.tokens / 4, free.nano_usd / 4)
            }
        }
        .max(min);
        let mut hold = budget.reserve_up_to(min, want).await.map_err(|why| budget_refusal(&budget, why))?;
        let mut cap_hold = match caps {
            Some((c, b)) => {
                let h = c.hold(&meter.run_id, b, min.nano_usd, hold.cost().nano_usd).await.map_err(|e| {
                    // A cap reached ends the run as a budget does.
                    if let StageError::ResourceExhausted(why) = e {
                        budget_refusal(&budget, BudgetRefusal::spent(why))
                    } else {
                        e
                    }
                })?;
                if let Some(granted) = h.granted() {
                    hold.shrink(Cost::new(hold.cost().tokens, granted));
                }
                Some(h)
            }
            None => None,
        };
        // Stored before the call is sent: a kill now cannot hide what it may spend.
        if let Some(log) = &meter.held_log {
            log().await?;
        }
        let slice = hold.cost();
        let limits = Limits {
            max_tokens: budget.limits().max_tokens.map(|_| slice.tokens),
            max_cost_usd: (budget.limits_dollars() || cap_hold.is_some()).then_some(slice.nano_usd as f64 / 1e9),
        };
        let child = Budget::new(limits);
        // A stage call that fails after spending reports it: charged to the slice, and to the
        // run's summary as before.
        let sink: assay_budget::Sink = {
            let (child, outer) = (child.clone(), outer_sink.clone());
            Arc::new(move |u: &Usage| {
                child.charge(u);
                if let Some(o) = &outer {
                    o(u);
                }
            })
        };
        // Dropped while the call is out (its run cancelled, its caller gone), the call's slice
        // counts as spent on the run and on the caps: its model calls were sent and may be served.
        // At what such a call was seen to spend, within its slice; the first call of a kind (its
        // slice a share of what is free, not a need) at the most any kind of the run was seen to
        // spend, and at nothing before anything was measured.
        let seen = budget.learned(kind).or_else(|| budget.largest_learned()).unwrap_or_default();
        let estimate = Cost::new(seen.tokens.min(slice.tokens), seen.nano_usd.min(slice.nano_usd));
        let mut cut_off = CutOff { hold: Some(hold), estimate, limits, sink: outer_sink.clone() };
        if let Some(h) = cap_hold.as_mut() {
            h.sent(estimate.nano_usd);
        }
        let out = assay_budget::with_sink(sink, assay_budget::scope(child.clone(), call())).await;
        let hold = cut_off.hold.take().expect("the call returned: its hold is here");
        let mut used = child.spent();
        if let Ok(v) = &out {
            used.add(&usage_of(v));
        }
        hold.settle(&used);
        if let Some(log) = &meter.held_log {
            // Not waited for: a kill before it is stored counts the hold as spent, never less.
            drop(log());
        }
        if let Some(h) = cap_hold {
            h.settle(&used).await;
        }
        budget.learn(kind, Cost::of(&used));
        match out {
            Err(StageError::BudgetExhausted(m)) => {
                let need = child.refused_need();
                if let Some(need) = need {
                    budget.learn(kind, need);
                }
                // The slice had all that was left: the run cannot pay for the call.
                let left = budget.left();
                let had_all = (budget.limits().max_tokens.is_none() || slice.tokens >= left.tokens)
                    && (limits.max_cost_usd.is_none() || slice.nano_usd >= left.nano_usd);
                if budget.exhausted().is_some() || (need.is_none() && had_all) || attempt == MAX_ATTEMPTS {
                    return Err(budget_refusal(&budget, m));
                }
                min = need.unwrap_or_else(|| {
                    Cost::new(
                        slice.tokens.saturating_mul(2).min(left.tokens),
                        slice.nano_usd.saturating_mul(2).min(left.nano_usd),
                    )
                });
            }
            other => {
                drop(probe);
                return other;
            }
        }
    }
}

/// A stage call's hold while the call is out: dropped before it returned, the call is charged at
/// what such a call was seen to spend (in the quantities the run limits) and told to the run's
/// sink, as an abandoned call.
struct CutOff {
    hold: Option<assay_budget::Hold>,
    /// What the call is counted at.
    estimate: Cost,
    limits: Limits,
    sink: Option<assay_budget::Sink>,
}

impl Drop for CutOff {
    fn drop(&mut self) {
        let Some(hold) = self.hold.take() else { return };
        let cost = self.estimate;
        let tokens = if self.limits.max_tokens.is_some() { cost.tokens } else { 0 };
        let usd = if self.limits.max_cost_usd.is_some() { cost.nano_usd as f64 / 1e9 } else { 0.0 };
        let usage = Usage {
            calls: 1,
            prompt_tokens: tokens,
            cost_usd: usd,
            abandoned_calls: 1,
            abandoned_tokens: tokens,
            abandoned_cost_usd: usd,
            ..Usage::default()
        };
        if let Some(sink) = &self.sink {
            sink(&usage);
        }
        hold.settle(&usage);
    }
}

/// A refusal of the run's budget: the run starts no more calls, and says why.
fn budget_refusal(budget: &Budget, why: BudgetRefusal) -> StageError {
    budget.stop(why.clone());
    StageError::BudgetExhausted(budget.exhaustion().unwrap_or(why))
}
