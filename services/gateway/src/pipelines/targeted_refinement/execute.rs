//! One iteration's tasks, batch by batch (patchers together, expanders alone): each task refined,
//! verified by the delta judge, applied or rolled back; a section locks after
//! [`EDITS_TO_LOCK`] accepted edits.

use assay_domain::arbiter::FixAction;
use assay_domain::content::SectionEditRequest;
use assay_domain::iteration::EDITS_TO_LOCK;
use assay_domain::verify::VerifyRequest;
use assay_domain::{JudgeIssue, Section, StageError};
use assay_proto::convert;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::refinement_event::Event as Ev;
use futures::StreamExt;
use tokio::sync::Mutex;

use super::state::{Halt, State, Status, TaskState};
use super::{TargetedRefinement, verdict_of};
use crate::engine::RunCtx;

impl TargetedRefinement {
    /// Run the iteration's pending tasks batch by batch.
    pub(super) async fn execute(&self, ctx: &RunCtx, st: State) -> Result<(State, Option<Halt>), StageError> {
        let shared = Mutex::new(st);
        let batches: Vec<u32> = {
            let st = shared.lock().await;
            let mut b: Vec<u32> = st.tasks.iter().map(|t| t.batch).collect();
            b.dedup();
            b
        };
        let total = batches.len() as u32;
        let mut halt = None;
        for batch in batches {
            let (pending, fresh, parallel) = {
                let mut st = shared.lock().await;
                let fresh = !st.batches_started.contains(&batch)
                    && st.tasks.iter().filter(|t| t.batch == batch).all(|t| t.status == Status::Pending);
                // A task left running by a stopped gateway runs again.
                for t in st.tasks.iter_mut().filter(|t| t.batch == batch && t.status == Status::Running) {
                    t.status = Status::Pending;
                }
                let ts: Vec<&TaskState> = st.tasks.iter().filter(|t| t.batch == batch).collect();
                let pending: Vec<usize> = st
                    .tasks
                    .iter()
                    .enumerate()
                    .filter(|(_, t)| t.batch == batch && t.status == Status::Pending)
                    .map(|(i, _)| i)
                    .collect();
                let parallel = ts.iter().all(|t| t.task.action == FixAction::SurgicalEdit);
                (pending, fresh, parallel)
            };
            if pending.is_empty() {
                continue;
            }
            if halt.is_some() {
                let mut st = shared.lock().await;
                for i in pending {
                    st.tasks[i].status = Status::Skipped;
                    st.tasks[i].detail = "not run: the iteration stopped".into();
                }
                continue;
            }
            let iteration = shared.lock().await.iteration;
            if fresh {
                let task_ids = pending.iter().map(|i| async { shared.lock().await.tasks[*i].task.id.clone() });
                let task_ids = futures::future::join_all(task_ids).await;
                self.emit(
                    ctx,
                    iteration,
                    Ev::BatchStarted(gw::BatchStarted { batch_index: batch, batches_total: total, task_ids }),
                )
                .await?;
                let mut st = shared.lock().await;
                st.batches_started.insert(batch);
                self.save(ctx, &st, "executing").await?;
            }
            let width = if parallel { self.max_parallel_patchers as usize } else { 1 };
            let shared_ref = &shared;
            let mut runs = futures::stream::iter(pending.clone())
                .map(|i| async move {
                    if let Some(h) = self.checkpoint_gate(ctx, shared_ref).await? {
                        let mut st = shared_ref.lock().await;
                        st.tasks[i].status = Status::Skipped;
                        st.tasks[i].detail = match &h {
                            Halt::Limit(r) => format!("not run: {r}"),
                            Halt::Accept => "not run: accepted by a human".into(),
                        };
                        return Ok::<_, StageError>(Some(h));
                    }
                    self.run_task(ctx, shared_ref, i).await?;
                    Ok(None)
                })
                .buffer_unordered(width);
            while let Some(r) = runs.next().await {
                if let Some(h) = r? {
                    // A human accept wins over a limit.
                    if halt.is_none() || h == Halt::Accept {
                        halt = Some(h);
                    }
                }
            }
            drop(runs);
            let st = shared.lock().await;
            let of = |s: Status| st.tasks.iter().filter(|t| t.batch == batch && t.status == s).count() as u32;
            let event = gw::BatchComplete {
                batch_index: batch,
                tasks_completed: of(Status::Applied),
                tasks_failed: of(Status::Rejected) + of(Status::Failed),
                tasks_skipped: of(Status::Skipped),
            };
            self.save(ctx, &st, "executing").await?;
            drop(st);
            self.emit(ctx, iteration, Ev::BatchComplete(event)).await?;
        }
        Ok((shared.into_inner(), halt))
    }

    /// One task: refine the section, verify the fix, apply or roll back, lock after 2 edits.
    async fn run_task(&self, ctx: &RunCtx, shared: &Mutex<State>, i: usize) -> Result<(), StageError> {
        let stages = self.stages()?;
        let (task, request, iteration, batch, active_ms) = {
            let mut st = shared.lock().await;
            let task = st.tasks[i].task.clone();
            if st.human_edited.contains(&task.section_id) || st.locked.contains(&task.section_id) {
                st.tasks[i].status = Status::Skipped;
                st.tasks[i].detail = if st.locked.contains(&task.section_id) {
                    "section locked".into()
                } else {
                    "a human edited the section".into()
                };
                return Ok(());
            }
            let Some(pos) = st.sections.iter().position(|s| s.id == task.section_id) else {
                st.tasks[i].status = Status::Failed;
                st.tasks[i].detail = format!("no section {:?}", task.section_id);
                return Ok(());
            };
            let issues: Vec<JudgeIssue> = st
                .judged
                .last()
                .map(|j| j.issues.iter().filter(|x| task.issue_ids.contains(&x.id)).cloned().collect())
                .unwrap_or_default();
            let request = SectionEditRequest {
                section: st.sections[pos].clone(),
                issues,
                instruction: task.instruction.clone(),
                constraints: task.constraints.clone(),
                previous: pos.checked_sub(1).map(|p| st.sections[p].clone()),
                next: st.sections.get(pos + 1).cloned(),
                brief: self.brief.clone(),
                target_words: 0,
                model: match task.action {
                    FixAction::SurgicalEdit => self.models.patcher.clone(),
                    FixAction::RegenerateSection | FixAction::FullRegenerate => self.models.expander.clone(),
                },
            };
            st.tasks[i].status = Status::Running;
            self.save(ctx, &st, "executing").await?;
            (task, request, st.iteration, st.tasks[i].batch, st.active_ms)
        };
        self.emit(
            ctx,
            iteration,
            Ev::TaskStarted(gw::TaskStarted { task: Some(convert::arbiter::task_to(&task)), batch_index: batch }),
        )
        .await?;
        let before = request.section.clone();
        let issues = request.issues.clone();
        let edit = match task.action {
            FixAction::SurgicalEdit => stages.editor.patch(request).await,
            FixAction::RegenerateSection | FixAction::FullRegenerate => stages.editor.expand_section(request).await,
        };
        let failure = |reason: String| gw::VerificationResult {
            task_id: task.id.clone(),
            section_id: task.section_id.clone(),
            accepted: false,
            rolled_back: false,
            verification: None,
            reason,
            human_edit: false,
            edit_count: 0,
        };
        let edit = match edit {
            Err(e @ StageError::Cancelled(_)) => return Err(e),
            Err(e) => return self.task_failed(ctx, shared, i, failure(format!("refiner failed: {e}"))).await,
            Ok(edit) => edit,
        };
        ctx.add_usage(&edit.usage);
        ctx.add_model(&edit.model);
        let Some(after) = edit.section.clone() else {
            let reason = format!("refiner refused its reply: {}", edit.rejected_reason);
            return self.task_failed(ctx, shared, i, failure(reason)).await;
        };
        let after = Section { id: before.id.clone(), index: before.index, ..after };
        self.emit(
            ctx,
            iteration,
            Ev::PatchApplied(gw::PatchApplied {
                task_id: task.id.clone(),
                section_id: task.section_id.clone(),
                action: convert::arbiter::fix_action_to(task.action) as i32,
                section: Some(convert::document::section_to(&after)),
                diff_summary: edit.diff_summary.clone(),
                usage: Some(convert::usage_to(&edit.usage)),
            }),
        )
        .await?;
        // Once a budget is spent the fix is not verified: rolled back (the iteration is not judged).
        let (accepted, verification, reason) = match self.spent(ctx, active_ms) {
            Some(limit) => (false, None, format!("not verified: {limit}")),
            None => {
                let verified = stages
                    .delta
                    .verify(VerifyRequest {
                        before: before.clone(),
                        after: after.clone(),
                        issues,
                        model: self.models.delta.clone(),
                        ..VerifyRequest::default()
                    })
                    .await;
                verdict_of(ctx, verified)?
            }
        };
        let mut st = shared.lock().await;
        let mut locked_now = None;
        if accepted {
            st.set_section(&after);
            let n = {
                let e = st.edits.entry(task.section_id.clone()).or_default();
                *e += 1;
                *e
            };
            if n >= EDITS_TO_LOCK && !st.locked.contains(&task.section_id) {
                st.locked.push(task.section_id.clone());
                locked_now = Some(n);
            }
            st.tasks[i].status = Status::Applied;
            st.tasks_completed += 1;
        } else {
            st.tasks[i].status = Status::Rejected;
            st.tasks[i].detail.clone_from(&reason);
            st.tasks_failed += 1;
        }
        let edit_count = st.edits.get(&task.section_id).copied().unwrap_or(0);
        self.save(ctx, &st, "executing").await?;
        drop(st);
        self.emit(
            ctx,
            iteration,
            Ev::VerificationResult(gw::VerificationResult {
                task_id: task.id.clone(),
                section_id: task.section_id.clone(),
                accepted,
                rolled_back: !accepted,
                verification,
                reason,
                human_edit: false,
                edit_count,
            }),
        )
        .await?;
        if let Some(n) = locked_now {
            self.emit(
                ctx,
                iteration,
                Ev::SectionLocked(gw::SectionLocked { section_id: task.section_id.clone(), edit_count: n }),
            )
            .await?;
        }
        Ok(())
    }

    async fn task_failed(
        &self,
        ctx: &RunCtx,
        shared: &Mutex<State>,
        i: usize,
        mut event: gw::VerificationResult,
    ) -> Result<(), StageError> {
        let mut st = shared.lock().await;
        st.tasks[i].status = Status::Failed;
        st.tasks[i].detail.clone_from(&event.reason);
        st.tasks_failed += 1;
        event.edit_count = st.edits.get(&event.section_id).copied().unwrap_or(0);
        let iteration = st.iteration;
        self.save(ctx, &st, "executing").await?;
        drop(st);
        self.emit(ctx, iteration, Ev::VerificationResult(event)).await
    }
}
