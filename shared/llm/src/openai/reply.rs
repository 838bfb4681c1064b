//! Reading replies: checking a 200 body is usable, and turning it into a [`ChatResponse`] or an
//! [`EmbeddingResponse`].

use super::wire;
use crate::json::extract_json;
use crate::types::{ChatRequest, ChatResponse, EmbeddingResponse, ResponseFormat, Usage};

/// Map a reply onto one of `options` (trimmed, case-insensitive, surrounding quotes and
/// punctuation ignored); `None` when it matches none.
pub fn normalise_choice(text: &str, options: &[String]) -> Option<String> {
    let cleaned = text.trim().trim_matches(|c: char| c.is_whitespace() || c.is_ascii_punctuation());
    options.iter().find(|option| option.trim().eq_ignore_ascii_case(cleaned)).cloned()
}

/// Why a 200 body cannot be used.
#[derive(Debug, thiserror::Error)]
pub(super) enum UnusableBody {
    #[error("{what} is not valid json: {source}")]
    NotJson { what: &'static str, source: serde_json::Error },
    #[error("chat completion has no choices")]
    NoChoices,
    #[error("expected {expected} embeddings, got {got}")]
    EmbeddingCount { expected: usize, got: usize },
}

/// A chat completion body, which must have at least one choice.
pub(super) fn parse_chat(bytes: &[u8]) -> Result<wire::ChatCompletion, UnusableBody> {
    let completion: wire::ChatCompletion =
        serde_json::from_slice(bytes).map_err(|source| UnusableBody::NotJson { what: "chat completion", source })?;
    if completion.choices.as_ref().is_none_or(Vec::is_empty) {
        return Err(UnusableBody::NoChoices);
    }
    Ok(completion)
}

/// A body of Ollama's native `/api/chat`, read in the OpenAI shape; it must hold a message.
pub(super) fn parse_ollama_chat(bytes: &[u8]) -> Result<wire::ChatCompletion, UnusableBody> {
    let reply: wire::OllamaChat =
        serde_json::from_slice(bytes).map_err(|source| UnusableBody::NotJson { what: "ollama chat reply", source })?;
    if reply.message.is_none() {
        return Err(UnusableBody::NoChoices);
    }
    Ok(reply.into_completion())
}

/// A body of Ollama's native `/api/embed`, read in the OpenAI shape, with `expected` embeddings.
pub(super) fn parse_ollama_embeddings(bytes: &[u8], expected: usize) -> Result<wire::EmbeddingList, UnusableBody> {
    let reply: wire::OllamaEmbeddings = serde_json::from_slice(bytes)
        .map_err(|source| UnusableBody::NotJson { what: "ollama embedding list", source })?;
    let list = reply.into_list();
    let got = list.data.as_ref().map_or(0, Vec::len);
    if got != expected {
        return Err(UnusableBody::EmbeddingCount { expected, got });
    }
    Ok(list)
}

/// An embedding list body, which must have `expected` embeddings.
pub(super) fn parse_embeddings(bytes: &[u8], expected: usize) -> Result<wire::EmbeddingList, UnusableBody> {
    let mut list: wire::EmbeddingList =
        serde_json::from_slice(bytes).map_err(|source| UnusableBody::NotJson { what: "embedding list", source })?;
    let data = list.data.get_or_insert_with(Vec::new);
    if data.len() != expected {
        return Err(UnusableBody::EmbeddingCount { expected, got: data.len() });
    }
    Ok(list)
}

/// The response to `request` from its first choice. `model` is the requested model (used when the
/// reply names none); `supports_logprobs` is the backend's configuration.
pub(super) fn chat_response(
    request: &ChatRequest,
    model: &str,
    completion: wire::ChatCompletion,
    retries: u32,
    supports_logprobs: bool,
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
    let first_token_logprobs = if request.top_logprobs.is_some() && supports_logprobs {
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
            cached_prompt_tokens: wire_usage.cached_prompt_tokens(),
            // Priced by the backend's price table where one is configured (assay-runtime).
            cost_usd: 0.0,
            unpriced_calls: 1,
            ..Usage::default()
        },
        schema_fallback: false,
        cached: false,
    }
}

/// The vectors in input order (by each item's `index`, else its position). `model` is the
/// requested model (used when the reply names none).
pub(super) fn embedding_response(list: wire::EmbeddingList, model: String, retries: u32) -> EmbeddingResponse {
    let mut data: Vec<(usize, Vec<f32>)> = list
        .data
        .unwrap_or_default()
        .into_iter()
        .enumerate()
        .map(|(position, item)| (item.index.unwrap_or(position), item.embedding))
        .collect();
    data.sort_by_key(|(index, _)| *index);
    let wire_usage = list.usage.unwrap_or_default();
    EmbeddingResponse {
        vectors: data.into_iter().map(|(_, v)| v).collect(),
        model: list.model.filter(|m| !m.is_empty()).unwrap_or(model),
        usage: Usage {
            calls: 1,
            prompt_tokens: wire_usage.prompt_tokens.unwrap_or(0),
            completion_tokens: 0,
            cache_hits: 0,
            retries,
            schema_fallbacks: 0,
            cached_prompt_tokens: 0,
            cost_usd: 0.0,
            unpriced_calls: 1,
            ..Usage::default()
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choice_normalisation() {
        let options = vec!["YES".to_owned(), "NO".to_owned()];
        assert_eq!(normalise_choice(" yes.\n", &options), Some("YES".into()));
        assert_eq!(normalise_choice("\"No\"", &options), Some("NO".into()));
        assert_eq!(normalise_choice("maybe", &options), None);
    }

    #[test]
    fn ollama_native_replies_read_as_openai_ones() {
        let body = br#"{"model":"qwen3:0.6b","created_at":"2026-12-03T09:00:00Z","message":{"role":"assistant","content":"{\"a\":1}"},
            "done":true,"done_reason":"length","prompt_eval_count":21,"eval_count":7,
            "logprobs":[{"token":"{","logprob":-0.01,"top_logprobs":[{"token":"{","logprob":-0.01},{"token":"Sure","logprob":-4.6}]}]}"#;
        let completion = parse_ollama_chat(body).unwrap();
        let request = ChatRequest {
            response_format: ResponseFormat::JsonSchema { name: "s".into(), schema: serde_json::json!({}) },
            top_logprobs: Some(2),
            ..ChatRequest::default()
        };
        let response = chat_response(&request, "asked", completion, 0, true);
        assert_eq!(response.json, Some(serde_json::json!({"a": 1})));
        assert_eq!((response.usage.prompt_tokens, response.usage.completion_tokens), (21, 7));
        assert_eq!(response.finish_reason, crate::types::FinishReason::Length);
        assert_eq!(response.model, "qwen3:0.6b");
        assert_eq!(response.first_token_logprobs.map(|l| l.len()), Some(2));
        assert!(matches!(parse_ollama_chat(br#"{"error":"model not found"}"#), Err(UnusableBody::NoChoices)));
        let list =
            parse_ollama_embeddings(br#"{"model":"e","embeddings":[[0.1,0.2],[0.3,0.4]],"prompt_eval_count":4}"#, 2)
                .unwrap();
        let embedded = embedding_response(list, "e".into(), 0);
        assert_eq!(embedded.vectors, vec![vec![0.1, 0.2], vec![0.3, 0.4]]);
        assert_eq!(embedded.usage.prompt_tokens, 4);
        assert!(parse_ollama_embeddings(br#"{"embeddings":[[0.1]]}"#, 2).is_err());
    }
}
