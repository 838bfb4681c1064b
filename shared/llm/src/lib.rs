//! Model backends for Assay.
//!
//! - [`types`]: backend-neutral traits ([`ChatModel`], [`EmbeddingModel`]) and request/response types.
//! - [`openai`]: [`OpenAiClient`], an OpenAI-compatible HTTP client with retries, schema fallback,
//!   concurrency limit, circuit breaker and cancellation.
//! - [`limiter`]: [`AdaptiveLimit`](limiter::AdaptiveLimit), the adaptive concurrency limit of a backend.
//! - [`cache`]: [`CachedChat`] / [`CachedEmbed`] wrappers over a [`ResponseCache`] (memory, optional SQLite).
//! - [`phases`]: per-phase [`ModelSettings`] ([`PhaseModels`]) and the [`Backends`] registry.
//! - [`metrics`]: model-call metrics per backend and phase ([`metrics::MeteredChat`]).
//! - [`hub`]: [`ModelHub`] resolves a caller's spec per phase; [`ResolvedChat::request`] builds
//!   every stage's chat request in one documented order.
//! - [`convergence`]: the convergence cascade's embedding step ([`convergence::Cascade`]).
//! - [`grammar`]: GBNF grammars (llama.cpp syntax) for a JSON schema or a closed choice: the
//!   embedded backend decodes under them, and the OpenAI-compatible client holds a choice's answer
//!   to its options with one on servers that take a `grammar` field.
//! - [`context`]: a model's context window and a refusal of a prompt over it ([`context::context_refusal`]).
//! - [`json`]: lenient reply parsing ([`extract_json`], [`json::reply_json`], [`json::lenient_bool`],
//!   [`json::preview`]).

pub mod attempts;
pub mod breaker;
pub mod cache;
pub mod clock;
pub mod context;
pub mod convergence;
pub mod grammar;
pub mod hub;
pub mod json;
pub mod limiter;
pub mod metrics;
pub mod openai;
pub mod phases;
pub mod pricing;
pub mod retry;
pub mod types;

pub use breaker::BreakerState;
pub use cache::{CacheConfig, CacheError, CachedChat, CachedEmbed, ResponseCache};
pub use context::{ContextRefusal, context_refusal};
pub use hub::{ModelHub, Purpose, ResolvedChat, cache_policy};
pub use json::extract_json;
pub use openai::{
    AdaptiveTimeout, Api, DEFAULT_HEDGE_FACTOR, MaxTokensField, OpenAiClient, OpenAiConfig, StructuredOutput,
};
pub use phases::{Backends, DEFAULT_BACKEND, EMBEDDING_PHASE, ModelSettings, PhaseModels};
pub use types::*;
