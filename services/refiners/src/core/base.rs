//! The refiners core's state and what every refiner uses: model resolution, embedding, the
//! request shape of a refiner chat call, lenient reply reading. The refiners themselves are
//! sibling modules; [`super`] dispatches to them.

use std::sync::Arc;

use assay_domain::refiners::{DEFAULT_CONCURRENCY, MAX_CONCURRENCY};
use assay_domain::{ModelSpec, Scorer, StageError, UnusableReply, Usage};
use assay_llm::convergence::Cascade;
use assay_llm::{ChatRequest, LlmError, Message, ModelHub, Purpose, ResolvedChat, ResponseFormat};

/// Configuration phase the refiners resolve their models for.
pub const PHASE: &str = "refiners";

pub(crate) const MERGE_TEMPLATE: &str = include_str!("../../prompts/merge.txt");
pub(crate) const TAG_TEMPLATE: &str = include_str!("../../prompts/tag.txt");
pub(crate) const REWRITE_TEMPLATE: &str = include_str!("../../prompts/rewrite_fail.txt");

/// The checklist refiners core.
#[derive(Clone)]
pub struct ChecklistRefiners {
    pub(crate) hub: Arc<ModelHub>,
    /// Bound on concurrent model calls per request.
    pub(crate) concurrency: usize,
    /// Scores the UnitTester's rewrites (the scorer service over gRPC in production).
    pub(crate) scorer: Option<Arc<dyn Scorer>>,
    /// Self-refine's convergence cascade: its embedding cache and breaker live as long as the
    /// service.
    pub(crate) cascade: Arc<Cascade>,
}

impl ChecklistRefiners {
    pub fn new(hub: Arc<ModelHub>) -> Self {
        Self { hub, concurrency: DEFAULT_CONCURRENCY, scorer: None, cascade: Arc::new(Cascade::new()) }
    }

    /// Use this convergence cascade for self-refine (e.g. one on a test clock).
    pub fn with_cascade(mut self, cascade: Cascade) -> Self {
        self.cascade = Arc::new(cascade);
        self
    }

    /// Self-refine's convergence cascade (its breaker state and cache size are observable).
    pub fn cascade(&self) -> &Cascade {
        &self.cascade
    }

    /// Score the UnitTester's rewrites with this scorer. Without one, UnitTest answers
    /// FAILED_PRECONDITION before any model call.
    pub fn with_scorer(mut self, scorer: Arc<dyn Scorer>) -> Self {
        self.scorer = Some(scorer);
        self
    }

    /// The UnitTester's scorer.
    pub(crate) fn scorer(&self) -> Result<&Arc<dyn Scorer>, StageError> {
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
    pub(crate) fn effective_concurrency(&self, requested: usize) -> usize {
        if requested == 0 { self.concurrency } else { requested.min(MAX_CONCURRENCY) }
    }

    /// Resolve the chat model of a step.
    pub(crate) fn chat(&self, spec: &ModelSpec, field: &str) -> Result<ResolvedChat, StageError> {
        self.hub.chat(PHASE, spec, field)
    }

    /// Embed `texts` in one batched call. Vectors come back in input order.
    pub(crate) async fn embed(
        &self,
        spec: &ModelSpec,
        field: &str,
        texts: Vec<String>,
    ) -> Result<(Vec<Vec<f32>>, Usage), StageError> {
        self.hub.embed(PHASE, spec, field, texts).await
    }
}

/// A refiner chat request: one user message, the reply `format`, `max_tokens` unless the caller or
/// the configuration sets a limit, temperature 0 unless they set one ([`ResolvedChat::request`]).
pub(crate) fn chat_request(
    chat: &ResolvedChat,
    prompt: String,
    format: ResponseFormat,
    max_tokens: u32,
) -> ChatRequest {
    ChatRequest { response_format: format, ..chat.request(vec![Message::user(prompt)], Purpose::new(max_tokens)) }
}

/// Why one item's (or one cluster's) model call gave nothing usable: the item stays as it was and
/// its action says why.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum ItemFailure {
    #[error("{step} reply could not be parsed: {why}")]
    Unparsed { step: &'static str, why: UnusableReply },
    /// A transient failure, its retries spent.
    #[error("{step} call failed: {error}")]
    Call { step: &'static str, error: LlmError },
    #[error("no {step} reply")]
    NoReply { step: &'static str },
}
