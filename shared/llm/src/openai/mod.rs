//! Client for OpenAI-compatible servers (`{base_url}/chat/completions`, `{base_url}/embeddings`).
//!
//! Behaviour, per client instance (clones share it):
//! - **Retries** only on HTTP 408, 429, 5xx (except the statuses in
//!   [`OpenAiConfig::deterministic_statuses`], by default 501 and 505), connect/timeout/transport
//!   errors, and once on a 200 whose body cannot be parsed (a malformed or truncated 200 is typical
//!   of a proxy cutting the connection, so one more try is cheap and usually succeeds; a second
//!   malformed body is returned as [`LlmError::MalformedReply`]). Waits use full-jitter exponential
//!   backoff, with `Retry-After` (seconds) as a minimum, and never run past the request deadline:
//!   when the next wait would cross it the last error is returned, or
//!   [`LlmError::DeadlineExceeded`] when the deadline itself has passed. Every other status is
//!   returned at once: 400/404/422 and other 4xx as `InvalidRequest`, 401/403 as `Unauthorized`,
//!   the deterministic 5xx as `Unsupported`.
//! - **JSON schema**: sent as `response_format: json_schema` (strict). If the backend answers 400
//!   (or any error status whose body names `response_format` or `json_schema`, never retried:
//!   llama-cpp-python answers 500), the request is re-sent as `json_object` with the schema (which
//!   llama-cpp-python enforces with a grammar) and the schema in the prompt, then with the schema in
//!   the prompt only. The first form that works is remembered for later calls.
//! - **Concurrency**: at most `max_concurrency` HTTP requests in flight (slots are held per
//!   attempt, not across backoff sleeps).
//! - **Circuit breaker**: `breaker_failures` consecutive transient failures (after retries) open
//!   it for `breaker_cooldown`; then one probe call decides.
//! - **Cancellation**: nothing is spawned; dropping the returned future drops the HTTP request,
//!   which closes its connection.

mod wire;

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use crate::breaker::{BreakerState, CircuitBreaker, Outcome};
use crate::json::extract_json;
use crate::retry::{Backoff, StatusClass, WaitPlan, classify_status, parse_retry_after, plan_wait};
use crate::types::{
    ChatModel, ChatRequest, ChatResponse, EmbeddingModel, EmbeddingRequest, EmbeddingResponse, LlmError, Message,
    ResponseFormat, Role, Usage,
};

/// Name of the request field that carries the token limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MaxTokensField {
    /// `max_tokens` (most servers: llama.cpp, vLLM, older OpenAI models).
    #[default]
    MaxTokens,
    /// `max_completion_tokens` (newer OpenAI models).
    MaxCompletionTokens,
}

impl MaxTokensField {
    pub fn as_str(self) -> &'static str {
        match self {
            MaxTokensField::MaxTokens => "max_tokens",
            MaxTokensField::MaxCompletionTokens => "max_completion_tokens",
        }
    }
}

/// Configuration of one OpenAI-compatible backend.
#[derive(Clone)]
pub struct OpenAiConfig {
    /// Backend name used in [`ChatModel::backend`], logs and cache keys (default `openai`).
    pub backend_name: String,
    /// e.g. `https://api.openai.com/v1` or `http://127.0.0.1:8080/v1` (no trailing path).
    pub base_url: String,
    /// Sent as `Authorization: Bearer ...` when set. Never logged.
    pub api_key: Option<String>,
    pub default_model: String,
    pub embedding_model: String,
    pub max_tokens_field: MaxTokensField,
    pub max_concurrency: usize,
    /// Retries after the first attempt.
    pub max_retries: u32,
    pub base_backoff: Duration,
    pub max_backoff: Duration,
    /// Per-attempt HTTP timeout (also capped by the request deadline).
    pub request_timeout: Duration,
    pub connect_timeout: Duration,
    pub breaker_failures: u32,
    pub breaker_cooldown: Duration,
    /// Send `response_format: json_schema`; when false the schema always goes in the prompt.
    pub supports_json_schema: bool,
    pub supports_logprobs: bool,
    /// 5xx statuses that are deterministic and never retried (default 501, 505).
    pub deterministic_statuses: Vec<u16>,
}

impl Default for OpenAiConfig {
    fn default() -> Self {
        Self {
            backend_name: "openai".into(),
            base_url: "https://api.openai.com/v1".into(),
            api_key: None,
            default_model: "gpt-4o-mini".into(),
            embedding_model: "text-embedding-3-small".into(),
            max_tokens_field: MaxTokensField::MaxTokens,
            max_concurrency: 16,
            max_retries: 4,
            base_backoff: Duration::from_millis(200),
            max_backoff: Duration::from_secs(8),
            request_timeout: Duration::from_secs(120),
            connect_timeout: Duration::from_secs(10),
            breaker_failures: 5,
            breaker_cooldown: Duration::from_secs(30),
            supports_json_schema: true,
            supports_logprobs: true,
            deterministic_statuses: vec![501, 505],
        }
    }
}

impl fmt::Debug for OpenAiConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiConfig")
            .field("backend_name", &self.backend_name)
            .field("base_url", &self.base_url)
            .field("api_key", &self.api_key.as_ref().map(|_| "<redacted>"))
            .field("default_model", &self.default_model)
            .field("embedding_model", &self.embedding_model)
            .field("max_tokens_field", &self.max_tokens_field)
            .field("max_concurrency", &self.max_concurrency)
            .field("max_retries", &self.max_retries)
            .field("base_backoff", &self.base_backoff)
            .field("max_backoff", &self.max_backoff)
            .field("request_timeout", &self.request_timeout)
            .field("connect_timeout", &self.connect_timeout)
            .field("breaker_failures", &self.breaker_failures)
            .field("breaker_cooldown", &self.breaker_cooldown)
            .field("supports_json_schema", &self.supports_json_schema)
            .field("supports_logprobs", &self.supports_logprobs)
            .field("deterministic_statuses", &self.deterministic_statuses)
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

    fn backoff(&self) -> Backoff {
        Backoff { base: self.base_backoff, max: self.max_backoff }
    }
}

/// An OpenAI-compatible chat and embedding client. Cheap to clone; clones share the connection
/// pool, concurrency limit, circuit breaker and schema-support memory.
#[derive(Clone)]
pub struct OpenAiClient {
    inner: Arc<Inner>,
}

struct Inner {
    config: OpenAiConfig,
    http: reqwest::Client,
    chat_url: String,
    embeddings_url: String,
    slots: Semaphore,
    breaker: Arc<CircuitBreaker>,
    /// The first schema delivery this backend accepted after a rejection: 0 native json_schema,
    /// 1 json_object with the schema, 2 the schema in the prompt.
    schema_level: AtomicU8,
}

impl fmt::Debug for OpenAiClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("OpenAiClient")
            .field("config", &self.inner.config)
            .field("breaker", &self.inner.breaker.state())
            .finish_non_exhaustive()
    }
}

/// How the JSON schema of a request is delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SchemaDelivery {
    None,
    /// `response_format: {"type": "json_schema", ...}` (OpenAI, vLLM, llama.cpp server, Ollama).
    ResponseFormat,
    /// `response_format: {"type": "json_object", "schema": ...}` plus the schema in the prompt:
    /// servers that enforce the schema this way (llama-cpp-python) or JSON mode at least.
    JsonObject,
    /// The schema written into the last user message only.
    Prompt,
}

impl SchemaDelivery {
    const LEVELS: [SchemaDelivery; 3] = [Self::ResponseFormat, Self::JsonObject, Self::Prompt];

    fn level(self) -> u8 {
        match self {
            Self::ResponseFormat | Self::None => 0,
            Self::JsonObject => 1,
            Self::Prompt => 2,
        }
    }

    /// The next, weaker form after a rejection (None after the prompt form).
    fn weaker(self) -> Option<Self> {
        match self {
            Self::ResponseFormat => Some(Self::JsonObject),
            Self::JsonObject => Some(Self::Prompt),
            Self::Prompt | Self::None => None,
        }
    }
}

/// One failed attempt.
#[derive(Debug)]
struct AttemptError {
    error: LlmError,
    status: Option<u16>,
    retry_after: Option<Duration>,
    kind: AttemptKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AttemptKind {
    Transient,
    /// A 200 whose body could not be used: retried once.
    Malformed,
    Permanent,
}

/// A failed call (after retries).
#[derive(Debug)]
struct CallError {
    error: LlmError,
    status: Option<u16>,
    retries: u32,
}

const BODY_SNIPPET: usize = 300;

/// Whether an error body is about the structured-output request (`response_format` / `json_schema`).
fn complains_about_schema(body: &[u8]) -> bool {
    let text = String::from_utf8_lossy(body).to_ascii_lowercase();
    text.contains("response_format") || text.contains("json_schema")
}

fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let one_line: String = text.split_whitespace().collect::<Vec<_>>().join(" ");
    match one_line.char_indices().nth(BODY_SNIPPET) {
        Some((cut, _)) => format!("{}...", &one_line[..cut]),
        None => one_line,
    }
}

fn error_chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

fn deadline_passed(deadline: Option<Instant>) -> bool {
    deadline.is_some_and(|d| Instant::now() >= d)
}

fn status_error(status: u16, body: &[u8]) -> LlmError {
    let detail = format!("http {status}: {}", snippet(body));
    match status {
        401 | 403 => LlmError::Unauthorized(detail),
        429 => LlmError::RateLimited(detail),
        500..=599 => LlmError::Unavailable(detail),
        _ => LlmError::InvalidRequest(detail),
    }
}

fn breaker_outcome(error: &LlmError) -> Outcome {
    match error {
        LlmError::InvalidRequest(_) | LlmError::Unauthorized(_) | LlmError::Unsupported(_) => Outcome::Healthy,
        LlmError::RateLimited(_) | LlmError::Unavailable(_) | LlmError::MalformedReply(_) => Outcome::Failed,
        LlmError::DeadlineExceeded => Outcome::Neutral,
    }
}

fn append_to_last_user(messages: &mut Vec<Message>, instruction: &str) {
    match messages.iter_mut().rev().find(|m| m.role == Role::User) {
        Some(message) => {
            message.content.push_str("\n\n");
            message.content.push_str(instruction);
        }
        None => messages.push(Message::user(instruction)),
    }
}

/// The instruction appended to the prompt when a schema cannot go in `response_format`.
pub fn schema_instruction(schema: &Value) -> String {
    format!("Reply with only a JSON value matching this JSON schema: {schema}")
}

/// The instruction appended to the prompt for [`ResponseFormat::Choice`].
pub fn choice_instruction(options: &[String]) -> String {
    format!("Answer with exactly one of: {}", options.join(", "))
}

/// Map a reply onto one of `options` (trimmed, case-insensitive, surrounding quotes and
/// punctuation ignored); `None` when it matches none.
pub fn normalise_choice(text: &str, options: &[String]) -> Option<String> {
    let cleaned = text.trim().trim_matches(|c: char| c.is_whitespace() || c.is_ascii_punctuation());
    options.iter().find(|option| option.trim().eq_ignore_ascii_case(cleaned)).cloned()
}

impl OpenAiClient {
    /// Build a client. Fails only if the HTTP stack cannot be initialised.
    pub fn new(config: OpenAiConfig) -> Result<Self, LlmError> {
        let http = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .build()
            .map_err(|e| LlmError::Unsupported(format!("http client: {}", error_chain(&e))))?;
        let base = config.base_url.trim_end_matches('/').to_owned();
        Ok(Self {
            inner: Arc::new(Inner {
                chat_url: format!("{base}/chat/completions"),
                embeddings_url: format!("{base}/embeddings"),
                slots: Semaphore::new(config.max_concurrency.max(1)),
                breaker: Arc::new(CircuitBreaker::new(config.breaker_failures, config.breaker_cooldown)),
                schema_level: AtomicU8::new(0),
                http,
                config,
            }),
        })
    }

    pub fn config(&self) -> &OpenAiConfig {
        &self.inner.config
    }

    /// Current circuit-breaker state.
    pub fn breaker_state(&self) -> BreakerState {
        self.inner.breaker.state()
    }

    /// Whether this backend has rejected the native JSON schema form (later calls use the weaker
    /// form that worked).
    pub fn schema_rejected(&self) -> bool {
        self.inner.schema_level.load(Ordering::Relaxed) > 0
    }

    /// The schema form later calls use: `json_schema`, `json_object` or `prompt`.
    pub fn schema_delivery(&self) -> &'static str {
        match self.inner.schema_level.load(Ordering::Relaxed) {
            0 => "json_schema",
            1 => "json_object",
            _ => "prompt",
        }
    }

    fn resolve_model(&self, requested: Option<&str>, fallback: &str) -> String {
        requested.filter(|m| !m.is_empty()).unwrap_or(fallback).to_owned()
    }

    fn chat_body(&self, request: &ChatRequest, model: &str, delivery: SchemaDelivery) -> Value {
        let config = &self.inner.config;
        let mut messages = request.messages.clone();
        let mut body = serde_json::Map::new();
        match (&request.response_format, delivery) {
            (ResponseFormat::JsonSchema { name, schema }, SchemaDelivery::ResponseFormat) => {
                body.insert(
                    "response_format".into(),
                    json!({"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": true}}),
                );
            }
            (ResponseFormat::JsonSchema { schema, .. }, SchemaDelivery::JsonObject) => {
                body.insert("response_format".into(), json!({"type": "json_object", "schema": schema}));
                append_to_last_user(&mut messages, &schema_instruction(schema));
            }
            (ResponseFormat::JsonSchema { schema, .. }, SchemaDelivery::Prompt | SchemaDelivery::None) => {
                append_to_last_user(&mut messages, &schema_instruction(schema));
            }
            (ResponseFormat::Choice(options), _) => append_to_last_user(&mut messages, &choice_instruction(options)),
            (ResponseFormat::Text, _) => {}
        }
        body.insert("model".into(), json!(model));
        body.insert("messages".into(), json!(messages));
        if let Some(t) = request.temperature {
            body.insert("temperature".into(), json!(t));
        }
        if let Some(p) = request.top_p {
            body.insert("top_p".into(), json!(p));
        }
        if let Some(seed) = request.seed {
            body.insert("seed".into(), json!(seed));
        }
        if let Some(max) = request.max_tokens {
            body.insert(config.max_tokens_field.as_str().into(), json!(max));
        }
        if !request.stop.is_empty() {
            body.insert("stop".into(), json!(request.stop));
        }
        if let Some(k) = request.top_logprobs
            && config.supports_logprobs
        {
            body.insert("logprobs".into(), json!(true));
            body.insert("top_logprobs".into(), json!(k.clamp(1, 20)));
        }
        Value::Object(body)
    }

    /// One call through the breaker, with retries.
    async fn call<T>(
        &self,
        url: &str,
        body: &Value,
        deadline: Option<Instant>,
        parse: impl Fn(&[u8]) -> Result<T, String>,
    ) -> Result<(T, u32), CallError> {
        let Some(permit) = self.inner.breaker.try_acquire() else {
            debug!(backend = %self.inner.config.backend_name, "circuit open, failing fast");
            return Err(CallError { error: LlmError::Unavailable("circuit open".into()), status: None, retries: 0 });
        };
        let result = self.call_with_retries(url, body, deadline, &parse).await;
        let outcome = match &result {
            Ok(_) => Outcome::Healthy,
            Err(e) => breaker_outcome(&e.error),
        };
        if let Some(state) = permit.record(outcome) {
            warn!(backend = %self.inner.config.backend_name, state = ?state, "circuit breaker changed state");
        }
        result
    }

    async fn call_with_retries<T>(
        &self,
        url: &str,
        body: &Value,
        deadline: Option<Instant>,
        parse: &impl Fn(&[u8]) -> Result<T, String>,
    ) -> Result<(T, u32), CallError> {
        let config = &self.inner.config;
        let backoff = config.backoff();
        let mut retries = 0u32;
        let mut malformed_retried = false;
        loop {
            if deadline_passed(deadline) {
                return Err(CallError { error: LlmError::DeadlineExceeded, status: None, retries });
            }
            let failure = match self.attempt(url, body, deadline, parse).await {
                Ok(value) => return Ok((value, retries)),
                Err(failure) => failure,
            };
            let retryable = match failure.kind {
                AttemptKind::Transient => true,
                AttemptKind::Malformed => !malformed_retried,
                AttemptKind::Permanent => false,
            };
            if !retryable || retries >= config.max_retries {
                if retryable {
                    warn!(backend = %config.backend_name, retries, error = %failure.error, "retries exhausted");
                }
                return Err(CallError { error: failure.error, status: failure.status, retries });
            }
            let jitter = backoff.jittered(retries, &mut rand::rng());
            match plan_wait(jitter, failure.retry_after, Instant::now(), deadline) {
                WaitPlan::Sleep(wait) => {
                    warn!(
                        backend = %config.backend_name,
                        status = failure.status,
                        attempt = retries + 1,
                        wait_ms = wait.as_millis() as u64,
                        error = %failure.error,
                        "retrying model call"
                    );
                    if failure.kind == AttemptKind::Malformed {
                        malformed_retried = true;
                    }
                    tokio::time::sleep(wait).await;
                    retries += 1;
                }
                WaitPlan::GiveUp => {
                    debug!(backend = %config.backend_name, "next retry would cross the deadline");
                    return Err(CallError { error: failure.error, status: failure.status, retries });
                }
                WaitPlan::DeadlinePassed => {
                    return Err(CallError { error: LlmError::DeadlineExceeded, status: failure.status, retries });
                }
            }
        }
    }

    async fn attempt<T>(
        &self,
        url: &str,
        body: &Value,
        deadline: Option<Instant>,
        parse: &impl Fn(&[u8]) -> Result<T, String>,
    ) -> Result<T, AttemptError> {
        let config = &self.inner.config;
        let deadline_error = || AttemptError {
            error: LlmError::DeadlineExceeded,
            status: None,
            retry_after: None,
            kind: AttemptKind::Permanent,
        };
        let acquire = self.inner.slots.acquire();
        let slot = match deadline {
            Some(d) => tokio::time::timeout_at(d.into(), acquire).await.map_err(|_| deadline_error())?,
            None => acquire.await,
        };
        let _slot = slot.map_err(|_| AttemptError {
            error: LlmError::Unavailable("client closed".into()),
            status: None,
            retry_after: None,
            kind: AttemptKind::Permanent,
        })?;
        let timeout = match deadline {
            Some(d) => d.saturating_duration_since(Instant::now()).min(config.request_timeout),
            None => config.request_timeout,
        };
        if timeout.is_zero() {
            return Err(deadline_error());
        }
        let mut builder = self.inner.http.post(url).json(body).timeout(timeout);
        if let Some(key) = &config.api_key {
            builder = builder.bearer_auth(key);
        }
        // When the deadline, not `request_timeout`, set this attempt's timeout, a timeout means the
        // deadline is (about) reached.
        let capped_by_deadline = deadline.is_some() && timeout < config.request_timeout;
        let transport = |e: reqwest::Error| {
            if deadline_passed(deadline) || (e.is_timeout() && capped_by_deadline) {
                return deadline_error();
            }
            let e = e.without_url();
            let (error, kind) = if e.is_builder() {
                (LlmError::InvalidRequest(format!("building request: {}", error_chain(&e))), AttemptKind::Permanent)
            } else if e.is_timeout() {
                (LlmError::Unavailable(format!("timed out after {} ms", timeout.as_millis())), AttemptKind::Transient)
            } else if e.is_connect() {
                (LlmError::Unavailable(format!("connect error: {}", error_chain(&e))), AttemptKind::Transient)
            } else {
                (LlmError::Unavailable(format!("transport error: {}", error_chain(&e))), AttemptKind::Transient)
            };
            AttemptError { error, status: None, retry_after: None, kind }
        };
        let response = builder.send().await.map_err(&transport)?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        let bytes = response.bytes().await.map_err(&transport)?;
        debug!(backend = %config.backend_name, status, bytes = bytes.len(), "model call answered");
        match classify_status(status, &config.deterministic_statuses) {
            StatusClass::Success => parse(&bytes).map_err(|why| AttemptError {
                error: LlmError::MalformedReply(format!("{why} (body: {})", snippet(&bytes))),
                status: Some(status),
                retry_after: None,
                kind: AttemptKind::Malformed,
            }),
            // Some servers (llama-cpp-python) answer an unsupported response_format with a 500
            // that names it: not transient, and the caller falls back to the prompt form.
            StatusClass::Transient if body.get("response_format").is_some() && complains_about_schema(&bytes) => {
                Err(AttemptError {
                    error: status_error(status, &bytes),
                    status: Some(status),
                    retry_after: None,
                    kind: AttemptKind::Permanent,
                })
            }
            StatusClass::Transient => Err(AttemptError {
                error: status_error(status, &bytes),
                status: Some(status),
                retry_after,
                kind: AttemptKind::Transient,
            }),
            StatusClass::Permanent => {
                let error = if config.deterministic_statuses.contains(&status) {
                    LlmError::Unsupported(format!("http {status}: {}", snippet(&bytes)))
                } else {
                    status_error(status, &bytes)
                };
                Err(AttemptError { error, status: Some(status), retry_after: None, kind: AttemptKind::Permanent })
            }
        }
    }

    fn parse_chat(bytes: &[u8]) -> Result<wire::ChatCompletion, String> {
        let completion: wire::ChatCompletion =
            serde_json::from_slice(bytes).map_err(|e| format!("chat completion is not valid json: {e}"))?;
        if completion.choices.as_ref().is_none_or(Vec::is_empty) {
            return Err("chat completion has no choices".into());
        }
        Ok(completion)
    }

    fn parse_embeddings(bytes: &[u8], expected: usize) -> Result<wire::EmbeddingList, String> {
        let mut list: wire::EmbeddingList =
            serde_json::from_slice(bytes).map_err(|e| format!("embedding list is not valid json: {e}"))?;
        let data = list.data.get_or_insert_with(Vec::new);
        if data.len() != expected {
            return Err(format!("expected {expected} embeddings, got {}", data.len()));
        }
        Ok(list)
    }

    fn build_response(
        &self,
        request: &ChatRequest,
        model: &str,
        completion: wire::ChatCompletion,
        retries: u32,
    ) -> ChatResponse {
        let wire_usage = completion.usage.unwrap_or_default();
        let choice = completion.choices.and_then(|c| c.into_iter().next()).unwrap_or_default();
        let raw_text = choice.message.and_then(|m| m.content).or(choice.text).unwrap_or_default();
        let text = match &request.response_format {
            ResponseFormat::Choice(options) => normalise_choice(&raw_text, options).unwrap_or(raw_text),
            ResponseFormat::Text | ResponseFormat::JsonSchema { .. } => raw_text,
        };
        let json = match &request.response_format {
            ResponseFormat::JsonSchema { .. } => extract_json(&text),
            ResponseFormat::Text | ResponseFormat::Choice(_) => None,
        };
        let first_token_logprobs = if request.top_logprobs.is_some() && self.inner.config.supports_logprobs {
            wire::first_token_logprobs(choice.logprobs.as_ref())
        } else {
            None
        };
        ChatResponse {
            text,
            json,
            first_token_logprobs,
            finish_reason: wire::finish_reason(choice.finish_reason.as_deref()),
            model: completion.model.filter(|m| !m.is_empty()).unwrap_or_else(|| model.to_owned()),
            usage: Usage {
                calls: 1,
                prompt_tokens: wire_usage.prompt_tokens.unwrap_or(0),
                completion_tokens: wire_usage.completion_tokens.unwrap_or(0),
                cache_hits: 0,
                retries,
                schema_fallbacks: 0,
            },
            schema_fallback: false,
            cached: false,
        }
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

    async fn chat(&self, request: ChatRequest) -> Result<ChatResponse, LlmError> {
        let config = &self.inner.config;
        let model = self.resolve_model(request.model.as_deref(), &config.default_model);
        let delivery = match request.response_format {
            ResponseFormat::JsonSchema { .. } if config.supports_json_schema => {
                let level = self.inner.schema_level.load(Ordering::Relaxed) as usize;
                SchemaDelivery::LEVELS[level.min(SchemaDelivery::LEVELS.len() - 1)]
            }
            ResponseFormat::JsonSchema { .. } => SchemaDelivery::Prompt,
            ResponseFormat::Text | ResponseFormat::Choice(_) => SchemaDelivery::None,
        };
        debug!(backend = %config.backend_name, model = %model, messages = request.messages.len(), "chat call");
        let started = Instant::now();
        let url = &self.inner.chat_url;
        let mut delivery = delivery;
        let mut fallbacks = 0u32;
        let mut earlier_retries = 0u32;
        let mut response = loop {
            let body = self.chat_body(&request, &model, delivery);
            match self.call(url, &body, request.deadline, Self::parse_chat).await {
                Ok((completion, retries)) => {
                    break self.build_response(&request, &model, completion, earlier_retries + retries);
                }
                Err(CallError { status: Some(status), retries, error })
                    if status == 400 || (status >= 400 && complains_about_schema(error.to_string().as_bytes())) =>
                {
                    let Some(weaker) = delivery.weaker().filter(|_| delivery != SchemaDelivery::None) else {
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
            self.inner.schema_level.fetch_max(delivery.level(), Ordering::Relaxed);
            response.usage.calls += fallbacks;
            response.usage.schema_fallbacks = fallbacks;
        }
        let fell_back = matches!(delivery, SchemaDelivery::JsonObject | SchemaDelivery::Prompt);
        response.schema_fallback = fell_back;
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
        let (list, retries) = self
            .call(&self.inner.embeddings_url, &body, request.deadline, |bytes| Self::parse_embeddings(bytes, expected))
            .await
            .map_err(|e| e.error)?;
        let mut data: Vec<(usize, Vec<f32>)> = list
            .data
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(position, item)| (item.index.unwrap_or(position), item.embedding))
            .collect();
        data.sort_by_key(|(index, _)| *index);
        let wire_usage = list.usage.unwrap_or_default();
        Ok(EmbeddingResponse {
            vectors: data.into_iter().map(|(_, v)| v).collect(),
            model: list.model.filter(|m| !m.is_empty()).unwrap_or(model),
            usage: Usage {
                calls: 1,
                prompt_tokens: wire_usage.prompt_tokens.unwrap_or(0),
                completion_tokens: 0,
                cache_hits: 0,
                retries,
                schema_fallbacks: 0,
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(config: OpenAiConfig) -> OpenAiClient {
        OpenAiClient::new(config).unwrap()
    }

    #[test]
    fn body_has_fields_and_configured_max_tokens_name() {
        let c =
            client(OpenAiConfig { max_tokens_field: MaxTokensField::MaxCompletionTokens, ..OpenAiConfig::default() });
        let request = ChatRequest {
            messages: vec![Message::system("s"), Message::user("q")],
            temperature: Some(0.0),
            seed: Some(7),
            max_tokens: Some(12),
            stop: vec!["\n".into()],
            top_logprobs: Some(50),
            ..ChatRequest::default()
        };
        let body = c.chat_body(&request, "m", SchemaDelivery::None);
        assert_eq!(body["max_completion_tokens"], 12);
        assert!(body.get("max_tokens").is_none());
        assert_eq!(body["seed"], 7);
        assert_eq!(body["logprobs"], true);
        assert_eq!(body["top_logprobs"], 20);
        assert_eq!(body["stop"], json!(["\n"]));
        assert!(body.get("response_format").is_none());
        assert!(body.get("top_p").is_none());
    }

    #[test]
    fn schema_delivery_forms() {
        let c = client(OpenAiConfig::default());
        let schema = json!({"type": "object"});
        let request = ChatRequest {
            messages: vec![Message::user("q"), Message::assistant("a")],
            response_format: ResponseFormat::JsonSchema { name: "s".into(), schema: schema.clone() },
            ..ChatRequest::default()
        };
        let native = c.chat_body(&request, "m", SchemaDelivery::ResponseFormat);
        assert_eq!(native["response_format"]["json_schema"]["strict"], true);
        assert_eq!(native["messages"][0]["content"], "q");
        let prompt = c.chat_body(&request, "m", SchemaDelivery::Prompt);
        assert!(prompt.get("response_format").is_none());
        let content = prompt["messages"][0]["content"].as_str().unwrap();
        assert!(content.starts_with("q\n\n") && content.contains(&schema.to_string()));
    }

    #[test]
    fn choice_normalisation() {
        let options = vec!["YES".to_owned(), "NO".to_owned()];
        assert_eq!(normalise_choice(" yes.\n", &options), Some("YES".into()));
        assert_eq!(normalise_choice("\"No\"", &options), Some("NO".into()));
        assert_eq!(normalise_choice("maybe", &options), None);
    }

    #[test]
    fn debug_redacts_api_key() {
        let config = OpenAiConfig { api_key: Some("sk-secret".into()), ..OpenAiConfig::default() };
        assert!(!format!("{config:?}").contains("sk-secret"));
    }
}
