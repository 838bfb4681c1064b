//! Request checks. Field paths are relative to `prefix` (may be empty).

use std::collections::BTreeSet;

use crate::error::{StageError, Violations};
use crate::limits::MAX_ID_BYTES;

use super::types::*;

fn path(prefix: &str, name: &str) -> String {
    if prefix.is_empty() { name.to_string() } else { format!("{prefix}.{name}") }
}

pub(super) fn check_text(text: &str, field: &str, max: usize, v: &mut Violations) {
    if text.len() > max {
        v.push(field, format!("is {} bytes; the limit is {max} bytes", text.len()));
    }
}

pub(super) fn check_list(items: &[String], field: &str, v: &mut Violations) {
    if items.len() > MAX_ARTIFACT_ITEMS {
        v.push(field, format!("has {} entries; the limit is {MAX_ARTIFACT_ITEMS}", items.len()));
    }
    for (i, t) in items.iter().enumerate() {
        check_text(t, &format!("{field}[{i}]"), MAX_ARTIFACT_TEXT_BYTES, v);
    }
}

pub(super) fn check_confidence(x: f64, field: &str, v: &mut Violations) {
    if !x.is_finite() || !(0.0..=1.0).contains(&x) {
        v.push(field, format!("must be in [0, 1] (got {x})"));
    }
}

/// The problem: non-blank, at most [`MAX_PROBLEM_BYTES`].
pub fn check_problem(problem: &str, prefix: &str, v: &mut Violations) {
    let f = path(prefix, "problem");
    if problem.trim().is_empty() {
        v.push(f, "must not be empty");
    } else {
        check_text(problem, &f, MAX_PROBLEM_BYTES, v);
    }
}

/// Solvers: none (the defaults) or exactly [`SOLVERS`], ids unique, personas bounded.
pub fn check_solvers(solvers: &[Solver], prefix: &str, v: &mut Violations) {
    let f = path(prefix, "solvers");
    if !solvers.is_empty() && solvers.len() != SOLVERS {
        v.push(
            &f,
            format!("has {} solvers; a debate needs exactly {SOLVERS} (or none for the defaults)", solvers.len()),
        );
    }
    let mut ids = BTreeSet::new();
    for (i, s) in solvers.iter().enumerate() {
        let id = if s.id.trim().is_empty() { default_solver_id(i) } else { s.id.clone() };
        if s.id.len() > MAX_ID_BYTES {
            v.push(format!("{f}[{i}].id"), format!("is {} bytes; the limit is {MAX_ID_BYTES}", s.id.len()));
        } else if !ids.insert(id.clone()) {
            v.push(format!("{f}[{i}].id"), format!("duplicate solver id {id:?}"));
        }
        check_text(&s.persona, &format!("{f}[{i}].persona"), MAX_PERSONA_BYTES, v);
    }
}

/// At most [`MAX_RAW_REPLIES`] raw replies, each within its bounds.
pub(super) fn check_raw_replies(replies: &[RawReply], field: &str, v: &mut Violations) {
    let f = format!("{field}.raw_replies");
    if replies.len() > MAX_RAW_REPLIES {
        v.push(&f, format!("has {} entries; the limit is {MAX_RAW_REPLIES}", replies.len()));
    }
    for (i, r) in replies.iter().enumerate() {
        check_text(&r.text, &format!("{f}[{i}].text"), MAX_RAW_REPLY_BYTES, v);
        check_text(&r.finish_reason, &format!("{f}[{i}].finish_reason"), MAX_FINISH_REASON_BYTES, v);
        check_text(&r.unusable_reason, &format!("{f}[{i}].unusable_reason"), MAX_ARTIFACT_TEXT_BYTES, v);
    }
}

pub(super) fn check_solution(s: &Solution, field: &str, v: &mut Violations) {
    check_text(&s.solver_id, &format!("{field}.solver_id"), MAX_ID_BYTES, v);
    check_list(&s.reasoning_steps, &format!("{field}.reasoning_steps"), v);
    if s.final_answer.trim().is_empty() {
        v.push(format!("{field}.final_answer"), "must not be empty");
    }
    check_text(&s.final_answer, &format!("{field}.final_answer"), MAX_ARTIFACT_TEXT_BYTES, v);
    check_text(&s.approach, &format!("{field}.approach"), MAX_ARTIFACT_TEXT_BYTES, v);
    check_confidence(s.confidence, &format!("{field}.confidence"), v);
    check_raw_replies(&s.raw_replies, field, v);
}

pub(super) fn check_review(r: &Review, field: &str, v: &mut Violations) {
    check_list(&r.strengths, &format!("{field}.strengths"), v);
    check_list(&r.weaknesses, &format!("{field}.weaknesses"), v);
    check_list(&r.suggested_changes, &format!("{field}.suggested_changes"), v);
    if r.errors.len() > MAX_ARTIFACT_ITEMS {
        v.push(format!("{field}.errors"), format!("has {} entries; the limit is {MAX_ARTIFACT_ITEMS}", r.errors.len()));
    }
    for (i, e) in r.errors.iter().enumerate() {
        for (name, t) in [("location", &e.location), ("error_type", &e.error_type), ("description", &e.description)] {
            check_text(t, &format!("{field}.errors[{i}].{name}"), MAX_ARTIFACT_TEXT_BYTES, v);
        }
    }
    check_raw_replies(&r.raw_replies, field, v);
}

pub(super) fn check_refined(r: &RefinedSolution, field: &str, v: &mut Violations) {
    check_list(&r.critiques_accepted, &format!("{field}.critiques_accepted"), v);
    check_list(&r.reasoning_steps, &format!("{field}.reasoning_steps"), v);
    if r.critiques_rejected.len() > MAX_ARTIFACT_ITEMS {
        v.push(
            format!("{field}.critiques_rejected"),
            format!("has {} entries; the limit is {MAX_ARTIFACT_ITEMS}", r.critiques_rejected.len()),
        );
    }
    for (i, c) in r.critiques_rejected.iter().enumerate() {
        check_text(&c.critique, &format!("{field}.critiques_rejected[{i}].critique"), MAX_ARTIFACT_TEXT_BYTES, v);
        check_text(&c.reason, &format!("{field}.critiques_rejected[{i}].reason"), MAX_ARTIFACT_TEXT_BYTES, v);
    }
    if r.final_answer.trim().is_empty() {
        v.push(format!("{field}.final_answer"), "must not be empty");
    }
    for (name, t) in [
        ("final_answer", &r.final_answer),
        ("refinement_reasoning", &r.refinement_reasoning),
        ("improvement_explanation", &r.improvement_explanation),
    ] {
        check_text(t, &format!("{field}.{name}"), MAX_ARTIFACT_TEXT_BYTES, v);
    }
    check_confidence(r.confidence, &format!("{field}.confidence"), v);
    check_raw_replies(&r.raw_replies, field, v);
}

/// One solution per solver in `ids`: a solver without one, a solution of an unknown solver and a
/// second solution of a solver are named. Empty `solutions` is a missing stage, checked by
/// [`require_stage`].
pub(super) fn check_solution_set(solutions: &[Solution], ids: &[String], prefix: &str, v: &mut Violations) {
    let f = path(prefix, "solutions");
    let mut seen = BTreeSet::new();
    for (i, s) in solutions.iter().enumerate() {
        check_solution(s, &format!("{f}[{i}]"), v);
        if !ids.contains(&s.solver_id) {
            v.push(
                format!("{f}[{i}].solver_id"),
                format!("{:?} is not one of the solvers ({})", s.solver_id, ids.join(", ")),
            );
        } else if !seen.insert(s.solver_id.as_str()) {
            v.push(format!("{f}[{i}].solver_id"), format!("a second solution of solver {:?}", s.solver_id));
        }
    }
    if !solutions.is_empty() {
        for id in ids.iter().filter(|id| !seen.contains(id.as_str())) {
            v.push(&f, format!("has no solution of solver {id:?}"));
        }
    }
}

/// Exactly one review of every solver by each of the other two.
pub(super) fn check_review_set(reviews: &[Review], ids: &[String], prefix: &str, v: &mut Violations) {
    let f = path(prefix, "reviews");
    let mut seen = BTreeSet::new();
    for (i, r) in reviews.iter().enumerate() {
        let rf = format!("{f}[{i}]");
        check_review(r, &rf, v);
        let known = |id: &str| ids.iter().any(|k| k == id);
        if !known(&r.reviewer_id) {
            v.push(
                format!("{rf}.reviewer_id"),
                format!("{:?} is not one of the solvers ({})", r.reviewer_id, ids.join(", ")),
            );
        } else if !known(&r.target_solver_id) {
            v.push(
                format!("{rf}.target_solver_id"),
                format!("{:?} is not one of the solvers ({})", r.target_solver_id, ids.join(", ")),
            );
        } else if r.reviewer_id == r.target_solver_id {
            v.push(format!("{rf}.target_solver_id"), format!("solver {:?} reviews itself", r.reviewer_id));
        } else if !seen.insert((r.reviewer_id.as_str(), r.target_solver_id.as_str())) {
            v.push(rf.clone(), format!("a second review of {:?} by {:?}", r.target_solver_id, r.reviewer_id));
        }
    }
    if !reviews.is_empty() {
        for target in ids {
            let missing: Vec<&str> = ids
                .iter()
                .filter(|r| *r != target && !seen.contains(&(r.as_str(), target.as_str())))
                .map(String::as_str)
                .collect();
            if !missing.is_empty() {
                v.push(
                    &f,
                    format!(
                        "solver {target:?} needs the reviews of the other two solvers; missing the review by {}",
                        missing.join(" and ")
                    ),
                );
            }
        }
    }
}

/// One refined solution per solver in `ids`.
pub(super) fn check_refined_set(refined: &[RefinedSolution], ids: &[String], prefix: &str, v: &mut Violations) {
    let f = path(prefix, "refined");
    let mut seen = BTreeSet::new();
    for (i, r) in refined.iter().enumerate() {
        check_refined(r, &format!("{f}[{i}]"), v);
        if !ids.contains(&r.solver_id) {
            v.push(
                format!("{f}[{i}].solver_id"),
                format!("{:?} is not one of the solvers ({})", r.solver_id, ids.join(", ")),
            );
        } else if !seen.insert(r.solver_id.as_str()) {
            v.push(format!("{f}[{i}].solver_id"), format!("a second refined solution of solver {:?}", r.solver_id));
        }
    }
    if !refined.is_empty() {
        for id in ids.iter().filter(|id| !seen.contains(id.as_str())) {
            v.push(&f, format!("has no refined solution of solver {id:?}"));
        }
    }
}

/// FAILED_PRECONDITION when an earlier stage's artifacts are missing altogether.
fn require_stage(missing: &[(bool, &str, &str)], prefix: &str) -> Result<(), StageError> {
    let named: Vec<String> = missing
        .iter()
        .filter(|(absent, _, _)| *absent)
        .map(|(_, field, stage)| format!("{} is empty: run {stage} first", path(prefix, field)))
        .collect();
    if named.is_empty() { Ok(()) } else { Err(StageError::FailedPrecondition(named.join("; "))) }
}

/// Ids of the solvers as the stage will run them (defaults filled).
fn solver_ids(solvers: &[Solver]) -> Vec<String> {
    solvers.iter().map(|s| s.id.clone()).collect()
}

/// Ids of `solutions` in order (for the default solvers' names).
pub fn solution_ids(solutions: &[Solution]) -> Vec<&str> {
    solutions.iter().map(|s| s.solver_id.as_str()).collect()
}

impl SolveRequest {
    /// Every violation; then the request with its solvers filled.
    pub fn checked(self, prefix: &str) -> Result<SolveRequest, StageError> {
        let mut v = Violations::new();
        check_problem(&self.problem, prefix, &mut v);
        check_solvers(&self.solvers, prefix, &mut v);
        v.into_result()?;
        Ok(SolveRequest { solvers: solvers_or_default(self.solvers, &[]), ..self })
    }
}

impl ReviewRequest {
    /// Every violation, then a missing stage 1 (FAILED_PRECONDITION); the request with its solvers
    /// filled.
    pub fn checked(self, prefix: &str) -> Result<ReviewRequest, StageError> {
        let mut v = Violations::new();
        check_problem(&self.problem, prefix, &mut v);
        check_solvers(&self.solvers, prefix, &mut v);
        v.into_result()?;
        let solvers = solvers_or_default(self.solvers, &solution_ids(&self.solutions));
        let ids = solver_ids(&solvers);
        let mut v = Violations::new();
        check_solution_set(&self.solutions, &ids, prefix, &mut v);
        v.into_result()?;
        require_stage(&[(self.solutions.is_empty(), "solutions", "Solve (stage 1)")], prefix)?;
        Ok(ReviewRequest { solvers, ..self })
    }
}

impl RefineRequest {
    /// Every violation (a solver without its solution or without exactly its two reviews is
    /// named), then missing stages (FAILED_PRECONDITION); the request with its solvers filled.
    pub fn checked(self, prefix: &str) -> Result<RefineRequest, StageError> {
        let mut v = Violations::new();
        check_problem(&self.problem, prefix, &mut v);
        check_solvers(&self.solvers, prefix, &mut v);
        v.into_result()?;
        let solvers = solvers_or_default(self.solvers, &solution_ids(&self.solutions));
        let ids = solver_ids(&solvers);
        let mut v = Violations::new();
        check_solution_set(&self.solutions, &ids, prefix, &mut v);
        check_review_set(&self.reviews, &ids, prefix, &mut v);
        v.into_result()?;
        require_stage(
            &[
                (self.solutions.is_empty(), "solutions", "Solve (stage 1)"),
                (self.reviews.is_empty(), "reviews", "Review (stage 2)"),
            ],
            prefix,
        )?;
        Ok(RefineRequest { solvers, ..self })
    }
}

impl JudgeRequest {
    /// Every violation: three solutions, their six reviews and three refined solutions of the same
    /// solvers; missing stages are FAILED_PRECONDITION.
    pub fn checked(self, prefix: &str) -> Result<JudgeRequest, StageError> {
        let mut v = Violations::new();
        check_problem(&self.problem, prefix, &mut v);
        let ids: Vec<String> = self.solutions.iter().map(|s| s.solver_id.clone()).collect();
        if !self.solutions.is_empty() && self.solutions.len() != SOLVERS {
            v.push(
                path(prefix, "solutions"),
                format!("has {} solutions; a debate has exactly {SOLVERS}", self.solutions.len()),
            );
        }
        for (i, s) in self.solutions.iter().enumerate() {
            if s.solver_id.trim().is_empty() {
                v.push(path(prefix, &format!("solutions[{i}].solver_id")), "must not be empty");
            }
        }
        v.into_result()?;
        let mut v = Violations::new();
        check_solution_set(&self.solutions, &ids, prefix, &mut v);
        if !self.solutions.is_empty() {
            check_review_set(&self.reviews, &ids, prefix, &mut v);
            check_refined_set(&self.refined, &ids, prefix, &mut v);
        }
        v.into_result()?;
        require_stage(
            &[
                (self.solutions.is_empty(), "solutions", "Solve (stage 1)"),
                (self.reviews.is_empty(), "reviews", "Review (stage 2)"),
                (self.refined.is_empty(), "refined", "RefineSolutions (stage 3)"),
            ],
            prefix,
        )?;
        Ok(self)
    }
}

impl DebateRequest {
    /// Every violation; then the request with its solvers filled.
    pub fn checked(self, prefix: &str) -> Result<DebateRequest, StageError> {
        let mut v = Violations::new();
        check_problem(&self.problem, prefix, &mut v);
        check_solvers(&self.solvers, prefix, &mut v);
        if self.rounds == 0 || self.rounds > MAX_ROUNDS {
            v.push(path(prefix, "rounds"), format!("must be between 1 and {MAX_ROUNDS} (got {})", self.rounds));
        }
        v.into_result()?;
        Ok(DebateRequest { solvers: solvers_or_default(self.solvers, &[]), ..self })
    }
}
