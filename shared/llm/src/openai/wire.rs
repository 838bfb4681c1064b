//! Lenient serde types for OpenAI-compatible replies. Every field is optional: backends differ
//! (llama.cpp, vLLM, Ollama, proxies), and a missing or odd field must not fail a call.

use serde::Deserialize;

use crate::types::{FinishReason, TokenLogprob};

#[derive(Debug, Default, Deserialize)]
pub(crate) struct ChatCompletion {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub choices: Option<Vec<Choice>>,
    #[serde(default)]
    pub usage: Option<WireUsage>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct Choice {
    #[serde(default)]
    pub message: Option<WireMessage>,
    /// Some servers put the text here (legacy completions shape).
    #[serde(default)]
    pub text: Option<String>,
    #[serde(default)]
    pub finish_reason: Option<String>,
    #[serde(default)]
    pub logprobs: Option<WireLogprobs>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct WireMessage {
    #[serde(default)]
    pub content: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct WireLogprobs {
    #[serde(default)]
    pub content: Option<Vec<WireTokenLogprob>>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct WireTokenLogprob {
    #[serde(default)]
    pub token: Option<String>,
    #[serde(default)]
    pub logprob: Option<f64>,
    #[serde(default)]
    pub top_logprobs: Option<Vec<WireTopLogprob>>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct WireTopLogprob {
    #[serde(default)]
    pub token: Option<String>,
    #[serde(default)]
    pub logprob: Option<f64>,
}

#[derive(Debug, Default, Clone, Copy, Deserialize)]
pub(crate) struct WireUsage {
    #[serde(default)]
    pub prompt_tokens: Option<u64>,
    #[serde(default)]
    pub completion_tokens: Option<u64>,
    /// `cached_tokens`: prompt tokens served from the provider's prompt cache.
    #[serde(default)]
    pub prompt_tokens_details: Option<PromptTokensDetails>,
}

#[derive(Debug, Default, Clone, Copy, Deserialize)]
pub(crate) struct PromptTokensDetails {
    #[serde(default)]
    pub cached_tokens: Option<u64>,
}

impl WireUsage {
    /// Prompt tokens served from the provider's prompt cache (0 when not reported).
    pub fn cached_prompt_tokens(&self) -> u64 {
        self.prompt_tokens_details.and_then(|d| d.cached_tokens).unwrap_or(0)
    }
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct EmbeddingList {
    #[serde(default)]
    pub data: Option<Vec<EmbeddingItem>>,
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub usage: Option<WireUsage>,
}

#[derive(Debug, Default, Deserialize)]
pub(crate) struct EmbeddingItem {
    #[serde(default)]
    pub index: Option<usize>,
    pub embedding: Vec<f32>,
}

/// A reply of Ollama's native `/api/chat` (not streamed).
#[derive(Debug, Default, Deserialize)]
pub(crate) struct OllamaChat {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub message: Option<WireMessage>,
    /// `stop`, `length`, ...
    #[serde(default)]
    pub done_reason: Option<String>,
    #[serde(default)]
    pub prompt_eval_count: Option<u64>,
    #[serde(default)]
    pub eval_count: Option<u64>,
    /// One per generated token, when asked (`logprobs: true`).
    #[serde(default)]
    pub logprobs: Option<Vec<WireTokenLogprob>>,
}

impl OllamaChat {
    /// The same reply in the OpenAI shape the rest of the client reads.
    pub fn into_completion(self) -> ChatCompletion {
        let choice = Choice {
            message: self.message,
            text: None,
            finish_reason: self.done_reason,
            logprobs: self.logprobs.map(|content| WireLogprobs { content: Some(content) }),
        };
        ChatCompletion {
            model: self.model,
            choices: Some(vec![choice]),
            usage: Some(WireUsage {
                prompt_tokens: self.prompt_eval_count,
                completion_tokens: self.eval_count,
                prompt_tokens_details: None,
            }),
        }
    }
}

/// A reply of Ollama's native `/api/embed`.
#[derive(Debug, Default, Deserialize)]
pub(crate) struct OllamaEmbeddings {
    #[serde(default)]
    pub model: Option<String>,
    #[serde(default)]
    pub embeddings: Option<Vec<Vec<f32>>>,
    #[serde(default)]
    pub prompt_eval_count: Option<u64>,
}

impl OllamaEmbeddings {
    /// The same reply in the OpenAI shape.
    pub fn into_list(self) -> EmbeddingList {
        EmbeddingList {
            data: self.embeddings.map(|vectors| {
                vectors
                    .into_iter()
                    .enumerate()
                    .map(|(i, embedding)| EmbeddingItem { index: Some(i), embedding })
                    .collect()
            }),
            model: self.model,
            usage: Some(WireUsage {
                prompt_tokens: self.prompt_eval_count,
                completion_tokens: None,
                prompt_tokens_details: None,
            }),
        }
    }
}

/// Map a wire `finish_reason`; `None` (null or missing) means the model stopped normally.
pub(crate) fn finish_reason(raw: Option<&str>) -> FinishReason {
    match raw {
        None | Some("stop") => FinishReason::Stop,
        Some("length") => FinishReason::Length,
        Some("content_filter") => FinishReason::ContentFilter,
        Some("tool_calls" | "function_call") => FinishReason::ToolCalls,
        Some(other) => FinishReason::Other(other.to_owned()),
    }
}

/// Alternatives of the first generated token: its `top_logprobs`, or the chosen token alone when
/// the backend sent no alternatives. `None` when the reply has no logprobs at all.
pub(crate) fn first_token_logprobs(logprobs: Option<&WireLogprobs>) -> Option<Vec<TokenLogprob>> {
    let first = logprobs?.content.as_ref()?.first()?;
    let top: Vec<TokenLogprob> = first
        .top_logprobs
        .iter()
        .flatten()
        .filter_map(|alt| Some(TokenLogprob { token: alt.token.clone()?, logprob: alt.logprob? }))
        .collect();
    if !top.is_empty() {
        return Some(top);
    }
    Some(vec![TokenLogprob { token: first.token.clone()?, logprob: first.logprob? }])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lenient_chat_completion() {
        let body = r#"{"choices":[{"message":{"content":null},"finish_reason":"eos_token"}]}"#;
        let parsed: ChatCompletion = serde_json::from_str(body).unwrap();
        let choice = &parsed.choices.as_ref().unwrap()[0];
        assert_eq!(choice.message.as_ref().unwrap().content, None);
        assert_eq!(finish_reason(choice.finish_reason.as_deref()), FinishReason::Other("eos_token".into()));
        assert!(parsed.usage.is_none());
        assert_eq!(finish_reason(None), FinishReason::Stop);
    }

    #[test]
    fn logprobs_top_or_chosen() {
        let body = r#"{"content":[{"token":"YES","logprob":-0.1,"top_logprobs":[{"token":"YES","logprob":-0.1},{"token":"NO","logprob":-2.3}]}]}"#;
        let lp: WireLogprobs = serde_json::from_str(body).unwrap();
        let top = first_token_logprobs(Some(&lp)).unwrap();
        assert_eq!(top.len(), 2);
        assert_eq!(top[1], TokenLogprob { token: "NO".into(), logprob: -2.3 });
        let body = r#"{"content":[{"token":"A","logprob":-0.5,"top_logprobs":null}]}"#;
        let lp: WireLogprobs = serde_json::from_str(body).unwrap();
        assert_eq!(first_token_logprobs(Some(&lp)).unwrap(), vec![TokenLogprob { token: "A".into(), logprob: -0.5 }]);
        let lp: WireLogprobs = serde_json::from_str(r#"{"content":null}"#).unwrap();
        assert_eq!(first_token_logprobs(Some(&lp)), None);
        assert_eq!(first_token_logprobs(None), None);
    }
}
