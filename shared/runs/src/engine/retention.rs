//! Deleting finished runs: one at a time on request (DeleteRun), and every run past the
//! retention period in the background (`gateway.retention_days`), by the one gateway holding the
//! store-wide sweep lease.

use std::time::Duration;

use assay_domain::StageError;
use assay_proto::gateway::v1 as gw;

use super::Engine;
use crate::clock::now;

/// The store-wide lease the retention sweep is done under.
const SWEEP_LEASE: &str = "retention";
/// How often the sweep looks for runs past the retention period.
const SWEEP_EVERY: Duration = Duration::from_secs(3600);
/// Runs deleted per store read of a sweep.
const SWEEP_BATCH: usize = 500;

impl Engine {
    /// Delete finished run `run_id` (its events, checkpoints and audit entries with it) and
    /// return its summary as it was, without its result. FAILED_PRECONDITION while it has not
    /// finished (or this gateway is still writing its end), NOT_FOUND when there is none.
    pub async fn delete(&self, run_id: &str) -> Result<gw::Run, StageError> {
        if self.live(run_id).is_some() {
            return Err(StageError::FailedPrecondition(format!(
                "run {run_id} is still executing; cancel it and delete it once it has ended"
            )));
        }
        let mut run = self.store.delete(run_id).await?;
        run.result = None;
        tracing::info!(run_id = %run_id, "run deleted");
        Ok(run)
    }

    /// Delete every finished run created more than `retention` ago; returns how many. A run
    /// that changed under the sweep (deleted by another caller meanwhile) is skipped.
    pub async fn sweep(&self, retention: Duration) -> Result<usize, StageError> {
        let cutoff = now().seconds.saturating_sub(i64::try_from(retention.as_secs()).unwrap_or(i64::MAX));
        let mut deleted = 0;
        loop {
            let ids = self.store.finished_before(cutoff, SWEEP_BATCH).await?;
            let mut gone = 0;
            for run_id in &ids {
                #[allow(clippy::wildcard_enum_match_arm)]
                match self.store.delete(run_id).await {
                    Ok(_) => gone += 1,
                    // Deleted by someone else since it was listed.
                    Err(StageError::NotFound(_)) => {}
                    Err(e) => return Err(e),
                }
            }
            deleted += gone;
            if ids.len() < SWEEP_BATCH || gone == 0 {
                return Ok(deleted);
            }
        }
    }

    /// Keep the store to `retention` (None = keep every run) until halted: every hour, the
    /// gateway holding the store-wide sweep lease deletes the finished runs older than that.
    pub async fn retain(&self, retention: Option<Duration>) {
        let Some(retention) = retention else { return };
        let retention_days = retention.as_secs_f64() / 86_400.0;
        let mut halt = self.halt.subscribe();
        loop {
            // Held for two periods: a gateway that dies leaves the chore to another after that.
            match self.store.hold_store_lease(SWEEP_LEASE, 2.0 * SWEEP_EVERY.as_secs_f64()).await {
                Ok(true) => match self.sweep(retention).await {
                    Ok(0) => {}
                    Ok(n) => tracing::info!(runs = n, retention_days, "deleted runs past the retention period"),
                    Err(e) => tracing::warn!(error = %e, "retention sweep failed; retried next period"),
                },
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "could not take the retention sweep lease"),
            }
            tokio::select! {
                () = tokio::time::sleep(SWEEP_EVERY) => {}
                _ = halt.wait_for(|h| *h) => return,
            }
        }
    }
}
