//! The delta judge stage: verify an edited section against the
//! issues it was meant to fix, and compare two drafts with the convergence cascade.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::Usage;
use crate::document::{JudgeIssue, Section, check_unit};
use crate::error::{StageError, Violations};
use crate::limits::{MAX_ID_BYTES, MAX_TEXT_BYTES};
use crate::model::{ModelRecord, ModelSpec};
use crate::score::Answer;

pub use crate::similarity::{CompareOutcome, ConvergenceMode, DecidedBy, JaccardScore};

/// Most issues of one Verify request.
pub const MAX_VERIFY_ISSUES: usize = 100;
/// Most locks or criterion scores of one Verify request.
pub const MAX_VERIFY_LOCKS: usize = 100;
/// Default bounds of len(after) / len(before), in characters.
pub const DEFAULT_MIN_LENGTH_RATIO: f64 = 0.5;
pub const DEFAULT_MAX_LENGTH_RATIO: f64 = 2.0;
/// Default largest allowed drop of a locked criterion.
pub const DEFAULT_LOCK_MAX_DROP: f64 = 0.05;

/// A criterion that may not drop by more than `max_drop` (default 0.05).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QualityLock {
    pub criterion: String,
    pub baseline: f64,
    pub max_drop: Option<f64>,
}

/// Verify one edited section.
#[derive(Debug, Clone, PartialEq)]
pub struct VerifyRequest {
    pub before: Section,
    pub after: Section,
    /// The issues the edit was meant to fix (ids unique and non-empty).
    pub issues: Vec<JudgeIssue>,
    pub locks: Vec<QualityLock>,
    /// Criterion scores after the edit; every locked criterion needs one.
    pub criterion_scores: BTreeMap<String, f64>,
    pub model: ModelSpec,
    pub min_length_ratio: f64,
    pub max_length_ratio: f64,
    /// Least confidence (P(YES) from the first token's logprobs) for a YES to count as fixed.
    /// `None` (the default): the model's YES/NO answer is the verdict, whatever its confidence.
    /// When set, a YES below it, or a YES whose confidence is unknown (no logprobs), counts as not
    /// fixed and the reason says so.
    pub min_fix_confidence: Option<f64>,
}

impl Default for VerifyRequest {
    fn default() -> Self {
        Self {
            before: Section::default(),
            after: Section::default(),
            issues: Vec::new(),
            locks: Vec::new(),
            criterion_scores: BTreeMap::new(),
            model: ModelSpec::default(),
            min_length_ratio: DEFAULT_MIN_LENGTH_RATIO,
            max_length_ratio: DEFAULT_MAX_LENGTH_RATIO,
            min_fix_confidence: None,
        }
    }
}

/// A section a request quotes: content non-empty and within [`MAX_TEXT_BYTES`], id within
/// [`MAX_ID_BYTES`] (fields named `<field>.content`, `<field>.id`).
fn check_quoted_section(s: &Section, field: &str, v: &mut Violations) {
    if s.content.trim().is_empty() {
        v.push(format!("{field}.content"), "must not be empty");
    }
    if s.content.len() > MAX_TEXT_BYTES {
        v.push(
            format!("{field}.content"),
            format!("is {} bytes; the limit is {MAX_TEXT_BYTES} bytes", s.content.len()),
        );
    }
    if s.id.len() > MAX_ID_BYTES {
        v.push(format!("{field}.id"), format!("is {} bytes; the limit is {MAX_ID_BYTES}", s.id.len()));
    }
}

impl VerifyRequest {
    /// Check everything the domain requires; field paths are relative to `prefix` (may be empty).
    pub fn check(&self, prefix: &str, v: &mut Violations) {
        let f = |name: &str| if prefix.is_empty() { name.to_string() } else { format!("{prefix}.{name}") };
        for (name, s) in [("before", &self.before), ("after", &self.after)] {
            check_quoted_section(s, &f(name), v);
        }
        if self.before.id != self.after.id {
            v.push(
                f("after.id"),
                format!(
                    "is {:?} but before.id is {:?}: both must name the same section",
                    self.after.id, self.before.id
                ),
            );
        }
        if self.issues.len() > MAX_VERIFY_ISSUES {
            v.push(f("issues"), format!("has {} issues; the limit is {MAX_VERIFY_ISSUES}", self.issues.len()));
        }
        let mut ids = HashSet::new();
        for (i, issue) in self.issues.iter().enumerate() {
            if issue.id.trim().is_empty() {
                v.push(f(&format!("issues[{i}].id")), "must not be empty");
            } else if !ids.insert(issue.id.as_str()) {
                v.push(f(&format!("issues[{i}].id")), format!("duplicate issue id {:?}", issue.id));
            }
            if issue.description.trim().is_empty() && issue.fix_instruction.trim().is_empty() {
                v.push(
                    f(&format!("issues[{i}].description")),
                    "must not be empty (nor fix_instruction): nothing says what to verify",
                );
            }
            if !issue.section_id.is_empty() && issue.section_id != self.after.id {
                v.push(
                    f(&format!("issues[{i}].section_id")),
                    format!("is {:?} but the verified section is {:?}", issue.section_id, self.after.id),
                );
            }
        }
        if self.locks.len() > MAX_VERIFY_LOCKS || self.criterion_scores.len() > MAX_VERIFY_LOCKS {
            v.push(f("locks"), format!("at most {MAX_VERIFY_LOCKS} locks and {MAX_VERIFY_LOCKS} criterion scores"));
        }
        let mut locked = HashSet::new();
        for (i, l) in self.locks.iter().enumerate() {
            let lf = f(&format!("locks[{i}]"));
            if l.criterion.trim().is_empty() {
                v.push(format!("{lf}.criterion"), "must not be empty");
            } else if !locked.insert(l.criterion.as_str()) {
                v.push(format!("{lf}.criterion"), format!("duplicate criterion {:?}", l.criterion));
            } else if !self.criterion_scores.contains_key(&l.criterion) {
                v.push(f("criterion_scores"), format!("has no score for the locked criterion {:?}", l.criterion));
            }
            check_unit(l.baseline, &format!("{lf}.baseline"), v);
            if let Some(d) = l.max_drop {
                check_unit(d, &format!("{lf}.max_drop"), v);
            }
        }
        for (c, x) in &self.criterion_scores {
            check_unit(*x, &f(&format!("criterion_scores[{c:?}]")), v);
        }
        let (lo, hi) = (self.min_length_ratio, self.max_length_ratio);
        if !lo.is_finite() || lo < 0.0 {
            v.push(f("min_length_ratio"), format!("must be a number >= 0 (got {lo})"));
        }
        if !hi.is_finite() || hi <= 0.0 {
            v.push(f("max_length_ratio"), format!("must be a number > 0 (got {hi})"));
        } else if lo.is_finite() && lo > hi {
            v.push(f("max_length_ratio"), format!("must be at least min_length_ratio ({lo}); got {hi}"));
        }
        if let Some(m) = self.min_fix_confidence {
            check_unit(m, &f("min_fix_confidence"), v);
        }
    }
}

/// One heuristic check: `length`, `language`, `structure` or `readability`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HeuristicCheck {
    pub name: String,
    pub passed: bool,
    pub detail: String,
}

/// Whether one issue was fixed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IssueVerification {
    pub issue_id: String,
    /// The model answered YES (and, when the request set `min_fix_confidence`, with at least that
    /// confidence).
    pub fixed: bool,
    /// The probability of the answer the model gave, from the first token's logprobs: P(yes) /
    /// (P(yes) + P(no)) for a YES, P(no) / (P(yes) + P(no)) for a NO; unset when the backend gave
    /// no logprobs or neither token among them.
    pub confidence: Option<f64>,
    /// The model's answer; `None` when the call failed or the reply held none.
    pub answer: Option<Answer>,
    /// Why the issue could not be verified (failed call, unparseable reply); empty otherwise.
    pub error: String,
}

/// A lock the edit broke.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LockViolation {
    pub criterion: String,
    pub baseline: f64,
    pub current: f64,
    pub max_drop: f64,
}

/// Readability figures of a text (language agnostic).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ReadabilityReport {
    pub average_sentence_words: f64,
    pub max_sentence_words: u32,
    pub paragraph_break_ratio: f64,
    pub sentences: u32,
    pub paragraphs: u32,
    pub long_sentences: Vec<String>,
    pub dense_text: bool,
    pub within_targets: bool,
}

/// What Verify found.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct VerifyOutcome {
    pub heuristics: Vec<HeuristicCheck>,
    pub issues: Vec<IssueVerification>,
    pub lock_violations: Vec<LockViolation>,
    /// Every heuristic passed, no lock broken, every issue fixed.
    pub accepted: bool,
    /// Changes reported but not held against the fix, one line each: a structure change an issue
    /// asked for, sentences shortened under the 15-word target.
    pub notes: Vec<String>,
    /// Readability of `after`.
    pub readability: ReadabilityReport,
    pub usage: Usage,
    pub model: ModelRecord,
    /// Every reason the fix is rejected, one line each (empty when accepted).
    pub rejection_reasons: Vec<String>,
    /// Logprobs were requested but the backend gave none: confidences are unset.
    pub logprobs_unavailable: bool,
}

/// Compare two drafts with the convergence cascade.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct CompareRequest {
    pub previous: String,
    pub current: String,
    pub mode: ConvergenceMode,
    /// Unset fields: the phase's configured embedding backend.
    pub embedding_model: ModelSpec,
}

impl CompareRequest {
    /// Both texts non-empty and within [`MAX_TEXT_BYTES`].
    pub fn check(&self, prefix: &str, v: &mut Violations) {
        let f = |name: &str| if prefix.is_empty() { name.to_string() } else { format!("{prefix}.{name}") };
        for (name, text) in [("previous", &self.previous), ("current", &self.current)] {
            if text.trim().is_empty() {
                v.push(f(name), "must not be empty");
            }
            if text.len() > MAX_TEXT_BYTES {
                v.push(f(name), format!("is {} bytes; the limit is {MAX_TEXT_BYTES} bytes", text.len()));
            }
        }
    }
}

/// The delta judge stage.
#[async_trait::async_trait]
pub trait DeltaJudge: Send + Sync {
    /// Heuristics, readability, one YES/NO check per issue, quality locks.
    async fn verify(&self, request: VerifyRequest) -> Result<VerifyOutcome, StageError>;
    /// The convergence cascade between two drafts.
    async fn compare_texts(&self, request: CompareRequest) -> Result<CompareOutcome, StageError>;
    /// One YES/NO call: is `section` still consistent with the `previous` section (just
    /// regenerated)? The N+1 consistency check.
    async fn check_consistency(&self, request: ConsistencyRequest) -> Result<ConsistencyOutcome, StageError>;
    /// Readability figures of a text (no model call). A blank text, or one over
    /// [`MAX_TEXT_BYTES`], is refused.
    async fn readability(&self, text: String) -> Result<ReadabilityReport, StageError>;
}

/// Check a section against the previous one after that one was regenerated.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ConsistencyRequest {
    /// The previous section as it now stands (regenerated).
    pub previous: Section,
    /// The section to check (not edited).
    pub section: Section,
    pub model: ModelSpec,
}

impl ConsistencyRequest {
    /// Both sections non-empty and within [`MAX_TEXT_BYTES`], ids within [`MAX_ID_BYTES`] and not
    /// the same section twice; field paths relative to `prefix` (may be empty).
    pub fn check(&self, prefix: &str, v: &mut Violations) {
        let f = |name: &str| if prefix.is_empty() { name.to_string() } else { format!("{prefix}.{name}") };
        for (name, s) in [("previous", &self.previous), ("section", &self.section)] {
            check_quoted_section(s, &f(name), v);
        }
        if !self.section.id.is_empty() && self.section.id == self.previous.id {
            v.push(
                f("section.id"),
                format!("is {:?}, the same as previous.id: check a section against another one", self.section.id),
            );
        }
    }
}

/// The model's answer to a consistency check.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ConsistencyOutcome {
    pub consistent: bool,
    /// When inconsistent: what no longer fits (becomes the patch task's issue); else empty.
    pub reason: String,
    /// P(answer) from logprobs when the backend gives them.
    pub confidence: Option<f64>,
    pub usage: Usage,
    pub model: Option<ModelRecord>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::document::Severity;

    fn issue(id: &str) -> JudgeIssue {
        JudgeIssue {
            id: id.into(),
            criterion: "clarity_readability".into(),
            severity: Severity::Minor,
            section_id: String::new(),
            description: "too long".into(),
            fix_instruction: String::new(),
            location: String::new(),
            raised_by: vec![],
            context_window: String::new(),
        }
    }

    #[test]
    fn verify_request_checks_name_every_field() {
        let r = VerifyRequest {
            before: Section { id: "s1".into(), content: "text".into(), ..Default::default() },
            after: Section { id: "s2".into(), content: " ".into(), ..Default::default() },
            issues: vec![issue("a"), issue("a")],
            locks: vec![QualityLock { criterion: "clarity".into(), baseline: 1.5, max_drop: None }],
            criterion_scores: [("x".to_string(), -0.1)].into(),
            min_length_ratio: 3.0,
            ..Default::default()
        };
        let mut v = Violations::new();
        r.check("", &mut v);
        let e = v.into_result().unwrap_err().to_string();
        for field in [
            "after.content: must not be empty",
            "after.id: is \"s2\"",
            "issues[1].id: duplicate",
            "locks[0].baseline",
            "criterion_scores: has no score for the locked criterion \"clarity\"",
            "criterion_scores[\"x\"]",
            "max_length_ratio: must be at least min_length_ratio",
        ] {
            assert!(e.contains(field), "{field} missing from {e}");
        }
        let too_many = VerifyRequest {
            before: Section { content: "x".into(), ..Default::default() },
            after: Section { content: "y".into(), ..Default::default() },
            issues: (0..=MAX_VERIFY_ISSUES).map(|i| issue(&i.to_string())).collect(),
            ..Default::default()
        };
        let mut v = Violations::new();
        too_many.check("req", &mut v);
        assert!(v.into_result().unwrap_err().to_string().contains("req.issues: has 101 issues; the limit is 100"));
    }

    #[test]
    fn min_fix_confidence_and_consistency_sections_are_checked() {
        let r = VerifyRequest {
            before: Section { content: "x".into(), ..Default::default() },
            after: Section { content: "y".into(), ..Default::default() },
            min_fix_confidence: Some(f64::NAN),
            ..Default::default()
        };
        let mut v = Violations::new();
        r.check("", &mut v);
        assert!(v.into_result().unwrap_err().to_string().contains("min_fix_confidence"));
        let c = ConsistencyRequest {
            previous: Section { id: "a".into(), content: String::new(), ..Default::default() },
            section: Section { id: "a".into(), content: "x".repeat(MAX_TEXT_BYTES + 1), ..Default::default() },
            ..Default::default()
        };
        let mut v = Violations::new();
        c.check("c", &mut v);
        let e = v.into_result().unwrap_err().to_string();
        for field in ["c.previous.content: must not be empty", "c.section.content: is", "c.section.id: is \"a\""] {
            assert!(e.contains(field), "{field} missing from {e}");
        }
    }
}
