//! Scores and their aggregates (REFERENCE section 1 and 4).

use serde::{Deserialize, Serialize};

use crate::checklist::{Checklist, UNGROUPED};

/// A yes/no answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Answer {
    Yes,
    No,
}

impl Answer {
    /// Case-insensitive YES/NO (surrounding whitespace and punctuation ignored).
    pub fn parse(s: &str) -> Option<Answer> {
        let t = s.trim().trim_matches(|c: char| !c.is_alphanumeric());
        if t.eq_ignore_ascii_case("yes") {
            Some(Answer::Yes)
        } else if t.eq_ignore_ascii_case("no") {
            Some(Answer::No)
        } else {
            None
        }
    }
}

/// Confidence band.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ConfidenceLevel {
    No10,
    No30,
    Unsure,
    Yes70,
    Yes90,
}

impl ConfidenceLevel {
    /// Band of a confidence: < 0.2 no_10; < 0.4 no_30; < 0.6 unsure; < 0.8 yes_70; else yes_90.
    pub fn of(confidence: f64) -> ConfidenceLevel {
        if confidence < 0.2 {
            ConfidenceLevel::No10
        } else if confidence < 0.4 {
            ConfidenceLevel::No30
        } else if confidence < 0.6 {
            ConfidenceLevel::Unsure
        } else if confidence < 0.8 {
            ConfidenceLevel::Yes70
        } else {
            ConfidenceLevel::Yes90
        }
    }

    /// The answer a band implies (unsure counts as no).
    pub fn answer(self) -> Answer {
        match self {
            ConfidenceLevel::No10 | ConfidenceLevel::No30 | ConfidenceLevel::Unsure => Answer::No,
            ConfidenceLevel::Yes70 | ConfidenceLevel::Yes90 => Answer::Yes,
        }
    }
}

/// Whether an item got a usable answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ItemStatus {
    Answered,
    Unanswered,
    Unparseable,
    Failed,
}

/// The answer to one item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItemScore {
    pub item_id: String,
    pub answer: Option<Answer>,
    pub confidence: Option<f64>,
    pub confidence_level: Option<ConfidenceLevel>,
    pub reasoning: Option<String>,
    pub status: ItemStatus,
    pub error: String,
    /// With several samples: each sample's answer in sample order (`None`: that sample abstained).
    /// Empty with one sample.
    pub sample_answers: Vec<Option<Answer>>,
    /// YES samples / answered samples; `None` with one sample or when no sample answered.
    pub yes_share: Option<f64>,
    /// The answered samples disagree.
    pub flaky: bool,
    /// Samples with no answer for this item (unparseable, unanswered or failed), never a NO.
    pub abstentions: u32,
}

impl ItemScore {
    pub fn answered(item_id: impl Into<String>, answer: Answer) -> Self {
        Self {
            item_id: item_id.into(),
            answer: Some(answer),
            confidence: None,
            confidence_level: None,
            reasoning: None,
            status: ItemStatus::Answered,
            error: String::new(),
            sample_answers: Vec::new(),
            yes_share: None,
            flaky: false,
            abstentions: 0,
        }
    }

    pub fn missing(item_id: impl Into<String>, status: ItemStatus, error: impl Into<String>) -> Self {
        Self {
            item_id: item_id.into(),
            answer: None,
            confidence: None,
            confidence_level: None,
            reasoning: None,
            status,
            error: error.into(),
            sample_answers: Vec::new(),
            yes_share: None,
            flaky: false,
            abstentions: 0,
        }
    }

    pub fn is_yes(&self) -> bool {
        self.answer == Some(Answer::Yes)
    }

    /// The item was answered (it counts in the rates).
    pub fn has_answer(&self) -> bool {
        self.status == ItemStatus::Answered && self.answer.is_some()
    }

    /// One item judged by several samples (`samples[i]` is sample i's score of this item, at least
    /// one): the majority over the samples that answered (a tie is NO, and flaky), the yes-share,
    /// the abstentions (samples without an answer, never counted as NO). Answered when at least one
    /// sample answered, else the first sample's status and error. Confidence is the mean of the
    /// answered samples' confidences; reasoning the first one agreeing with the majority.
    pub fn majority(samples: &[ItemScore]) -> ItemScore {
        let answered: Vec<&ItemScore> =
            samples.iter().filter(|s| s.status == ItemStatus::Answered && s.answer.is_some()).collect();
        let sample_answers: Vec<Option<Answer>> =
            samples.iter().map(|s| if s.status == ItemStatus::Answered { s.answer } else { None }).collect();
        let abstentions = (samples.len() - answered.len()) as u32;
        let Some(first) = samples.first() else {
            return ItemScore::missing("", ItemStatus::Unanswered, "no sample");
        };
        if answered.is_empty() {
            return ItemScore {
                sample_answers,
                abstentions,
                ..ItemScore::missing(&first.item_id, first.status, &first.error)
            };
        }
        let yes = answered.iter().filter(|s| s.is_yes()).count();
        let no = answered.len() - yes;
        let answer = if yes > no { Answer::Yes } else { Answer::No };
        let confidences: Vec<f64> = answered.iter().filter_map(|s| s.confidence).collect();
        let confidence = (!confidences.is_empty()).then(|| confidences.iter().sum::<f64>() / confidences.len() as f64);
        ItemScore {
            item_id: first.item_id.clone(),
            answer: Some(answer),
            confidence,
            confidence_level: confidence.map(ConfidenceLevel::of),
            reasoning: answered.iter().find(|s| s.answer == Some(answer)).and_then(|s| s.reasoning.clone()),
            status: ItemStatus::Answered,
            error: String::new(),
            sample_answers,
            yes_share: Some(yes as f64 / answered.len() as f64),
            flaky: yes > 0 && no > 0,
            abstentions,
        }
    }
}

/// Which aggregate the primary score aliases.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum PrimaryMetric {
    #[default]
    Pass,
    Weighted,
    Normalized,
}

/// Batch (one call) or item (one call per question).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum ScoringMode {
    #[default]
    Batch,
    Item,
}

/// Which built-in prompt a scorer uses when no custom template is given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum ScoringPrompt {
    /// The generic batch and item prompts.
    #[default]
    Default,
    /// One criterion at a time, judged on the response alone (the rlcf presets).
    Rlcf,
    /// The conversation history, query and response, one question at a time (rocketeval).
    RocketEval,
}

/// Placeholders a custom scorer template may use. `{checklist}` is another name for
/// `{question}` (the numbered questions in batch mode), as the original library calls it.
pub const SCORER_PLACEHOLDERS: &[&str] = &["input", "target", "question", "checklist", "history", "reference"];

/// Most samples per target ([`ScorerConfig::samples`]).
pub const MAX_JUDGE_SAMPLES: u32 = 10;
/// Most judge models of [`ScorerConfig::sample_models`].
pub const MAX_SAMPLE_MODELS: usize = 10;

/// Scorer options, every field decided.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ScorerConfig {
    pub mode: ScoringMode,
    pub primary_metric: PrimaryMetric,
    pub capture_reasoning: bool,
    pub use_logprobs: bool,
    pub prompt: ScoringPrompt,
    pub prompt_template: Option<String>,
    /// Most model calls of one scoring request in flight at once, over all its targets and items
    /// (0 = the service's default). The backend's own limit applies under it.
    pub concurrency: u32,
    /// Times each target is scored as a whole (1 to [`MAX_JUDGE_SAMPLES`]; 1 is one scoring as
    /// without repeated judging). Sample i > 0 sends seed (spec seed or 0) + i.
    pub samples: u32,
    /// Judge model names used round-robin over the samples (sample i: `sample_models[i % len]`
    /// on the scorer's backend); empty = the scorer's model.
    pub sample_models: Vec<String>,
}

impl Default for ScorerConfig {
    fn default() -> Self {
        Self {
            mode: ScoringMode::default(),
            primary_metric: PrimaryMetric::default(),
            capture_reasoning: false,
            use_logprobs: false,
            prompt: ScoringPrompt::default(),
            prompt_template: None,
            concurrency: 0,
            samples: 1,
            sample_models: Vec::new(),
        }
    }
}

impl ScorerConfig {
    /// Normalized needs logprobs.
    pub fn wants_logprobs(&self) -> bool {
        self.use_logprobs || self.primary_metric == PrimaryMetric::Normalized
    }

    /// What is wrong with this configuration (fields named `{field}.*`): unknown placeholders, a
    /// custom template that never shows the response or the questions, logprobs in batch mode.
    pub fn check(&self, field: &str, v: &mut crate::Violations) {
        if let Some(t) = &self.prompt_template {
            let unknown = crate::template::unknown_placeholders(t, SCORER_PLACEHOLDERS);
            if !unknown.is_empty() {
                v.push(
                    format!("{field}.prompt_template"),
                    format!(
                        "unknown placeholder(s) {{{}}} (allowed: {{input}} {{target}} {{question}} {{checklist}} {{history}} {{reference}})",
                        unknown.join("}, {")
                    ),
                );
            }
            if !crate::template::has_placeholder(t, "target") {
                v.push(format!("{field}.prompt_template"), "must contain the {target} placeholder");
            }
            if !crate::template::has_placeholder(t, "question") && !crate::template::has_placeholder(t, "checklist") {
                let what = match self.mode {
                    ScoringMode::Batch => "the numbered questions",
                    ScoringMode::Item => "the question",
                };
                v.push(
                    format!("{field}.prompt_template"),
                    format!("must contain the {{question}} (or {{checklist}}) placeholder: it shows the judge {what}"),
                );
            }
        }
        if !(1..=MAX_JUDGE_SAMPLES).contains(&self.samples) {
            v.push(format!("{field}.samples"), format!("is {}; must be 1 to {MAX_JUDGE_SAMPLES}", self.samples));
        }
        check_sample_models(&self.sample_models, field, v);
        if self.mode == ScoringMode::Batch && self.wants_logprobs() {
            v.push(
                format!("{field}.mode"),
                "logprob confidence (use_logprobs or the normalized metric) needs item mode: the first token of a batch reply is not an answer",
            );
        }
    }
}

/// What is wrong with a list of judge models (fields `{field}.sample_models*`): more than
/// [`MAX_SAMPLE_MODELS`] entries, blank entries.
pub fn check_sample_models(models: &[String], field: &str, v: &mut crate::Violations) {
    if models.len() > MAX_SAMPLE_MODELS {
        v.push(
            format!("{field}.sample_models"),
            format!("has {} models; the limit is {MAX_SAMPLE_MODELS}", models.len()),
        );
    }
    for (i, m) in models.iter().enumerate() {
        if m.trim().is_empty() {
            v.push(format!("{field}.sample_models[{i}]"), "must not be blank");
        }
    }
}

/// Scorer options as a caller gives them: any field may be left unset, to take the default of the
/// preset the checklist comes from ([`crate::generator::default_scorer_for`]).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ScorerSettings {
    pub mode: Option<ScoringMode>,
    pub primary_metric: Option<PrimaryMetric>,
    pub capture_reasoning: Option<bool>,
    pub use_logprobs: Option<bool>,
    pub prompt: Option<ScoringPrompt>,
    pub prompt_template: Option<String>,
    pub concurrency: Option<u32>,
    /// Samples per target; unset = the defaults' (1).
    pub samples: Option<u32>,
    /// Judge models round-robin; empty = the defaults'.
    pub sample_models: Vec<String>,
}

impl ScorerSettings {
    /// Every field set, from a whole configuration.
    pub fn all(c: &ScorerConfig) -> Self {
        Self {
            mode: Some(c.mode),
            primary_metric: Some(c.primary_metric),
            capture_reasoning: Some(c.capture_reasoning),
            use_logprobs: Some(c.use_logprobs),
            prompt: Some(c.prompt),
            prompt_template: c.prompt_template.clone(),
            concurrency: Some(c.concurrency),
            samples: Some(c.samples),
            sample_models: c.sample_models.clone(),
        }
    }

    /// The set fields over `defaults`, field by field. An unset mode becomes item mode when the
    /// settings ask for logprob confidence (batch mode cannot give it).
    pub fn resolve(&self, defaults: &ScorerConfig) -> ScorerConfig {
        let primary_metric = self.primary_metric.unwrap_or(defaults.primary_metric);
        let use_logprobs = self.use_logprobs.unwrap_or(defaults.use_logprobs);
        let wants_logprobs = use_logprobs || primary_metric == PrimaryMetric::Normalized;
        let mode = self.mode.unwrap_or(if wants_logprobs { ScoringMode::Item } else { defaults.mode });
        ScorerConfig {
            mode,
            primary_metric,
            capture_reasoning: self.capture_reasoning.unwrap_or(defaults.capture_reasoning),
            use_logprobs,
            prompt: self.prompt.unwrap_or(defaults.prompt),
            prompt_template: self.prompt_template.clone().or_else(|| defaults.prompt_template.clone()),
            concurrency: self.concurrency.unwrap_or(defaults.concurrency),
            samples: self.samples.unwrap_or(defaults.samples),
            sample_models: if self.sample_models.is_empty() {
                defaults.sample_models.clone()
            } else {
                self.sample_models.clone()
            },
        }
    }
}

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
    /// comparison, counted apart as unscored (REFERENCE section 4: never silently a zero).
    pub fn is_scored(&self) -> bool {
        self.answered_count > 0
    }

    /// Compute every aggregate from item scores (aligned with the checklist's items by id).
    ///
    /// An item without an answer (unanswered, unparseable, failed) is counted apart
    /// (`unanswered_count`) and kept out of the rates: pass_rate = #yes / #answered, the weighted
    /// score over the answered items' weights (REFERENCE: "never silently counted as NO or zero").
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checklist::ChecklistItem;

    fn checklist() -> Checklist {
        let mut items =
            vec![ChecklistItem::new("a", "qa"), ChecklistItem::new("b", "qb"), ChecklistItem::new("c", "qc")];
        items[0].weight = 50.0;
        items[1].weight = 30.0;
        items[2].weight = 20.0;
        items[0].category = Some("x".into());
        Checklist { id: "cl".into(), items, ..Default::default() }
    }

    #[test]
    fn aggregates_follow_the_formulas() {
        let cl = checklist();
        let mut a = ItemScore::answered("a", Answer::Yes);
        a.confidence = Some(0.9);
        let b = ItemScore::answered("b", Answer::No);
        let mut c = ItemScore::answered("c", Answer::Yes);
        c.confidence = Some(0.7);
        let s = Score::compute(&cl, vec![a, b, c], PrimaryMetric::Weighted);
        assert!((s.pass_rate - 2.0 / 3.0).abs() < 1e-12);
        assert!((s.weighted_score - 0.7).abs() < 1e-12);
        assert!((s.normalized_score - 0.8).abs() < 1e-12);
        assert!((s.scaled_score_1_5 - (2.0 / 3.0 * 4.0 + 1.0)).abs() < 1e-12);
        assert_eq!(s.primary_score, s.weighted_score);
        assert_eq!(s.answered_count, 3);
    }

    #[test]
    fn unanswered_items_are_counted_not_hidden() {
        let cl = checklist();
        let s = Score::compute(
            &cl,
            vec![
                ItemScore::answered("a", Answer::Yes),
                ItemScore::missing("b", ItemStatus::Unanswered, "no answer"),
                ItemScore::answered("c", Answer::Yes),
            ],
            PrimaryMetric::Pass,
        );
        assert_eq!((s.unanswered_count, s.answered_count), (1, 2));
        // Kept out of the rates, not counted as NO: both answers are YES.
        assert_eq!(s.pass_rate, 1.0);
        assert_eq!(s.weighted_score, 1.0, "over the answered items' weights");
        assert!((s.normalized_score - s.pass_rate).abs() < 1e-12);
        assert_eq!(s.scaled_score_1_5, 5.0);
        // One NO among the answered: 1/2, weights 50 (a, YES) of 50 + 20.
        let s = Score::compute(
            &cl,
            vec![
                ItemScore::answered("a", Answer::Yes),
                ItemScore::missing("b", ItemStatus::Unparseable, "no yes/no"),
                ItemScore::answered("c", Answer::No),
            ],
            PrimaryMetric::Weighted,
        );
        assert_eq!(s.pass_rate, 0.5);
        assert!((s.weighted_score - 50.0 / 70.0).abs() < 1e-12);
        // Nothing answered: zero, and every item counted unanswered.
        let s =
            Score::compute(&cl, vec![ItemScore::missing("a", ItemStatus::Failed, "backend down")], PrimaryMetric::Pass);
        assert_eq!((s.pass_rate, s.unanswered_count, s.answered_count), (0.0, 1, 0));
        // Aggregates: the micro rate and the categories count answered items only.
        let one = Score::compute(
            &cl,
            vec![
                ItemScore::answered("a", Answer::Yes),
                ItemScore::missing("b", ItemStatus::Unanswered, "no answer"),
                ItemScore::answered("c", Answer::No),
            ],
            PrimaryMetric::Pass,
        );
        let agg = AggregateScores::compute([(&one, &cl)]);
        assert_eq!((agg.micro_pass_rate, agg.macro_pass_rate, agg.unanswered_items), (0.5, 0.5, 1));
        let ungrouped = agg.category_pass_rates.iter().find(|c| c.category == UNGROUPED).expect("ungrouped");
        assert_eq!((ungrouped.pass_rate, ungrouped.items), (0.0, 1), "c (NO) only: b has no answer");
    }

    /// Issue 59, point 1: record 1 all YES, record 2's reply unparseable. Before, record 2 was a
    /// primary score of 0 in the mean (0.5) and in the interval; it is unscored, counted apart.
    #[test]
    fn an_unparseable_reply_is_unscored_not_a_zero() {
        let cl = checklist();
        let yes = Score::compute(
            &cl,
            ["a", "b", "c"].iter().map(|i| ItemScore::answered(*i, Answer::Yes)).collect(),
            PrimaryMetric::Pass,
        );
        let garbled = Score::compute(
            &cl,
            ["a", "b", "c"].iter().map(|i| ItemScore::missing(*i, ItemStatus::Unparseable, "no yes/no")).collect(),
            PrimaryMetric::Pass,
        );
        assert!(yes.is_scored() && !garbled.is_scored());
        let mut third = yes.clone();
        third.target_id = "r3".into();
        let agg = AggregateScores::compute([(&yes, &cl), (&garbled, &cl), (&third, &cl)]);
        assert_eq!((agg.targets, agg.unscored_targets, agg.scored_targets()), (3, 1, 2));
        assert_eq!((agg.mean_primary_score, agg.macro_pass_rate, agg.micro_pass_rate), (1.0, 1.0, 1.0));
        assert_eq!(agg.unanswered_items, 3, "its items are still counted unanswered");
        assert_eq!(agg.uncertainty.as_ref().map(|u| (u.observations, u.mean)), Some((2, 1.0)));
        // Nothing scored at all: no mean to give (0, with every target unscored).
        let none = AggregateScores::compute([(&garbled, &cl)]);
        assert_eq!((none.targets, none.unscored_targets, none.mean_primary_score), (1, 1, 0.0));
        assert!(none.uncertainty.is_none());

        // With samples, a sample whose reply was unparseable abstains: the means are over the
        // others (1.0, not 2/3), and a target no sample scored is unscored.
        let s = Score::combine_samples(&cl, vec![yes.clone(), garbled.clone(), yes.clone()], PrimaryMetric::Pass);
        assert!(s.is_scored());
        assert_eq!((s.primary_score, s.sample_primary_scores.clone()), (1.0, vec![1.0, 1.0]));
        let s = Score::combine_samples(&cl, vec![garbled.clone(), garbled], PrimaryMetric::Pass);
        assert!(!s.is_scored() && s.sample_primary_scores.is_empty() && s.sample_spread.is_none());
    }

    #[test]
    fn empty_checklist_scores_zero() {
        let cl = Checklist::default();
        let s = Score::compute(&cl, vec![], PrimaryMetric::Pass);
        assert_eq!(s.pass_rate, 0.0);
        assert_eq!(s.weighted_score, 0.0);
        assert_eq!(s.scaled_score_1_5, 1.0);
    }

    #[test]
    fn zero_weights_give_zero_weighted_score() {
        let mut cl = checklist();
        for i in &mut cl.items {
            i.weight = 0.0;
        }
        let s = Score::compute(&cl, vec![ItemScore::answered("a", Answer::Yes)], PrimaryMetric::Weighted);
        assert_eq!(s.weighted_score, 0.0);
    }

    #[test]
    fn confidence_bands_at_exact_boundaries() {
        assert_eq!(ConfidenceLevel::of(0.0), ConfidenceLevel::No10);
        assert_eq!(ConfidenceLevel::of(0.19999), ConfidenceLevel::No10);
        assert_eq!(ConfidenceLevel::of(0.2), ConfidenceLevel::No30);
        assert_eq!(ConfidenceLevel::of(0.4), ConfidenceLevel::Unsure);
        assert_eq!(ConfidenceLevel::of(0.6), ConfidenceLevel::Yes70);
        assert_eq!(ConfidenceLevel::of(0.8), ConfidenceLevel::Yes90);
        assert_eq!(ConfidenceLevel::of(1.0), ConfidenceLevel::Yes90);
        assert_eq!(ConfidenceLevel::Unsure.answer(), Answer::No);
    }

    #[test]
    fn settings_fill_unset_fields_from_the_defaults_one_by_one() {
        let rlcf = ScorerConfig {
            mode: ScoringMode::Item,
            primary_metric: PrimaryMetric::Weighted,
            prompt: ScoringPrompt::Rlcf,
            ..ScorerConfig::default()
        };
        let only_reasoning = ScorerSettings { capture_reasoning: Some(true), ..ScorerSettings::default() };
        let c = only_reasoning.resolve(&rlcf);
        assert_eq!(
            (c.mode, c.primary_metric, c.prompt),
            (ScoringMode::Item, PrimaryMetric::Weighted, ScoringPrompt::Rlcf)
        );
        assert!(c.capture_reasoning);
        let rocket = ScorerConfig {
            mode: ScoringMode::Item,
            primary_metric: PrimaryMetric::Normalized,
            use_logprobs: true,
            prompt: ScoringPrompt::RocketEval,
            ..ScorerConfig::default()
        };
        let c = ScorerSettings { capture_reasoning: Some(true), ..ScorerSettings::default() }.resolve(&rocket);
        assert!(c.use_logprobs && c.wants_logprobs());
        assert_eq!(c.primary_metric, PrimaryMetric::Normalized);
        // A set field wins, false included.
        let c = ScorerSettings {
            use_logprobs: Some(false),
            primary_metric: Some(PrimaryMetric::Pass),
            ..ScorerSettings::default()
        }
        .resolve(&rocket);
        assert!(!c.wants_logprobs());
        // The normalized metric on a batch preset moves to item mode unless the mode is set.
        let batch = ScorerConfig::default();
        let normalized =
            ScorerSettings { primary_metric: Some(PrimaryMetric::Normalized), ..ScorerSettings::default() };
        assert_eq!(normalized.resolve(&batch).mode, ScoringMode::Item);
        let forced = ScorerSettings { mode: Some(ScoringMode::Batch), ..normalized };
        assert_eq!(forced.resolve(&batch).mode, ScoringMode::Batch);
        assert_eq!(ScorerSettings::all(&rocket).resolve(&batch), rocket);
    }

    #[test]
    fn custom_templates_must_show_the_response_and_the_questions() {
        let check = |mode, t: &str| {
            let mut v = crate::Violations::new();
            ScorerConfig { mode, prompt_template: Some(t.into()), ..ScorerConfig::default() }.check("config", &mut v);
            v.into_result().err().map(|e| e.to_string()).unwrap_or_default()
        };
        assert!(check(ScoringMode::Item, "Is {target} good?").contains("{question}"));
        assert!(check(ScoringMode::Batch, "Rate {target}").contains("numbered questions"));
        assert!(check(ScoringMode::Batch, "{question}").contains("{target}"));
        assert_eq!(check(ScoringMode::Batch, "{target}\n{checklist}"), "");
        assert_eq!(check(ScoringMode::Item, "{target} / {question} / {reference}"), "");
        assert!(check(ScoringMode::Item, "{target} {question} {refrence}").contains("refrence"));
    }

    #[test]
    fn answers_parse_case_insensitively() {
        assert_eq!(Answer::parse("yes"), Some(Answer::Yes));
        assert_eq!(Answer::parse(" YES."), Some(Answer::Yes));
        assert_eq!(Answer::parse("No"), Some(Answer::No));
        assert_eq!(Answer::parse("maybe"), None);
    }

    #[test]
    fn macro_micro_and_categories() {
        let cl = checklist();
        let s1 = Score::compute(
            &cl,
            vec![
                ItemScore::answered("a", Answer::Yes),
                ItemScore::answered("b", Answer::Yes),
                ItemScore::answered("c", Answer::Yes),
            ],
            PrimaryMetric::Pass,
        );
        let cl2 = Checklist { id: "cl2".into(), items: vec![ChecklistItem::new("z", "qz")], ..Default::default() };
        let s2 = Score::compute(&cl2, vec![ItemScore::answered("z", Answer::No)], PrimaryMetric::Pass);
        let agg = AggregateScores::compute([(&s1, &cl), (&s2, &cl2)]);
        assert_eq!(agg.targets, 2);
        assert!((agg.macro_pass_rate - 0.5).abs() < 1e-12);
        assert!((agg.micro_pass_rate - 0.75).abs() < 1e-12);
        assert_eq!(agg.category_pass_rates[0].category, "x");
        assert_eq!(agg.category_pass_rates[1].category, UNGROUPED);
        assert!((agg.category_pass_rates[1].pass_rate - 2.0 / 3.0).abs() < 1e-12);
    }

    fn sample(cl: &Checklist, target: &str, answers: &[Option<Answer>]) -> Score {
        let items = cl
            .items
            .iter()
            .zip(answers)
            .map(|(it, a)| match a {
                Some(a) => ItemScore::answered(&it.id, *a),
                None => ItemScore::missing(&it.id, ItemStatus::Unparseable, "no yes/no"),
            })
            .collect();
        let mut s = Score::compute(cl, items, PrimaryMetric::Weighted);
        s.target_id = target.into();
        s
    }

    #[test]
    fn the_majority_counts_abstentions_apart_and_a_tie_is_a_flaky_no() {
        use Answer::{No, Yes};
        let item = |a: Option<Answer>| match a {
            Some(a) => ItemScore::answered("a", a),
            None => ItemScore::missing("a", ItemStatus::Unparseable, "garbled"),
        };
        let m = ItemScore::majority(&[item(Some(Yes)), item(None), item(Some(No)), item(Some(Yes))]);
        assert_eq!((m.answer, m.status, m.flaky, m.abstentions), (Some(Yes), ItemStatus::Answered, true, 1));
        assert_eq!(m.yes_share, Some(2.0 / 3.0));
        assert_eq!(m.sample_answers, vec![Some(Yes), None, Some(No), Some(Yes)]);
        // An abstention is never a NO: one YES and two abstentions is a unanimous YES.
        let m = ItemScore::majority(&[item(None), item(Some(Yes)), item(None)]);
        assert_eq!((m.answer, m.flaky, m.abstentions, m.yes_share), (Some(Yes), false, 2, Some(1.0)));
        let tie = ItemScore::majority(&[item(Some(Yes)), item(Some(No))]);
        assert_eq!((tie.answer, tie.flaky, tie.yes_share), (Some(No), true, Some(0.5)));
        let none = ItemScore::majority(&[item(None), item(None)]);
        assert_eq!((none.answer, none.status, none.yes_share), (None, ItemStatus::Unparseable, None));
        assert_eq!((none.error.as_str(), none.abstentions), ("garbled", 2));
    }

    #[test]
    fn samples_combine_into_mean_aggregates_and_majority_items() {
        use Answer::{No, Yes};
        let cl = checklist();
        let samples = vec![
            sample(&cl, "t", &[Some(Yes), Some(Yes), Some(No)]),
            sample(&cl, "t", &[Some(Yes), Some(No), None]),
            sample(&cl, "t", &[Some(No), Some(Yes), Some(No)]),
        ];
        let primaries: Vec<f64> = samples.iter().map(|s| s.primary_score).collect();
        // The second sample's third item has no answer: its rates are over the two answered
        // items (weights 50 + 30).
        assert_eq!(primaries, vec![0.8, 0.625, 0.3]);
        let s = Score::combine_samples(&cl, samples.clone(), PrimaryMetric::Weighted);
        assert!((s.primary_score - 1.725 / 3.0).abs() < 1e-12);
        assert!((s.weighted_score - 1.725 / 3.0).abs() < 1e-12);
        assert!((s.pass_rate - (2.0 / 3.0 + 1.0 / 2.0 + 1.0 / 3.0) / 3.0).abs() < 1e-12);
        assert!((s.scaled_score_1_5 - (s.pass_rate * 4.0 + 1.0)).abs() < 1e-12);
        assert_eq!(s.sample_primary_scores, primaries);
        assert!((s.sample_spread.unwrap() - crate::stats::sd(&primaries)).abs() < 1e-15);
        assert!((s.sample_spread.unwrap() - 0.2537222891273055).abs() < 1e-12);
        let answers: Vec<_> = s.item_scores.iter().map(|i| (i.answer, i.flaky)).collect();
        assert_eq!(answers, vec![(Some(Yes), true), (Some(Yes), true), (Some(No), false)]);
        assert_eq!((s.abstentions, s.answered_count, s.unanswered_count, s.target_id.as_str()), (1, 3, 0, "t"));
        // One sample is the sample itself.
        assert_eq!(Score::combine_samples(&cl, samples[..1].to_vec(), PrimaryMetric::Weighted), samples[0]);
    }

    #[test]
    fn uncertainty_is_the_standard_error_of_the_observations() {
        use Answer::{No, Yes};
        let cl = checklist();
        let one = |t: &str, a: &[Option<Answer>]| sample(&cl, t, a);
        // One sample per target: naive only, one observation per target.
        let scores = [
            one("r1", &[Some(Yes), Some(Yes), Some(No)]),
            one("r2", &[Some(No), Some(Yes), Some(No)]),
            one("r3", &[Some(Yes), Some(Yes), Some(Yes)]),
        ];
        let agg = AggregateScores::compute(scores.iter().map(|s| (s, &cl)));
        let want = crate::stats::standard_error(&[("r1", 0.8), ("r2", 0.3), ("r3", 1.0)], 0.05).unwrap();
        let u = agg.uncertainty.clone().unwrap();
        assert_eq!(u, ScoreUncertainty::from(&want));
        assert_eq!((u.observations, u.clusters, u.se_clustered), (3, 0, None));
        assert_eq!((u.se, u.ci), (want.se_naive, want.ci_naive));
        assert!((u.mean - agg.mean_primary_score).abs() < 1e-12);
        // Several samples per target: one observation per sample, clustered by target.
        let a = Score::combine_samples(
            &cl,
            vec![one("r1", &[Some(Yes), Some(Yes), Some(No)]), one("r1", &[Some(Yes), Some(No), Some(No)])],
            PrimaryMetric::Weighted,
        );
        let b = Score::combine_samples(
            &cl,
            vec![one("r2", &[Some(No), Some(No), Some(No)]), one("r2", &[Some(No), Some(Yes), Some(No)])],
            PrimaryMetric::Weighted,
        );
        let c = Score::combine_samples(
            &cl,
            vec![one("r3", &[Some(Yes), Some(Yes), Some(Yes)]), one("r3", &[Some(Yes), Some(Yes), Some(No)])],
            PrimaryMetric::Weighted,
        );
        let agg = AggregateScores::compute([(&a, &cl), (&b, &cl), (&c, &cl)]);
        let obs = [("r1", 0.8), ("r1", 0.5), ("r2", 0.0), ("r2", 0.3), ("r3", 1.0), ("r3", 0.8)];
        let want = crate::stats::standard_error(&obs, 0.05).unwrap();
        let u = agg.uncertainty.unwrap();
        assert_eq!(u, ScoreUncertainty::from(&want));
        assert_eq!((u.observations, u.clusters), (6, 3));
        assert_eq!(Some(u.se), want.se_clustered);
        assert_eq!(Some(u.ci), want.ci_clustered);
        assert!(u.inflation.is_some());
        // Fewer than two observations: no uncertainty.
        let single = one("r1", &[Some(Yes), Some(Yes), Some(No)]);
        assert_eq!(AggregateScores::compute([(&single, &cl)]).uncertainty, None);
        assert_eq!(AggregateScores::compute(std::iter::empty()).uncertainty, None);
    }

    #[test]
    fn sample_settings_are_checked_with_their_limits() {
        let check = |samples: u32, models: &[&str]| {
            let mut v = crate::Violations::new();
            ScorerConfig {
                samples,
                sample_models: models.iter().map(|m| m.to_string()).collect(),
                ..Default::default()
            }
            .check("config", &mut v);
            v.into_result().err().map(|e| e.to_string()).unwrap_or_default()
        };
        assert_eq!(check(1, &[]), "");
        assert_eq!(check(10, &["a", "b"]), "");
        assert!(check(0, &[]).contains("config.samples") && check(0, &[]).contains("1 to 10"));
        assert!(check(11, &[]).contains("config.samples"));
        assert!(check(2, &["a", " "]).contains("config.sample_models[1]"));
        let many = ["m"; 11];
        assert!(check(2, &many).contains("config.sample_models") && check(2, &many).contains("limit is 10"));
        // Unset settings keep the defaults: one sample, the scorer's model.
        let c = ScorerSettings::default().resolve(&ScorerConfig::default());
        assert_eq!((c.samples, c.sample_models.len()), (1, 0));
        let c = ScorerSettings { samples: Some(3), sample_models: vec!["j".into()], ..Default::default() }
            .resolve(&ScorerConfig::default());
        assert_eq!((c.samples, c.sample_models), (3, vec!["j".to_string()]));
    }
}
