//! Checklist refiners (REFERENCE section 3): Deduplicator, Tagger, UnitTester and Selector, alone or
//! as an ordered chain. No transport types here.
//!
//! Every refiner reports exactly one [`RefinerAction`] per input item (kept, removed, merged or
//! error), sums the [`Usage`] of every model call it made, and resolves its models through the
//! [`ModelHub`] under the phase [`PHASE`].

mod chain;
mod dedup;
mod selector;
mod tagger;
mod unit_tester;

use std::sync::Arc;

use assay_domain::{
    ChecklistItem, EventSink, ModelHub, ModelSpec, ResolvedChat, Scorer, StageError, Usage, Violations,
};
use assay_llm::{CachePolicy, ChatRequest, ChatResponse, EmbeddingRequest, Message, ResponseFormat};

pub use assay_domain::refiners::*;
pub use dedup::{Clustering, Similarity, cluster, cosine_matrix};
pub use selector::{BeamConfig, CoverageMap, SelectionResult, beam_search, set_metrics};
pub use unit_tester::sample_indices;

/// Configuration phase the refiners resolve their models for.
pub const PHASE: &str = "refiners";

pub(crate) const MERGE_TEMPLATE: &str = include_str!("../../prompts/merge.txt");
pub(crate) const TAG_TEMPLATE: &str = include_str!("../../prompts/tag.txt");
pub(crate) const REWRITE_TEMPLATE: &str = include_str!("../../prompts/rewrite_fail.txt");

/// The checklist refiners core.
#[derive(Clone)]
pub struct ChecklistRefiners {
    hub: Arc<ModelHub>,
    /// Bound on concurrent model calls per request.
    concurrency: usize,
    /// Scores the UnitTester's rewrites (the scorer service over gRPC in production).
    scorer: Option<Arc<dyn Scorer>>,
}

impl ChecklistRefiners {
    pub fn new(hub: Arc<ModelHub>) -> Self {
        Self { hub, concurrency: DEFAULT_CONCURRENCY, scorer: None }
    }

    /// Score the UnitTester's rewrites with this scorer. Without one, UnitTest answers
    /// FAILED_PRECONDITION before any model call.
    pub fn with_scorer(mut self, scorer: Arc<dyn Scorer>) -> Self {
        self.scorer = Some(scorer);
        self
    }

    /// The UnitTester's scorer.
    fn scorer(&self) -> Result<&Arc<dyn Scorer>, StageError> {
        self.scorer.as_ref().ok_or_else(|| {
            StageError::FailedPrecondition(
                "the unit tester needs a scorer, and this refiners service has none configured (set upstreams.scorer)"
                    .into(),
            )
        })
    }

    /// Bound on concurrent model calls per request (at least 1).
    pub fn with_concurrency(mut self, concurrency: usize) -> Self {
        self.concurrency = concurrency.max(1);
        self
    }

    /// The service's bound on concurrent model calls per request.
    pub fn concurrency(&self) -> usize {
        self.concurrency
    }

    /// A request's concurrency: its own when set, else the service's.
    fn effective_concurrency(&self, requested: usize) -> usize {
        if requested == 0 { self.concurrency } else { requested.min(MAX_CONCURRENCY) }
    }

    /// Merge near-duplicate questions.
    pub async fn deduplicate(
        &self,
        items: Vec<ChecklistItem>,
        options: &DedupOptions,
    ) -> Result<StepOutcome, StageError> {
        let mut v = Violations::new();
        validate_items(&items, "items", &mut v);
        validate_dedup(options, "", &mut v);
        v.into_result()?;
        dedup::run(self, items, options).await
    }

    /// Keep items that are generally applicable and section specific.
    pub async fn tag(&self, items: Vec<ChecklistItem>, options: &TagOptions) -> Result<StepOutcome, StageError> {
        let mut v = Violations::new();
        validate_items(&items, "items", &mut v);
        validate_tag(options, "", &mut v);
        v.into_result()?;
        tagger::run(self, items, options).await
    }

    /// Keep items whose failures the scorer detects on rewritten samples.
    pub async fn unit_test(
        &self,
        items: Vec<ChecklistItem>,
        options: &UnitTestOptions,
    ) -> Result<StepOutcome, StageError> {
        let mut v = Violations::new();
        validate_items(&items, "items", &mut v);
        validate_unit_test(options, "", &mut v);
        v.into_result()?;
        unit_tester::run(self, items, options).await
    }

    /// Pick a diverse (and covering) subset by beam search.
    pub async fn select(&self, items: Vec<ChecklistItem>, options: &SelectOptions) -> Result<StepOutcome, StageError> {
        let mut v = Violations::new();
        validate_items(&items, "items", &mut v);
        validate_select(options, "", &mut v);
        v.into_result()?;
        selector::run(self, items, options).await
    }

    /// Runs steps in order, feeding each the previous step's items; calls `events` after each step.
    pub async fn run_chain(
        &self,
        items: Vec<ChecklistItem>,
        steps: &[RefinerStep],
        events: EventSink<'_, StepReport>,
    ) -> Result<ChainOutcome, StageError> {
        validate_chain(&items, steps)?;
        chain::run(self, items, steps, events).await
    }

    /// Resolve the chat model of a step.
    fn chat(&self, spec: &ModelSpec, field: &str) -> Result<ResolvedChat, StageError> {
        self.hub.chat(PHASE, spec, field)
    }

    /// Embed `texts` in one batched call. Vectors come back in input order.
    async fn embed(
        &self,
        spec: &ModelSpec,
        field: &str,
        texts: Vec<String>,
    ) -> Result<(Vec<Vec<f32>>, Usage), StageError> {
        let (model, settings) = self.hub.embedding(PHASE, spec, field)?;
        let n = texts.len();
        let request = settings.apply_embedding(EmbeddingRequest {
            texts,
            model: None,
            cache: cache_policy(spec),
            deadline: None,
        });
        let reply = model.embed(request).await?;
        if reply.vectors.len() != n {
            return Err(StageError::Unavailable(format!(
                "the embedding backend returned {} vectors for {n} questions",
                reply.vectors.len()
            )));
        }
        let dim = reply.vectors.first().map_or(0, Vec::len);
        if dim == 0 || reply.vectors.iter().any(|v| v.len() != dim || v.iter().any(|x| !x.is_finite())) {
            return Err(StageError::Unavailable(
                "the embedding backend returned empty, ragged or non-finite vectors".into(),
            ));
        }
        Ok((reply.vectors, reply.usage))
    }
}

#[async_trait::async_trait]
impl ChecklistRefiner for ChecklistRefiners {
    async fn refine(
        &self,
        items: Vec<ChecklistItem>,
        steps: Vec<RefinerStep>,
        events: EventSink<'_, StepReport>,
    ) -> Result<ChainOutcome, StageError> {
        self.run_chain(items, &steps, events).await
    }
}

fn cache_policy(spec: &ModelSpec) -> CachePolicy {
    if spec.no_cache {
        CachePolicy::Bypass
    } else if spec.cache_sampled {
        CachePolicy::OptIn
    } else {
        CachePolicy::Auto
    }
}

/// A refiner chat request: one user message, temperature 0 unless configured, the phase's settings.
fn chat_request(
    chat: &ResolvedChat,
    spec: &ModelSpec,
    prompt: String,
    format: ResponseFormat,
    max_tokens: u32,
) -> ChatRequest {
    let req = ChatRequest {
        messages: vec![Message::user(prompt)],
        response_format: format,
        top_p: spec.top_p.map(|p| p as f32),
        max_tokens: Some(chat.settings.max_tokens.unwrap_or(max_tokens)),
        cache: chat.cache,
        ..Default::default()
    };
    let mut req = chat.settings.apply(req);
    req.temperature = Some(req.temperature.unwrap_or(0.0));
    req
}

/// The JSON value of a reply: the structured value when the backend gave one, else the JSON found
/// in the text.
fn reply_json(reply: &ChatResponse) -> Option<serde_json::Value> {
    reply.json.clone().or_else(|| assay_llm::extract_json(&reply.text))
}

/// First `max` characters of `s`, for reasons and errors.
fn preview(s: &str, max: usize) -> String {
    let t = s.trim();
    match t.char_indices().nth(max) {
        Some((i, _)) => format!("{}...", &t[..i]),
        None => t.to_string(),
    }
}

#[cfg(test)]
mod tests;
