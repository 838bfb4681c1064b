//! The limits of an iterative refinement and its convergence; quality lock violations.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::verify::{DEFAULT_LOCK_MAX_DROP as DEFAULT_MAX_DROP, LockViolation, QualityLock};

/// A gain under this (on the 0..1 scale) counts as no progress.
pub const MIN_GAIN: f64 = 0.02;
/// Iterations in a row without progress that end the refinement.
pub const STALLED_ITERATIONS: usize = 2;
/// Default hard limits.
pub const MAX_ITERATIONS: usize = 3;
pub const MAX_TOKENS: u64 = 15_000;
/// The default token budget per document token (characters / 4): about what regenerating the
/// whole document would cost (read and write every section, verify each), so targeted
/// refinement never spends more by default than starting over.
pub const BUDGET_PER_DOCUMENT_TOKEN: u64 = 5;

/// The default token budget of a refinement (the first assessment is counted apart): the larger
/// of [`MAX_TOKENS`] and [`BUDGET_PER_DOCUMENT_TOKEN`] times the document's tokens.
pub fn default_token_budget(document_chars: usize) -> u64 {
    MAX_TOKENS.max(BUDGET_PER_DOCUMENT_TOKEN * (document_chars as u64).div_ceil(4))
}
pub const MAX_ELAPSED_MS: u64 = 300_000;
/// Edits after which a section is locked.
pub const EDITS_TO_LOCK: u32 = 2;
/// Slack for floating-point comparisons of scores (0.80 - 0.75 is 0.05000000000000004).
const EPSILON: f64 = 1e-9;

/// The locks `scores` break, in lock order. Callers check that every locked criterion has a score.
pub fn lock_violations(locks: &[QualityLock], scores: &BTreeMap<String, f64>) -> Vec<LockViolation> {
    locks
        .iter()
        .filter_map(|l| {
            let current = *scores.get(&l.criterion)?;
            let max_drop = l.max_drop.unwrap_or(DEFAULT_MAX_DROP);
            (l.baseline - current > max_drop + EPSILON).then(|| LockViolation {
                criterion: l.criterion.clone(),
                baseline: l.baseline,
                current,
                max_drop,
            })
        })
        .collect()
}

/// Why a refinement stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Stop {
    GainBelowThreshold,
    MaxIterations,
    TokenBudget,
    TimeBudget,
}

impl Stop {
    pub fn name(self) -> &'static str {
        match self {
            Stop::GainBelowThreshold => "gain_below_threshold",
            Stop::MaxIterations => "max_iterations",
            Stop::TokenBudget => "token_budget",
            Stop::TimeBudget => "time_budget",
        }
    }
}

/// The hard limits of one refinement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Rounds of edits.
    pub max_iterations: usize,
    pub max_tokens: u64,
    pub max_elapsed_ms: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self { max_iterations: MAX_ITERATIONS, max_tokens: MAX_TOKENS, max_elapsed_ms: MAX_ELAPSED_MS }
    }
}

/// The convergence decision.
#[derive(Debug, Clone, PartialEq)]
pub struct Convergence {
    /// Stop iterating, for `stop`.
    pub stop: Option<Stop>,
    /// Sections edited [`EDITS_TO_LOCK`] times or more, by id.
    pub locked_sections: Vec<String>,
    /// Index in `scores` of the first highest score.
    pub best_iteration: usize,
}

/// Decide whether a refinement with these `scores` (initial first) should stop, at the default
/// limits.
pub fn convergence(
    scores: &[f64],
    section_edits: &BTreeMap<String, u32>,
    tokens_used: u64,
    elapsed_ms: u64,
) -> Convergence {
    convergence_within(scores, section_edits, tokens_used, elapsed_ms, Limits::default())
}

/// [`convergence`] at the given limits.
pub fn convergence_within(
    scores: &[f64],
    section_edits: &BTreeMap<String, u32>,
    tokens_used: u64,
    elapsed_ms: u64,
    limits: Limits,
) -> Convergence {
    let gains: Vec<f64> = scores.windows(2).map(|w| w[1] - w[0]).collect();
    let stalled = gains.len() >= STALLED_ITERATIONS
        && gains[gains.len() - STALLED_ITERATIONS..].iter().all(|g| *g < MIN_GAIN - EPSILON);
    let stop = if stalled {
        Some(Stop::GainBelowThreshold)
    } else if gains.len() >= limits.max_iterations {
        Some(Stop::MaxIterations)
    } else if tokens_used >= limits.max_tokens {
        Some(Stop::TokenBudget)
    } else if elapsed_ms >= limits.max_elapsed_ms {
        Some(Stop::TimeBudget)
    } else {
        None
    };
    let mut best_iteration = 0;
    for (i, s) in scores.iter().enumerate() {
        if *s > scores[best_iteration] {
            best_iteration = i;
        }
    }
    let locked_sections =
        section_edits.iter().filter(|(_, n)| **n >= EDITS_TO_LOCK).map(|(id, _)| id.clone()).collect();
    Convergence { stop, locked_sections, best_iteration }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lock(c: &str, baseline: f64, max_drop: Option<f64>) -> QualityLock {
        QualityLock { criterion: c.into(), baseline, max_drop }
    }

    #[test]
    fn a_lock_breaks_only_beyond_its_drop() {
        let scores: BTreeMap<String, f64> =
            [("clarity".to_string(), 0.75), ("accuracy".to_string(), 0.70), ("tone".to_string(), 0.9)].into();
        let locks = [lock("clarity", 0.80, None), lock("accuracy", 0.80, None), lock("tone", 0.95, Some(0.01))];
        let v = lock_violations(&locks, &scores);
        let names: Vec<&str> = v.iter().map(|v| v.criterion.as_str()).collect();
        // clarity dropped exactly 0.05: allowed; accuracy 0.10 and tone 0.05 > 0.01: broken.
        assert_eq!(names, vec!["accuracy", "tone"]);
        assert_eq!((v[0].baseline, v[0].current, v[0].max_drop), (0.80, 0.70, DEFAULT_MAX_DROP));
    }

    #[test]
    fn stops_after_two_small_gains_or_at_a_hard_limit() {
        let none = BTreeMap::new();
        let c = convergence(&[0.6, 0.7, 0.71, 0.72], &none, 0, 0);
        assert_eq!(c.stop, Some(Stop::GainBelowThreshold));
        assert_eq!(c.best_iteration, 3);
        // One small gain is not enough.
        assert_eq!(convergence(&[0.6, 0.7, 0.71], &none, 0, 0).stop, None);
        // A regression counts as no gain; the best iteration stays the earlier one.
        let c = convergence(&[0.6, 0.8, 0.75, 0.76], &none, 0, 0);
        assert_eq!((c.stop, c.best_iteration), (Some(Stop::GainBelowThreshold), 1));
        assert_eq!(convergence(&[0.5, 0.6, 0.7, 0.8], &none, 0, 0).stop, Some(Stop::MaxIterations));
        assert_eq!(convergence(&[0.5, 0.6], &none, 15_000, 0).stop, Some(Stop::TokenBudget));
        assert_eq!(convergence(&[0.5, 0.6], &none, 14_999, 300_000).stop, Some(Stop::TimeBudget));
        assert_eq!(convergence(&[0.5], &none, 0, 0).stop, None);
        // A gain of exactly 0.02 is progress.
        assert_eq!(convergence(&[0.5, 0.52, 0.54], &none, 0, 0).stop, None);
    }

    #[test]
    fn sections_lock_after_two_edits() {
        let edits: BTreeMap<String, u32> = [("s2".to_string(), 2), ("s1".to_string(), 1), ("s3".to_string(), 3)].into();
        assert_eq!(convergence(&[0.5], &edits, 0, 0).locked_sections, vec!["s2", "s3"]);
    }
}
