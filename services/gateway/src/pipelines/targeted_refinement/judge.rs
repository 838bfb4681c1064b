//! Judging the document, planning from the verdicts, and starting the next iteration from the
//! plan. A re-judging restores the sections whose edits broke a quality lock.

use std::collections::BTreeMap;

use assay_domain::arbiter::{ConsolidateRequest, Consolidation, MeasurementLevel, Plan, PlanRequest};
use assay_domain::iteration::{self, board, board::Board};
use assay_domain::judge::{JudgeResult, JudgeSectionsRequest};
use assay_domain::{JudgeIssue, JudgeVerdict, ModelSpec, Section, Severity, StageError};
use assay_proto::convert;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::refinement_event::Event as Ev;

use super::state::{self, Judged, Judging, State, Status, TaskState};
use super::{TargetedRefinement, mode_to};
use assay_runs::RunCtx;

impl TargetedRefinement {
    /// Judge the whole document as it stands (the request's verdicts the first time, when given)
    /// and plan from the verdicts. The first judging always runs (there is no result without
    /// one); a later full judging does not start once a budget is spent, and a judging whose
    /// panel spent it is not planned (its issues unconsolidated).
    pub(super) async fn judge(&self, ctx: &RunCtx, st: &mut State) -> Result<Judged, StageError> {
        let stages = self.stages()?;
        let phase = st.judging_phase();
        let (verdicts, results) = if st.judged.is_empty() && !self.verdicts.is_empty() {
            (self.verdicts.clone(), Vec::new())
        } else {
            if let Some(reason) = self.spent(ctx, st).filter(|_| !st.judged.is_empty()) {
                return Ok(Judged::Limit(reason));
            }
            let estimate = self.judging_estimate(st, &st.sections, 0);
            st.expect(phase, estimate);
            let request = JudgeSectionsRequest {
                sections: st.sections.clone(),
                brief: self.brief.clone(),
                criteria: self.criteria.clone(),
                judges: self.judges.clone(),
                context: Vec::new(),
            };
            let outcome = stages.judge.judge_sections(request, &assay_domain::no_events).await?;
            self.charge(ctx, st, phase, &outcome.usage);
            if st.judging_scale.is_none() && estimate > 0 {
                let used = outcome.usage.prompt_tokens + outcome.usage.completion_tokens;
                st.judging_scale = Some(used as f64 / estimate as f64).filter(|x| *x > 0.0);
            }
            for r in &outcome.results {
                if let Some(m) = &r.model_record {
                    ctx.progress.add_model(m);
                }
            }
            (outcome.verdicts(), outcome.results)
        };
        let judges: Vec<_> = results.iter().map(convert::judge::judge_result_to).collect();
        if verdicts.is_empty() {
            return self.all_failed(ctx, st, &results, judges).await;
        }
        let board = Board::from_full(&verdicts);
        self.planned(ctx, st, board, judges, Vec::new()).await
    }

    /// Every judge failed: say so (the judged event) and why.
    async fn all_failed(
        &self,
        ctx: &RunCtx,
        st: &State,
        results: &[JudgeResult],
        judges: Vec<assay_proto::scorer::v1::JudgeResult>,
    ) -> Result<Judged, StageError> {
        let why: Vec<String> = results.iter().map(|r| format!("{}: {}", r.judge_id, r.error)).collect();
        self.emit(
            ctx,
            st.iteration,
            Ev::Judged(gw::Judged { score: 0.0, judges, open_issues: 0, critical_issues: 0, ..Default::default() }),
        )
        .await?;
        tracing::warn!(run_id = %ctx.run_id(), "every judge failed: {}", why.join("; "));
        Ok(Judged::Failed)
    }

    /// The judging of the document as `board` stands: planned from the board's verdicts (unless
    /// a budget is spent, or the loop stops after this judging anyway), announced.
    async fn planned(
        &self,
        ctx: &RunCtx,
        st: &mut State,
        board: Board,
        judges: Vec<assay_proto::scorer::v1::JudgeResult>,
        judged_ids: Vec<String>,
    ) -> Result<Judged, StageError> {
        let verdicts = board.verdicts();
        let plan = if self.spent(ctx, st).is_some() || st.pending_stop.is_some() {
            Plan {
                consolidation: Consolidation { issues: unconsolidated(&verdicts), ..Consolidation::default() },
                ..Plan::default()
            }
        } else {
            self.plan(ctx, st, &verdicts).await?
        };
        // An issue the arbiter placed belongs to its section(s) from now on: re-judging the
        // section credits its fix (it is not carried as a section-less issue).
        let mut board = board;
        for l in plan.consolidation.localizations.iter().filter(|l| !l.section_ids.is_empty()) {
            let Some(placed) = plan.consolidation.issues.iter().find(|i| l.issue_ids.contains(&i.id)) else {
                continue;
            };
            board.place(&l.issue_id, &placed.criterion, &placed.raised_by, &l.section_ids);
        }
        let score = iteration::document_score(&verdicts);
        let issues = plan.consolidation.issues.clone();
        let held = plan.consolidation.held_critical.clone();
        let critical_issues = (issues.iter().filter(|i| i.severity == Severity::Critical).count() + held.len()) as u32;
        let focused = !judged_ids.is_empty();
        self.emit(
            ctx,
            st.iteration,
            Ev::Judged(gw::Judged {
                score,
                judges,
                open_issues: (issues.len() + held.len()) as u32,
                critical_issues,
                focused,
                judged_section_ids: judged_ids,
            }),
        )
        .await?;
        Ok(Judged::Done(Box::new(Judging {
            iteration: st.iteration,
            score,
            sections: st.sections.clone(),
            critical: critical_issues > 0,
            issues,
            held,
            scores: iteration::mean_scores(&verdicts),
            plan,
            human_edited: st
                .judged
                .last()
                .is_some_and(|j| j.sections.iter().zip(&st.sections).any(|(a, b)| a.content != b.content))
                && !st.human_edited.is_empty(),
            board,
            focused,
        })))
    }

    /// The arbiter's plan from the verdicts (its usage and model land on the run).
    async fn plan(&self, ctx: &RunCtx, st: &mut State, verdicts: &[JudgeVerdict]) -> Result<Plan, StageError> {
        let plan = self
            .stages()?
            .arbiter
            .plan(PlanRequest {
                consolidate: ConsolidateRequest {
                    verdicts: verdicts.to_vec(),
                    sections: st.sections.clone(),
                    level: MeasurementLevel::Interval,
                    criteria: self.criteria.clone(),
                    brief: self.brief.clone(),
                    model: self.models.arbiter.clone(),
                    embedding_model: ModelSpec::default(),
                    match_threshold: assay_domain::arbiter::DEFAULT_MATCH_THRESHOLD,
                    skip_synthesis: false,
                },
                locked_section_ids: st.locked.clone(),
                max_parallel_patchers: self.max_parallel_patchers,
            })
            .await?;
        let phase = st.arbiter_phase();
        self.charge(ctx, st, phase, &plan.consolidation.usage);
        if let Some(m) = &plan.consolidation.model_record {
            ctx.progress.add_model(m);
        }
        Ok(plan)
    }

    /// Judge after an iteration, incrementally: the panel judges only the sections changed since
    /// the last judging (their neighbours as read-only context) and the rest is carried (see
    /// [`assay_domain::iteration::board`]). Sections whose edits broke a quality lock are
    /// restored (with their earlier verdicts). Emits iteration_complete.
    pub(super) async fn rejudge(&self, ctx: &RunCtx, st: &mut State) -> Result<Judged, StageError> {
        let Some(last) = st.judged.last().cloned() else { return self.judge(ctx, st).await };
        let (mut judged, mut context) = board::focus(&st.sections, &last.sections);
        // A panel whose judges have no standing view yet (the first judging was the request's
        // verdicts) judges the whole document.
        let known = |id: &str| last.board.judges.iter().any(|b| b.verdict.judge_id == id);
        if !judged.is_empty() && !self.judges.iter().any(|j| known(&j.id)) {
            judged = st.sections.clone();
            context.clear();
        }
        let mut restored = Vec::new();
        let mut judging = if judged.is_empty() {
            // Nothing changed: the last judging stands (no call), its plan too.
            self.emit(
                ctx,
                st.iteration,
                Ev::Judged(gw::Judged {
                    score: last.score,
                    open_issues: (last.issues.len() + last.held.len()) as u32,
                    critical_issues: last.critical_count(),
                    focused: true,
                    ..Default::default()
                }),
            )
            .await?;
            Judging { iteration: st.iteration, human_edited: false, focused: true, ..last.clone() }
        } else {
            if let Some(reason) = self.spent(ctx, st) {
                return Ok(Judged::Limit(reason));
            }
            let estimate = self.judging_estimate(st, &judged, context.len());
            st.expect(state::JUDGING, estimate);
            let ids: Vec<String> = judged.iter().map(|s| s.id.clone()).collect();
            let request = JudgeSectionsRequest {
                sections: judged,
                brief: self.brief.clone(),
                criteria: self.criteria.clone(),
                judges: self.judges.clone(),
                context,
            };
            let outcome = self.stages()?.judge.judge_sections(request, &assay_domain::no_events).await?;
            self.charge(ctx, st, state::JUDGING, &outcome.usage);
            for r in &outcome.results {
                if let Some(m) = &r.model_record {
                    ctx.progress.add_model(m);
                }
            }
            let verdicts = outcome.verdicts();
            let judges: Vec<_> = outcome.results.iter().map(convert::judge::judge_result_to).collect();
            if verdicts.is_empty() {
                return self.all_failed(ctx, st, &outcome.results, judges).await;
            }
            // Every section changed: a full judging (its board starts afresh).
            let whole = ids.len() == st.sections.len();
            let mut board = if whole { Board::from_full(&verdicts) } else { last.board.clone() };
            let focused = if whole { Vec::new() } else { iteration::focused_scores(&verdicts, &ids) };
            if !whole {
                board.update_focused(&verdicts, &ids);
            }
            restored = self.restore_regressions(ctx, st, &last, &mut board, &focused).await?;
            let ids: Vec<String> =
                if whole { Vec::new() } else { ids.into_iter().filter(|id| !restored.contains(id)).collect() };
            match self.planned(ctx, st, board, judges, ids).await? {
                Judged::Done(j) => Judging { sections: st.sections.clone(), ..*j },
                other @ (Judged::Failed | Judged::Limit(_)) => return Ok(other),
            }
        };
        judging.iteration = st.iteration;
        let mut history = st.history();
        history.push(judging.score);
        let done = st.tasks.iter().filter(|t| t.status == Status::Applied).count() as u32;
        let failed = st.tasks.iter().filter(|t| matches!(t.status, Status::Rejected | Status::Failed)).count() as u32;
        self.emit(
            ctx,
            st.iteration,
            Ev::IterationComplete(gw::IterationComplete {
                score: judging.score,
                score_history: history,
                tokens_used: self.budget_used(ctx, st),
                tasks_completed: done,
                tasks_failed: failed,
                restored_section_ids: restored,
            }),
        )
        .await?;
        Ok(Judged::Done(Box::new(judging)))
    }

    /// Restore the sections whose edits broke a quality lock (content and verdicts as the last
    /// judging had them), each announced by a rolled-back verification result.
    /// `focused` holds the focused judging's scores of the sections it judged that its verdicts
    /// gave no section score (see [`iteration::focused_scores`]): a drop only they show breaks a
    /// lock too.
    async fn restore_regressions(
        &self,
        ctx: &RunCtx,
        st: &mut State,
        last: &Judging,
        board: &mut Board,
        focused: &[iteration::MeanScore],
    ) -> Result<Vec<String>, StageError> {
        let verdicts = board.verdicts();
        let scores = iteration::mean_scores(&verdicts);
        let before = last.board.verdicts();
        let gained = iteration::issues_gained(&verdicts, &before);
        let mut regressions = iteration::regressions(&st.sections, &last.sections, &st.quality_locks, &scores, &gained);
        let open_before: Vec<JudgeIssue> = before.iter().flat_map(|v| v.issues.iter().cloned()).collect();
        for (id, broken) in iteration::focused_regressions(focused, &st.quality_locks, &open_before, &gained) {
            match regressions.iter_mut().find(|(s, _)| *s == id) {
                Some((_, known)) => {
                    let new: Vec<_> =
                        broken.into_iter().filter(|b| !known.iter().any(|k| k.criterion == b.criterion)).collect();
                    known.extend(new);
                }
                None => regressions.push((id, broken)),
            }
        }
        let restored = self.restore_sections(ctx, st, &last.sections, regressions).await?;
        if !restored.is_empty() {
            board.restore(&last.board, &restored);
            self.save(ctx, st, "judging").await?;
        }
        Ok(restored)
    }

    /// A confirming full judging (see `confirms`) checks the quality locks too: the sections
    /// edited since the last full judging whose lock it finds broken are restored to that
    /// judging's content, and the loop judges them again before it decides. Returns the
    /// sections restored.
    pub(super) async fn restore_after_confirming(
        &self,
        ctx: &RunCtx,
        st: &mut State,
        confirming: &Judging,
    ) -> Result<Vec<String>, StageError> {
        let Some(full) = st.judged.iter().rev().find(|j| !j.focused && j.iteration < confirming.iteration).cloned()
        else {
            return Ok(Vec::new());
        };
        let verdicts = confirming.board.verdicts();
        let gained = iteration::issues_gained(&verdicts, &full.board.verdicts());
        let regressions = iteration::regressions(
            &st.sections,
            &full.sections,
            &st.quality_locks,
            &iteration::mean_scores(&verdicts),
            &gained,
        );
        let restored = self.restore_sections(ctx, st, &full.sections, regressions).await?;
        if !restored.is_empty() {
            self.save(ctx, st, "judging").await?;
        }
        Ok(restored)
    }

    /// Put `regressions`' sections back as `before` had them, each announced by a rolled-back
    /// verification result naming the broken locks.
    async fn restore_sections(
        &self,
        ctx: &RunCtx,
        st: &mut State,
        before: &[Section],
        regressions: Vec<(String, Vec<iteration::LockViolation>)>,
    ) -> Result<Vec<String>, StageError> {
        let mut restored = Vec::new();
        for (id, broken) in regressions {
            let Some(before) = before.iter().find(|s| s.id == id).cloned() else { continue };
            st.set_section(&before);
            let reasons: Vec<String> = broken
                .iter()
                .map(|v| {
                    format!(
                        "quality lock: {} dropped from {:.2} to {:.2} (at most {:.2} allowed)",
                        v.criterion, v.baseline, v.current, v.max_drop
                    )
                })
                .collect();
            let verification = gw_verification_of_locks(&broken, &reasons);
            self.emit(
                ctx,
                st.iteration,
                Ev::VerificationResult(gw::VerificationResult {
                    task_id: String::new(),
                    section_id: id.clone(),
                    accepted: false,
                    rolled_back: true,
                    verification: Some(verification),
                    reason: reasons.join("; "),
                    human_edit: false,
                    edit_count: st.edits.get(&id).copied().unwrap_or(0),
                }),
            )
            .await?;
            restored.push(id);
        }
        Ok(restored)
    }

    /// Start the next iteration from the last judging's plan.
    pub(super) async fn start_iteration(&self, ctx: &RunCtx, st: &mut State) -> Result<(), StageError> {
        let Some(last) = st.judged.last().cloned() else { return Ok(()) };
        st.iteration += 1;
        st.before_iteration = st.sections.clone();
        st.human_edited.clear();
        st.batches_started.clear();
        let routing = &last.plan.routing;
        st.full_regenerate = routing.full_regenerate;
        st.full_regenerate_reason.clone_from(&routing.full_regenerate_reason);
        st.tasks = if routing.full_regenerate {
            self.regeneration_tasks(st, &last)
        } else {
            last.plan
                .batches
                .iter()
                .flat_map(|b| {
                    b.tasks.iter().map(|t| TaskState {
                        task: t.clone(),
                        batch: b.index,
                        status: Status::Pending,
                        detail: String::new(),
                    })
                })
                .collect()
        };
        let mut plan = convert::arbiter::plan_to(&last.plan);
        if routing.full_regenerate {
            // The tasks run are the regenerations, one batch each.
            let mut batches: BTreeMap<u32, Vec<&TaskState>> = BTreeMap::new();
            for t in &st.tasks {
                batches.entry(t.batch).or_default().push(t);
            }
            plan.batches = batches
                .into_iter()
                .map(|(index, ts)| assay_proto::arbiter::v1::Batch {
                    index,
                    estimated_tokens: ts.iter().map(|t| t.task.estimated_tokens).sum(),
                    tasks: ts.iter().map(|t| convert::arbiter::task_to(&t.task)).collect(),
                })
                .collect();
            if let Some(r) = plan.routing.as_mut() {
                r.tasks = st.tasks.iter().map(|t| convert::arbiter::task_to(&t.task)).collect();
            }
            plan.estimated_tokens = st.tasks.iter().map(|t| u64::from(t.task.estimated_tokens)).sum();
        }
        self.save(ctx, st, "executing").await?;
        let start = gw::RefinementStart {
            mode: mode_to(self.mode) as i32,
            plan: Some(plan),
            full_regenerate: st.full_regenerate,
            full_regenerate_reason: st.full_regenerate_reason.clone(),
            locked_section_ids: st.locked.clone(),
            score: last.score,
        };
        // One refinement_start per run; each later iteration opens with iteration_started.
        let event = if st.iteration == 1 { Ev::RefinementStart(start) } else { Ev::IterationStarted(start) };
        self.emit(ctx, st.iteration, event).await
    }

    /// FULL_REGENERATE: one regeneration per unlocked section, in document order, one at a time
    /// (see [`iteration::regeneration_tasks`]).
    fn regeneration_tasks(&self, st: &State, last: &Judging) -> Vec<TaskState> {
        iteration::regeneration_tasks(&st.sections, &st.locked, &last.issues, &last.plan)
            .into_iter()
            .enumerate()
            .map(|(n, task)| TaskState { task, batch: n as u32, status: Status::Pending, detail: String::new() })
            .collect()
    }
}

/// The verdicts' issues as the judges raised them (no arbiter: the budget was spent), the same
/// issue raised by several judges once.
fn unconsolidated(verdicts: &[JudgeVerdict]) -> Vec<JudgeIssue> {
    let mut out: Vec<JudgeIssue> = Vec::new();
    for v in verdicts {
        for i in &v.issues {
            let same = |o: &JudgeIssue| {
                o.section_id == i.section_id
                    && o.criterion == i.criterion
                    && o.location == i.location
                    && o.description == i.description
            };
            match out.iter_mut().find(|o| same(o)) {
                Some(o) => o.raised_by.push(v.judge_id.clone()),
                None => out.push(JudgeIssue { raised_by: vec![v.judge_id.clone()], ..i.clone() }),
            }
        }
    }
    out
}

/// A verification record for a quality-lock rollback.
fn gw_verification_of_locks(
    broken: &[iteration::LockViolation],
    reasons: &[String],
) -> assay_proto::delta_judge::v1::VerifyResponse {
    assay_proto::delta_judge::v1::VerifyResponse {
        lock_violations: broken.iter().map(convert::delta_judge::lock_violation_to).collect(),
        accepted: false,
        rejection_reasons: reasons.to_vec(),
        ..Default::default()
    }
}
