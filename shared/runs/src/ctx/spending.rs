//! What a run spends: its usage, its budget (every stage call runs on a slice of it, see
//! [`crate::meter`]), the daily caps of the backends it uses, and the holds a process killed with
//! calls in flight leaves behind.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::{Arc, Mutex};

use assay_domain::Usage;
use assay_proto::common::v1 as pb;
use assay_proto::convert;

use super::log::EventLog;
use super::summary::Summary;
use crate::meter::{HeldLog, RunMeter};
use crate::spend::SpendCaps;

/// Checkpoint: what the run's stage calls in flight hold of its budget (`tokens nano-dollars`).
const HELD: &str = "engine:budget:held";
/// Checkpoint: holds left behind by processes that stopped with calls in flight, counted as spent.
const LOST: &str = "engine:budget:lost";

/// A run's usage, budget and caps.
pub struct Spending {
    log: EventLog,
    summary: Summary,
    /// The run's spending limit with what its stage calls spent so far (restored from the
    /// stored usage after a restart): every stage call reserves a slice of it.
    budget: Option<Arc<assay_budget::Budget>>,
    /// The daily spend caps of the capped backends the run uses (every stage call holds its
    /// slice on them in the store).
    caps: Option<(Arc<SpendCaps>, BTreeSet<String>)>,
}

impl Spending {
    pub(crate) fn new(log: EventLog, summary: Summary) -> Self {
        let run = summary.snapshot();
        let budget = run.budget.as_ref().map(|b| {
            let limits = assay_budget::Limits { max_tokens: b.max_tokens, max_cost_usd: b.max_cost_usd };
            assay_budget::Budget::resumed(limits, &convert::usage_from(run.usage.clone()))
        });
        Self { log, summary, budget, caps: None }
    }

    /// Hold the run to the daily spend caps of `backends` (the capped backends it uses): every
    /// stage call holds its slice on their caps in the store before it is sent (a run with no
    /// budget of its own gets one, limited by the caps alone).
    pub(crate) fn hold_to(&mut self, caps: Arc<SpendCaps>, backends: BTreeSet<String>) {
        if backends.is_empty() {
            return;
        }
        if self.budget.is_none() {
            let spent = convert::usage_from(self.summary.snapshot().usage);
            self.budget = Some(assay_budget::Budget::resumed(assay_budget::Limits::default(), &spent));
        }
        self.caps = Some((caps, backends));
    }

    /// Run `fut` (the pipeline) with the run's budget current: every stage call it makes runs on
    /// a slice of it, and a stage call that fails after spending is charged what it spent.
    pub(crate) async fn scope<F: Future>(&self, fut: F) -> F::Output {
        let summary = self.summary.clone();
        let fut = assay_budget::with_sink(Arc::new(move |usage: &Usage| charge(&summary, usage)), fut);
        match &self.budget {
            Some(b) => {
                self.count_lost_holds(b).await;
                let mut meter = RunMeter::new(self.log.run_id().to_string(), b.clone(), self.caps.clone());
                meter.held_log = self.held_log(b);
                assay_budget::scope(b.clone(), crate::meter::scope(Arc::new(meter), fut)).await
            }
            None => fut.await,
        }
    }

    /// What the run's stage calls hold of its budget, stored before each is sent ([`HELD`]): a
    /// process killed with calls in flight leaves it behind, and the next one counts it as spent
    /// ([`Spending::count_lost_holds`]). None for a run kept in memory.
    fn held_log(&self, budget: &Arc<assay_budget::Budget>) -> Option<HeldLog> {
        if self.log.is_ephemeral() {
            return None;
        }
        let (log, budget) = (self.log.clone(), budget.clone());
        // Read and queued under one lock: the last value queued is the last value read.
        let order = Arc::new(Mutex::new(()));
        Some(Arc::new(move || {
            let _in_order = order.lock().unwrap_or_else(|p| p.into_inner());
            Box::pin(log.put_queued(HELD, budget.held().header_value().into_bytes()))
        }))
    }

    /// Count as spent what stage calls held when the process before this one stopped (killed with
    /// them in flight: a provider may have served every one): added to what earlier restarts
    /// found ([`LOST`]), charged to the budget, and the held record cleared.
    async fn count_lost_holds(&self, budget: &assay_budget::Budget) {
        let run_id = self.log.run_id();
        let read = |rows: Vec<(String, Vec<u8>)>, key: &str| {
            rows.into_iter()
                .find(|(k, _)| k == key)
                .and_then(|(_, v)| assay_budget::Cost::from_header(&String::from_utf8_lossy(&v)))
                .unwrap_or_default()
        };
        let (held, lost) = match (self.log.raw(HELD).await, self.log.raw(LOST).await) {
            (Ok(h), Ok(l)) => (read(h, HELD), read(l, LOST)),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(run_id = %run_id, error = %e, "could not read the run's holds");
                return;
            }
        };
        let lost = if held == assay_budget::Cost::default() {
            lost
        } else {
            tracing::warn!(run_id = %run_id, tokens = held.tokens, usd = held.nano_usd as f64 / 1e9,
                "stage calls were in flight when the run's last gateway stopped: their holds count as spent");
            let lost = lost.plus(held);
            let stored = async {
                self.log.put(LOST, lost.header_value().into_bytes()).await?;
                self.log.put(HELD, assay_budget::Cost::default().header_value().into_bytes()).await
            };
            if let Err(e) = stored.await {
                tracing::warn!(run_id = %run_id, error = %e, "could not store the run's lost holds");
            }
            lost
        };
        if lost != assay_budget::Cost::default() {
            budget.charge(&Usage {
                prompt_tokens: lost.tokens,
                cost_usd: lost.nano_usd as f64 / 1e9,
                ..Usage::default()
            });
        }
    }

    /// What is left of the run's budget (its own limits, and a spend cap's ceiling), if it has one.
    pub fn budget_left(&self) -> Option<assay_budget::Limits> {
        self.budget.as_ref().map(|b| b.remaining())
    }

    /// The run's token limit, if it has one.
    pub fn token_limit(&self) -> Option<u64> {
        self.budget.as_ref()?.limits().max_tokens
    }

    /// Whether the run has a spending limit.
    pub fn has_budget(&self) -> bool {
        self.budget.is_some()
    }

    /// Why the run may start no more model calls (its budget is spent, or a model it needs has no
    /// price), recorded in the run the first time; None while it may.
    pub fn budget_exhausted(&self) -> Option<assay_budget::BudgetRefusal> {
        let why = self.budget.as_ref()?.exhaustion()?;
        self.summary.update(|r| {
            if r.budget_exhausted.is_empty() {
                r.budget_exhausted = why.message.clone();
            }
        });
        Some(why)
    }

    /// Record why the run's budget stopped it (a call it needed could not be paid for), if it
    /// did and nothing was recorded yet.
    pub fn record_budget_stop(&self) {
        if let Some(why) = self.budget.as_ref().and_then(|b| b.stopped()) {
            self.summary.update(|r| {
                if r.budget_exhausted.is_empty() {
                    r.budget_exhausted = why;
                }
            });
        }
    }

    /// Add to the run's usage (its summary; the budget and the caps are settled by the stage
    /// call's slice).
    pub fn add_usage(&self, usage: &Usage) {
        charge(&self.summary, usage);
    }

    /// The usage so far, reset to none: what a helping gateway hands over with its finished
    /// chunks (its context's usage is its own, not the run's).
    pub fn take_usage(&self) -> pb::Usage {
        let mut taken = pb::Usage::default();
        self.summary.update(|run| taken = run.usage.replace(pb::Usage::default()).unwrap_or_default());
        taken
    }

    /// The run's usage so far.
    pub fn usage(&self) -> pb::Usage {
        self.summary.snapshot().usage.unwrap_or_default()
    }
}

/// Add `usage` to the run's summary: what [`Spending::add_usage`] and the sink of failed stage
/// calls share.
fn charge(summary: &Summary, usage: &Usage) {
    summary.update(|run| {
        let mut total = convert::usage_from(run.usage.take());
        total.add(usage);
        run.usage = Some(convert::usage_to(&total));
    });
}
