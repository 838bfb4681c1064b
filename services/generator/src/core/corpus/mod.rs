//! Corpus-level checklist generation: one checklist for a
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
pub(crate) mod run;

use assay_domain::limits::MAX_CHECKLIST_ITEMS;
use assay_domain::{Checklist, EventSink, GenerationLevel, StageError, Usage};

pub use assay_domain::generator::corpus::*;

use super::{Generator, PHASE, now_seconds};

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
        let run = run::Run {
            chat,
            request: &request,
            concurrency,
            events,
            usage: std::sync::Mutex::new(Usage::default()),
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
        let mut model = run.chat.record(
            PHASE,
            generated.max_tokens,
            assay_domain::template::template_sha256(&templates(preset)),
            false,
        );
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
