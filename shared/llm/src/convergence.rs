//! The convergence cascade with its embedding step: the measures and the
//! decisions are the domain's ([`assay_domain::similarity`]); this adds fetching draft vectors,
//! cached in a [`VectorCache`] (LRU, 256 entries, 5 minute TTL, keyed by [`embedding_text_key`]) and
//! behind a [`CircuitBreaker`] (3 consecutive failures open it for 30 s, then one half-open trial
//! call decides). Time comes from a [`Clock`] so tests drive it without sleeping.
//!
//! [`Cascade::compare`] always runs the embedding step when the text steps leave a comparison
//! undecided (the delta judge's CompareTexts). Self-refine's step is a setting
//! ([`Cascade::embedding_step`], from `convergence.embedding_step`, default
//! [`DEFAULT_EMBEDDING_STEP`]) a request may override: [`Cascade::compare_with`].

use std::sync::Arc;
use std::time::{Duration, Instant};

pub use assay_domain::self_refine::DEFAULT_EMBEDDING_STEP;
pub use assay_domain::similarity::EmbeddingUnavailable;
use assay_domain::similarity::{
    CompareOutcome, ConvergenceMode, TextSteps, cosine, embedding_step, skip_embedding_step, text_steps,
};

use crate::breaker::{BreakerState, CircuitBreaker, Outcome};
use crate::cache::{VectorCache, embedding_text_key};
use crate::clock::{Clock, SystemClock};
use crate::types::{CachePolicy, EmbeddingModel, EmbeddingRequest, LlmError};

/// Embedding cache capacity.
pub const CACHE_ENTRIES: usize = 256;
/// Embedding cache entry lifetime.
pub const CACHE_TTL: Duration = Duration::from_secs(5 * 60);
/// Consecutive embedding failures that open the breaker.
pub const BREAKER_FAILURES: u32 = 3;
/// How long an open breaker refuses calls before one trial call.
pub const BREAKER_COOLDOWN: Duration = Duration::from_secs(30);

/// Where the embedding step gets vectors from.
#[derive(Clone)]
pub struct EmbeddingSource {
    pub model: Arc<dyn EmbeddingModel>,
    /// Model name to request (`None`: the backend's default).
    pub model_name: Option<String>,
    pub deadline: Option<Instant>,
}

/// The cascade with its embedding cache and breaker; hold one for a service's lifetime.
pub struct Cascade {
    cache: VectorCache,
    breaker: Arc<CircuitBreaker>,
    /// Whether [`Self::compare_with`] runs the embedding step when the caller leaves it open.
    embedding_step: bool,
}

impl std::fmt::Debug for Cascade {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cascade")
            .field("cache", &self.cache)
            .field("breaker", &self.breaker)
            .field("embedding_step", &self.embedding_step)
            .finish()
    }
}

impl Default for Cascade {
    fn default() -> Self {
        Self::new()
    }
}

impl Cascade {
    /// The reference settings on the system clock.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    /// The reference settings on `clock`.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self {
            cache: VectorCache::new(clock.clone(), CACHE_ENTRIES, CACHE_TTL),
            breaker: Arc::new(CircuitBreaker::with_clock(BREAKER_FAILURES, BREAKER_COOLDOWN, clock)),
            embedding_step: DEFAULT_EMBEDDING_STEP,
        }
    }

    /// Run (or skip) the embedding step in [`Self::compare_with`] when a request does not say
    /// (the service's `convergence.embedding_step`).
    pub fn with_embedding_step(mut self, on: bool) -> Self {
        self.embedding_step = on;
        self
    }

    /// The embedding step setting requests fall back on.
    pub fn embedding_step(&self) -> bool {
        self.embedding_step
    }

    pub fn breaker_state(&self) -> BreakerState {
        self.breaker.state()
    }

    pub fn cached_vectors(&self) -> usize {
        self.cache.len()
    }

    /// Compare two drafts. `embeddings` is `Err(reason)` when no embedding backend is usable.
    pub async fn compare(
        &self,
        previous: &str,
        current: &str,
        mode: ConvergenceMode,
        embeddings: Result<&EmbeddingSource, EmbeddingUnavailable>,
    ) -> CompareOutcome {
        match text_steps(previous, current) {
            TextSteps::Decided(out) => out,
            TextSteps::NeedEmbedding(out) => {
                embedding_step(out, mode, self.embedding_cosine(previous, current, embeddings).await)
            }
        }
    }

    /// [`Self::compare`] with the embedding step on or off as `embedding_step` says (`None`: this
    /// cascade's setting). Off, an undecided comparison is decided without embeddings, by choice
    /// (no embedding call, nothing recorded as degraded).
    pub async fn compare_with(
        &self,
        previous: &str,
        current: &str,
        mode: ConvergenceMode,
        embeddings: Result<&EmbeddingSource, EmbeddingUnavailable>,
        embedding_step: Option<bool>,
    ) -> CompareOutcome {
        if embedding_step.unwrap_or(self.embedding_step) {
            return self.compare(previous, current, mode, embeddings).await;
        }
        match text_steps(previous, current) {
            TextSteps::Decided(out) => out,
            TextSteps::NeedEmbedding(out) => skip_embedding_step(out, mode),
        }
    }

    /// Embedding cosine of two texts through this cascade's cache and breaker, and whether both
    /// vectors came from the cache; `Err(reason)` when embeddings are unavailable (no backend,
    /// failed call, open breaker, incomparable vectors). The cascade's last step, and what
    /// self-refine's regression guard measures drift from the original with.
    pub async fn embedding_cosine(
        &self,
        a: &str,
        b: &str,
        embeddings: Result<&EmbeddingSource, EmbeddingUnavailable>,
    ) -> Result<(f64, bool), EmbeddingUnavailable> {
        let (x, y, cached) = self.vectors(embeddings?, a, b).await?;
        cosine(&x, &y).map(|c| (c, cached)).ok_or(EmbeddingUnavailable::Incomparable(x.len(), y.len()))
    }

    /// Vectors of both texts (cache first, then one batch call behind the breaker), and whether both
    /// came from the cache.
    async fn vectors(
        &self,
        source: &EmbeddingSource,
        a: &str,
        b: &str,
    ) -> Result<(Arc<Vec<f32>>, Arc<Vec<f32>>, bool), EmbeddingUnavailable> {
        let model_name = source.model_name.clone().unwrap_or_else(|| source.model.default_model().to_string());
        let keys = [a, b].map(|t| embedding_text_key(source.model.backend(), &model_name, t));
        let mut found = [self.cache.get(&keys[0]), self.cache.get(&keys[1])];
        if let [Some(x), Some(y)] = &found {
            return Ok((x.clone(), y.clone(), true));
        }
        let Some(permit) = self.breaker.try_acquire() else {
            return Err(EmbeddingUnavailable::BreakerOpen);
        };
        let missing: Vec<usize> = (0..2).filter(|i| found[*i].is_none()).collect();
        let texts: Vec<String> = missing.iter().map(|i| [a, b][*i].to_string()).collect();
        let request = EmbeddingRequest {
            texts,
            model: source.model_name.clone(),
            cache: CachePolicy::Bypass,
            deadline: source.deadline,
        };
        match source.model.embed(request).await {
            Ok(reply) if reply.vectors.len() == missing.len() => {
                permit.record(Outcome::Healthy);
                for (i, v) in missing.iter().zip(reply.vectors) {
                    let v = Arc::new(v);
                    self.cache.insert(keys[*i].clone(), v.clone());
                    found[*i] = Some(v);
                }
            }
            Ok(reply) => {
                permit.record(Outcome::Failed);
                return Err(EmbeddingUnavailable::WrongCount { returned: reply.vectors.len(), asked: missing.len() });
            }
            Err(e) => {
                permit.record(breaker_outcome(&e));
                return Err(EmbeddingUnavailable::CallFailed(e.to_string()));
            }
        }
        match found {
            [Some(x), Some(y)] => Ok((x, y, false)),
            [x, y] => Err(EmbeddingUnavailable::WrongCount {
                returned: usize::from(x.is_some()) + usize::from(y.is_some()),
                asked: 2,
            }),
        }
    }
}

/// What a failed embedding call tells the breaker: transient failures and unreadable replies count
/// against the backend; refusals of this request and a passed deadline say nothing about it.
fn breaker_outcome(e: &LlmError) -> Outcome {
    match e {
        LlmError::RateLimited(_) | LlmError::Unavailable(_) | LlmError::CircuitOpen | LlmError::MalformedReply(_) => {
            Outcome::Failed
        }
        LlmError::InvalidRequest(_)
        | LlmError::Unauthorized(_)
        | LlmError::DeadlineExceeded
        | LlmError::Unsupported(_)
        | LlmError::BudgetExhausted(_) => Outcome::Neutral,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::types::EmbeddingResponse;
    use assay_domain::StageError;
    use assay_domain::similarity::DecidedBy;
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-12
    }

    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    type Script = Option<Box<dyn Fn(&str) -> Vec<f32> + Send>>;

    /// Embeddings from a script: `None` fails the call.
    struct FakeEmbedder {
        calls: AtomicUsize,
        vectors: Mutex<Script>,
    }

    #[async_trait::async_trait]
    impl EmbeddingModel for FakeEmbedder {
        fn backend(&self) -> &str {
            "fake"
        }
        fn default_model(&self) -> &str {
            "fake-embed"
        }
        async fn embed(&self, request: EmbeddingRequest) -> Result<EmbeddingResponse, LlmError> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            match &*lock(&self.vectors) {
                Some(f) => Ok(EmbeddingResponse {
                    vectors: request.texts.iter().map(|t| f(t)).collect(),
                    ..Default::default()
                }),
                None => Err(LlmError::Unavailable("down".into())),
            }
        }
    }

    fn fake(f: Script) -> (Arc<FakeEmbedder>, EmbeddingSource) {
        let e = Arc::new(FakeEmbedder { calls: AtomicUsize::new(0), vectors: Mutex::new(f) });
        let source = EmbeddingSource { model: e.clone(), model_name: None, deadline: None };
        (e, source)
    }

    const WORDS: &str = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike \
        november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu \
        mercury venus earth mars";

    fn title_case(text: &str) -> String {
        text.split_whitespace()
            .map(|w| {
                let mut c = w.chars();
                c.next().map(|f| f.to_uppercase().chain(c).collect::<String>()).unwrap_or_default()
            })
            .collect::<Vec<_>>()
            .join(" ")
    }

    fn run<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(f)
    }

    #[test]
    fn cascade_thresholds_at_the_boundaries() {
        let c = Cascade::new();
        let none =
            || Err::<&EmbeddingSource, _>(EmbeddingUnavailable::NoBackend(StageError::Unavailable("down".into())));
        // 1 edit in 100 chars: exactly 0.99 converges by char.
        let a = "a".repeat(100);
        let b = format!("{}b", "a".repeat(99));
        let o = run(c.compare(&a, &b, ConvergenceMode::Strict, none()));
        assert!(o.converged && !o.diverged && o.decided_by == DecidedBy::Char, "{o:?}");
        // 2 edits in 100: 0.98, past the char step.
        let b2 = format!("{}bb", "a".repeat(98));
        let o = run(c.compare(&a, &b2, ConvergenceMode::Strict, none()));
        assert!(!o.converged && o.decided_by != DecidedBy::Char, "{o:?}");
        // Exactly 0.3 is not diverged; just under is.
        let x = "a".repeat(10);
        let y = format!("{}{}", "a".repeat(3), "b".repeat(7));
        let o = run(c.compare(&x, &y, ConvergenceMode::Permissive, none()));
        assert!(close(o.char_similarity, 0.3) && !o.diverged, "{o:?}");
        let y = format!("{}{}", "a".repeat(2), "b".repeat(8));
        let o = run(c.compare(&x, &y, ConvergenceMode::Permissive, none()));
        assert!(o.diverged && !o.converged && o.decided_by == DecidedBy::Char && o.jaccard.is_none(), "{o:?}");
    }

    #[test]
    fn jaccard_step_needs_similarity_and_confidence() {
        let c = Cascade::new();
        let none =
            || Err::<&EmbeddingSource, _>(EmbeddingUnavailable::NoBackend(StageError::Unavailable("down".into())));
        // Same 30 tokens, different case and punctuation: Jaccard 1.0, confidence 30/50 = 0.6.
        let words = WORDS.split_whitespace().collect::<Vec<_>>().join(" ");
        let o = run(c.compare(&words, &title_case(&words), ConvergenceMode::Strict, none()));
        assert!(o.converged && o.decided_by == DecidedBy::Jaccard, "{o:?}");
        assert!(close(o.jaccard.unwrap().confidence, 0.6));
        assert!(o.degraded_from.is_none());
        // 29 tokens: confidence 0.58 < 0.6; strict mode without embeddings refuses to converge.
        let short: Vec<&str> = WORDS.split(' ').filter(|w| !w.is_empty()).take(29).collect();
        let short = short.join(" ");
        let o = run(c.compare(&short, &title_case(&short), ConvergenceMode::Strict, none()));
        assert!(!o.converged && o.degraded_from.as_deref() == Some("embedding"), "{o:?}");
        assert_eq!(o.degraded_reason, "no embedding backend: unavailable: down");
        // Permissive mode decides by Jaccard alone.
        let o = run(c.compare(&short, &title_case(&short), ConvergenceMode::Permissive, none()));
        assert!(o.converged && o.decided_by == DecidedBy::Jaccard && o.degraded_from.is_some(), "{o:?}");
    }

    #[test]
    fn the_embedding_step_follows_the_request_then_the_setting() {
        let (e, src) = fake(Some(Box::new(|_: &str| vec![1.0, 0.0])));
        let (a, b) = ("the cat sat on the mat today", "the dog sat on the rug today");
        let off = Cascade::new().with_embedding_step(false);
        let o = run(off.compare_with(a, b, ConvergenceMode::Permissive, Ok(&src), None));
        assert!(!o.converged && o.decided_by == DecidedBy::Jaccard && o.degraded_from.is_none(), "{o:?}");
        assert_eq!(e.calls.load(Ordering::SeqCst), 0, "no embedding call when the step is off");
        let o = run(off.compare_with(a, b, ConvergenceMode::Permissive, Ok(&src), Some(true)));
        assert!(o.converged && o.decided_by == DecidedBy::Embedding, "the request turns it on: {o:?}");
        let on = Cascade::new().with_embedding_step(true);
        assert!(on.embedding_step());
        let o = run(on.compare_with(a, b, ConvergenceMode::Permissive, Ok(&src), Some(false)));
        assert!(!o.converged && o.embedding_cosine.is_none(), "the request turns it off: {o:?}");
        let o = run(on.compare_with(a, b, ConvergenceMode::Permissive, Ok(&src), None));
        assert!(o.converged && o.decided_by == DecidedBy::Embedding, "{o:?}");
        assert_eq!(e.calls.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn embedding_step_caches_and_breaks() {
        let clock = Arc::new(ManualClock::new());
        let c = Cascade::with_clock(clock.clone());
        let same = || -> Script { Some(Box::new(|_: &str| vec![1.0, 0.0])) };
        let (e, src) = fake(same());
        let a = "the cat sat on the mat today";
        let b = "the dog sat on the rug today";
        let o = run(c.compare(a, b, ConvergenceMode::Strict, Ok(&src)));
        assert!(o.converged && o.decided_by == DecidedBy::Embedding && !o.embedding_cached, "{o:?}");
        assert_eq!((e.calls.load(Ordering::SeqCst), c.cached_vectors()), (1, 2));
        let o = run(c.compare(a, b, ConvergenceMode::Strict, Ok(&src)));
        assert!(o.embedding_cached && e.calls.load(Ordering::SeqCst) == 1, "{o:?}");
        clock.advance(CACHE_TTL);
        let o = run(c.compare(a, b, ConvergenceMode::Strict, Ok(&src)));
        assert!(!o.embedding_cached && e.calls.load(Ordering::SeqCst) == 2, "expired entries are fetched again");

        // Orthogonal vectors: cosine 0, not converged.
        let (_, orth) = fake(Some(Box::new(|t: &str| if t.contains("cat") { vec![1.0, 0.0] } else { vec![0.0, 1.0] })));
        let c2 = Cascade::with_clock(clock.clone());
        let o = run(c2.compare(a, b, ConvergenceMode::Permissive, Ok(&orth)));
        assert!(!o.converged && close(o.embedding_cosine.unwrap(), 0.0), "{o:?}");

        // Failing backend: three failures open the breaker, the fourth compare makes no call.
        let (down, src) = fake(None);
        let c3 = Cascade::with_clock(clock.clone());
        for _ in 0..3 {
            let o = run(c3.compare(a, b, ConvergenceMode::Strict, Ok(&src)));
            assert!(!o.converged && o.degraded_reason.contains("embedding call failed"), "{o:?}");
        }
        assert_eq!(c3.breaker_state(), BreakerState::Open);
        let o = run(c3.compare(a, b, ConvergenceMode::Permissive, Ok(&src)));
        assert_eq!(down.calls.load(Ordering::SeqCst), 3);
        assert!(o.degraded_reason.contains("breaker is open"), "{o:?}");
        clock.advance(BREAKER_COOLDOWN);
        *lock(&down.vectors) = same();
        let o = run(c3.compare(a, b, ConvergenceMode::Strict, Ok(&src)));
        assert!(o.converged && o.decided_by == DecidedBy::Embedding, "a successful trial closes: {o:?}");
        assert_eq!(c3.breaker_state(), BreakerState::Closed);
    }
}
