//! Judging the document, planning from the verdicts, and starting the next iteration from the
//! plan. A re-judging restores the sections whose edits broke a quality lock.

use std::collections::BTreeMap;

use assay_domain::arbiter::{ConsolidateRequest, Consolidation, MeasurementLevel, Plan, PlanRequest};
use assay_domain::iteration;
use assay_domain::judge::JudgeSectionsRequest;
use assay_domain::{JudgeIssue, JudgeVerdict, ModelSpec, Severity, StageError};
use assay_proto::convert;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::refinement_event::Event as Ev;

use super::state::{Judging, State, Status, TaskState};
use super::{TargetedRefinement, mode_to, tokens};
use crate::engine::RunCtx;

/// A judging's end.
pub(super) enum Judged {
    Done(Box<Judging>),
    /// Every judge failed.
    Failed,
    /// A budget was spent before the judging could finish (the reason): nothing was judged.
    Limit(String),
}

impl TargetedRefinement {
    /// Judge the document as it stands (the request's verdicts the first time, when given) and
    /// plan from the verdicts. Once a budget is spent no stage call starts: a re-judging does not
    /// start, and a judging whose panel spent it is not planned (its issues unconsolidated).
    pub(super) async fn judge(&self, ctx: &RunCtx, st: &State) -> Result<Judged, StageError> {
        let stages = self.stages()?;
        let (verdicts, results) = if st.judged.is_empty() && !self.verdicts.is_empty() {
            (self.verdicts.clone(), Vec::new())
        } else {
            // The first judging always runs: there is no result without one.
            if let Some(reason) = self.spent(ctx, st.active_ms).filter(|_| !st.judged.is_empty()) {
                return Ok(Judged::Limit(reason));
            }
            let request = JudgeSectionsRequest {
                sections: st.sections.clone(),
                brief: self.brief.clone(),
                criteria: self.criteria.clone(),
                judges: self.judges.clone(),
                context: Vec::new(),
            };
            let outcome = stages.judge.judge_sections(request, &assay_domain::no_events).await?;
            ctx.add_usage(&outcome.usage);
            for r in &outcome.results {
                if let Some(m) = &r.model_record {
                    ctx.add_model(m);
                }
            }
            (outcome.verdicts(), outcome.results)
        };
        let judges: Vec<_> = results.iter().map(convert::judge::judge_result_to).collect();
        if verdicts.is_empty() {
            let why: Vec<String> = results.iter().map(|r| format!("{}: {}", r.judge_id, r.error)).collect();
            self.emit(
                ctx,
                st.iteration,
                Ev::Judged(gw::Judged { score: 0.0, judges, open_issues: 0, critical_issues: 0 }),
            )
            .await?;
            tracing::warn!(run_id = %ctx.run_id(), "every judge failed: {}", why.join("; "));
            return Ok(Judged::Failed);
        }
        let plan = if self.spent(ctx, st.active_ms).is_some() {
            Plan {
                consolidation: Consolidation { issues: unconsolidated(&verdicts), ..Consolidation::default() },
                ..Plan::default()
            }
        } else {
            self.plan(ctx, st, &verdicts).await?
        };
        let score = iteration::document_score(&verdicts);
        let issues = plan.consolidation.issues.clone();
        let critical_issues = issues.iter().filter(|i| i.severity == Severity::Critical).count() as u32;
        self.emit(
            ctx,
            st.iteration,
            Ev::Judged(gw::Judged { score, judges, open_issues: issues.len() as u32, critical_issues }),
        )
        .await?;
        Ok(Judged::Done(Box::new(Judging {
            iteration: st.iteration,
            score,
            sections: st.sections.clone(),
            critical: critical_issues > 0,
            issues,
            scores: iteration::mean_scores(&verdicts),
            plan,
            human_edited: st
                .judged
                .last()
                .is_some_and(|j| j.sections.iter().zip(&st.sections).any(|(a, b)| a.content != b.content))
                && !st.human_edited.is_empty(),
        })))
    }

    /// The arbiter's plan from the verdicts (its usage and model land on the run).
    async fn plan(&self, ctx: &RunCtx, st: &State, verdicts: &[JudgeVerdict]) -> Result<Plan, StageError> {
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
        ctx.add_usage(&plan.consolidation.usage);
        if let Some(m) = &plan.consolidation.model_record {
            ctx.add_model(m);
        }
        Ok(plan)
    }

    /// Judge after an iteration: restore sections whose edits broke a quality lock (then judge
    /// once more), emit iteration_complete.
    pub(super) async fn rejudge(&self, ctx: &RunCtx, st: &mut State) -> Result<Judged, StageError> {
        let mut judging = match self.judge(ctx, st).await? {
            Judged::Done(j) => *j,
            other @ (Judged::Failed | Judged::Limit(_)) => return Ok(other),
        };
        let regressions =
            iteration::regressions(&st.sections, &st.before_iteration, &st.quality_locks, &judging.scores);
        let mut restored = Vec::new();
        if !regressions.is_empty() {
            for (id, broken) in regressions {
                let Some(before) = st.before_iteration.iter().find(|s| s.id == id).cloned() else { continue };
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
            self.save(ctx, st, "judging").await?;
            // The restored document is judged again so the iteration's score is its own.
            match self.judge(ctx, st).await? {
                Judged::Done(j) => judging = *j,
                other @ (Judged::Failed | Judged::Limit(_)) => return Ok(other),
            }
        }
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
                tokens_used: tokens(ctx),
                tasks_completed: done,
                tasks_failed: failed,
                restored_section_ids: restored,
            }),
        )
        .await?;
        Ok(Judged::Done(Box::new(judging)))
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
        self.emit(
            ctx,
            st.iteration,
            Ev::RefinementStart(gw::RefinementStart {
                mode: mode_to(self.mode) as i32,
                plan: Some(plan),
                full_regenerate: st.full_regenerate,
                full_regenerate_reason: st.full_regenerate_reason.clone(),
                locked_section_ids: st.locked.clone(),
                score: last.score,
            }),
        )
        .await
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
