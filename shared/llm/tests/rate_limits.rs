//! Per-minute limits (requests and tokens per minute) of the OpenAI-compatible client, measured at
//! the scripted server on a loopback port.

use std::time::{Duration, Instant};

use assay_llm::{ChatModel, ChatRequest, LlmError, Message, OpenAiClient, OpenAiConfig};
use assay_testkit::{RecordedRequest, Reply, ScriptedLlm};
use futures::future::join_all;

/// Tokens per minute of the token-limit tests.
const TPM: u64 = 60_000;

/// Completion tokens a drain call asks for and is reported to use: the whole token bucket (with
/// its prompt the estimate is larger than the bucket, so it waits for it full).
const DRAIN_MAX_TOKENS: u32 = TPM as u32;

fn config(server: &ScriptedLlm, requests_per_minute: u32, tokens_per_minute: u64) -> OpenAiConfig {
    OpenAiConfig {
        base_url: server.base_url(),
        default_model: "test-model".into(),
        base_backoff: Duration::from_millis(5),
        max_backoff: Duration::from_millis(20),
        request_timeout: Duration::from_secs(20),
        // A fixed, wide concurrency limit: the buckets, not the slots, set the pace.
        initial_concurrency: 0,
        max_concurrency: 256,
        requests_per_minute,
        tokens_per_minute,
        // Requests are counted one per call: no duplicates of stragglers (a busy test machine
        // makes some; hedging is tested in openai_client.rs).
        adaptive_timeout: assay_llm::AdaptiveTimeout { hedge_factor: 0.0, ..assay_llm::AdaptiveTimeout::default() },
        ..OpenAiConfig::default()
    }
}

fn ask(max_tokens: u32, deadline: Option<Instant>) -> ChatRequest {
    ChatRequest {
        messages: vec![Message::user("hi")],
        max_tokens: Some(max_tokens),
        deadline,
        ..ChatRequest::default()
    }
}

/// Replies reporting `prompt` + `completion` tokens, except a drain call (asking for
/// [`DRAIN_MAX_TOKENS`]), reported to use what it asked for.
fn usage_handler(prompt: u64, completion: u64) -> impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static {
    move |request| {
        let asked = request.body.get("max_tokens").and_then(serde_json::Value::as_u64).unwrap_or(0);
        if asked == u64::from(DRAIN_MAX_TOKENS) {
            Reply::text("ok").usage(0, asked)
        } else {
            Reply::text("ok").usage(prompt, completion)
        }
    }
}

/// `n` concurrent calls; how many succeeded and how many failed with the deadline error.
async fn concurrent(client: &OpenAiClient, n: usize, max_tokens: u32, deadline: Option<Instant>) -> (usize, usize) {
    let results = join_all((0..n).map(|_| client.chat(ask(max_tokens, deadline)))).await;
    let ok = results.iter().filter(|r| r.is_ok()).count();
    let deadline = results.iter().filter(|r| matches!(r, Err(LlmError::DeadlineExceeded))).count();
    (ok, deadline)
}

/// Requests per second over the last `tail` requests the server received (from the first of them
/// to the last: `tail - 1` intervals).
fn tail_rate(server: &ScriptedLlm, tail: usize) -> f64 {
    let mut received: Vec<Instant> = server.exchanges().iter().map(|e| e.received).collect();
    received.sort();
    let tail = &received[received.len() - tail..];
    let span = tail[tail.len() - 1].duration_since(tail[0]).as_secs_f64();
    (tail.len() - 1) as f64 / span
}

fn within(measured: f64, expected: f64, tolerance: f64) -> bool {
    (measured - expected).abs() <= expected * tolerance
}

/// Calls in the paced phase that are measured.
const MEASURED: usize = 31;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_per_minute_hold_a_steady_rate_within_ten_percent() {
    let server = ScriptedLlm::start().await;
    server.set_handler(usage_handler(5, 5));
    let rpm = 600u32;
    let created = Instant::now();
    let client = OpenAiClient::new(config(&server, rpm, 0)).unwrap();
    // The bucket starts full: a minute's worth goes out at once.
    let (ok, _) = concurrent(&client, rpm as usize, 16, None).await;
    assert_eq!(ok, rpm as usize);
    // Meanwhile it refilled at rpm / 60 per second: those go at once too, the rest are paced.
    let per_second = f64::from(rpm) / 60.0;
    let refilled = (created.elapsed().as_secs_f64() * per_second).ceil() as usize + 1;
    let (ok, _) = concurrent(&client, refilled + MEASURED, 16, None).await;
    assert_eq!(ok, refilled + MEASURED);
    assert_eq!(server.request_count(), rpm as usize + refilled + MEASURED);
    let rate = tail_rate(&server, MEASURED);
    eprintln!("requests_per_minute {rpm}: steady rate {rate:.3}/s (expected {per_second}/s)");
    assert!(within(rate, per_second, 0.10), "measured {rate:.3} requests/s, expected {per_second}");
}

/// Tokens per minute at a steady rate, each call reserving `max_tokens` + its prompt estimate and
/// corrected to the `prompt + completion` its reply reports; the measured tokens per second are
/// within 10% of `tpm / 60`.
async fn tokens_per_minute_rate(max_tokens: u32, prompt: u64, completion: u64) {
    let server = ScriptedLlm::start().await;
    server.set_handler(usage_handler(prompt, completion));
    let tpm = TPM;
    let client = OpenAiClient::new(config(&server, 0, tpm)).unwrap();
    // One call larger than the bucket waits for it full, goes, and is reported to use it all.
    client.chat(ask(DRAIN_MAX_TOKENS, None)).await.unwrap();
    let drained = Instant::now();
    let per_call = prompt + completion;
    let tokens_per_second = tpm as f64 / 60.0;
    let refilled = (drained.elapsed().as_secs_f64() * tokens_per_second / per_call as f64).ceil() as usize + 1;
    let (ok, _) = concurrent(&client, refilled + MEASURED, max_tokens, None).await;
    assert_eq!(ok, refilled + MEASURED);
    let rate = tail_rate(&server, MEASURED) * per_call as f64;
    eprintln!(
        "tokens_per_minute {tpm}, estimate max_tokens {max_tokens} + prompt, reported {per_call}: \
         steady rate {rate:.1} tokens/s (expected {tokens_per_second})"
    );
    assert!(within(rate, tokens_per_second, 0.10), "measured {rate:.1} tokens/s, expected {tokens_per_second}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_per_minute_take_the_usage_above_the_estimate() {
    // Reserved 40 + 1 (the prompt estimate), used 100: the difference is taken after the reply.
    tokens_per_minute_rate(40, 30, 70).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_per_minute_give_back_the_estimate_not_used() {
    // Reserved 300 + 1, used 100: the difference is given back after the reply.
    tokens_per_minute_rate(300, 30, 70).await;
}

#[tokio::test]
async fn a_deadline_shorter_than_the_wait_fails_at_once_and_sends_nothing() {
    let server = ScriptedLlm::start().await;
    server.set_handler(usage_handler(5, 5));
    // One request a minute: after the first, the wait is about a minute.
    let client = OpenAiClient::new(config(&server, 1, 0)).unwrap();
    client.chat(ask(16, None)).await.unwrap();
    let started = Instant::now();
    let deadline = started + Duration::from_secs(10);
    let result = client.chat(ask(16, Some(deadline))).await;
    assert!(matches!(result, Err(LlmError::DeadlineExceeded)), "{result:?}");
    // Known at once, not at the deadline.
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    // A waiter that is dropped sends nothing either.
    let dropped = tokio::time::timeout(Duration::from_millis(100), client.chat(ask(16, None))).await;
    assert!(dropped.is_err());
    assert_eq!(server.request_count(), 1);
}

#[tokio::test]
async fn every_retry_takes_a_request_from_the_bucket() {
    let server = ScriptedLlm::start().await;
    server.push(Reply::status(429));
    server.set_handler(usage_handler(5, 5));
    let client = OpenAiClient::new(config(&server, 2, 0)).unwrap();
    let response = client.chat(ask(16, None)).await.unwrap();
    assert_eq!(response.usage.retries, 1);
    assert_eq!(server.request_count(), 2);
    // The 429 and its retry took both requests of the minute.
    let result = client.chat(ask(16, Some(Instant::now() + Duration::from_secs(10)))).await;
    assert!(matches!(result, Err(LlmError::DeadlineExceeded)), "{result:?}");
    assert_eq!(server.request_count(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zero_means_no_limit() {
    let calls = 120;
    let run = |rpm: u32, tpm: u64| async move {
        let server = ScriptedLlm::start().await;
        server.set_handler(usage_handler(5, 5));
        let client = OpenAiClient::new(config(&server, rpm, tpm)).unwrap();
        let deadline = Instant::now() + Duration::from_secs(4);
        let (ok, deadline_errors) = concurrent(&client, calls, 16, Some(deadline)).await;
        assert_eq!(ok + deadline_errors, calls);
        assert_eq!(server.request_count(), ok);
        ok
    };
    // No limit: every call goes within the deadline.
    assert_eq!(run(0, 0).await, calls);
    // The same calls under 60 requests a minute: the bucket's 60, plus about one a second.
    let limited = run(60, 0).await;
    assert!((60..=65).contains(&limited), "{limited}");
    // And under 600 tokens a minute (each call reserves 16 + 2 and uses 10): at most the bucket
    // and four seconds of refill, 64 calls' use.
    let limited = run(0, 600).await;
    assert!((30..=70).contains(&limited), "{limited}");
}
