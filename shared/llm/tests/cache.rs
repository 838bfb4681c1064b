//! The response cache in front of the real HTTP client and the scripted server.

use std::sync::Arc;
use std::time::Duration;

use assay_llm::{
    CacheConfig, CachePolicy, CachedChat, CachedEmbed, ChatModel, ChatRequest, ChatResponse, EmbeddingModel,
    EmbeddingRequest, LlmError, Message, OpenAiClient, OpenAiConfig, ResponseCache, ResponseFormat, Usage,
};
use assay_testkit::{Reply, ScriptedLlm, embedding_handler};
use serde_json::json;

fn client(server: &ScriptedLlm) -> Arc<OpenAiClient> {
    Arc::new(
        OpenAiClient::new(OpenAiConfig {
            base_url: server.base_url(),
            default_model: "test-model".into(),
            base_backoff: Duration::from_millis(5),
            max_backoff: Duration::from_millis(20),
            // Requests are counted one per call: no hedged duplicates.
            adaptive_timeout: assay_llm::AdaptiveTimeout { hedge_factor: 0.0, ..assay_llm::AdaptiveTimeout::default() },
            ..OpenAiConfig::default()
        })
        .unwrap(),
    )
}

fn ask(text: &str) -> ChatRequest {
    ChatRequest { messages: vec![Message::user(text)], temperature: Some(0.0), ..ChatRequest::default() }
}

/// A response with the cache markers reset, to compare a hit with the original.
fn as_fresh(response: &ChatResponse, usage: Usage) -> ChatResponse {
    ChatResponse { cached: false, usage, ..response.clone() }
}

#[tokio::test]
async fn repeat_is_served_from_memory() {
    let server = ScriptedLlm::start().await;
    server.push(Reply::with_logprobs("YES", vec![("YES", -0.2), ("NO", -1.7)]).usage(30, 1));
    let cached = CachedChat::in_memory(client(&server));
    let request = ChatRequest {
        top_logprobs: Some(2),
        response_format: ResponseFormat::Choice(vec!["YES".into(), "NO".into()]),
        ..ask("good?")
    };
    let first = cached.chat(request.clone()).await.unwrap();
    assert!(!first.cached);
    assert_eq!(first.usage.calls, 1);
    let second = cached.chat(request).await.unwrap();
    assert!(second.cached);
    assert_eq!(second.usage, Usage { cache_hits: 1, ..Usage::default() });
    assert_eq!(as_fresh(&second, first.usage.clone()), first);
    assert_eq!(server.request_count(), 1);
}

#[tokio::test]
async fn errors_are_not_cached() {
    let server = ScriptedLlm::start().await;
    server.push(Reply::status(400)).push(Reply::text("fine"));
    let cached = CachedChat::in_memory(client(&server));
    assert!(matches!(cached.chat(ask("q")).await, Err(LlmError::InvalidRequest(_))));
    let response = cached.chat(ask("q")).await.unwrap();
    assert_eq!(response.text, "fine");
    assert!(!response.cached);
    assert_eq!(server.request_count(), 2);
    assert!(cached.chat(ask("q")).await.unwrap().cached);
    assert_eq!(server.request_count(), 2);
}

#[tokio::test]
async fn sampled_requests_are_cached_only_with_seed_or_opt_in() {
    let server = ScriptedLlm::start().await;
    server.set_handler(|request| Reply::text(format!("reply {}", request.raw_body.len())));
    let cached = CachedChat::in_memory(client(&server));
    let sampled = ChatRequest { temperature: Some(0.8), ..ask("poem") };
    cached.chat(sampled.clone()).await.unwrap();
    assert!(!cached.chat(sampled.clone()).await.unwrap().cached);
    assert_eq!(server.request_count(), 2);

    let seeded = ChatRequest { seed: Some(42), ..sampled.clone() };
    cached.chat(seeded.clone()).await.unwrap();
    assert!(cached.chat(seeded).await.unwrap().cached);
    assert_eq!(server.request_count(), 3);

    let opted = ChatRequest { cache: CachePolicy::OptIn, ..sampled.clone() };
    cached.chat(opted.clone()).await.unwrap();
    assert!(cached.chat(opted).await.unwrap().cached);
    assert_eq!(server.request_count(), 4);

    let bypass = ChatRequest { cache: CachePolicy::Bypass, ..ask("poem") };
    cached.chat(bypass.clone()).await.unwrap();
    assert!(!cached.chat(bypass).await.unwrap().cached);
    assert_eq!(server.request_count(), 6);
}

#[tokio::test]
async fn different_schema_is_a_different_entry() {
    let server = ScriptedLlm::start().await;
    server.set_handler(|_| Reply::json(json!({"a": 1})));
    let cached = CachedChat::in_memory(client(&server));
    let with = |schema: serde_json::Value| ChatRequest {
        response_format: ResponseFormat::JsonSchema { name: "s".into(), schema },
        ..ask("q")
    };
    cached.chat(with(json!({"type": "object"}))).await.unwrap();
    let other = cached.chat(with(json!({"type": "array"}))).await.unwrap();
    assert!(!other.cached);
    assert_eq!(server.request_count(), 2);
}

#[tokio::test]
async fn concurrent_identical_requests_coalesce() {
    let server = ScriptedLlm::start().await;
    server.set_handler(|_| Reply::text("slow").delay(Duration::from_millis(300)));
    let cached = CachedChat::in_memory(client(&server));
    let calls = (0..6).map(|_| cached.chat(ask("same")));
    let results = futures::future::join_all(calls).await;
    let responses: Vec<ChatResponse> = results.into_iter().map(Result::unwrap).collect();
    assert_eq!(server.request_count(), 1);
    assert_eq!(responses.iter().filter(|r| !r.cached).count(), 1);
    assert!(responses.iter().all(|r| r.text == "slow"));
    let total: u32 = responses.iter().map(|r| r.usage.calls).sum();
    assert_eq!(total, 1, "only one call reached the backend");
}

#[tokio::test]
async fn sqlite_cache_survives_a_new_client() {
    let dir = tempfile::tempdir().unwrap();
    let config = CacheConfig { capacity: 100, sqlite_path: Some(dir.path().join("llm-cache.sqlite")) };
    let server = ScriptedLlm::start().await;
    server.push(Reply::json(json!({"score": 3})).usage(12, 4));
    let request = ChatRequest {
        response_format: ResponseFormat::JsonSchema { name: "s".into(), schema: json!({"type": "object"}) },
        ..ask("rate")
    };
    let first = {
        let cached = CachedChat::new(client(&server), ResponseCache::open(&config).unwrap());
        cached.chat(request.clone()).await.unwrap()
    };
    assert!(!first.cached);

    let cached = CachedChat::new(client(&server), ResponseCache::open(&config).unwrap());
    let second = cached.chat(request).await.unwrap();
    assert!(second.cached);
    assert_eq!(second.json, Some(json!({"score": 3})));
    assert_eq!(as_fresh(&second, first.usage.clone()), first);
    assert_eq!(server.request_count(), 1);
}

#[tokio::test]
async fn embeddings_are_cached_and_share_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let cache =
        ResponseCache::open(&CacheConfig { capacity: 100, sqlite_path: Some(dir.path().join("c.sqlite")) }).unwrap();
    let server = ScriptedLlm::start().await;
    server.set_handler(embedding_handler(4));
    let backend = client(&server);
    let embed = CachedEmbed::new(backend.clone(), cache.clone());
    let chat = CachedChat::new(backend, cache);
    let request = EmbeddingRequest { texts: vec!["a".into(), "b".into()], ..EmbeddingRequest::default() };
    let first = embed.embed(request.clone()).await.unwrap();
    let second = embed.embed(request.clone()).await.unwrap();
    assert_eq!(first.vectors, second.vectors);
    assert_eq!(second.usage.cache_hits, 1);
    assert_eq!(server.request_count(), 1);
    assert_eq!(chat.chat(ask("q")).await.unwrap().text, "ok");
    assert_eq!(server.request_count(), 2);

    let bypass = EmbeddingRequest { cache: CachePolicy::Bypass, ..request };
    embed.embed(bypass).await.unwrap();
    assert_eq!(server.request_count(), 3);
}

#[tokio::test]
async fn wrapped_dyn_model_keeps_identity() {
    let server = ScriptedLlm::start().await;
    let model: Arc<dyn ChatModel> = client(&server);
    let cached: CachedChat<dyn ChatModel> = CachedChat::in_memory(model);
    assert_eq!(cached.backend(), "openai");
    assert_eq!(cached.default_model(), "test-model");
    assert!(cached.supports_logprobs());
}

#[tokio::test]
async fn embeddings_are_cached_text_by_text_across_batches_and_processes() {
    let dir = tempfile::tempdir().unwrap();
    let config = CacheConfig { capacity: 100, sqlite_path: Some(dir.path().join("c.sqlite")) };
    let server = ScriptedLlm::start().await;
    server.set_handler(embedding_handler(4));
    let embed = CachedEmbed::new(client(&server), ResponseCache::open(&config).unwrap());
    let texts =
        |t: &[&str]| EmbeddingRequest { texts: t.iter().map(|s| s.to_string()).collect(), ..Default::default() };
    let ab = embed.embed(texts(&["a", "b", "a"])).await.unwrap();
    assert_eq!(sent(&server), vec![vec!["a".to_string(), "b".to_string()]], "each distinct text once");
    assert_eq!(ab.vectors[0], ab.vectors[2]);
    let bc = embed.embed(texts(&["b", "c"])).await.unwrap();
    assert_eq!(sent(&server)[1], vec!["c".to_string()], "only the new text is sent");
    assert_eq!(bc.vectors[0], ab.vectors[1]);
    assert_eq!(bc.usage.cache_hits, 0);
    // A new process on the same file: every text is a hit, nothing is sent.
    let again = CachedEmbed::new(client(&server), ResponseCache::open(&config).unwrap());
    let all = again.embed(texts(&["c", "a", "b"])).await.unwrap();
    assert_eq!(server.request_count(), 2);
    assert_eq!(all.vectors, vec![bc.vectors[1].clone(), ab.vectors[0].clone(), ab.vectors[1].clone()]);
    assert_eq!(all.usage.cache_hits, 1);
}

fn sent(server: &ScriptedLlm) -> Vec<Vec<String>> {
    server
        .requests()
        .iter()
        .filter(|r| r.is_embeddings())
        .map(assay_testkit::RecordedRequest::embedding_inputs)
        .collect()
}
