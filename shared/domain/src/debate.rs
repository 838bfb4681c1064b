//! Multi-LLM debate (REFERENCE section 6): three solvers solve a problem independently, each
//! reviews the other two, each refines with the two reviews about it, and a judge picks the winner
//! whose refined answer is final. Types, limits, request checks, answer normalisation and the
//! stage trait; the model calls live in the debate service.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::Usage;
use crate::document::Severity;
use crate::error::{StageError, Violations};
use crate::limits::MAX_ID_BYTES;
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

// ---------------------------------------------------------------------------------------------
// Answers: normalisation, consensus, majority vote.

/// An answer in comparable form: lower case, numbers in canonical form (`1,000.50` -> `1000.5`,
/// `42.0` -> `42`, `+3` -> `3`), fractions of whole numbers reduced and written as decimals when
/// they terminate (`1/2` -> `0.5`, `6/4` -> `1.5`, `2/6` -> `1/3`), every other character that is
/// not a letter or a digit removed (punctuation, whitespace, symbols).
pub fn normalize_answer(answer: &str) -> String {
    let lower = answer.trim().to_lowercase();
    let chars: Vec<char> = lower.chars().collect();
    let mut out = String::with_capacity(lower.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let starts_number = c.is_ascii_digit()
            || (matches!(c, '-' | '+' | '.')
                && chars.get(i + 1).is_some_and(char::is_ascii_digit)
                && !chars.get(i.wrapping_sub(1)).is_some_and(|p| p.is_alphanumeric()));
        if starts_number {
            let (number, mut next) = read_number(&chars, i);
            if chars.get(next) == Some(&'/') && chars.get(next + 1).is_some_and(char::is_ascii_digit) {
                let (denominator, after) = read_number(&chars, next + 1);
                out.push_str(&fraction(&number, &denominator));
                next = after;
            } else {
                out.push_str(&number);
            }
            i = next;
            continue;
        }
        if c.is_alphanumeric() {
            out.push(c);
        }
        i += 1;
    }
    out
}

/// The number starting at `start` in canonical form, and the index after it.
fn read_number(chars: &[char], start: usize) -> (String, usize) {
    let mut i = start;
    let mut raw = String::new();
    if matches!(chars[i], '-' | '+') {
        raw.push(chars[i]);
        i += 1;
    }
    let mut seen_dot = false;
    while i < chars.len() {
        let c = chars[i];
        let next_digit = chars.get(i + 1).is_some_and(char::is_ascii_digit);
        if c.is_ascii_digit() {
            raw.push(c);
        } else if c == ',' && next_digit && !seen_dot && raw.chars().any(|d| d.is_ascii_digit()) {
            // Thousands separator.
        } else if c == '.' && next_digit && !seen_dot {
            seen_dot = true;
            raw.push(c);
        } else {
            break;
        }
        i += 1;
    }
    (canonical_number(&raw), i)
}

/// `[-+]digits[.digits]` without a plus sign, leading zeros, trailing fraction zeros or an empty
/// fraction, and without the sign of zero (exact: no floating point).
fn canonical_number(raw: &str) -> String {
    let (negative, digits) = match raw.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, raw.trim_start_matches('+')),
    };
    let (int, frac) = digits.split_once('.').unwrap_or((digits, ""));
    let int = int.trim_start_matches('0');
    let int = if int.is_empty() { "0" } else { int };
    let frac = frac.trim_end_matches('0');
    let body = if frac.is_empty() { int.to_string() } else { format!("{int}.{frac}") };
    if negative && body != "0" { format!("-{body}") } else { body }
}

/// `numerator/denominator` (canonical numbers) reduced: a terminating decimal in canonical form,
/// else `p/q` in lowest terms; kept as written when not both whole numbers that fit in 128 bits.
fn fraction(numerator: &str, denominator: &str) -> String {
    let as_written = || format!("{numerator}/{denominator}");
    let (Ok(n), Ok(d)) = (numerator.parse::<i128>(), denominator.parse::<i128>()) else {
        return as_written();
    };
    if d <= 0 {
        return as_written();
    }
    let g = gcd(n.unsigned_abs(), d.unsigned_abs());
    let (n, d) = (n / g as i128, d / g as i128);
    if d == 1 {
        return n.to_string();
    }
    // A terminating decimal: d = 2^a 5^b, n / d = n * 2^(k-a) 5^(k-b) / 10^k with k = max(a, b).
    let (mut rest, mut twos, mut fives) = (d, 0u32, 0u32);
    while rest % 2 == 0 {
        rest /= 2;
        twos += 1;
    }
    while rest % 5 == 0 {
        rest /= 5;
        fives += 1;
    }
    if rest != 1 {
        return format!("{n}/{d}");
    }
    let k = twos.max(fives);
    let scaled = 2i128
        .checked_pow(k - twos)
        .and_then(|f| f.checked_mul(5i128.checked_pow(k - fives)?))
        .and_then(|f| f.checked_mul(n));
    let Some(scaled) = scaled else { return format!("{n}/{d}") };
    let digits = scaled.unsigned_abs().to_string();
    let k = k as usize;
    let padded = format!("{digits:0>width$}", width = k + 1);
    let (int, frac) = padded.split_at(padded.len() - k);
    let sign = if scaled < 0 { "-" } else { "" };
    canonical_number(&format!("{sign}{int}.{frac}"))
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a.max(1)
}

/// Whether every answer is non-empty and all are equal after [`normalize_answer`].
pub fn answers_agree<'a>(answers: impl IntoIterator<Item = &'a str>) -> bool {
    let normalized: Vec<String> = answers.into_iter().map(normalize_answer).collect();
    !normalized.is_empty() && !normalized[0].is_empty() && normalized.iter().all(|a| *a == normalized[0])
}

/// A majority vote over refined answers.
#[derive(Debug, Clone, PartialEq)]
pub struct Vote {
    /// The most confident solver holding the winning answer (earlier solver on a tie).
    pub winner_solver_id: String,
    /// The winner's own answer (not the normalised form).
    pub answer: String,
    /// Solvers holding the winning answer.
    pub votes: usize,
    pub total: usize,
}

/// Majority vote over the refined answers after normalisation: the answer most solvers hold; on a
/// tie (e.g. three different answers) the group whose most confident member is the most confident,
/// then the earliest solver. `None` without refined solutions.
pub fn majority_vote(refined: &[RefinedSolution]) -> Option<Vote> {
    let mut groups: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, r) in refined.iter().enumerate() {
        groups.entry(normalize_answer(&r.final_answer)).or_default().push(i);
    }
    // Members of a group, best first: higher confidence, then earlier position.
    let best = |members: &[usize]| -> usize {
        let mut m = members.to_vec();
        m.sort_by(|a, b| refined[*b].confidence.total_cmp(&refined[*a].confidence).then(a.cmp(b)));
        m[0]
    };
    let (_, members) = groups.iter().max_by(|(_, a), (_, b)| {
        let (ba, bb) = (best(a), best(b));
        a.len().cmp(&b.len()).then(refined[ba].confidence.total_cmp(&refined[bb].confidence)).then(bb.cmp(&ba))
    })?;
    let winner = &refined[best(members)];
    Some(Vote {
        winner_solver_id: winner.solver_id.clone(),
        answer: winner.final_answer.clone(),
        votes: members.len(),
        total: refined.len(),
    })
}

// ---------------------------------------------------------------------------------------------
// Request checks. Field paths are relative to `prefix` (may be empty).

fn path(prefix: &str, name: &str) -> String {
    if prefix.is_empty() { name.to_string() } else { format!("{prefix}.{name}") }
}

fn check_text(text: &str, field: &str, max: usize, v: &mut Violations) {
    if text.len() > max {
        v.push(field, format!("is {} bytes; the limit is {max} bytes", text.len()));
    }
}

fn check_list(items: &[String], field: &str, v: &mut Violations) {
    if items.len() > MAX_ARTIFACT_ITEMS {
        v.push(field, format!("has {} entries; the limit is {MAX_ARTIFACT_ITEMS}", items.len()));
    }
    for (i, t) in items.iter().enumerate() {
        check_text(t, &format!("{field}[{i}]"), MAX_ARTIFACT_TEXT_BYTES, v);
    }
}

fn check_confidence(x: f64, field: &str, v: &mut Violations) {
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
fn check_raw_replies(replies: &[RawReply], field: &str, v: &mut Violations) {
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

fn check_solution(s: &Solution, field: &str, v: &mut Violations) {
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

fn check_review(r: &Review, field: &str, v: &mut Violations) {
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

fn check_refined(r: &RefinedSolution, field: &str, v: &mut Violations) {
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
fn check_solution_set(solutions: &[Solution], ids: &[String], prefix: &str, v: &mut Violations) {
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
fn check_review_set(reviews: &[Review], ids: &[String], prefix: &str, v: &mut Violations) {
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
fn check_refined_set(refined: &[RefinedSolution], ids: &[String], prefix: &str, v: &mut Violations) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blank_solution_ids_do_not_name_the_default_solvers() {
        // A blank solver id is the default one wherever a solver is given, so it cannot name one
        // when solvers are filled from the solutions either (found by the round-trip property).
        let ids: Vec<String> = solvers_or_default(vec![], &["\t", " ", "x"]).into_iter().map(|s| s.id).collect();
        assert_eq!(ids, ["solver_1", "solver_2", "solver_3"]);
        let ids: Vec<String> = solvers_or_default(vec![], &["a", "b", "c"]).into_iter().map(|s| s.id).collect();
        assert_eq!(ids, ["a", "b", "c"]);
    }

    #[test]
    fn answers_are_normalised() {
        assert_eq!(normalize_answer("  The Answer: 42. "), "theanswer42");
        assert_eq!(normalize_answer("42"), normalize_answer("42.0"));
        assert_eq!(normalize_answer("1,000"), normalize_answer("1000"));
        assert_eq!(normalize_answer("$1,000.50"), "1000.5");
        assert_eq!(normalize_answer("+3"), "3");
        assert_eq!(normalize_answer("-0.0"), "0");
        assert_eq!(normalize_answer("x = -2"), "x-2");
        assert_eq!(normalize_answer("3.14"), "3.14");
        assert_ne!(normalize_answer("3.14"), normalize_answer("314"));
        assert_eq!(normalize_answer("Paris!"), normalize_answer("paris"));
        assert_eq!(normalize_answer("a1.5b"), "a1.5b");
        assert_eq!(normalize_answer("x2-3"), "x23");
        assert_eq!(normalize_answer(".5"), "0.5");
        assert_eq!(normalize_answer("1, 2, 3"), "123");
        assert_eq!(normalize_answer("007"), "7");
        // Fractions: reduced, decimal when they terminate, never run together with their digits.
        assert_eq!(normalize_answer("1/2"), "0.5");
        assert_eq!(normalize_answer("1/2"), normalize_answer("0.5"));
        assert_ne!(normalize_answer("1/2"), normalize_answer("12"));
        assert_eq!(normalize_answer("6/4"), "1.5");
        assert_eq!(normalize_answer("-3/8"), "-0.375");
        assert_eq!(normalize_answer("2/6"), "1/3");
        assert_eq!(normalize_answer("2/6"), normalize_answer("1/3"));
        assert_eq!(normalize_answer("10/5"), "2");
        assert_eq!(normalize_answer("x = 3/4 cup"), "x0.75cup");
        assert_eq!(normalize_answer("1/0"), "1/0");
        assert_eq!(normalize_answer("1.5/3"), "1.5/3");
        assert_eq!(normalize_answer("7/1024"), "0.0068359375");
        assert_ne!(normalize_answer("12345678901234567890"), normalize_answer("12345678901234567891"));
    }

    #[test]
    fn agreement_needs_equal_non_empty_answers() {
        assert!(answers_agree(["42", "42.0", " 42. "]));
        assert!(!answers_agree(["42", "43", "42"]));
        assert!(!answers_agree(["", "", ""]));
        assert!(!answers_agree(Vec::<&str>::new()));
    }

    fn refined(id: &str, answer: &str, confidence: f64) -> RefinedSolution {
        RefinedSolution { solver_id: id.into(), final_answer: answer.into(), confidence, ..Default::default() }
    }

    #[test]
    fn majority_vote_takes_the_most_held_answer_then_confidence() {
        let v = majority_vote(&[refined("a", "41", 0.9), refined("b", "42", 0.6), refined("c", "42.0", 0.7)]).unwrap();
        assert_eq!((v.winner_solver_id.as_str(), v.answer.as_str(), v.votes, v.total), ("c", "42.0", 2, 3));
        let v = majority_vote(&[refined("a", "1", 0.5), refined("b", "2", 0.8), refined("c", "3", 0.8)]).unwrap();
        assert_eq!((v.winner_solver_id.as_str(), v.votes), ("b", 1));
        assert!(majority_vote(&[]).is_none());
    }

    #[test]
    fn solvers_are_none_or_three_with_unique_ids() {
        let mut v = Violations::new();
        check_solvers(&default_solvers()[..2], "", &mut v);
        let e = v.into_result().unwrap_err();
        assert!(e.to_string().contains("solvers: has 2 solvers"), "{e}");
        let mut solvers = default_solvers();
        solvers[2].id = "solver_1".into();
        let mut v = Violations::new();
        check_solvers(&solvers, "request", &mut v);
        assert!(v.into_result().unwrap_err().to_string().contains("request.solvers[2].id"));
        let filled = solvers_or_default(Vec::new(), &["a", "b", "c"]);
        assert_eq!(filled.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!(filled[1].model.temperature, Some(0.5));
    }

    fn solution(id: &str) -> Solution {
        Solution { solver_id: id.into(), final_answer: "42".into(), confidence: 0.5, ..Default::default() }
    }

    fn review(by: &str, of: &str) -> Review {
        Review { reviewer_id: by.into(), target_solver_id: of.into(), ..Default::default() }
    }

    #[test]
    fn refinement_names_the_missing_solution_and_review() {
        let ids = ["solver_1", "solver_2", "solver_3"];
        let all_reviews: Vec<Review> =
            ids.iter().flat_map(|a| ids.iter().filter(move |b| *b != a).map(move |b| review(a, b))).collect();
        let request = RefineRequest {
            problem: "p".into(),
            solutions: vec![solution("solver_1"), solution("solver_2")],
            reviews: all_reviews[1..].to_vec(),
            ..Default::default()
        };
        let StageError::InvalidArgument(vs) = request.checked("").unwrap_err() else { panic!("not invalid") };
        let text: Vec<String> = vs.iter().map(|v| format!("{}: {}", v.field, v.description)).collect();
        assert!(text.iter().any(|t| t.contains("solutions: has no solution of solver \"solver_3\"")), "{text:?}");
        assert!(text.iter().any(|t| t.contains("missing the review by solver_1")), "{text:?}");
        let request = RefineRequest {
            problem: "p".into(),
            solutions: ids.iter().map(|i| solution(i)).collect(),
            ..Default::default()
        };
        let e = request.checked("").unwrap_err();
        assert!(matches!(&e, StageError::FailedPrecondition(m) if m.contains("reviews is empty: run Review")), "{e}");
        let ok = RefineRequest {
            problem: "p".into(),
            solutions: ids.iter().map(|i| solution(i)).collect(),
            reviews: all_reviews,
            ..Default::default()
        };
        assert_eq!(ok.checked("").unwrap().solvers.len(), 3);
    }

    #[test]
    fn a_self_review_is_refused() {
        let ids = ["solver_1", "solver_2", "solver_3"];
        let mut reviews: Vec<Review> =
            ids.iter().flat_map(|a| ids.iter().filter(move |b| *b != a).map(move |b| review(a, b))).collect();
        reviews[0].target_solver_id = "solver_1".into();
        let request = ReviewRequest {
            problem: "p".into(),
            solutions: ids.iter().map(|i| solution(i)).collect(),
            ..Default::default()
        };
        assert!(request.checked("").is_ok());
        let request = RefineRequest {
            problem: "p".into(),
            solutions: ids.iter().map(|i| solution(i)).collect(),
            reviews,
            ..Default::default()
        };
        assert!(request.checked("").unwrap_err().to_string().contains("reviews itself"));
    }

    #[test]
    fn raw_replies_are_bounded() {
        let long = "é".repeat(MAX_RAW_REPLY_BYTES);
        let r = RawReply::new(&long, "length");
        assert_eq!((r.text.len(), r.bytes as usize), (MAX_RAW_REPLY_BYTES, 2 * MAX_RAW_REPLY_BYTES));
        assert!(r.truncated() && !RawReply::new("{}", "stop").truncated());
        let mut s = solution("a");
        s.raw_replies = vec![RawReply::new("{}", "stop"); 3];
        s.raw_replies[1].text = "x".repeat(MAX_RAW_REPLY_BYTES + 1);
        let mut v = Violations::new();
        check_solution(&s, "solutions[0]", &mut v);
        let e = v.into_result().unwrap_err().to_string();
        assert!(e.contains("solutions[0].raw_replies: has 3 entries; the limit is 2"), "{e}");
        assert!(e.contains("solutions[0].raw_replies[1].text: is 16385 bytes; the limit is 16384 bytes"), "{e}");
    }

    #[test]
    fn rounds_and_problem_are_bounded() {
        let r = DebateRequest { problem: " ".into(), rounds: 0, ..Default::default() };
        let e = r.checked("request").unwrap_err().to_string();
        assert!(e.contains("request.problem: must not be empty") && e.contains("request.rounds"), "{e}");
        let r = DebateRequest { problem: "x".repeat(MAX_PROBLEM_BYTES + 1), ..Default::default() };
        assert!(r.checked("").unwrap_err().to_string().contains("the limit is 32768 bytes"));
    }
}
