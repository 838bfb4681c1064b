//! Resolving a caller's [`ModelSpec`] against configured backends and per-phase settings, and
//! building every stage's chat request from the result ([`ResolvedChat::request`]).

use std::sync::Arc;

use assay_domain::{ModelRecord, ModelSpec, StageError};

use crate::phases::{Backends, ModelSettings, PhaseModels};
use crate::types::{CachePolicy, ChatModel, ChatRequest, EmbeddingModel, EmbeddingRequest, Message, Usage};

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

/// What a stage brings to one chat call besides its messages: its own defaults, used only where
/// neither the caller nor the configuration decides, and its bound, applied last. See
/// [`ResolvedChat::request`] for the order.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Purpose {
    /// Reply token limit when neither the caller's spec nor the phase's settings set one.
    pub max_tokens: u32,
    /// Temperature when neither the caller's spec nor the phase's settings set one.
    pub temperature: f32,
    /// A temperature the stage chose itself from the caller's spec (the generator's preset
    /// temperatures, debate's solver spread): sent as is, over the phase's settings.
    pub chosen_temperature: Option<f32>,
    /// The least reply token limit the stage can work with (the scorer's batch needs room for
    /// every item): applied last, over the caller's spec and the settings.
    pub min_tokens: Option<u32>,
}

impl Purpose {
    /// A call that defaults to `max_tokens` reply tokens at temperature 0.
    pub fn new(max_tokens: u32) -> Self {
        Self { max_tokens, temperature: 0.0, chosen_temperature: None, min_tokens: None }
    }

    /// A temperature the stage chose from the caller's spec; see [`Purpose::chosen_temperature`].
    pub fn chosen_temperature(self, temperature: f64) -> Self {
        Self { chosen_temperature: Some(temperature as f32), ..self }
    }

    /// The least reply token limit; see [`Purpose::min_tokens`].
    pub fn at_least(self, tokens: u32) -> Self {
        Self { min_tokens: Some(tokens), ..self }
    }
}

impl ResolvedChat {
    /// The chat request of one stage call: `messages`, this backend's cache policy, free text
    /// (set `response_format` / `top_logprobs` on the result for other shapes), and the sampling
    /// settings in one order for every stage:
    ///
    /// 1. the caller's [`ModelSpec`] (model, temperature, top_p, seed, max_tokens),
    /// 2. then the phase's configured [`ModelSettings`] (its entry over the default entry),
    /// 3. then the stage's own default from `purpose` (max tokens, temperature; top_p and seed stay
    ///    unset, leaving the backend's),
    /// 4. last the stage's bound: [`Purpose::min_tokens`] raises the token limit to what the stage
    ///    needs.
    ///
    /// Steps 1 and 2 are [`ResolvedChat::settings`] (merged by [`ModelHub::chat`]). A temperature
    /// the stage chose from the caller's spec ([`Purpose::chosen_temperature`]) replaces steps 1-3
    /// for temperature only.
    pub fn request(&self, messages: Vec<Message>, purpose: Purpose) -> ChatRequest {
        let settings = &self.settings;
        ChatRequest {
            messages,
            model: settings.model.clone(),
            temperature: Some(purpose.chosen_temperature.or(settings.temperature).unwrap_or(purpose.temperature)),
            top_p: settings.top_p,
            seed: settings.seed,
            max_tokens: Some(self.max_tokens(purpose)),
            cache: self.cache,
            ..ChatRequest::default()
        }
    }

    /// The reply token limit [`ResolvedChat::request`] sends (for reproducibility records).
    pub fn max_tokens(&self, purpose: Purpose) -> u32 {
        let tokens = self.settings.max_tokens.unwrap_or(purpose.max_tokens);
        purpose.min_tokens.map_or(tokens, |least| tokens.max(least))
    }

    /// Model name actually used.
    pub fn model_name(&self) -> String {
        self.settings.model.clone().unwrap_or_else(|| self.model.default_model().to_string())
    }

    /// Reproducibility record for this phase.
    pub fn record(&self, phase: &str, max_tokens: u32, template_sha256: String, logprobs: bool) -> ModelRecord {
        let model = self.model_name();
        ModelRecord {
            phase: phase.to_string(),
            backend: self.backend.clone(),
            structured_output: self.model.structured_output(&model).unwrap_or_default().to_string(),
            model,
            temperature: self.settings.temperature.map(f64::from),
            seed: self.settings.seed,
            max_tokens,
            prompt_template_sha256: template_sha256,
            logprobs_requested: logprobs,
            prompt_cut_chars: 0,
        }
    }
}

impl ModelHub {
    pub fn new(backends: Backends, phases: PhaseModels) -> Self {
        Self { backends, phases }
    }

    /// Every phase, chat and embeddings, on one OpenAI-compatible server under the backend name
    /// `openai`: for tools and tests that talk to a single endpoint.
    pub fn single_openai(config: crate::OpenAiConfig) -> Result<Self, crate::LlmError> {
        let client = Arc::new(crate::OpenAiClient::new(config)?);
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
            top_p: spec.top_p.map(|p| p as f32),
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
        // Measured per backend and phase (crate::metrics).
        let model: Arc<dyn ChatModel> = Arc::new(crate::metrics::MeteredChat::new(model, &settings.backend, phase));
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
        let request =
            EmbeddingRequest { texts, model: None, cache: cache_policy(spec), deadline: None }.with_settings(&settings);
        let model_name = request.model.clone().unwrap_or_else(|| model.default_model().to_string());
        let started = std::time::Instant::now();
        let reply = model.embed(request).await;
        crate::metrics::record_call(
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{ChatResponse, LlmError};

    struct Silent;

    #[async_trait::async_trait]
    impl ChatModel for Silent {
        fn backend(&self) -> &str {
            "silent"
        }
        fn default_model(&self) -> &str {
            "m"
        }
        fn supports_logprobs(&self) -> bool {
            false
        }
        async fn chat(&self, _: ChatRequest) -> Result<ChatResponse, LlmError> {
            Err(LlmError::Unsupported("never called".into()))
        }
    }

    /// A hub whose phase `p` configures top_p 0.25, max_tokens 300 and temperature 0.5.
    fn hub() -> ModelHub {
        let configured = ModelSettings {
            backend: "silent".into(),
            temperature: Some(0.5),
            top_p: Some(0.25),
            max_tokens: Some(300),
            ..ModelSettings::default()
        };
        let phases = PhaseModels { phases: [("p".to_string(), configured)].into(), ..PhaseModels::default() };
        ModelHub::new(Backends::new().with_chat("silent", Arc::new(Silent)), phases)
    }

    #[test]
    fn request_takes_the_spec_then_the_phase_then_the_stage_default() {
        let hub = hub();
        let spec =
            ModelSpec { top_p: Some(0.75), max_tokens: Some(50), temperature: Some(0.0), ..ModelSpec::default() };
        let chat = hub.chat("p", &spec, "model").unwrap();
        let req = chat.request(vec![Message::user("q")], Purpose::new(999));
        assert_eq!((req.top_p, req.max_tokens, req.temperature), (Some(0.75), Some(50), Some(0.0)), "spec wins");

        let chat = hub.chat("p", &ModelSpec::default(), "model").unwrap();
        let req = chat.request(vec![Message::user("q")], Purpose::new(999));
        assert_eq!((req.top_p, req.max_tokens, req.temperature), (Some(0.25), Some(300), Some(0.5)), "then the phase");

        let chat =
            hub.chat("other", &ModelSpec { backend: Some("silent".into()), ..ModelSpec::default() }, "model").unwrap();
        let req = chat.request(vec![Message::user("q")], Purpose::new(999));
        assert_eq!((req.top_p, req.max_tokens, req.temperature), (None, Some(999), Some(0.0)), "then the stage");
    }

    #[test]
    fn the_stage_bound_comes_last_and_a_chosen_temperature_replaces_the_settings() {
        let hub = hub();
        let chat = hub.chat("p", &ModelSpec { max_tokens: Some(50), ..ModelSpec::default() }, "model").unwrap();
        let purpose = Purpose::new(10).at_least(120).chosen_temperature(0.9);
        assert_eq!(chat.max_tokens(purpose), 120);
        let req = chat.request(vec![Message::user("q")], purpose);
        assert_eq!((req.max_tokens, req.temperature), (Some(120), Some(0.9)));
        assert_eq!(chat.max_tokens(Purpose::new(10).at_least(20)), 50, "a bound under the limit changes nothing");
    }
}
