//! Model backends for Assay.
//!
//! - [`types`]: backend-neutral traits ([`ChatModel`], [`EmbeddingModel`]) and request/response types.
//! - [`openai`]: [`OpenAiClient`], an OpenAI-compatible HTTP client with retries, schema fallback,
//!   concurrency limit, circuit breaker and cancellation.
//! - [`limiter`]: [`AdaptiveLimit`](limiter::AdaptiveLimit), the adaptive concurrency limit of a backend.
//! - [`cache`]: [`CachedChat`] / [`CachedEmbed`] wrappers over a [`ResponseCache`] (memory, optional SQLite).
//! - [`phases`]: per-phase [`ModelSettings`] ([`PhaseModels`]) and the [`Backends`] registry.
//! - [`metrics`]: model-call metrics per backend and phase ([`metrics::MeteredChat`]).
//! - [`extract_json`]: pull a JSON value out of model text.

pub mod breaker;
pub mod cache;
pub mod json;
pub mod limiter;
pub mod metrics;
pub mod openai;
pub mod phases;
pub mod retry;
pub mod types;

pub use breaker::BreakerState;
pub use cache::{CacheConfig, CacheError, CachedChat, CachedEmbed, ResponseCache};
pub use json::extract_json;
pub use openai::{AdaptiveTimeout, MaxTokensField, OpenAiClient, OpenAiConfig};
pub use phases::{Backends, DEFAULT_BACKEND, EMBEDDING_PHASE, ModelSettings, PhaseModels};
pub use types::*;
