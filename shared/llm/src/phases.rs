//! Per-phase model choice (`stage_6_arbiter`, `stage_6_patcher`, ...) and the backend registry.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::Arc;

use crate::types::{ChatModel, ChatRequest, EmbeddingModel, EmbeddingRequest, LlmError};

pub use assay_config::models::{DEFAULT_BACKEND, EMBEDDING_PHASE, ModelSettings, PhaseModels};

impl ChatRequest {
    /// This request with its unset model, temperature, top_p, seed and max tokens filled from
    /// `settings` (fields the request already sets win).
    pub fn with_settings(mut self, settings: &ModelSettings) -> ChatRequest {
        self.model = self.model.or_else(|| settings.model.clone());
        self.temperature = self.temperature.or(settings.temperature);
        self.top_p = self.top_p.or(settings.top_p);
        self.seed = self.seed.or(settings.seed);
        self.max_tokens = self.max_tokens.or(settings.max_tokens);
        self
    }
}

impl EmbeddingRequest {
    /// This request with its unset model filled from `settings`.
    pub fn with_settings(mut self, settings: &ModelSettings) -> EmbeddingRequest {
        self.model = self.model.or_else(|| settings.model.clone());
        self
    }
}

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
    fn apply_keeps_request_fields() {
        let settings = ModelSettings { model: Some("m".into()), temperature: Some(0.5), ..ModelSettings::default() };
        let request = ChatRequest { temperature: Some(0.0), ..ChatRequest::default() }.with_settings(&settings);
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
