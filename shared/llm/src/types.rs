//! Backend-neutral request, response and error types shared by every model backend.

use std::time::{Duration, Instant};

use assay_domain::{BudgetRefusal, StageError};
use serde::{Deserialize, Serialize};

/// Role of one chat message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    User,
    Assistant,
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Message {
    pub role: Role,
    pub content: String,
}

impl Message {
    pub fn system(content: impl Into<String>) -> Self {
        Self { role: Role::System, content: content.into() }
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self { role: Role::User, content: content.into() }
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self { role: Role::Assistant, content: content.into() }
    }
}

/// What shape the reply must have.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub enum ResponseFormat {
    /// Free text.
    #[default]
    Text,
    /// A JSON value matching `schema` (a JSON Schema object). `name` is the schema's name as sent
    /// to OpenAI-compatible backends.
    JsonSchema { name: String, schema: serde_json::Value },
    /// Exactly one of these strings (e.g. `["YES", "NO"]`).
    Choice(Vec<String>),
}

/// How a request may use the response cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum CachePolicy {
    /// Cache when the request is deterministic (temperature 0 or a seed is set).
    #[default]
    Auto,
    /// Also cache sampled (temperature > 0, no seed) requests.
    OptIn,
    /// Never read or write the cache.
    Bypass,
}

/// A chat completion request.
#[derive(Debug, Clone, Default)]
pub struct ChatRequest {
    pub messages: Vec<Message>,
    /// Model name; `None` uses the backend's configured default.
    pub model: Option<String>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub seed: Option<u64>,
    pub max_tokens: Option<u32>,
    pub stop: Vec<String>,
    pub response_format: ResponseFormat,
    /// Ask for the top-k alternatives of each generated token (k = this value, 1..=20).
    pub top_logprobs: Option<u8>,
    pub cache: CachePolicy,
    /// Absolute deadline of the caller; retries and waits never go past it.
    pub deadline: Option<Instant>,
}

impl ChatRequest {
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline.map(|d| d.saturating_duration_since(Instant::now()))
    }
}

/// Why generation stopped. Unknown values from a backend are kept, never rejected.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub enum FinishReason {
    #[default]
    Stop,
    Length,
    ContentFilter,
    ToolCalls,
    Other(String),
}

/// One alternative for a generated token.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TokenLogprob {
    pub token: String,
    pub logprob: f64,
}

/// Token accounting: the domain's type (stage outcomes carry it), re-exported for backends.
pub use assay_domain::Usage;

/// A chat completion reply.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct ChatResponse {
    pub text: String,
    /// The reply parsed as JSON when a JSON schema was requested and the reply held a JSON value
    /// (whole text, else first fenced block, else first `{` to last `}`).
    pub json: Option<serde_json::Value>,
    /// Alternatives of the first generated token, when logprobs were requested and the backend
    /// returned them. `None` means the backend gave no logprobs.
    pub first_token_logprobs: Option<Vec<TokenLogprob>>,
    pub finish_reason: FinishReason,
    /// The model name the backend reports (or the requested one).
    pub model: String,
    pub usage: Usage,
    /// The JSON schema was rejected by the backend and the request was re-sent with the schema in
    /// the prompt.
    pub schema_fallback: bool,
    /// Served from the response cache.
    pub cached: bool,
}

/// Embeddings for a batch of texts, in input order.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct EmbeddingResponse {
    pub vectors: Vec<Vec<f32>>,
    pub model: String,
    pub usage: Usage,
}

/// An embedding request.
#[derive(Debug, Clone, Default)]
pub struct EmbeddingRequest {
    pub texts: Vec<String>,
    pub model: Option<String>,
    pub cache: CachePolicy,
    pub deadline: Option<Instant>,
}

impl EmbeddingRequest {
    pub fn remaining(&self) -> Option<Duration> {
        self.deadline.map(|d| d.saturating_duration_since(Instant::now()))
    }
}

/// Errors from model backends. Closed set: callers match exhaustively.
#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum LlmError {
    /// The request is wrong and would fail again (HTTP 400/404/422...).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// Authentication or permission failure (HTTP 401/403).
    #[error("backend refused credentials: {0}")]
    Unauthorized(String),
    /// Rate limited and retries exhausted (HTTP 429).
    #[error("rate limited: {0}")]
    RateLimited(String),
    /// Backend unreachable or failing (5xx, connect errors, timeouts) after retries.
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    /// The backend's circuit breaker is open: the call failed at once, without reaching it.
    #[error("backend unavailable: circuit open")]
    CircuitOpen,
    /// The caller's deadline passed.
    #[error("deadline exceeded")]
    DeadlineExceeded,
    /// The reply could not be understood.
    #[error("malformed reply: {0}")]
    MalformedReply(String),
    /// The backend cannot do what was asked (e.g. embeddings on a chat-only backend).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The budget of the work cannot pay for the call: it is never sent.
    #[error("{0}")]
    BudgetExhausted(BudgetRefusal),
}

impl LlmError {
    /// Whether a retry of the same request may succeed.
    pub fn is_transient(&self) -> bool {
        match self {
            LlmError::RateLimited(_) | LlmError::Unavailable(_) | LlmError::CircuitOpen => true,
            LlmError::InvalidRequest(_)
            | LlmError::Unauthorized(_)
            | LlmError::DeadlineExceeded
            | LlmError::MalformedReply(_)
            | LlmError::Unsupported(_)
            | LlmError::BudgetExhausted(_) => false,
        }
    }
}

/// How a stage reports a backend error: the closed [`StageError`] every adapter maps.
impl From<LlmError> for StageError {
    fn from(e: LlmError) -> Self {
        match e {
            LlmError::InvalidRequest(m) => {
                StageError::FailedPrecondition(format!("model backend rejected the request: {m}"))
            }
            LlmError::Unauthorized(m) => {
                StageError::FailedPrecondition(format!("model backend refused credentials: {m}"))
            }
            LlmError::RateLimited(m) => StageError::RateLimited(format!("model backend rate limited: {m}")),
            LlmError::Unavailable(m) => StageError::Unavailable(format!("model backend unavailable: {m}")),
            LlmError::CircuitOpen => StageError::CircuitOpen("model backend unavailable: circuit open".into()),
            LlmError::DeadlineExceeded => StageError::DeadlineExceeded("model call ran out of time".into()),
            LlmError::MalformedReply(m) => {
                StageError::Unavailable(format!("model backend sent a malformed reply: {m}"))
            }
            LlmError::Unsupported(m) => StageError::FailedPrecondition(format!("model backend cannot do this: {m}")),
            LlmError::BudgetExhausted(r) => StageError::BudgetExhausted(r),
        }
    }
}

/// Chat completion backend.
#[async_trait::async_trait]
pub trait ChatModel: Send + Sync + 'static {
    /// Short backend identifier used in reproducibility records and cache keys (e.g. `openai`, `local`).
    fn backend(&self) -> &str;
    /// The model used when a request names none.
    fn default_model(&self) -> &str;
    /// Whether replies can carry first-token logprobs.
    fn supports_logprobs(&self) -> bool;
    /// Run one completion. Dropping the future cancels the in-flight call.
    async fn chat(&self, request: ChatRequest) -> Result<ChatResponse, LlmError>;
    /// How JSON schemas are sent to `model` now (`json_schema`, `json_object`, `json_mode`,
    /// `prompt`), for reproducibility records; `None` when the backend does not say.
    fn structured_output(&self, _model: &str) -> Option<&'static str> {
        None
    }
    /// Tokens one call to `model` may hold, prompt and reply together, as the backend says
    /// (llama.cpp's `/props`, asked once, a refusal naming the context, the embedded model's
    /// window); `None` when it does not.
    async fn context_tokens(&self, _model: &str) -> Option<u32> {
        None
    }
}

/// Embedding backend.
#[async_trait::async_trait]
pub trait EmbeddingModel: Send + Sync + 'static {
    fn backend(&self) -> &str;
    fn default_model(&self) -> &str;
    /// Embed a batch; vectors come back in input order.
    async fn embed(&self, request: EmbeddingRequest) -> Result<EmbeddingResponse, LlmError>;
}
