//! The human loop: controls posted on the run (validated against its state), the gate every
//! task and judging passes (pause, posted edits, an accept), the delta judge's check of a human's
//! edits, and the wait after a semi-auto escalation.

use std::time::Instant;

use assay_domain::limits::MAX_TEXT_BYTES;
use assay_domain::verify::VerifyRequest;
use assay_domain::{JudgeIssue, StageError, Violations};
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::control_run_request::Action;
use assay_proto::gateway::v1::refinement_event::Event as Ev;
use tokio::sync::Mutex;

use super::state::{Halt, Human, State};
use super::{STATE, TargetedRefinement, verdict_of};
use assay_runs::{ControlEffect, RunCtx};

impl TargetedRefinement {
    /// Before new work: wait while paused, take posted human actions (edits applied at once,
    /// verified once the run resumes), stop at a limit. `Some` ends the iteration.
    pub(super) async fn checkpoint_gate(
        &self,
        ctx: &RunCtx,
        shared: &Mutex<State>,
    ) -> Result<Option<Halt>, StageError> {
        let _one = self.gate.lock().await;
        loop {
            if self.accepted.load(std::sync::atomic::Ordering::SeqCst) {
                return Ok(Some(Halt::Accept));
            }
            let consumed = {
                let st = shared.lock().await;
                if ctx.gate.is_paused() {
                    self.save(ctx, &st, "paused").await?;
                }
                st.consumed
            };
            let waited = Instant::now();
            let action = ctx.inbox.gate_or_action(consumed).await?;
            self.clock.add_wait(waited.elapsed());
            let Some(request) = action else { break };
            let mut st = shared.lock().await;
            st.consumed += 1;
            match request.action {
                Some(Action::EditSection(e)) => self.apply_human_edit(&mut st, &e),
                Some(Action::Accept(_)) => {
                    self.accepted.store(true, std::sync::atomic::Ordering::SeqCst);
                    self.save(ctx, &st, "done").await?;
                    return Ok(Some(Halt::Accept));
                }
                // Review and resume-after-escalation do not apply mid-iteration.
                _ => {}
            }
            self.save(ctx, &st, "paused").await?;
        }
        let mut st = shared.lock().await;
        if !st.unverified_edits.is_empty() {
            self.verify_human_edits(ctx, &mut st).await?;
        }
        Ok(self.spent(ctx, &st).map(Halt::Limit))
    }

    fn apply_human_edit(&self, st: &mut State, e: &gw::EditSection) {
        let Some(mut section) = st.section(&e.section_id).cloned() else { return };
        section.content.clone_from(&e.content);
        st.set_section(&section);
        if !st.unverified_edits.contains(&e.section_id) {
            st.unverified_edits.push(e.section_id.clone());
        }
        st.human_edited.insert(e.section_id.clone());
        st.human_sections.insert(e.section_id.clone());
    }

    /// Verify sections a human edited before the loop goes on: the delta judge checks each against the open
    /// issues of its section. The edit stands either way (a human decided); the result is reported.
    pub(super) async fn verify_human_edits(&self, ctx: &RunCtx, st: &mut State) -> Result<(), StageError> {
        let delta = &self.stages()?.delta;
        let ids = std::mem::take(&mut st.unverified_edits);
        for id in ids {
            let (Some(before), Some(after)) = (
                st.judged.last().and_then(|j| j.sections.iter().find(|s| s.id == id)).cloned(),
                st.section(&id).cloned(),
            ) else {
                continue;
            };
            let issues: Vec<JudgeIssue> = st
                .judged
                .last()
                .map(|j| j.issues.iter().filter(|i| i.section_id == id).cloned().collect())
                .unwrap_or_default();
            let (accepted, verification, reason) = match self.spent(ctx, st) {
                // The edit stands; it is reported unverified.
                Some(limit) => (false, None, format!("not verified: {limit}")),
                None => {
                    let outcome = delta
                        .verify(VerifyRequest {
                            before,
                            after,
                            issues,
                            model: self.models.delta.clone(),
                            ..VerifyRequest::default()
                        })
                        .await;
                    if let Ok(o) = &outcome {
                        st.tally(super::state::VERIFICATION, &o.usage);
                    }
                    verdict_of(ctx, outcome)?
                }
            };
            self.emit(
                ctx,
                st.iteration,
                Ev::VerificationResult(gw::VerificationResult {
                    task_id: String::new(),
                    section_id: id.clone(),
                    accepted,
                    rolled_back: false,
                    verification,
                    reason,
                    human_edit: true,
                    edit_count: st.edits.get(&id).copied().unwrap_or(0),
                }),
            )
            .await?;
        }
        self.save(ctx, st, "executing").await
    }

    /// Semi-auto escalation: wait for a human. Edits are applied as they come; accept, review or
    /// resume ends the wait.
    pub(super) async fn await_human(&self, ctx: &RunCtx, st: &mut State) -> Result<Human, StageError> {
        ctx.progress.set_state(gw::RunState::AwaitingHuman, "escalated: below the semi-auto thresholds").await?;
        self.save(ctx, st, "awaiting_human").await?;
        loop {
            let waited = Instant::now();
            let request = ctx.inbox.next_action(st.consumed).await;
            self.clock.add_wait(waited.elapsed());
            let request = request?;
            st.consumed += 1;
            let decision = match request.action {
                Some(Action::EditSection(e)) => {
                    self.apply_human_edit(st, &e);
                    None
                }
                Some(Action::Accept(_)) => Some(Human::Accept),
                Some(Action::Review(_)) => Some(Human::Review),
                Some(Action::Resume(_)) => Some(Human::Resume),
                _ => None,
            };
            self.save(ctx, st, "awaiting_human").await?;
            if let Some(d) = decision {
                return Ok(d);
            }
        }
    }

    /// Bytes of the document (titles and contents) once `edit` is applied after the edits already
    /// taken: the state checkpointed, then the posted edits the loop has not consumed yet.
    async fn document_after(&self, ctx: &RunCtx, edit: &gw::EditSection) -> Result<usize, StageError> {
        let (mut sections, consumed) = match ctx.checkpoints.load_json::<State>(STATE).await? {
            Some(st) => (st.sections, st.consumed),
            None => (self.sections.clone(), 0),
        };
        let posted = ctx.inbox.actions_from(consumed).await?;
        let edits = posted.iter().filter_map(|r| match &r.action {
            Some(Action::EditSection(e)) => Some(e),
            _ => None,
        });
        for e in edits.chain([edit]) {
            if let Some(s) = sections.iter_mut().find(|s| s.id == e.section_id) {
                s.content.clone_from(&e.content);
            }
        }
        Ok(sections.iter().map(|s| s.title.len() + s.content.len()).sum())
    }

    /// Validate a pipeline control against the run's state and post it for the loop.
    pub(super) async fn take_control(
        &self,
        ctx: &RunCtx,
        request: &gw::ControlRunRequest,
    ) -> Result<ControlEffect, StageError> {
        let state = ctx.progress.state();
        let held = matches!(state, gw::RunState::Paused | gw::RunState::AwaitingHuman);
        let name = state.as_str_name();
        let reason = &request.reason;
        match &request.action {
            Some(Action::EditSection(e)) => {
                if !held {
                    return Err(StageError::FailedPrecondition(format!(
                        "edit_section: the run is {name}; pause it first (intervene) or wait for an escalation"
                    )));
                }
                let mut v = Violations::new();
                if !self.sections.iter().any(|s| s.id == e.section_id) {
                    let ids: Vec<&str> = self.sections.iter().map(|s| s.id.as_str()).collect();
                    v.push(
                        "edit_section.section_id",
                        format!("no section {:?}; the document's sections are {}", e.section_id, ids.join(", ")),
                    );
                }
                if e.content.trim().is_empty() {
                    v.push("edit_section.content", "must not be empty");
                } else if e.content.len() > MAX_TEXT_BYTES {
                    v.push(
                        "edit_section.content",
                        format!("is {} bytes; the limit is {MAX_TEXT_BYTES} bytes", e.content.len()),
                    );
                }
                v.into_result()?;
                let total = self.document_after(ctx, e).await?;
                if total > MAX_TEXT_BYTES {
                    return Err(StageError::invalid(
                        "edit_section.content",
                        format!(
                            "would make the document {total} bytes (its sections' titles and contents with the \
                             edits posted so far); the limit is {MAX_TEXT_BYTES} bytes"
                        ),
                    ));
                }
                let detail = format!("section {}: {reason}", e.section_id);
                ctx.inbox.post_action(request, "edit_section", &detail).await?;
                Ok(ControlEffect::Taken)
            }
            Some(Action::Accept(_)) => {
                if !held {
                    return Err(StageError::FailedPrecondition(format!(
                        "accept: the run is {name}; pause it first (intervene) or wait for an escalation"
                    )));
                }
                ctx.inbox.post_action(request, "accept", reason).await?;
                Ok(ControlEffect::Ends)
            }
            Some(Action::Review(_)) => {
                if state != gw::RunState::AwaitingHuman {
                    return Err(StageError::FailedPrecondition(format!(
                        "review: the run is {name}; mark as reviewed applies to an escalated run (RUN_STATE_AWAITING_HUMAN)"
                    )));
                }
                ctx.inbox.post_action(request, "review", reason).await?;
                Ok(ControlEffect::Ends)
            }
            Some(Action::Resume(_)) => {
                ctx.inbox.post_action(request, "resume", reason).await?;
                Ok(ControlEffect::Taken)
            }
            _ => Err(StageError::FailedPrecondition(format!("this action does not apply to a run in state {name}"))),
        }
    }
}
