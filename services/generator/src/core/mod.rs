//! Instance-level checklist generation (REFERENCE section 2): presets with their required inputs,
//! defaults (max items, temperature, scorer config), weighted and categorized items, contrastive
//! candidates passed in or produced by candidate models. No transport types here.

pub mod corpus;
pub mod parse;
pub mod preset;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use assay_domain::limits::{MAX_CHECKLIST_ITEMS, MAX_QUESTION_BYTES, MAX_TEXT_BYTES};
use assay_domain::template::render;
use assay_domain::{
    Checklist, ChecklistItem, EventSink, GenerationLevel, ModelHub, ModelRecord, ModelSpec, ResolvedChat, ScorerConfig,
    StageError, Usage, Violations,
};
use assay_llm::{ChatRequest, Message, ResponseFormat};
use futures::StreamExt;
use sha2::{Digest, Sha256};

pub use corpus::{
    AugmentationMode, CorpusOutcome, CorpusPreset, CorpusProgress, CorpusRefinement, CorpusRequest, Dimension,
    SubDimension,
};
pub use parse::{HARD_RULE, PRINCIPLE, ParsedItem, ParsedReply, normalize_category, parse_reply, schema};
pub use preset::{CandidateSource, ItemShape, Preset, PresetId, PresetInfo, fields, preset_table};

/// Configuration phase the generator resolves its model for.
pub const PHASE: &str = "generator";
/// Configuration phase of the candidate models.
pub const CANDIDATES_PHASE: &str = "generator_candidates";

/// Placeholders the generator's prompt templates use.
pub const PLACEHOLDERS: &[&str] = &["input", "reference", "history", "candidates", "chosen", "rejected", "max_items"];

/// Most candidates one request may pass.
pub const MAX_CANDIDATES: usize = 32;
/// Most candidate models one request may name.
pub const MAX_CANDIDATE_MODELS: usize = 16;
/// Responses drawn from a single candidate model.
pub const SINGLE_MODEL_CANDIDATES: usize = 4;
/// Candidate temperature with several candidate models (one response each).
pub const MULTI_MODEL_TEMPERATURE: f64 = 0.7;
/// Candidate temperature with one candidate model (several responses).
pub const SINGLE_MODEL_TEMPERATURE: f64 = 0.9;
/// Max tokens of a candidate response unless configured.
pub const CANDIDATE_MAX_TOKENS: u32 = 1024;
/// Tokens budgeted per requested item in the generation reply.
pub const TOKENS_PER_ITEM: u32 = 80;
/// Default concurrent candidate calls per request.
pub const DEFAULT_CONCURRENCY: usize = 8;

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

/// The generator stage: what the gateway holds (in-process core or remote client).
#[async_trait::async_trait]
pub trait ChecklistGenerator: Send + Sync {
    /// Generate one checklist (instance level).
    async fn generate(&self, request: GenerateRequest) -> Result<GenerateOutcome, StageError>;
    /// Generate one corpus-level checklist, reporting progress (per batch, dimension, stage and
    /// refiner step) to `events`. Implementations without corpus support answer UNIMPLEMENTED.
    async fn generate_corpus(
        &self,
        request: CorpusRequest,
        events: EventSink<'_, CorpusProgress>,
    ) -> Result<CorpusOutcome, StageError> {
        let _ = (request, events);
        Err(StageError::Unimplemented("this generator does not do corpus-level generation".into()))
    }
    /// The presets (instance and corpus level) and their defaults.
    async fn list_presets(&self) -> Result<Vec<PresetInfo>, StageError>;
}

/// The generator core.
#[derive(Clone)]
pub struct Generator {
    hub: Arc<ModelHub>,
    /// Concurrent candidate calls per request.
    concurrency: usize,
}

fn sha256_hex(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

fn now_seconds() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

fn text_limit(text: &str, field: &str, v: &mut Violations) {
    if text.len() > MAX_TEXT_BYTES {
        v.push(field, format!("is {} bytes; the limit is {MAX_TEXT_BYTES} bytes", text.len()));
    }
}

/// Candidates as they go into a prompt: numbered blocks.
pub fn format_candidates(candidates: &[Candidate]) -> String {
    candidates
        .iter()
        .enumerate()
        .map(|(i, c)| format!("### Response {}\n{}", i + 1, c.text.trim()))
        .collect::<Vec<_>>()
        .join("\n\n")
}

impl Generator {
    pub fn new(hub: Arc<ModelHub>) -> Self {
        Self { hub, concurrency: DEFAULT_CONCURRENCY }
    }

    /// Bound on concurrent candidate calls per request (at least 1).
    pub fn with_concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// The presets (instance, then corpus level) and their defaults.
    pub fn presets(&self) -> Vec<PresetInfo> {
        preset_table()
    }

    /// Every domain-level rule of a request: required fields of the preset, text limits, counts.
    pub fn validate(request: &GenerateRequest) -> Result<(), StageError> {
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

    /// Generate one checklist.
    pub async fn generate(&self, request: GenerateRequest) -> Result<GenerateOutcome, StageError> {
        Self::validate(&request)?;
        let preset = request.preset;
        // Resolve every model before the first call, so a bad backend name costs no call.
        let chat = self.hub.chat(PHASE, &request.model, "model")?;
        let source = preset.candidate_source();
        let generate_candidates = source == CandidateSource::PassedOrGenerated && request.candidates.is_empty();
        let candidate_chats = if generate_candidates {
            request
                .candidate_models
                .iter()
                .enumerate()
                .map(|(i, spec)| {
                    Ok((self.hub.chat(CANDIDATES_PHASE, spec, &format!("candidate_models[{i}]"))?, spec.clone()))
                })
                .collect::<Result<Vec<_>, StageError>>()?
        } else {
            Vec::new()
        };

        let mut usage = Usage::default();
        let candidates = if generate_candidates {
            let (c, u) = self.candidates(&request.input, &candidate_chats).await?;
            usage.add(&u);
            c
        } else {
            match source {
                CandidateSource::None | CandidateSource::Pair => Vec::new(),
                CandidateSource::PassedOrGenerated | CandidateSource::PassedRanked => request
                    .candidates
                    .iter()
                    .enumerate()
                    .map(|(i, c)| Candidate {
                        id: if c.id.is_empty() { format!("c{}", i + 1) } else { c.id.clone() },
                        text: c.text.clone(),
                        model: c.model.clone(),
                    })
                    .collect(),
            }
        };

        let max_items = request.effective_max_items();
        let temperature = request.effective_temperature();
        let template = preset.template();
        let max_items_text = max_items.to_string();
        let candidates_text = format_candidates(&candidates);
        let prompt = render(
            template,
            &[
                ("input", request.input.trim()),
                ("reference", request.reference.trim()),
                ("history", request.history.trim()),
                ("candidates", &candidates_text),
                ("chosen", request.chosen.trim()),
                ("rejected", request.rejected.trim()),
                ("max_items", &max_items_text),
            ],
        );
        let max_tokens =
            chat.settings.max_tokens.unwrap_or_else(|| (TOKENS_PER_ITEM * max_items + 256).clamp(1024, 16_384));
        let shape = preset.item_shape();
        let req = ChatRequest {
            messages: vec![Message::user(prompt)],
            temperature: Some(temperature as f32),
            top_p: request.model.top_p.map(|p| p as f32),
            max_tokens: Some(max_tokens),
            response_format: ResponseFormat::JsonSchema { name: "checklist".into(), schema: schema(shape, max_items) },
            cache: chat.cache,
            ..Default::default()
        };
        let req = chat.settings.apply(req);
        let reply = chat.model.chat(req).await?;
        usage.add(&reply.usage);
        let parsed = parse_reply(&reply, shape).map_err(|why| {
            StageError::Unavailable(format!(
                "the generator model's reply for preset {preset} could not be parsed: {why}"
            ))
        })?;
        if parsed.items.is_empty() {
            return Err(StageError::Unavailable(format!(
                "the generator model returned no questions for preset {preset}"
            )));
        }
        let total = parsed.items.len();
        let keep = total.min(max_items as usize);
        let dropped_items = (total - keep) as u32;
        let items: Vec<ChecklistItem> = parsed
            .items
            .into_iter()
            .take(keep)
            .enumerate()
            .map(|(i, p)| {
                let mut item = ChecklistItem::new((i + 1).to_string(), truncate(p.question, MAX_QUESTION_BYTES));
                item.weight = p.weight.unwrap_or(assay_domain::DEFAULT_WEIGHT);
                item.category = p.category;
                item
            })
            .collect();
        let mut metadata = std::collections::BTreeMap::new();
        if !candidates.is_empty() {
            metadata.insert("num_candidates".to_string(), candidates.len().to_string());
        }
        if parsed.skipped_empty > 0 {
            metadata.insert("skipped_empty_questions".to_string(), parsed.skipped_empty.to_string());
        }
        tracing::debug!(preset = preset.name(), items = items.len(), dropped_items, "checklist generated");
        let checklist = Checklist {
            id: uuid::Uuid::now_v7().to_string(),
            items,
            source_method: preset.name().to_string(),
            generation_level: GenerationLevel::Instance,
            input: request.input,
            corpus_description: String::new(),
            created_at: Some(now_seconds()),
            metadata,
        };
        let mut model = chat.record(PHASE, max_tokens, sha256_hex(template), false);
        model.temperature = Some(temperature);
        Ok(GenerateOutcome {
            checklist,
            dropped_items,
            default_scorer: preset.default_scorer(),
            candidates,
            usage,
            model,
        })
    }

    /// Candidate responses from candidate models, concurrently (bounded): several models give one
    /// response each at 0.7, a single model gives 4 at 0.9 (a spec's own temperature wins).
    async fn candidates(
        &self,
        input: &str,
        chats: &[(ResolvedChat, ModelSpec)],
    ) -> Result<(Vec<Candidate>, Usage), StageError> {
        // (chat index, temperature, seed)
        let plan: Vec<(usize, f64, Option<u64>)> = match chats {
            [] => Vec::new(),
            [(chat, spec)] => {
                let t = spec.temperature.unwrap_or(SINGLE_MODEL_TEMPERATURE);
                // Distinct seeds keep seeded draws distinct (and cacheable).
                (0..SINGLE_MODEL_CANDIDATES).map(|k| (0, t, chat.settings.seed.map(|s| s + k as u64))).collect()
            }
            many => many
                .iter()
                .enumerate()
                .map(|(i, (chat, spec))| (i, spec.temperature.unwrap_or(MULTI_MODEL_TEMPERATURE), chat.settings.seed))
                .collect(),
        };
        let replies: Vec<_> = futures::stream::iter(plan)
            .map(|(i, temperature, seed)| async move {
                let chat = &chats[i].0;
                let req = ChatRequest {
                    messages: vec![Message::user(input.trim())],
                    temperature: Some(temperature as f32),
                    top_p: chats[i].1.top_p.map(|p| p as f32),
                    seed,
                    max_tokens: Some(chat.settings.max_tokens.unwrap_or(CANDIDATE_MAX_TOKENS)),
                    cache: chat.cache,
                    ..Default::default()
                };
                let reply = chat.model.chat(chat.settings.apply(req)).await;
                (chat.model_name(), reply)
            })
            .buffered(self.concurrency)
            .collect()
            .await;
        let mut usage = Usage::default();
        let mut out = Vec::new();
        for (model, reply) in replies {
            let reply = reply.map_err(StageError::from)?;
            usage.add(&reply.usage);
            let text = reply.text.trim();
            if text.is_empty() {
                continue;
            }
            out.push(Candidate {
                id: format!("c{}", out.len() + 1),
                text: text.to_string(),
                model: if reply.model.is_empty() { model } else { reply.model.clone() },
            });
        }
        if out.is_empty() {
            return Err(StageError::Unavailable("every candidate model returned an empty response".into()));
        }
        Ok((out, usage))
    }
}

fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

#[async_trait::async_trait]
impl ChecklistGenerator for Generator {
    async fn generate(&self, request: GenerateRequest) -> Result<GenerateOutcome, StageError> {
        Generator::generate(self, request).await
    }

    async fn generate_corpus(
        &self,
        request: CorpusRequest,
        events: EventSink<'_, CorpusProgress>,
    ) -> Result<CorpusOutcome, StageError> {
        Generator::generate_corpus(self, request, events).await
    }

    async fn list_presets(&self) -> Result<Vec<PresetInfo>, StageError> {
        Ok(self.presets())
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
        assert_eq!(fields_of(Generator::validate(&r).unwrap_err()), vec!["reference"]);
        r.reference = "An old pond".into();
        Generator::validate(&r).unwrap();

        let r = GenerateRequest::new(Preset::RlcfCandidatesOnly, "x");
        assert_eq!(fields_of(Generator::validate(&r).unwrap_err()), vec!["candidates"]);
        let mut r = GenerateRequest::new(Preset::RlcfCandidatesOnly, "x");
        r.candidate_models = vec![ModelSpec::default()];
        Generator::validate(&r).unwrap();

        let r = GenerateRequest::new(Preset::OpenRubricsPairwise, " ");
        assert_eq!(fields_of(Generator::validate(&r).unwrap_err()), vec!["input", "chosen", "rejected"]);

        let mut r = GenerateRequest::new(Preset::OpenRubricsListwise, "x");
        r.candidate_models = vec![ModelSpec::default()];
        assert_eq!(fields_of(Generator::validate(&r).unwrap_err()), vec!["candidates"]);
    }

    #[test]
    fn limits_are_enforced() {
        let mut r = GenerateRequest::new(Preset::Tick, "x".repeat(MAX_TEXT_BYTES + 1));
        r.max_items = Some(0);
        r.history = "h".repeat(MAX_TEXT_BYTES + 1);
        let f = fields_of(Generator::validate(&r).unwrap_err());
        assert_eq!(f, vec!["max_items", "input", "history"]);
        r = GenerateRequest::new(Preset::RlcfCandidatesOnly, "x");
        r.candidates = vec![Candidate { text: " ".into(), ..Default::default() }];
        assert_eq!(fields_of(Generator::validate(&r).unwrap_err()), vec!["candidates[0].text"]);
    }

    #[test]
    fn request_values_win_over_preset_defaults() {
        let mut r = GenerateRequest::new(Preset::Tick, "x");
        assert_eq!((r.effective_max_items(), r.effective_temperature()), (8, 0.7));
        r.max_items = Some(3);
        r.model.temperature = Some(0.2);
        assert_eq!((r.effective_max_items(), r.effective_temperature()), (3, 0.2));
    }

    #[test]
    fn candidates_are_numbered_blocks() {
        let c = vec![
            Candidate { id: "a".into(), text: " one ".into(), model: String::new() },
            Candidate { id: "b".into(), text: "two".into(), model: String::new() },
        ];
        assert_eq!(format_candidates(&c), "### Response 1\none\n\n### Response 2\ntwo");
    }
}
