//! One iteration's tasks, batch by batch (patchers together, expanders alone): each task refined,
//! verified by the delta judge, applied or rolled back; a section locks after
//! [`EDITS_TO_LOCK`] accepted edits.

use assay_domain::arbiter::{FixAction, FixTask};
use assay_domain::content::{SectionEditRequest, edit_length};
use assay_domain::iteration::{self, EDITS_TO_LOCK, board};
use assay_domain::verify::{ConsistencyRequest, VerifyRequest};
use assay_domain::{JudgeIssue, Section, Severity, StageError};
use assay_proto::convert;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::refinement_event::Event as Ev;
use futures::StreamExt;
use tokio::sync::Mutex;

use super::state::{EDITING, Halt, State, Status, TaskState, VERIFICATION};
use super::{TargetedRefinement, verdict_of};
use assay_runs::RunCtx;

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
                    self.run_task(ctx, shared_ref, i).await
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
            // Sections locked by the batch's edits: section_locked comes after batch_complete.
            let mut st = shared.lock().await;
            for (section_id, edit_count) in std::mem::take(&mut st.locks_to_announce) {
                self.emit(ctx, iteration, Ev::SectionLocked(gw::SectionLocked { section_id, edit_count })).await?;
            }
            self.save(ctx, &st, "executing").await?;
        }
        Ok((shared.into_inner(), halt))
    }

    /// One task: refine the section, verify the fix, apply or roll back, lock after 2 edits. A
    /// task whose estimate (plus the reserve for the final judging) no longer fits the budget
    /// does not start (`Some`: the iteration stops); a task that started always completes,
    /// verification included. A consistency check (the section after a regenerated one) asks
    /// the delta judge first and edits only when the section no longer fits.
    async fn run_task(&self, ctx: &RunCtx, shared: &Mutex<State>, i: usize) -> Result<Option<Halt>, StageError> {
        let stages = self.stages()?;
        let (task, mut request, iteration, batch, previous_changed, length) = {
            let mut st = shared.lock().await;
            let task = st.tasks[i].task.clone();
            if st.human_edited.contains(&task.section_id) || st.locked.contains(&task.section_id) {
                st.tasks[i].status = Status::Skipped;
                st.tasks[i].detail = if st.locked.contains(&task.section_id) {
                    "section locked".into()
                } else {
                    "a human edited the section".into()
                };
                return Ok(None);
            }
            let Some(pos) = st.sections.iter().position(|s| s.id == task.section_id) else {
                st.tasks[i].status = Status::Failed;
                st.tasks[i].detail = format!("no section {:?}", task.section_id);
                return Ok(None);
            };
            let reserve = self.reserve(&st, &task.section_id);
            let used = self.budget_used(ctx, &st);
            if used + u64::from(task.estimated_tokens) + reserve > self.max_tokens(ctx, &st) {
                st.tasks[i].status = Status::Skipped;
                st.tasks[i].detail = format!(
                    "not run: token_budget ({used} of {} tokens used; this task needs about {} and the final \
                     judging of the changed sections about {reserve})",
                    self.max_tokens(ctx, &st),
                    task.estimated_tokens
                );
                return Ok(Some(Halt::Limit(iteration::Stop::TokenBudget.name().into())));
            }
            let issues: Vec<JudgeIssue> = st
                .judged
                .last()
                .map(|j| j.issues.iter().filter(|x| task.issue_ids.contains(&x.id)).cloned().collect())
                .unwrap_or_default();
            // The task's kind and issues set the length it aims at and is verified against.
            let expand = task.action != FixAction::SurgicalEdit;
            let length = edit_length(expand, &st.sections[pos], &st.sections, &issues);
            let request = SectionEditRequest {
                section: st.sections[pos].clone(),
                issues,
                instruction: task.instruction.clone(),
                constraints: task.constraints.clone(),
                previous: pos.checked_sub(1).map(|p| st.sections[p].clone()),
                next: st.sections.get(pos + 1).cloned(),
                brief: self.brief.clone(),
                target_words: length.target_words,
                model: match task.action {
                    FixAction::SurgicalEdit => self.models.patcher.clone(),
                    FixAction::RegenerateSection | FixAction::FullRegenerate => self.models.expander.clone(),
                },
            };
            let previous_changed = request.previous.as_ref().is_some_and(|p| {
                st.before_iteration.iter().find(|b| b.id == p.id).is_some_and(|b| b.content != p.content)
            });
            if task.consistency_check && request.issues.is_empty() && !previous_changed {
                st.tasks[i].status = Status::Skipped;
                st.tasks[i].detail = "no consistency check: the section before it was not changed".into();
                return Ok(None);
            }
            let (edit, verify) = split_estimate(&task, &request.section);
            st.expect(VERIFICATION, verify);
            st.expect(EDITING, edit);
            st.tasks[i].status = Status::Running;
            self.save(ctx, &st, "executing").await?;
            (task, request, st.iteration, st.tasks[i].batch, previous_changed, length)
        };
        self.emit(
            ctx,
            iteration,
            Ev::TaskStarted(gw::TaskStarted { task: Some(convert::arbiter::task_to(&task)), batch_index: batch }),
        )
        .await?;
        if task.consistency_check {
            match self.check_consistency(ctx, shared, &task, &request, previous_changed, iteration).await? {
                Consistency::Fits(detail) if request.issues.is_empty() => {
                    let mut st = shared.lock().await;
                    st.tasks[i].status = Status::Skipped;
                    st.tasks[i].detail = detail;
                    self.save(ctx, &st, "executing").await?;
                    return Ok(None);
                }
                Consistency::Fits(_) => {}
                Consistency::Broken(issue) => {
                    request.instruction = if request.instruction.trim().is_empty() {
                        issue.fix_instruction.clone()
                    } else {
                        format!("{} {}", request.instruction.trim(), issue.fix_instruction)
                    };
                    request.issues.push(issue);
                }
            }
        }
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
            Err(e) => {
                return self.task_failed(ctx, shared, i, failure(format!("refiner failed: {e}"))).await.map(|()| None);
            }
            Ok(edit) => edit,
        };
        ctx.progress.add_model(&edit.model);
        {
            let mut st = shared.lock().await;
            self.charge(ctx, &mut st, EDITING, &edit.usage);
        }
        let Some(after) = edit.section.clone() else {
            let reason = format!("refiner refused its reply: {}", edit.rejected_reason);
            return self.task_failed(ctx, shared, i, failure(reason)).await.map(|()| None);
        };
        let after = Section { id: before.id.clone(), index: before.index, ..after };
        // A task that started completes: its fix is verified whatever the budget says now.
        let verified = stages
            .delta
            .verify(VerifyRequest {
                before: before.clone(),
                after: after.clone(),
                issues,
                model: self.models.delta.clone(),
                min_length_ratio: length.min_length_ratio,
                max_length_ratio: length.max_length_ratio,
                ..VerifyRequest::default()
            })
            .await;
        if let Ok(o) = &verified {
            let mut st = shared.lock().await;
            st.tally(VERIFICATION, &o.usage);
        }
        let (accepted, verification, reason) = verdict_of(ctx, verified)?;
        let mut st = shared.lock().await;
        if accepted {
            st.set_section(&after);
            let n = {
                let e = st.edits.entry(task.section_id.clone()).or_default();
                *e += 1;
                *e
            };
            if n >= EDITS_TO_LOCK && !st.locked.contains(&task.section_id) {
                st.locked.push(task.section_id.clone());
                // Announced after the batch completes (section_locked follows batch_complete).
                st.locks_to_announce.push((task.section_id.clone(), n));
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
        // The edit, kept or not, then its verification.
        let applied = gw::PatchApplied {
            task_id: task.id.clone(),
            section_id: task.section_id.clone(),
            action: convert::arbiter::fix_action_to(task.action) as i32,
            section: Some(convert::document::section_to(&after)),
            diff_summary: edit.diff_summary.clone(),
            usage: Some(convert::usage_to(&edit.usage)),
        };
        let patch = if accepted { Ev::PatchApplied(applied) } else { Ev::PatchRejected(rejected(applied, &reason)) };
        self.emit(ctx, iteration, patch).await?;
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
        Ok(None)
    }

    /// Tokens kept for the final judging: a focused judging of the sections changed since the
    /// last judging plus `section`.
    fn reserve(&self, st: &State, section: &str) -> u64 {
        let judged = st.judged.last().map(|j| j.sections.clone()).unwrap_or_default();
        let mut now = st.sections.clone();
        // Count the task's section as changed.
        if let Some(s) = now.iter_mut().find(|s| s.id == section) {
            s.content.push(' ');
        }
        let (focus, context) = board::focus(&now, &judged);
        self.judging_estimate(st, &focus, context.len())
    }

    /// The N+1 consistency check: one YES/NO call of the delta judge on the section against
    /// the regenerated one before it. Announced by a consistency_checked event.
    async fn check_consistency(
        &self,
        ctx: &RunCtx,
        shared: &Mutex<State>,
        task: &FixTask,
        request: &SectionEditRequest,
        previous_changed: bool,
        iteration: u32,
    ) -> Result<Consistency, StageError> {
        let Some(previous) = request.previous.clone().filter(|_| previous_changed) else {
            return Ok(Consistency::Fits("no check: the section before it was not changed".into()));
        };
        let outcome = self
            .stages()?
            .delta
            .check_consistency(ConsistencyRequest {
                previous: previous.clone(),
                section: request.section.clone(),
                model: self.models.delta.clone(),
            })
            .await;
        let (consistent, reason, confidence, usage) = match outcome {
            Err(e @ StageError::Cancelled(_)) => return Err(e),
            // A check that cannot run edits nothing (no evidence the section is wrong).
            Err(e) => (true, format!("the consistency check failed: {e}"), None, Default::default()),
            Ok(o) => {
                if let Some(m) = &o.model {
                    ctx.progress.add_model(m);
                }
                (o.consistent, o.reason, o.confidence, o.usage)
            }
        };
        {
            let mut st = shared.lock().await;
            st.expect(VERIFICATION, 0);
            self.charge(ctx, &mut st, VERIFICATION, &usage);
        }
        self.emit(
            ctx,
            iteration,
            Ev::ConsistencyChecked(gw::ConsistencyChecked {
                task_id: task.id.clone(),
                section_id: task.section_id.clone(),
                previous_section_id: previous.id.clone(),
                consistent,
                reason: reason.clone(),
                confidence,
                usage: Some(convert::usage_to(&usage)),
            }),
        )
        .await?;
        if consistent {
            let detail = if reason.is_empty() {
                format!("consistent with the regenerated section {:?}: no edit", previous.id)
            } else {
                format!("no edit: {reason}")
            };
            return Ok(Consistency::Fits(detail));
        }
        let why = if reason.trim().is_empty() {
            format!("The section no longer fits the regenerated section {:?} before it.", previous.id)
        } else {
            reason.trim().to_string()
        };
        Ok(Consistency::Broken(JudgeIssue {
            id: format!("{}-consistency", task.id),
            criterion: if task.criterion.is_empty() { "pedagogical_structure".into() } else { task.criterion.clone() },
            severity: Severity::Major,
            section_id: task.section_id.clone(),
            description: why.clone(),
            fix_instruction: format!(
                "Keep this section consistent with the section before it, which was rewritten: {why} Change nothing else."
            ),
            location: String::new(),
            raised_by: vec!["consistency_check".into()],
            context_window: String::new(),
        }))
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

/// What the consistency check found.
enum Consistency {
    /// The section fits (or no check was needed): the detail.
    Fits(String),
    /// It no longer fits: the issue the patch fixes.
    Broken(JudgeIssue),
}

/// A task's estimate split into the edit and its verification (one check per issue: the section
/// before and after in, one token out; about 250 tokens of instructions a call).
fn split_estimate(task: &FixTask, section: &Section) -> (u64, u64) {
    let body = (section.content.chars().count() as u64).div_ceil(4);
    let checks = task.issue_ids.len().max(1) as u64;
    let verify = (checks * (250 + 2 * body + 1)).min(u64::from(task.estimated_tokens));
    (u64::from(task.estimated_tokens) - verify, verify)
}

/// The event of a fix that was not kept: the patch as it would have been applied, and why not.
fn rejected(p: gw::PatchApplied, reason: &str) -> gw::PatchRejected {
    let gw::PatchApplied { task_id, section_id, action, section, diff_summary, usage } = p;
    gw::PatchRejected { task_id, section_id, action, section, diff_summary, usage, reason: reason.to_string() }
}
