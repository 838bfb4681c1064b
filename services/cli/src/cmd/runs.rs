//! `assay runs`: list, show, watch and control runs on a running gateway; the human-in-the-loop
//! verbs of targeted refinement (intervene, edit, resume, accept, review). Also how the verbs that
//! start a run follow it ([`follow_run`]).

use std::path::PathBuf;
use std::pin::Pin;

use assay_config::AssayConfig;
use assay_proto::arbiter::v1 as arb;
use assay_proto::common::v1 as common;
use assay_proto::gateway::v1 as gw;
use assay_proto::refiners::v1 as ref_pb;
use futures::{Stream, StreamExt};
use serde_json::{Value, json};

use super::render::{checklist_json, record_json, self_refined_json};
use super::{Client, client, status_text};

/// Why following a run failed: the gateway refused the request (bad input), or the connection, the
/// gateway or the event stream failed.
#[derive(Debug, PartialEq, Eq)]
pub enum FollowError {
    BadInput(String),
    Failed(String),
}

/// The run events of a `RunPipeline` or `WatchRun` stream.
pub type Events = Pin<Box<dyn Stream<Item = Result<gw::RunEvent, tonic::Status>> + Send>>;

/// The run events of a stream of `M`s.
pub fn events_of<M: Send + 'static>(stream: tonic::Streaming<M>, event: fn(M) -> Option<gw::RunEvent>) -> Events {
    Box::pin(stream.filter_map(move |m| futures::future::ready(m.map(event).transpose())))
}

/// Reattachments in a row that bring no new event before the follower gives up.
pub const MAX_QUIET_REATTACH: u32 = 3;

/// Start a run: the events of its `RunPipeline` stream. A request the gateway refuses as invalid
/// is bad input.
pub async fn start_run(client: &mut Client, request: gw::RunPipelineRequest) -> Result<Events, FollowError> {
    let stream = client.run_pipeline(request).await.map_err(|s| {
        if s.code() == tonic::Code::InvalidArgument {
            FollowError::BadInput(status_text(&s))
        } else {
            FollowError::Failed(status_text(&s))
        }
    })?;
    Ok(events_of(stream.into_inner(), |m: gw::RunPipelineResponse| m.event))
}

/// Start a run and follow it until the verb is done ([`start_run`], [`follow_run`]).
pub async fn run_and_follow<F: RunFollower>(
    client: &mut Client,
    request: gw::RunPipelineRequest,
    follower: &mut F,
) -> Result<F::Ending, F::Error> {
    let events = start_run(client, request).await?;
    follow_run(client, events, follower).await
}

/// What one event means to the verb following the run.
pub enum Step<T> {
    /// Keep following.
    Continue,
    /// Stop following: the verb ends so.
    Done(T),
    /// Stop following: the run waits for a human ([`RunFollower::awaiting_human`]).
    AwaitingHuman,
}

/// A verb that follows the events of the run it started ([`follow_run`]).
pub trait RunFollower {
    /// How the verb ends when it does not fail.
    type Ending;
    /// Why the verb fails; the errors of following itself convert into it.
    type Error: From<FollowError>;

    /// One event of the run.
    fn on_event(&mut self, event: gw::RunEvent) -> Step<Result<Self::Ending, Self::Error>>;

    /// The event stream ended before the verb was done; `run` is the run as the gateway stores it.
    /// `None` follows the run again from the last event seen.
    fn on_stream_end(&mut self, run: gw::Run) -> Option<Result<Self::Ending, Self::Error>>;

    /// After [`Step::AwaitingHuman`]: how the verb ends, given the stored run when the gateway gave
    /// it.
    fn awaiting_human(&mut self, run: Option<&gw::Run>) -> Result<Self::Ending, Self::Error> {
        let id = run.map_or("", |r| r.run_id.as_str());
        Err(FollowError::Failed(format!("run {id} waits for a human")).into())
    }
}

/// Whether a run in this state is over (succeeded, partial, failed or cancelled).
pub fn is_final(state: i32) -> bool {
    match gw::RunState::try_from(state) {
        Ok(gw::RunState::Succeeded | gw::RunState::Partial | gw::RunState::Failed | gw::RunState::Cancelled) => true,
        Ok(
            gw::RunState::Unspecified
            | gw::RunState::Pending
            | gw::RunState::Running
            | gw::RunState::Paused
            | gw::RunState::AwaitingHuman,
        )
        | Err(_) => false,
    }
}

/// Follow a run's `events` until the verb is done. When the stream breaks (resource exhausted,
/// unavailable) or ends early, the run is followed again (`WatchRun` from the last sequence seen,
/// after a pause of a second); after [`MAX_QUIET_REATTACH`] reattachments in a row without a new
/// event, following fails.
pub async fn follow_run<F: RunFollower>(
    client: &mut Client,
    mut events: Events,
    follower: &mut F,
) -> Result<F::Ending, F::Error> {
    let mut run = Followed::default();
    loop {
        match events.next().await {
            Some(Ok(ev)) => {
                run.seen(&ev);
                match follower.on_event(ev) {
                    Step::Continue => {}
                    Step::Done(outcome) => return outcome,
                    Step::AwaitingHuman => {
                        let stored = run.get(client).await.ok();
                        return follower.awaiting_human(stored.as_ref());
                    }
                }
            }
            Some(Err(s)) if matches!(s.code(), tonic::Code::ResourceExhausted | tonic::Code::Unavailable) => {
                eprintln!("event stream interrupted ({}); reattaching", s.message());
                events = run.reattach(client).await?;
            }
            Some(Err(s)) => return Err(FollowError::Failed(status_text(&s)).into()),
            None => {
                let stored = run.get(client).await?;
                match follower.on_stream_end(stored) {
                    Some(outcome) => return outcome,
                    None => events = run.reattach(client).await?,
                }
            }
        }
    }
}

/// Where following a run stands.
#[derive(Default)]
struct Followed {
    run_id: String,
    last_sequence: u64,
    /// Reattachments since the last event.
    quiet: u32,
}

impl Followed {
    fn seen(&mut self, ev: &gw::RunEvent) {
        if self.run_id.is_empty() {
            self.run_id.clone_from(&ev.run_id);
        }
        self.last_sequence = self.last_sequence.max(ev.sequence);
        self.quiet = 0;
    }

    /// Follow the run again from the last sequence seen (after a pause of a second).
    async fn reattach(&mut self, client: &mut Client) -> Result<Events, FollowError> {
        self.quiet += 1;
        if self.quiet > MAX_QUIET_REATTACH {
            return Err(FollowError::Failed(format!(
                "lost the events of run {id}; follow it with `assay runs watch {id} --after {}`",
                self.last_sequence,
                id = self.run_id
            )));
        }
        tokio::time::sleep(std::time::Duration::from_secs(1)).await;
        let request = gw::WatchRunRequest { run_id: self.run_id.clone(), after_sequence: self.last_sequence };
        let stream = client.watch_run(request).await.map_err(|s| FollowError::Failed(status_text(&s)))?;
        Ok(events_of(stream.into_inner(), |m: gw::WatchRunResponse| m.event))
    }

    /// The run as the gateway stores it.
    async fn get(&self, client: &mut Client) -> Result<gw::Run, FollowError> {
        if self.run_id.is_empty() {
            return Err(FollowError::Failed("the gateway ended the event stream before the run started".into()));
        }
        let reply = client
            .get_run(gw::GetRunRequest { run_id: self.run_id.clone() })
            .await
            .map_err(|s| FollowError::Failed(status_text(&s)))?;
        reply
            .into_inner()
            .run
            .ok_or_else(|| FollowError::Failed(format!("run {}: the gateway sent no run", self.run_id)))
    }
}

/// What to do.
pub enum Action {
    List {
        limit: u32,
        state: Option<String>,
    },
    Show {
        run_id: String,
    },
    Watch {
        run_id: String,
        after: u64,
    },
    /// A `ControlRun` call.
    Control {
        run_id: String,
        verb: Verb,
        who: Who,
    },
}

/// A `ControlRun` action.
pub enum Verb {
    /// Start no new work until resumed (`pause`, `intervene`).
    Pause,
    Resume,
    Cancel,
    /// Accept the current content as final (targeted refinement).
    Accept,
    /// Mark an escalated refinement as reviewed (targeted refinement).
    Review,
    /// Replace one section's content (targeted refinement, paused or awaiting a human).
    Edit {
        section_id: String,
        content: EditContent,
    },
}

/// Where an edited section's new content comes from.
pub enum EditContent {
    Text(String),
    File(PathBuf),
}

/// Who acts and why, for the run's audit log.
#[derive(Default)]
pub struct Who {
    /// Default: `$USER`, else "cli".
    pub actor: Option<String>,
    /// Default: "assay runs <verb>".
    pub reason: Option<String>,
}

impl Verb {
    fn name(&self) -> &'static str {
        match self {
            Verb::Pause => "pause",
            Verb::Resume => "resume",
            Verb::Cancel => "cancel",
            Verb::Accept => "accept",
            Verb::Review => "review",
            Verb::Edit { .. } => "edit",
        }
    }
}

/// An enum name without its prefix, lower case (`RUN_STATE_AWAITING_HUMAN` -> `awaiting_human`).
pub fn lower(name: &str, prefix: &str) -> String {
    name.trim_start_matches(prefix).to_lowercase()
}

/// Lower-case names of the wire enums; an unknown number prints as the number.
macro_rules! enum_names {
    ($($(#[$doc:meta])* $name:ident: $ty:ty, $prefix:literal;)*) => {
        $(
            $(#[$doc])*
            pub fn $name(v: i32) -> String {
                <$ty>::try_from(v).map_or_else(|_| v.to_string(), |e| lower(e.as_str_name(), $prefix))
            }
        )*
    };
}

enum_names! {
    /// A run state (`awaiting_human`).
    state_name: gw::RunState, "RUN_STATE_";
    /// A pipeline kind (`targeted_refinement`).
    kind_name: gw::PipelineKind, "PIPELINE_KIND_";
    /// A refinement mode (`semi_auto`).
    mode_name: gw::RefinementMode, "REFINEMENT_MODE_";
    /// A quality status (`below_standard`).
    quality_name: gw::QualityStatus, "QUALITY_STATUS_";
    /// A refinement outcome (`accepted_with_warning`).
    outcome_name: gw::RefinementOutcome, "REFINEMENT_OUTCOME_";
    /// A task status (`rejected`).
    task_status_name: gw::TaskStatus, "TASK_STATUS_";
    /// A fix action (`surgical_edit`).
    action_name: arb::FixAction, "FIX_ACTION_";
    /// An agreement level (`moderate`).
    agreement_name: arb::AgreementLevel, "AGREEMENT_LEVEL_";
    /// An issue severity (`critical`).
    severity_name: common::Severity, "SEVERITY_";
    /// Why self-refine stopped (`max_passes`).
    stop_reason_name: ref_pb::SelfRefineStopReason, "SELF_REFINE_STOP_REASON_";
}

fn time(t: Option<prost_types::Timestamp>) -> String {
    t.map(|t| t.to_string()).unwrap_or_default()
}

/// Token and call counts as JSON.
pub fn usage_json(u: Option<&common::Usage>) -> Value {
    let u = u.copied().unwrap_or_default();
    json!({"calls": u.calls, "prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
        "cache_hits": u.cache_hits})
}

/// Sections as JSON (`id`, `title`, `content`).
pub fn sections_json(sections: &[common::Section]) -> Value {
    sections.iter().map(|s| json!({"id": s.id, "title": s.title, "content": s.content})).collect()
}

/// A judge's issue as JSON.
pub fn issue_json(i: &common::JudgeIssue) -> Value {
    json!({"id": i.id, "criterion": i.criterion, "severity": severity_name(i.severity), "section_id": i.section_id,
        "description": i.description, "fix_instruction": i.fix_instruction, "location": i.location,
        "raised_by": i.raised_by})
}

/// The human actions of a refinement as JSON.
pub fn audit_json(log: &[gw::AuditEntry]) -> Value {
    log.iter()
        .map(|a| json!({"time": time(a.time), "actor": a.actor, "action": a.action, "detail": a.detail}))
        .collect()
}

/// A best-effort selection as JSON.
pub fn best_effort_json(b: &gw::BestEffort) -> Value {
    json!({"best_score": b.best_score, "best_iteration": b.best_iteration, "quality": quality_name(b.quality),
        "unresolved_issues": b.unresolved_issues_count, "unresolved_categories": b.unresolved_categories,
        "improvement_hints": b.improvement_hints})
}

/// A targeted refinement's result as JSON, without its sections (see [`sections_json`]).
pub fn refinement_result_json(r: &gw::TargetedRefinementResult) -> Value {
    let mut v = json!({
        "outcome": outcome_name(r.outcome), "quality": quality_name(r.quality), "final_score": r.final_score,
        "score_history": r.score_history, "iterations": r.iterations, "best_iteration": r.best_iteration,
        "improvement_hints": r.improvement_hints, "unresolved_issues": r.unresolved_issues.len(),
        "changed_section_ids": r.changed_section_ids, "locked_section_ids": r.locked_section_ids,
        "tasks_completed": r.tasks_completed, "tasks_failed": r.tasks_failed, "full_regenerate": r.full_regenerate,
        "usage": usage_json(r.usage.as_ref()), "audit_log": audit_json(&r.audit_log),
    });
    if !r.stop_reason.is_empty() {
        v["stop_reason"] = json!(r.stop_reason);
    }
    if !r.warning.is_empty() {
        v["warning"] = json!(r.warning);
    }
    if !r.self_refined.is_empty() {
        v["self_refined"] = r.self_refined.iter().map(self_refined_json).collect();
    }
    v
}

fn task_json(t: &arb::FixTask) -> Value {
    json!({"id": t.id, "section_id": t.section_id, "action": action_name(t.action), "criterion": t.criterion,
        "severity": severity_name(t.severity), "priority": t.priority, "instruction": t.instruction,
        "constraints": t.constraints, "issue_ids": t.issue_ids, "consistency_check": t.consistency_check,
        "estimated_tokens": t.estimated_tokens})
}

/// A running refinement's progress as JSON, without the document (see [`sections_json`]).
pub fn progress_json(p: &gw::RefinementProgress) -> Value {
    let tasks: Vec<Value> = p
        .tasks
        .iter()
        .map(|t| {
            let task = t.task.clone().unwrap_or_default();
            json!({"id": task.id, "section_id": task.section_id, "action": action_name(task.action),
                "batch_index": t.batch_index, "status": task_status_name(t.status), "locked": t.locked,
                "edit_count": t.edit_count, "detail": t.detail})
        })
        .collect();
    json!({
        "mode": mode_name(p.mode), "phase": p.phase, "iteration": p.iteration, "max_iterations": p.max_iterations,
        "score_history": p.score_history, "tasks_total": p.tasks_total, "tasks_completed": p.tasks_completed,
        "tasks_failed": p.tasks_failed, "locked_section_ids": p.locked_section_ids,
        "changed_section_ids": p.changed_section_ids, "quality": quality_name(p.quality), "converged": p.converged,
        "tokens_used": p.tokens_used, "token_limit": p.token_limit, "unresolved_issues": p.unresolved_issues.len(),
        "tasks": tasks,
    })
}

/// A run summary as JSON.
pub fn run_json(r: &gw::Run) -> Value {
    let mut v = json!({
        "run_id": r.run_id, "kind": kind_name(r.kind), "state": state_name(r.state), "label": r.label,
        "created_at": time(r.created_at), "updated_at": time(r.updated_at), "last_sequence": r.last_sequence,
        "records_total": r.records_total, "records_done": r.records_done, "usage": usage_json(r.usage.as_ref()),
    });
    if let Some(gw::run::Progress::Refinement(p)) = &r.progress {
        v["refinement"] = progress_json(p);
    }
    if let Some(result) = &r.result {
        if !result.error.is_empty() {
            v["error"] = json!(result.error);
        }
        match &result.result {
            Some(gw::run_result::Result::ChecklistEval(e)) => {
                let a = e.aggregate.clone().unwrap_or_default();
                v["aggregate"] = json!({"targets": a.targets, "mean_primary_score": a.mean_primary_score,
                    "macro_pass_rate": a.macro_pass_rate, "micro_pass_rate": a.micro_pass_rate,
                    "unanswered_items": a.unanswered_items});
                v["failed_records"] = json!(e.results.iter().filter(|r| r.score.is_none()).count());
            }
            Some(gw::run_result::Result::Checklist(c)) => v["checklist"] = checklist_json(c),
            Some(gw::run_result::Result::TargetedRefinement(t)) => v["targeted_refinement"] = refinement_result_json(t),
            Some(gw::run_result::Result::Debate(d)) => v["debate"] = super::debate::result_json(d),
            Some(gw::run_result::Result::SelfRefine(r)) => {
                v["self_refine"] = super::refine_text::self_refine_result_json(r)
            }
            None => {}
        }
    }
    v
}

/// A run as `runs show` prints it: [`run_json`] plus the document (the refinement's current
/// sections, or its result's) or a self-refine's final text.
fn run_detail_json(r: &gw::Run) -> Value {
    let mut v = run_json(r);
    if let Some(gw::run::Progress::Refinement(p)) = &r.progress {
        v["refinement"]["sections"] = sections_json(&p.sections);
    }
    if let Some(gw::run_result::Result::TargetedRefinement(t)) = r.result.as_ref().and_then(|r| r.result.as_ref()) {
        v["targeted_refinement"]["sections"] = sections_json(&t.sections);
    }
    if let Some(gw::run_result::Result::SelfRefine(s)) = r.result.as_ref().and_then(|r| r.result.as_ref()) {
        v["self_refine"]["final_text"] = json!(s.final_text);
    }
    v
}

fn judged_json(j: &gw::Judged) -> Value {
    let judges: Vec<Value> = j
        .judges
        .iter()
        .map(
            |r| json!({"judge_id": r.judge_id, "score": r.verdict.as_ref().map(|v| v.overall_score), "error": r.error}),
        )
        .collect();
    json!({"score": j.score, "open_issues": j.open_issues, "critical_issues": j.critical_issues, "judges": judges})
}

fn plan_json(p: &arb::PlanResponse) -> Value {
    let c = p.consolidation.clone().unwrap_or_default();
    let batches: Vec<Value> = p
        .batches
        .iter()
        .map(|b| {
            json!({"index": b.index, "estimated_tokens": b.estimated_tokens,
            "tasks": b.tasks.iter().map(task_json).collect::<Vec<_>>()})
        })
        .collect();
    json!({"alpha": c.alpha, "agreement": agreement_name(c.agreement), "flagged_for_review": c.flagged_for_review,
        "issues": c.issues.len(), "issues_dropped": c.issues_dropped, "conflicts": c.conflicts.len(),
        "estimated_tokens": p.estimated_tokens, "batches": batches})
}

fn verification_json(v: &gw::VerificationResult) -> Value {
    let check = v.verification.clone().unwrap_or_default();
    json!({
        "task_id": v.task_id, "section_id": v.section_id, "accepted": v.accepted, "rolled_back": v.rolled_back,
        "reason": v.reason, "human_edit": v.human_edit, "edit_count": v.edit_count,
        "rejection_reasons": check.rejection_reasons,
        "heuristics": check.heuristics.iter().map(|h| json!({"name": h.name, "passed": h.passed, "detail": h.detail})).collect::<Vec<_>>(),
        "issues": check.issues.iter().map(|i| json!({"issue_id": i.issue_id, "fixed": i.fixed, "confidence": i.confidence, "error": i.error})).collect::<Vec<_>>(),
        "lock_violations": check.lock_violations.iter().map(|l| json!({"criterion": l.criterion, "baseline": l.baseline, "current": l.current, "max_drop": l.max_drop})).collect::<Vec<_>>(),
    })
}

/// A refinement event as its kind (the oneof field name) and its fields, with the iteration.
pub fn refinement_event_json(r: &gw::RefinementEvent) -> (&'static str, Value) {
    use gw::refinement_event::Event as E;
    let (kind, mut detail) = match &r.event {
        Some(E::Judged(j)) => ("judged", judged_json(j)),
        Some(E::RefinementStart(s)) => (
            "refinement_start",
            json!({"mode": mode_name(s.mode), "score": s.score, "full_regenerate": s.full_regenerate,
                "full_regenerate_reason": s.full_regenerate_reason, "locked_section_ids": s.locked_section_ids,
                "plan": s.plan.as_ref().map(plan_json)}),
        ),
        Some(E::BatchStarted(b)) => (
            "batch_started",
            json!({"batch_index": b.batch_index, "batches_total": b.batches_total, "task_ids": b.task_ids}),
        ),
        Some(E::TaskStarted(t)) => {
            ("task_started", json!({"batch_index": t.batch_index, "task": t.task.as_ref().map(task_json)}))
        }
        Some(E::PatchApplied(p)) => {
            let s = p.section.clone().unwrap_or_default();
            (
                "patch_applied",
                json!({"task_id": p.task_id, "section_id": p.section_id, "action": action_name(p.action),
                    "diff_summary": p.diff_summary, "title": s.title, "content": s.content,
                    "usage": usage_json(p.usage.as_ref())}),
            )
        }
        Some(E::VerificationResult(v)) => ("verification_result", verification_json(v)),
        Some(E::BatchComplete(b)) => (
            "batch_complete",
            json!({"batch_index": b.batch_index, "tasks_completed": b.tasks_completed,
                "tasks_failed": b.tasks_failed, "tasks_skipped": b.tasks_skipped}),
        ),
        Some(E::SectionLocked(s)) => {
            ("section_locked", json!({"section_id": s.section_id, "edit_count": s.edit_count}))
        }
        Some(E::IterationComplete(c)) => (
            "iteration_complete",
            json!({"score": c.score, "score_history": c.score_history, "tokens_used": c.tokens_used,
                "tasks_completed": c.tasks_completed, "tasks_failed": c.tasks_failed,
                "restored_section_ids": c.restored_section_ids}),
        ),
        Some(E::ConvergenceDetected(c)) => {
            ("convergence_detected", json!({"reason": c.reason, "score_history": c.score_history}))
        }
        Some(E::BestEffortSelected(b)) => {
            ("best_effort_selected", b.best_effort.as_ref().map_or_else(|| json!({}), best_effort_json))
        }
        Some(E::EscalationTriggered(e)) => (
            "escalation_triggered",
            json!({"reason": e.reason, "best_score": e.best_score, "best_iteration": e.best_iteration,
                "unresolved_issues": e.unresolved_issues.iter().map(issue_json).collect::<Vec<_>>()}),
        ),
        Some(E::RefinementComplete(c)) => (
            "refinement_complete",
            json!({"outcome": outcome_name(c.outcome), "final_score": c.final_score, "iterations": c.iterations}),
        ),
        None => ("refinement", json!({})),
    };
    detail["iteration"] = json!(r.iteration);
    (kind, detail)
}

/// A run event as JSON: sequence, time, kind and fields.
pub fn event_json(e: &gw::RunEvent) -> Value {
    use gw::run_event::Event;
    let (kind, detail) = match &e.event {
        Some(Event::Started(s)) => ("started", json!({"kind": kind_name(s.kind), "records": s.records})),
        Some(Event::Progress(p)) => {
            let pr = p.progress.clone().unwrap_or_default();
            (
                "progress",
                json!({"service": p.service, "stage": pr.stage, "message": pr.message, "done": pr.done, "total": pr.total}),
            )
        }
        Some(Event::ChecklistReady(c)) => (
            "checklist_ready",
            json!({"checklist_id": c.checklist.as_ref().map(|c| c.id.clone()), "items": c.checklist.as_ref().map_or(0, |c| c.items.len()), "records": c.record_indices.len()}),
        ),
        Some(Event::RecordScored(r)) => ("record_scored", record_json(r)),
        Some(Event::Aggregate(a)) => {
            let a = a.aggregate.clone().unwrap_or_default();
            (
                "aggregate",
                json!({"mean_primary_score": a.mean_primary_score, "macro_pass_rate": a.macro_pass_rate, "micro_pass_rate": a.micro_pass_rate}),
            )
        }
        Some(Event::StateChanged(s)) => ("state_changed", json!({"state": state_name(s.state), "reason": s.reason})),
        Some(Event::Completed(c)) => {
            ("completed", json!({"state": state_name(c.state), "error": c.result.as_ref().map(|r| r.error.clone())}))
        }
        Some(Event::Refinement(r)) => refinement_event_json(r),
        Some(Event::SelfRefinePass(p)) => ("self_refine_pass", super::refine_text::pass_json(p)),
        Some(Event::DebateStage(d)) => {
            let stage = d.stage.clone().unwrap_or_default();
            (
                "debate_stage",
                json!({"index": d.index, "problem_id": d.problem_id, "stage": stage.stage, "round": stage.round,
                       "consensus": stage.consensus}),
            )
        }
        Some(Event::DebateProblemDone(p)) => ("debate_problem_done", super::debate::problem_json(p)),
        Some(Event::SelfRefined(r)) => ("self_refined", self_refined_json(r)),
        None => ("unknown", Value::Null),
    };
    json!({"sequence": e.sequence, "time": time(e.time), "event": kind, "detail": detail})
}

/// The actor recorded in the audit log: `--actor`, else `$USER`, else "cli".
fn actor(given: Option<String>) -> String {
    given
        .or_else(|| std::env::var("USER").ok())
        .map(|a| a.trim().to_string())
        .filter(|a| !a.is_empty())
        .unwrap_or_else(|| "cli".into())
}

/// The new content of an edited section: the text given or the file's, never blank.
fn edit_content(content: EditContent) -> Result<String, String> {
    let (text, what) = match content {
        EditContent::Text(t) => (t, "--content".to_string()),
        EditContent::File(p) => {
            (std::fs::read_to_string(&p).map_err(|e| format!("{}: {e}", p.display()))?, p.display().to_string())
        }
    };
    if text.trim().is_empty() {
        return Err(format!("{what}: the section's new content must not be empty"));
    }
    Ok(text)
}

/// The `ControlRun` request of a verb.
pub fn control_request(run_id: String, verb: Verb, who: Who) -> Result<gw::ControlRunRequest, String> {
    use gw::control_run_request::Action as A;
    if run_id.trim().is_empty() {
        return Err("RUN_ID must not be empty".into());
    }
    let reason = who.reason.unwrap_or_else(|| format!("assay runs {}", verb.name()));
    let action = match verb {
        Verb::Pause => A::Pause(gw::PauseRun {}),
        Verb::Resume => A::Resume(gw::ResumeRun {}),
        Verb::Cancel => A::Cancel(gw::CancelRun {}),
        Verb::Accept => A::Accept(gw::AcceptRun {}),
        Verb::Review => A::Review(gw::ReviewRun {}),
        Verb::Edit { section_id, content } => {
            if section_id.trim().is_empty() {
                return Err("--section must not be empty".into());
            }
            A::EditSection(gw::EditSection { section_id, content: edit_content(content)? })
        }
    };
    Ok(gw::ControlRunRequest { run_id, action: Some(action), actor: actor(who.actor), reason })
}

/// One line per run, as `runs list` prints it (a refinement with its iteration, score and phase).
fn run_line(r: &gw::Run) -> String {
    let head = format!("{}  {:<20} {:<14}", r.run_id, kind_name(r.kind), state_name(r.state));
    match &r.progress {
        Some(gw::run::Progress::Refinement(p)) => {
            let score = p.score_history.last().map_or_else(|| "-".to_string(), |s| format!("{s:.2}"));
            format!("{head} iteration {}/{} score {score} {}  {}", p.iteration, p.max_iterations, p.phase, r.label)
        }
        None => format!("{head} {}/{} records  {}", r.records_done, r.records_total, r.label),
    }
}

fn print_json(v: &Value, as_json: bool) -> Result<(), String> {
    if as_json {
        println!("{v}");
    } else {
        println!("{}", serde_json::to_string_pretty(v).map_err(|e| e.to_string())?);
    }
    Ok(())
}

/// Run the action against the gateway at `url`.
pub async fn run(config: &AssayConfig, url: &str, action: Action, as_json: bool) -> Result<(), String> {
    let mut c = client(config, url)?;
    match action {
        Action::List { limit, state } => {
            let state = match state {
                None => gw::RunState::Unspecified,
                Some(s) => {
                    gw::RunState::from_str_name(&format!("RUN_STATE_{}", s.to_ascii_uppercase())).ok_or_else(|| {
                        format!(
                            "unknown state {s:?} (running, paused, awaiting_human, succeeded, partial, failed, cancelled)"
                        )
                    })?
                }
            };
            let mut token = String::new();
            let mut shown = 0u32;
            loop {
                let page = c
                    .list_runs(gw::ListRunsRequest {
                        page_size: (limit - shown).min(500),
                        page_token: token.clone(),
                        kind: 0,
                        state: state as i32,
                    })
                    .await
                    .map_err(|s| status_text(&s))?
                    .into_inner();
                for r in &page.runs {
                    if as_json {
                        println!("{}", run_json(r));
                    } else {
                        println!("{}", run_line(r));
                    }
                    shown += 1;
                }
                if page.next_page_token.is_empty() || shown >= limit {
                    break;
                }
                token = page.next_page_token;
            }
        }
        Action::Show { run_id } => {
            let r = c.get_run(gw::GetRunRequest { run_id }).await.map_err(|s| status_text(&s))?.into_inner();
            print_json(&run_detail_json(&r.run.unwrap_or_default()), as_json)?;
        }
        Action::Watch { run_id, after } => {
            let mut s = c
                .watch_run(gw::WatchRunRequest { run_id, after_sequence: after })
                .await
                .map_err(|s| status_text(&s))?
                .into_inner();
            while let Some(m) = s.message().await.map_err(|s| status_text(&s))? {
                if let Some(e) = m.event {
                    println!("{}", watch_line(&e, as_json));
                }
            }
        }
        Action::Control { run_id, verb, who } => {
            let request = control_request(run_id, verb, who)?;
            let reply = c.control_run(request).await.map_err(|s| status_text(&s))?.into_inner();
            print_json(&run_json(&reply.run.unwrap_or_default()), as_json)?;
        }
    }
    Ok(())
}

/// One watched event: its JSON, or `#<sequence> <kind> <fields>` (refinement events in the words
/// of `assay refine`, self-refine passes in those of `assay refine-text`, self-refine hook entries
/// in those of `assay refine` and `assay debate`).
fn watch_line(e: &gw::RunEvent, as_json: bool) -> String {
    let v = event_json(e);
    if as_json {
        return v.to_string();
    }
    if let Some(gw::run_event::Event::Refinement(r)) = &e.event
        && let Some(line) = super::refine::progress_line(&e.run_id, r)
    {
        return format!("#{} {}", e.sequence, line.trim_start());
    }
    if let Some(gw::run_event::Event::SelfRefinePass(p)) = &e.event {
        return format!("#{} {}", e.sequence, super::refine_text::pass_line(p));
    }
    if let Some(gw::run_event::Event::SelfRefined(r)) = &e.event {
        return format!("#{} {}", e.sequence, super::refine_text::self_refined_line(r));
    }
    format!("#{} {} {}", e.sequence, v["event"].as_str().unwrap_or_default(), v["detail"])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refinement(iteration: u32, event: gw::refinement_event::Event) -> gw::RefinementEvent {
        gw::RefinementEvent { iteration, event: Some(event) }
    }

    #[test]
    fn refinement_events_are_named_by_their_oneof_field() {
        use gw::refinement_event::Event as E;
        let (kind, v) = refinement_event_json(&refinement(
            2,
            E::VerificationResult(gw::VerificationResult {
                task_id: "t1".into(),
                section_id: "intro".into(),
                rolled_back: true,
                reason: "length ratio 2.4".into(),
                ..Default::default()
            }),
        ));
        assert_eq!(kind, "verification_result");
        assert_eq!(v["iteration"], 2);
        assert_eq!(v["rolled_back"], true);
        assert_eq!(v["reason"], "length ratio 2.4");
        let (kind, v) = refinement_event_json(&refinement(
            1,
            E::RefinementComplete(gw::RefinementComplete {
                outcome: gw::RefinementOutcome::AcceptedWithWarning as i32,
                final_score: 0.8,
                iterations: 1,
            }),
        ));
        assert_eq!(kind, "refinement_complete");
        assert_eq!(v["outcome"], "accepted_with_warning");
        let (kind, _) = refinement_event_json(&refinement(0, E::Judged(gw::Judged::default())));
        assert_eq!(kind, "judged");
    }

    #[test]
    fn run_json_shows_refinement_progress_and_result() {
        let run = gw::Run {
            run_id: "r1".into(),
            kind: gw::PipelineKind::TargetedRefinement as i32,
            state: gw::RunState::AwaitingHuman as i32,
            progress: Some(gw::run::Progress::Refinement(gw::RefinementProgress {
                iteration: 2,
                max_iterations: 3,
                score_history: vec![0.6, 0.7],
                quality: gw::QualityStatus::BelowStandard as i32,
                mode: gw::RefinementMode::SemiAuto as i32,
                phase: "awaiting_human".into(),
                sections: vec![common::Section { id: "a".into(), content: "text".into(), ..Default::default() }],
                ..Default::default()
            })),
            result: Some(gw::RunResult {
                result: Some(gw::run_result::Result::TargetedRefinement(gw::TargetedRefinementResult {
                    outcome: gw::RefinementOutcome::Reviewed as i32,
                    audit_log: vec![gw::AuditEntry {
                        actor: "alice".into(),
                        action: "review".into(),
                        ..Default::default()
                    }],
                    ..Default::default()
                })),
                error: String::new(),
            }),
            ..Default::default()
        };
        let v = run_json(&run);
        assert_eq!(v["state"], "awaiting_human");
        assert_eq!(v["kind"], "targeted_refinement");
        assert_eq!(v["refinement"]["quality"], "below_standard");
        assert_eq!(v["refinement"]["mode"], "semi_auto");
        assert_eq!(v["refinement"]["score_history"], json!([0.6, 0.7]));
        assert!(v["refinement"].get("sections").is_none());
        assert_eq!(v["targeted_refinement"]["outcome"], "reviewed");
        assert_eq!(v["targeted_refinement"]["audit_log"][0]["actor"], "alice");
        assert_eq!(run_detail_json(&run)["refinement"]["sections"][0]["content"], "text");
    }

    #[test]
    fn self_refine_runs_and_passes_render() {
        let pass = ref_pb::SelfRefinePass {
            pass: 2,
            critique: vec!["Too vague".into()],
            char_similarity: 0.994,
            decided_by: "char".into(),
            converged: true,
            ..Default::default()
        };
        let event = gw::RunEvent {
            run_id: "r1".into(),
            sequence: 4,
            event: Some(gw::run_event::Event::SelfRefinePass(pass.clone())),
            ..Default::default()
        };
        let v = event_json(&event);
        assert_eq!(v["event"], "self_refine_pass");
        assert_eq!((v["detail"]["pass"].as_u64(), v["detail"]["decided_by"].as_str()), (Some(2), Some("char")));
        assert_eq!(v["detail"]["critique"], json!(["Too vague"]));
        assert_eq!(watch_line(&event, false), "#4 pass 2: 1 critique point; similarity 0.99 (char); converged");
        let run = gw::Run {
            run_id: "r1".into(),
            kind: gw::PipelineKind::SelfRefine as i32,
            state: gw::RunState::Succeeded as i32,
            result: Some(gw::RunResult {
                result: Some(gw::run_result::Result::SelfRefine(ref_pb::SelfRefineResponse {
                    final_text: "Final.".into(),
                    passes: vec![pass],
                    converged: true,
                    stop_reason: ref_pb::SelfRefineStopReason::Converged as i32,
                    ..Default::default()
                })),
                error: String::new(),
            }),
            ..Default::default()
        };
        let v = run_json(&run);
        assert_eq!(v["self_refine"]["stop_reason"], "converged");
        assert_eq!(v["self_refine"]["passes"][0]["converged"], true);
        assert!(v["self_refine"].get("final_text").is_none());
        assert_eq!(run_detail_json(&run)["self_refine"]["final_text"], "Final.");
    }

    #[test]
    fn only_finished_runs_are_final() {
        for s in [gw::RunState::Succeeded, gw::RunState::Partial, gw::RunState::Failed, gw::RunState::Cancelled] {
            assert!(is_final(s as i32), "{s:?}");
        }
        for s in [gw::RunState::Pending, gw::RunState::Running, gw::RunState::Paused, gw::RunState::AwaitingHuman] {
            assert!(!is_final(s as i32), "{s:?}");
        }
        assert!(!is_final(99));
    }

    #[test]
    fn self_refine_hook_entries_render_in_results_and_events() {
        let entry = gw::SelfRefined {
            target: "intro".into(),
            producer: "original".into(),
            skipped: "too_short".into(),
            before: "Hi.".into(),
            after: "Hi.".into(),
            ..Default::default()
        };
        let run = gw::Run {
            run_id: "r1".into(),
            kind: gw::PipelineKind::TargetedRefinement as i32,
            state: gw::RunState::Succeeded as i32,
            result: Some(gw::RunResult {
                result: Some(gw::run_result::Result::TargetedRefinement(gw::TargetedRefinementResult {
                    self_refined: vec![entry.clone()],
                    ..Default::default()
                })),
                error: String::new(),
            }),
            ..Default::default()
        };
        let v = run_detail_json(&run);
        assert_eq!(v["targeted_refinement"]["self_refined"][0]["target"], "intro");
        assert_eq!(v["targeted_refinement"]["self_refined"][0]["skipped"], "too_short");
        let debate = gw::Run {
            kind: gw::PipelineKind::Debate as i32,
            result: Some(gw::RunResult {
                result: Some(gw::run_result::Result::Debate(gw::DebateRunResult {
                    problems: vec![
                        gw::DebateProblemResult { id: "p1".into(), ..Default::default() },
                        gw::DebateProblemResult {
                            id: "p2".into(),
                            self_refined: Some(gw::SelfRefined { target: "p2".into(), ..entry.clone() }),
                            ..Default::default()
                        },
                    ],
                    ..Default::default()
                })),
                error: String::new(),
            }),
            ..run
        };
        let v = run_detail_json(&debate);
        assert_eq!(v["debate"]["self_refined"].as_array().map(Vec::len), Some(1));
        assert_eq!(v["debate"]["self_refined"][0]["target"], "p2");
        let event = gw::RunEvent {
            run_id: "r1".into(),
            sequence: 9,
            event: Some(gw::run_event::Event::SelfRefined(entry)),
            ..Default::default()
        };
        assert_eq!(event_json(&event)["event"], "self_refined");
        assert_eq!(watch_line(&event, false), "#9 self-refine intro (original): skipped: too_short");
    }

    #[test]
    fn control_requests_carry_the_action_actor_and_reason() {
        let who = Who { actor: Some("alice".into()), reason: Some("fix the dates".into()) };
        let edit = Verb::Edit { section_id: "intro".into(), content: EditContent::Text("New text.".into()) };
        let r = control_request("run-1".into(), edit, who).unwrap();
        assert_eq!((r.actor.as_str(), r.reason.as_str()), ("alice", "fix the dates"));
        assert_eq!(
            r.action,
            Some(gw::control_run_request::Action::EditSection(gw::EditSection {
                section_id: "intro".into(),
                content: "New text.".into()
            }))
        );
        let r = control_request("run-1".into(), Verb::Review, Who::default()).unwrap();
        assert_eq!(r.reason, "assay runs review");
        assert!(!r.actor.is_empty());
        let blank = Verb::Edit { section_id: "intro".into(), content: EditContent::Text("  ".into()) };
        assert!(control_request("run-1".into(), blank, Who::default()).unwrap_err().contains("must not be empty"));
        let missing = Verb::Edit { section_id: "intro".into(), content: EditContent::File("/no/such/file".into()) };
        assert!(control_request("run-1".into(), missing, Who::default()).unwrap_err().starts_with("/no/such/file"));
    }
}
