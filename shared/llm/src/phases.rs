//! Per-phase model choice (`stage_6_arbiter`, `stage_6_patcher`, ...) and the backend registry.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::types::{ChatModel, ChatRequest, EmbeddingModel, EmbeddingRequest, LlmError};

/// The backend used when nothing names one: the embedded offline model.
pub const DEFAULT_BACKEND: &str = "local";

/// Model settings for one phase. In a phase entry, unset fields (and an empty `backend`) inherit
/// from the default entry.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSettings {
    /// `openai`, `local`, or any name registered in [`Backends`].
    pub backend: String,
    pub model: Option<String>,
    pub temperature: Option<f32>,
    /// Nucleus sampling; unset leaves the backend's own.
    pub top_p: Option<f32>,
    pub seed: Option<u64>,
    pub max_tokens: Option<u32>,
}

impl ModelSettings {
    /// Settings on backend `backend` with nothing else set.
    pub fn backend(backend: impl Into<String>) -> Self {
        Self { backend: backend.into(), ..Self::default() }
    }

    /// `self`, with every unset field taken from `fallback`.
    pub fn or(&self, fallback: &ModelSettings) -> ModelSettings {
        ModelSettings {
            backend: if self.backend.trim().is_empty() { fallback.backend.clone() } else { self.backend.clone() },
            model: self.model.clone().or_else(|| fallback.model.clone()),
            temperature: self.temperature.or(fallback.temperature),
            top_p: self.top_p.or(fallback.top_p),
            seed: self.seed.or(fallback.seed),
            max_tokens: self.max_tokens.or(fallback.max_tokens),
        }
    }

    /// Fill the request's unset model, temperature, top_p, seed and max tokens from these settings
    /// (fields the request already sets win).
    pub fn apply(&self, mut request: ChatRequest) -> ChatRequest {
        request.model = request.model.or_else(|| self.model.clone());
        request.temperature = request.temperature.or(self.temperature);
        request.top_p = request.top_p.or(self.top_p);
        request.seed = request.seed.or(self.seed);
        request.max_tokens = request.max_tokens.or(self.max_tokens);
        request
    }

    /// Fill an embedding request's unset model.
    pub fn apply_embedding(&self, mut request: EmbeddingRequest) -> EmbeddingRequest {
        request.model = request.model.or_else(|| self.model.clone());
        request
    }
}

/// Default settings plus per-phase overrides.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PhaseModels {
    pub default: ModelSettings,
    pub phases: BTreeMap<String, ModelSettings>,
}

impl Default for PhaseModels {
    fn default() -> Self {
        Self { default: ModelSettings::backend(DEFAULT_BACKEND), phases: BTreeMap::new() }
    }
}

impl PhaseModels {
    /// Settings for `phase`: its entry over the default, field by field. An unknown phase gets the
    /// default; a backend left empty everywhere becomes [`DEFAULT_BACKEND`].
    pub fn resolve(&self, phase: &str) -> ModelSettings {
        let base = self.default.or(&ModelSettings::backend(DEFAULT_BACKEND));
        match self.phases.get(phase) {
            Some(entry) => entry.or(&base),
            None => base,
        }
    }

    /// Settings for the embedding calls of `phase`: the [`EMBEDDING_PHASE`] entry over the phase's
    /// backend. Only that entry names an embedding model, so a chat model name set for a phase or
    /// as the default never reaches an embeddings endpoint (the backend's own embedding model
    /// applies). `models.phases.embedding.backend = "local"` keeps embeddings on the embedded model
    /// while chat goes to a remote server.
    pub fn resolve_embedding(&self, phase: &str) -> ModelSettings {
        let base = ModelSettings::backend(self.resolve(phase).backend);
        match self.phases.get(EMBEDDING_PHASE) {
            Some(entry) => {
                ModelSettings { backend: entry.or(&base).backend, model: entry.model.clone(), ..Default::default() }
            }
            None => base,
        }
    }
}

/// The phase entry that configures every embedding call.
pub const EMBEDDING_PHASE: &str = "embedding";

/// Named chat and embedding backends.
#[derive(Clone, Default)]
pub struct Backends {
    chat: BTreeMap<String, Arc<dyn ChatModel>>,
    embedding: BTreeMap<String, Arc<dyn EmbeddingModel>>,
}

impl fmt::Debug for Backends {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Backends")
            .field("chat", &self.chat.keys().collect::<Vec<_>>())
            .field("embedding", &self.embedding.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Backends {
    pub fn new() -> Self {
        Self::default()
    }

    /// Register (or replace) a chat backend.
    pub fn insert_chat(&mut self, name: impl Into<String>, model: Arc<dyn ChatModel>) -> &mut Self {
        self.chat.insert(name.into(), model);
        self
    }

    /// Register (or replace) an embedding backend.
    pub fn insert_embedding(&mut self, name: impl Into<String>, model: Arc<dyn EmbeddingModel>) -> &mut Self {
        self.embedding.insert(name.into(), model);
        self
    }

    /// Builder form of [`Backends::insert_chat`].
    pub fn with_chat(mut self, name: impl Into<String>, model: Arc<dyn ChatModel>) -> Self {
        self.insert_chat(name, model);
        self
    }

    /// Builder form of [`Backends::insert_embedding`].
    pub fn with_embedding(mut self, name: impl Into<String>, model: Arc<dyn EmbeddingModel>) -> Self {
        self.insert_embedding(name, model);
        self
    }

    /// The chat backend called `name`; `InvalidRequest` when none is registered.
    pub fn chat(&self, name: &str) -> Result<Arc<dyn ChatModel>, LlmError> {
        self.chat.get(name).cloned().ok_or_else(|| {
            LlmError::InvalidRequest(format!("unknown chat backend {name:?} (known: {})", join(self.chat.keys())))
        })
    }

    /// The embedding backend called `name`; `InvalidRequest` when none is registered.
    pub fn embedding(&self, name: &str) -> Result<Arc<dyn EmbeddingModel>, LlmError> {
        self.embedding.get(name).cloned().ok_or_else(|| {
            LlmError::InvalidRequest(format!(
                "unknown embedding backend {name:?} (known: {})",
                join(self.embedding.keys())
            ))
        })
    }

    /// The backend and settings for `phase`.
    pub fn chat_for_phase(
        &self,
        phases: &PhaseModels,
        phase: &str,
    ) -> Result<(Arc<dyn ChatModel>, ModelSettings), LlmError> {
        let settings = phases.resolve(phase);
        Ok((self.chat(&settings.backend)?, settings))
    }

    pub fn chat_names(&self) -> impl Iterator<Item = &str> {
        self.chat.keys().map(String::as_str)
    }

    pub fn embedding_names(&self) -> impl Iterator<Item = &str> {
        self.embedding.keys().map(String::as_str)
    }
}

fn join<'a>(names: impl Iterator<Item = &'a String>) -> String {
    let names: Vec<&str> = names.map(String::as_str).collect();
    if names.is_empty() { "none".into() } else { names.join(", ") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phase_overrides_default_field_by_field() {
        let phases: PhaseModels = serde_json::from_value(serde_json::json!({
            "default": {"backend": "openai", "model": "gpt-4o-mini", "temperature": 0.0, "max_tokens": 512},
            "phases": {
                "stage_6_arbiter": {"model": "gpt-4o", "seed": 7},
                "stage_6_patcher": {"backend": "local", "temperature": 0.7},
            }
        }))
        .unwrap();
        let arbiter = phases.resolve("stage_6_arbiter");
        assert_eq!(
            arbiter,
            ModelSettings {
                backend: "openai".into(),
                model: Some("gpt-4o".into()),
                temperature: Some(0.0),
                top_p: None,
                seed: Some(7),
                max_tokens: Some(512),
            }
        );
        let patcher = phases.resolve("stage_6_patcher");
        assert_eq!(patcher.backend, "local");
        assert_eq!(patcher.model.as_deref(), Some("gpt-4o-mini"));
        assert_eq!(patcher.temperature, Some(0.7));
        assert_eq!(phases.resolve("unknown"), phases.default);
        let nucleus: PhaseModels =
            serde_json::from_value(serde_json::json!({"phases": {"scorer": {"top_p": 0.5}}})).unwrap();
        assert_eq!(nucleus.resolve("scorer").top_p, Some(0.5), "a phase may set top_p");
    }

    #[test]
    fn embeddings_never_take_a_chat_model_name() {
        let phases: PhaseModels = serde_json::from_value(serde_json::json!({
            "default": {"backend": "openai", "model": "gpt-4o-mini"},
            "phases": {"refiners": {"backend": "vllm", "model": "llama-3"}}
        }))
        .unwrap();
        assert_eq!(phases.resolve_embedding("refiners"), ModelSettings::backend("vllm"));
        assert_eq!(phases.resolve_embedding("scorer"), ModelSettings::backend("openai"));
        let phases: PhaseModels = serde_json::from_value(serde_json::json!({
            "default": {"backend": "openai", "model": "gpt-4o-mini"},
            "phases": {"embedding": {"backend": "local"}, "refiners": {"backend": "vllm"}}
        }))
        .unwrap();
        assert_eq!(phases.resolve_embedding("refiners"), ModelSettings::backend("local"));
        let phases: PhaseModels = serde_json::from_value(serde_json::json!({
            "default": {"backend": "openai"},
            "phases": {"embedding": {"model": "text-embedding-3-small"}}
        }))
        .unwrap();
        let e = phases.resolve_embedding("generator");
        assert_eq!((e.backend.as_str(), e.model.as_deref()), ("openai", Some("text-embedding-3-small")));
    }

    #[test]
    fn empty_config_uses_local() {
        let phases: PhaseModels = serde_json::from_str("{}").unwrap();
        assert_eq!(phases.resolve("x").backend, DEFAULT_BACKEND);
        let phases: PhaseModels = serde_json::from_value(serde_json::json!({"default": {"model": "m"}})).unwrap();
        assert_eq!(phases.resolve("x").backend, DEFAULT_BACKEND);
        assert_eq!(phases.resolve("x").model.as_deref(), Some("m"));
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let parsed = serde_json::from_value::<ModelSettings>(serde_json::json!({"backnd": "openai"}));
        assert!(parsed.is_err());
    }

    #[test]
    fn apply_keeps_request_fields() {
        let settings = ModelSettings { model: Some("m".into()), temperature: Some(0.5), ..ModelSettings::default() };
        let request = settings.apply(ChatRequest { temperature: Some(0.0), ..ChatRequest::default() });
        assert_eq!(request.model.as_deref(), Some("m"));
        assert_eq!(request.temperature, Some(0.0));
    }

    #[test]
    fn unknown_backend_is_an_error() {
        let backends = Backends::new();
        match backends.chat("openai") {
            Err(LlmError::InvalidRequest(message)) => assert!(message.contains("openai")),
            Err(other) => panic!("unexpected error {other}"),
            Ok(_) => panic!("no backend was registered"),
        }
    }
}
