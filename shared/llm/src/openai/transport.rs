//! Sending one request: the circuit breaker around a call, the retry loop with backoff inside the
//! deadline, and each HTTP attempt under the concurrency limit.

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;
use tokio::sync::Semaphore;
use tracing::{debug, warn};

use super::config::OpenAiConfig;
use super::errors::{
    AttemptError, AttemptKind, CallError, breaker_outcome, classify_reply, deadline_passed, error_chain,
    transport_error,
};
use crate::breaker::{BreakerState, CircuitBreaker, Outcome};
use crate::retry::{WaitPlan, parse_retry_after, plan_wait};
use crate::types::LlmError;

/// The HTTP side of a client: connection pool, concurrency slots and circuit breaker.
pub(super) struct Transport {
    http: reqwest::Client,
    slots: Semaphore,
    breaker: Arc<CircuitBreaker>,
}

impl Transport {
    /// Fails only if the HTTP stack cannot be initialised.
    pub(super) fn new(config: &OpenAiConfig) -> Result<Self, LlmError> {
        let http = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .build()
            .map_err(|e| LlmError::Unsupported(format!("http client: {}", error_chain(&e))))?;
        Ok(Self {
            http,
            slots: Semaphore::new(config.max_concurrency.max(1)),
            breaker: Arc::new(CircuitBreaker::new(config.breaker_failures, config.breaker_cooldown)),
        })
    }

    /// Current circuit-breaker state.
    pub(super) fn breaker_state(&self) -> BreakerState {
        self.breaker.state()
    }

    /// One call through the breaker, with retries.
    pub(super) async fn call<T>(
        &self,
        config: &OpenAiConfig,
        url: &str,
        body: &Value,
        deadline: Option<Instant>,
        parse: impl Fn(&[u8]) -> Result<T, String>,
    ) -> Result<(T, u32), CallError> {
        let Some(permit) = self.breaker.try_acquire() else {
            debug!(backend = %config.backend_name, "circuit open, failing fast");
            return Err(CallError { error: LlmError::Unavailable("circuit open".into()), status: None, retries: 0 });
        };
        let result = self.call_with_retries(config, url, body, deadline, &parse).await;
        let outcome = match &result {
            Ok(_) => Outcome::Healthy,
            Err(e) => breaker_outcome(&e.error),
        };
        if let Some(state) = permit.record(outcome) {
            warn!(backend = %config.backend_name, state = ?state, "circuit breaker changed state");
        }
        result
    }

    async fn call_with_retries<T>(
        &self,
        config: &OpenAiConfig,
        url: &str,
        body: &Value,
        deadline: Option<Instant>,
        parse: &impl Fn(&[u8]) -> Result<T, String>,
    ) -> Result<(T, u32), CallError> {
        let backoff = config.backoff();
        let mut retries = 0u32;
        let mut malformed_retried = false;
        loop {
            if deadline_passed(deadline) {
                return Err(CallError { error: LlmError::DeadlineExceeded, status: None, retries });
            }
            let failure = match self.attempt(config, url, body, deadline, parse).await {
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
        config: &OpenAiConfig,
        url: &str,
        body: &Value,
        deadline: Option<Instant>,
        parse: &impl Fn(&[u8]) -> Result<T, String>,
    ) -> Result<T, AttemptError> {
        let acquire = self.slots.acquire();
        let slot = match deadline {
            Some(d) => tokio::time::timeout_at(d.into(), acquire).await.map_err(|_| AttemptError::deadline())?,
            None => acquire.await,
        };
        let _slot = slot.map_err(|_| AttemptError::permanent(LlmError::Unavailable("client closed".into())))?;
        let timeout = match deadline {
            Some(d) => d.saturating_duration_since(Instant::now()).min(config.request_timeout),
            None => config.request_timeout,
        };
        if timeout.is_zero() {
            return Err(AttemptError::deadline());
        }
        let mut builder = self.http.post(url).json(body).timeout(timeout);
        if let Some(key) = &config.api_key {
            builder = builder.bearer_auth(key);
        }
        // When the deadline, not `request_timeout`, set this attempt's timeout, a timeout means the
        // deadline is (about) reached.
        let capped_by_deadline = deadline.is_some() && timeout < config.request_timeout;
        let transport = |e: reqwest::Error| transport_error(e, deadline, capped_by_deadline, timeout);
        let response = builder.send().await.map_err(transport)?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(parse_retry_after);
        let bytes = response.bytes().await.map_err(transport)?;
        debug!(backend = %config.backend_name, status, bytes = bytes.len(), "model call answered");
        let sent_response_format = body.get("response_format").is_some();
        classify_reply(status, &bytes, retry_after, sent_response_format, &config.deterministic_statuses, parse)
    }
}
