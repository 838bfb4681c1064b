//! Configuration of one OpenAI-compatible backend.

use std::fmt;
use std::time::Duration;

pub use super::api::Api;
use super::latency::AdaptiveTimeout;
use crate::limiter::LimitSettings;
use crate::retry::Backoff;

/// Name of the request field that carries the token limit (declared with the backend's
/// settings).
pub use assay_config::MaxTokensField;

/// Configuration of one OpenAI-compatible backend.
#[derive(Clone)]
pub struct OpenAiConfig {
    /// Backend name used in [`ChatModel::backend`](crate::types::ChatModel::backend), logs and
    /// cache keys (default `openai`).
    pub backend_name: String,
    /// e.g. `https://api.openai.com/v1` or `http://127.0.0.1:8080/v1` (no trailing path);
    /// `http://127.0.0.1:11434/api` for Ollama's native API.
    pub base_url: String,
    /// The API the server speaks (default: [`Api::of_base_url`] of `base_url`, decided when the
    /// client is built; `None` = that).
    pub api: Option<Api>,
    /// Sent as `Authorization: Bearer ...` when set. Never logged.
    pub api_key: Option<String>,
    pub default_model: String,
    pub embedding_model: String,
    pub max_tokens_field: MaxTokensField,
    /// Hard cap on HTTP requests in flight (1024 by default: the official OpenAI Python client
    /// allows 1000 connections; the adaptive limit below keeps a smaller server from drowning).
    pub max_concurrency: usize,
    /// Requests in flight at the start; the limit then adapts between 1 and `max_concurrency`
    /// (see [`crate::limiter`]). 0 = fixed at `max_concurrency`.
    pub initial_concurrency: usize,
    /// Retries after the first attempt.
    pub max_retries: u32,
    pub base_backoff: Duration,
    pub max_backoff: Duration,
    /// Longest `Retry-After` honoured (default 30 s): a server asking for a longer wait gets no
    /// retry; the call fails at once (rate limited or unavailable) instead of sitting through it.
    pub max_retry_after: Duration,
    /// Per-attempt HTTP timeout, the ceiling of the adaptive one (also capped by the request
    /// deadline).
    pub request_timeout: Duration,
    /// Per-attempt timeouts from the backend's observed latency (floor, multiplier, on/off).
    pub adaptive_timeout: AdaptiveTimeout,
    pub connect_timeout: Duration,
    pub breaker_failures: u32,
    pub breaker_cooldown: Duration,
    /// Send `response_format: json_schema`; when false the schema always goes in the prompt.
    pub supports_json_schema: bool,
    /// How structured output is sent: negotiated per model (`Auto`), or one fixed form.
    pub structured_output: super::format::StructuredOutput,
    pub supports_logprobs: bool,
    /// 5xx statuses that are deterministic and never retried (default 501, 505).
    pub deterministic_statuses: Vec<u16>,
    /// Requests per minute this client may send (a token bucket in front of the concurrency
    /// limit; 0 = no limit).
    pub requests_per_minute: u32,
    /// Prompt + completion tokens per minute this client may use (0 = no limit).
    pub tokens_per_minute: u64,
}

impl Default for OpenAiConfig {
    fn default() -> Self {
        Self {
            backend_name: "openai".into(),
            base_url: "https://api.openai.com/v1".into(),
            api: None,
            api_key: None,
            default_model: "gpt-4o-mini".into(),
            embedding_model: "text-embedding-3-small".into(),
            max_tokens_field: MaxTokensField::MaxTokens,
            max_concurrency: 1024,
            initial_concurrency: 64,
            max_retries: 4,
            base_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(8),
            max_retry_after: Duration::from_secs(30),
            request_timeout: Duration::from_secs(120),
            adaptive_timeout: AdaptiveTimeout::default(),
            connect_timeout: Duration::from_secs(10),
            breaker_failures: 5,
            breaker_cooldown: Duration::from_secs(30),
            supports_json_schema: true,
            structured_output: super::format::StructuredOutput::Auto,
            supports_logprobs: true,
            deterministic_statuses: vec![501, 505],
            requests_per_minute: 0,
            tokens_per_minute: 0,
        }
    }
}

impl fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("backend_name", &self.backend_name)
            .field("base_url", &self.base_url)
            .field("api", &self.api)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("default_model", &self.default_model)
            .field("embedding_model", &self.embedding_model)
            .field("max_tokens_field", &self.max_tokens_field)
            .field("max_concurrency", &self.max_concurrency)
            .field("initial_concurrency", &self.initial_concurrency)
            .field("max_retries", &self.max_retries)
            .field("base_backoff", &self.base_backoff)
            .field("max_backoff", &self.max_backoff)
            .field("max_retry_after", &self.max_retry_after)
            .field("request_timeout", &self.request_timeout)
            .field("adaptive_timeout", &self.adaptive_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("breaker_failures", &self.breaker_failures)
            .field("breaker_cooldown", &self.breaker_cooldown)
            .field("supports_json_schema", &self.supports_json_schema)
            .field("structured_output", &self.structured_output)
            .field("supports_logprobs", &self.supports_logprobs)
            .field("deterministic_statuses", &self.deterministic_statuses)
            .field("requests_per_minute", &self.requests_per_minute)
            .field("tokens_per_minute", &self.tokens_per_minute)
            .finish()
    }
}

impl OpenAiConfig {
    /// Defaults with this base URL.
    pub fn new(base_url: impl Into<String>) -> Self {
        Self { base_url: base_url.into(), ..Self::default() }
    }

    /// Defaults, with `OPENAI_BASE_URL` (default `https://api.openai.com/v1`), `OPENAI_API_KEY`,
    /// and optionally `OPENAI_MODEL` / `OPENAI_EMBEDDING_MODEL` from the environment.
    pub fn from_env() -> Self {
        let var = |name: &str| std::env::var(name).ok().map(|v| v.trim().to_owned()).filter(|v| !v.is_empty());
        let defaults = Self::default();
        Self {
            base_url: var("OPENAI_BASE_URL").unwrap_or(defaults.base_url),
            api_key: var("OPENAI_API_KEY"),
            default_model: var("OPENAI_MODEL").unwrap_or(defaults.default_model),
            embedding_model: var("OPENAI_EMBEDDING_MODEL").unwrap_or(defaults.embedding_model),
            ..Self::default()
        }
    }

    /// The API the backend speaks: the configured one, else the base URL's.
    pub fn api(&self) -> Api {
        self.api.unwrap_or_else(|| Api::of_base_url(&self.base_url))
    }

    /// The settings of the backend's concurrency limit.
    pub fn limit_settings(&self) -> LimitSettings {
        if self.initial_concurrency == 0 {
            LimitSettings::fixed(self.max_concurrency)
        } else {
            LimitSettings { initial: self.initial_concurrency, ..LimitSettings::adaptive(self.max_concurrency) }
        }
    }

    pub(super) fn backoff(&self) -> Backoff {
        Backoff { base: self.base_backoff, max: self.max_backoff }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn debug_redacts_api_key() {
        let config = OpenAiConfig { api_key: Some("sk-secret".into()), ..OpenAiConfig::default() };
        assert!(!format!("{config:?}").contains("sk-secret"));
    }

    #[test]
    fn the_api_follows_the_base_url_unless_configured() {
        assert_eq!(OpenAiConfig::new("http://127.0.0.1:11434/api").api(), Api::Ollama);
        assert_eq!(OpenAiConfig::new("http://127.0.0.1:11434/api/").api(), Api::Ollama);
        assert_eq!(OpenAiConfig::new("http://127.0.0.1:11434/v1").api(), Api::OpenAi);
        let configured = OpenAiConfig { api: Some(Api::Ollama), ..OpenAiConfig::new("http://ollama.internal") };
        assert_eq!(configured.api(), Api::Ollama);
        assert_eq!(Api::parse("ollama"), Some(Api::Ollama));
        assert_eq!(Api::parse("tgi"), None);
    }
}
