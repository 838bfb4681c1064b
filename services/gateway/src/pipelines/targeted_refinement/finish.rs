//! How the loop ends: stop (best effort in full-auto, escalation in semi-auto), the self-refine
//! hook over the final sections, and the run's result.

use std::collections::BTreeMap;

use assay_domain::iteration::{self, Mode};
use assay_domain::self_refine::SelfRefineHook;
use assay_domain::self_refine::polish_instruction;
use assay_domain::{JudgeIssue, StageError, Usage};
use assay_proto::convert;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::refinement_event::Event as Ev;
use assay_proto::gateway::v1::run_event::Event;
use futures::{StreamExt, TryStreamExt};

use super::state::{Finishing, Judging, Phase, SELF_REFINE, State};
use super::{SELF_REFINED, TargetedRefinement, quality_of, tokens};
use crate::pipelines::self_refine_hook::{self, Output};
use assay_runs::{RunCtx, RunOutcome};

impl TargetedRefinement {
    /// The judging a stopped loop reports, and the content it returns. Every fix the delta
    /// judge accepted stays: fixes no judging scored (a budget stopped the loop before the final
    /// judging) are returned with the last judging flagged as predating them. Only a judging
    /// that scored the current content lower than an earlier one sends the document back to that
    /// earlier judged content.
    fn take_best(&self, st: &mut State) -> usize {
        let last = st.judged.len().saturating_sub(1);
        if !st.stale.is_empty() {
            return last;
        }
        let best = st.best();
        st.roll_back(best);
        best
    }

    pub(super) fn best_effort(&self, st: &State, best: usize) -> gw::BestEffort {
        let j = &st.judged[best];
        let open = j.open_issues();
        let mut categories: Vec<String> = open.iter().map(|i| i.criterion.clone()).collect();
        categories.sort();
        categories.dedup();
        gw::BestEffort {
            best_score: j.score,
            best_iteration: j.iteration,
            quality: quality_of(j.score, j.critical) as i32,
            unresolved_issues_count: open.len() as u32,
            unresolved_categories: categories,
            improvement_hints: hints(&open),
        }
    }

    /// Stop iterating: best effort (full-auto) or escalation (semi-auto). `Some` is the outcome.
    pub(super) async fn stop(
        &self,
        ctx: &RunCtx,
        st: &mut State,
        reason: String,
    ) -> Result<Option<RunOutcome>, StageError> {
        st.stop_reason.clone_from(&reason);
        self.emit(
            ctx,
            st.iteration,
            Ev::ConvergenceDetected(gw::ConvergenceDetected { reason: reason.clone(), score_history: st.history() }),
        )
        .await?;
        let best = self.take_best(st);
        match self.mode {
            Mode::FullAuto => {
                let be = self.best_effort(st, best);
                self.emit(
                    ctx,
                    st.iteration,
                    Ev::BestEffortSelected(gw::BestEffortSelected { best_effort: Some(be.clone()) }),
                )
                .await?;
                let outcome =
                    self.finish(ctx, st, gw::RefinementOutcome::BestEffort, best, String::new(), Some(be)).await?;
                Ok(Some(outcome))
            }
            Mode::SemiAuto => {
                let j = &st.judged[best];
                self.emit(
                    ctx,
                    st.iteration,
                    Ev::EscalationTriggered(gw::EscalationTriggered {
                        reason: format!("{reason}: score {:.2} is below the semi-auto thresholds", j.score),
                        best_score: j.score,
                        best_iteration: j.iteration,
                        unresolved_issues: j.open_issues_to(),
                    }),
                )
                .await?;
                st.phase = Phase::Escalated;
                self.save(ctx, st, "awaiting_human").await?;
                Ok(None)
            }
        }
    }

    /// The run's result; `judging` is the index of the judging whose score and issues it reports.
    pub(super) async fn finish(
        &self,
        ctx: &RunCtx,
        st: &mut State,
        outcome: gw::RefinementOutcome,
        judging: usize,
        warning: String,
        best_effort: Option<gw::BestEffort>,
    ) -> Result<RunOutcome, StageError> {
        st.finishing = Some(Finishing {
            outcome: outcome as i32,
            judging,
            warning: warning.clone(),
            best_effort: best_effort.is_some(),
        });
        let self_refined = match &self.hook {
            Some(hook) => self.self_refine_sections(ctx, st, hook).await?,
            None => Vec::new(),
        };
        let (readability, readability_unavailable) = self.readability(st).await;
        let j = st.judged.get(judging);
        let final_score = j.map_or(0.0, |j| j.score);
        let quality = j.map_or(gw::QualityStatus::Unspecified, |j| quality_of(j.score, j.critical));
        let issues = j.map(Judging::open_issues).unwrap_or_default();
        let unresolved_issues = j.map(Judging::open_issues_to).unwrap_or_default();
        // Accepted with a critical issue open (the top threshold accepts it): the result
        // says so, naming each one.
        let (outcome, warning) = match iteration::open_critical_warning(&issues) {
            Some(open)
                if matches!(outcome, gw::RefinementOutcome::Accepted | gw::RefinementOutcome::AcceptedWithWarning) =>
            {
                let warning = if warning.is_empty() { open } else { format!("{warning}; {open}") };
                (gw::RefinementOutcome::AcceptedWithWarning, warning)
            }
            _ => (outcome, warning),
        };
        self.save(ctx, st, "done").await?;
        self.emit(
            ctx,
            st.iteration,
            Ev::RefinementComplete(gw::RefinementComplete {
                outcome: outcome as i32,
                final_score,
                iterations: st.iteration,
            }),
        )
        .await?;
        let result = gw::TargetedRefinementResult {
            sections: st.sections.iter().map(convert::document::section_to).collect(),
            final_score,
            iterations: st.iteration,
            outcome: outcome as i32,
            quality: quality as i32,
            improvement_hints: if matches!(outcome, gw::RefinementOutcome::Accepted) {
                Vec::new()
            } else {
                hints(&issues)
            },
            audit_log: ctx.inbox.audit_log().await?,
            usage: Some(ctx.spending.usage()),
            score_history: st.history(),
            best_iteration: j.map_or(0, |j| j.iteration),
            unresolved_issues,
            changed_section_ids: self.changed(&st.sections),
            locked_section_ids: st.locked.clone(),
            full_regenerate: st.judged.iter().any(|j| j.plan.routing.full_regenerate) && st.iteration > 0,
            stop_reason: st.stop_reason.clone(),
            warning,
            best_effort,
            tasks_completed: st.tasks_completed,
            tasks_failed: st.tasks_failed,
            models: ctx.progress.models().iter().map(convert::model_record_to).collect(),
            score_predates_self_refine: self_refined.iter().any(|e| e.after != e.before),
            self_refined,
            phase_usage: super::phase_usage(st),
            score_predates_fixes: !st.stale.is_empty(),
            stale_section_ids: st.stale.clone(),
            full_judgings: st
                .judged
                .iter()
                .filter(|j| !j.focused && (j.iteration != 0 || self.verdicts.is_empty()))
                .count() as u32,
            focused_judgings: st.judged.iter().filter(|j| j.focused).count() as u32,
            discarded_fixes: st
                .discarded
                .iter()
                .map(|d| gw::DiscardedFix {
                    section_id: d.section_id.clone(),
                    iteration: d.iteration,
                    content: d.content.clone(),
                    reason: d.reason.clone(),
                })
                .collect(),
            readability,
            readability_unavailable,
            unplaced_issue_ids: issues.iter().filter(|i| i.section_id.is_empty()).map(|i| i.id.clone()).collect(),
        };
        Ok(RunOutcome {
            state: gw::RunState::Succeeded,
            result: Some(gw::run_result::Result::TargetedRefinement(result)),
        })
    }

    /// Readability of the final document: every non-blank section's readability, untouched
    /// sections included (the delta judge measures; no model call). A figure is only a figure:
    /// when the delta judge cannot measure, the run keeps its verdict and the figures are
    /// reported missing, with why (the second value; empty when every section was measured).
    async fn readability(&self, st: &State) -> (Vec<gw::SectionReadability>, String) {
        let delta = match self.stages() {
            Ok(stages) => stages.delta.clone(),
            Err(e) => return (Vec::new(), format!("readability not measured: {e}")),
        };
        let mut out = Vec::new();
        for s in st.sections.iter().filter(|s| !s.content.trim().is_empty()) {
            match delta.readability(s.content.clone()).await {
                Ok(r) => out.push(gw::SectionReadability {
                    section_id: s.id.clone(),
                    flagged: !r.long_sentences.is_empty() || r.dense_text,
                    readability: Some(convert::delta_judge::readability_to(&r)),
                }),
                Err(e) => {
                    tracing::warn!(section = %s.id, "readability not measured: {e}");
                    return (Vec::new(), format!("readability not measured (section {}): {e}", s.id));
                }
            }
        }
        (out, String::new())
    }

    /// The self-refine hook over the final document, sections in document order (a few at once);
    /// an entry already checkpointed for the same text is not redone.
    async fn self_refine_sections(
        &self,
        ctx: &RunCtx,
        st: &mut State,
        hook: &SelfRefineHook,
    ) -> Result<Vec<gw::SelfRefined>, StageError> {
        self.save(ctx, st, "self_refining").await?;
        let done: BTreeMap<String, gw::SelfRefined> = ctx
            .checkpoints
            .all::<gw::SelfRefined>(SELF_REFINED)
            .await?
            .into_iter()
            .map(|(_, e)| (e.target.clone(), e))
            .collect();
        let brief = self.brief.prompt_text();
        let outputs: Vec<Output> = st
            .sections
            .iter()
            .map(|s| {
                let original = self.sections.iter().find(|o| o.id == s.id);
                let producer = if st.human_sections.contains(&s.id) {
                    "human"
                } else if original.is_some_and(|o| o.content == s.content) {
                    "original"
                } else {
                    "model"
                };
                let instruction = polish_instruction(&s.id, &s.title, &brief);
                Output { target: s.id.clone(), producer, text: s.content.clone(), instruction }
            })
            .collect();
        let limit = self.spent(ctx, st);
        let before = tokens(ctx);
        let entries: Vec<gw::SelfRefined> = futures::stream::iter(outputs)
            .map(|o| {
                let done = done.get(&o.target).filter(|e| e.before == o.text).cloned();
                let limit = limit.clone();
                async move {
                    if let Some(e) = done {
                        return Ok(e);
                    }
                    let e = match limit {
                        // No loop starts once a budget is spent: the text is kept.
                        Some(limit) => {
                            let e = gw::SelfRefined {
                                target: o.target,
                                producer: o.producer.to_string(),
                                before: o.text.clone(),
                                after: o.text,
                                skipped: limit,
                                ..Default::default()
                            };
                            ctx.log.emit(Event::SelfRefined(e.clone())).await?;
                            e
                        }
                        None => self_refine_hook::refine(&self.stages, ctx, hook, o).await?,
                    };
                    // A failed loop is tried again by a restarted gateway.
                    if e.error.is_empty() {
                        ctx.checkpoints.put(&format!("{SELF_REFINED}{}", e.target), &e).await?;
                    }
                    Ok::<_, StageError>(e)
                }
            })
            .buffered(self.stages.concurrency)
            .try_collect()
            .await?;
        let used = tokens(ctx).saturating_sub(before);
        st.tally(SELF_REFINE, &Usage { prompt_tokens: used, ..Usage::default() });
        for e in &entries {
            if let Some(s) = st.sections.iter_mut().find(|s| s.id == e.target) {
                s.content.clone_from(&e.after);
            }
        }
        Ok(entries)
    }
}

/// Improvement hints: the unresolved issues' fix instructions (their descriptions when they have
/// none), once each.
fn hints(issues: &[JudgeIssue]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for i in issues {
        let h = if i.fix_instruction.trim().is_empty() { i.description.trim() } else { i.fix_instruction.trim() };
        if !h.is_empty() && !out.iter().any(|o| o == h) {
            out.push(h.to_string());
        }
    }
    out
}
