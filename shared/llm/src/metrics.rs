//! Model-call metrics over the global OpenTelemetry meter ([`assay_telemetry::meter`]), per
//! backend and phase:
//!
//! - `gen_ai.client.operation.duration` (s) and `gen_ai.client.token.usage` ({token}, by
//!   `gen_ai.token.type`): the OpenTelemetry GenAI client metrics, for calls that reached a
//!   backend;
//! - `assay.llm.calls` ({call}, by `assay.outcome`: `ok`, `cache_hit`, `error`), and
//!   `assay.llm.cache.hits`;
//! - `assay.llm.retries` ({retry}): retried attempts, counted where they happen;
//! - `assay.llm.schema.violations` ({reply}, by `assay.schema.form`): structured replies that did
//!   not match their JSON schema, and `assay.llm.schema.demotions` ({change}, by the form left and
//!   `assay.schema.to`): a model moved down the structured-output ladder because a form it accepted
//!   was not enforced;
//! - `assay.llm.breaker.state` (0 closed, 1 half-open, 2 open), `assay.llm.concurrency.limit` and
//!   `assay.llm.concurrency.in_flight`: observed per OpenAI-compatible backend at each export.
//!
//! Instruments are made on first use: the meter provider must be installed before the first
//! model call (each binary initialises telemetry first).

use std::sync::{Arc, OnceLock, Weak};
use std::time::Instant;

use opentelemetry::KeyValue;
use opentelemetry::metrics::{Counter, Histogram};

use crate::breaker::{BreakerState, CircuitBreaker};
use crate::limiter::AdaptiveLimit;
use crate::types::{ChatModel, ChatRequest, ChatResponse, LlmError};

struct Instruments {
    duration: Histogram<f64>,
    tokens: Histogram<u64>,
    calls: Counter<u64>,
    cache_hits: Counter<u64>,
    retries: Counter<u64>,
    schema_violations: Counter<u64>,
    schema_demotions: Counter<u64>,
}

fn instruments() -> &'static Instruments {
    static INSTRUMENTS: OnceLock<Instruments> = OnceLock::new();
    INSTRUMENTS.get_or_init(|| {
        let meter = assay_telemetry::meter();
        Instruments {
            duration: meter
                .f64_histogram("gen_ai.client.operation.duration")
                .with_unit("s")
                .with_description("Duration of model calls that reached a backend")
                .with_boundaries(assay_telemetry::DURATION_BUCKETS.to_vec())
                .build(),
            tokens: meter
                .u64_histogram("gen_ai.client.token.usage")
                .with_unit("{token}")
                .with_description("Tokens per model call, by gen_ai.token.type (input, output)")
                .with_boundaries(vec![
                    1.0, 4.0, 16.0, 64.0, 256.0, 1024.0, 4096.0, 16384.0, 65536.0, 262144.0, 1048576.0,
                ])
                .build(),
            calls: meter
                .u64_counter("assay.llm.calls")
                .with_unit("{call}")
                .with_description("Model calls by outcome (ok, cache_hit, error)")
                .build(),
            cache_hits: meter
                .u64_counter("assay.llm.cache.hits")
                .with_unit("{call}")
                .with_description("Model calls answered from the response cache")
                .build(),
            retries: meter
                .u64_counter("assay.llm.retries")
                .with_unit("{retry}")
                .with_description("Model call attempts retried after a transient failure")
                .build(),
            schema_violations: meter
                .u64_counter("assay.llm.schema.violations")
                .with_unit("{reply}")
                .with_description("Structured replies that did not match their JSON schema, by the form it was sent in")
                .build(),
            schema_demotions: meter
                .u64_counter("assay.llm.schema.demotions")
                .with_unit("{change}")
                .with_description(
                    "Models moved to a weaker structured-output form: the form they accepted was not enforced",
                )
                .build(),
        }
    })
}

/// A retried attempt on `backend` (`reason`: `rate_limited`, `server_error`, `timeout`, ...).
pub fn retried(backend: &str, reason: &'static str) {
    instruments()
        .retries
        .add(1, &[KeyValue::new("assay.backend", backend.to_string()), KeyValue::new("assay.retry.reason", reason)]);
}

/// A structured reply from `backend`'s `model` that did not match its schema, sent in `form`.
pub fn schema_violated(backend: &str, model: &str, form: &'static str) {
    instruments().schema_violations.add(
        1,
        &[
            KeyValue::new("assay.backend", backend.to_string()),
            KeyValue::new("gen_ai.request.model", model.to_string()),
            KeyValue::new("assay.schema.form", form),
        ],
    );
}

/// `backend`'s `model` moved from structured-output form `from` to `to`.
pub fn schema_demoted(backend: &str, model: &str, from: &'static str, to: &'static str) {
    instruments().schema_demotions.add(
        1,
        &[
            KeyValue::new("assay.backend", backend.to_string()),
            KeyValue::new("gen_ai.request.model", model.to_string()),
            KeyValue::new("assay.schema.form", from),
            KeyValue::new("assay.schema.to", to),
        ],
    );
}

/// The attributes every model-call measurement carries.
fn attributes(operation: &'static str, backend: &str, phase: &str, model: &str) -> Vec<KeyValue> {
    vec![
        KeyValue::new("gen_ai.operation.name", operation),
        KeyValue::new("gen_ai.request.model", model.to_string()),
        KeyValue::new("assay.backend", backend.to_string()),
        KeyValue::new("assay.phase", phase.to_string()),
    ]
}

/// Record one finished model call (`operation`: `chat` or `embeddings`). A reply with cache hits
/// and no backend call counts as a cache hit, not in the duration and token histograms.
pub fn record_call(
    operation: &'static str,
    (backend, phase, model): (&str, &str, &str),
    started: Instant,
    outcome: Result<&crate::types::Usage, &LlmError>,
) {
    let m = instruments();
    let mut attrs = attributes(operation, backend, phase, model);
    match outcome {
        Ok(usage) if usage.calls == 0 && usage.cache_hits > 0 => {
            m.cache_hits.add(u64::from(usage.cache_hits), &attrs);
            attrs.push(KeyValue::new("assay.outcome", "cache_hit"));
            m.calls.add(1, &attrs);
        }
        Ok(usage) => {
            m.duration.record(started.elapsed().as_secs_f64(), &attrs);
            for (kind, n) in [("input", usage.prompt_tokens), ("output", usage.completion_tokens)] {
                let mut a = attrs.clone();
                a.push(KeyValue::new("gen_ai.token.type", kind));
                m.tokens.record(n, &a);
            }
            attrs.push(KeyValue::new("assay.outcome", "ok"));
            m.calls.add(1, &attrs);
        }
        Err(e) => {
            attrs.push(KeyValue::new("error.type", error_type(e)));
            m.duration.record(started.elapsed().as_secs_f64(), &attrs);
            attrs.push(KeyValue::new("assay.outcome", "error"));
            m.calls.add(1, &attrs);
        }
    }
}

fn error_type(e: &LlmError) -> &'static str {
    match e {
        LlmError::InvalidRequest(_) => "invalid_request",
        LlmError::Unauthorized(_) => "unauthorized",
        LlmError::RateLimited(_) => "rate_limited",
        LlmError::Unavailable(_) => "unavailable",
        LlmError::CircuitOpen => "circuit_open",
        LlmError::DeadlineExceeded => "deadline_exceeded",
        LlmError::MalformedReply(_) => "malformed_reply",
        LlmError::Unsupported(_) => "unsupported",
        LlmError::BudgetExhausted(_) => "budget_exhausted",
    }
}

/// A chat backend whose calls are measured under one phase.
pub struct MeteredChat {
    inner: Arc<dyn ChatModel>,
    backend: String,
    phase: String,
}

impl MeteredChat {
    /// `inner`, registered as `backend`, measured as phase `phase`.
    pub fn new(inner: Arc<dyn ChatModel>, backend: &str, phase: &str) -> MeteredChat {
        MeteredChat { inner, backend: backend.to_string(), phase: phase.to_string() }
    }
}

#[async_trait::async_trait]
impl ChatModel for MeteredChat {
    fn backend(&self) -> &str {
        self.inner.backend()
    }

    fn default_model(&self) -> &str {
        self.inner.default_model()
    }

    fn supports_logprobs(&self) -> bool {
        self.inner.supports_logprobs()
    }

    fn structured_output(&self, model: &str) -> Option<&'static str> {
        self.inner.structured_output(model)
    }

    async fn context_tokens(&self, model: &str) -> Option<u32> {
        self.inner.context_tokens(model).await
    }

    async fn chat(&self, request: ChatRequest) -> Result<ChatResponse, LlmError> {
        let model = request.model.clone().filter(|m| !m.is_empty());
        let model = model.as_deref().unwrap_or_else(|| self.inner.default_model()).to_string();
        let started = Instant::now();
        let reply = self.inner.chat(request).await;
        record_call("chat", (&self.backend, &self.phase, &model), started, reply.as_ref().map(|r| &r.usage));
        reply
    }
}

/// Observe `limit` and `breaker` of backend `backend` at every export, while they live.
pub(crate) fn observe_backend(backend: &str, limit: &Arc<AdaptiveLimit>, breaker: &Arc<CircuitBreaker>) {
    let meter = assay_telemetry::meter();
    let attrs = [KeyValue::new("assay.backend", backend.to_string())];
    let limit_gauge = |name: &'static str, description: &'static str, read: fn(&AdaptiveLimit) -> usize| {
        let (l, a) = (Arc::downgrade(limit), attrs.clone());
        meter
            .u64_observable_gauge(name)
            .with_unit("{call}")
            .with_description(description)
            .with_callback(move |o| {
                if let Some(l) = Weak::upgrade(&l) {
                    o.observe(read(&l) as u64, &a);
                }
            })
            .build()
    };
    let _limit = limit_gauge(
        "assay.llm.concurrency.limit",
        "Current adaptive concurrency limit of a backend",
        AdaptiveLimit::limit,
    );
    let _in_flight =
        limit_gauge("assay.llm.concurrency.in_flight", "Model calls in flight on a backend", AdaptiveLimit::in_flight);
    let (b, a) = (Arc::downgrade(breaker), attrs);
    let _breaker = meter
        .i64_observable_gauge("assay.llm.breaker.state")
        .with_description("Circuit breaker of a backend: 0 closed, 1 half-open, 2 open")
        .with_callback(move |o| {
            if let Some(b) = Weak::upgrade(&b) {
                let v = match b.state() {
                    BreakerState::Closed => 0,
                    BreakerState::HalfOpen => 1,
                    BreakerState::Open => 2,
                };
                o.observe(v, &a);
            }
        })
        .build();
}
