//! Scorer options: the primary metric, the mode and the built-in prompt, the configuration with
//! every field decided and its checks, and the settings a caller gives (unset fields take the
//! preset's defaults).

use serde::{Deserialize, Serialize};

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
