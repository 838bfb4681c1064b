//! Resolving a caller's [`ModelSpec`] against configured backends and per-phase settings.

use std::sync::Arc;

use assay_llm::phases::{Backends, ModelSettings, PhaseModels};
use assay_llm::{CachePolicy, ChatModel, EmbeddingModel, EmbeddingRequest, Usage};

use crate::error::StageError;
use crate::model::{ModelRecord, ModelSpec};

/// Backends plus per-phase settings: what every model-using stage needs.
#[derive(Clone, Debug, Default)]
pub struct ModelHub {
    pub backends: Backends,
    pub phases: PhaseModels,
}

/// A chat backend with the settings to use for one call.
#[derive(Clone)]
pub struct ResolvedChat {
    pub model: Arc<dyn ChatModel>,
    pub backend: String,
    pub settings: ModelSettings,
    pub cache: CachePolicy,
}

impl ResolvedChat {
    /// Model name actually used.
    pub fn model_name(&self) -> String {
        self.settings.model.clone().unwrap_or_else(|| self.model.default_model().to_string())
    }

    /// Reproducibility record for this phase.
    pub fn record(&self, phase: &str, max_tokens: u32, template_sha256: String, logprobs: bool) -> ModelRecord {
        ModelRecord {
            phase: phase.to_string(),
            backend: self.backend.clone(),
            model: self.model_name(),
            temperature: self.settings.temperature.map(f64::from),
            seed: self.settings.seed,
            max_tokens,
            prompt_template_sha256: template_sha256,
            logprobs_requested: logprobs,
        }
    }
}

impl ModelHub {
    pub fn new(backends: Backends, phases: PhaseModels) -> Self {
        Self { backends, phases }
    }

    /// Every phase, chat and embeddings, on one OpenAI-compatible server under the backend name
    /// `openai`: for tools and tests that talk to a single endpoint.
    pub fn single_openai(config: assay_llm::OpenAiConfig) -> Result<Self, assay_llm::LlmError> {
        let client = Arc::new(assay_llm::OpenAiClient::new(config)?);
        let backends = Backends::new().with_chat("openai", client.clone()).with_embedding("openai", client);
        Ok(Self::new(backends, PhaseModels { default: ModelSettings::backend("openai"), ..PhaseModels::default() }))
    }

    /// The chat backend for `phase`: the caller's spec over the phase's configured settings.
    /// `field` names the spec in errors (e.g. `model`).
    pub fn chat(&self, phase: &str, spec: &ModelSpec, field: &str) -> Result<ResolvedChat, StageError> {
        let configured = self.phases.resolve(phase);
        let requested = ModelSettings {
            backend: spec.backend.clone().unwrap_or_default(),
            model: spec.model.clone(),
            temperature: spec.temperature.map(|t| t as f32),
            seed: spec.seed,
            max_tokens: spec.max_tokens,
        };
        let settings = requested.or(&configured);
        let model = self.backends.chat(&settings.backend).map_err(|e| {
            StageError::invalid(
                format!("{field}.backend"),
                e.to_string().trim_start_matches("invalid request: ").to_string(),
            )
        })?;
        // Measured per backend and phase (assay_llm::metrics).
        let model: Arc<dyn ChatModel> = Arc::new(assay_llm::metrics::MeteredChat::new(model, &settings.backend, phase));
        Ok(ResolvedChat { model, backend: settings.backend.clone(), settings, cache: cache_policy(spec) })
    }

    /// The embedding backend for `phase`.
    pub fn embedding(
        &self,
        phase: &str,
        spec: &ModelSpec,
        field: &str,
    ) -> Result<(Arc<dyn EmbeddingModel>, ModelSettings), StageError> {
        let configured = self.phases.resolve_embedding(phase);
        let requested = ModelSettings {
            backend: spec.backend.clone().unwrap_or_default(),
            model: spec.model.clone(),
            ..Default::default()
        };
        let settings = requested.or(&configured);
        let model = self.backends.embedding(&settings.backend).map_err(|e| {
            StageError::invalid(
                format!("{field}.backend"),
                e.to_string().trim_start_matches("invalid request: ").to_string(),
            )
        })?;
        Ok((model, settings))
    }

    /// Embed `texts` for `phase` in one batched call, vectors in input order, checked (one per
    /// text, same non-zero dimension, finite).
    pub async fn embed(
        &self,
        phase: &str,
        spec: &ModelSpec,
        field: &str,
        texts: Vec<String>,
    ) -> Result<(Vec<Vec<f32>>, Usage), StageError> {
        let (model, settings) = self.embedding(phase, spec, field)?;
        let n = texts.len();
        if n == 0 {
            return Ok((Vec::new(), Usage::default()));
        }
        let request = settings.apply_embedding(EmbeddingRequest {
            texts,
            model: None,
            cache: cache_policy(spec),
            deadline: None,
        });
        let model_name = request.model.clone().unwrap_or_else(|| model.default_model().to_string());
        let started = std::time::Instant::now();
        let reply = model.embed(request).await;
        assay_llm::metrics::record_call(
            "embeddings",
            (&settings.backend, phase, &model_name),
            started,
            reply.as_ref().map(|r| &r.usage),
        );
        let reply = reply?;
        if reply.vectors.len() != n {
            return Err(StageError::Unavailable(format!(
                "the embedding backend returned {} vectors for {n} texts",
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

/// The cache policy a caller's spec asks for.
pub fn cache_policy(spec: &ModelSpec) -> CachePolicy {
    if spec.no_cache {
        CachePolicy::Bypass
    } else if spec.cache_sampled {
        CachePolicy::OptIn
    } else {
        CachePolicy::Auto
    }
}
