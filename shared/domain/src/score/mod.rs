//! Scores and their aggregates.
//!
//! Layout: `item` (one item's answer, confidence and status, the majority over samples), `config`
//! (scorer options and their checks), `target` (a scored target's aggregates, samples combined),
//! `aggregate` (aggregates over many targets, their uncertainty); this module only re-exports them.

mod aggregate;
mod config;
mod item;
mod target;
#[cfg(test)]
mod tests;

pub use aggregate::{AggregateBuilder, AggregateScores, CategoryPassRate, ScoreUncertainty, UNCERTAINTY_ALPHA};
pub use config::{
    MAX_JUDGE_SAMPLES, MAX_SAMPLE_MODELS, PrimaryMetric, SCORER_PLACEHOLDERS, ScorerConfig, ScorerSettings,
    ScoringMode, ScoringPrompt, check_sample_models,
};
pub use item::{Answer, ConfidenceLevel, ItemScore, ItemStatus};
pub use target::Score;
