//! Instance-level checklist generation: presets with their required inputs,
//! defaults (max items, temperature, scorer config), weighted and categorized items, contrastive
//! candidates passed in or produced by candidate models. No transport types here.

pub mod corpus;
pub mod parse;
pub mod prompts;
#[cfg(test)]
pub(crate) mod quoted;

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use assay_domain::generator::{
    Candidate, CandidateSource, ChecklistGenerator, CorpusOutcome, CorpusProgress, CorpusRequest, GenerateOutcome,
    GenerateRequest, PresetInfo, RespondOutcome, RespondRequest, preset_table,
};
use assay_domain::limits::MAX_QUESTION_BYTES;
use assay_domain::refiners::ChecklistRefiner;
use assay_domain::{Checklist, ChecklistItem, EventSink, GenerationLevel, ModelSpec, StageError, Usage};
use assay_llm::{ChatRequest, Message, ModelHub, Purpose, ResolvedChat, ResponseFormat};
use futures::StreamExt;

pub use parse::{HARD_RULE, PRINCIPLE, ParsedItem, ParsedReply, normalize_category, parse_reply, schema};
pub use prompts::{format_candidates, item_count, render_prompt};

/// Configuration phase the generator resolves its model for.
pub const PHASE: &str = "generator";
/// Configuration phase of the candidate models.
pub const CANDIDATES_PHASE: &str = "generator_candidates";
/// Model phase of the models under test (responders).
pub const RESPONDER_PHASE: &str = "responder";
/// A responder's reply token limit unless its spec or phase sets one.
pub const RESPONDER_MAX_TOKENS: u32 = 1024;
/// A responder's temperature unless its spec or phase sets one: 0 for one sample (the model's
/// most likely answer), 0.7 for several (distinct draws).
pub const RESPONDER_SAMPLES_TEMPERATURE: f64 = 0.7;

/// Placeholders the generator's prompt templates use.
pub const PLACEHOLDERS: &[&str] =
    &["input", "reference", "history", "candidates", "chosen", "rejected", "max_items", "item_count"];

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

/// The generator core.
#[derive(Clone)]
pub struct Generator {
    hub: Arc<ModelHub>,
    /// Concurrent candidate calls per request.
    concurrency: usize,
    /// The refiners stage corpus presets refine with (feedback, checkeval).
    refiners: Option<Arc<dyn ChecklistRefiner>>,
}

fn now_seconds() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
}

impl Generator {
    pub fn new(hub: Arc<ModelHub>) -> Self {
        Self { hub, concurrency: DEFAULT_CONCURRENCY, refiners: None }
    }

    /// Refine corpus checklists with this refiners stage (the refiners service over gRPC in
    /// production). Without one, corpus presets whose built-in refinement is not skipped fail with
    /// FAILED_PRECONDITION before any model call.
    pub fn with_refiners(mut self, refiners: Arc<dyn ChecklistRefiner>) -> Self {
        self.refiners = Some(refiners);
        self
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

    /// Generate one checklist.
    pub async fn generate(&self, request: GenerateRequest) -> Result<GenerateOutcome, StageError> {
        request.validate()?;
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
        let template = prompts::template(preset);
        let prompt = render_prompt(&request, &candidates, max_items);
        // The preset's temperature unless the caller set one (not the phase's: presets differ).
        let purpose =
            Purpose::new((TOKENS_PER_ITEM * max_items + 256).clamp(1024, 16_384)).chosen_temperature(temperature);
        let max_tokens = chat.max_tokens(purpose);
        let shape = preset.item_shape();
        let req = ChatRequest {
            response_format: ResponseFormat::JsonSchema { name: "checklist".into(), schema: schema(shape, max_items) },
            ..chat.request(vec![Message::user(prompt)], purpose)
        };
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
        let mut model = chat.record(PHASE, max_tokens, assay_domain::template::template_sha256(template), false);
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

    /// Ask a model under test for `request.samples` responses to its prompt, concurrently
    /// (bounded), each reported to `events` as it finishes. Sample k is sent with the seed plus k
    /// (seed k without one), so samples are distinct draws, each cached apart; an empty response
    /// is kept (it is what the model said).
    pub async fn respond(
        &self,
        request: RespondRequest,
        events: EventSink<'_, (u32, String)>,
    ) -> Result<RespondOutcome, StageError> {
        request.validate()?;
        let chat = self.hub.chat(RESPONDER_PHASE, &request.model, "model")?;
        let samples = request.sample_count();
        // The spec's temperature, else the phase's, else 0 for one sample and 0.7 for several.
        let mut purpose = Purpose::new(RESPONDER_MAX_TOKENS);
        if samples > 1 {
            purpose.temperature = RESPONDER_SAMPLES_TEMPERATURE as f32;
        }
        let mut messages = Vec::new();
        if !request.system_prompt.is_empty() {
            messages.push(Message::system(request.system_prompt.clone()));
        }
        messages.push(Message::user(request.prompt.clone()));
        let base = chat.request(messages, purpose);
        let calls = (0..samples).map(|k| {
            let req = ChatRequest {
                seed: if samples > 1 { Some(base.seed.unwrap_or(0) + u64::from(k)) } else { base.seed },
                ..base.clone()
            };
            let chat = &chat;
            async move { (k, chat.model.chat(req).await) }
        });
        let mut replies = futures::stream::iter(calls).buffer_unordered(self.concurrency);
        let mut responses = vec![String::new(); samples as usize];
        let mut usage = Usage::default();
        while let Some((k, reply)) = replies.next().await {
            let reply = reply.map_err(StageError::from)?;
            usage.add(&reply.usage);
            events((k, reply.text.clone()));
            responses[k as usize] = reply.text;
        }
        let mut model = chat.record(RESPONDER_PHASE, chat.max_tokens(purpose), String::new(), false);
        model.temperature = base.temperature.map(f64::from);
        Ok(RespondOutcome { responses, usage, model })
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
                let purpose = Purpose::new(CANDIDATE_MAX_TOKENS).chosen_temperature(temperature);
                let req = ChatRequest { seed, ..chat.request(vec![Message::user(input.trim())], purpose) };
                let reply = chat.model.chat(req).await;
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

    async fn respond(
        &self,
        request: RespondRequest,
        events: EventSink<'_, (u32, String)>,
    ) -> Result<RespondOutcome, StageError> {
        Generator::respond(self, request, events).await
    }
}
