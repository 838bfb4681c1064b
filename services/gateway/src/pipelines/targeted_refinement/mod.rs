//! The `targeted_refinement` pipeline (Stage 6): fix only what the judges
//! found, keep what passed.
//!
//! ```text
//! judge (the panel, or the request's verdicts) -> arbiter plan -> decide
//!   accepted at the mode's threshold            -> done
//!   a stop (convergence, a limit, nothing to do) -> full-auto: best effort / semi-auto: escalate
//!   else one iteration: batches of tasks (patchers together, expanders alone), each task
//!        refined -> verified by the delta judge (rejected -> rolled back) -> a section locks after
//!        2 edits; then re-judge (quality locks: a regressed section is restored) -> decide again
//! ```
//!
//! Everything the loop knows is one [`State`], checkpointed after every step (a task applied, a
//! judging, a human action consumed), so a restarted gateway goes on where it was and never
//! redoes an applied task. Human actions (edit a section, accept, mark reviewed, resume after an
//! escalation) arrive through the engine's action inbox; pause is the engine's gate, observed
//! before every task and every judging. With `self_refine` set, the final document's sections go
//! through the self-refine hook before the result (each section's entry checkpointed).
//!
//! Its parts: `request` parses and validates the request; `state` is the checkpointed state;
//! `judge` judges, plans and starts iterations; `execute` runs an iteration's tasks; `human` takes
//! human actions (controls, the gate, escalation); `finish` stops and assembles the result. Here:
//! the pipeline, its progress and the loop. The policy (acceptance, the stop/continue decision,
//! quality, mean scores, regressions, regeneration tasks) is pure, in [`assay_domain::iteration`].

mod execute;
mod finish;
mod human;
mod judge;
mod request;
mod state;

use std::sync::Mutex as StdMutex;
use std::time::{Duration, Instant};

use assay_domain::iteration::{self, Acceptance, Decision, LastJudging, Limits, Mode, Quality, Standing, board};
use assay_domain::judge::PanelJudge;
use assay_domain::self_refine::SelfRefineHook;
use assay_domain::{Brief, Criterion, JudgeVerdict, ModelSpec, Section, StageError};
use assay_proto::convert;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::refinement_event::Event as Ev;
use assay_proto::gateway::v1::run_event::Event;
use tokio::sync::Mutex;

use super::stages::{RefinementStages, Stages};
use assay_runs::{ControlEffect, Pipeline, RunCtx, RunOutcome};
use state::{Halt, Human, Judged, Judging, PHASES, Phase, State, Status};

/// Checkpoint key of the loop's state.
const STATE: &str = "refinement:state";
/// Checkpoint key prefix of the self-refine hook's entries (by section id).
const SELF_REFINED: &str = "refinement:self_refined:";

/// Models of the phases (unset fields: the configured phase).
#[derive(Debug, Clone, Default)]
struct Models {
    patcher: ModelSpec,
    expander: ModelSpec,
    delta: ModelSpec,
    arbiter: ModelSpec,
}

/// A parsed targeted refinement.
pub struct TargetedRefinement {
    sections: Vec<Section>,
    verdicts: Vec<JudgeVerdict>,
    judges: Vec<PanelJudge>,
    brief: Brief,
    criteria: Vec<Criterion>,
    mode: Mode,
    limits: Limits,
    max_parallel_patchers: u32,
    lock_threshold: f64,
    models: Models,
    /// The self-refine hook on the final document.
    hook: Option<SelfRefineHook>,
    stages: Stages,
    /// One task at a time waits at the gate (so a posted action is consumed once).
    gate: Mutex<()>,
    /// Set once a human accepted: every task still waiting at the gate stops too.
    accepted: std::sync::atomic::AtomicBool,
    clock: Clock,
}

/// Active time of the run: time paused or waiting for a human excluded, carried across restarts.
struct Clock {
    start: Instant,
    waited: StdMutex<Duration>,
}

impl Clock {
    fn active_ms(&self, base_ms: u64) -> u64 {
        let waited = self.waited.lock().map(|w| *w).unwrap_or_default();
        base_ms + self.start.elapsed().saturating_sub(waited).as_millis() as u64
    }

    fn add_wait(&self, d: Duration) {
        if let Ok(mut w) = self.waited.lock() {
            *w += d;
        }
    }
}

fn tokens(ctx: &RunCtx) -> u64 {
    let u = ctx.spending.usage();
    u.prompt_tokens + u.completion_tokens
}

/// Tokens by phase, in the contract's order.
fn phase_usage(st: &State) -> Vec<gw::PhaseUsage> {
    PHASES
        .iter()
        .filter_map(|p| {
            let t = st.phases.get(*p)?;
            Some(gw::PhaseUsage {
                phase: (*p).to_string(),
                estimated_tokens: t.estimated,
                usage: Some(convert::usage_to(&t.usage)),
                budgeted: *p != state::ASSESSMENT,
            })
        })
        .collect()
}

fn status_to(s: Status) -> gw::TaskStatus {
    match s {
        Status::Pending => gw::TaskStatus::Pending,
        Status::Running => gw::TaskStatus::Running,
        Status::Applied => gw::TaskStatus::Applied,
        Status::Rejected => gw::TaskStatus::Rejected,
        Status::Failed => gw::TaskStatus::Failed,
        Status::Skipped => gw::TaskStatus::Skipped,
    }
}

fn mode_to(m: Mode) -> gw::RefinementMode {
    match m {
        Mode::FullAuto => gw::RefinementMode::FullAuto,
        Mode::SemiAuto => gw::RefinementMode::SemiAuto,
    }
}

fn quality_to(q: Quality) -> gw::QualityStatus {
    match q {
        Quality::Good => gw::QualityStatus::Good,
        Quality::Acceptable => gw::QualityStatus::Acceptable,
        Quality::BelowStandard => gw::QualityStatus::BelowStandard,
    }
}

/// The wire quality of a judged document.
fn quality_of(score: f64, critical: bool) -> gw::QualityStatus {
    quality_to(iteration::quality(score, critical))
}

/// The outcome and warning of an acceptance.
fn acceptance_to(a: Acceptance) -> (gw::RefinementOutcome, String) {
    match a {
        Acceptance::Accepted => (gw::RefinementOutcome::Accepted, String::new()),
        Acceptance::AcceptedWithWarning(warning) => (gw::RefinementOutcome::AcceptedWithWarning, warning),
    }
}

/// A delta-judge verification as the loop uses it: accepted, the wire record, the rejection
/// reasons. Its usage lands on the run; a failed verification rejects (only cancellation fails).
fn verdict_of(
    ctx: &RunCtx,
    outcome: Result<assay_domain::verify::VerifyOutcome, StageError>,
) -> Result<(bool, Option<assay_proto::delta_judge::v1::VerifyResponse>, String), StageError> {
    match outcome {
        Ok(o) => {
            ctx.spending.add_usage(&o.usage);
            ctx.progress.add_model(&o.model);
            Ok((o.accepted, Some(convert::delta_judge::verify_response_to(&o)), o.rejection_reasons.join("; ")))
        }
        Err(e @ StageError::Cancelled(_)) => Err(e),
        Err(e) => Ok((false, None, format!("verification failed: {e}"))),
    }
}

impl TargetedRefinement {
    fn stages(&self) -> Result<&RefinementStages, StageError> {
        self.stages.refinement()
    }

    /// Tokens counted against the budget: everything after the first assessment.
    /// Tokens counted against the token budget: everything after the first assessment, since
    /// the current allowance (see [`Self::grant_allowances`]). The one base of every token figure
    /// set beside a limit (progress, iteration_complete, the decisions).
    fn budget_used(&self, ctx: &RunCtx, st: &State) -> u64 {
        self.budget_used_in_all(ctx, st).saturating_sub(st.allowance_tokens)
    }

    /// Tokens after the first assessment, every allowance included.
    fn budget_used_in_all(&self, ctx: &RunCtx, st: &State) -> u64 {
        match st.assessment_tokens {
            Some(a) => tokens(ctx).saturating_sub(a),
            None if st.judged.is_empty() => 0,
            // A run checkpointed before the assessment was counted apart: every token counts.
            None => tokens(ctx),
        }
    }

    /// The token budget of the current allowance: the pipeline's, or what the run's budget leaves
    /// of it when that is smaller (a run's budget is a hard cap over the whole run, never renewed;
    /// it then ends the refinement by the pipeline's own budget rules).
    fn max_tokens(&self, ctx: &RunCtx, st: &State) -> u64 {
        ctx.spending
            .token_limit()
            .map_or(self.limits.max_tokens, |t| t.saturating_sub(st.allowance_tokens).min(self.limits.max_tokens))
    }

    /// Active time of the current allowance.
    fn elapsed_ms(&self, st: &State) -> u64 {
        self.clock.active_ms(st.active_ms).saturating_sub(st.allowance_ms)
    }

    /// A human resumed an escalated loop: a fresh allowance of each budget spent (tokens, time;
    /// the iterations are granted again by `since`). Returns the budgets renewed.
    fn grant_allowances(&self, ctx: &RunCtx, st: &mut State) -> Vec<&'static str> {
        let mut renewed = Vec::new();
        if self.budget_used(ctx, st) >= self.max_tokens(ctx, st) {
            st.allowance_tokens = self.budget_used_in_all(ctx, st);
            renewed.push(iteration::Stop::TokenBudget.name());
        }
        if self.elapsed_ms(st) >= self.limits.max_elapsed_ms {
            st.allowance_ms = self.clock.active_ms(st.active_ms);
            renewed.push(iteration::Stop::TimeBudget.name());
        }
        renewed
    }

    /// The limit reached once the token or time budget is spent (its stop reason).
    fn spent(&self, ctx: &RunCtx, st: &State) -> Option<String> {
        if self.budget_used(ctx, st) >= self.max_tokens(ctx, st) {
            Some(iteration::Stop::TokenBudget.name().into())
        } else if self.elapsed_ms(st) >= self.limits.max_elapsed_ms {
            Some(iteration::Stop::TimeBudget.name().into())
        } else {
            None
        }
    }

    /// A stage call's usage: on the run and on the phase.
    fn charge(&self, ctx: &RunCtx, st: &mut State, phase: &str, usage: &assay_domain::Usage) {
        ctx.spending.add_usage(usage);
        st.tally(phase, usage);
    }

    /// Estimated tokens of a panel judging of `judged` with `context` excerpts, scaled by what
    /// the first judging cost against its own estimate.
    fn judging_estimate(&self, st: &State, judged: &[Section], context: usize) -> u64 {
        let raw = board::judging_estimate(self.judges.len(), self.brief.prompt_text().len(), judged, context);
        (raw as f64 * st.judging_scale.unwrap_or(1.0)).ceil() as u64
    }

    async fn emit(&self, ctx: &RunCtx, iteration: u32, event: Ev) -> Result<(), StageError> {
        ctx.log.emit(Event::Refinement(gw::RefinementEvent { iteration, event: Some(event) })).await
    }

    /// Save the state (checkpoint) and publish its progress on the run.
    async fn save(&self, ctx: &RunCtx, st: &State, phase: &str) -> Result<(), StageError> {
        let mut st = st.clone();
        st.active_ms = self.clock.active_ms(st.active_ms);
        ctx.checkpoints.put_json(STATE, &st).await?;
        // A paused run says so, whatever its in-flight work is doing.
        let phase = if ctx.gate.is_paused() && !matches!(phase, "done" | "awaiting_human") { "paused" } else { phase };
        ctx.progress.set(gw::run::Progress::Refinement(self.progress(ctx, &st, phase)));
        Ok(())
    }

    /// Iteration progress, as `GetRun` reports it.
    fn progress(&self, ctx: &RunCtx, st: &State, phase: &str) -> gw::RefinementProgress {
        let last = st.judged.last();
        let count = |f: &dyn Fn(Status) -> bool| st.tasks.iter().filter(|t| f(t.status)).count() as u32;
        gw::RefinementProgress {
            iteration: st.iteration,
            max_iterations: self.limits.max_iterations as u32,
            score_history: st.history(),
            tasks_total: st.tasks.len() as u32,
            tasks_completed: count(&|s| s == Status::Applied),
            tasks_failed: count(&|s| matches!(s, Status::Rejected | Status::Failed)),
            locked_section_ids: st.locked.clone(),
            quality: last.map_or(gw::QualityStatus::Unspecified, |j| quality_of(j.score, j.critical)) as i32,
            converged: !st.stop_reason.is_empty(),
            tokens_used: self.budget_used(ctx, st),
            token_limit: self.max_tokens(ctx, st),
            tasks: st
                .tasks
                .iter()
                .map(|t| gw::RefinementTask {
                    task: Some(convert::arbiter::task_to(&t.task)),
                    batch_index: t.batch,
                    status: status_to(t.status) as i32,
                    locked: st.locked.contains(&t.task.section_id),
                    edit_count: st.edits.get(&t.task.section_id).copied().unwrap_or(0),
                    detail: t.detail.clone(),
                })
                .collect(),
            mode: mode_to(self.mode) as i32,
            phase: phase.to_string(),
            sections: st.sections.iter().map(convert::document::section_to).collect(),
            unresolved_issues: last.map(Judging::open_issues_to).unwrap_or_default(),
            changed_section_ids: self.changed(&st.sections),
            phase_usage: phase_usage(st),
            budget_tokens_used: self.budget_used(ctx, st),
            assessment_tokens: st.assessment_tokens.unwrap_or_default(),
        }
    }

    /// Sections whose content differs from the document as given.
    fn changed(&self, sections: &[Section]) -> Vec<String> {
        sections
            .iter()
            .zip(&self.sections)
            .filter(|(now, given)| now.content != given.content)
            .map(|(s, _)| s.id.clone())
            .collect()
    }

    /// Carry out a decision: `Some` is the run's outcome; `None` goes on with the loop (the next
    /// iteration started, or a semi-auto escalation waiting for a human).
    async fn act(&self, ctx: &RunCtx, st: &mut State, decision: Decision) -> Result<Option<RunOutcome>, StageError> {
        match decision {
            Decision::Accept(acceptance) => {
                let (outcome, warning) = acceptance_to(acceptance);
                let last = st.judged.len() - 1;
                self.finish(ctx, st, outcome, last, warning, None).await.map(Some)
            }
            Decision::Settle(acceptance, reason, judging) => {
                st.stop_reason.clone_from(&reason);
                self.emit(
                    ctx,
                    st.iteration,
                    Ev::ConvergenceDetected(gw::ConvergenceDetected { reason, score_history: st.history() }),
                )
                .await?;
                let (outcome, warning) = acceptance_to(acceptance);
                // The best judged iteration, not the last (fixes no judging scored stay).
                let judging = if st.stale.is_empty() { judging } else { st.judged.len() - 1 };
                st.roll_back(judging);
                self.finish(ctx, st, outcome, judging, warning, None).await.map(Some)
            }
            Decision::Stop(reason) => self.stop(ctx, st, reason).await,
            Decision::Continue => {
                st.phase = Phase::Execute;
                self.start_iteration(ctx, st).await?;
                Ok(None)
            }
        }
    }

    /// The decision after the final judging of a stopped loop: the top threshold, else the best
    /// judging a tier accepts, else the stop.
    fn final_decision(&self, st: &State, reason: String) -> Decision {
        let Some(last) = st.judged.last() else { return Decision::Stop(reason) };
        if iteration::meets_top(self.mode, last.score) {
            return Decision::Accept(Acceptance::Accepted);
        }
        match iteration::settle_on(self.mode, &st.scored()) {
            Some((a, judging)) => Decision::Settle(a, reason, judging),
            None => Decision::Stop(reason),
        }
    }

    /// A focused judging's final decision is confirmed by a full judging when the budget and
    /// the time allow one.
    fn confirms(&self, ctx: &RunCtx, st: &State) -> bool {
        let Some(last) = st.judged.last() else { return false };
        // Nothing changed since the last full judging: it still describes the document.
        let full = st.judged.iter().rev().find(|j| !j.focused);
        let changed = full.is_none_or(|f| f.sections.iter().zip(&st.sections).any(|(a, b)| a.content != b.content));
        last.focused
            && changed
            && self.spent(ctx, st).is_none()
            && self.budget_used(ctx, st) + self.judging_estimate(st, &st.sections, 0) <= self.max_tokens(ctx, st)
    }

    /// The sections changed since the last judging hold fixes no judging scored.
    fn mark_stale(&self, st: &mut State) {
        let judged = st.judged.last().map(|j| j.sections.clone()).unwrap_or_default();
        st.stale = board::focus(&st.sections, &judged).0.into_iter().map(|s| s.id).collect();
    }

    /// The decision after the last judging (see [`iteration::decide`]).
    fn decide(&self, ctx: &RunCtx, st: &State) -> Decision {
        let judged = st.scored();
        iteration::decide(&Standing {
            mode: self.mode,
            last: st.judged.last().map(|j| LastJudging {
                score: j.score,
                critical: j.critical,
                routing: &j.plan.routing,
            }),
            judged: &judged,
            since: st.since,
            edits: &st.edits,
            tokens_used: self.budget_used(ctx, st),
            elapsed_ms: self.elapsed_ms(st),
            limits: self.limits,
            sections: &st.sections,
            locked: &st.locked,
        })
    }
}

#[async_trait::async_trait]
impl Pipeline for TargetedRefinement {
    fn kind(&self) -> gw::PipelineKind {
        gw::PipelineKind::TargetedRefinement
    }

    fn total(&self) -> u32 {
        0
    }

    async fn run(&self, ctx: &RunCtx) -> Result<RunOutcome, StageError> {
        // Cancel drops whatever is in flight (model calls included) at once.
        tokio::select! {
            biased;
            () = ctx.gate.cancelled() => Err(StageError::Cancelled("the run was cancelled".into())),
            outcome = self.refine(ctx) => outcome,
        }
    }

    async fn control(&self, ctx: &RunCtx, request: &gw::ControlRunRequest) -> Result<ControlEffect, StageError> {
        self.take_control(ctx, request).await
    }
}

impl TargetedRefinement {
    /// The loop (see the module documentation), resumed from the state checkpoint.
    async fn refine(&self, ctx: &RunCtx) -> Result<RunOutcome, StageError> {
        let mut st = match ctx.checkpoints.load_json::<State>(STATE).await? {
            Some(st) => st,
            None => State::new(self.sections.clone()),
        };
        if let Some(f) = st.finishing.clone() {
            let outcome = gw::RefinementOutcome::try_from(f.outcome).unwrap_or(gw::RefinementOutcome::BestEffort);
            let best_effort = f.best_effort.then(|| self.best_effort(&st, f.judging));
            return self.finish(ctx, &mut st, outcome, f.judging, f.warning, best_effort).await;
        }
        loop {
            match st.phase {
                Phase::Judge => {
                    let shared = Mutex::new(st);
                    let halt = self.checkpoint_gate(ctx, &shared).await?;
                    st = shared.into_inner();
                    let limit = match halt {
                        Some(Halt::Accept) => {
                            let last = st.judged.len().saturating_sub(1);
                            return self
                                .finish(ctx, &mut st, gw::RefinementOutcome::AcceptedManual, last, String::new(), None)
                                .await;
                        }
                        // No judging starts once a budget is spent (the first one always runs).
                        Some(Halt::Limit(reason)) if !st.judged.is_empty() => Some(reason),
                        Some(Halt::Limit(_)) | None => None,
                    };
                    let judged = match limit {
                        Some(reason) => Judged::Limit(reason),
                        None => {
                            self.save(ctx, &st, "judging").await?;
                            if st.judged.is_empty() || st.confirming {
                                self.judge(ctx, &mut st).await?
                            } else {
                                self.rejudge(ctx, &mut st).await?
                            }
                        }
                    };
                    let judging = match judged {
                        Judged::Done(j) => Some(*j),
                        Judged::Limit(_) | Judged::Failed if st.confirming => {
                            // The confirming judging could not run: the focused judging's
                            // decision stands.
                            st.confirming = false;
                            let decision = self.decide(ctx, &st);
                            if let Some(done) = self.act(ctx, &mut st, decision).await? {
                                return Ok(done);
                            }
                            continue;
                        }
                        Judged::Failed => None,
                        Judged::Limit(reason) => {
                            // The fixes since the last judging stay; its score is flagged as
                            // describing the document before them.
                            self.mark_stale(&mut st);
                            if let Some(done) = self.stop(ctx, &mut st, reason).await? {
                                return Ok(done);
                            }
                            continue;
                        }
                    };
                    let Some(judging) = judging else {
                        if st.judged.is_empty() {
                            return Err(StageError::Unavailable(
                                "every judge failed on the document as given (see the judged event)".into(),
                            ));
                        }
                        self.mark_stale(&mut st);
                        if let Some(done) = self.stop(ctx, &mut st, "judges_failed".into()).await? {
                            return Ok(done);
                        }
                        continue;
                    };
                    if st.judged.is_empty() {
                        st.quality_locks = iteration::quality_locks(&judging.scores, self.lock_threshold);
                        st.assessment_tokens = Some(tokens(ctx));
                    }
                    let mut judging = judging;
                    let confirmed = std::mem::take(&mut st.confirming);
                    if confirmed {
                        // The full judging measures the same content as the focused one: it
                        // takes its place (a human's edit in it stays one).
                        if let Some(replaced) = st.judged.pop() {
                            judging.human_edited |= replaced.human_edited;
                            judging.iteration = replaced.iteration;
                        }
                    }
                    st.judged.push(judging.clone());
                    st.stale.clear();
                    if confirmed && !self.restore_after_confirming(ctx, &mut st, &judging).await?.is_empty() {
                        // Sections broke a lock the focused judging did not see: they are back
                        // to their content at the last full judging, judged again before any
                        // decision.
                        self.save(ctx, &st, "judging").await?;
                        continue;
                    }
                    self.save(ctx, &st, "planning").await?;
                    let stopped = st.pending_stop.take();
                    let decision = match stopped.clone() {
                        // The final judging after a budget stop: accept or stop, never go on.
                        Some(reason) => self.final_decision(&st, reason),
                        None => self.decide(ctx, &st),
                    };
                    if stopped.is_none() && !matches!(decision, Decision::Continue) && self.confirms(ctx, &st) {
                        st.confirming = true;
                        self.save(ctx, &st, "judging").await?;
                        continue;
                    }
                    if let Some(done) = self.act(ctx, &mut st, decision).await? {
                        return Ok(done);
                    }
                }
                Phase::Execute => {
                    let (next, halt) = self.execute(ctx, st).await?;
                    st = next;
                    match halt {
                        Some(Halt::Accept) => {
                            let last = st.judged.len().saturating_sub(1);
                            return self
                                .finish(ctx, &mut st, gw::RefinementOutcome::AcceptedManual, last, String::new(), None)
                                .await;
                        }
                        Some(Halt::Limit(reason)) => {
                            // Every verified fix stays: the changed sections get one final
                            // (focused) judging from the budget's reserve, then the loop stops.
                            if board::focus(
                                &st.sections,
                                &st.judged.last().map(|j| j.sections.clone()).unwrap_or_default(),
                            )
                            .0
                            .is_empty()
                            {
                                if let Some(done) = self.stop(ctx, &mut st, reason).await? {
                                    return Ok(done);
                                }
                            } else {
                                st.pending_stop = Some(reason);
                                st.phase = Phase::Judge;
                                self.save(ctx, &st, "judging").await?;
                            }
                        }
                        None => {
                            st.phase = Phase::Judge;
                            self.save(ctx, &st, "judging").await?;
                        }
                    }
                }
                Phase::Escalated => match self.await_human(ctx, &mut st).await? {
                    Human::Accept => {
                        let best = st.best();
                        return self
                            .finish(ctx, &mut st, gw::RefinementOutcome::AcceptedManual, best, String::new(), None)
                            .await;
                    }
                    Human::Review => {
                        let best = st.best();
                        return self
                            .finish(ctx, &mut st, gw::RefinementOutcome::Reviewed, best, String::new(), None)
                            .await;
                    }
                    Human::Resume => {
                        ctx.progress.set_state(gw::RunState::Running, "resumed by a human").await?;
                        // A fresh allowance of each budget spent, before the edits are verified
                        // (they are verified from it).
                        let renewed = self.grant_allowances(ctx, &mut st);
                        if !renewed.is_empty() {
                            tracing::info!(run_id = %ctx.run_id(), "resumed with a fresh allowance: {}", renewed.join(", "));
                        }
                        if !st.unverified_edits.is_empty() {
                            self.verify_human_edits(ctx, &mut st).await?;
                        }
                        st.before_iteration = st.sections.clone();
                        st.tasks.clear();
                        // A fresh iteration allowance: the next judging (of the document the
                        // human sent back) is where convergence and the limit count from.
                        st.since = st.judged.len();
                        st.stop_reason.clear();
                        st.phase = Phase::Judge;
                        self.save(ctx, &st, "judging").await?;
                    }
                },
            }
        }
    }
}

impl super::Registered for assay_proto::pipelines::TargetedRefinement {
    fn parse(request: Self::Request, stages: super::Stages) -> Result<std::sync::Arc<dyn Pipeline>, StageError> {
        Ok(std::sync::Arc::new(TargetedRefinement::parse(request, stages)?))
    }
}
