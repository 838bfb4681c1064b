//! Controls of a run: pause, resume and cancel (the engine's) and a pipeline's own, on the gateway
//! executing the run or, on a shared store, posted for the one that does.

use assay_domain::StageError;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::control_run_request::Action;

use super::{CANCEL_WAIT, CONTROL_POLL, CONTROL_WAIT, Engine};
use crate::clock::{is_terminal, state_name};
use crate::pipeline::ControlEffect;
use crate::store;

impl Engine {
    /// Pause, resume or cancel (the engine's), or a pipeline-specific control. Every action taken
    /// is in the run's audit log with its actor and reason.
    pub async fn control(&self, req: gw::ControlRunRequest) -> Result<gw::Run, StageError> {
        let Some(action) = req.action.clone() else {
            return Err(StageError::invalid(
                "action",
                "is required (pause, resume, cancel, accept, review or edit_section)",
            ));
        };
        let run_id = req.run_id.clone();
        let Some(live) = self.live(&run_id) else {
            let stored = self.store.get(&run_id).await?.ok_or_else(|| StageError::NotFound(format!("run {run_id}")))?;
            if self.store.shared() && !is_terminal(stored.run.state) {
                return self.control_elsewhere(req).await;
            }
            return Err(StageError::FailedPrecondition(format!(
                "run {run_id} is not in progress (state {})",
                gw::RunState::try_from(stored.run.state).map(|s| s.as_str_name()).unwrap_or("unknown")
            )));
        };
        // The caller's text quoted and escaped (`?`): never a raw newline or escape in a log line.
        tracing::info!(run_id = %run_id, actor = ?req.actor, reason = ?req.reason, "run control");
        let ctx = &live.ctx;
        // One control at a time on a run (every control of a run comes here, on the gateway
        // executing it): the first decides, the next sees the state it left. Each is taken only
        // in the state it was checked against, its audit entry written with its effect.
        let _one = ctx.controls.lock().await;
        let state = ctx.progress.state();
        if is_terminal(state as i32) {
            return Err(StageError::FailedPrecondition(format!(
                "run {run_id} is not in progress (state {})",
                state_name(state as i32)
            )));
        }
        let awaiting = state == gw::RunState::AwaitingHuman;
        let effect = match action {
            Action::Pause(_) => {
                match state {
                    gw::RunState::AwaitingHuman => {
                        return Err(StageError::FailedPrecondition(format!(
                            "run {run_id} is waiting for a human decision (RUN_STATE_AWAITING_HUMAN): edit_section, resume, accept or review"
                        )));
                    }
                    gw::RunState::Paused => {
                        return Err(StageError::FailedPrecondition(format!(
                            "run {run_id} is already paused (RUN_STATE_PAUSED): resume or cancel it"
                        )));
                    }
                    gw::RunState::Unspecified
                    | gw::RunState::Pending
                    | gw::RunState::Running
                    | gw::RunState::Succeeded
                    | gw::RunState::Partial
                    | gw::RunState::Failed
                    | gw::RunState::Cancelled => {}
                }
                // The gate closes first: no stage call starts once the pause is taken.
                let was = ctx.gate.paused.send_replace(true);
                if let Err(e) = ctx.inbox.control_write(&req, "pause", &[state], Some(gw::RunState::Paused)).await {
                    ctx.gate.paused.send_replace(was);
                    return Err(e);
                }
                ControlEffect::Taken
            }
            Action::Resume(_) if awaiting => {
                let effect = live.pipeline.control(ctx, &req).await?;
                // Decided: the run no longer waits for a human (a concurrent accept or review
                // finds it running); the pipeline goes on once it takes the posted resume.
                ctx.progress.set_state(gw::RunState::Running, "resumed by a human").await?;
                // A run that escalated while paused goes on too.
                ctx.gate.paused.send_replace(false);
                effect
            }
            Action::Resume(_) => {
                if state != gw::RunState::Paused {
                    return Err(StageError::FailedPrecondition(format!(
                        "run {run_id} is not paused (state {}); resume applies to a paused run or one waiting for a human",
                        state_name(state as i32)
                    )));
                }
                ctx.inbox.control_write(&req, "resume", &[gw::RunState::Paused], Some(gw::RunState::Running)).await?;
                ctx.gate.paused.send_replace(false);
                ControlEffect::Taken
            }
            Action::Cancel(_) => {
                ctx.inbox.control_write(&req, "cancel", &[state], None).await?;
                ctx.gate.paused.send_replace(false);
                ctx.gate.cancelled.send_replace(true);
                ControlEffect::Ends
            }
            Action::Accept(_) | Action::EditSection(_) | Action::Review(_) => live.pipeline.control(ctx, &req).await?,
        };
        if effect == ControlEffect::Ends {
            // A human ended the run: a pause no longer holds it (its last stage calls, the
            // self-refine hook say, run to their end).
            ctx.gate.paused.send_replace(false);
            // Answer once the run has stopped (in-flight calls dropped, its end recorded), so the
            // state returned is the one the run ends in; the control lock is held until then, so
            // a control that came meanwhile finds the run ended.
            let mut done = live.done.subscribe();
            if tokio::time::timeout(CANCEL_WAIT, done.wait_for(|d| *d)).await.is_err() {
                tracing::warn!(run_id = %run_id, "control: run still stopping after {CANCEL_WAIT:?}");
            }
            return self.get(&run_id).await;
        }
        Ok(ctx.snapshot())
    }

    /// A control for a run another gateway executes (shared store): posted for it, answered
    /// once that gateway has taken it, with the run as stored then.
    async fn control_elsewhere(&self, req: gw::ControlRunRequest) -> Result<gw::Run, StageError> {
        let run_id = req.run_id.clone();
        let id = self.store.post_control(req).await?;
        let deadline = tokio::time::Instant::now() + CONTROL_WAIT;
        loop {
            match self.store.control_outcome(id).await? {
                store::ControlOutcome::Taken => return self.get(&run_id).await,
                // The executing gateway's answer, as it would have given it.
                store::ControlOutcome::Refused(r) => {
                    self.store.remove_control(id).await?;
                    let status =
                        tonic::Status::with_details(tonic::Code::from_i32(r.code), r.message, r.details.into());
                    return Err(assay_rpc::from_status(status));
                }
                store::ControlOutcome::Pending => {}
            }
            if tokio::time::Instant::now() >= deadline {
                self.store.remove_control(id).await?;
                return Err(StageError::Unavailable(format!(
                    "run {run_id}: the gateway executing it did not take the control within {CONTROL_WAIT:?}; retry"
                )));
            }
            tokio::time::sleep(CONTROL_POLL / 2).await;
        }
    }
}
