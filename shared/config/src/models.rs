//! Per-phase model choice (`[models]`: `stage_6_arbiter`, `stage_6_patcher`, ...): declared here,
//! resolved by the model hub (`assay-llm`).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The backend used when nothing names one: the embedded offline model.
pub const DEFAULT_BACKEND: &str = "local";

/// The phase entry that configures every embedding call.
pub const EMBEDDING_PHASE: &str = "embedding";

/// Model settings for one phase. In a phase entry, unset fields (and an empty `backend`) inherit
/// from the default entry.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelSettings {
    /// `openai`, `local`, or any name of a configured backend.
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
}
