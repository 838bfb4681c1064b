//! Sending one request: the circuit breaker around a call, the retry loop with backoff inside the
//! deadline, and each HTTP attempt under the per-minute limits (see [`super::rate`]) and the
//! concurrency limit.

use std::sync::Arc;
use std::time::Instant;

use serde_json::Value;
use tracing::{debug, warn};

use super::config::OpenAiConfig;
use super::errors::{
    AttemptError, AttemptKind, CallError, breaker_outcome, classify_reply, deadline_passed, error_chain,
    transport_error,
};
use super::latency::{CallClass, HedgeBudget, LatencyBook, class_of};
use super::rate::{self, RateLimits, ReportsUsage};
use super::reply::UnusableBody;
use crate::breaker::{BreakerState, CircuitBreaker, Outcome};
use crate::limiter::{AdaptiveLimit, Signal};
use crate::retry::{WaitPlan, parse_retry_after, plan_wait};
use crate::types::LlmError;

/// How long the slots probe ([`Transport::probe_slots`]) waits for `/props`.
const PROPS_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// The HTTP side of a client: connection pool, per-minute limits, adaptive concurrency limit and
/// circuit breaker.
pub(super) struct Transport {
    http: reqwest::Client,
    rate: RateLimits,
    limit: Arc<AdaptiveLimit>,
    /// The backend's breaker: opened by failures of the server itself (no connection, timeouts,
    /// 429 / 502 / 503 / 504).
    breaker: Arc<CircuitBreaker>,
    /// A breaker per model: opened by failures the server answered for one model (a 500 for a
    /// model it cannot load), so one broken model fails its own calls, not the backend's.
    models: std::sync::Mutex<std::collections::HashMap<String, Arc<CircuitBreaker>>>,
    breaker_settings: (u32, std::time::Duration),
    latency: LatencyBook,
    hedges: HedgeBudget,
}

/// What a server said of itself ([`Transport::probe_props`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct ServerProps {
    /// Calls it serves at once.
    pub slots: Option<usize>,
    /// Tokens one call may hold (a slot's context).
    pub context: Option<u32>,
}

impl Transport {
    /// Fails only if the HTTP stack cannot be initialised.
    pub(super) fn new(config: &OpenAiConfig) -> Result<Self, LlmError> {
        let http = reqwest::Client::builder()
            .connect_timeout(config.connect_timeout)
            .build()
            .map_err(|e| LlmError::Unsupported(format!("http client: {}", error_chain(&e))))?;
        let limit = AdaptiveLimit::new(config.backend_name.clone(), config.limit_settings());
        let breaker = Arc::new(CircuitBreaker::new(config.breaker_failures, config.breaker_cooldown));
        crate::metrics::observe_backend(&config.backend_name, &limit, &breaker);
        let rate = RateLimits::new(&config.backend_name, config.requests_per_minute, config.tokens_per_minute);
        Ok(Self {
            http,
            rate,
            limit,
            breaker,
            models: std::sync::Mutex::default(),
            breaker_settings: (config.breaker_failures, config.breaker_cooldown),
            latency: LatencyBook::default(),
            hedges: HedgeBudget::default(),
        })
    }

    /// Ask the server how many calls it serves at once and what one call may hold: llama.cpp's
    /// `llama-server` answers `GET /props` (beside `/v1`) with `total_slots` (its `--parallel`)
    /// and `default_generation_settings.n_ctx` (a slot's context). Once per client, before its
    /// first chat call, within `PROPS_TIMEOUT`; any other answer (404 from other servers, a body
    /// without the fields, no answer) leaves the limit to find the slots from the answers.
    pub(super) async fn probe_props(&self, config: &OpenAiConfig) -> ServerProps {
        let none = ServerProps::default();
        if config.api() != super::api::Api::OpenAi {
            return none;
        }
        let base = config.base_url.trim_end_matches('/');
        let url = format!("{}/props", base.strip_suffix("/v1").unwrap_or(base));
        let mut builder = self.http.get(&url).timeout(PROPS_TIMEOUT);
        if let Some(key) = &config.api_key {
            builder = builder.bearer_auth(key);
        }
        let Ok(response) = builder.send().await else {
            return none;
        };
        if !response.status().is_success() {
            debug!(backend = %config.backend_name, status = response.status().as_u16(), "the server has no /props");
            return none;
        }
        let Ok(props) = response.json::<Value>().await else {
            return none;
        };
        let slots =
            props.get("total_slots").and_then(Value::as_u64).filter(|n| *n >= 1).and_then(|n| usize::try_from(n).ok());
        let context = props
            .pointer("/default_generation_settings/n_ctx")
            .and_then(Value::as_u64)
            .filter(|n| *n >= 1)
            .and_then(|n| u32::try_from(n).ok());
        if let Some(slots) = slots {
            self.limit.report_slots(slots);
        }
        ServerProps { slots, context }
    }

    /// The concurrency limit (current value, in flight).
    pub(super) fn limit(&self) -> &AdaptiveLimit {
        &self.limit
    }

    /// Current circuit-breaker state.
    pub(super) fn breaker_state(&self) -> BreakerState {
        self.breaker.state()
    }

    /// The state of `model`'s own breaker (closed for a model not called yet).
    pub(super) fn model_breaker_state(&self, model: &str) -> BreakerState {
        let models = self.models.lock().unwrap_or_else(|p| p.into_inner());
        models.get(model).map_or(BreakerState::Closed, |b| b.state())
    }

    fn model_breaker(&self, model: &str) -> Arc<CircuitBreaker> {
        let mut models = self.models.lock().unwrap_or_else(|p| p.into_inner());
        models
            .entry(model.to_string())
            .or_insert_with(|| Arc::new(CircuitBreaker::new(self.breaker_settings.0, self.breaker_settings.1)))
            .clone()
    }

    /// One call through the breaker, with retries.
    pub(super) async fn call<T: ReportsUsage>(
        &self,
        config: &OpenAiConfig,
        url: &str,
        body: &Value,
        deadline: Option<Instant>,
        parse: impl Fn(&[u8]) -> Result<T, UnusableBody>,
    ) -> Result<(T, u32), CallError> {
        let Some(permit) = self.breaker.try_acquire() else {
            debug!(backend = %config.backend_name, "circuit open, failing fast");
            return Err(CallError { error: LlmError::CircuitOpen, status: None, retries: 0 });
        };
        let model = body.get("model").and_then(Value::as_str).unwrap_or_default();
        let model_breaker = self.model_breaker(model);
        let Some(model_permit) = model_breaker.try_acquire() else {
            debug!(backend = %config.backend_name, model, "circuit open for this model, failing fast");
            return Err(CallError { error: LlmError::CircuitOpen, status: None, retries: 0 });
        };
        let result = self.call_with_retries(config, url, body, deadline, &parse).await;
        let (backend, of_model) = match &result {
            Ok(_) => (Outcome::Healthy, Outcome::Healthy),
            // A backend refusing a structured-output form (being negotiated) is up and answering:
            // never a failure toward the breaker.
            Err(e)
                if body.get("response_format").is_some()
                    && e.status.is_some_and(|s| super::format::is_schema_rejection(s, &e.error)) =>
            {
                (Outcome::Neutral, Outcome::Neutral)
            }
            Err(e) => match (breaker_outcome(&e.error), e.status) {
                // The server answered, for this model: it is up; the model is what fails.
                (Outcome::Failed, Some(status)) if !matches!(status, 429 | 502 | 503 | 504) => {
                    (Outcome::Healthy, Outcome::Failed)
                }
                (outcome, _) => (outcome, Outcome::Neutral),
            },
        };
        if let Some(state) = permit.record(backend) {
            warn!(backend = %config.backend_name, state = ?state, "circuit breaker changed state");
        }
        if let Some(state) = model_permit.record(of_model) {
            warn!(backend = %config.backend_name, model, state = ?state, "circuit breaker of one model changed state");
        }
        result
    }

    async fn call_with_retries<T: ReportsUsage>(
        &self,
        config: &OpenAiConfig,
        url: &str,
        body: &Value,
        deadline: Option<Instant>,
        parse: &impl Fn(&[u8]) -> Result<T, UnusableBody>,
    ) -> Result<(T, u32), CallError> {
        let backoff = config.backoff();
        let class = class_of(url, body);
        let mut retries = 0u32;
        let mut malformed_retried = false;
        loop {
            if deadline_passed(deadline) {
                return Err(CallError { error: LlmError::DeadlineExceeded, status: None, retries });
            }
            // An attempt after one given up on (which the backend may have served) waits for
            // room in the budget like any call.
            if let Err(error) = crate::attempts::reserve_next(deadline).await {
                return Err(CallError { error, status: None, retries });
            }
            let failure = match self.attempt(config, url, body, deadline, (&class, retries), parse).await {
                Ok(value) => return Ok((value, retries)),
                Err(failure) => failure,
            };
            let retryable = match failure.kind {
                AttemptKind::Transient | AttemptKind::TimedOut | AttemptKind::Unreachable => true,
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
            match plan_wait(jitter, failure.retry_after, config.max_retry_after, Instant::now(), deadline) {
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
                    crate::metrics::retried(&config.backend_name, retry_reason(&failure));
                    tokio::time::sleep(wait).await;
                    retries += 1;
                }
                WaitPlan::GiveUp => {
                    debug!(backend = %config.backend_name, retry_after_ms = failure.retry_after.map(|d| d.as_millis() as u64),
                           "next retry would cross the deadline or wait longer than max_retry_after");
                    return Err(CallError { error: failure.error, status: failure.status, retries });
                }
                WaitPlan::DeadlinePassed => {
                    return Err(CallError { error: LlmError::DeadlineExceeded, status: failure.status, retries });
                }
            }
        }
    }

    /// One HTTP attempt: attempt number `attempt` of a call of class `class`. Its timeout is the
    /// adaptive one (see [`LatencyBook`]); an attempt started before the class had enough samples
    /// recomputes it as samples arrive, so it is still cut short once the class has them; the
    /// request deadline caps it. A success's latency is noted under the class.
    ///
    /// Before its slot, the attempt waits for the per-minute limits (one request and its token
    /// estimate); that wait is queueing and is in no latency sample. A reply's reported usage
    /// corrects the token reservation.
    async fn attempt<T: ReportsUsage>(
        &self,
        config: &OpenAiConfig,
        url: &str,
        body: &Value,
        deadline: Option<Instant>,
        (class, attempt): (&CallClass, u32),
        parse: &impl Fn(&[u8]) -> Result<T, UnusableBody>,
    ) -> Result<T, AttemptError> {
        // Dropped before the request goes out (deadline, cancellation), it gives its share back.
        let admission = if self.rate.is_limited() {
            let admitted = self.rate.admit(rate::estimate_tokens(body), deadline).await;
            Some(admitted.map_err(|_| AttemptError::deadline())?)
        } else {
            None
        };
        let acquire = self.limit.acquire();
        let slot = match deadline {
            Some(d) => tokio::time::timeout_at(d.into(), acquire).await.map_err(|_| AttemptError::deadline())?,
            None => acquire.await,
        };
        if deadline_passed(deadline) {
            return Err(AttemptError::deadline());
        }
        let sent = admission.map(rate::Admission::sent);
        let started = Instant::now();
        let reply = self.exchange(config, url, body, deadline, (class, attempt, slot.ahead()), parse).await;
        // A hung request rescued by its duplicate is no latency of the backend's (the duplicate's
        // own slot reports its latency): counted, its 5-11 s read as a latency rise and cut the
        // limit, which then had no free slot for the next hang's duplicate.
        let signal = match &reply {
            Ok(answered) if answered.by_duplicate => Signal::Ignore,
            _ => load_signal(&reply, started.elapsed()),
        };
        slot.finish(&class.key, signal);
        if let Err(e) = &reply
            && e.status.is_some_and(|s| s >= 500)
            && super::errors::out_of_room(&e.error.to_string())
        {
            self.limit.out_of_room();
        }
        let reply = reply.map(|answered| answered.value);
        if let Some(sent) = sent {
            // Whichever of the attempt and its hedges answered, one reservation is corrected by
            // the usage; the others keep their estimates (the provider may have counted them).
            sent.settle(reply.as_ref().ok().and_then(ReportsUsage::tokens_used));
        }
        reply
    }

    /// The HTTP exchange of one attempt, under its slot, sent with `ahead` calls in flight.
    ///
    /// A server that queues (one slot, or a few) answers a call only after the calls ahead of it:
    /// its wait is no hang. Its timeout and its hedges count from its turn: from when the backend
    /// has answered enough of the calls ahead of it for a slot to be free
    /// ([`answers_before_turn`]: at once when it has more slots than calls ahead), not from when
    /// it was sent. Until then it is given up on only when the backend answers nothing at all for a
    /// whole attempt timeout (a server that stopped, not one working through its queue). So a
    /// call is never abandoned, and sent again, for waiting its turn: a queueing server would
    /// still serve the abandoned copy (llama-cpp-python does; see "Local servers" in docs/backends.md).
    async fn exchange<T: ReportsUsage>(
        &self,
        config: &OpenAiConfig,
        url: &str,
        body: &Value,
        deadline: Option<Instant>,
        (class, attempt, ahead): (&CallClass, u32, usize),
        parse: &impl Fn(&[u8]) -> Result<T, UnusableBody>,
    ) -> Result<Answered<T>, AttemptError> {
        let mut builder = self.http.post(url).json(body);
        if let Some(key) = &config.api_key {
            builder = builder.bearer_auth(key);
        }
        // The model server joins the caller's trace (W3C trace context), when one is recorded.
        for (name, value) in assay_telemetry::current_trace_headers() {
            builder = builder.header(name, value);
        }
        let started = Instant::now();
        let mut samples = self.latency.subscribe();
        let answers_at_send = *samples.borrow_and_update();
        // Answers needed before its turn: a server that said it has `k` slots serves a call sent
        // with `ahead` in flight at once when `ahead < k`, else after `ahead - k + 1` answers; any
        // other is taken to serve one at a time (FIFO: slots found from answers are an estimate).
        let needed = answers_before_turn(ahead, self.limit.reported_slots());
        // When the calls ahead had been answered (its turn); when the backend last answered.
        let mut turn: Option<Instant> = (needed == 0).then_some(started);
        let mut progress = started;
        // Hedged requests: once an attempt has gone unanswered for `hedge_factor` times its class's
        // expected latency, a duplicate goes out beside it (when the concurrency limit has a free
        // slot: a hedge never queues) and the first success is taken. A hang then costs about
        // twice the usual latency, not an attempt timeout (whose floor guards against cutting a
        // slow answer; a hedge cuts nothing, so it needs no floor). An attempt may be hedged up
        // to [`MAX_HEDGES`] times, each duplicate replacing an unanswered one, within the backend's
        // hedge budget; a duplicate the server refused is replaced after the retry backoff, up to
        // `max_retries` times, as a refused attempt would be retried. The last attempt, which has the ceiling, is hedged outside
        // the budget, at the latest after a first attempt's timeout; a call slow for good reason
        // still has the whole ceiling.
        // The wait is recomputed as samples arrive (a call sent before the backend answered anything
        // is hedged once its siblings set the pace).
        let last = attempt >= config.max_retries;
        let hedge_after = || {
            let first_timeout =
                self.latency.attempt_timeout(&config.adaptive_timeout, class, 0, 1, config.request_timeout);
            match self.latency.hedge_delay(&config.adaptive_timeout, class) {
                Some(delay) => delay.min(first_timeout),
                None if last => first_timeout,
                None => config.request_timeout,
            }
        };
        // Under a limited budget no duplicate goes out: each would be a second call the provider
        // may serve and bill, outside the call's reservation.
        let budgeted = assay_budget::current().is_some_and(|b| b.is_limited());
        let hedge = (config.adaptive_timeout.enabled && !budgeted).then(|| builder.try_clone()).flatten();
        // Duplicates that went out and were not refused (at most MAX_HEDGES), and those the
        // server refused (replaced, at most `max_retries`, as refused attempts are retried).
        let mut hedges = 0u32;
        let mut refused = 0u32;
        // When the last duplicate (or the attempt itself) went out.
        let mut hedged_from = started;
        let send = |builder: reqwest::RequestBuilder| async move {
            let response = builder.send().await?;
            let status = response.status().as_u16();
            let retry_after = response
                .headers()
                .get(reqwest::header::RETRY_AFTER)
                .and_then(|v| v.to_str().ok())
                .and_then(parse_retry_after);
            let bytes = response.bytes().await?;
            Ok::<_, reqwest::Error>((status, retry_after, bytes))
        };
        let exchange = send(builder);
        tokio::pin!(exchange);
        let mut hedged = None;
        // When a failed duplicate is replaced: after the retry backoff (at least its `Retry-After`),
        // as a failed attempt would be retried, not after the doubled wait of a duplicate that
        // has not answered; `None` while no duplicate has failed since the last one went out.
        let mut replace_at: Option<Instant> = None;
        let mut answered_since = started;
        // Requests of this attempt no longer waited for whose fate is unknown: duplicates
        // replaced while unanswered, and those cut off without a status (the backend may have
        // served either; see `crate::attempts`).
        let mut replaced = 0u32;
        let mut cut_off = 0u32;
        let (status, retry_after, bytes) = loop {
            let wait = hedge_after();
            // A duplicate at a server found to queue with few slots would wait behind the
            // request it duplicates (or take one of its few slots): none goes out there.
            let hedging = hedge.is_some()
                && turn.is_some()
                && self.limit.serves_at_once(FEW_SLOTS)
                && hedges < MAX_HEDGES
                && refused <= config.max_retries
                && wait < config.request_timeout;
            let next_hedge = replace_at.unwrap_or(hedged_from + wait.saturating_mul(1 << hedges));
            let budget = self.latency.attempt_timeout(
                &config.adaptive_timeout,
                class,
                attempt,
                config.max_retries,
                config.request_timeout,
            );
            // At a server that said its slots (llama.cpp's), a call in service may take as long as
            // its token limit needs at the pace the server has shown, beyond the ceiling: calls
            // served at once share its cores, and cutting one that is still being generated only
            // makes the server start it again. (Slots found from answers are an estimate, and a
            // client short of CPU reads as one: hangs there keep the adaptive timeout.)
            let budget = match class.max_tokens.filter(|n| *n > 0) {
                Some(n) if self.limit.reported_slots().is_some() => {
                    self.latency.service_bound(n).map_or(budget, |bound| budget.max(bound))
                }
                Some(_) | None => budget,
            };
            // While the class is cold its budget is the ceiling or a prior borrowed from other
            // classes: listen for new samples and recompute it, so a hang is cut once siblings set
            // the pace. A warm class keeps the budget it started with.
            // Waiting its turn, it listens for answers too, to know when its turn came.
            let listen = !self.latency.is_warm(class) || turn.is_none();
            let by_budget = turn.unwrap_or(progress) + budget;
            let limit = deadline.map_or(by_budget, |d| d.min(by_budget));
            tokio::select! {
                answered = &mut exchange => match answered {
                    Ok(reply) => break reply,
                    Err(e) => {
                        // Refused before it was sent, it ran nowhere; cut off after, it may have.
                        let sent = !e.is_connect() && !e.is_builder();
                        crate::attempts::abandoned(u32::from(sent) + u32::from(hedged.is_some()) + replaced + cut_off);
                        return Err(transport_error(e, deadline));
                    }
                },
                () = tokio::time::sleep_until(next_hedge.into()), if hedging => {
                    // A duplicate takes a free slot and never queues for one: with none free it waits
                    // another round, except beside the last attempt (which would otherwise sit out
                    // the ceiling): that one goes out regardless, as it always has. It is a request
                    // the provider counts, so it also takes one from the per-minute limits, only
                    // when they have it now and nobody waits (never queueing there either, even
                    // beside the last attempt).
                    // Replacing a duplicate the server refused is part of the decision to hedge
                    // that was already paid for: it needs a slot but not the budget (the refused
                    // one added no load to wait behind; at most MAX_HEDGES go out per attempt).
                    let replacing = replace_at.take().is_some();
                    let Some(admitted) = self.rate.try_admit(rate::estimate_tokens(body)) else {
                        hedged_from = Instant::now();
                        continue;
                    };
                    let slot = self.limit.try_acquire();
                    if !last && (slot.is_none() || !(replacing || self.hedges.try_spend())) {
                        hedged_from = Instant::now();
                        continue;
                    }
                    let _kept = admitted.sent();
                    debug!(backend = %config.backend_name, attempt, hedge = hedges + 1, "attempt unanswered, hedging it");
                    crate::metrics::retried(&config.backend_name, "hedge");
                    hedges += 1;
                    // A hedge that has not answered either is replaced: it may have hung too.
                    replaced += u32::from(hedged.is_some());
                    hedged = hedge
                        .as_ref()
                        .and_then(reqwest::RequestBuilder::try_clone)
                        .map(|b| (Instant::now(), slot, Box::pin(send(b))));
                    hedged_from = Instant::now();
                    continue;
                }
                answered = async { hedged.as_mut().map(|(_, _, h)| h).expect("guarded by is_some").await }, if hedged.is_some() => {
                    match answered {
                        Ok(reply) if (200..300).contains(&reply.0) => {
                            if let Some((at, slot, _)) = hedged.take() {
                                answered_since = at;
                                if let Some(slot) = slot {
                                    slot.finish(&class.key, Signal::Answered(at.elapsed()));
                                }
                            }
                            break reply;
                        }
                        // The duplicate failed: the first request may still answer, and the
                        // duplicate is replaced after the backoff a failed attempt would wait (a
                        // server asking for more than `max_retry_after` gets no replacement).
                        failed => {
                            hedged = None;
                            if failed.as_ref().is_err_and(|e| !e.is_connect()) {
                                cut_off += 1;
                            }
                            hedges -= 1;
                            refused += 1;
                            let asked = failed.ok().and_then(|(_, retry_after, _)| retry_after);
                            if asked.is_some_and(|asked| asked > config.max_retry_after) {
                                refused = u32::MAX;
                                continue;
                            }
                            let jitter = config.backoff().jittered(refused - 1, &mut rand::rng());
                            replace_at = Some(Instant::now() + asked.map_or(jitter, |asked| jitter.max(asked)));
                            continue;
                        }
                    }
                }
                () = tokio::time::sleep_until(limit.into()) => {
                    // Given up on: the request and any duplicate still out may yet be served.
                    crate::attempts::abandoned(1 + u32::from(hedged.is_some()) + replaced + cut_off);
                    if deadline.is_some_and(|d| d <= by_budget) {
                        return Err(AttemptError::deadline());
                    }
                    return Err(AttemptError::timed_out(budget, budget < config.request_timeout));
                }
                Ok(()) = samples.changed(), if listen => {
                    let answers = *samples.borrow_and_update();
                    progress = Instant::now();
                    if turn.is_none() && answers.wrapping_sub(answers_at_send) >= needed as u64 {
                        turn = Some(progress);
                        if hedges == 0 && replace_at.is_none() {
                            hedged_from = progress;
                        }
                    }
                    continue;
                }
            }
        };
        debug!(backend = %config.backend_name, status, bytes = bytes.len(), "model call answered");
        let sent_response_format = body.get("response_format").is_some();
        // An error body goes into the error's message (and so to callers and logs): never with
        // the key in it, even from a backend that echoes it.
        let bytes = match &config.api_key {
            Some(key) if status >= 300 && !key.is_empty() => redact(&bytes, key),
            _ => bytes.to_vec(),
        };
        let reply =
            classify_reply(status, &bytes, retry_after, sent_response_format, &config.deterministic_statuses, parse);
        // The requests still out beside the one that answered: a duplicate, or the request a
        // duplicate answered for.
        let others = replaced + u32::from(hedged.is_some()) + u32::from(answered_since != started);
        match &reply {
            Ok(_) => {
                crate::attempts::duplicated(others);
                crate::attempts::abandoned(cut_off);
            }
            // Served, but its reply could not be read: spent all the same.
            Err(e) if e.kind == AttemptKind::Malformed => crate::attempts::abandoned(1 + others + cut_off),
            Err(_) => crate::attempts::abandoned(others + cut_off),
        }
        if let Ok(value) = &reply {
            self.latency.record(class, answered_since.elapsed());
            if let Some(tokens) = value.completion_tokens() {
                self.latency.record_pace(answered_since.elapsed(), tokens);
            }
            self.hedges.answered();
        }
        reply.map(|value| Answered { value, by_duplicate: answered_since != started })
    }
}

/// Answers the backend must give before a call sent with `ahead` calls in flight is in service:
/// none when the `slots` the server said it has exceed `ahead`, else `ahead - slots + 1`; with
/// none said, `ahead` (one at a time: a call given up on for waiting its turn would be served
/// twice, and slots found from answers are an estimate that may read high).
fn answers_before_turn(ahead: usize, slots: Option<usize>) -> usize {
    match slots {
        Some(k) => (ahead + 1).saturating_sub(k.max(1)),
        None => ahead,
    }
}

/// An attempt's reply and whether a duplicate of it (not the request itself) gave it.
struct Answered<T> {
    value: T,
    by_duplicate: bool,
}

/// A server found to queue with fewer slots than this, or not yet seen to serve calls at once,
/// gets no hedged duplicates.
const FEW_SLOTS: f64 = 8.0;

/// Duplicates an attempt may get, each after twice the wait of the one before.
const MAX_HEDGES: u32 = 3;

/// What an attempt's end says about the backend's load: 429 and 503, timeouts and transport
/// failures on a connection are overload; a success is a latency; a deadline, a connection that
/// could not be made or another error status says nothing.
fn load_signal<T>(reply: &Result<T, AttemptError>, elapsed: std::time::Duration) -> Signal {
    match reply {
        Ok(_) => Signal::Answered(elapsed),
        Err(e) if matches!(e.error, LlmError::DeadlineExceeded) => Signal::Ignore,
        Err(e) => match e.status {
            Some(429 | 503) => Signal::Overloaded,
            // Another error status (500, 502, a 4xx) is neither a refusal nor the latency of an
            // answer: a 500 back in a millisecond, taken as one, set a call class's long-term
            // latency so low that its next ordinary answers read as a rise and cut the limit.
            Some(_) => Signal::Ignore,
            None if matches!(e.kind, AttemptKind::Transient | AttemptKind::TimedOut) => Signal::Overloaded,
            // A backend that cannot be reached is down, not loaded.
            None => Signal::Ignore,
        },
    }
}

/// `body` with every occurrence of `secret` replaced by `<redacted>`.
fn redact(body: &[u8], secret: &str) -> Vec<u8> {
    let text = String::from_utf8_lossy(body);
    if text.contains(secret) { text.replace(secret, "<redacted>").into_bytes() } else { body.to_vec() }
}

/// Why an attempt is retried, for the `assay.llm.retries` metric.
fn retry_reason(failure: &AttemptError) -> &'static str {
    match (failure.kind, failure.status) {
        (AttemptKind::Malformed, _) => "malformed_reply",
        (_, Some(429)) => "rate_limited",
        (_, Some(s)) if s >= 500 => "server_error",
        (_, Some(_)) => "other_status",
        (AttemptKind::TimedOut, None) => "timeout",
        (AttemptKind::Transient | AttemptKind::Unreachable | AttemptKind::Permanent, None) => "transport",
    }
}

#[cfg(test)]
mod tests {
    use super::answers_before_turn;

    #[test]
    fn a_call_is_in_service_once_a_slot_is_free_for_it() {
        // Four slots (llama-server's default): the first four calls at once, the fifth after one
        // answer, the sixth after two.
        assert_eq!([0, 3, 4, 5].map(|ahead| answers_before_turn(ahead, Some(4))), [0, 0, 1, 2]);
        assert_eq!(answers_before_turn(2, Some(1)), 2);
        // Not said: one at a time.
        assert_eq!(answers_before_turn(3, None), 3);
    }
}
