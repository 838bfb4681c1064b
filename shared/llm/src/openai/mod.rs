//! Client for OpenAI-compatible servers (`{base_url}/chat/completions`, `{base_url}/embeddings`).
//!
//! Behaviour, per client instance (clones share it):
//! - **Retries** only on HTTP 408, 429, 5xx (except the statuses in
//!   [`OpenAiConfig::deterministic_statuses`], by default 501 and 505), connect/timeout/transport
//!   errors, and once on a 200 whose body cannot be parsed (a malformed or truncated 200 is typical
//!   of a proxy cutting the connection, so one more try is cheap and usually succeeds; a second
//!   malformed body is returned as [`LlmError::MalformedReply`]). Waits use full-jitter exponential
//!   backoff, with `Retry-After` (seconds) as a minimum (a server asking for more than
//!   [`OpenAiConfig::max_retry_after`] gets no retry), and never run past the request deadline:
//!   when the next wait would cross it the last error is returned, or
//!   [`LlmError::DeadlineExceeded`] when the deadline itself has passed. Every other status is
//!   returned at once: 400/404/422 and other 4xx as `InvalidRequest`, 401/403 as `Unauthorized`,
//!   the deterministic 5xx as `Unsupported`.
//! - **JSON schema**: sent as `response_format: json_schema` (strict). If the backend answers 400
//!   (or any error status whose body names `response_format` or `json_schema`, never retried:
//!   llama-cpp-python answers 500), the request is re-sent as `json_object` with the schema (which
//!   llama-cpp-python enforces with a grammar) and the schema in the prompt, then with the schema in
//!   the prompt only. The first form that works is remembered for later calls. Every structured
//!   reply is checked against its schema: one that breaks it is counted
//!   (`Usage::schema_violations`, metric `assay.llm.schema.violations`), and a few under a form the
//!   server accepted without enforcing it move the model one form down the ladder, said once in
//!   the log, in a metric and in later reproducibility records (`structured_output`).
//! - **Choices** ([`ResponseFormat::Choice`]): the options go in the prompt, and as a GBNF
//!   `grammar` field that llama.cpp's servers (llama-server, llama-cpp-python) decode under, so the
//!   reply's first token is an option and its logprobs the model's preference between them
//!   (others ignore the field; a server that refuses it, as OpenAI does with a 400 naming it, gets
//!   the choice again without it, and later choices go without).
//! - **Concurrency**: an adaptive limit on HTTP requests in flight (see [`crate::limiter`]): it
//!   starts at `initial_concurrency`, grows while latency stays flat and is cut on latency rises
//!   and on 429 / 503 / timeouts once they are most of the recent answers, never above
//!   `max_concurrency`. Slots are held per attempt, not across backoff sleeps. A server that
//!   queues is found from its answers; one that says how many calls it serves at once (llama.cpp's
//!   `llama-server`: `GET /props` `total_slots`, asked once before the first chat call) is held to
//!   that many from the start.
//! - **Hedged requests**: an attempt unanswered after `hedge_factor` (default 2) times its call
//!   class's expected latency, and at least 100 ms, gets a duplicate beside it in a free slot; the
//!   first success is taken. Within a budget of about one duplicate per ten answers (see
//!   `latency`).
//! - **Per-minute limits**: `requests_per_minute` and `tokens_per_minute` (0 = none) are token
//!   buckets in front of the concurrency limit (see `rate`): every HTTP attempt, retries and
//!   hedges included, takes one request and reserves its token estimate before its slot, waiting
//!   in order within the deadline; the reply's usage corrects the reservation.
//! - **Circuit breaker**: `breaker_failures` consecutive transient failures (after retries) open
//!   it for `breaker_cooldown`; then one probe call decides.
//! - **Cancellation**: nothing is spawned; dropping the returned future drops the HTTP request,
//!   which closes its connection.
//!
//! Layout: `api` (OpenAI-compatible or Ollama native), `config` (the configuration), `format` (the schema fallback ladder), `request` (the
//! chat body), `transport` (breaker, retries, attempts), `rate` (per-minute limits), `errors` (failure classification),
//! `reply` and `wire` (reading replies); this module ties them into [`OpenAiClient`].

mod api;
mod config;
mod errors;
mod format;
mod latency;
mod rate;
mod reply;
mod request;
mod transport;
mod wire;

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::Instant;

use serde_json::json;
use tracing::{debug, info, warn};

use crate::breaker::BreakerState;
use crate::types::{
    ChatModel, ChatRequest, ChatResponse, EmbeddingModel, EmbeddingRequest, EmbeddingResponse, FinishReason, LlmError,
    ResponseFormat, Usage,
};

pub use api::Api;
pub use config::{MaxTokensField, OpenAiConfig};
pub use format::StructuredOutput;
pub use latency::{AdaptiveTimeout, DEFAULT_HEDGE_FACTOR};
pub use reply::normalise_choice;
pub use request::{choice_instruction, schema_instruction};

use errors::CallError;
use format::{
    Conformance, ModelForms, SchemaDelivery, SchemaMemory, VIOLATIONS_TO_DEMOTE, Validators, is_grammar_rejection,
    is_schema_rejection,
};
use transport::{ServerProps, Transport};

/// An OpenAI-compatible chat and embedding client. Cheap to clone; clones share the connection
/// pool, concurrency limit, circuit breaker and schema-support memory.
#[derive(Clone)]
pub struct OpenAiClient {
    inner: Arc<Inner>,
}

struct Inner {
    config: OpenAiConfig,
    transport: Transport,
    chat_url: String,
    embeddings_url: String,
    /// Host of the server (`server.address` of model-call spans).
    server_address: String,
    /// The schema delivery form later calls start from.
    schema: SchemaMemory,
    /// The schemas replies are checked against, compiled.
    validators: Validators,
    /// The server's slots and context as it reports them, asked once before the first chat call.
    probed: tokio::sync::OnceCell<ServerProps>,
    /// A model's context as a refusal named it (over what `/props` said).
    refused_at: std::sync::Mutex<HashMap<String, u32>>,
}

impl fmt::Debug for OpenAiClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiClient")
            .field("config", &self.inner.config)
            .field("breaker", &self.inner.transport.breaker_state())
            .finish_non_exhaustive()
    }
}

impl OpenAiClient {
    /// Build a client. Fails only if the HTTP stack cannot be initialised.
    pub fn new(config: OpenAiConfig) -> Result<Self, LlmError> {
        let transport = Transport::new(&config)?;
        let base = config.base_url.trim_end_matches('/').to_owned();
        let (chat_url, embeddings_url) = match config.api() {
            Api::OpenAi => (format!("{base}/chat/completions"), format!("{base}/embeddings")),
            Api::Ollama => {
                let api = if base.ends_with("/api") { base.clone() } else { format!("{base}/api") };
                (format!("{api}/chat"), format!("{api}/embed"))
            }
        };
        Ok(Self {
            inner: Arc::new(Inner {
                chat_url,
                embeddings_url,
                server_address: url::Url::parse(&base)
                    .ok()
                    .and_then(|u| u.host_str().map(str::to_string))
                    .unwrap_or_default(),
                transport,
                schema: SchemaMemory::default(),
                validators: Validators::default(),
                probed: tokio::sync::OnceCell::new(),
                refused_at: std::sync::Mutex::default(),
                config,
            }),
        })
    }

    pub fn config(&self) -> &OpenAiConfig {
        &self.inner.config
    }

    /// Current circuit-breaker state of the backend (opened by failures of the server itself).
    pub fn breaker_state(&self) -> BreakerState {
        self.inner.transport.breaker_state()
    }

    /// Current circuit-breaker state of one model of the backend (opened by errors the server
    /// answered for that model only).
    pub fn model_breaker_state(&self, model: &str) -> BreakerState {
        self.inner.transport.model_breaker_state(model)
    }

    /// The current concurrency limit.
    pub fn concurrency_limit(&self) -> usize {
        self.inner.transport.limit().limit()
    }

    /// The server's slots as its answers show them, once they show it queues (see
    /// [`crate::limiter`]).
    pub fn server_slots(&self) -> Option<f64> {
        self.inner.transport.limit().server_slots()
    }

    /// The server's slots as it reported them (llama.cpp's `/props`), once the first chat call
    /// has asked.
    pub fn reported_slots(&self) -> Option<usize> {
        self.inner.probed.get().and_then(|p| p.slots)
    }

    /// HTTP requests in flight now.
    pub fn in_flight(&self) -> usize {
        self.inner.transport.limit().in_flight()
    }

    /// Whether this backend has rejected the native JSON schema form (later calls use the weaker
    /// form that worked).
    pub fn schema_rejected(&self) -> bool {
        self.inner.schema.rejected()
    }

    /// The schema form later calls use: `json_schema`, `json_object` or `prompt`.
    pub fn schema_delivery(&self) -> &'static str {
        self.inner.schema.name()
    }

    fn resolve_model(&self, requested: Option<&str>, fallback: &str) -> String {
        requested.filter(|m| !m.is_empty()).unwrap_or(fallback).to_owned()
    }
}

#[async_trait::async_trait]
impl ChatModel for OpenAiClient {
    fn backend(&self) -> &str {
        &self.inner.config.backend_name
    }

    fn default_model(&self) -> &str {
        &self.inner.config.default_model
    }

    fn supports_logprobs(&self) -> bool {
        self.inner.config.supports_logprobs
    }

    fn structured_output(&self, model: &str) -> Option<&'static str> {
        let config = &self.inner.config;
        let form = match config.structured_output.fixed() {
            Some(form) => form,
            None if !config.supports_json_schema => SchemaDelivery::Prompt,
            None => self.inner.schema.of(model).current(),
        };
        Some(form.name())
    }

    async fn context_tokens(&self, model: &str) -> Option<u32> {
        let refused = self.inner.refused_at.lock().unwrap_or_else(|p| p.into_inner()).get(model).copied();
        let config = &self.inner.config;
        let props = self.inner.probed.get_or_init(|| self.inner.transport.probe_props(config)).await;
        refused.or(props.context)
    }

    async fn chat(&self, request: ChatRequest) -> Result<ChatResponse, LlmError> {
        let config = &self.inner.config;
        let model = self.resolve_model(request.model.as_deref(), &config.default_model);
        // One client span per model call, with the OpenTelemetry GenAI attributes.
        let span = tracing::info_span!(
            "chat",
            otel.name = %format!("chat {model}"),
            otel.kind = "client",
            "gen_ai.operation.name" = "chat",
            "gen_ai.provider.name" = "openai",
            "gen_ai.system" = "openai",
            "gen_ai.request.model" = %model,
            "gen_ai.request.max_tokens" = tracing::field::Empty,
            "gen_ai.request.temperature" = tracing::field::Empty,
            "server.address" = %self.inner.server_address,
            "gen_ai.response.model" = tracing::field::Empty,
            "gen_ai.usage.input_tokens" = tracing::field::Empty,
            "gen_ai.usage.output_tokens" = tracing::field::Empty,
            "assay.backend" = %config.backend_name,
            "assay.retries" = tracing::field::Empty,
            "error.type" = tracing::field::Empty,
        );
        if let Some(n) = request.max_tokens {
            span.record("gen_ai.request.max_tokens", i64::from(n));
        }
        if let Some(t) = request.temperature {
            // As written (0.7, not the f32's 0.699999988...).
            span.record("gen_ai.request.temperature", t.to_string().parse::<f64>().unwrap_or(f64::from(t)));
        }
        let request_model = model.clone();
        let result = tracing::Instrument::instrument(self.chat_traced(request, model), span.clone()).await;
        match &result {
            Ok(r) => {
                span.record("gen_ai.response.model", r.model.as_str());
                // Integers as OTLP ints (tracing-opentelemetry exports u64 values as strings).
                let int = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
                span.record("gen_ai.usage.input_tokens", int(r.usage.prompt_tokens));
                span.record("gen_ai.usage.output_tokens", int(r.usage.completion_tokens));
                span.record("assay.retries", i64::from(r.usage.retries));
            }
            Err(e) => {
                span.record("error.type", e.to_string().split(':').next().unwrap_or("error"));
                if let Some(context) = crate::context::context_refusal(e).and_then(|r| r.context_tokens) {
                    self.inner.refused_at.lock().unwrap_or_else(|p| p.into_inner()).insert(request_model, context);
                }
            }
        }
        result
    }
}

impl OpenAiClient {
    async fn chat_traced(&self, request: ChatRequest, model: String) -> Result<ChatResponse, LlmError> {
        let config = &self.inner.config;
        self.inner.probed.get_or_init(|| self.inner.transport.probe_props(config)).await;
        let forms = self.inner.schema.of(&model);
        let fixed = config.structured_output.fixed();
        let structured = matches!(request.response_format, ResponseFormat::JsonSchema { .. });
        // A refused form is negotiated once per model: the first call refused takes the gate and
        // walks down the ladder; calls refused meanwhile wait for it, then resend in the form it
        // found. Backends that take the native form never wait.
        let mut gate: Option<tokio::sync::MutexGuard<'_, ()>> = None;
        let mut delivery = match fixed {
            Some(form) if structured => form,
            _ => forms.first_form(&request.response_format, config.supports_json_schema),
        };
        debug!(backend = %config.backend_name, model = %model, messages = request.messages.len(), "chat call");
        let started = Instant::now();
        let url = &self.inner.chat_url;
        let mut fallbacks = 0u32;
        let mut earlier_retries = 0u32;
        let api = config.api();
        // A server that answered `/props` is llama.cpp's.
        let llama_cpp = self.reported_slots().is_some();
        let mut grammar = api == Api::OpenAi && forms.sends_grammar() && request::choice_grammar(&request).is_some();
        let parse = match api {
            Api::OpenAi => reply::parse_chat,
            Api::Ollama => reply::parse_ollama_chat,
        };
        let mut response = loop {
            let body = request::chat_body(config, &request, &model, delivery, (grammar, llama_cpp));
            match self.inner.transport.call(config, url, &body, request.deadline, parse).await {
                Ok((completion, retries)) => {
                    let retries = earlier_retries + retries;
                    break reply::chat_response(&request, &model, completion, retries, config.supports_logprobs);
                }
                Err(CallError { status: Some(status), retries, error })
                    if grammar && is_grammar_rejection(status, &error) =>
                {
                    // The choice goes again without its grammar, and so do later ones.
                    if forms.refuse_grammar() {
                        info!(backend = %config.backend_name, model = %model, error = %error,
                              "the backend takes no grammar: choices go with the options in the prompt only");
                    }
                    grammar = false;
                    fallbacks += 1;
                    earlier_retries += retries;
                }
                Err(CallError { status: Some(status), retries, error })
                    if fixed.is_none() && is_schema_rejection(status, &error) =>
                {
                    if gate.is_none() && structured {
                        let lock = forms.gate.lock();
                        gate = Some(match request.deadline {
                            Some(d) => {
                                tokio::time::timeout_at(d.into(), lock).await.map_err(|_| LlmError::DeadlineExceeded)?
                            }
                            None => lock.await,
                        });
                        let known = forms.first_form(&request.response_format, config.supports_json_schema);
                        if known.weaker_than(delivery) {
                            // Another call negotiated meanwhile: its form, no descent of our own.
                            gate = None;
                            delivery = known;
                            fallbacks += 1;
                            earlier_retries += retries;
                            continue;
                        }
                    }
                    let Some(weaker) =
                        delivery.weaker(&error.to_string(), api).filter(|_| delivery != SchemaDelivery::None)
                    else {
                        debug!(backend = %config.backend_name, model = %model, error = %error, "chat call failed");
                        return Err(error);
                    };
                    warn!(backend = %config.backend_name, model = %model, error = %error, from = ?delivery, to = ?weaker,
                          "backend rejected the structured-output form, retrying with a weaker one");
                    delivery = weaker;
                    fallbacks += 1;
                    earlier_retries += retries;
                }
                Err(e) => {
                    debug!(backend = %config.backend_name, model = %model, error = %e.error, retries = e.retries, "chat call failed");
                    return Err(e.error);
                }
            }
        };
        if fallbacks > 0 {
            // Remembered only once a weaker form worked: a 400 that every form gets was not about
            // the schema.
            if structured {
                forms.remember(delivery);
            }
            response.usage.calls += fallbacks;
            response.usage.schema_fallbacks = fallbacks;
        }
        if gate.is_some() && fallbacks > 0 && forms.settle() {
            info!(backend = %config.backend_name, model = %model, form = delivery.name(), fallbacks,
                  "structured output negotiated: later calls to this model use this form");
        }
        drop(gate);
        if let ResponseFormat::JsonSchema { schema, .. } = &request.response_format {
            self.check_schema(&forms, &model, schema, delivery, fixed.is_some(), &mut response);
        }
        response.schema_fallback = delivery.fell_back();
        debug!(
            backend = %config.backend_name,
            model = %response.model,
            elapsed_ms = started.elapsed().as_millis() as u64,
            prompt_tokens = response.usage.prompt_tokens,
            completion_tokens = response.usage.completion_tokens,
            retries = response.usage.retries,
            "chat call done"
        );
        Ok(response)
    }
}

impl OpenAiClient {
    /// Check a structured reply against its schema: one that breaks it is counted in its usage
    /// and the metric; one without even the schema's shape, under a form that claims enforcement
    /// (and unless the form is fixed by configuration), is evidence the form is accepted and
    /// ignored, and the [`VIOLATIONS_TO_DEMOTE`]th moves the model one form down. A reply that
    /// only breaks a bound, or is cut at the token limit, filtered, or empty (a refusal), is
    /// counted but is no evidence.
    fn check_schema(
        &self,
        forms: &ModelForms,
        model: &str,
        schema: &serde_json::Value,
        delivery: SchemaDelivery,
        fixed: bool,
        response: &mut ChatResponse,
    ) {
        let backend = &self.inner.config.backend_name;
        let conformance = self.inner.validators.check(schema, response.json.as_ref());
        if matches!(conformance, None | Some(Conformance::Matches)) {
            return;
        }
        response.usage.schema_violations += 1;
        crate::metrics::schema_violated(backend, model, delivery.name());
        let cut = matches!(response.finish_reason, FinishReason::Length | FinishReason::ContentFilter)
            || response.text.trim().is_empty();
        if cut || fixed || conformance == Some(Conformance::BreaksBounds) {
            debug!(backend = %backend, model = %model, form = delivery.name(), cut, ?conformance, "reply does not match its schema");
            return;
        }
        if let Some(weaker) = forms.violated(delivery, self.inner.config.api()) {
            warn!(backend = %backend, model = %model, from = delivery.name(), to = weaker.name(),
                  violations = VIOLATIONS_TO_DEMOTE,
                  "the backend accepts this structured-output form without enforcing it (replies broke their schema): later calls to this model use a weaker form");
            crate::metrics::schema_demoted(backend, model, delivery.name(), weaker.name());
        }
    }
}

#[async_trait::async_trait]
impl EmbeddingModel for OpenAiClient {
    fn backend(&self) -> &str {
        &self.inner.config.backend_name
    }

    // The embedding trait's default model is the configured embedding model.
    #[allow(clippy::misnamed_getters)]
    fn default_model(&self) -> &str {
        &self.inner.config.embedding_model
    }

    async fn embed(&self, request: EmbeddingRequest) -> Result<EmbeddingResponse, LlmError> {
        let config = &self.inner.config;
        let model = self.resolve_model(request.model.as_deref(), &config.embedding_model);
        if request.texts.is_empty() {
            return Ok(EmbeddingResponse { vectors: Vec::new(), model, usage: Usage::default() });
        }
        let body = json!({"model": model, "input": request.texts});
        let expected = request.texts.len();
        let api = config.api();
        let (list, retries) = self
            .inner
            .transport
            .call(config, &self.inner.embeddings_url, &body, request.deadline, |bytes| match api {
                Api::OpenAi => reply::parse_embeddings(bytes, expected),
                Api::Ollama => reply::parse_ollama_embeddings(bytes, expected),
            })
            .await
            .map_err(|e| e.error)?;
        Ok(reply::embedding_response(list, model, retries))
    }
}
