//! Quality locks and convergence of an iterative refinement.
//!
//! - A locked criterion may not drop below its baseline by more than `max_drop` (default 0.05).
//! - Scores are on the 0..1 scale; `scores[0]` is the score before any edit, each later entry one
//!   iteration. The refinement stops (`converged`) when the gain was under 0.02 (2 points of the
//!   scale) for the last 2 iterations, or at a hard limit: 3 iterations, 15,000 tokens, 5 minutes.
//! - A section locks after 2 edits. The best iteration is the first with the highest score.
//!
//! The targeted refinement loop's policy, pure functions the gateway's pipeline calls: [`decide`]
//! (accept, stop or go on after a judging, and a document's [`quality`]), [`scores`] (the judging's
//! score and mean scores, quality locks and the regressions that break them, the best judging) and
//! [`regenerate`] (the tasks of a full regeneration).

pub mod board;
pub mod decide;
mod limits;
pub mod regenerate;
pub mod scores;

pub use crate::verify::{DEFAULT_LOCK_MAX_DROP as DEFAULT_MAX_DROP, LockViolation, QualityLock};
pub use decide::{
    Acceptance, Decision, LastJudging, Mode, Quality, Scored, Standing, accepts, decide, meets_top,
    open_critical_warning, quality, settle_on, top_acceptance,
};
pub use limits::{
    BUDGET_PER_DOCUMENT_TOKEN, Convergence, EDITS_TO_LOCK, Limits, MAX_ELAPSED_MS, MAX_ITERATIONS, MAX_TOKENS,
    MIN_GAIN, STALLED_ITERATIONS, Stop, convergence, convergence_within, default_token_budget, lock_violations,
};
pub use regenerate::regeneration_tasks;
pub use scores::{
    DEFAULT_LOCK_THRESHOLD, MeanScore, SectionLock, best_judging, document_score, focused_regressions, focused_scores,
    issues_gained, mean_scores, quality_locks, regressions, verdict_score,
};
