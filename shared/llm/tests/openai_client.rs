//! The OpenAI-compatible client against the scripted server on a loopback port.

use std::time::{Duration, Instant};

use assay_llm::{
    BreakerState, ChatModel, ChatRequest, EmbeddingModel, EmbeddingRequest, FinishReason, LlmError, MaxTokensField,
    Message, OpenAiClient, OpenAiConfig, ResponseFormat, TokenLogprob,
};
use assay_testkit::{Reply, ScriptedLlm, embedding_handler, eventually, hash_embedding};
use serde_json::json;

fn config(server: &ScriptedLlm) -> OpenAiConfig {
    OpenAiConfig {
        base_url: server.base_url(),
        default_model: "test-model".into(),
        embedding_model: "test-embed".into(),
        base_backoff: Duration::from_millis(10),
        max_backoff: Duration::from_millis(50),
        request_timeout: Duration::from_secs(20),
        // Requests are counted one per attempt: only the last attempt is hedged here (the
        // hedging tests use `hedging_client`).
        adaptive_timeout: assay_llm::AdaptiveTimeout { hedge_factor: 0.0, ..assay_llm::AdaptiveTimeout::default() },
        ..OpenAiConfig::default()
    }
}

fn client(server: &ScriptedLlm) -> OpenAiClient {
    OpenAiClient::new(config(server)).unwrap()
}

fn ask(text: &str) -> ChatRequest {
    ChatRequest { messages: vec![Message::system("be brief"), Message::user(text)], ..ChatRequest::default() }
}

fn schema() -> serde_json::Value {
    json!({"type": "object", "properties": {"score": {"type": "integer"}}, "required": ["score"]})
}

fn schema_request() -> ChatRequest {
    ChatRequest {
        response_format: ResponseFormat::JsonSchema { name: "score".into(), schema: schema() },
        ..ask("rate it")
    }
}

#[tokio::test]
async fn plain_call_sends_openai_request_and_parses_reply() {
    let server = ScriptedLlm::start().await;
    server.push(Reply::text("hello").usage(11, 2));
    let config = OpenAiConfig {
        api_key: Some("sk-test".into()),
        max_tokens_field: MaxTokensField::MaxCompletionTokens,
        ..config(&server)
    };
    let client = OpenAiClient::new(config).unwrap();
    let response = client.chat(ChatRequest { max_tokens: Some(9), temperature: Some(0.0), ..ask("hi") }).await.unwrap();
    assert_eq!(response.text, "hello");
    assert_eq!(response.finish_reason, FinishReason::Stop);
    assert_eq!(response.model, "test-model");
    assert_eq!(response.usage.calls, 1);
    assert_eq!(response.usage.prompt_tokens, 11);
    assert_eq!(response.usage.completion_tokens, 2);
    assert_eq!(response.usage.retries, 0);
    assert!(response.json.is_none() && response.first_token_logprobs.is_none());
    assert!(!response.cached && !response.schema_fallback);

    let requests = server.requests();
    assert_eq!(requests.len(), 1);
    let request = &requests[0];
    assert_eq!(request.method, "POST");
    assert_eq!(request.path, "/v1/chat/completions");
    assert_eq!(request.header("authorization"), Some("Bearer sk-test"));
    assert_eq!(request.body["model"], "test-model");
    assert_eq!(request.body["max_completion_tokens"], 9);
    assert_eq!(request.body["messages"][1], json!({"role": "user", "content": "hi"}));
    assert!(request.body.get("response_format").is_none());
    assert!(request.body.get("logprobs").is_none());
}

#[tokio::test]
async fn retry_after_429_is_honoured() {
    let server = ScriptedLlm::start().await;
    server.push(Reply::status(429).retry_after(1)).push(Reply::text("ok"));
    let client = client(&server);
    let started = Instant::now();
    let response = client.chat(ask("q")).await.unwrap();
    let elapsed = started.elapsed();
    assert_eq!(response.text, "ok");
    assert_eq!(response.usage.retries, 1);
    assert_eq!(server.request_count(), 2);
    assert!(elapsed >= Duration::from_secs(1), "waited only {elapsed:?} despite Retry-After: 1");
}

#[tokio::test]
async fn deterministic_errors_are_not_retried() {
    let server = ScriptedLlm::start().await;
    let client = client(&server);

    server.push(Reply::status(501));
    let err = client.chat(ask("q")).await.unwrap_err();
    assert!(matches!(err, LlmError::Unsupported(_)), "{err:?}");
    assert_eq!(server.request_count(), 1);

    server.push(Reply::status(400).body(r#"{"error":{"message":"bad parameter"}}"#));
    let err = client.chat(ask("q")).await.unwrap_err();
    assert!(matches!(&err, LlmError::InvalidRequest(message) if message.contains("bad parameter")), "{err:?}");
    assert_eq!(server.request_count(), 2);

    server.push(Reply::status(422));
    assert!(matches!(client.chat(ask("q")).await, Err(LlmError::InvalidRequest(_))));
    server.push(Reply::status(404));
    assert!(matches!(client.chat(ask("q")).await, Err(LlmError::InvalidRequest(_))));
    server.push(Reply::status(401));
    assert!(matches!(client.chat(ask("q")).await, Err(LlmError::Unauthorized(_))));
    server.push(Reply::status(403));
    assert!(matches!(client.chat(ask("q")).await, Err(LlmError::Unauthorized(_))));
    assert_eq!(server.request_count(), 6);
    assert_eq!(client.breaker_state(), BreakerState::Closed);
}

#[tokio::test]
async fn schema_rejected_with_400_falls_back_to_json_object_then_prompt_and_is_remembered() {
    let server = ScriptedLlm::start().await;
    server
        .push(Reply::status(400).body(r#"{"error":{"message":"response_format json_schema is not supported"}}"#))
        .push(Reply::status(400).body(r#"{"error":{"message":"response_format json_object is not supported"}}"#))
        .push(Reply::text("Here it is:\n```json\n{\"score\": 4}\n```"));
    let client = client(&server);
    let response = client.chat(schema_request()).await.unwrap();
    assert_eq!(response.json, Some(json!({"score": 4})));
    assert!(response.schema_fallback);
    assert_eq!(response.usage.schema_fallbacks, 2);
    assert_eq!(response.usage.calls, 3);
    assert!(client.schema_rejected());
    assert_eq!(client.schema_delivery(), "prompt");

    let requests = server.requests();
    assert_eq!(requests.len(), 3);
    let first = &requests[0].body;
    assert_eq!(first["response_format"]["type"], "json_schema");
    assert_eq!(first["response_format"]["json_schema"]["name"], "score");
    assert_eq!(first["response_format"]["json_schema"]["strict"], true);
    assert_eq!(first["response_format"]["json_schema"]["schema"], schema());
    let second = &requests[1];
    assert_eq!(second.body["response_format"], json!({"type": "json_object", "schema": schema()}));
    assert!(second.last_user_message().unwrap().contains(&schema().to_string()));
    let third = &requests[2];
    assert!(third.body.get("response_format").is_none());
    let prompt = third.last_user_message().unwrap();
    assert!(prompt.starts_with("rate it"), "{prompt}");
    assert!(prompt.contains("JSON schema"), "{prompt}");
    assert!(prompt.contains(&schema().to_string()), "{prompt}");

    // Later calls go straight to the prompt form.
    server.push(Reply::json(json!({"score": 2})));
    let response = client.chat(schema_request()).await.unwrap();
    assert_eq!(response.json, Some(json!({"score": 2})));
    assert!(response.schema_fallback);
    assert_eq!(response.usage.schema_fallbacks, 0);
    let requests = server.requests();
    assert_eq!(requests.len(), 4);
    assert!(requests[3].body.get("response_format").is_none());
}

#[tokio::test]
async fn json_object_with_schema_is_remembered_when_it_works() {
    let server = ScriptedLlm::start().await;
    server
        .push(Reply::status(400).body(r#"{"error":{"message":"response_format type json_schema unknown"}}"#))
        .push(Reply::json(json!({"score": 5})));
    let client = client(&server);
    let response = client.chat(schema_request()).await.unwrap();
    assert_eq!(response.json, Some(json!({"score": 5})));
    assert_eq!(client.schema_delivery(), "json_object");
    server.push(Reply::json(json!({"score": 1})));
    client.chat(schema_request()).await.unwrap();
    let requests = server.requests();
    assert_eq!(requests[2].body["response_format"]["type"], "json_object");
}

#[tokio::test]
async fn schema_rejected_with_a_500_naming_response_format_falls_back_without_retrying() {
    // llama-cpp-python's server answers an unknown response_format type with a 500 validation error.
    let server = ScriptedLlm::start().await;
    server
        .push(Reply::status(500).body(
            r#"{"error":{"message":"1 validation error: body.response_format.type: Input should be 'text' or 'json_object'"}}"#,
        ))
        .push(Reply::json(json!({"score": 3})));
    let client = client(&server);
    let response = client.chat(schema_request()).await.unwrap();
    assert_eq!(response.json, Some(json!({"score": 3})));
    assert!(response.schema_fallback);
    assert_eq!(response.usage.retries, 0, "a schema complaint is not retried");
    assert_eq!(server.request_count(), 2);
    assert_eq!(client.schema_delivery(), "json_object");
    assert!(client.schema_rejected());
    // A plain 500 (not about the schema) is still transient and retried.
    server.push(Reply::status(500)).push(Reply::json(json!({"score": 1})));
    let response = client.chat(ask("q")).await.unwrap();
    assert_eq!(response.usage.retries, 1);
}

/// A server that accepts `json_schema` with a 200 and ignores it (vLLM with a key it no longer
/// knows, llama.cpp with a grammar it cannot parse), and enforces `json_object` with a schema.
fn ignores_json_schema(request: &assay_testkit::RecordedRequest) -> Reply {
    match request.body["response_format"]["type"].as_str() {
        Some("json_schema") => Reply::json(json!({"rating": "good"})),
        _ => Reply::json(json!({"score": 4})),
    }
}

#[tokio::test]
async fn a_form_accepted_and_ignored_is_noticed_and_left() {
    let server = ScriptedLlm::start().await;
    server.set_handler(ignores_json_schema);
    let client = client(&server);
    assert_eq!(client.structured_output("test-model"), Some("json_schema"));
    for call in 1..=3 {
        let response = client.chat(schema_request()).await.unwrap();
        assert_eq!(response.json, Some(json!({"rating": "good"})), "the reply is returned as it is");
        assert_eq!(response.usage.schema_violations, 1, "call {call}: the broken schema is counted");
        assert_eq!(response.usage.calls, 1, "nothing is sent again");
        let expected = if call < 3 { "json_schema" } else { "json_object" };
        assert_eq!(client.schema_delivery(), expected, "call {call}");
    }
    assert_eq!(client.structured_output("test-model"), Some("json_object"), "later records say so");
    assert_eq!(client.structured_output("other-model"), Some("json_schema"), "per model");
    let response = client.chat(schema_request()).await.unwrap();
    assert_eq!(response.json, Some(json!({"score": 4})));
    assert_eq!(response.usage.schema_violations, 0);
    assert!(response.schema_fallback);
    let requests = server.requests();
    assert_eq!(requests.len(), 4);
    assert_eq!(requests[3].body["response_format"]["type"], "json_object");
    assert!(requests[3].last_user_message().unwrap().contains(&schema().to_string()), "the schema is in the prompt");
    // A form that is enforced is never left: replies that match stay where they are.
    for _ in 0..5 {
        client.chat(schema_request()).await.unwrap();
    }
    assert_eq!(client.schema_delivery(), "json_object");
}

#[tokio::test]
async fn replies_cut_or_refused_and_fixed_forms_are_no_evidence() {
    let server = ScriptedLlm::start().await;
    let client = client(&server);
    // Cut at the token limit, or empty (a refusal): counted, but they say nothing of the form.
    for _ in 0..4 {
        server.push(Reply::text("{\"sco").finish_reason("length"));
        server.push(Reply::text(""));
    }
    for _ in 0..8 {
        let response = client.chat(schema_request()).await.unwrap();
        assert_eq!(response.usage.schema_violations, 1);
    }
    assert_eq!(client.schema_delivery(), "json_schema");
    // Text where a schema was asked: the same evidence as JSON that breaks it.
    server.push_all([Reply::text("4"), Reply::text("four"), Reply::json(json!({"score": "4"}))]);
    for _ in 0..3 {
        client.chat(schema_request()).await.unwrap();
    }
    assert_eq!(client.schema_delivery(), "json_object");

    // A form the configuration fixes is counted, never left.
    let fixed = OpenAiClient::new(OpenAiConfig {
        structured_output: assay_llm::StructuredOutput::JsonSchema,
        ..config(&server)
    })
    .unwrap();
    server.set_handler(ignores_json_schema);
    for _ in 0..5 {
        assert_eq!(fixed.chat(schema_request()).await.unwrap().usage.schema_violations, 1);
    }
    assert_eq!(fixed.structured_output("test-model"), Some("json_schema"));
    assert!(server.requests().iter().rev().take(5).all(|r| r.body["response_format"]["type"] == "json_schema"));
}

fn choice_request() -> ChatRequest {
    ChatRequest {
        response_format: ResponseFormat::Choice(vec!["YES".into(), "NO".into()]),
        top_logprobs: Some(5),
        ..ask("Is the sky blue?")
    }
}

#[tokio::test]
async fn a_choice_is_held_to_its_options_by_a_grammar_where_the_server_takes_one() {
    // llama.cpp's servers take the grammar: the reply's first token is an answer.
    let server = ScriptedLlm::start().await;
    server.push(Reply::with_logprobs("YES", vec![("YES", -0.2), ("NO", -1.7)]));
    let llama = client(&server);
    let reply = llama.chat(choice_request()).await.unwrap();
    assert_eq!(reply.text, "YES");
    let body = &server.requests()[0].body;
    let grammar = body["grammar"].as_str().expect("a grammar");
    assert!(grammar.contains("\"YES\"") && grammar.contains("\"NO\""), "{grammar}");
    assert!(server.requests()[0].last_user_message().unwrap().contains("Answer with exactly one of: YES, NO"));

    // OpenAI refuses an argument it does not know: the choice goes again without it, once.
    let openai = ScriptedLlm::start().await;
    openai
        .push(Reply::status(400).body(
            r#"{"error":{"message":"Unrecognized request argument supplied: grammar","type":"invalid_request_error","param":null,"code":null}}"#,
        ))
        .push(Reply::text("NO"))
        .push(Reply::text("YES"));
    let remote = client(&openai);
    let reply = remote.chat(choice_request()).await.unwrap();
    assert_eq!(reply.text, "NO");
    assert_eq!((reply.usage.calls, reply.usage.schema_fallbacks), (2, 1), "the refused request is counted");
    let reply = remote.chat(choice_request()).await.unwrap();
    assert_eq!((reply.text.as_str(), reply.usage.calls), ("YES", 1), "later choices go without it at once");
    let requests = openai.requests();
    assert!(requests[0].body.get("grammar").is_some());
    assert!(requests[1].body.get("grammar").is_none() && requests[2].body.get("grammar").is_none());
    // Any other 400 is the request's own fault: returned, and the grammar kept.
    let other = ScriptedLlm::start().await;
    other.push(Reply::status(400).body(r#"{"error":{"message":"messages must not be empty"}}"#));
    let client = client(&other);
    assert!(matches!(client.chat(choice_request()).await, Err(LlmError::InvalidRequest(_))));
    other.push(Reply::text("YES"));
    client.chat(choice_request()).await.unwrap();
    assert!(other.requests()[1].body.get("grammar").is_some());
}

#[tokio::test]
async fn schema_accepted_natively() {
    let server = ScriptedLlm::start().await;
    server.push(Reply::json(json!({"score": 5})));
    let client = client(&server);
    let response = client.chat(schema_request()).await.unwrap();
    assert_eq!(response.json, Some(json!({"score": 5})));
    assert!(!response.schema_fallback);
    assert_eq!(server.requests()[0].last_user_message().as_deref(), Some("rate it"));
}

#[tokio::test]
async fn persistent_503_gives_unavailable_after_max_retries() {
    let server = ScriptedLlm::start().await;
    server.set_handler(|_| Reply::status(503));
    let client = OpenAiClient::new(OpenAiConfig { max_retries: 3, ..config(&server) }).unwrap();
    let err = client.chat(ask("q")).await.unwrap_err();
    assert!(matches!(err, LlmError::Unavailable(_)), "{err:?}");
    assert_eq!(server.request_count(), 4);
}

#[tokio::test]
async fn transient_5xx_and_408_are_retried() {
    let server = ScriptedLlm::start().await;
    server.push_all([
        Reply::status(500),
        Reply::status(502),
        Reply::status(504),
        Reply::status(408),
        Reply::text("ok"),
    ]);
    let client = client(&server);
    let response = client.chat(ask("q")).await.unwrap();
    assert_eq!(response.text, "ok");
    assert_eq!(response.usage.retries, 4);
    assert_eq!(server.request_count(), 5);
}

#[tokio::test]
async fn rate_limit_exhausted_is_rate_limited() {
    let server = ScriptedLlm::start().await;
    server.set_handler(|_| Reply::status(429));
    let client = OpenAiClient::new(OpenAiConfig { max_retries: 1, ..config(&server) }).unwrap();
    assert!(matches!(client.chat(ask("q")).await, Err(LlmError::RateLimited(_))));
    assert_eq!(server.request_count(), 2);
}

#[tokio::test]
async fn a_retry_after_beyond_max_retry_after_fails_at_once_without_a_deadline() {
    let server = ScriptedLlm::start().await;
    server.push(Reply::status(429).retry_after(3600)).push(Reply::text("ok"));
    let client = client(&server);
    assert_eq!(client.config().max_retry_after, Duration::from_secs(30), "the default cap");
    let err = tokio::time::timeout(Duration::from_secs(10), client.chat(ask("q")))
        .await
        .expect("sat through an hour's Retry-After")
        .unwrap_err();
    assert!(matches!(err, LlmError::RateLimited(_)), "{err:?}");
    assert_eq!(server.request_count(), 1, "no retry");
}

#[tokio::test]
async fn deadline_caps_retry_after() {
    let server = ScriptedLlm::start().await;
    server.set_handler(|_| Reply::status(429).retry_after(30));
    let client = client(&server);
    let started = Instant::now();
    let request = ChatRequest { deadline: Some(Instant::now() + Duration::from_secs(1)), ..ask("q") };
    let err = client.chat(request).await.unwrap_err();
    let elapsed = started.elapsed();
    assert!(elapsed < Duration::from_secs(2), "took {elapsed:?}");
    assert!(matches!(err, LlmError::RateLimited(_)), "{err:?}");
    assert_eq!(server.request_count(), 1);
}

#[tokio::test]
async fn deadline_bounds_a_slow_backend() {
    let server = ScriptedLlm::start().await;
    server.push(Reply::hang());
    let client = client(&server);
    let started = Instant::now();
    let request = ChatRequest { deadline: Some(Instant::now() + Duration::from_millis(300)), ..ask("q") };
    let err = client.chat(request).await.unwrap_err();
    assert_eq!(err, LlmError::DeadlineExceeded);
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(eventually(Duration::from_secs(5), || server.cancelled_count() == 1).await);
    assert_eq!(server.request_count(), 1, "no retry after the deadline");
}

#[tokio::test]
async fn odd_finish_reason_missing_usage_and_null_content_parse() {
    let server = ScriptedLlm::start().await;
    server
        .push(Reply::text("hi").finish_reason("weird").no_usage())
        .push(Reply::text("x").null_finish_reason())
        .push(Reply::text("cut").finish_reason("length"))
        .push(Reply::status(200).body(
            r#"{"choices":[{"index":0,"message":{"role":"assistant","content":null},"finish_reason":"content_filter"}]}"#,
        ));
    let client = client(&server);
    let response = client.chat(ask("q")).await.unwrap();
    assert_eq!(response.text, "hi");
    assert_eq!(response.finish_reason, FinishReason::Other("weird".into()));
    assert_eq!(response.usage.calls, 1);
    assert_eq!((response.usage.prompt_tokens, response.usage.completion_tokens), (0, 0));
    assert_eq!(client.chat(ask("q")).await.unwrap().finish_reason, FinishReason::Stop);
    assert_eq!(client.chat(ask("q")).await.unwrap().finish_reason, FinishReason::Length);
    let response = client.chat(ask("q")).await.unwrap();
    assert_eq!(response.text, "");
    assert_eq!(response.finish_reason, FinishReason::ContentFilter);
    assert_eq!(response.model, "test-model");
}

#[tokio::test]
async fn malformed_200_is_retried_once() {
    let server = ScriptedLlm::start().await;
    server.push(Reply::malformed()).push(Reply::text("ok"));
    let client = client(&server);
    let response = client.chat(ask("q")).await.unwrap();
    assert_eq!(response.text, "ok");
    assert_eq!(response.usage.retries, 1);

    server.push(Reply::truncated()).push(Reply::truncated()).push(Reply::text("never reached"));
    let err = client.chat(ask("q")).await.unwrap_err();
    assert!(matches!(err, LlmError::MalformedReply(_)), "{err:?}");
    assert_eq!(server.request_count(), 4);
}

#[tokio::test]
async fn logprobs_are_requested_and_parsed() {
    let server = ScriptedLlm::start().await;
    server.push(Reply::with_logprobs("yes", vec![("YES", -0.1), ("NO", -2.3)])).push(Reply::text("NO"));
    let client = client(&server);
    let request = ChatRequest {
        top_logprobs: Some(2),
        response_format: ResponseFormat::Choice(vec!["YES".into(), "NO".into()]),
        max_tokens: Some(1),
        ..ask("is the sky blue?")
    };
    let response = client.chat(request.clone()).await.unwrap();
    assert_eq!(response.text, "YES", "choice replies are normalised to the option's spelling");
    assert_eq!(
        response.first_token_logprobs,
        Some(vec![
            TokenLogprob { token: "YES".into(), logprob: -0.1 },
            TokenLogprob { token: "NO".into(), logprob: -2.3 }
        ])
    );
    let sent = &server.requests()[0];
    assert_eq!(sent.body["logprobs"], true);
    assert_eq!(sent.body["top_logprobs"], 2);
    assert!(sent.last_user_message().unwrap().ends_with("Answer with exactly one of: YES, NO"));

    // A backend that returns no logprobs.
    let response = client.chat(request).await.unwrap();
    assert_eq!(response.text, "NO");
    assert_eq!(response.first_token_logprobs, None);
}

#[tokio::test]
async fn logprobs_not_sent_when_unsupported() {
    let server = ScriptedLlm::start().await;
    server.push(Reply::with_logprobs("YES", vec![("YES", -0.1)]));
    let client = OpenAiClient::new(OpenAiConfig { supports_logprobs: false, ..config(&server) }).unwrap();
    let response = client.chat(ChatRequest { top_logprobs: Some(2), ..ask("q") }).await.unwrap();
    assert_eq!(response.first_token_logprobs, None);
    assert!(server.requests()[0].body.get("logprobs").is_none());
}

#[tokio::test]
async fn circuit_breaker_opens_fails_fast_and_recovers() {
    let server = ScriptedLlm::start().await;
    server.push_all([Reply::status(503), Reply::status(503)]);
    let client = OpenAiClient::new(OpenAiConfig {
        max_retries: 0,
        breaker_failures: 2,
        breaker_cooldown: Duration::from_millis(300),
        ..config(&server)
    })
    .unwrap();
    assert!(matches!(client.chat(ask("q")).await, Err(LlmError::Unavailable(_))));
    assert_eq!(client.breaker_state(), BreakerState::Closed);
    assert!(matches!(client.chat(ask("q")).await, Err(LlmError::Unavailable(_))));
    assert_eq!(client.breaker_state(), BreakerState::Open);

    let started = Instant::now();
    let err = client.chat(ask("q")).await.unwrap_err();
    assert_eq!(err, LlmError::CircuitOpen);
    assert!(started.elapsed() < Duration::from_millis(100));
    assert_eq!(server.request_count(), 2, "an open breaker does not call the server");

    assert!(eventually(Duration::from_secs(5), || client.breaker_state() == BreakerState::HalfOpen).await);
    server.push(Reply::text("back"));
    assert_eq!(client.chat(ask("q")).await.unwrap().text, "back");
    assert_eq!(client.breaker_state(), BreakerState::Closed);
    assert_eq!(server.request_count(), 3);
}

/// One model the server cannot serve (500 for it alone) opens that model's breaker, not the
/// backend's: calls to the other models go on being sent. The server itself failing (503) is the
/// backend's.
#[tokio::test]
async fn a_failing_model_opens_its_own_breaker_not_the_backends() {
    let server = ScriptedLlm::start().await;
    server.set_handler(|r| match r.model() {
        Some("broken-model") => Reply::status(500).body(r#"{"error":{"message":"model broken-model failed to load"}}"#),
        _ => Reply::text("fine"),
    });
    let client = OpenAiClient::new(OpenAiConfig {
        max_retries: 0,
        breaker_failures: 2,
        breaker_cooldown: Duration::from_secs(60),
        ..config(&server)
    })
    .unwrap();
    let broken = || ChatRequest { model: Some("broken-model".into()), ..ask("q") };
    for _ in 0..2 {
        assert!(matches!(client.chat(broken()).await, Err(LlmError::Unavailable(_))));
    }
    assert_eq!(client.model_breaker_state("broken-model"), BreakerState::Open);
    assert_eq!(client.chat(broken()).await.unwrap_err(), LlmError::CircuitOpen, "the broken model fails fast");
    assert_eq!(server.request_count(), 2);
    assert_eq!(client.breaker_state(), BreakerState::Closed, "the backend answered: it is up");
    for _ in 0..3 {
        assert_eq!(client.chat(ask("q")).await.unwrap().text, "fine", "another model is still served");
    }
    assert_eq!(server.request_count(), 5);
}

#[tokio::test]
async fn dropping_the_call_cancels_the_backend_request() {
    let server = ScriptedLlm::start().await;
    server.push(Reply::hang());
    let client = client(&server);
    let outcome = tokio::time::timeout(Duration::from_millis(300), client.chat(ask("q"))).await;
    assert!(outcome.is_err(), "the hanging call must not finish");
    assert!(
        eventually(Duration::from_secs(5), || server.cancelled_count() == 1).await,
        "server saw {} cancellations",
        server.cancelled_count()
    );
    assert_eq!(server.request_count(), 1);
    assert_eq!(server.completed_count(), 0);
    // The client is still usable and the breaker did not count the abandoned call.
    server.push(Reply::text("ok"));
    assert_eq!(client.chat(ask("q")).await.unwrap().text, "ok");
    assert_eq!(client.breaker_state(), BreakerState::Closed);
}

#[tokio::test]
async fn concurrency_is_limited_per_client() {
    let server = ScriptedLlm::start().await;
    server.set_handler(|_| Reply::text("ok").delay(Duration::from_millis(200)));
    let client = OpenAiClient::new(OpenAiConfig { max_concurrency: 1, ..config(&server) }).unwrap();
    let started = Instant::now();
    let (a, b) = tokio::join!(client.chat(ask("a")), client.chat(ask("b")));
    a.unwrap();
    b.unwrap();
    assert!(started.elapsed() >= Duration::from_millis(400), "calls overlapped: {:?}", started.elapsed());
}

#[tokio::test]
async fn embeddings_come_back_in_input_order() {
    let server = ScriptedLlm::start().await;
    server.set_handler(embedding_handler(8));
    let client = client(&server);
    let texts = vec!["alpha".to_owned(), "beta".to_owned(), "gamma".to_owned()];
    let response =
        client.embed(EmbeddingRequest { texts: texts.clone(), ..EmbeddingRequest::default() }).await.unwrap();
    let expected: Vec<Vec<f32>> = texts.iter().map(|t| hash_embedding(t, 8)).collect();
    assert_eq!(response.vectors, expected);
    assert_eq!(response.model, "test-embed");
    assert_eq!(response.usage.calls, 1);
    let sent = &server.requests()[0];
    assert_eq!(sent.path, "/v1/embeddings");
    assert_eq!(sent.body, json!({"model": "test-embed", "input": texts}));

    // Out-of-order `data` is sorted by index; a 503 is retried on this path too.
    server.push(Reply::status(503)).push(Reply::embeddings(vec![vec![1.0], vec![2.0]]).reversed_data());
    let response = client
        .embed(EmbeddingRequest { texts: vec!["x".into(), "y".into()], ..EmbeddingRequest::default() })
        .await
        .unwrap();
    assert_eq!(response.vectors, vec![vec![1.0], vec![2.0]]);
    assert_eq!(response.usage.retries, 1);

    // A count mismatch is a malformed reply (retried once, then returned).
    server.push(Reply::embeddings(vec![vec![1.0]])).push(Reply::embeddings(vec![vec![1.0]]));
    let err = client
        .embed(EmbeddingRequest { texts: vec!["x".into(), "y".into()], ..EmbeddingRequest::default() })
        .await
        .unwrap_err();
    assert!(matches!(err, LlmError::MalformedReply(_)), "{err:?}");
}

#[tokio::test]
async fn connection_refused_is_unavailable_after_retries() {
    // Bind then drop a listener to get a port nobody listens on.
    let port = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
    };
    let client = OpenAiClient::new(OpenAiConfig {
        base_url: format!("http://127.0.0.1:{port}/v1"),
        max_retries: 2,
        base_backoff: Duration::from_millis(1),
        max_backoff: Duration::from_millis(5),
        ..OpenAiConfig::default()
    })
    .unwrap();
    let err = client.chat(ask("q")).await.unwrap_err();
    assert!(matches!(err, LlmError::Unavailable(_)), "{err:?}");
}

#[tokio::test]
async fn a_400_that_is_not_about_the_schema_is_not_remembered() {
    let server = ScriptedLlm::start().await;
    server
        .push(Reply::status(400))
        .push(Reply::status(400).body("context too long"))
        .push(Reply::status(400).body("context too long"))
        .push(Reply::status(400).body("context too long"));
    let client = client(&server);
    let err = client.chat(schema_request()).await.unwrap_err();
    assert!(matches!(&err, LlmError::InvalidRequest(m) if m.contains("context too long")), "{err:?}");
    // The bare 400 could be the form: a weaker one is tried; its 400 refuses the request itself
    // (the context), which no weaker form would change: it fails there.
    assert_eq!(server.request_count(), 2, "the next form tried once, then the request refused");
    assert!(!client.schema_rejected());
    assert_eq!(client.schema_delivery(), "json_schema");
}

/// Issue 60: a context-length 400 (vLLM's wording, llama.cpp's `exceed_context_size_error`) is
/// not a refused structured-output form: the call fails at once, one request, nothing remembered.
/// Before, it walked the whole ladder: four requests, each refused the same way.
#[tokio::test]
async fn a_context_length_400_fails_at_once_without_walking_the_ladder() {
    for body in [
        r#"{"object":"error","message":"This model's maximum context length is 2048 tokens. However, you requested 4096 tokens (3900 in the messages, 196 in the completion).","type":"BadRequestError","code":400}"#,
        r#"{"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":4100,"n_ctx":2048}}"#,
    ] {
        let server = ScriptedLlm::start().await;
        server.set_handler(move |_| Reply::status(400).body(body));
        let client = client(&server);
        let err = client.chat(schema_request()).await.unwrap_err();
        assert!(matches!(&err, LlmError::InvalidRequest(_)), "{err:?}");
        assert_eq!(server.request_count(), 1, "{body}");
        assert!(!client.schema_rejected());
        assert_eq!(client.schema_delivery(), "json_schema");
    }
}

/// A handler that answers every chat call with its prompt after `latency`, except that the first
/// attempt of every prompt in `hang_first` hangs.
fn hang_first_attempts(
    latency: Duration,
    hang_first: Vec<String>,
) -> impl Fn(&assay_testkit::RecordedRequest) -> Reply + Send + Sync + 'static {
    let seen = std::sync::Mutex::new(std::collections::HashSet::new());
    move |request| {
        let prompt = request.last_user_message().unwrap_or_default();
        let first = seen.lock().unwrap().insert(prompt.clone());
        if first && hang_first.contains(&prompt) {
            Reply::hang()
        } else {
            Reply::text(format!("echo {prompt}")).delay(latency)
        }
    }
}

/// Four calls at once, a 30 s ceiling, adaptive timeouts from a 100 ms floor, no hedging before
/// the last attempt (these tests are about the timeouts).
fn adaptive_client(server: &ScriptedLlm) -> OpenAiClient {
    OpenAiClient::new(OpenAiConfig {
        max_concurrency: 4,
        request_timeout: Duration::from_secs(30),
        adaptive_timeout: assay_llm::AdaptiveTimeout {
            enabled: true,
            floor: Duration::from_millis(100),
            multiplier: 4.0,
            hedge_factor: 0.0,
        },
        ..config(server)
    })
    .unwrap()
}

/// A client whose attempt timeouts cannot be what rescues a hang (a 20 s floor), hedging after
/// twice the usual latency, with a fixed concurrency limit of `slots`.
fn hedging_client(server: &ScriptedLlm, slots: usize) -> OpenAiClient {
    OpenAiClient::new(OpenAiConfig {
        max_concurrency: slots,
        initial_concurrency: 0,
        request_timeout: Duration::from_secs(30),
        adaptive_timeout: assay_llm::AdaptiveTimeout {
            enabled: true,
            floor: Duration::from_secs(20),
            multiplier: 4.0,
            hedge_factor: 2.0,
        },
        ..config(server)
    })
    .unwrap()
}

/// Every call answered "echo <its last user message>" after `delay`.
fn echo_after(server: &ScriptedLlm, delay: Duration) {
    server
        .set_handler(move |r| Reply::text(format!("echo {}", r.last_user_message().unwrap_or_default())).delay(delay));
}

/// `n` calls, four at a time, so the client has samples of the backend's latency and has seen it
/// serve calls at once (no duplicate goes to a server that may queue it behind its original).
async fn warm(client: &OpenAiClient, n: usize) {
    for burst in (0..n).collect::<Vec<_>>().chunks(4) {
        let calls = burst.iter().map(|i| client.chat(ask(&format!("warm{i}"))));
        for reply in futures::future::join_all(calls).await {
            reply.unwrap();
        }
    }
}

#[tokio::test]
async fn a_hung_first_attempt_is_answered_by_its_hedge_long_before_any_timeout() {
    let server = ScriptedLlm::start().await;
    server.set_handler(hang_first_attempts(Duration::from_millis(20), vec!["slow".into()]));
    let client = hedging_client(&server, 4);
    warm(&client, 10).await;
    let started = Instant::now();
    assert_eq!(client.chat(ask("slow")).await.unwrap().text, "echo slow");
    // Without the hedge the first attempt would wait for its 20 s floor.
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    assert_eq!(server.request_count(), 12, "the hung attempt and one duplicate, no retry");
    assert!(
        eventually(Duration::from_secs(5), || server.cancelled_count() == 1).await,
        "the hung original is dropped once the duplicate answers"
    );
}

#[tokio::test]
async fn a_failed_hedge_is_replaced_while_the_attempt_still_hangs() {
    let server = ScriptedLlm::start().await;
    echo_after(&server, Duration::from_millis(20));
    let client = hedging_client(&server, 4);
    warm(&client, 10).await;
    // The attempt hangs, its first duplicate is refused (429), the second answers.
    server.push(Reply::hang()).push(Reply::status(429));
    let started = Instant::now();
    let reply = client.chat(ask("slow")).await.unwrap();
    assert_eq!(reply.text, "echo slow");
    assert_eq!(reply.usage.retries, 0, "answered by a duplicate of the first attempt, not a retry");
    // Without a second duplicate the attempt would wait for its 20 s floor.
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    assert_eq!(server.request_count(), 10 + 3, "the hung attempt, the refused duplicate, the one that answered");
}

/// The gap between the refused duplicate's arrival and its replacement's, when the attempt hangs,
/// its first duplicate is refused with `refused` and the second answers; calls take 100 ms, so a
/// duplicate goes out after 200 ms unanswered and the next after twice that.
async fn gap_before_a_refused_hedge_is_replaced(refused: Reply) -> Duration {
    let server = ScriptedLlm::start().await;
    echo_after(&server, Duration::from_millis(100));
    let client = hedging_client(&server, 4);
    warm(&client, 10).await;
    server.push(Reply::hang()).push(refused);
    assert_eq!(client.chat(ask("slow")).await.unwrap().text, "echo slow");
    let arrived: Vec<Instant> = server.exchanges().iter().skip(10).map(|e| e.received).collect();
    assert_eq!(arrived.len(), 3, "the hung attempt, the refused duplicate, the one that answered");
    assert!(arrived[1] - arrived[0] >= Duration::from_millis(150), "hedged before twice the usual latency");
    arrived[2] - arrived[1]
}

#[tokio::test]
async fn a_refused_hedge_is_replaced_after_the_retry_backoff_not_the_doubled_hedge_wait() {
    // The backoff here is at most 10 ms; the doubled hedge wait would be 400 ms.
    let gap = gap_before_a_refused_hedge_is_replaced(Reply::status(503)).await;
    assert!(gap < Duration::from_millis(250), "replaced {gap:?} after the refusal");
    // A server's Retry-After is a minimum for the replacement too.
    let gap = gap_before_a_refused_hedge_is_replaced(Reply::status(429).retry_after(1)).await;
    assert!(gap >= Duration::from_secs(1), "replaced {gap:?} after a 429 asking for 1 s");
}

#[tokio::test]
async fn refused_hedges_do_not_use_up_the_duplicates_of_a_hung_attempt() {
    let server = ScriptedLlm::start().await;
    echo_after(&server, Duration::from_millis(20));
    let client = hedging_client(&server, 4);
    warm(&client, 10).await;
    // As many refusals as an attempt may have duplicates: a fourth duplicate still goes out.
    server.push(Reply::hang()).push(Reply::status(429)).push(Reply::status(500)).push(Reply::status(503));
    let started = Instant::now();
    assert_eq!(client.chat(ask("slow")).await.unwrap().text, "echo slow");
    // With its duplicates used up the attempt would wait for its 20 s floor.
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    assert_eq!(server.request_count(), 10 + 5, "the hung attempt, three refused duplicates, the one that answered");
}

#[tokio::test]
async fn hangs_rescued_by_their_duplicates_do_not_cut_the_concurrency_limit() {
    let server = ScriptedLlm::start().await;
    echo_after(&server, Duration::from_millis(20));
    let client = OpenAiClient::new(OpenAiConfig {
        initial_concurrency: 16,
        max_concurrency: 16,
        request_timeout: Duration::from_secs(30),
        adaptive_timeout: assay_llm::AdaptiveTimeout {
            enabled: true,
            floor: Duration::from_secs(20),
            multiplier: 4.0,
            hedge_factor: 2.0,
        },
        ..config(&server)
    })
    .unwrap();
    warm(&client, 40).await;
    assert_eq!(client.concurrency_limit(), 16);
    // Five hangs in a row, each answered by its duplicate about 100 ms later: the hung requests'
    // waits are no latency of the backend's (read as one, five times the usual rose past the
    // latency tolerance and cut the limit).
    for i in 0..5 {
        server.push(Reply::hang());
        assert_eq!(client.chat(ask(&format!("slow{i}"))).await.unwrap().text, format!("echo slow{i}"));
    }
    assert_eq!(server.request_count(), 40 + 10, "each hang answered by one duplicate");
    assert_eq!(client.concurrency_limit(), 16, "rescued hangs are not overload");
}

#[tokio::test]
async fn fast_server_errors_are_no_latency_samples_for_the_concurrency_limit() {
    let server = ScriptedLlm::start().await;
    echo_after(&server, Duration::from_millis(20));
    let client =
        OpenAiClient::new(OpenAiConfig { initial_concurrency: 16, max_concurrency: 16, ..config(&server) }).unwrap();
    // A class's first answers are 500s back at once: taken as latencies they set its long-term
    // average near zero, and the ordinary 20 ms answers after them read as a rise.
    server.push(Reply::status(500)).push(Reply::status(502)).push(Reply::status(500));
    for i in 0..60 {
        client.chat(ask(&format!("q{i}"))).await.unwrap();
    }
    assert_eq!(server.request_count(), 63);
    assert_eq!(client.concurrency_limit(), 16, "fast 5xx are no latency");
}

#[tokio::test]
async fn a_hedge_never_queues_for_a_slot() {
    let server = ScriptedLlm::start().await;
    server.set_handler(hang_first_attempts(Duration::from_millis(20), vec!["slow".into()]));
    // One slot, held by the hung attempt itself: no duplicate can go out, so the attempt waits for
    // its timeout (the 20 s floor here would be too long for a test: 300 ms instead).
    let client = OpenAiClient::new(OpenAiConfig {
        max_concurrency: 1,
        initial_concurrency: 0,
        request_timeout: Duration::from_secs(30),
        adaptive_timeout: assay_llm::AdaptiveTimeout {
            enabled: true,
            floor: Duration::from_millis(300),
            multiplier: 4.0,
            hedge_factor: 2.0,
        },
        ..config(&server)
    })
    .unwrap();
    warm(&client, 10).await;
    let started = Instant::now();
    assert_eq!(client.chat(ask("slow")).await.unwrap().text, "echo slow");
    assert!(started.elapsed() >= Duration::from_millis(300), "answered before the timeout: {:?}", started.elapsed());
    assert_eq!(server.request_count(), 12, "the hung attempt, cut at its timeout, and one retry");
}

#[tokio::test]
async fn a_hung_attempt_is_cut_after_a_few_times_the_usual_latency_and_retried() {
    let server = ScriptedLlm::start().await;
    let prompts: Vec<String> = (0..50).map(|i| format!("q{i}")).collect();
    // 5% of calls (every 20th, after the first dozen have set the pace) hang on their first try.
    let hanging: Vec<String> = prompts.iter().skip(12).step_by(20).cloned().collect();
    assert_eq!(hanging.len(), 2);
    server.set_handler(hang_first_attempts(Duration::from_millis(20), hanging.clone()));
    let client = adaptive_client(&server);
    let started = Instant::now();
    let mut answers = Vec::new();
    for chunk in prompts.chunks(4) {
        let calls = chunk.iter().map(|p| client.chat(ask(p)));
        for reply in futures::future::join_all(calls).await {
            answers.push(reply.unwrap().text);
        }
    }
    let elapsed = started.elapsed();
    let expected: Vec<String> = prompts.iter().map(|p| format!("echo {p}")).collect();
    assert_eq!(answers, expected, "every call answers exactly as without the hangs");
    // Each hang costs about the floor (100 ms), not the 30 s ceiling.
    assert!(elapsed < Duration::from_secs(10), "took {elapsed:?}");
    assert_eq!(server.request_count(), prompts.len() + hanging.len(), "one retry per hung call");
    assert!(eventually(Duration::from_secs(5), || server.cancelled_count() == hanging.len()).await);
}

#[tokio::test]
async fn a_cold_start_hang_is_cut_once_other_calls_set_the_pace() {
    let server = ScriptedLlm::start().await;
    let prompts: Vec<String> = (0..12).map(|i| format!("q{i}")).collect();
    // The very first call hangs before the client has seen any latency at all.
    server.set_handler(hang_first_attempts(Duration::from_millis(10), vec!["q0".into()]));
    let client = adaptive_client(&server);
    let started = Instant::now();
    let calls = prompts.iter().map(|p| client.chat(ask(p)));
    let answers: Vec<String> = futures::future::join_all(calls).await.into_iter().map(|r| r.unwrap().text).collect();
    let expected: Vec<String> = prompts.iter().map(|p| format!("echo {p}")).collect();
    assert_eq!(answers, expected);
    assert!(started.elapsed() < Duration::from_secs(10), "took {:?}", started.elapsed());
    assert_eq!(server.request_count(), prompts.len() + 1);
}

#[tokio::test]
async fn without_adaptive_timeouts_a_hang_waits_for_the_ceiling() {
    let server = ScriptedLlm::start().await;
    server.set_handler(hang_first_attempts(Duration::from_millis(5), vec!["slow".into()]));
    let client = OpenAiClient::new(OpenAiConfig {
        request_timeout: Duration::from_millis(600),
        adaptive_timeout: assay_llm::AdaptiveTimeout { enabled: false, ..Default::default() },
        ..config(&server)
    })
    .unwrap();
    warm(&client, 10).await;
    let started = Instant::now();
    assert_eq!(client.chat(ask("slow")).await.unwrap().text, "echo slow");
    assert!(started.elapsed() >= Duration::from_millis(600), "cut before the ceiling: {:?}", started.elapsed());
}

#[tokio::test]
async fn the_concurrency_limit_finds_a_small_servers_capacity_from_its_429s() {
    let server = ScriptedLlm::start().await;
    server.set_handler(|_| Reply::text("ok").delay(Duration::from_millis(20)));
    server.set_capacity(8);
    let client = OpenAiClient::new(OpenAiConfig { max_retries: 8, ..config(&server) }).unwrap();
    assert_eq!(client.concurrency_limit(), 64, "starts high");
    let started = Instant::now();
    let calls = (0..300).map(|i| client.chat(ask(&format!("q{i}"))));
    let answers = futures::future::join_all(calls).await;
    assert!(answers.iter().all(Result::is_ok), "every call answered despite the 429s");
    let refused = server.over_capacity_count();
    eprintln!(
        "300 calls, capacity 8: {refused} refused attempts, limit now {}, {:?}",
        client.concurrency_limit(),
        started.elapsed()
    );
    assert!(client.concurrency_limit() <= 16, "cut toward the capacity of 8: {}", client.concurrency_limit());
    // A fixed limit of 64 meets a 429 on most attempts (2,903 refused for these 300 calls); the
    // adaptive one settles near the capacity. Refusals cut only as the majority of about one
    // limit's worth of recent answers, at least 50 (a minority is what transient faults give at
    // any load), so the first cut waits for about 45 refusals of the 64 and a limit one or two
    // above the capacity meets a fast 429 now and then without a cut: 239-254 refusals here (65
    // when every refusal cut, 111-133 over the last ten answers), in the same time (0.93-0.97 s
    // for 300 calls of 20 ms on 8 slots).
    assert!(refused < 300, "{refused} attempts refused for 300 calls");
    assert_eq!(server.peak_in_flight(), 8);
}

/// `calls` calls at once against a server with `slots` slots that queues the rest, at `service` a
/// reply on average (from 0.9 to 1.1 times it, as answers of different lengths take): every call
/// answered, none given up on or sent twice; the limit it settles at and the slots it found.
async fn against_a_queueing_server(slots: usize, calls: usize, service: Duration) -> (usize, Option<f64>) {
    let server = ScriptedLlm::start().await;
    let n = std::sync::atomic::AtomicU64::new(0);
    server.set_handler(move |_| {
        let i = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Reply::text("ok").delay(service.mul_f64(0.9 + 0.2 * ((i * 7919) % 101) as f64 / 100.0))
    });
    server.set_slots(slots);
    let client = OpenAiClient::new(config(&server)).unwrap();
    assert_eq!(client.concurrency_limit(), 64, "starts high, with no setting");
    let started = Instant::now();
    let answers = futures::future::join_all((0..calls).map(|i| client.chat(ask(&format!("q{i}"))))).await;
    assert!(answers.iter().all(Result::is_ok), "every call answered");
    eprintln!(
        "{calls} calls, {slots} slots: limit {}, slots found {:?}, {} requests, {} cancelled, {:?}",
        client.concurrency_limit(),
        client.server_slots(),
        server.request_count(),
        server.cancelled_count(),
        started.elapsed()
    );
    assert_eq!(server.cancelled_count(), 0, "no attempt abandoned while it waited its turn");
    assert_eq!(server.request_count(), calls, "no call sent twice (no retry, no duplicate)");
    assert_eq!(server.peak_serving(), slots);
    (client.concurrency_limit(), client.server_slots())
}

#[tokio::test]
async fn the_concurrency_limit_finds_the_slots_of_a_server_that_queues() {
    // The first 64 calls queue at the server (the limit starts at 64): a one-slot server answers
    // the last of them after 64 service times, 16 times the adaptive timeout the first answers
    // set. Counted from their turn, none is given up on, and the answers' wait against the calls
    // ahead gives the slots; the limit is held one past them.
    // The service time is the class's fastest answer: the client's share of it (a debug build's
    // burst of 64 connections, about 10 ms; a model's answer takes seconds) puts the slots found
    // above the true ones, answers faster than the mean below; within a tenth here.
    let (limit, found) = against_a_queueing_server(2, 300, Duration::from_millis(50)).await;
    assert!((2..=3).contains(&limit), "two slots: the limit settles at 2 or 3, not {limit}");
    assert!(found.is_some_and(|k| (1.6..3.0).contains(&k)), "two slots found: {found:?}");
    let (limit, found) = against_a_queueing_server(16, 320, Duration::from_millis(500)).await;
    // A tenth of noise on 16 slots is one slot either way: at 15 the server's slots are 94% busy.
    assert!((15..=17).contains(&limit), "sixteen slots: the limit settles at 15 to 17, not {limit}");
    assert!(found.is_some_and(|k| (14.4..17.0).contains(&k)), "sixteen slots found: {found:?}");
}

#[tokio::test]
async fn a_server_that_reports_its_slots_is_held_to_them_from_the_first_call() {
    // llama.cpp's llama-server with `--parallel 3` says so in `GET /props`: no call waits at it,
    // from the first burst on (the limit starts at 64).
    let server = ScriptedLlm::start().await;
    server.set_props(json!({"total_slots": 3, "default_generation_settings": {"n_ctx": 4096}}));
    server.set_slots(3);
    server.set_handler(|_| Reply::text("ok").delay(Duration::from_millis(20)));
    let client = OpenAiClient::new(config(&server)).unwrap();
    assert_eq!(client.reported_slots(), None, "asked with the first call");
    let calls = (0..24).map(|i| client.chat(ask(&format!("q{i}"))));
    assert!(futures::future::join_all(calls).await.iter().all(Result::is_ok));
    assert_eq!(client.reported_slots(), Some(3));
    assert_eq!(server.props_asked(), 1, "asked once");
    assert_eq!(server.request_count(), 24, "the probe is no chat call");
    assert_eq!(server.peak_in_flight(), 3, "never more sent than it serves at once");
    assert_eq!(client.concurrency_limit(), 3);
    assert_eq!(client.server_slots(), Some(3.0));

    // A server without /props (404, as every other server answers): asked once, nothing changes.
    let other = ScriptedLlm::start().await;
    other.set_handler(|_| Reply::text("ok"));
    let client = OpenAiClient::new(config(&other)).unwrap();
    let calls = (0..24).map(|i| client.chat(ask(&format!("q{i}"))));
    assert!(futures::future::join_all(calls).await.iter().all(Result::is_ok));
    assert_eq!((other.props_asked(), client.reported_slots(), other.request_count()), (1, None, 24));
    assert!(client.concurrency_limit() >= 24, "{}", client.concurrency_limit());
}

#[tokio::test]
async fn a_server_that_serves_everything_at_once_keeps_its_limit() {
    // No queue: the latency does not follow the calls ahead (it varies for its own reasons, as the
    // length of an answer does), and the limit grows as before.
    let server = ScriptedLlm::start().await;
    let n = std::sync::atomic::AtomicU64::new(0);
    server.set_handler(move |_| {
        let i = n.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Reply::text("ok").delay(Duration::from_millis(10 + (i * 7919) % 40))
    });
    let client = OpenAiClient::new(config(&server)).unwrap();
    for _ in 0..6 {
        let calls = (0..200).map(|i| client.chat(ask(&format!("q{i}"))));
        assert!(futures::future::join_all(calls).await.iter().all(Result::is_ok));
    }
    assert_eq!(client.server_slots(), None, "no queue shown");
    assert!(client.concurrency_limit() >= 64, "the limit never came down: {}", client.concurrency_limit());
}

#[tokio::test]
async fn a_backend_that_refuses_connections_does_not_cut_the_concurrency_limit() {
    // A port nothing listens on: every connection is refused, as while a backend restarts. That
    // is no sign of load: cutting for it left one slot for a whole debate once the backend was back
    // 300 ms later (2 s became 10 s).
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/v1", closed.local_addr().unwrap());
    drop(closed);
    let client = OpenAiClient::new(OpenAiConfig {
        base_url: url,
        max_retries: 1,
        breaker_failures: 1000,
        ..OpenAiConfig::default()
    })
    .unwrap();
    assert_eq!(client.concurrency_limit(), 64);
    let calls = (0..64).map(|i| client.chat(ask(&format!("q{i}"))));
    let answers = futures::future::join_all(calls).await;
    assert!(answers.iter().all(|a| matches!(a, Err(LlmError::Unavailable(m)) if m.contains("connect"))), "{answers:?}");
    assert_eq!(client.concurrency_limit(), 64, "refused connections are not overload");
}

#[tokio::test]
async fn the_concurrency_limit_grows_past_its_start_on_a_server_that_keeps_up() {
    let server = ScriptedLlm::start().await;
    server.set_handler(|_| Reply::text("ok").delay(Duration::from_millis(20)));
    let client =
        OpenAiClient::new(OpenAiConfig { initial_concurrency: 16, max_concurrency: 48, ..config(&server) }).unwrap();
    for _ in 0..20 {
        let calls = (0..100).map(|i| client.chat(ask(&format!("q{i}"))));
        assert!(futures::future::join_all(calls).await.iter().all(Result::is_ok));
    }
    assert_eq!(client.concurrency_limit(), 48, "grew from 16 to the hard cap and stayed");
    assert_eq!(server.peak_in_flight(), 48, "never above the hard cap");
    assert_eq!(server.over_capacity_count(), 0);
}

#[tokio::test]
async fn a_fixed_concurrency_limit_stays_put() {
    let server = ScriptedLlm::start().await;
    server.set_handler(|_| Reply::text("ok").delay(Duration::from_millis(5)));
    let client =
        OpenAiClient::new(OpenAiConfig { initial_concurrency: 0, max_concurrency: 6, ..config(&server) }).unwrap();
    let calls = (0..60).map(|i| client.chat(ask(&format!("q{i}"))));
    assert!(futures::future::join_all(calls).await.iter().all(Result::is_ok));
    assert_eq!(client.concurrency_limit(), 6);
    assert_eq!(server.peak_in_flight(), 6);
}

#[tokio::test]
async fn a_backend_echoing_the_api_key_never_gets_it_into_the_error() {
    let server = ScriptedLlm::start().await;
    let key = "sk-echoed-secret-4711";
    server.set_handler(move |_| Reply::status(401).body(format!("{{\"error\": {{\"message\": \"bad key {key}\"}}}}")));
    let client = OpenAiClient::new(OpenAiConfig { api_key: Some(key.into()), ..config(&server) }).unwrap();
    let err = client.chat(ask("q")).await.unwrap_err();
    let text = format!("{err} {err:?}");
    assert!(!text.contains(key), "{text}");
    assert!(text.contains("<redacted>"), "the rest of the body is kept: {text}");
}

/// A sequential pipeline makes a few calls per class: the first call of a class (here one allowed
/// 512 tokens) hangs while another class (64 tokens) has answered quickly a few times. The hang is
/// cut at a timeout borrowed from the other class (scaled by the token limits), not at the 30 s
/// ceiling, and the retry answers.
#[tokio::test]
async fn a_cold_class_hang_is_cut_at_a_prior_from_the_backends_other_classes() {
    let server = ScriptedLlm::start().await;
    server.set_handler(hang_first_attempts(Duration::from_millis(10), vec!["long".into()]));
    let client = adaptive_client(&server);
    let ceiling = client.config().request_timeout;
    for i in 0..4 {
        let reply = client.chat(ChatRequest { max_tokens: Some(64), ..ask(&format!("short{i}")) }).await.unwrap();
        assert_eq!(reply.usage.retries, 0);
    }
    let call = client.chat(ChatRequest { max_tokens: Some(512), ..ask("long") });
    let reply = tokio::time::timeout(ceiling / 2, call)
        .await
        .expect("the hung attempt waited for the ceiling: a cold class got no prior")
        .unwrap();
    assert_eq!(reply.text, "echo long");
    assert_eq!(reply.usage.retries, 1, "one attempt cut, one answered");
    assert!(eventually(Duration::from_secs(5), || server.cancelled_count() == 1).await);
    // How long the hung attempt was given: from its arrival to the client dropping it.
    let hung = server.exchanges().into_iter().find(|e| e.answered.is_none()).expect("the hung exchange");
    let given = server.cancelled_times()[0] - hung.received;
    // The prior: p95 of the short class (>= 10 ms) x 8 (512 / 64 tokens) x 2 (margin) x 4
    // (multiplier) >= 640 ms; far below the ceiling.
    assert!(given >= Duration::from_millis(600), "cut before the prior: {given:?}");
    assert!(given < ceiling / 4, "given {given:?} of a {ceiling:?} ceiling");
}

/// The last attempt a call may make gets the ceiling, so a call slow for good reason still
/// completes; but when it hangs, a duplicate sent after about one adaptive timeout answers and
/// the call does not wait for the ceiling.
#[tokio::test]
async fn a_hung_last_attempt_is_hedged_instead_of_waiting_for_the_ceiling() {
    let server = ScriptedLlm::start().await;
    server.set_handler(|r| Reply::text(format!("echo {}", r.last_user_message().unwrap_or_default())));
    let client =
        OpenAiClient::new(OpenAiConfig { max_retries: 1, ..adaptive_client(&server).config().clone() }).unwrap();
    let ceiling = client.config().request_timeout;
    warm(&client, 8).await;
    // The first attempt fails at once, the second (the last) never answers, the hedge does.
    server.push(Reply::status(503)).push(Reply::hang());
    let call = client.chat(ask("q"));
    let reply =
        tokio::time::timeout(ceiling / 2, call).await.expect("the last attempt waited for the ceiling").unwrap();
    assert_eq!(reply.text, "echo q");
    assert_eq!(reply.usage.retries, 1);
    assert_eq!(server.request_count(), 8 + 3, "eight warm-up calls, the 503, the hung attempt and its hedge");
    assert!(eventually(Duration::from_secs(5), || server.cancelled_count() == 1).await, "the hung request dropped");
}

/// A llama-cpp-python-like server: `json_schema` refused with a 500 validation error naming the
/// field, `json_object` (with its schema) answered.
fn refuses_json_schema(r: &assay_testkit::RecordedRequest) -> Reply {
    match r.body["response_format"]["type"].as_str() {
        Some("json_schema") => Reply::status(500).body(
            r#"{"error":{"message":"1 validation error: body.response_format.type: Input should be 'text' or 'json_object'"}}"#,
        ),
        _ => Reply::json(json!({"score": 3})),
    }
}

/// A server that takes JSON mode only: `json_schema` refused with a 500 naming the field, a
/// `json_object` carrying a schema with a 400.
fn json_mode_only(r: &assay_testkit::RecordedRequest) -> Reply {
    let format = &r.body["response_format"];
    match (format["type"].as_str(), format.get("schema").is_some()) {
        (Some("json_schema"), _) => refuses_json_schema(r),
        (Some("json_object"), true) => {
            Reply::status(400).body(r#"{"error":{"message":"response_format.schema is not supported"}}"#)
        }
        _ => Reply::json(json!({"score": 3})),
    }
}

/// Sixteen concurrent first structured calls to a model negotiate its form once: each is refused
/// at most once in the native form (they were sent together), one call walks down the ladder
/// (the only `json_object` with a schema), the others wait for it and resend in the form it found;
/// no call fails and the circuit breaker, which opens after 5 failures, stays closed.
#[tokio::test]
async fn a_first_burst_negotiates_the_form_once_and_never_opens_the_breaker() {
    let server = ScriptedLlm::start().await;
    server.set_handler(json_mode_only);
    let client = client(&server);
    let calls = (0..16).map(|_| client.chat(schema_request()));
    let replies = futures::future::join_all(calls).await;
    assert!(replies.iter().all(|r| matches!(r, Ok(x) if x.json == Some(json!({"score": 3})))), "{replies:?}");
    let forms: Vec<String> = server
        .requests()
        .iter()
        .map(|r| {
            let f = &r.body["response_format"];
            format!(
                "{}{}",
                f["type"].as_str().unwrap_or("none"),
                if f.get("schema").is_some() { "+schema" } else { "" }
            )
        })
        .collect();
    let count = |form: &str| forms.iter().filter(|f| *f == form).count();
    assert!(count("json_schema") <= 16, "{forms:?}");
    assert_eq!(count("json_object+schema"), 1, "one negotiation: {forms:?}");
    assert_eq!(count("json_object"), 16, "every call answered in JSON mode: {forms:?}");
    assert_eq!(client.breaker_state(), BreakerState::Closed);
    assert_eq!(client.schema_delivery(), "json_mode");
    // Later calls start from the negotiated form.
    let before = server.request_count();
    client.chat(schema_request()).await.unwrap();
    assert_eq!(server.request_count(), before + 1);
}

/// Each model of a backend negotiates its own form; the refusals of six models in a row (more
/// than the breaker's 5 failures) are no outage: the breaker stays closed and a plain call goes
/// through. A fixed `structured_output` sends its one form, no negotiation.
#[tokio::test]
async fn refused_forms_are_not_failures_and_a_fixed_form_is_sent_as_is() {
    let server = ScriptedLlm::start().await;
    server.set_handler(refuses_json_schema);
    let client = client(&server);
    for m in 0..6 {
        let request = ChatRequest { model: Some(format!("model-{m}")), ..schema_request() };
        assert!(client.chat(request).await.is_ok(), "model-{m}");
    }
    assert_eq!(client.breaker_state(), BreakerState::Closed);
    assert_eq!(server.request_count(), 12, "json_schema then json_object, per model");

    let server = ScriptedLlm::start().await;
    server.set_handler(refuses_json_schema);
    let config = OpenAiConfig { structured_output: assay_llm::StructuredOutput::JsonMode, ..config(&server) };
    let client = OpenAiClient::new(config).unwrap();
    let reply = client.chat(schema_request()).await.unwrap();
    assert!(reply.schema_fallback && reply.usage.schema_fallbacks == 0);
    let sent = &server.requests()[0];
    assert_eq!(sent.body["response_format"], json!({"type": "json_object"}));
    assert!(sent.last_user_message().unwrap().contains(&schema().to_string()));
}

/// A text-generation-inference-like server: its router reads `response_format` as
/// `{"type": "json" | "json_object", "value": schema}`, refuses the OpenAI forms with a 422 naming
/// the missing `value`, and holds the reply to the schema it was given by grammar.
fn tgi_like(r: &assay_testkit::RecordedRequest) -> Reply {
    let format = &r.body["response_format"];
    if format.is_null() {
        return Reply::text("free text");
    }
    match (format["type"].as_str(), format.get("value")) {
        (Some("json" | "json_object"), Some(value)) if value["required"] == json!(["score"]) => {
            Reply::json(json!({"score": 3}))
        }
        _ => Reply::status(422).body(
            "Failed to deserialize the JSON body into the target type: response_format: missing field `value` at line 1 column 212",
        ),
    }
}

#[tokio::test]
async fn text_generation_inference_gets_its_own_form() {
    let server = ScriptedLlm::start().await;
    server.set_handler(tgi_like);
    let client = client(&server);
    let response = client.chat(schema_request()).await.unwrap();
    assert_eq!(response.json, Some(json!({"score": 3})));
    assert_eq!(response.usage.schema_fallbacks, 1, "json_schema refused in TGI's words: TGI's form next");
    assert_eq!(response.usage.schema_violations, 0);
    assert_eq!(client.schema_delivery(), "tgi");
    assert_eq!(client.structured_output("test-model"), Some("tgi"));
    let requests = server.requests();
    let forms: Vec<_> = requests.iter().map(|r| r.body["response_format"]["type"].clone()).collect();
    assert_eq!(forms, [json!("json_schema"), json!("json")]);
    assert_eq!(requests[1].body["response_format"]["value"], schema());
    // Later calls start in TGI's form: one request each.
    let response = client.chat(schema_request()).await.unwrap();
    assert_eq!((response.usage.calls, response.json), (1, Some(json!({"score": 3}))));
    assert_eq!(server.request_count(), 3);
    // Fixed in the configuration: the form from the first call.
    let fixed =
        OpenAiClient::new(OpenAiConfig { structured_output: assay_llm::StructuredOutput::Tgi, ..config(&server) })
            .unwrap();
    assert_eq!(fixed.chat(schema_request()).await.unwrap().usage.calls, 1);
    assert_eq!(server.request_count(), 4);
}

/// An Ollama-like server on its native API: `/api/chat` and `/api/embed`, replies in Ollama's
/// shape. `format` holding a schema is enforced unless `ignore_schema` (an Ollama older than its
/// structured outputs, which ignores what it does not know).
fn ollama_like(ignore_schema: bool) -> impl Fn(&assay_testkit::RecordedRequest) -> Reply + Send + Sync + 'static {
    move |r| match r.path.as_str() {
        "/api/chat" => {
            let format = &r.body["format"];
            let content = if format.is_object() && !ignore_schema {
                json!({"score": 2}).to_string()
            } else if format == "json" {
                json!({"score": 1}).to_string()
            } else {
                "I would rate it a two.".to_owned()
            };
            let mut reply = json!({"model": r.body["model"], "created_at": "2026-12-03T09:00:00Z",
                "message": {"role": "assistant", "content": content},
                "done": true, "done_reason": "stop", "prompt_eval_count": 12, "eval_count": 5});
            if r.body["logprobs"] == true {
                reply["logprobs"] = json!([{"token": "YES", "logprob": -0.2,
                    "top_logprobs": [{"token": "YES", "logprob": -0.2}, {"token": "NO", "logprob": -1.7}]}]);
            }
            Reply::text("").body(reply.to_string())
        }
        "/api/embed" => {
            let inputs: Vec<String> = r.body["input"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|v| v.as_str().map(str::to_owned))
                .collect();
            let vectors: Vec<Vec<f32>> = inputs.iter().map(|t| hash_embedding(t, 8)).collect();
            Reply::text("")
                .body(json!({"model": r.body["model"], "embeddings": vectors, "prompt_eval_count": 3}).to_string())
        }
        _ => Reply::status(404).body("404 page not found"),
    }
}

fn ollama_client(server: &ScriptedLlm) -> OpenAiClient {
    OpenAiClient::new(OpenAiConfig { base_url: format!("http://{}/api", server.addr()), ..config(server) }).unwrap()
}

#[tokio::test]
async fn ollama_native_api_sends_the_schema_in_format() {
    let server = ScriptedLlm::start().await;
    server.set_handler(ollama_like(false));
    let client = ollama_client(&server);
    let response = client.chat(ChatRequest { max_tokens: Some(40), temperature: Some(0.0), ..schema_request() }).await;
    let response = response.unwrap();
    assert_eq!(response.json, Some(json!({"score": 2})));
    assert_eq!((response.usage.prompt_tokens, response.usage.completion_tokens), (12, 5));
    assert_eq!((response.usage.calls, response.usage.schema_violations), (1, 0));
    assert_eq!(response.finish_reason, FinishReason::Stop);
    let request = &server.requests()[0];
    assert_eq!(request.path, "/api/chat");
    assert_eq!(request.body["format"], schema());
    assert_eq!(request.body["stream"], false);
    assert_eq!(request.body["options"], json!({"temperature": 0.0, "num_predict": 40}));
    assert_eq!(server.props_asked(), 0, "llama.cpp's /props is not asked of Ollama");
    // Logprobs of a choice, in Ollama's shape.
    let choice = ChatRequest {
        response_format: ResponseFormat::Choice(vec!["YES".into(), "NO".into()]),
        top_logprobs: Some(5),
        ..ask("is it?")
    };
    let response = client.chat(choice).await.unwrap();
    assert_eq!(
        response.first_token_logprobs,
        Some(vec![
            TokenLogprob { token: "YES".into(), logprob: -0.2 },
            TokenLogprob { token: "NO".into(), logprob: -1.7 }
        ])
    );
    assert!(server.requests()[1].body.get("grammar").is_none(), "Ollama takes no GBNF grammar");
    // Embeddings from /api/embed.
    let texts = vec!["a".to_owned(), "b c".to_owned()];
    let embedded =
        client.embed(EmbeddingRequest { texts: texts.clone(), ..EmbeddingRequest::default() }).await.unwrap();
    assert_eq!(embedded.vectors, vec![hash_embedding("a", 8), hash_embedding("b c", 8)]);
    assert_eq!(server.requests()[2].path, "/api/embed");
}

#[tokio::test]
async fn an_ollama_that_ignores_the_schema_moves_to_json_mode() {
    let server = ScriptedLlm::start().await;
    server.set_handler(ollama_like(true));
    let client = ollama_client(&server);
    for call in 1..=3 {
        let response = client.chat(schema_request()).await.unwrap();
        assert_eq!(response.usage.schema_violations, 1, "call {call}");
    }
    assert_eq!(client.structured_output("test-model"), Some("json_mode"));
    let response = client.chat(schema_request()).await.unwrap();
    assert_eq!((response.json, response.usage.schema_violations), (Some(json!({"score": 1})), 0));
    assert_eq!(server.requests()[3].body["format"], "json");
}

/// A llama.cpp-like server (it says its slots at `/props`) serves calls at once on a few cores, so
/// each is generated more slowly the more it serves: a call in service is not cut at the attempt
/// ceiling while its token limit's time at the pace the server has shown has not passed. At a
/// server that says nothing of its slots the ceiling still cuts.
#[tokio::test]
async fn a_call_in_service_has_its_token_limits_time_at_the_servers_pace() {
    async fn run(props: bool) -> (Result<assay_llm::ChatResponse, LlmError>, usize) {
        let server = ScriptedLlm::start().await;
        if props {
            server.set_props(json!({"total_slots": 4}));
        }
        let config = OpenAiConfig { request_timeout: Duration::from_millis(600), max_retries: 1, ..config(&server) };
        let client = OpenAiClient::new(config).unwrap();
        // Three answers show the pace: 200 ms for 10 tokens (20 ms a token).
        for _ in 0..3 {
            server.push(Reply::text("short").usage(5, 10).delay(Duration::from_millis(200)));
        }
        for _ in 0..3 {
            client.chat(ChatRequest { max_tokens: Some(64), ..ask("q") }).await.unwrap();
        }
        // One generated to its limit at that pace, slower for sharing the server: 1.3 s, over the
        // 600 ms ceiling, under 64 tokens x 20 ms x 3 = 3.84 s.
        server.push_all([
            Reply::text("long").usage(5, 64).delay(Duration::from_millis(1300)),
            Reply::text("again").usage(5, 64).delay(Duration::from_millis(1300)),
        ]);
        let response = client.chat(ChatRequest { max_tokens: Some(64), ..ask("q") }).await;
        (response, server.cancelled_count())
    }
    let (response, cancelled) = run(true).await;
    let response = response.expect("the call in service is waited for");
    assert_eq!((response.text.as_str(), response.usage.retries, cancelled), ("long", 0, 0));
    let (response, cancelled) = run(false).await;
    assert!(response.is_err() && cancelled >= 1, "the ceiling cuts elsewhere: {response:?}, {cancelled} cancelled");
}

/// llama.cpp's `llama-server` at its defaults shares one KV cache among four slots: when the
/// calls in service outgrow it, every one of them fails with a 500 "Context size has been
/// exceeded". That is one event: the server is held to one slot fewer, and the calls are retried.
#[tokio::test]
async fn a_server_out_of_room_for_its_slots_is_held_to_one_fewer() {
    let server = ScriptedLlm::start().await;
    server.set_props(json!({"total_slots": 4}));
    let full = || {
        Reply::status(500)
            .body(r#"{"error":{"code":500,"message":"Context size has been exceeded.","type":"server_error"}}"#)
            .delay(Duration::from_millis(100))
    };
    server.push_all([full(), full(), full(), full()]);
    server.set_handler(|_| Reply::text("ok").delay(Duration::from_millis(50)));
    let client = client(&server);
    let answers = futures::future::join_all((0..4).map(|i| client.chat(ask(&format!("q{i}"))))).await;
    assert!(answers.iter().all(Result::is_ok), "retried and answered: {answers:?}");
    assert_eq!(client.concurrency_limit(), 3, "four failing together are one event: one slot fewer");
    assert_eq!(server.request_count(), 8);
}
