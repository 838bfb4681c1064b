//! Model selection and reproducibility records.

use serde::{Deserialize, Serialize};

/// Caller's choice of model for one phase; unset fields fall back to configuration.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelSpec {
    pub backend: Option<String>,
    pub model: Option<String>,
    pub temperature: Option<f64>,
    pub seed: Option<u64>,
    pub max_tokens: Option<u32>,
    pub top_p: Option<f64>,
    pub cache_sampled: bool,
    pub no_cache: bool,
}

/// What produced an output, exactly.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ModelRecord {
    pub phase: String,
    pub backend: String,
    pub model: String,
    pub temperature: Option<f64>,
    pub seed: Option<u64>,
    pub max_tokens: u32,
    pub prompt_template_sha256: String,
    pub logprobs_requested: bool,
    /// How the backend was sent JSON schemas for this model when the record was made
    /// (`json_schema`, `json_object`, `json_mode` or `prompt`); empty when the backend does not
    /// say (the embedded backend enforces schemas itself).
    #[serde(default)]
    pub structured_output: String,
    /// The most characters each quoted text of the prompt was cut to so the prompt fit the
    /// model's context; 0 when nothing was cut.
    #[serde(default)]
    pub prompt_cut_chars: u32,
}
