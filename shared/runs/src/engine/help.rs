//! Helping with runs other gateways execute: an open run whose records are spread over the
//! gateways sharing the store (see [`crate::store::ChunkStorage`]) is looked for every second, and
//! this gateway claims chunks of it, scores them and stores their results until nothing is left to
//! claim, the run stops running, or this gateway stops.

use std::sync::Arc;
use std::time::Duration;

use assay_domain::StageError;
use assay_proto::gateway::v1 as gw;

use super::Engine;
use crate::ctx::RunCtx;

/// How often a gateway looks for spread runs to help with.
pub(super) const LOOK_EVERY: Duration = Duration::from_secs(1);
/// How often a helper checks that the run it helps with still runs.
const STATE_POLL: Duration = Duration::from_millis(500);
/// Runs a gateway helps with at once.
const MAX_HELPED: usize = 4;

impl Engine {
    /// Start helping with the spread runs that have chunks to claim, up to [`MAX_HELPED`].
    pub(super) async fn look_for_help(&self) {
        let room = MAX_HELPED.saturating_sub(self.helping.lock().map(|h| h.len()).unwrap_or(MAX_HELPED));
        if room == 0 {
            return;
        }
        let runs = match self.store.runs_to_help(room + MAX_HELPED).await {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(error = %e, "could not look for runs to help with");
                return;
            }
        };
        for run_id in runs {
            if self.live(&run_id).is_some() {
                continue;
            }
            let fresh = self.helping.lock().is_ok_and(|mut h| h.len() < MAX_HELPED && h.insert(run_id.clone()));
            if !fresh {
                continue;
            }
            let this = self.clone();
            tokio::spawn(async move {
                if let Err(e) = this.help(&run_id).await {
                    tracing::warn!(run_id = %run_id, error = %e, "helping with a spread run failed");
                }
                if let Ok(mut h) = this.helping.lock() {
                    h.remove(&run_id);
                }
            });
        }
    }

    /// Help with run `run_id` until nothing is left to claim (or it stops running, or this
    /// gateway stops); the chunks it still holds are given up at the end.
    async fn help(&self, run_id: &str) -> Result<(), StageError> {
        let Some(stored) = self.store.get(run_id).await? else { return Ok(()) };
        if stored.run.state != gw::RunState::Running as i32 {
            return Ok(());
        }
        let pipeline = self.factory.parse(&stored.request)?;
        let spend = match &self.spend {
            Some(c) => Some((c.clone(), c.capped_backends_of(&stored.request))),
            None => None,
        };
        let ctx = Arc::new(self.capped(RunCtx::helper(stored.run, self.store.clone()), spend));
        tracing::info!(run_id = %run_id, "helping with a spread run");
        let mut halt = self.halt.subscribe();
        let gate = ctx.gate.run_gate();
        let outcome = tokio::select! {
            r = gate.scope(ctx.spending.scope(pipeline.help(&ctx))) => r,
            () = self.stops_running(run_id) => Ok(()),
            _ = halt.wait_for(|h| *h) => Ok(()),
        };
        ctx.inputs.release().await?;
        tracing::info!(run_id = %run_id, "done helping with a spread run");
        outcome
    }

    /// Resolves once run `run_id` is no longer RUNNING (paused, ended, deleted).
    async fn stops_running(&self, run_id: &str) {
        loop {
            tokio::time::sleep(STATE_POLL).await;
            match self.store.get(run_id).await {
                Ok(Some(s)) if s.run.state == gw::RunState::Running as i32 => {}
                Ok(_) => return,
                Err(e) => tracing::warn!(run_id = %run_id, error = %e, "could not read a helped run's state"),
            }
        }
    }
}
