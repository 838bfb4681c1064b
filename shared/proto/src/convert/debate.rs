//! The debate service (`assay.debate.v1`): wire <-> domain. Incoming requests are checked field by
//! field with full paths (`solvers[1].model.temperature`, `reviews[3].target_solver_id`); missing
//! earlier stages are FAILED_PRECONDITION naming the field; outgoing conversions are infallible.

use assay_domain as d;
use assay_domain::Violations;
use assay_domain::debate as dd;

use super::document::severity_to;
use super::{enum_value, model_record_from, model_record_to, model_spec, model_spec_to, usage_from, usage_to};
use crate::common::v1 as common;
use crate::debate::v1 as pb;

fn join(prefix: &str, field: &str) -> String {
    if prefix.is_empty() { field.to_string() } else { format!("{prefix}.{field}") }
}

fn record_to(r: &Option<d::ModelRecord>) -> Option<common::ModelRecord> {
    r.as_ref().map(model_record_to)
}

fn record_from(r: Option<common::ModelRecord>) -> Option<d::ModelRecord> {
    r.map(|r| model_record_from(Some(r)))
}

// ---------------------------------------------------------------------------------------------
// Artifacts.

/// A raw reply; its bounds are checked with the artifact that carries it.
fn raw_reply(p: pb::RawReply) -> dd::RawReply {
    let pb::RawReply { text, bytes, finish_reason, unusable_reason } = p;
    dd::RawReply { text, bytes, finish_reason, unusable_reason }
}

fn raw_reply_to(r: &dd::RawReply) -> pb::RawReply {
    pb::RawReply {
        text: r.text.clone(),
        bytes: r.bytes,
        finish_reason: r.finish_reason.clone(),
        unusable_reason: r.unusable_reason.clone(),
    }
}

fn raw_replies(p: Vec<pb::RawReply>) -> Vec<dd::RawReply> {
    p.into_iter().map(raw_reply).collect()
}

fn raw_replies_to(r: &[dd::RawReply]) -> Vec<pb::RawReply> {
    r.iter().map(raw_reply_to).collect()
}

pub fn solver(p: pb::Solver, field: &str, v: &mut Violations) -> dd::Solver {
    let pb::Solver { id, persona, model } = p;
    dd::Solver { id, persona, model: model_spec(model, &format!("{field}.model"), v) }
}

pub fn solver_to(s: &dd::Solver) -> pb::Solver {
    pb::Solver { id: s.id.clone(), persona: s.persona.clone(), model: Some(model_spec_to(&s.model)) }
}

fn solvers(p: Vec<pb::Solver>, field: &str, v: &mut Violations) -> Vec<dd::Solver> {
    p.into_iter().enumerate().map(|(i, s)| solver(s, &format!("{field}[{i}]"), v)).collect()
}

/// A solution; its checks against the other artifacts are the domain's.
pub fn solution(p: pb::Solution) -> dd::Solution {
    let pb::Solution { solver_id, reasoning_steps, final_answer, approach, confidence, model, raw_replies: raw } = p;
    dd::Solution {
        solver_id,
        reasoning_steps,
        final_answer,
        approach,
        confidence,
        model: record_from(model),
        raw_replies: raw_replies(raw),
    }
}

pub fn solution_to(s: &dd::Solution) -> pb::Solution {
    pb::Solution {
        solver_id: s.solver_id.clone(),
        reasoning_steps: s.reasoning_steps.clone(),
        final_answer: s.final_answer.clone(),
        approach: s.approach.clone(),
        confidence: s.confidence,
        model: record_to(&s.model),
        raw_replies: raw_replies_to(&s.raw_replies),
    }
}

/// A reviewer's error; SEVERITY_UNSPECIFIED is a severity the reviewer did not give.
fn solution_error(p: pb::SolutionError, field: &str, v: &mut Violations) -> dd::SolutionError {
    let pb::SolutionError { location, error_type, severity, description } = p;
    let severity = match enum_value::<common::Severity>(
        severity,
        &format!("{field}.severity"),
        "0 unspecified, 1 critical, 2 major, 3 minor",
        v,
    ) {
        Some(common::Severity::Critical) => Some(d::Severity::Critical),
        Some(common::Severity::Major) => Some(d::Severity::Major),
        Some(common::Severity::Minor) => Some(d::Severity::Minor),
        Some(common::Severity::Unspecified) | None => None,
    };
    dd::SolutionError { location, error_type, severity, description }
}

fn solution_error_to(e: &dd::SolutionError) -> pb::SolutionError {
    pb::SolutionError {
        location: e.location.clone(),
        error_type: e.error_type.clone(),
        severity: e.severity.map_or(common::Severity::Unspecified, severity_to) as i32,
        description: e.description.clone(),
    }
}

pub fn review(p: pb::Review, field: &str, v: &mut Violations) -> dd::Review {
    let pb::Review {
        reviewer_id,
        target_solver_id,
        strengths,
        weaknesses,
        errors,
        suggested_changes,
        model,
        raw_replies: raw,
    } = p;
    dd::Review {
        reviewer_id,
        target_solver_id,
        strengths,
        weaknesses,
        errors: errors
            .into_iter()
            .enumerate()
            .map(|(i, e)| solution_error(e, &format!("{field}.errors[{i}]"), v))
            .collect(),
        suggested_changes,
        model: record_from(model),
        raw_replies: raw_replies(raw),
    }
}

pub fn review_to(r: &dd::Review) -> pb::Review {
    pb::Review {
        reviewer_id: r.reviewer_id.clone(),
        target_solver_id: r.target_solver_id.clone(),
        strengths: r.strengths.clone(),
        weaknesses: r.weaknesses.clone(),
        errors: r.errors.iter().map(solution_error_to).collect(),
        suggested_changes: r.suggested_changes.clone(),
        model: record_to(&r.model),
        raw_replies: raw_replies_to(&r.raw_replies),
    }
}

fn reviews(p: Vec<pb::Review>, field: &str, v: &mut Violations) -> Vec<dd::Review> {
    p.into_iter().enumerate().map(|(i, r)| review(r, &format!("{field}[{i}]"), v)).collect()
}

/// A review from a response (a severity our own server sent is always known).
fn review_from(p: pb::Review) -> dd::Review {
    review(p, "", &mut Violations::new())
}

pub fn refined(p: pb::RefinedSolution) -> dd::RefinedSolution {
    let pb::RefinedSolution {
        solver_id,
        critiques_accepted,
        critiques_rejected,
        refinement_reasoning,
        reasoning_steps,
        final_answer,
        confidence,
        changed,
        improvement_explanation,
        model,
        raw_replies: raw,
    } = p;
    dd::RefinedSolution {
        solver_id,
        critiques_accepted,
        critiques_rejected: critiques_rejected
            .into_iter()
            .map(|pb::RejectedCritique { critique, reason }| dd::RejectedCritique { critique, reason })
            .collect(),
        refinement_reasoning,
        reasoning_steps,
        final_answer,
        confidence,
        changed,
        improvement_explanation,
        model: record_from(model),
        raw_replies: raw_replies(raw),
    }
}

pub fn refined_to(r: &dd::RefinedSolution) -> pb::RefinedSolution {
    pb::RefinedSolution {
        solver_id: r.solver_id.clone(),
        critiques_accepted: r.critiques_accepted.clone(),
        critiques_rejected: r
            .critiques_rejected
            .iter()
            .map(|c| pb::RejectedCritique { critique: c.critique.clone(), reason: c.reason.clone() })
            .collect(),
        refinement_reasoning: r.refinement_reasoning.clone(),
        reasoning_steps: r.reasoning_steps.clone(),
        final_answer: r.final_answer.clone(),
        confidence: r.confidence,
        changed: r.changed,
        improvement_explanation: r.improvement_explanation.clone(),
        model: record_to(&r.model),
        raw_replies: raw_replies_to(&r.raw_replies),
    }
}

/// Conversion violations plus the cheap domain checks (problem, solvers), so one reply names every
/// bad field; the stage checks follow when these pass.
fn first_checks(v: &mut Violations, problem: &str, solvers: Option<&[dd::Solver]>, prefix: &str) {
    dd::check_problem(problem, prefix, v);
    if let Some(s) = solvers {
        dd::check_solvers(s, prefix, v);
    }
}

// ---------------------------------------------------------------------------------------------
// Stage 1: Solve.

/// Solve request from the wire, validated; no solvers means the three defaults.
pub fn solve_request(p: pb::SolveRequest, prefix: &str) -> Result<dd::SolveRequest, d::StageError> {
    let pb::SolveRequest { problem, solvers: s } = p;
    let mut v = Violations::new();
    let solvers = solvers(s, &join(prefix, "solvers"), &mut v);
    if !v.is_empty() {
        first_checks(&mut v, &problem, Some(&solvers), prefix);
        v.into_result()?;
    }
    dd::SolveRequest { problem, solvers }.checked(prefix)
}

pub fn solve_request_to(r: &dd::SolveRequest) -> pb::SolveRequest {
    pb::SolveRequest { problem: r.problem.clone(), solvers: r.solvers.iter().map(solver_to).collect() }
}

pub fn solve_response_to(o: &dd::SolveOutcome) -> pb::SolveResponse {
    pb::SolveResponse { solutions: o.solutions.iter().map(solution_to).collect(), usage: Some(usage_to(&o.usage)) }
}

pub fn solve_response_from(p: pb::SolveResponse) -> dd::SolveOutcome {
    let pb::SolveResponse { solutions, usage } = p;
    dd::SolveOutcome { solutions: solutions.into_iter().map(solution).collect(), usage: usage_from(usage) }
}

// ---------------------------------------------------------------------------------------------
// Stage 2: Review.

/// Review request from the wire, validated: one solution per solver (no solutions at all is
/// FAILED_PRECONDITION: Solve first).
pub fn review_request(p: pb::ReviewRequest, prefix: &str) -> Result<dd::ReviewRequest, d::StageError> {
    let pb::ReviewRequest { problem, solvers: s, solutions } = p;
    let mut v = Violations::new();
    let solvers = solvers(s, &join(prefix, "solvers"), &mut v);
    if !v.is_empty() {
        first_checks(&mut v, &problem, Some(&solvers), prefix);
        v.into_result()?;
    }
    dd::ReviewRequest { problem, solvers, solutions: solutions.into_iter().map(solution).collect() }.checked(prefix)
}

pub fn review_request_to(r: &dd::ReviewRequest) -> pb::ReviewRequest {
    pb::ReviewRequest {
        problem: r.problem.clone(),
        solvers: r.solvers.iter().map(solver_to).collect(),
        solutions: r.solutions.iter().map(solution_to).collect(),
    }
}

pub fn review_response_to(o: &dd::ReviewOutcome) -> pb::ReviewResponse {
    pb::ReviewResponse { reviews: o.reviews.iter().map(review_to).collect(), usage: Some(usage_to(&o.usage)) }
}

pub fn review_response_from(p: pb::ReviewResponse) -> dd::ReviewOutcome {
    let pb::ReviewResponse { reviews, usage } = p;
    dd::ReviewOutcome { reviews: reviews.into_iter().map(review_from).collect(), usage: usage_from(usage) }
}

// ---------------------------------------------------------------------------------------------
// Stage 3: RefineSolutions.

/// Refine request from the wire, validated: a solver without its solution or without exactly the
/// two reviews about it is named (INVALID_ARGUMENT); no solutions or no reviews at all is
/// FAILED_PRECONDITION.
pub fn refine_request(p: pb::RefineSolutionsRequest, prefix: &str) -> Result<dd::RefineRequest, d::StageError> {
    let pb::RefineSolutionsRequest { problem, solvers: s, solutions, reviews: r } = p;
    let mut v = Violations::new();
    let solvers = solvers(s, &join(prefix, "solvers"), &mut v);
    let reviews = reviews(r, &join(prefix, "reviews"), &mut v);
    if !v.is_empty() {
        first_checks(&mut v, &problem, Some(&solvers), prefix);
        v.into_result()?;
    }
    dd::RefineRequest { problem, solvers, solutions: solutions.into_iter().map(solution).collect(), reviews }
        .checked(prefix)
}

pub fn refine_request_to(r: &dd::RefineRequest) -> pb::RefineSolutionsRequest {
    pb::RefineSolutionsRequest {
        problem: r.problem.clone(),
        solvers: r.solvers.iter().map(solver_to).collect(),
        solutions: r.solutions.iter().map(solution_to).collect(),
        reviews: r.reviews.iter().map(review_to).collect(),
    }
}

pub fn refine_response_to(o: &dd::RefineOutcome) -> pb::RefineSolutionsResponse {
    pb::RefineSolutionsResponse { refined: o.refined.iter().map(refined_to).collect(), usage: Some(usage_to(&o.usage)) }
}

pub fn refine_response_from(p: pb::RefineSolutionsResponse) -> dd::RefineOutcome {
    let pb::RefineSolutionsResponse { refined: r, usage } = p;
    dd::RefineOutcome { refined: r.into_iter().map(refined).collect(), usage: usage_from(usage) }
}

// ---------------------------------------------------------------------------------------------
// Stage 4: JudgeDebate.

/// Judge request from the wire, validated: three solutions, their six reviews and three refined
/// solutions.
pub fn judge_request(p: pb::JudgeDebateRequest, prefix: &str) -> Result<dd::JudgeRequest, d::StageError> {
    let pb::JudgeDebateRequest { problem, solutions, reviews: r, refined: rf, judge_model } = p;
    let mut v = Violations::new();
    let reviews = reviews(r, &join(prefix, "reviews"), &mut v);
    let judge_model = model_spec(judge_model, &join(prefix, "judge_model"), &mut v);
    if !v.is_empty() {
        first_checks(&mut v, &problem, None, prefix);
        v.into_result()?;
    }
    dd::JudgeRequest {
        problem,
        solutions: solutions.into_iter().map(solution).collect(),
        reviews,
        refined: rf.into_iter().map(refined).collect(),
        judge_model,
    }
    .checked(prefix)
}

pub fn judge_request_to(r: &dd::JudgeRequest) -> pb::JudgeDebateRequest {
    pb::JudgeDebateRequest {
        problem: r.problem.clone(),
        solutions: r.solutions.iter().map(solution_to).collect(),
        reviews: r.reviews.iter().map(review_to).collect(),
        refined: r.refined.iter().map(refined_to).collect(),
        judge_model: Some(model_spec_to(&r.judge_model)),
    }
}

pub fn judgment_to(j: &dd::Judgment) -> pb::JudgeDebateResponse {
    pb::JudgeDebateResponse {
        winner_solver_id: j.winner_solver_id.clone(),
        confidence: j.confidence,
        reasoning: j.reasoning.clone(),
        final_answer: j.final_answer.clone(),
        majority_vote_fallback: j.majority_vote_fallback,
        usage: Some(usage_to(&j.usage)),
        model: record_to(&j.model),
        fallback_reason: j.fallback_reason.clone(),
        raw_replies: raw_replies_to(&j.raw_replies),
    }
}

pub fn judgment_from(p: pb::JudgeDebateResponse) -> dd::Judgment {
    let pb::JudgeDebateResponse {
        winner_solver_id,
        confidence,
        reasoning,
        final_answer,
        majority_vote_fallback,
        usage,
        model,
        fallback_reason,
        raw_replies: raw,
    } = p;
    dd::Judgment {
        winner_solver_id,
        confidence,
        reasoning,
        final_answer,
        majority_vote_fallback,
        fallback_reason,
        usage: usage_from(usage),
        model: record_from(model),
        raw_replies: raw_replies(raw),
    }
}

// ---------------------------------------------------------------------------------------------
// RunDebate / RunDebateStream.

/// Debate request from the wire, validated (field names relative to `prefix`, e.g. `request` in
/// RunDebateStream or the gateway's pipeline field). Unset rounds is one round.
pub fn run_debate_request(p: pb::RunDebateRequest, prefix: &str) -> Result<dd::DebateRequest, d::StageError> {
    let pb::RunDebateRequest { problem, solvers: s, judge_model, rounds, early_stop_on_agreement } = p;
    let mut v = Violations::new();
    let solvers = solvers(s, &join(prefix, "solvers"), &mut v);
    let judge_model = model_spec(judge_model, &join(prefix, "judge_model"), &mut v);
    if !v.is_empty() {
        first_checks(&mut v, &problem, Some(&solvers), prefix);
        v.into_result()?;
    }
    dd::DebateRequest {
        problem,
        solvers,
        judge_model,
        rounds: rounds.unwrap_or(dd::DEFAULT_ROUNDS),
        early_stop_on_agreement,
    }
    .checked(prefix)
}

pub fn run_debate_request_to(r: &dd::DebateRequest) -> pb::RunDebateRequest {
    pb::RunDebateRequest {
        problem: r.problem.clone(),
        solvers: r.solvers.iter().map(solver_to).collect(),
        judge_model: Some(model_spec_to(&r.judge_model)),
        rounds: Some(r.rounds),
        early_stop_on_agreement: r.early_stop_on_agreement,
    }
}

fn decision_to(d: dd::Decision) -> pb::DebateDecision {
    match d {
        dd::Decision::Judge => pb::DebateDecision::Judge,
        dd::Decision::MajorityVote => pb::DebateDecision::MajorityVote,
        dd::Decision::Consensus => pb::DebateDecision::Consensus,
    }
}

fn round_to(r: &dd::DebateRound) -> pb::DebateRound {
    pb::DebateRound {
        round: r.round,
        reviews: r.reviews.iter().map(review_to).collect(),
        refined: r.refined.iter().map(refined_to).collect(),
        consensus: r.consensus,
    }
}

fn round_from(p: pb::DebateRound) -> dd::DebateRound {
    let pb::DebateRound { round, reviews, refined: r, consensus } = p;
    dd::DebateRound {
        round,
        reviews: reviews.into_iter().map(review_from).collect(),
        refined: r.into_iter().map(refined).collect(),
        consensus,
    }
}

pub fn run_debate_response_to(o: &dd::DebateOutcome) -> pb::RunDebateResponse {
    pb::RunDebateResponse {
        solutions: o.solutions.iter().map(solution_to).collect(),
        reviews: o.last_reviews().iter().map(review_to).collect(),
        refined: o.last_refined().iter().map(refined_to).collect(),
        judgment: o.judgment.as_ref().map(judgment_to),
        final_answer: o.final_answer.clone(),
        consensus: o.consensus,
        answers_changed: o.answers_changed,
        stopped_early: o.stopped_early,
        usage: Some(usage_to(&o.usage)),
        rounds: o.rounds.iter().map(round_to).collect(),
        winner_solver_id: o.winner_solver_id.clone(),
        decided_by: decision_to(o.decided_by) as i32,
    }
}

/// A debate result from the wire. `rounds` is authoritative; a response with only the last
/// round's `reviews` / `refined` (no `rounds`) reads as one round. An unknown or unset decision is
/// read from the judgment.
pub fn run_debate_response_from(p: pb::RunDebateResponse) -> dd::DebateOutcome {
    let pb::RunDebateResponse {
        solutions,
        reviews,
        refined: r,
        judgment,
        final_answer,
        consensus,
        answers_changed,
        stopped_early,
        usage,
        rounds,
        winner_solver_id,
        decided_by,
    } = p;
    let mut rounds: Vec<dd::DebateRound> = rounds.into_iter().map(round_from).collect();
    if rounds.is_empty() && (!reviews.is_empty() || !r.is_empty()) {
        let refined: Vec<dd::RefinedSolution> = r.into_iter().map(refined).collect();
        let consensus = dd::answers_agree(refined.iter().map(|x| x.final_answer.as_str()));
        rounds.push(dd::DebateRound {
            round: 1,
            reviews: reviews.into_iter().map(review_from).collect(),
            refined,
            consensus,
        });
    }
    let judgment = judgment.map(judgment_from);
    let decided_by = match pb::DebateDecision::try_from(decided_by) {
        Ok(pb::DebateDecision::Judge) => dd::Decision::Judge,
        Ok(pb::DebateDecision::MajorityVote) => dd::Decision::MajorityVote,
        Ok(pb::DebateDecision::Consensus) => dd::Decision::Consensus,
        Ok(pb::DebateDecision::Unspecified) | Err(_) => match &judgment {
            Some(j) if j.majority_vote_fallback => dd::Decision::MajorityVote,
            Some(_) => dd::Decision::Judge,
            None => dd::Decision::Consensus,
        },
    };
    dd::DebateOutcome {
        solutions: solutions.into_iter().map(solution).collect(),
        rounds,
        judgment,
        final_answer,
        winner_solver_id,
        decided_by,
        consensus,
        answers_changed,
        stopped_early,
        usage: usage_from(usage),
    }
}

/// A finished stage on the wire.
pub fn stage_completed_to(e: &dd::DebateEvent) -> pb::DebateStageCompleted {
    match e {
        dd::DebateEvent::StageCompleted { stage, round, artifacts } => pb::DebateStageCompleted {
            stage: stage.as_str().to_string(),
            round: *round,
            solutions: artifacts.solutions.iter().map(solution_to).collect(),
            reviews: artifacts.reviews.iter().map(review_to).collect(),
            refined: artifacts.refined.iter().map(refined_to).collect(),
            judgment: artifacts.judgment.as_ref().map(judgment_to),
            consensus: artifacts.consensus,
            usage: Some(usage_to(&artifacts.usage)),
        },
    }
}

/// A finished stage from the wire; an unknown stage name is an error of the sender.
pub fn stage_completed_from(p: pb::DebateStageCompleted) -> Result<dd::DebateEvent, d::StageError> {
    let pb::DebateStageCompleted { stage, round, solutions, reviews, refined: r, judgment, consensus, usage } = p;
    let stage = dd::DebateStage::parse(&stage)
        .ok_or_else(|| d::StageError::Internal(format!("the debate service sent an unknown stage {stage:?}")))?;
    Ok(dd::DebateEvent::StageCompleted {
        stage,
        round,
        artifacts: dd::StageArtifacts {
            solutions: solutions.into_iter().map(solution).collect(),
            reviews: reviews.into_iter().map(review_from).collect(),
            refined: r.into_iter().map(refined).collect(),
            judgment: judgment.map(judgment_from),
            consensus,
            usage: usage_from(usage),
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn solution_pb(id: &str, answer: &str) -> pb::Solution {
        pb::Solution { solver_id: id.into(), final_answer: answer.into(), confidence: 0.5, ..Default::default() }
    }

    #[test]
    fn bad_fields_are_named_together() {
        let e = run_debate_request(
            pb::RunDebateRequest {
                problem: String::new(),
                solvers: vec![
                    pb::Solver {
                        model: Some(common::ModelSpec { temperature: Some(3.0), ..Default::default() }),
                        ..Default::default()
                    },
                    pb::Solver::default(),
                ],
                rounds: Some(9),
                ..Default::default()
            },
            "request",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("request.solvers[0].model.temperature"), "{e}");
        assert!(e.contains("request.problem: must not be empty"), "{e}");
        assert!(e.contains("request.solvers: has 2 solvers"), "{e}");
        let e =
            run_debate_request(pb::RunDebateRequest { problem: "p".into(), rounds: Some(0), ..Default::default() }, "")
                .unwrap_err()
                .to_string();
        assert!(e.contains("rounds: must be between 1 and 5 (got 0)"), "{e}");
    }

    #[test]
    fn a_review_request_without_solutions_is_a_precondition() {
        let e = review_request(pb::ReviewRequest { problem: "p".into(), ..Default::default() }, "").unwrap_err();
        assert!(matches!(e, d::StageError::FailedPrecondition(ref m) if m.contains("solutions is empty")), "{e}");
        let r = review_request(
            pb::ReviewRequest {
                problem: "p".into(),
                solutions: vec![solution_pb("a", "1"), solution_pb("b", "2"), solution_pb("c", "3")],
                ..Default::default()
            },
            "",
        )
        .unwrap();
        assert_eq!(r.solvers.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["a", "b", "c"]);
    }

    #[test]
    fn debate_results_round_trip() {
        let outcome = dd::DebateOutcome {
            solutions: vec![solution(solution_pb("a", "1"))],
            rounds: vec![dd::DebateRound {
                round: 1,
                reviews: vec![dd::Review {
                    reviewer_id: "a".into(),
                    target_solver_id: "b".into(),
                    errors: vec![dd::SolutionError { severity: None, ..Default::default() }],
                    ..Default::default()
                }],
                refined: vec![dd::RefinedSolution {
                    solver_id: "a".into(),
                    raw_replies: vec![dd::RawReply::new("{\"final_answer\": \"1\"}", "length")],
                    ..Default::default()
                }],
                consensus: true,
            }],
            judgment: Some(dd::Judgment {
                winner_solver_id: "a".into(),
                raw_replies: vec![dd::RawReply::new("{\"winner\": 7}", "stop").unusable("winner is not a solver id")],
                ..Default::default()
            }),
            final_answer: "1".into(),
            winner_solver_id: "a".into(),
            decided_by: dd::Decision::Judge,
            consensus: true,
            ..Default::default()
        };
        let wire = run_debate_response_to(&outcome);
        assert_eq!(wire.reviews.len(), 1);
        assert_eq!(run_debate_response_from(wire), outcome);
        let event = dd::DebateEvent::StageCompleted {
            stage: dd::DebateStage::Refine,
            round: 2,
            artifacts: dd::StageArtifacts { consensus: true, ..Default::default() },
        };
        assert_eq!(stage_completed_from(stage_completed_to(&event)).unwrap(), event);
    }
}
