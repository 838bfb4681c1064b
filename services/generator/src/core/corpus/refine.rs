//! Built-in refinement: the refiners stage (a [`ChecklistRefiner`], the refiners service over
//! gRPC in production) on the generator's own chat backend and the request's embedding model.
//!
//! - feedback: Deduplicator -> Tagger -> (UnitTester, with `run_unit_tester` and samples, which
//!   it scores first) -> Selector, each skippable. The Selector gets the coverage assignment observation -> questions derived
//!   from the questions' `source_indices`; ids are the raw ones, and the Selector matches a merged
//!   item through the ids it was merged from, so a merged question covers the union of its
//!   members' observations.
//! - checkeval: Deduplicator (0.85 unless overridden) with `filter` only, skippable.
//! - interacteval: none (its validation stage is its refinement).
//!
//! One progress event per step (stage `refine`, the message names the refiner).

use std::sync::Arc;

use assay_domain::refiners::{
    ChecklistRefiner, CoverageEntry, DedupOptions, MAX_ITEMS, RefinerStep, Sample, SelectOptions, StepReport,
    TagOptions, UnitTestOptions,
};
use assay_domain::{ChecklistItem, ModelSpec, StageError};
use assay_llm::ResolvedChat;

/// Configuration phase the refiners resolve their models for (the embedding backend is checked
/// under it before any call).
const REFINERS_PHASE: &str = "refiners";

use super::run::Run;
use crate::core::Generator;
use assay_domain::generator::corpus::{
    CorpusPreset, CorpusRequest, DEFAULT_DEDUP_THRESHOLD, DEFAULT_MAX_QUESTIONS, stages,
};

/// Which refiners a request runs, in order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    Deduplicate,
    Tag,
    UnitTest,
    Select,
}

impl Step {
    pub fn name(self) -> &'static str {
        match self {
            Step::Deduplicate => "deduplicator",
            Step::Tag => "tagger",
            Step::UnitTest => "unit_tester",
            Step::Select => "selector",
        }
    }
}

/// The built-in refiner steps of a request (pure).
pub fn steps(request: &CorpusRequest) -> Vec<Step> {
    let r = &request.refinement;
    let mut out = Vec::new();
    match request.preset {
        CorpusPreset::Feedback => {
            if !r.skip_deduplication {
                out.push(Step::Deduplicate);
            }
            if !r.skip_tagging {
                out.push(Step::Tag);
            }
            if r.run_unit_tester {
                out.push(Step::UnitTest);
            }
            if !r.skip_selection {
                out.push(Step::Select);
            }
        }
        // As the original, redundancy removal belongs to filtering: without `filter` the
        // generated questions come back as generated.
        CorpusPreset::CheckEval => {
            if request.filter && !r.skip_deduplication {
                out.push(Step::Deduplicate);
            }
        }
        CorpusPreset::InteractEval => {}
    }
    out
}

/// The coverage assignment: one entry per observation (in corpus order, including those no
/// question covers) with the ids of the items whose `source_indices` name it.
pub fn coverage(observations: &[String], items: &[ChecklistItem]) -> Vec<CoverageEntry> {
    let mut ids: Vec<Vec<String>> = vec![Vec::new(); observations.len()];
    for item in items {
        for &i in &item.source_indices {
            if let Some(slot) = ids.get_mut(i as usize)
                && !slot.contains(&item.id)
            {
                slot.push(item.id.clone());
            }
        }
    }
    observations.iter().zip(ids).map(|(o, item_ids)| CoverageEntry { observation: o.clone(), item_ids }).collect()
}

/// Fraction of observations covered by `items` (0 without observations).
pub fn covered_fraction(observations: usize, items: &[ChecklistItem]) -> f64 {
    if observations == 0 {
        return 0.0;
    }
    let mut covered = vec![false; observations];
    for i in items.iter().flat_map(|it| it.source_indices.iter()) {
        if let Some(c) = covered.get_mut(*i as usize) {
            *c = true;
        }
    }
    covered.iter().filter(|c| **c).count() as f64 / observations as f64
}

/// The refinement planned for one request, models resolved.
pub(crate) struct Refinement {
    steps: Vec<Step>,
    refiners: Option<Arc<dyn ChecklistRefiner>>,
    /// The generator's chat backend and model, for the refiners' chat calls.
    model: ModelSpec,
    embedding_model: ModelSpec,
}

/// The refiners' model spec for the generator's resolved chat: same backend, same model, the
/// caller's seed, token and cache settings; temperature left to the refiners (0).
fn same_backend(chat: &ResolvedChat, spec: &ModelSpec) -> ModelSpec {
    ModelSpec {
        backend: Some(chat.backend.clone()),
        model: Some(chat.model_name()),
        temperature: None,
        seed: spec.seed,
        max_tokens: spec.max_tokens,
        top_p: None,
        cache_sampled: spec.cache_sampled,
        no_cache: spec.no_cache,
    }
}

/// What refinement returned.
pub(crate) struct Refined {
    pub items: Vec<ChecklistItem>,
    pub metadata: Vec<(String, String)>,
}

impl Refinement {
    /// Plan the steps and resolve their models (a bad embedding backend fails before any call).
    pub fn plan(generator: &Generator, request: &CorpusRequest, chat: &ResolvedChat) -> Result<Self, StageError> {
        let steps = steps(request);
        let embeds = steps.iter().any(|s| matches!(s, Step::Deduplicate | Step::Select));
        if embeds {
            generator.hub.embedding(REFINERS_PHASE, &request.embedding_model, "embedding_model")?;
        }
        let refiners = if steps.is_empty() {
            None
        } else {
            let Some(refiners) = generator.refiners.clone() else {
                return Err(StageError::FailedPrecondition(format!(
                    "preset {} refines its questions, and this generator has no refiners service configured \
                     (set upstreams.refiners, or skip the built-in refinement)",
                    request.preset
                )));
            };
            Some(refiners)
        };
        Ok(Self {
            steps,
            refiners,
            model: same_backend(chat, &request.model),
            embedding_model: request.embedding_model.clone(),
        })
    }

    /// Run the planned steps on the generated items.
    pub async fn run(self, run: &Run<'_>, mut items: Vec<ChecklistItem>) -> Result<Refined, StageError> {
        let request = run.request;
        let mut metadata = Vec::new();
        let Some(refiners) = self.refiners else {
            return Ok(Refined { items, metadata });
        };
        if items.len() > MAX_ITEMS {
            tracing::warn!(items = items.len(), limit = MAX_ITEMS, "corpus refinement input capped");
            metadata.push(("refinement_input_capped".to_string(), format!("{} of {}", MAX_ITEMS, items.len())));
            items.truncate(MAX_ITEMS);
        }
        let r = &request.refinement;
        let threshold = Some(r.dedup_threshold.unwrap_or(DEFAULT_DEDUP_THRESHOLD));
        let max_questions = Some(r.max_questions.unwrap_or(DEFAULT_MAX_QUESTIONS));
        let observations = &request.observations;
        let chain: Vec<RefinerStep> = self
            .steps
            .iter()
            .map(|s| match s {
                Step::Deduplicate => RefinerStep::Deduplicate(DedupOptions {
                    threshold,
                    model: self.model.clone(),
                    embedding_model: self.embedding_model.clone(),
                }),
                Step::Tag => RefinerStep::Tag(TagOptions { model: self.model.clone(), concurrency: run.concurrency }),
                Step::UnitTest => RefinerStep::UnitTest(UnitTestOptions {
                    samples: r
                        .unit_test_samples
                        .iter()
                        .enumerate()
                        .map(|(i, text)| Sample {
                            id: format!("sample-{i}"),
                            text: text.clone(),
                            answers: Default::default(),
                        })
                        .collect(),
                    input: request.corpus_description.clone(),
                    model: self.model.clone(),
                    concurrency: run.concurrency,
                    ..UnitTestOptions::default()
                }),
                Step::Select => RefinerStep::Select(SelectOptions {
                    max_questions,
                    beam_width: r.beam_width,
                    length_penalty: r.length_penalty,
                    alpha: r.alpha,
                    coverage: coverage(observations, &items),
                    embedding_model: self.embedding_model.clone(),
                }),
            })
            .collect();
        let total = chain.len() as u32;
        let done = std::sync::atomic::AtomicU32::new(0);
        let sink = |report: StepReport| {
            let n = done.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            run.emit(
                stages::REFINE,
                n,
                total,
                format!("{}: {} -> {} questions", report.refiner, report.items_in, report.items_out),
            );
        };
        let outcome =
            refiners.refine(items, chain, &sink).await.map_err(|e| e.map_fields(|f| format!("refinement.{f}")))?;
        run.add_usage(&outcome.usage);
        for step in &outcome.steps {
            metadata.push((format!("{}_items", step.refiner), format!("{} -> {}", step.items_in, step.items_out)));
        }
        if request.preset == CorpusPreset::Feedback {
            let fraction = covered_fraction(observations.len(), &outcome.items);
            metadata.push(("observation_coverage".to_string(), format!("{fraction:.4}")));
        }
        Ok(Refined { items: outcome.items, metadata })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::corpus::CorpusRequest;

    fn item(id: &str, sources: &[u32]) -> ChecklistItem {
        let mut i = ChecklistItem::new(id, format!("{id}?"));
        i.source_indices = sources.to_vec();
        i
    }

    #[test]
    fn skip_flags_remove_steps() {
        let mut r = CorpusRequest::new(CorpusPreset::Feedback);
        assert_eq!(steps(&r), vec![Step::Deduplicate, Step::Tag, Step::Select]);
        r.refinement.skip_tagging = true;
        assert_eq!(steps(&r), vec![Step::Deduplicate, Step::Select]);
        r.refinement.skip_deduplication = true;
        r.refinement.skip_selection = true;
        assert!(steps(&r).is_empty());
        let mut r = CorpusRequest::new(CorpusPreset::CheckEval);
        assert!(steps(&r).is_empty(), "no deduplication without filtering");
        r.filter = true;
        r.refinement.skip_tagging = true;
        assert_eq!(steps(&r), vec![Step::Deduplicate]);
        r.refinement.skip_deduplication = true;
        assert!(steps(&r).is_empty());
        assert!(steps(&CorpusRequest::new(CorpusPreset::InteractEval)).is_empty());
    }

    #[test]
    fn coverage_lists_every_observation() {
        let obs: Vec<String> = (0..4).map(|i| format!("o{i}")).collect();
        let items = vec![item("fb-0", &[0, 2]), item("fb-1", &[2, 9]), item("fb-2", &[])];
        let c = coverage(&obs, &items);
        let got: Vec<(&str, Vec<&str>)> =
            c.iter().map(|e| (e.observation.as_str(), e.item_ids.iter().map(String::as_str).collect())).collect();
        assert_eq!(got, vec![("o0", vec!["fb-0"]), ("o1", vec![]), ("o2", vec!["fb-0", "fb-1"]), ("o3", vec![])]);
        assert_eq!(covered_fraction(4, &items), 0.5);
    }
}
