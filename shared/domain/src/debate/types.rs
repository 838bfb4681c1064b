//! The debate's limits, defaults, types and stage trait.

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::Usage;
use crate::document::Severity;
use crate::error::StageError;
use crate::model::{ModelRecord, ModelSpec};
use crate::stage::EventSink;

/// Configuration phase of the solutions (stage 1).
pub const SOLVER_PHASE: &str = "debate_solver";
/// Configuration phase of the peer reviews (stage 2).
pub const REVIEWER_PHASE: &str = "debate_reviewer";
/// Configuration phase of the refinements (stage 3).
pub const REFINER_PHASE: &str = "debate_refiner";
/// Configuration phase of the judge (stage 4).
pub const JUDGE_PHASE: &str = "debate_judge";

/// Solvers of a debate.
pub const SOLVERS: usize = 3;
/// Reviews of one round: every solver reviews the other two.
pub const REVIEWS: usize = SOLVERS * (SOLVERS - 1);
/// Temperatures of the default solvers, one each.
pub const DEFAULT_SOLVER_TEMPERATURES: [f64; SOLVERS] = [0.2, 0.5, 0.8];
/// Personas of the default solvers (and of given solvers without one), by position.
pub const DEFAULT_PERSONAS: [&str; SOLVERS] = [
    "a careful analyst who works step by step and double-checks every calculation",
    "a creative problem solver who looks for an elegant or unconventional approach and then verifies it",
    "a skeptical verifier who questions every assumption and tests the answer against all the problem's conditions",
];
/// Temperature of the judge when neither the request nor the configuration sets one.
pub const DEFAULT_JUDGE_TEMPERATURE: f64 = 0.0;

/// Longest problem, bytes.
pub const MAX_PROBLEM_BYTES: usize = 32 * 1024;
/// Longest persona, bytes.
pub const MAX_PERSONA_BYTES: usize = 2 * 1024;
/// Longest text of an artifact given back in a request (a step, an answer, a critique...), bytes.
pub const MAX_ARTIFACT_TEXT_BYTES: usize = 16 * 1024;
/// Most entries of an artifact's list (steps, strengths, errors...).
pub const MAX_ARTIFACT_ITEMS: usize = 64;
/// Longest raw model reply kept with an artifact, bytes: a longer reply keeps its first
/// `MAX_RAW_REPLY_BYTES` (cut on a character boundary) and its full length. 16 KiB holds every reply
/// the reply schemas allow at their usual sizes; with at most [`MAX_RAW_REPLIES`] per artifact a
/// one-round debate (13 artifacts) keeps at most 416 KiB of raw text.
pub const MAX_RAW_REPLY_BYTES: usize = 16 * 1024;
/// Raw replies kept per artifact: the first call's and its one retry's.
pub const MAX_RAW_REPLIES: usize = 2;
/// Longest finish reason of a raw reply, bytes.
pub const MAX_FINISH_REASON_BYTES: usize = 64;
/// Most review/refine rounds.
pub const MAX_ROUNDS: u32 = 5;
/// Rounds when the request sets none.
pub const DEFAULT_ROUNDS: u32 = 1;

/// One debater.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Solver {
    pub id: String,
    pub persona: String,
    /// Used for the solver's solution, its reviews and its refinement.
    pub model: ModelSpec,
}

/// Id of the solver at `index` when the caller gave none.
pub fn default_solver_id(index: usize) -> String {
    format!("solver_{}", index + 1)
}

/// The three default solvers: one model (the phases' configuration) at three temperatures, three
/// personas.
pub fn default_solvers() -> Vec<Solver> {
    (0..SOLVERS)
        .map(|i| Solver {
            id: default_solver_id(i),
            persona: DEFAULT_PERSONAS[i].to_string(),
            model: ModelSpec { temperature: Some(DEFAULT_SOLVER_TEMPERATURES[i]), ..ModelSpec::default() },
        })
        .collect()
}

/// The solvers a stage runs with: the given ones with empty ids and personas filled by position,
/// or, when none are given, the defaults, named after `ids` when it holds [`SOLVERS`] distinct
/// non-empty ids (the solver ids of the solutions a later stage gets).
pub fn solvers_or_default(solvers: Vec<Solver>, ids: &[&str]) -> Vec<Solver> {
    if solvers.is_empty() {
        let mut out = default_solvers();
        let distinct: BTreeSet<&str> = ids.iter().copied().filter(|s| !s.trim().is_empty()).collect();
        if ids.len() == SOLVERS && distinct.len() == SOLVERS {
            for (s, id) in out.iter_mut().zip(ids) {
                s.id = (*id).to_string();
            }
        }
        return out;
    }
    solvers
        .into_iter()
        .enumerate()
        .map(|(i, mut s)| {
            if s.id.trim().is_empty() {
                s.id = default_solver_id(i);
            }
            if s.persona.trim().is_empty() {
                s.persona = DEFAULT_PERSONAS.get(i).unwrap_or(&DEFAULT_PERSONAS[0]).to_string();
            }
            s
        })
        .collect()
}

/// Temperature of solver `index` for `spec`: the spec's, else the phase's configured one, else
/// the default solver's.
pub fn solver_temperature(spec: &ModelSpec, configured: Option<f64>, index: usize) -> f64 {
    spec.temperature.or(configured).unwrap_or(DEFAULT_SOLVER_TEMPERATURES[index % SOLVERS])
}

/// One model reply exactly as the backend returned it (bounded by [`MAX_RAW_REPLY_BYTES`]), kept
/// with the artifact it produced so a user can see what the model said when parsing dropped,
/// capped or rejected something.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct RawReply {
    /// The reply's text, its first [`MAX_RAW_REPLY_BYTES`] when longer.
    pub text: String,
    /// The whole reply's length in bytes.
    pub bytes: u64,
    /// Why the backend stopped ("stop", "length", ...).
    pub finish_reason: String,
    /// Why the reply could not be used; empty when it was used.
    pub unusable_reason: String,
}

impl RawReply {
    /// `text` kept up to [`MAX_RAW_REPLY_BYTES`] (and `finish_reason` up to
    /// [`MAX_FINISH_REASON_BYTES`]), with its full length.
    pub fn new(text: &str, finish_reason: &str) -> Self {
        RawReply {
            text: head(text, MAX_RAW_REPLY_BYTES).to_string(),
            bytes: text.len() as u64,
            finish_reason: head(finish_reason, MAX_FINISH_REASON_BYTES).to_string(),
            unusable_reason: String::new(),
        }
    }

    /// The same reply marked unusable for `reason` (kept up to [`MAX_ARTIFACT_TEXT_BYTES`]).
    pub fn unusable(self, reason: &str) -> Self {
        RawReply { unusable_reason: head(reason, MAX_ARTIFACT_TEXT_BYTES).to_string(), ..self }
    }

    /// Whether the text was cut to [`MAX_RAW_REPLY_BYTES`].
    pub fn truncated(&self) -> bool {
        self.bytes > self.text.len() as u64
    }
}

/// The first `max` bytes of `s`, cut on a character boundary.
pub fn head(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// A solution (stage 1).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Solution {
    pub solver_id: String,
    pub reasoning_steps: Vec<String>,
    pub final_answer: String,
    pub approach: String,
    /// In [0, 1], as stated by the solver.
    pub confidence: f64,
    pub model: Option<ModelRecord>,
    /// The model's replies behind it: the first call's, then the retry's (at most
    /// [`MAX_RAW_REPLIES`]).
    #[serde(default)]
    pub raw_replies: Vec<RawReply>,
}

/// An error a reviewer found.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct SolutionError {
    pub location: String,
    pub error_type: String,
    /// `None` when the reviewer gave no known severity (kept, not guessed).
    pub severity: Option<Severity>,
    pub description: String,
}

/// One solver's review of another's solution (stage 2).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Review {
    pub reviewer_id: String,
    pub target_solver_id: String,
    pub strengths: Vec<String>,
    pub weaknesses: Vec<String>,
    pub errors: Vec<SolutionError>,
    pub suggested_changes: Vec<String>,
    pub model: Option<ModelRecord>,
    /// The model's replies behind it (see [`Solution::raw_replies`]).
    #[serde(default)]
    pub raw_replies: Vec<RawReply>,
}

/// A critique the solver rejected, with its reason.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RejectedCritique {
    pub critique: String,
    pub reason: String,
}

/// A refined solution (stage 3).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RefinedSolution {
    pub solver_id: String,
    pub critiques_accepted: Vec<String>,
    pub critiques_rejected: Vec<RejectedCritique>,
    pub refinement_reasoning: String,
    pub reasoning_steps: Vec<String>,
    pub final_answer: String,
    pub confidence: f64,
    /// The solver's own statement that its answer changed.
    pub changed: bool,
    pub improvement_explanation: String,
    pub model: Option<ModelRecord>,
    /// The model's replies behind it (see [`Solution::raw_replies`]).
    #[serde(default)]
    pub raw_replies: Vec<RawReply>,
}

/// Stage 1.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SolveRequest {
    pub problem: String,
    /// Empty: [`default_solvers`]; else exactly [`SOLVERS`].
    pub solvers: Vec<Solver>,
}

/// Stage 1 result: solutions in solver order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct SolveOutcome {
    pub solutions: Vec<Solution>,
    pub usage: Usage,
}

/// Stage 2.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ReviewRequest {
    pub problem: String,
    pub solvers: Vec<Solver>,
    /// One per solver.
    pub solutions: Vec<Solution>,
}

/// Stage 2 result: reviews by reviewer (solver order), then target (solver order).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ReviewOutcome {
    pub reviews: Vec<Review>,
    pub usage: Usage,
}

/// Stage 3.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RefineRequest {
    pub problem: String,
    pub solvers: Vec<Solver>,
    /// One per solver.
    pub solutions: Vec<Solution>,
    /// Exactly the two reviews about each solver, from the other two.
    pub reviews: Vec<Review>,
}

/// Stage 3 result: refined solutions in solver order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RefineOutcome {
    pub refined: Vec<RefinedSolution>,
    pub usage: Usage,
}

/// Stage 4.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct JudgeRequest {
    pub problem: String,
    pub solutions: Vec<Solution>,
    pub reviews: Vec<Review>,
    pub refined: Vec<RefinedSolution>,
    pub judge_model: ModelSpec,
}

/// Stage 4 result.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Judgment {
    pub winner_solver_id: String,
    pub confidence: f64,
    pub reasoning: String,
    /// The winner's refined answer.
    pub final_answer: String,
    /// The judge's replies could not be used after one retry; the winner is the majority vote.
    pub majority_vote_fallback: bool,
    /// With the fallback: why the judge's replies could not be used.
    pub fallback_reason: String,
    pub usage: Usage,
    pub model: Option<ModelRecord>,
    /// The judge's replies (see [`Solution::raw_replies`]); with the fallback, both unusable ones.
    #[serde(default)]
    pub raw_replies: Vec<RawReply>,
}

/// A whole debate.
#[derive(Debug, Clone, PartialEq)]
pub struct DebateRequest {
    pub problem: String,
    pub solvers: Vec<Solver>,
    pub judge_model: ModelSpec,
    /// 1 to [`MAX_ROUNDS`].
    pub rounds: u32,
    pub early_stop_on_agreement: bool,
}

impl Default for DebateRequest {
    fn default() -> Self {
        Self {
            problem: String::new(),
            solvers: Vec::new(),
            judge_model: ModelSpec::default(),
            rounds: DEFAULT_ROUNDS,
            early_stop_on_agreement: false,
        }
    }
}

/// One review/refine round.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct DebateRound {
    /// 1-based.
    pub round: u32,
    pub reviews: Vec<Review>,
    pub refined: Vec<RefinedSolution>,
    /// The refined answers agree after normalisation.
    pub consensus: bool,
}

/// How the final answer was decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum Decision {
    /// The judge picked the winner.
    #[default]
    Judge,
    /// The judge's replies could not be used: majority vote over the refined answers.
    MajorityVote,
    /// The solvers agreed before any review: no judge.
    Consensus,
}

/// A debate's result with every stage's artifacts.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct DebateOutcome {
    pub solutions: Vec<Solution>,
    /// Every round run, in order.
    pub rounds: Vec<DebateRound>,
    /// `None` when no judge was called.
    pub judgment: Option<Judgment>,
    pub final_answer: String,
    pub winner_solver_id: String,
    pub decided_by: Decision,
    /// The final answers agree after normalisation.
    pub consensus: bool,
    /// Some solver's final answer differs from its original one after normalisation.
    pub answers_changed: bool,
    /// Rounds were skipped because the solvers agreed.
    pub stopped_early: bool,
    pub usage: Usage,
}

impl DebateOutcome {
    /// The last round's reviews (what the judge saw); empty without rounds.
    pub fn last_reviews(&self) -> &[Review] {
        self.rounds.last().map_or(&[], |r| &r.reviews)
    }

    /// The last round's refined solutions; empty without rounds.
    pub fn last_refined(&self) -> &[RefinedSolution] {
        self.rounds.last().map_or(&[], |r| &r.refined)
    }
}

/// A debate stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DebateStage {
    Solve,
    Review,
    Refine,
    Judge,
}

impl DebateStage {
    pub fn as_str(self) -> &'static str {
        match self {
            DebateStage::Solve => "solve",
            DebateStage::Review => "review",
            DebateStage::Refine => "refine",
            DebateStage::Judge => "judge",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "solve" => Some(DebateStage::Solve),
            "review" => Some(DebateStage::Review),
            "refine" => Some(DebateStage::Refine),
            "judge" => Some(DebateStage::Judge),
            _ => None,
        }
    }
}

/// What a finished stage produced (only the part of its stage is filled).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct StageArtifacts {
    pub solutions: Vec<Solution>,
    pub reviews: Vec<Review>,
    pub refined: Vec<RefinedSolution>,
    pub judgment: Option<Judgment>,
    /// solve and refine: the answers agree after normalisation.
    pub consensus: bool,
    pub usage: Usage,
}

/// Progress of a debate.
#[derive(Debug, Clone, PartialEq)]
pub enum DebateEvent {
    /// `round`: 0 for solve, the 1-based round for review and refine, the rounds run for judge.
    StageCompleted { stage: DebateStage, round: u32, artifacts: StageArtifacts },
}

/// The debate stage.
#[async_trait::async_trait]
pub trait Debate: Send + Sync {
    /// Stage 1: every solver solves independently.
    async fn solve(&self, request: SolveRequest) -> Result<SolveOutcome, StageError>;
    /// Stage 2: every solver reviews the other two.
    async fn review(&self, request: ReviewRequest) -> Result<ReviewOutcome, StageError>;
    /// Stage 3: every solver refines with the two reviews about it.
    async fn refine(&self, request: RefineRequest) -> Result<RefineOutcome, StageError>;
    /// Stage 4: the judge picks the winner.
    async fn judge(&self, request: JudgeRequest) -> Result<Judgment, StageError>;
    /// All stages, with an event as each one finishes.
    async fn run_debate(
        &self,
        request: DebateRequest,
        events: EventSink<'_, DebateEvent>,
    ) -> Result<DebateOutcome, StageError>;
}
