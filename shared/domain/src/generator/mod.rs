//! Checklist generation: instance-level requests with a preset ([`GenerateRequest`]), corpus-level
//! requests ([`CorpusRequest`]), the preset table, the requests' validation and the
//! [`ChecklistGenerator`] stage trait. No transport types.

pub mod corpus;
pub mod preset;

use crate::Usage;
use crate::limits::{MAX_CHECKLIST_ITEMS, MAX_TEXT_BYTES};

use crate::checklist::Checklist;
use crate::error::{StageError, Violations};
use crate::model::{ModelRecord, ModelSpec};
use crate::score::ScorerConfig;
use crate::stage::EventSink;

pub use corpus::{
    AugmentationMode, CorpusOutcome, CorpusPreset, CorpusProgress, CorpusRefinement, CorpusRequest, Dimension,
    SubDimension,
};
pub use preset::{CandidateSource, ItemShape, Preset, PresetId, PresetInfo, fields, preset_table};

/// How checklists produced by `source_method` (a preset's name) are meant to be scored: that
/// preset's defaults, or batch mode with the pass rate for any other source.
pub fn default_scorer_for(source_method: &str) -> ScorerConfig {
    if let Some(p) = Preset::from_name(source_method) {
        p.default_scorer()
    } else if let Some(p) = CorpusPreset::from_name(source_method) {
        p.default_scorer()
    } else {
        ScorerConfig::default()
    }
}

/// Most candidates one request may pass.
pub const MAX_CANDIDATES: usize = 32;
/// Most candidate models one request may name.
pub const MAX_CANDIDATE_MODELS: usize = 16;
/// A candidate response for contrastive generation.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Candidate {
    pub id: String,
    pub text: String,
    /// Model that produced it (generated candidates); empty when passed in without one.
    pub model: String,
}

/// Instance-level generation with a preset.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateRequest {
    pub preset: Preset,
    /// The instruction to build a checklist for.
    pub input: String,
    pub reference: String,
    pub history: String,
    /// Contrastive candidates (rlcf_candidate, rlcf_candidates_only; openrubrics_listwise: ranked
    /// responses, best first).
    pub candidates: Vec<Candidate>,
    /// openrubrics_pairwise.
    pub chosen: String,
    pub rejected: String,
    /// Overrides the preset's maximum number of items.
    pub max_items: Option<u32>,
    pub model: ModelSpec,
    /// Produce candidates when none are passed (several: one each at 0.7; one: 4 at 0.9).
    pub candidate_models: Vec<ModelSpec>,
}

impl GenerateRequest {
    /// Every domain-level rule of a request: required fields of the preset, text limits, counts.
    pub fn validate(&self) -> Result<(), StageError> {
        let request = self;
        let mut v = Violations::new();
        let preset = request.preset;
        let required = |v: &mut Violations, field: &str, text: &str| {
            if text.trim().is_empty() {
                v.push(field, format!("is required by preset {preset}"));
            }
        };
        required(&mut v, fields::INPUT, &request.input);
        if preset.needs_reference() {
            required(&mut v, fields::REFERENCE, &request.reference);
        }
        match preset.candidate_source() {
            CandidateSource::None => {}
            CandidateSource::PassedOrGenerated => {
                if request.candidates.is_empty() && request.candidate_models.is_empty() {
                    v.push(
                        fields::CANDIDATES,
                        format!(
                            "is required by preset {preset}: pass candidates, or candidate_models to generate them"
                        ),
                    );
                }
            }
            CandidateSource::PassedRanked => {
                if request.candidates.len() < 2 {
                    v.push(
                        fields::CANDIDATES,
                        format!(
                            "preset {preset} needs at least 2 responses ranked best first (got {}); candidate models cannot rank responses",
                            request.candidates.len()
                        ),
                    );
                }
            }
            CandidateSource::Pair => {
                required(&mut v, fields::CHOSEN, &request.chosen);
                required(&mut v, fields::REJECTED, &request.rejected);
            }
        }
        if let Some(n) = request.max_items
            && (n == 0 || n as usize > MAX_CHECKLIST_ITEMS)
        {
            v.push("max_items", format!("must be between 1 and {MAX_CHECKLIST_ITEMS} when set (got {n})"));
        }
        if request.candidates.len() > MAX_CANDIDATES {
            v.push(
                fields::CANDIDATES,
                format!("has {} candidates; the limit is {MAX_CANDIDATES}", request.candidates.len()),
            );
        }
        if request.candidate_models.len() > MAX_CANDIDATE_MODELS {
            v.push(
                "candidate_models",
                format!("has {} models; the limit is {MAX_CANDIDATE_MODELS}", request.candidate_models.len()),
            );
        }
        let uses_candidates =
            matches!(preset.candidate_source(), CandidateSource::PassedOrGenerated | CandidateSource::PassedRanked);
        for (i, c) in request.candidates.iter().enumerate() {
            if uses_candidates && c.text.trim().is_empty() {
                v.push(format!("candidates[{i}].text"), "must not be empty");
            }
            text_limit(&c.text, &format!("candidates[{i}].text"), &mut v);
        }
        text_limit(&request.input, "input", &mut v);
        text_limit(&request.reference, "reference", &mut v);
        text_limit(&request.history, "history", &mut v);
        text_limit(&request.chosen, "chosen", &mut v);
        text_limit(&request.rejected, "rejected", &mut v);
        v.into_result()
    }

    /// A request for `preset` on `input`, everything else unset.
    pub fn new(preset: Preset, input: impl Into<String>) -> Self {
        Self {
            preset,
            input: input.into(),
            reference: String::new(),
            history: String::new(),
            candidates: Vec::new(),
            chosen: String::new(),
            rejected: String::new(),
            max_items: None,
            model: ModelSpec::default(),
            candidate_models: Vec::new(),
        }
    }

    /// The maximum number of items: the request's, else the preset's.
    pub fn effective_max_items(&self) -> u32 {
        self.max_items.unwrap_or_else(|| self.preset.default_max_items())
    }

    /// The generation temperature: the request's model spec, else the preset's.
    pub fn effective_temperature(&self) -> f64 {
        self.model.temperature.unwrap_or_else(|| self.preset.default_temperature())
    }
}

/// A generated checklist with what it took.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GenerateOutcome {
    pub checklist: Checklist,
    /// Items beyond the maximum that were dropped.
    pub dropped_items: u32,
    /// The preset's default scorer configuration.
    pub default_scorer: ScorerConfig,
    /// Candidates used (passed in or generated); empty for presets without candidates.
    pub candidates: Vec<Candidate>,
    /// Summed over every model call (candidates included).
    pub usage: Usage,
    /// The generation call (phase `generator`).
    pub model: ModelRecord,
}

/// Most responses one [`RespondRequest`] asks for.
pub const MAX_RESPONSE_SAMPLES: u32 = 10;

/// A prompt for a model under test (a responder).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RespondRequest {
    pub model: ModelSpec,
    /// The system message, when not empty.
    pub system_prompt: String,
    /// The user message.
    pub prompt: String,
    /// Responses wanted (0 = 1), at most [`MAX_RESPONSE_SAMPLES`].
    pub samples: u32,
}

impl RespondRequest {
    /// The responses it asks for.
    pub fn sample_count(&self) -> u32 {
        self.samples.max(1)
    }

    /// Every rule of a request, fields named.
    pub fn validate(&self) -> Result<(), StageError> {
        let mut v = Violations::new();
        if self.prompt.trim().is_empty() {
            v.push("prompt", "is required");
        }
        text_limit(&self.prompt, "prompt", &mut v);
        text_limit(&self.system_prompt, "system_prompt", &mut v);
        if self.samples > MAX_RESPONSE_SAMPLES {
            v.push("samples", format!("is {}; the limit is {MAX_RESPONSE_SAMPLES}", self.samples));
        }
        v.into_result()
    }
}

/// A responder's responses, by sample, with what they took.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct RespondOutcome {
    pub responses: Vec<String>,
    pub usage: Usage,
    /// The calls' model (phase `responder`).
    pub model: ModelRecord,
}

/// The generator stage: the generator core in-process, or the generator service over gRPC
/// (`assay_rpc::remote::RemoteGenerator`).
#[async_trait::async_trait]
pub trait ChecklistGenerator: Send + Sync {
    /// Generate one checklist (instance level).
    async fn generate(&self, request: GenerateRequest) -> Result<GenerateOutcome, StageError>;
    /// Generate one corpus-level checklist, reporting progress (per batch, dimension, stage and
    /// refiner step) to `events`.
    async fn generate_corpus(
        &self,
        request: CorpusRequest,
        events: EventSink<'_, CorpusProgress>,
    ) -> Result<CorpusOutcome, StageError>;
    /// The presets (instance and corpus level) and their defaults.
    async fn list_presets(&self) -> Result<Vec<PresetInfo>, StageError>;
    /// Ask a model under test: one response per sample, reported to `events` as each finishes
    /// (sample index, text).
    async fn respond(
        &self,
        request: RespondRequest,
        events: EventSink<'_, (u32, String)>,
    ) -> Result<RespondOutcome, StageError>;
}

fn text_limit(text: &str, field: &str, v: &mut Violations) {
    if text.len() > MAX_TEXT_BYTES {
        v.push(field, format!("is {} bytes; the limit is {MAX_TEXT_BYTES} bytes", text.len()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields_of(e: StageError) -> Vec<String> {
        let StageError::InvalidArgument(v) = e else { panic!("not invalid argument: {e}") };
        v.into_iter().map(|f| f.field).collect()
    }

    #[test]
    fn required_fields_are_named() {
        let mut r = GenerateRequest::new(Preset::RlcfDirect, "Write a haiku.");
        assert_eq!(fields_of(r.validate().unwrap_err()), vec!["reference"]);
        r.reference = "An old pond".into();
        r.validate().unwrap();

        let r = GenerateRequest::new(Preset::RlcfCandidatesOnly, "x");
        assert_eq!(fields_of(r.validate().unwrap_err()), vec!["candidates"]);
        let mut r = GenerateRequest::new(Preset::RlcfCandidatesOnly, "x");
        r.candidate_models = vec![ModelSpec::default()];
        r.validate().unwrap();

        let r = GenerateRequest::new(Preset::OpenRubricsPairwise, " ");
        assert_eq!(fields_of(r.validate().unwrap_err()), vec!["input", "chosen", "rejected"]);

        let mut r = GenerateRequest::new(Preset::OpenRubricsListwise, "x");
        r.candidate_models = vec![ModelSpec::default()];
        assert_eq!(fields_of(r.validate().unwrap_err()), vec!["candidates"]);
    }

    #[test]
    fn limits_are_enforced() {
        let mut r = GenerateRequest::new(Preset::Tick, "x".repeat(MAX_TEXT_BYTES + 1));
        r.max_items = Some(0);
        r.history = "h".repeat(MAX_TEXT_BYTES + 1);
        let f = fields_of(r.validate().unwrap_err());
        assert_eq!(f, vec!["max_items", "input", "history"]);
        r = GenerateRequest::new(Preset::RlcfCandidatesOnly, "x");
        r.candidates = vec![Candidate { text: " ".into(), ..Default::default() }];
        assert_eq!(fields_of(r.validate().unwrap_err()), vec!["candidates[0].text"]);
    }

    #[test]
    fn request_values_win_over_preset_defaults() {
        let mut r = GenerateRequest::new(Preset::Tick, "x");
        assert_eq!((r.effective_max_items(), r.effective_temperature()), (8, 0.7));
        r.max_items = Some(3);
        r.model.temperature = Some(0.2);
        assert_eq!((r.effective_max_items(), r.effective_temperature()), (3, 0.2));
    }
}
