//! Aggregates over many scored targets: mean primary score, macro and micro pass rates, per-category
//! pass rates and the uncertainty of the mean, all at once or one score at a time.

use serde::{Deserialize, Serialize};

use crate::checklist::{Checklist, UNGROUPED};

use super::target::Score;

/// Pass rate of one category.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CategoryPassRate {
    pub category: String,
    pub pass_rate: f64,
    pub items: u32,
}

/// The uncertainty of a mean score, as [`crate::stats::standard_error`] reports it (flattened).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ScoreUncertainty {
    pub mean: f64,
    /// Observations: targets, or target samples.
    pub observations: u32,
    /// Distinct targets when some target has several observations (clustered), else 0.
    pub clusters: u32,
    pub alpha: f64,
    pub se_naive: f64,
    pub ci_naive: (f64, f64),
    pub se_clustered: Option<f64>,
    pub ci_clustered: Option<(f64, f64)>,
    pub inflation: Option<f64>,
    /// The honest standard error: clustered when available, else naive.
    pub se: f64,
    /// The honest interval: clustered when available, else naive.
    pub ci: (f64, f64),
}

impl From<&crate::stats::StandardError> for ScoreUncertainty {
    fn from(e: &crate::stats::StandardError) -> Self {
        Self {
            mean: e.mean,
            observations: e.n as u32,
            clusters: e.n_clusters.unwrap_or(0) as u32,
            alpha: e.alpha,
            se_naive: e.se_naive,
            ci_naive: e.ci_naive,
            se_clustered: e.se_clustered,
            ci_clustered: e.ci_clustered,
            inflation: e.inflation,
            se: e.se(),
            ci: e.ci(),
        }
    }
}

/// Significance level of the intervals on aggregates (95% intervals).
pub const UNCERTAINTY_ALPHA: f64 = 0.05;

/// Aggregates over many scores.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct AggregateScores {
    pub targets: u32,
    pub mean_primary_score: f64,
    pub macro_pass_rate: f64,
    pub micro_pass_rate: f64,
    pub category_pass_rates: Vec<CategoryPassRate>,
    pub unanswered_items: u32,
    /// Standard error and interval of the mean primary score over the observations (one per
    /// target, or one per sample clustered by target); `None` under 2 observations.
    pub uncertainty: Option<ScoreUncertainty>,
    /// Targets added with no answered item ([`Score::is_scored`]): counted in `targets`, kept out
    /// of the means, the pass rates and the uncertainty (their unanswered items are still counted
    /// in `unanswered_items`).
    #[serde(default)]
    pub unscored_targets: u32,
    /// Items scored by logprob confidence whose reply did not begin with an answer
    /// ([`Score::off_answer_items`], summed).
    #[serde(default)]
    pub off_answer_items: u32,
}

impl AggregateScores {
    /// Targets that were scored (`targets` - `unscored_targets`): what the means are over.
    pub fn scored_targets(&self) -> u32 {
        self.targets - self.unscored_targets
    }
}

impl AggregateScores {
    /// Aggregate scores, each with the checklist it was scored against.
    pub fn compute<'a>(scores: impl IntoIterator<Item = (&'a Score, &'a Checklist)>) -> AggregateScores {
        let mut b = AggregateBuilder::default();
        for (score, checklist) in scores {
            b.add(score, checklist);
        }
        b.finish()
    }
}

/// A record's cluster key in [`AggregateBuilder`]: a fixed 64-bit hash of its id (the same in
/// every process, so a run's aggregates do not depend on which gateway computes them).
fn cluster_key(id: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::hash::DefaultHasher::new();
    id.hash(&mut h);
    h.finish()
}

/// [`AggregateScores`] computed one score at a time (a run's results read a page at a time):
/// running sums and counts, and the observations the uncertainty needs (one number and a
/// cluster key per observation, not the scores).
#[derive(Debug, Default, Clone)]
pub struct AggregateBuilder {
    targets: u32,
    unscored: u32,
    primary_sum: f64,
    rate_sum: f64,
    yes_all: usize,
    items_all: usize,
    unanswered: u32,
    off_answer: u32,
    cats: Vec<(String, usize, usize)>,
    /// (cluster key, primary score): targets are clusters, an empty target id stands alone. The
    /// key is a 64-bit hash of the id (16 bytes per observation, whatever the ids): two ids share a
    /// hash with odds of about n²/2⁶⁵ (3e-8 at a million records).
    observations: Vec<(u64, f64)>,
}

impl AggregateBuilder {
    /// Add one score with the checklist it was scored against. An unscored target
    /// ([`Score::is_scored`]) is counted, and apart: no mean, rate or interval takes it in.
    pub fn add(&mut self, score: &Score, checklist: &Checklist) {
        self.off_answer += score.off_answer_items;
        if !score.is_scored() {
            self.targets += 1;
            self.unscored += 1;
            self.unanswered += score.unanswered_count;
            return;
        }
        let key = if score.target_id.is_empty() {
            cluster_key(&format!("#{}", self.targets))
        } else {
            cluster_key(&score.target_id)
        };
        if score.sample_primary_scores.is_empty() {
            self.observations.push((key, score.primary_score));
        } else {
            self.observations.extend(score.sample_primary_scores.iter().map(|p| (key, *p)));
        }
        self.targets += 1;
        self.primary_sum += score.primary_score;
        self.rate_sum += score.pass_rate;
        self.yes_all += score.item_scores.iter().filter(|s| s.is_yes()).count();
        self.items_all += score.item_scores.iter().filter(|s| s.has_answer()).count();
        self.unanswered += score.unanswered_count;
        for s in score.item_scores.iter().filter(|s| s.has_answer()) {
            let cat = checklist
                .items
                .iter()
                .find(|i| i.id == s.item_id)
                .and_then(|i| i.category.as_deref())
                .filter(|c| !c.is_empty())
                .unwrap_or(UNGROUPED);
            let yes = usize::from(s.is_yes());
            match self.cats.iter_mut().find(|(c, _, _)| c == cat) {
                Some((_, y, n)) => {
                    *y += yes;
                    *n += 1;
                }
                None => self.cats.push((cat.to_string(), yes, 1)),
            }
        }
    }

    /// The aggregates of every score added.
    pub fn finish(self) -> AggregateScores {
        let targets = self.targets;
        let scored = targets - self.unscored;
        let t = f64::from(scored);
        let mut obs = self.observations;
        let uncertainty =
            crate::stats::standard_error_keyed(&mut obs, UNCERTAINTY_ALPHA).ok().map(|e| ScoreUncertainty::from(&e));
        drop(obs);
        AggregateScores {
            targets,
            mean_primary_score: if scored == 0 { 0.0 } else { self.primary_sum / t },
            macro_pass_rate: if scored == 0 { 0.0 } else { self.rate_sum / t },
            micro_pass_rate: if self.items_all == 0 { 0.0 } else { self.yes_all as f64 / self.items_all as f64 },
            category_pass_rates: self
                .cats
                .into_iter()
                .map(|(category, y, n)| CategoryPassRate { category, pass_rate: y as f64 / n as f64, items: n as u32 })
                .collect(),
            unanswered_items: self.unanswered,
            uncertainty,
            unscored_targets: self.unscored,
            off_answer_items: self.off_answer,
        }
    }
}
