//! A scored target: every aggregate of one target's item scores, and several samples of one
//! target combined.

use serde::{Deserialize, Serialize};

use crate::checklist::Checklist;

use super::config::PrimaryMetric;
use super::item::{ItemScore, ItemStatus};

/// A scored target with every aggregate.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Score {
    pub checklist_id: String,
    pub target_id: String,
    pub item_scores: Vec<ItemScore>,
    pub pass_rate: f64,
    pub weighted_score: f64,
    pub normalized_score: f64,
    pub scaled_score_1_5: f64,
    pub primary_metric: PrimaryMetric,
    pub primary_score: f64,
    pub answered_count: u32,
    pub unanswered_count: u32,
    pub logprobs_unavailable: bool,
    pub schema_fallback: bool,
    /// With several samples: each sample's primary score on its own, in sample order; empty with
    /// one sample.
    pub sample_primary_scores: Vec<f64>,
    /// Sample standard deviation (n - 1) of `sample_primary_scores`; `None` with one sample.
    pub sample_spread: Option<f64>,
    /// Item abstentions summed over items.
    pub abstentions: u32,
    /// Under logprob confidence: items whose reply did not begin with an answer (its first token
    /// neither option), so their confidence came from alternatives the model did not pick.
    #[serde(default)]
    pub off_answer_items: u32,
}

impl Score {
    /// Whether the target was scored: at least one item got an answer. A target whose items all
    /// went unanswered (an unparseable or refused judge reply, every item call failed) has no
    /// score at all: its rates read 0 but mean nothing, and it is kept out of every mean and
    /// comparison, counted apart as unscored: an unanswered or unreadable item is never silently a zero.
    pub fn is_scored(&self) -> bool {
        self.answered_count > 0
    }

    /// Compute every aggregate from item scores (aligned with the checklist's items by id).
    ///
    /// An item without an answer (unanswered, unparseable, failed) is counted apart
    /// (`unanswered_count`) and kept out of the rates: pass_rate = #yes / #answered, the weighted
    /// score over the answered items' weights (an unanswered item is never silently counted as NO or zero).
    /// autochecklist 0.2.3 maps a missing batch answer to NO, which lowers its pass rate by an
    /// answer nobody gave; on fully answered checklists both agree to the last digit.
    pub fn compute(checklist: &Checklist, item_scores: Vec<ItemScore>, primary: PrimaryMetric) -> Score {
        let n = item_scores.len();
        let answered_items: Vec<&ItemScore> = item_scores.iter().filter(|s| s.has_answer()).collect();
        let yes = answered_items.iter().filter(|s| s.is_yes()).count();
        let pass_rate = if answered_items.is_empty() { 0.0 } else { yes as f64 / answered_items.len() as f64 };
        let weight_of = |id: &str| {
            checklist.items.iter().find(|i| i.id == id).map_or(crate::checklist::DEFAULT_WEIGHT, |i| i.weight)
        };
        let total_weight: f64 = answered_items.iter().map(|s| weight_of(&s.item_id)).sum();
        let yes_weight: f64 = item_scores.iter().filter(|s| s.is_yes()).map(|s| weight_of(&s.item_id)).sum();
        let weighted_score = if total_weight > 0.0 { yes_weight / total_weight } else { 0.0 };
        let confidences: Vec<f64> = item_scores.iter().filter_map(|s| s.confidence).collect();
        let normalized_score =
            if confidences.is_empty() { pass_rate } else { confidences.iter().sum::<f64>() / confidences.len() as f64 };
        let primary_score = match primary {
            PrimaryMetric::Pass => pass_rate,
            PrimaryMetric::Weighted => weighted_score,
            PrimaryMetric::Normalized => normalized_score,
        };
        let answered = answered_items.len() as u32;
        Score {
            checklist_id: checklist.id.clone(),
            target_id: String::new(),
            unanswered_count: n as u32 - answered,
            answered_count: answered,
            item_scores,
            pass_rate,
            weighted_score,
            normalized_score,
            scaled_score_1_5: pass_rate * 4.0 + 1.0,
            primary_metric: primary,
            primary_score,
            logprobs_unavailable: false,
            schema_fallback: false,
            sample_primary_scores: Vec::new(),
            sample_spread: None,
            abstentions: 0,
            off_answer_items: 0,
        }
    }

    /// A target scored several times (each sample through [`Score::compute`] on its own items,
    /// aligned with the checklist): every aggregate is the mean over samples of the sample's
    /// aggregate; the items carry the majority ([`ItemScore::majority`]) and the answered and
    /// unanswered counts count those; the per-sample primary scores and their spread are kept.
    /// One sample is returned as it is. A sample that scored nothing ([`Score::is_scored`]: its
    /// reply unparseable) abstains: the means and the per-sample scores are over the samples that
    /// scored, and a target no sample scored is unscored.
    pub fn combine_samples(checklist: &Checklist, mut samples: Vec<Score>, primary: PrimaryMetric) -> Score {
        if samples.len() <= 1 {
            return samples.pop().unwrap_or_else(|| Score::compute(checklist, Vec::new(), primary));
        }
        let scored: Vec<&Score> = samples.iter().filter(|s| s.is_scored()).collect();
        let k = scored.len().max(1) as f64;
        let mean_of = |f: fn(&Score) -> f64| scored.iter().map(|s| f(s)).sum::<f64>() / k;
        let n_items = samples.iter().map(|s| s.item_scores.len()).max().unwrap_or(0);
        let item_scores: Vec<ItemScore> = (0..n_items)
            .map(|j| {
                let per_sample: Vec<ItemScore> = samples.iter().filter_map(|s| s.item_scores.get(j).cloned()).collect();
                ItemScore::majority(&per_sample)
            })
            .collect();
        let sample_primary_scores: Vec<f64> = scored.iter().map(|s| s.primary_score).collect();
        let answered = item_scores.iter().filter(|s| s.status == ItemStatus::Answered).count() as u32;
        let first = &samples[0];
        Score {
            checklist_id: first.checklist_id.clone(),
            target_id: first.target_id.clone(),
            pass_rate: mean_of(|s| s.pass_rate),
            weighted_score: mean_of(|s| s.weighted_score),
            normalized_score: mean_of(|s| s.normalized_score),
            scaled_score_1_5: mean_of(|s| s.scaled_score_1_5),
            primary_metric: primary,
            primary_score: mean_of(|s| s.primary_score),
            answered_count: answered,
            unanswered_count: item_scores.len() as u32 - answered,
            logprobs_unavailable: samples.iter().any(|s| s.logprobs_unavailable),
            schema_fallback: samples.iter().any(|s| s.schema_fallback),
            sample_spread: (!sample_primary_scores.is_empty()).then(|| crate::stats::sd(&sample_primary_scores)),
            sample_primary_scores,
            abstentions: item_scores.iter().map(|s| s.abstentions).sum(),
            off_answer_items: samples.iter().map(|s| s.off_answer_items).sum(),
            item_scores,
        }
    }
}
