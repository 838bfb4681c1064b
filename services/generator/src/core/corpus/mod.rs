//! Corpus-level checklist generation (REFERENCE section 2, "Corpus level"): one checklist for a
//! whole corpus instead of one instruction.
//!
//! - `feedback` (inductive, [`feedback`]): observations in batches, each shown with its global
//!   index; the model returns questions with the indices of the observations they address; then the
//!   built-in refinement Deduplicator -> Tagger -> (UnitTester) -> Selector with coverage.
//! - `checkeval` (deductive, [`checkeval`]): questions per dimension and sub-dimension, augmented
//!   (seed | elaboration | diversification | combined), optionally filtered, then deduplicated.
//! - `interacteval` (interactive, [`interacteval`]): five LLM stages from think-aloud notes to a
//!   validated list of 10-15 questions.
//!
//! Built-in refinement ([`refine`]) goes through the refiners stage (a `ChecklistRefiner`: the
//! refiners service over gRPC in production) on the same model backends as the generator. The
//! request types and their validation are the domain's (`assay_domain::generator::corpus`). No
//! transport types here.

pub mod checkeval;
pub mod feedback;
pub mod interacteval;
pub mod refine;
pub mod reply;

use std::sync::Mutex;

use assay_domain::limits::MAX_CHECKLIST_ITEMS;
use assay_domain::{Checklist, ChecklistItem, EventSink, GenerationLevel, ResolvedChat, StageError, Usage};
use assay_llm::{ChatRequest, Message, ResponseFormat};
use serde_json::Value;

pub use assay_domain::generator::corpus::*;

use super::{Generator, PHASE, now_seconds, sha256_hex};

/// The prompt templates a preset uses, concatenated (for the reproducibility hash).
fn templates(preset: CorpusPreset) -> String {
    match preset {
        CorpusPreset::Feedback => feedback::TEMPLATE.to_string(),
        CorpusPreset::CheckEval => {
            [checkeval::GENERATE_TEMPLATE, checkeval::AUGMENT_TEMPLATE, checkeval::FILTER_TEMPLATE].concat()
        }
        CorpusPreset::InteractEval => interacteval::TEMPLATES.concat(),
    }
}

/// One corpus run: the resolved model, settings and the usage of every call so far.
pub(crate) struct Run<'a> {
    pub chat: ResolvedChat,
    pub request: &'a CorpusRequest,
    pub concurrency: usize,
    pub events: EventSink<'a, CorpusProgress>,
    usage: Mutex<Usage>,
    /// Bounds the run's concurrent model calls, however the stages nest.
    permits: tokio::sync::Semaphore,
}

impl<'a> Run<'a> {
    pub fn emit(&self, stage: &str, done: u32, total: u32, message: impl Into<String>) {
        (self.events)(CorpusProgress::new(stage, done, total, message));
    }

    pub fn add_usage(&self, u: &Usage) {
        self.usage.lock().unwrap_or_else(|p| p.into_inner()).add(u);
    }

    pub fn usage(&self) -> Usage {
        *self.usage.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Generation temperature of this run.
    pub fn temperature(&self) -> f64 {
        self.request.effective_temperature()
    }

    /// One structured call: the prompt as the only user message, a JSON schema, the temperature
    /// given; returns the reply's JSON value, `None` when the reply holds none.
    pub async fn call_value(
        &self,
        what: &str,
        prompt: String,
        schema: Value,
        temperature: f64,
        max_tokens: u32,
    ) -> Result<(Option<Value>, String), StageError> {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| StageError::Internal("the call limiter of the corpus run was closed".into()))?;
        let chat = &self.chat;
        let req = ChatRequest {
            messages: vec![Message::user(prompt)],
            temperature: Some(temperature as f32),
            top_p: self.request.model.top_p.map(|p| p as f32),
            max_tokens: Some(chat.settings.max_tokens.unwrap_or(max_tokens)),
            response_format: ResponseFormat::JsonSchema { name: what.replace(' ', "_"), schema },
            cache: chat.cache,
            ..Default::default()
        };
        let reply = chat.model.chat(chat.settings.apply(req)).await?;
        self.add_usage(&reply.usage);
        let value = reply.json.clone().or_else(|| assay_llm::extract_json(&reply.text));
        Ok((value, reply.text))
    }

    /// [`Run::call_value`], where a reply without JSON is UNAVAILABLE naming `what`.
    pub async fn call_json(
        &self,
        what: &str,
        prompt: String,
        schema: Value,
        temperature: f64,
        max_tokens: u32,
    ) -> Result<Value, StageError> {
        let (value, text) = self.call_value(what, prompt, schema, temperature, max_tokens).await?;
        value.ok_or_else(|| {
            StageError::Unavailable(format!(
                "the {what} reply of preset {} holds no JSON value (reply starts with {:?})",
                self.request.preset,
                super::parse::preview(&text)
            ))
        })
    }
}

/// What a preset's generation stage produced, before built-in refinement.
pub(crate) struct Generated {
    pub items: Vec<ChecklistItem>,
    /// Questions the model produced before any filtering or refinement.
    pub raw_questions: u32,
    /// Checklist metadata the stage reports.
    pub metadata: Vec<(String, String)>,
    /// Max tokens of the main generation call (for the model record).
    pub max_tokens: u32,
}

impl Generator {
    /// Generate one corpus-level checklist, reporting progress to `events`.
    pub async fn generate_corpus(
        &self,
        request: CorpusRequest,
        events: EventSink<'_, CorpusProgress>,
    ) -> Result<CorpusOutcome, StageError> {
        request.validate()?;
        let preset = request.preset;
        // Resolve every model before the first call, so a bad backend name costs no call.
        let chat = self.hub.chat(PHASE, &request.model, "model")?;
        let refiners = refine::Refinement::plan(self, &request, &chat)?;
        let concurrency = request.concurrency.map_or(self.concurrency, |c| c as usize).max(1);
        let run = Run {
            chat,
            request: &request,
            concurrency,
            events,
            usage: Mutex::new(Usage::default()),
            permits: tokio::sync::Semaphore::new(concurrency),
        };

        let generated = match preset {
            CorpusPreset::Feedback => feedback::generate(&run).await?,
            CorpusPreset::CheckEval => checkeval::generate(&run).await?,
            CorpusPreset::InteractEval => interacteval::generate(&run).await?,
        };
        let raw_questions = generated.raw_questions;
        let mut generated = generated;
        let before = generated.items.len();
        generated.items.retain(|i| !crate::core::parse::is_fragment(&i.question));
        let fragments = before - generated.items.len();
        if generated.items.is_empty() {
            return Err(StageError::Unavailable(format!(
                "the generator model returned no questions for preset {preset}"
            )));
        }
        let mut metadata: std::collections::BTreeMap<String, String> = generated.metadata.into_iter().collect();
        metadata.insert("raw_question_count".into(), raw_questions.to_string());
        if fragments > 0 {
            metadata.insert("dropped_fragments".into(), fragments.to_string());
        }
        let refined = refiners.run(&run, generated.items).await?;
        metadata.extend(refined.metadata);
        if refined.items.is_empty() {
            return Err(StageError::Unavailable(format!(
                "built-in refinement of preset {preset} removed every one of the {raw_questions} generated questions"
            )));
        }
        let mut items = refined.items;
        items.truncate(MAX_CHECKLIST_ITEMS);
        tracing::debug!(preset = preset.name(), raw_questions, items = items.len(), "corpus checklist generated");
        let usage = run.usage();
        let temperature = run.temperature();
        let mut model = run.chat.record(PHASE, generated.max_tokens, sha256_hex(&templates(preset)), false);
        model.temperature = Some(temperature);
        let checklist = Checklist {
            id: uuid::Uuid::now_v7().to_string(),
            items,
            source_method: preset.name().to_string(),
            generation_level: GenerationLevel::Corpus,
            input: String::new(),
            corpus_description: request.corpus_description.clone(),
            created_at: Some(now_seconds()),
            metadata,
        };
        Ok(CorpusOutcome { checklist, raw_questions, usage, model })
    }
}
