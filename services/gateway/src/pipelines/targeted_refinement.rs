//! The `targeted_refinement` pipeline (Stage 6, REFERENCE section 7): fix only what the judges
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

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex as StdMutex;
use std::time::{Duration, Instant};

use assay_domain::arbiter::{
    ConsolidateRequest, Consolidation, FixAction, FixTask, MeasurementLevel, Plan, PlanRequest,
};
use assay_domain::content::SectionEditRequest;
use assay_domain::document::{MAX_JUDGES, check_criteria, default_criteria, mean_score};
use assay_domain::iteration::{self, EDITS_TO_LOCK, Limits, QualityLock};
use assay_domain::judge::{JudgeSectionsRequest, PanelJudge, check_judges, panel_or_default};
use assay_domain::limits::MAX_TEXT_BYTES;
use assay_domain::self_refine::SelfRefineHook;
use assay_domain::verify::{DEFAULT_LOCK_MAX_DROP, VerifyRequest};
use assay_domain::{Brief, Criterion, JudgeIssue, JudgeVerdict, ModelSpec, Section, Severity, StageError, Violations};
use assay_proto::convert;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::control_run_request::Action;
use assay_proto::gateway::v1::refinement_event::Event as Ev;
use assay_proto::gateway::v1::run_event::Event;
use futures::{StreamExt, TryStreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::Mutex;

use super::self_refine_hook::{self, Output};
use super::stages::{RefinementStages, Stages};
use crate::engine::{ControlEffect, Pipeline, RunCtx, RunOutcome};

/// Checkpoint key of the loop's state.
const STATE: &str = "refinement:state";
/// Checkpoint key prefix of the self-refine hook's entries (by section id).
const SELF_REFINED: &str = "refinement:self_refined:";

/// Full-auto accepts at this score, or at [`WARN_SCORE`] with no critical issue (with a warning).
const FULL_AUTO_ACCEPT: f64 = 0.85;
const WARN_SCORE: f64 = 0.75;
/// Semi-auto accepts at this score, or at [`SEMI_AUTO_NO_CRITICAL`] with no critical issue.
const SEMI_AUTO_ACCEPT: f64 = 0.90;
const SEMI_AUTO_NO_CRITICAL: f64 = 0.85;
/// Default score at which a section's criterion is locked against regressions.
const DEFAULT_LOCK_THRESHOLD: f64 = 0.85;
/// Bounds of the per-request limits.
const MAX_ITERATIONS: u32 = 10;
const TOKEN_BUDGET: (u64, u64) = (1_000, 10_000_000);
const TIME_BUDGET_SECONDS: (u32, u32) = (1, 86_400);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Mode {
    FullAuto,
    SemiAuto,
}

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

/// A per-(section, criterion) quality lock; an empty section id locks the document's criterion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct SectionLock {
    section_id: String,
    lock: QualityLock,
}

/// One judging of the document.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Judging {
    /// Rounds of edits before it (0 = the document as given).
    iteration: u32,
    score: f64,
    sections: Vec<Section>,
    /// Consolidated issues (after agreement filtering).
    issues: Vec<JudgeIssue>,
    critical: bool,
    /// Mean per (section, criterion) over the judges that scored sections, else per criterion
    /// under an empty section id.
    scores: Vec<(String, String, f64)>,
    plan: Plan,
    /// The content judged holds edits a human made since the previous judging.
    #[serde(default)]
    human_edited: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
enum Status {
    Pending,
    Running,
    Applied,
    Rejected,
    Failed,
    Skipped,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
struct TaskState {
    task: FixTask,
    batch: u32,
    status: Status,
    detail: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
enum Phase {
    /// Judge the document (first, or after an iteration) and decide.
    Judge,
    /// Run the current iteration's tasks.
    Execute,
    /// Semi-auto escalation: waiting for a human.
    Escalated,
}

/// Everything the loop knows, checkpointed after every step.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct State {
    phase: Phase,
    sections: Vec<Section>,
    /// Rounds of edits started.
    iteration: u32,
    judged: Vec<Judging>,
    tasks: Vec<TaskState>,
    /// Batches of the current iteration whose batch_started was emitted (a restarted gateway
    /// does not emit it again).
    #[serde(default)]
    batches_started: BTreeSet<u32>,
    full_regenerate: bool,
    full_regenerate_reason: String,
    /// Accepted edits per section.
    edits: BTreeMap<String, u32>,
    locked: Vec<String>,
    quality_locks: Vec<SectionLock>,
    /// Content at the start of the current iteration (restored when a quality lock breaks).
    before_iteration: Vec<Section>,
    /// Sections a human edited, not verified yet.
    unverified_edits: Vec<String>,
    /// Sections a human edited during the current iteration (their tasks are skipped).
    human_edited: BTreeSet<String>,
    /// Every section a human ever edited (the self-refine hook's producer "human").
    #[serde(default)]
    human_sections: BTreeSet<String>,
    /// The loop has decided and the run is finishing (the self-refine hook may be under way): a
    /// restarted gateway finishes it the same way.
    #[serde(default)]
    finishing: Option<Finishing>,
    /// Posted actions consumed.
    consumed: u32,
    /// Active milliseconds before this process took the run over.
    active_ms: u64,
    stop_reason: String,
    tasks_completed: u32,
    tasks_failed: u32,
}

impl State {
    fn new(sections: Vec<Section>) -> Self {
        Self {
            phase: Phase::Judge,
            before_iteration: sections.clone(),
            sections,
            iteration: 0,
            judged: Vec::new(),
            tasks: Vec::new(),
            batches_started: BTreeSet::new(),
            full_regenerate: false,
            full_regenerate_reason: String::new(),
            edits: BTreeMap::new(),
            locked: Vec::new(),
            quality_locks: Vec::new(),
            unverified_edits: Vec::new(),
            human_edited: BTreeSet::new(),
            human_sections: BTreeSet::new(),
            finishing: None,
            consumed: 0,
            active_ms: 0,
            stop_reason: String::new(),
            tasks_completed: 0,
            tasks_failed: 0,
        }
    }

    fn history(&self) -> Vec<f64> {
        self.judged.iter().map(|j| j.score).collect()
    }

    /// Index of the first highest-scoring judging; on a tie, a judging of human-edited content
    /// wins over earlier ones (a human's edit is not thrown away for an equal score).
    fn best(&self) -> usize {
        let mut best = 0;
        for (i, j) in self.judged.iter().enumerate() {
            let top = self.judged[best].score;
            if j.score > top || (j.score == top && j.human_edited) {
                best = i;
            }
        }
        best
    }

    fn section(&self, id: &str) -> Option<&Section> {
        self.sections.iter().find(|s| s.id == id)
    }

    fn set_section(&mut self, section: &Section) {
        if let Some(s) = self.sections.iter_mut().find(|s| s.id == section.id) {
            s.content.clone_from(&section.content);
            if !section.title.trim().is_empty() {
                s.title.clone_from(&section.title);
            }
        }
    }
}

/// A decided run's ending, kept in the state until the result is stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Finishing {
    /// A `gw::RefinementOutcome`.
    outcome: i32,
    /// The judging the result reports.
    judging: usize,
    warning: String,
    /// A best-effort result (its summary is recomputed from the judging).
    best_effort: bool,
}

/// How a step of the loop ends when it does not simply go on.
#[derive(Debug, Clone, PartialEq)]
enum Halt {
    /// A limit was reached (the reason).
    Limit(String),
    /// A human accepted the content as it stands.
    Accept,
}

/// A human decision after an escalation.
enum Human {
    Accept,
    Review,
    Resume,
}

/// A judging's end.
enum Judged {
    Done(Box<Judging>),
    /// Every judge failed.
    Failed,
    /// A budget was spent before the judging could finish (the reason): nothing was judged.
    Limit(String),
}

/// The mode's decision after a judging.
enum Decision {
    Accept(gw::RefinementOutcome, String),
    Stop(String),
    Continue,
}

fn tokens(ctx: &RunCtx) -> u64 {
    let u = ctx.usage();
    u.prompt_tokens + u.completion_tokens
}

fn quality_of(score: f64, critical: bool) -> gw::QualityStatus {
    if score >= FULL_AUTO_ACCEPT {
        gw::QualityStatus::Good
    } else if score >= WARN_SCORE && !critical {
        gw::QualityStatus::Acceptable
    } else {
        gw::QualityStatus::BelowStandard
    }
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

/// Score of a verdict: the mean of its criterion scores (its overall score when it has none).
fn verdict_score(v: &JudgeVerdict) -> f64 {
    if v.criterion_scores.is_empty() { v.overall_score } else { mean_score(&v.criterion_scores) }
}

/// Mean scores per (section, criterion) over the verdicts that scored sections; per criterion
/// (empty section id) when none did.
fn mean_scores(verdicts: &[JudgeVerdict]) -> Vec<(String, String, f64)> {
    let mut sums: BTreeMap<(String, String), (f64, u32)> = BTreeMap::new();
    let sectioned: Vec<&JudgeVerdict> = verdicts.iter().filter(|v| !v.section_scores.is_empty()).collect();
    if sectioned.is_empty() {
        for v in verdicts {
            for (c, x) in &v.criterion_scores {
                let e = sums.entry((String::new(), c.clone())).or_default();
                e.0 += x;
                e.1 += 1;
            }
        }
    } else {
        for v in sectioned {
            for s in &v.section_scores {
                let e = sums.entry((s.section_id.clone(), s.criterion.clone())).or_default();
                e.0 += s.score;
                e.1 += 1;
            }
        }
    }
    sums.into_iter().map(|((s, c), (sum, n))| (s, c, sum / f64::from(n))).collect()
}

fn field(name: &str) -> String {
    format!("pipeline.{name}")
}

impl TargetedRefinement {
    /// Parse and validate (fields named `pipeline.*`).
    pub fn parse(p: gw::TargetedRefinementPipeline, stages: Stages) -> Result<Self, StageError> {
        let gw::TargetedRefinementPipeline {
            sections,
            verdicts,
            judges,
            mode,
            max_iterations,
            token_budget,
            time_budget_seconds,
            patcher_model,
            expander_model,
            delta_judge_model,
            brief,
            arbiter_model,
            criteria,
            max_parallel_patchers,
            lock_threshold,
            self_refine,
        } = p;
        let mut v = Violations::new();
        let sections: Vec<Section> = convert::document::sections(sections, &field("sections"), &mut v)
            .into_iter()
            .enumerate()
            .map(|(i, mut s)| {
                s.index = i as u32;
                s
            })
            .collect();
        if verdicts.len() > MAX_JUDGES {
            v.push(field("verdicts"), format!("has {} verdicts; the limit is {MAX_JUDGES}", verdicts.len()));
        }
        let verdicts: Vec<JudgeVerdict> = verdicts
            .into_iter()
            .enumerate()
            .map(|(i, x)| convert::document::verdict(x, &field(&format!("verdicts[{i}]")), &mut v))
            .collect();
        let judges: Vec<PanelJudge> = judges
            .into_iter()
            .enumerate()
            .map(|(i, j)| PanelJudge {
                id: j.id,
                model: convert::model_spec(j.model, &field(&format!("judges[{i}].model")), &mut v),
            })
            .collect();
        let judges = panel_or_default(judges);
        check_judges(&judges, &field("judges"), &mut v);
        let mode = match gw::RefinementMode::try_from(mode) {
            Ok(gw::RefinementMode::FullAuto | gw::RefinementMode::Unspecified) => Mode::FullAuto,
            Ok(gw::RefinementMode::SemiAuto) => Mode::SemiAuto,
            Err(_) => {
                v.push(field("mode"), format!("unknown enum value {mode}"));
                Mode::FullAuto
            }
        };
        let max_iterations = max_iterations.unwrap_or(iteration::MAX_ITERATIONS as u32);
        if !(1..=MAX_ITERATIONS).contains(&max_iterations) {
            v.push(field("max_iterations"), format!("is {max_iterations}; it must be between 1 and {MAX_ITERATIONS}"));
        }
        let token_budget = token_budget.unwrap_or(iteration::MAX_TOKENS);
        if !(TOKEN_BUDGET.0..=TOKEN_BUDGET.1).contains(&token_budget) {
            v.push(
                field("token_budget"),
                format!("is {token_budget}; it must be between {} and {}", TOKEN_BUDGET.0, TOKEN_BUDGET.1),
            );
        }
        let time_budget = time_budget_seconds.unwrap_or((iteration::MAX_ELAPSED_MS / 1000) as u32);
        if !(TIME_BUDGET_SECONDS.0..=TIME_BUDGET_SECONDS.1).contains(&time_budget) {
            v.push(
                field("time_budget_seconds"),
                format!("is {time_budget}; it must be between {} and {}", TIME_BUDGET_SECONDS.0, TIME_BUDGET_SECONDS.1),
            );
        }
        let max_parallel_patchers = max_parallel_patchers.unwrap_or(assay_domain::arbiter::MAX_PARALLEL_PATCHERS);
        if !(1..=assay_domain::arbiter::MAX_PARALLEL_PATCHERS).contains(&max_parallel_patchers) {
            v.push(
                field("max_parallel_patchers"),
                format!(
                    "is {max_parallel_patchers}; it must be between 1 and {}",
                    assay_domain::arbiter::MAX_PARALLEL_PATCHERS
                ),
            );
        }
        let lock_threshold = lock_threshold.unwrap_or(DEFAULT_LOCK_THRESHOLD);
        if !(0.0..=1.0).contains(&lock_threshold) {
            v.push(field("lock_threshold"), format!("is {lock_threshold}; it must be between 0 and 1"));
        }
        let brief = convert::document::brief(brief, &field("brief"), &mut v);
        let criteria = convert::document::criteria(criteria, &field("criteria"), &mut v);
        check_criteria(&criteria, &field("criteria"), &mut v);
        let criteria = if criteria.is_empty() { default_criteria() } else { criteria };
        let models = Models {
            patcher: convert::model_spec(patcher_model, &field("patcher_model"), &mut v),
            expander: convert::model_spec(expander_model, &field("expander_model"), &mut v),
            delta: convert::model_spec(delta_judge_model, &field("delta_judge_model"), &mut v),
            arbiter: convert::model_spec(arbiter_model, &field("arbiter_model"), &mut v),
        };
        let hook = self_refine.map(|h| convert::self_refine::self_refine_hook(h, &field("self_refine"), &mut v));
        v.into_result()?;
        stages.refinement()?;
        if hook.is_some() {
            stages.self_refiner()?;
        }
        Ok(Self {
            sections,
            verdicts,
            judges,
            brief,
            criteria,
            mode,
            limits: Limits {
                max_iterations: max_iterations as usize,
                max_tokens: token_budget,
                max_elapsed_ms: u64::from(time_budget) * 1000,
            },
            max_parallel_patchers,
            lock_threshold,
            models,
            hook,
            stages,
            gate: Mutex::new(()),
            accepted: std::sync::atomic::AtomicBool::new(false),
            clock: Clock { start: Instant::now(), waited: StdMutex::new(Duration::ZERO) },
        })
    }

    fn stages(&self) -> Result<&RefinementStages, StageError> {
        self.stages.refinement()
    }

    /// The limit reached once the token or time budget is spent (its stop reason): no stage call
    /// starts then.
    fn spent(&self, ctx: &RunCtx, active_ms: u64) -> Option<String> {
        if tokens(ctx) >= self.limits.max_tokens {
            Some(iteration::Stop::TokenBudget.name().into())
        } else if self.clock.active_ms(active_ms) >= self.limits.max_elapsed_ms {
            Some(iteration::Stop::TimeBudget.name().into())
        } else {
            None
        }
    }

    async fn emit(&self, ctx: &RunCtx, iteration: u32, event: Ev) -> Result<(), StageError> {
        ctx.emit(Event::Refinement(gw::RefinementEvent { iteration, event: Some(event) })).await
    }

    /// Save the state (checkpoint) and publish its progress on the run.
    async fn save(&self, ctx: &RunCtx, st: &State, phase: &str) -> Result<(), StageError> {
        let mut st = st.clone();
        st.active_ms = self.clock.active_ms(st.active_ms);
        ctx.checkpoint_json(STATE, &st).await?;
        // A paused run says so, whatever its in-flight work is doing.
        let phase = if ctx.is_paused() && !matches!(phase, "done" | "awaiting_human") { "paused" } else { phase };
        ctx.set_progress(gw::run::Progress::Refinement(self.progress(ctx, &st, phase)));
        Ok(())
    }

    /// FR-039 iteration progress.
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
            tokens_used: tokens(ctx),
            token_limit: self.limits.max_tokens,
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
            unresolved_issues: last
                .map(|j| j.issues.iter().map(convert::document::issue_to).collect())
                .unwrap_or_default(),
            changed_section_ids: self.changed(&st.sections),
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

    // ---- judging -------------------------------------------------------------------------

    /// Judge the document as it stands (the request's verdicts the first time, when given) and
    /// plan from the verdicts. Once a budget is spent no stage call starts: a re-judging does not
    /// start, and a judging whose panel spent it is not planned (its issues unconsolidated).
    async fn judge(&self, ctx: &RunCtx, st: &State) -> Result<Judged, StageError> {
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
        let score = verdicts.iter().map(verdict_score).sum::<f64>() / verdicts.len() as f64;
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
            scores: mean_scores(&verdicts),
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

    /// Quality locks from the first judging: every (section, criterion) at or above the threshold.
    fn quality_locks(&self, judging: &Judging) -> Vec<SectionLock> {
        judging
            .scores
            .iter()
            .filter(|(_, _, x)| *x >= self.lock_threshold)
            .map(|(s, c, x)| SectionLock {
                section_id: s.clone(),
                lock: QualityLock { criterion: c.clone(), baseline: *x, max_drop: Some(DEFAULT_LOCK_MAX_DROP) },
            })
            .collect()
    }

    /// Sections edited in this iteration that break a quality lock in `judging`, with the
    /// violations.
    fn regressions(&self, st: &State, judging: &Judging) -> Vec<(String, Vec<iteration::LockViolation>)> {
        let edited: Vec<String> = st
            .sections
            .iter()
            .zip(&st.before_iteration)
            .filter(|(now, before)| now.content != before.content)
            .map(|(s, _)| s.id.clone())
            .collect();
        let mut out = Vec::new();
        for id in edited {
            let locks: Vec<QualityLock> = st
                .quality_locks
                .iter()
                .filter(|l| l.section_id.is_empty() || l.section_id == id)
                .map(|l| l.lock.clone())
                .collect();
            let scores: BTreeMap<String, f64> = judging
                .scores
                .iter()
                .filter(|(s, _, _)| s.is_empty() || *s == id)
                .map(|(_, c, x)| (c.clone(), *x))
                .collect();
            let broken = iteration::lock_violations(&locks, &scores);
            if !broken.is_empty() {
                out.push((id, broken));
            }
        }
        out
    }

    /// Judge after an iteration: restore sections whose edits broke a quality lock (then judge
    /// once more), emit iteration_complete.
    async fn rejudge(&self, ctx: &RunCtx, st: &mut State) -> Result<Judged, StageError> {
        let mut judging = match self.judge(ctx, st).await? {
            Judged::Done(j) => *j,
            other @ (Judged::Failed | Judged::Limit(_)) => return Ok(other),
        };
        let regressions = self.regressions(st, &judging);
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

    // ---- deciding ------------------------------------------------------------------------

    /// The mode's thresholds (FR-025, FR-027).
    fn accepts(&self, score: f64, critical: bool) -> Option<Decision> {
        let accepted = Decision::Accept(gw::RefinementOutcome::Accepted, String::new());
        match self.mode {
            Mode::FullAuto if score >= FULL_AUTO_ACCEPT => Some(accepted),
            Mode::FullAuto if score >= WARN_SCORE && !critical => Some(Decision::Accept(
                gw::RefinementOutcome::AcceptedWithWarning,
                format!(
                    "score {score:.2} is below {FULL_AUTO_ACCEPT:.2} but at least {WARN_SCORE:.2} with no critical issue"
                ),
            )),
            Mode::SemiAuto if score >= SEMI_AUTO_ACCEPT || (score >= SEMI_AUTO_NO_CRITICAL && !critical) => {
                Some(accepted)
            }
            Mode::FullAuto | Mode::SemiAuto => None,
        }
    }

    fn decide(&self, ctx: &RunCtx, st: &State) -> Decision {
        let Some(last) = st.judged.last() else { return Decision::Stop("judges_failed".into()) };
        let (score, critical) = (last.score, last.critical);
        if let Some(accept) = self.accepts(score, critical) {
            return accept;
        }
        let c = iteration::convergence_within(
            &st.history(),
            &st.edits,
            tokens(ctx),
            self.clock.active_ms(st.active_ms),
            self.limits,
        );
        if let Some(stop) = c.stop {
            return Decision::Stop(stop.name().into());
        }
        let routing = &last.plan.routing;
        let unlocked = st.sections.iter().any(|s| !st.locked.contains(&s.id));
        if (routing.full_regenerate && !unlocked) || (!routing.full_regenerate && routing.tasks.is_empty()) {
            return Decision::Stop("nothing_to_fix".into());
        }
        Decision::Continue
    }

    /// Start the next iteration from the last judging's plan.
    async fn start_iteration(&self, ctx: &RunCtx, st: &mut State) -> Result<(), StageError> {
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

    /// FULL_REGENERATE: one regeneration per unlocked section, in document order, one at a time.
    fn regeneration_tasks(&self, st: &State, last: &Judging) -> Vec<TaskState> {
        let reason = &last.plan.routing.full_regenerate_reason;
        let ids: Vec<&str> = st.sections.iter().map(|s| s.id.as_str()).collect();
        st.sections
            .iter()
            .enumerate()
            .filter(|(_, s)| !st.locked.contains(&s.id))
            .enumerate()
            .map(|(n, (i, s))| {
                let issues: Vec<&JudgeIssue> = last.issues.iter().filter(|x| x.section_id == s.id).collect();
                let instruction = last
                    .plan
                    .consolidation
                    .instructions
                    .iter()
                    .find(|x| x.section_id == s.id && !x.instruction.trim().is_empty());
                let text = instruction.map_or_else(
                    || {
                        format!(
                            "The whole document is being rewritten ({reason}). Rewrite this section so that it \
                             teaches its part of the brief in a sound order and builds on the previous section."
                        )
                    },
                    |x| x.instruction.clone(),
                );
                TaskState {
                    task: FixTask {
                        id: format!("regenerate-{}", s.id),
                        section_id: s.id.clone(),
                        action: FixAction::RegenerateSection,
                        instruction: text,
                        constraints: instruction.map(|x| x.constraints.clone()).unwrap_or_default(),
                        issue_ids: issues.iter().map(|x| x.id.clone()).collect(),
                        consistency_check: false,
                        priority: 1,
                        criterion: "pedagogical_structure".into(),
                        severity: issues.iter().map(|x| x.severity).min(),
                        previous_section_id: i.checked_sub(1).map(|p| ids[p].to_string()).unwrap_or_default(),
                        next_section_id: ids.get(i + 1).map(|x| x.to_string()).unwrap_or_default(),
                        estimated_tokens: (s.content.len() / 2 + 600) as u32,
                    },
                    batch: n as u32,
                    status: Status::Pending,
                    detail: String::new(),
                }
            })
            .collect()
    }

    // ---- executing -----------------------------------------------------------------------

    /// Before new work: wait while paused, take posted human actions (edits applied at once,
    /// verified once the run resumes), stop at a limit. `Some` ends the iteration.
    async fn checkpoint_gate(&self, ctx: &RunCtx, shared: &Mutex<State>) -> Result<Option<Halt>, StageError> {
        let _one = self.gate.lock().await;
        loop {
            if self.accepted.load(std::sync::atomic::Ordering::SeqCst) {
                return Ok(Some(Halt::Accept));
            }
            let consumed = {
                let st = shared.lock().await;
                if ctx.is_paused() {
                    self.save(ctx, &st, "paused").await?;
                }
                st.consumed
            };
            let waited = Instant::now();
            let action = ctx.gate_or_action(consumed).await?;
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
        let active = self.clock.active_ms(st.active_ms);
        if tokens(ctx) >= self.limits.max_tokens {
            return Ok(Some(Halt::Limit(iteration::Stop::TokenBudget.name().into())));
        }
        if active >= self.limits.max_elapsed_ms {
            return Ok(Some(Halt::Limit(iteration::Stop::TimeBudget.name().into())));
        }
        Ok(None)
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

    /// Verify sections a human edited (FR-048d): the delta judge checks each against the open
    /// issues of its section. The edit stands either way (a human decided); the result is reported.
    async fn verify_human_edits(&self, ctx: &RunCtx, st: &mut State) -> Result<(), StageError> {
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
            let (accepted, verification, reason) = match self.spent(ctx, st.active_ms) {
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

    /// Run the iteration's pending tasks batch by batch.
    async fn execute(&self, ctx: &RunCtx, st: State) -> Result<(State, Option<Halt>), StageError> {
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

    // ---- human loop ----------------------------------------------------------------------

    /// Semi-auto escalation: wait for a human. Edits are applied as they come; accept, review or
    /// resume ends the wait.
    async fn await_human(&self, ctx: &RunCtx, st: &mut State) -> Result<Human, StageError> {
        ctx.set_state(gw::RunState::AwaitingHuman, "escalated: below the semi-auto thresholds").await?;
        self.save(ctx, st, "awaiting_human").await?;
        loop {
            let waited = Instant::now();
            let request = ctx.next_action(st.consumed).await;
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

    // ---- ending --------------------------------------------------------------------------

    /// The best iteration's content becomes the document (best effort, escalation).
    fn take_best(&self, st: &mut State) -> usize {
        let best = st.best();
        if let Some(j) = st.judged.get(best) {
            st.sections = j.sections.clone();
        }
        best
    }

    fn best_effort(&self, st: &State, best: usize) -> gw::BestEffort {
        let j = &st.judged[best];
        let mut categories: Vec<String> = j.issues.iter().map(|i| i.criterion.clone()).collect();
        categories.sort();
        categories.dedup();
        gw::BestEffort {
            best_score: j.score,
            best_iteration: j.iteration,
            quality: quality_of(j.score, j.critical) as i32,
            unresolved_issues_count: j.issues.len() as u32,
            unresolved_categories: categories,
            improvement_hints: hints(&j.issues),
        }
    }

    /// Stop iterating: best effort (full-auto) or escalation (semi-auto). `Some` is the outcome.
    async fn stop(&self, ctx: &RunCtx, st: &mut State, reason: String) -> Result<Option<RunOutcome>, StageError> {
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
                        unresolved_issues: j.issues.iter().map(convert::document::issue_to).collect(),
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
    async fn finish(
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
        let j = st.judged.get(judging);
        let final_score = j.map_or(0.0, |j| j.score);
        let quality = j.map_or(gw::QualityStatus::Unspecified, |j| quality_of(j.score, j.critical));
        let issues = j.map(|j| j.issues.clone()).unwrap_or_default();
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
            audit_log: ctx.audit_log().await?,
            usage: Some(ctx.usage()),
            score_history: st.history(),
            best_iteration: j.map_or(0, |j| j.iteration),
            unresolved_issues: issues.iter().map(convert::document::issue_to).collect(),
            changed_section_ids: self.changed(&st.sections),
            locked_section_ids: st.locked.clone(),
            full_regenerate: st.judged.iter().any(|j| j.plan.routing.full_regenerate) && st.iteration > 0,
            stop_reason: st.stop_reason.clone(),
            warning,
            best_effort,
            tasks_completed: st.tasks_completed,
            tasks_failed: st.tasks_failed,
            models: ctx.models().iter().map(convert::model_record_to).collect(),
            score_predates_self_refine: self_refined.iter().any(|e| e.after != e.before),
            self_refined,
        };
        Ok(RunOutcome {
            state: gw::RunState::Succeeded,
            result: Some(gw::run_result::Result::TargetedRefinement(result)),
        })
    }
}

impl TargetedRefinement {
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
            .checkpoints::<gw::SelfRefined>(SELF_REFINED)
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
                let mut instruction = format!(
                    "Polish section {:?} (\"{}\") of a sectioned document. Return only this section's text, in its \
                     own format and language; keep its headings, facts and place in the document.",
                    s.id, s.title
                );
                if !brief.trim().is_empty() {
                    instruction.push_str("\nThe document's brief:\n");
                    instruction.push_str(&brief);
                }
                Output { target: s.id.clone(), producer, text: s.content.clone(), instruction }
            })
            .collect();
        let active_ms = st.active_ms;
        let entries: Vec<gw::SelfRefined> = futures::stream::iter(outputs)
            .map(|o| {
                let done = done.get(&o.target).filter(|e| e.before == o.text).cloned();
                async move {
                    if let Some(e) = done {
                        return Ok(e);
                    }
                    let e = match self.spent(ctx, active_ms) {
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
                            ctx.emit(Event::SelfRefined(e.clone())).await?;
                            e
                        }
                        None => self_refine_hook::refine(&self.stages, ctx, hook, o).await?,
                    };
                    // A failed loop is tried again by a restarted gateway.
                    if e.error.is_empty() {
                        ctx.checkpoint(&format!("{SELF_REFINED}{}", e.target), &e).await?;
                    }
                    Ok::<_, StageError>(e)
                }
            })
            .buffered(self.stages.concurrency)
            .try_collect()
            .await?;
        for e in &entries {
            if let Some(s) = st.sections.iter_mut().find(|s| s.id == e.target) {
                s.content.clone_from(&e.after);
            }
        }
        Ok(entries)
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
            ctx.add_usage(&o.usage);
            ctx.add_model(&o.model);
            Ok((o.accepted, Some(convert::delta_judge::verify_response_to(&o)), o.rejection_reasons.join("; ")))
        }
        Err(e @ StageError::Cancelled(_)) => Err(e),
        Err(e) => Ok((false, None, format!("verification failed: {e}"))),
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
            () = ctx.cancelled() => Err(StageError::Cancelled("the run was cancelled".into())),
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
        let mut st = match ctx.load_json::<State>(STATE).await? {
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
                            if st.judged.is_empty() {
                                self.judge(ctx, &st).await?
                            } else {
                                self.rejudge(ctx, &mut st).await?
                            }
                        }
                    };
                    let judging = match judged {
                        Judged::Done(j) => Some(*j),
                        Judged::Failed => None,
                        Judged::Limit(reason) => {
                            // The edits since the last judging were never judged: the best
                            // judged iteration stands.
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
                        if let Some(done) = self.stop(ctx, &mut st, "judges_failed".into()).await? {
                            return Ok(done);
                        }
                        continue;
                    };
                    if st.judged.is_empty() {
                        st.quality_locks = self.quality_locks(&judging);
                    }
                    st.judged.push(judging);
                    self.save(ctx, &st, "planning").await?;
                    match self.decide(ctx, &st) {
                        Decision::Accept(outcome, warning) => {
                            let last = st.judged.len() - 1;
                            return self.finish(ctx, &mut st, outcome, last, warning, None).await;
                        }
                        Decision::Stop(reason) => {
                            if let Some(done) = self.stop(ctx, &mut st, reason).await? {
                                return Ok(done);
                            }
                        }
                        Decision::Continue => {
                            st.phase = Phase::Execute;
                            self.start_iteration(ctx, &mut st).await?;
                        }
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
                            // The edits of an unfinished iteration were never judged: the best
                            // judged iteration stands.
                            if let Some(done) = self.stop(ctx, &mut st, reason).await? {
                                return Ok(done);
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
                        ctx.set_state(gw::RunState::Running, "resumed by a human").await?;
                        if !st.unverified_edits.is_empty() {
                            self.verify_human_edits(ctx, &mut st).await?;
                        }
                        st.before_iteration = st.sections.clone();
                        st.tasks.clear();
                        st.phase = Phase::Judge;
                        self.save(ctx, &st, "judging").await?;
                    }
                },
            }
        }
    }

    /// Bytes of the document (titles and contents) once `edit` is applied after the edits already
    /// taken: the state checkpointed, then the posted edits the loop has not consumed yet.
    async fn document_after(&self, ctx: &RunCtx, edit: &gw::EditSection) -> Result<usize, StageError> {
        let (mut sections, consumed) = match ctx.load_json::<State>(STATE).await? {
            Some(st) => (st.sections, st.consumed),
            None => (self.sections.clone(), 0),
        };
        let posted = ctx.actions_from(consumed).await?;
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
    async fn take_control(&self, ctx: &RunCtx, request: &gw::ControlRunRequest) -> Result<ControlEffect, StageError> {
        let state = ctx.state();
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
                ctx.post_action(request, "edit_section", &detail).await?;
                Ok(ControlEffect::Taken)
            }
            Some(Action::Accept(_)) => {
                if !held {
                    return Err(StageError::FailedPrecondition(format!(
                        "accept: the run is {name}; pause it first (intervene) or wait for an escalation"
                    )));
                }
                ctx.post_action(request, "accept", reason).await?;
                Ok(ControlEffect::Ends)
            }
            Some(Action::Review(_)) => {
                if state != gw::RunState::AwaitingHuman {
                    return Err(StageError::FailedPrecondition(format!(
                        "review: the run is {name}; mark as reviewed applies to an escalated run (RUN_STATE_AWAITING_HUMAN)"
                    )));
                }
                ctx.post_action(request, "review", reason).await?;
                Ok(ControlEffect::Ends)
            }
            Some(Action::Resume(_)) => {
                ctx.post_action(request, "resume", reason).await?;
                Ok(ControlEffect::Taken)
            }
            _ => Err(StageError::FailedPrecondition(format!("this action does not apply to a run in state {name}"))),
        }
    }
}
