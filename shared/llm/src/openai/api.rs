//! The HTTP API a backend speaks: the OpenAI-compatible one, or Ollama's native one.

/// The HTTP API a backend speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Api {
    /// The OpenAI-compatible API: `{base_url}/chat/completions`, `{base_url}/embeddings`.
    #[default]
    OpenAi,
    /// Ollama's native API: `{base_url}/chat` and `{base_url}/embed` under `/api`, the schema in
    /// its `format` field (the OpenAI-compatible endpoint Ollama also serves, `/v1`, is `OpenAi`).
    Ollama,
}

impl Api {
    /// Parse a configuration value: `openai` or `ollama`.
    pub fn parse(value: &str) -> Option<Self> {
        match value {
            "openai" => Some(Self::OpenAi),
            "ollama" => Some(Self::Ollama),
            _ => None,
        }
    }

    /// The API a base URL points at when none is configured: Ollama's native one for a path
    /// ending in `/api` (`http://127.0.0.1:11434/api`), else the OpenAI-compatible one.
    pub fn of_base_url(base_url: &str) -> Self {
        if base_url.trim_end_matches('/').ends_with("/api") { Self::Ollama } else { Self::OpenAi }
    }
}
