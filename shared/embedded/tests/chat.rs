//! Local generation: constrained decoding, logprobs, sampling, stop sequences, cancellation.

mod common;

use std::time::{Duration, Instant};

use assay_llm::{ChatModel, ChatRequest, FinishReason, Message, ResponseFormat};
use serde_json::{Value, json};

fn answers_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "answers": {
                "type": "array",
                "minItems": 1,
                "maxItems": 3,
                "items": {
                    "type": "object",
                    "properties": {
                        "index": {"type": "integer", "minimum": 0},
                        "answer": {"type": "string", "enum": ["YES", "NO"]}
                    },
                    "required": ["index", "answer"]
                }
            }
        },
        "required": ["answers"]
    })
}

/// Validates a value against `answers_schema`.
fn validate_answers(v: &Value) -> Result<(), String> {
    let obj = v.as_object().ok_or("not an object")?;
    let answers = obj.get("answers").and_then(Value::as_array).ok_or("answers is not an array")?;
    if answers.is_empty() || answers.len() > 3 {
        return Err(format!("{} answers", answers.len()));
    }
    for a in answers {
        let a = a.as_object().ok_or("answer item is not an object")?;
        let index = a.get("index").ok_or("missing index")?;
        if !(index.is_u64()) {
            return Err(format!("index {index} is not a non-negative integer"));
        }
        match a.get("answer").and_then(Value::as_str) {
            Some("YES") | Some("NO") => {}
            other => return Err(format!("answer {other:?}")),
        }
    }
    Ok(())
}

fn questions_prompt() -> Vec<Message> {
    vec![
        Message::system("You answer numbered yes/no questions."),
        Message::user("1. Is the sky blue?\n2. Is fire cold?\nAnswer each question with YES or NO."),
    ]
}

#[tokio::test]
async fn constrained_json_always_parses_over_100_seeds() {
    let chat = common::smollm2();
    let started = Instant::now();
    let mut distinct = std::collections::HashSet::new();
    for seed in 0..100u64 {
        let req = ChatRequest {
            messages: questions_prompt(),
            temperature: Some(0.8),
            seed: Some(seed),
            max_tokens: Some(80),
            response_format: ResponseFormat::JsonSchema { name: "answers".into(), schema: answers_schema() },
            ..Default::default()
        };
        let resp = chat.chat(req).await.expect("chat");
        let parsed: Value = serde_json::from_str(&resp.text)
            .unwrap_or_else(|e| panic!("seed {seed}: reply does not parse ({e}): {}", resp.text));
        validate_answers(&parsed).unwrap_or_else(|e| panic!("seed {seed}: {e}: {}", resp.text));
        assert_eq!(resp.json.as_ref(), Some(&parsed), "seed {seed}");
        assert_eq!(resp.finish_reason, FinishReason::Stop, "seed {seed}: {}", resp.text);
        assert_eq!(resp.usage.calls, 1);
        assert!(resp.usage.prompt_tokens > 10 && resp.usage.completion_tokens > 5);
        distinct.insert(resp.text);
    }
    // Sampling at temperature 0.8 with different seeds explores different answers.
    assert!(distinct.len() > 1, "all 100 seeds gave the same reply");
    eprintln!("100 constrained runs in {:?}, {} distinct replies", started.elapsed(), distinct.len());
}

#[tokio::test]
async fn same_seed_same_output() {
    let chat = common::smollm2();
    let req = ChatRequest {
        messages: vec![Message::user("Write one sentence about the sea.")],
        temperature: Some(0.9),
        seed: Some(42),
        max_tokens: Some(24),
        ..Default::default()
    };
    let a = chat.chat(req.clone()).await.unwrap();
    let b = chat.chat(req).await.unwrap();
    assert_eq!(a.text, b.text);
    assert!(!a.text.is_empty());
}

async fn check_choice_logprobs(chat: &dyn ChatModel, question: &str) {
    let req = ChatRequest {
        messages: vec![Message::user(question)],
        temperature: Some(0.0),
        max_tokens: Some(4),
        response_format: ResponseFormat::Choice(vec!["YES".into(), "NO".into()]),
        top_logprobs: Some(5),
        ..Default::default()
    };
    let resp = chat.chat(req).await.unwrap();
    assert!(resp.text == "YES" || resp.text == "NO", "{:?}", resp.text);
    let lps = resp.first_token_logprobs.expect("logprobs requested");
    assert!(!lps.is_empty() && lps.len() <= 5);
    for w in lps.windows(2) {
        assert!(w[0].logprob >= w[1].logprob, "not sorted: {lps:?}");
    }
    let total: f64 = lps.iter().map(|l| l.logprob.exp()).sum();
    assert!(total <= 1.0 + 1e-6, "probabilities sum to {total}");
    assert!(lps.iter().all(|l| l.logprob <= 0.0));
    // Greedy: the chosen first token is the top alternative, and it starts the answer (options
    // are accepted in any case, and the reply is mapped back to the option as given).
    let top = lps[0].token.trim().to_uppercase();
    assert!(!top.is_empty() && resp.text.starts_with(&top), "answer {:?} vs top alternative {:?}", resp.text, lps[0]);
    // Every alternative is an allowed start of an option.
    for l in &lps {
        let t = l.token.trim().to_uppercase();
        assert!("YES".starts_with(&t) || "NO".starts_with(&t), "{l:?} is not an allowed token");
    }
}

#[tokio::test]
async fn choice_logprobs_are_consistent_smollm2() {
    for q in ["Is Paris the capital of France?", "Is 10 smaller than 3?"] {
        check_choice_logprobs(common::smollm2(), q).await;
    }
}

#[tokio::test]
async fn choice_logprobs_are_consistent_gemma3() {
    for q in ["Is Paris the capital of France?", "Is 10 smaller than 3?"] {
        check_choice_logprobs(common::gemma3(), q).await;
    }
}

#[tokio::test]
async fn text_logprobs_and_limits() {
    let chat = common::smollm2();
    let req = ChatRequest {
        messages: vec![Message::user("Count from 1 to 50, separated by commas.")],
        temperature: Some(0.0),
        max_tokens: Some(12),
        top_logprobs: Some(3),
        ..Default::default()
    };
    let resp = chat.chat(req).await.unwrap();
    assert_eq!(resp.finish_reason, FinishReason::Length);
    assert_eq!(resp.usage.completion_tokens, 12);
    let lps = resp.first_token_logprobs.unwrap();
    assert_eq!(lps.len(), 3);
    assert!(resp.text.starts_with(&lps[0].token));

    let req = ChatRequest {
        messages: vec![Message::user("Count from 1 to 50, separated by commas.")],
        temperature: Some(0.0),
        max_tokens: Some(100),
        stop: vec!["5".into()],
        ..Default::default()
    };
    let resp = chat.chat(req).await.unwrap();
    assert_eq!(resp.finish_reason, FinishReason::Stop);
    assert!(!resp.text.contains('5'), "{:?}", resp.text);
    assert!(resp.text.contains('4'), "{:?}", resp.text);
}

#[tokio::test]
async fn gemma3_json_schema_parses() {
    let chat = common::gemma3();
    let req = ChatRequest {
        messages: questions_prompt(),
        temperature: Some(0.0),
        max_tokens: Some(80),
        response_format: ResponseFormat::JsonSchema { name: "answers".into(), schema: answers_schema() },
        ..Default::default()
    };
    let resp = chat.chat(req).await.unwrap();
    validate_answers(resp.json.as_ref().expect("json")).unwrap();
}

#[tokio::test]
async fn dropped_request_does_not_block_the_next() {
    // A model instance of its own, so no other test's requests are queued in front.
    let chat = &common::load_smollm2();
    let long = ChatRequest {
        messages: vec![Message::user("Write a very long story about a dragon and a knight.")],
        temperature: Some(0.0),
        max_tokens: Some(2000),
        ..Default::default()
    };
    // Running request, dropped after a short while.
    let r = tokio::time::timeout(Duration::from_millis(300), chat.chat(long.clone())).await;
    assert!(r.is_err(), "the long request should still be running");
    // Queued requests dropped before they start.
    for _ in 0..3 {
        let _ = tokio::time::timeout(Duration::from_millis(1), chat.chat(long.clone())).await;
    }
    let started = Instant::now();
    let quick = ChatRequest {
        messages: vec![Message::user("Say hi.")],
        temperature: Some(0.0),
        max_tokens: Some(3),
        ..Default::default()
    };
    let resp = chat.chat(quick).await.unwrap();
    assert!(!resp.text.is_empty());
    // 2000 tokens take 30 s or more even at full speed; the quick request must not wait for that.
    assert!(started.elapsed() < Duration::from_secs(15), "waited {:?}", started.elapsed());
}

#[tokio::test]
async fn deadline_and_bad_requests() {
    let chat = common::smollm2();
    let req = ChatRequest {
        messages: vec![Message::user("Write a long essay.")],
        max_tokens: Some(2000),
        temperature: Some(0.0),
        deadline: Some(Instant::now() + Duration::from_millis(200)),
        ..Default::default()
    };
    assert_eq!(chat.chat(req).await.unwrap_err(), assay_llm::LlmError::DeadlineExceeded);
    let req = ChatRequest { messages: vec![Message::user("x")], model: Some("gpt-4o".into()), ..Default::default() };
    assert!(matches!(chat.chat(req).await, Err(assay_llm::LlmError::InvalidRequest(_))));
    let req = ChatRequest {
        messages: vec![Message::user("x")],
        response_format: ResponseFormat::JsonSchema { name: "x".into(), schema: json!({"type": "date"}) },
        ..Default::default()
    };
    assert!(matches!(chat.chat(req).await, Err(assay_llm::LlmError::InvalidRequest(_))));
    assert_eq!(chat.backend(), "local");
    assert!(chat.supports_logprobs());
}
