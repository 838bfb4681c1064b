//! A run's pause gate and cancellation: what a pipeline waits at before new work, and what every
//! stage call of its task waits at (through a task-local set by the engine).

use std::future::Future;

use assay_domain::StageError;
use tokio::sync::watch;

tokio::task_local! {
    /// The pause gate of the run whose pipeline this task executes (set by the engine).
    static RUN_GATE: RunGate;
}

/// A run's pause gate and cancellation, as the stage calls of its pipeline see them.
#[derive(Clone)]
pub(crate) struct RunGate {
    paused: watch::Receiver<bool>,
    cancelled: watch::Receiver<bool>,
}

impl RunGate {
    async fn wait(mut self) -> Result<(), StageError> {
        let released = tokio::select! {
            biased;
            _ = self.cancelled.wait_for(|c| *c) => false,
            _ = self.paused.wait_for(|p| !*p) => true,
        };
        if released && !*self.cancelled.borrow() {
            Ok(())
        } else {
            Err(StageError::Cancelled("the run was cancelled".into()))
        }
    }

    /// Run `f` (a pipeline) with this gate in scope for every stage call it makes on its task.
    pub(crate) async fn scope<F: Future>(self, f: F) -> F::Output {
        RUN_GATE.scope(self, f).await
    }
}

/// Before a stage call: waits while the run whose pipeline makes it is paused; CANCELLED once the
/// run is cancelled. Straight through outside a run. Every stage a pipeline holds calls it (the
/// gateway's stage wrappers), so no model call starts on a paused run.
pub async fn stage_gate() -> Result<(), StageError> {
    match RUN_GATE.try_with(RunGate::clone) {
        Ok(gate) => gate.wait().await,
        Err(_) => Ok(()),
    }
}

/// A run's pause and cancel switches.
pub struct Gate {
    pub(crate) paused: watch::Sender<bool>,
    pub(crate) cancelled: watch::Sender<bool>,
}

impl Default for Gate {
    fn default() -> Self {
        Self { paused: watch::channel(false).0, cancelled: watch::channel(false).0 }
    }
}

impl Gate {
    /// The run's pause gate, for the stage calls of its pipeline.
    pub(crate) fn run_gate(&self) -> RunGate {
        RunGate { paused: self.paused.subscribe(), cancelled: self.cancelled.subscribe() }
    }

    /// Whether the run is paused.
    pub fn is_paused(&self) -> bool {
        *self.paused.borrow()
    }

    /// Whether cancel was asked for.
    pub fn is_cancelled(&self) -> bool {
        *self.cancelled.borrow()
    }

    /// Resolves once cancel is asked for.
    pub async fn cancelled(&self) {
        let mut rx = self.cancelled.subscribe();
        let _ = rx.wait_for(|c| *c).await;
    }

    /// Before starting new work: waits while the run is paused; CANCELLED once cancel is asked for.
    pub async fn wait(&self) -> Result<(), StageError> {
        let mut paused = self.paused.subscribe();
        tokio::select! {
            biased;
            () = self.cancelled() => Err(StageError::Cancelled("the run was cancelled".into())),
            _ = paused.wait_for(|p| !*p) => {
                if self.is_cancelled() { Err(StageError::Cancelled("the run was cancelled".into())) } else { Ok(()) }
            }
        }
    }
}
