//! What a pipeline sees of its run, in parts of one job each: the event log, checkpoints, the
//! pause gate and cancellation, the human loop (action inbox and audit log), spending (usage,
//! budget, caps) and progress. [`RunCtx`] holds them; a pipeline uses the part it needs.

mod checkpoints;
mod gate;
mod inbox;
mod inputs;
mod log;
mod progress;
mod results;
mod spending;
mod summary;
#[cfg(test)]
mod tests;

use std::collections::BTreeSet;
use std::sync::Arc;

use assay_proto::gateway::v1 as gw;

pub use checkpoints::Checkpoints;
pub use gate::{Gate, stage_gate};
pub use inbox::Inbox;
pub(crate) use inbox::stored_audit_log;
pub use inputs::Inputs;
pub use log::{EventLog, Writes, Written};
pub use progress::{Progress, relay_with};
pub use results::Results;
pub(crate) use results::stored_page as stored_results_page;
pub use spending::Spending;

use crate::spend::SpendCaps;
use crate::store::RunStore;
use summary::Summary;

/// The parts of one run being executed by this gateway.
pub struct RunCtx {
    run_id: String,
    summary: Summary,
    /// Events (gap-free sequences, persisted, then broadcast).
    pub log: EventLog,
    /// What the pipeline stores to go on from after a restart.
    pub checkpoints: Checkpoints,
    /// The run's results by position (what `ListRunResults` pages).
    pub results: Results,
    /// Pause and cancel.
    pub gate: Gate,
    /// Human actions and the audit log.
    pub inbox: Inbox,
    /// An open run's records (rows of the run store).
    pub inputs: Inputs,
    /// Usage, budget and caps.
    pub spending: Spending,
    /// State, units done, models used, stage progress.
    pub progress: Progress,
    /// Serialises the controls of the run (the engine's): each sees the state the one before left.
    pub(crate) controls: tokio::sync::Mutex<()>,
}

impl RunCtx {
    /// A run's context; `seq` is the last sequence already stored. Starts the run's event writer
    /// (on the current Tokio runtime).
    pub(crate) fn new(run: gw::Run, seq: u64, store: Option<RunStore>) -> Self {
        let run_id = run.run_id.clone();
        let summary = Summary::new(run);
        let log = EventLog::new(run_id.clone(), seq, store.clone(), summary.clone());
        let gate = Gate::default();
        let inputs = Inputs::new(run_id.clone(), store.clone());
        Self {
            results: Results::new(log.clone(), inputs.clone()),
            checkpoints: Checkpoints::new(log.clone()),
            inputs,
            inbox: Inbox::new(log.clone(), summary.clone(), gate.paused.subscribe(), gate.cancelled.subscribe()),
            spending: Spending::new(log.clone(), summary.clone()),
            progress: Progress::new(log.clone(), summary.clone()),
            gate,
            log,
            run_id,
            summary,
            controls: tokio::sync::Mutex::new(()),
        }
    }

    /// The context of a gateway helping with a run another gateway executes (its records spread
    /// over the gateways sharing the store): records and stored checkpoints come from the store;
    /// its events, checkpoints, usage and progress stay in memory (what it stores goes through
    /// [`Inputs::commit`]).
    pub(crate) fn helper(run: gw::Run, store: RunStore) -> Self {
        let mut ctx = Self::new(run, 0, None);
        ctx.inputs = Inputs::new(ctx.run_id.clone(), Some(store));
        ctx.results = Results::new(ctx.log.clone(), ctx.inputs.clone());
        ctx.spending.take_usage();
        ctx
    }

    /// Hold the run to the daily spend caps of `backends` (see [`Spending`]).
    #[must_use]
    pub(crate) fn with_spend(mut self, caps: Arc<SpendCaps>, backends: BTreeSet<String>) -> Self {
        self.spending.hold_to(caps, backends);
        self
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Whether events and checkpoints are kept in memory only (Evaluate).
    pub fn is_ephemeral(&self) -> bool {
        self.log.is_ephemeral()
    }

    /// The run's summary as it stands.
    pub fn snapshot(&self) -> gw::Run {
        self.summary.snapshot()
    }

    pub(crate) fn update(&self, f: impl FnOnce(&mut gw::Run)) {
        self.summary.update(f);
    }
}
