//! What one call's context holds: a model's context window as its server tells it
//! ([`crate::ChatModel::context_tokens`]), and a refusal of a prompt over it
//! ([`context_refusal`]) read for the figures the server gave, so a stage can fit its prompt and
//! call again instead of failing.

use crate::LlmError;

/// A request refused for being over the model's context, with the figures the server gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextRefusal {
    /// Tokens one call may hold (prompt and reply), when the server said.
    pub context_tokens: Option<u32>,
    /// Tokens of the refused prompt, when the server said.
    pub prompt_tokens: Option<u32>,
}

/// Whether an error message refuses the request itself, whatever form its schema takes: the
/// prompt is over the model's context (vLLM and OpenAI "maximum context length" /
/// `context_length_exceeded`, llama.cpp's `exceed_context_size_error`, "prompt is too long",
/// "too many tokens"). A weaker structured-output form would be refused the same way.
pub fn refuses_the_request(message: &str) -> bool {
    let text = message.to_ascii_lowercase();
    let context = text.contains("context")
        && ["length", "exceed", "too long", "window", "size", "limit"].iter().any(|w| text.contains(w));
    context || text.contains("prompt is too long") || text.contains("too many tokens")
}

/// The figures of a context-length refusal (an invalid request whose message
/// [refuses the request](refuses_the_request)), as the servers spell them:
/// - llama.cpp's `llama-server`: `"n_prompt_tokens":10218,"n_ctx":8192` in its error body;
/// - vLLM and OpenAI: "maximum context length is 4096 tokens. However, you requested 5000 tokens
///   (4000 in the messages, ...)" or "... your request has 3000 input tokens" or "... your
///   messages resulted in 9000 tokens";
/// - the embedded backend: "prompt of 9000 tokens exceeds the local context window of 8192 tokens".
///
/// `None` for any other error.
pub fn context_refusal(error: &LlmError) -> Option<ContextRefusal> {
    let LlmError::InvalidRequest(message) = error else {
        return None;
    };
    if !refuses_the_request(message) {
        return None;
    }
    let text = message.to_ascii_lowercase();
    let first = |keys: &[&str]| keys.iter().find_map(|k| number_after(&text, k));
    Some(ContextRefusal {
        context_tokens: first(&["\"n_ctx\":", "maximum context length is ", "context window of "]),
        prompt_tokens: first(&["\"n_prompt_tokens\":", "your request has ", "resulted in ", "prompt of "])
            .or_else(|| number_before(&text, " in the messages")),
    })
}

/// The whole number right after `key` in `text` (spaces allowed between).
fn number_after(text: &str, key: &str) -> Option<u32> {
    let rest = &text[text.find(key)? + key.len()..];
    let rest = rest.trim_start();
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// The whole number right before `key` in `text`.
fn number_before(text: &str, key: &str) -> Option<u32> {
    let head = &text[..text.find(key)?];
    let start = head.trim_end_matches(|c: char| c.is_ascii_digit()).len();
    head[start..].parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(message: &str) -> Option<ContextRefusal> {
        context_refusal(&LlmError::InvalidRequest(message.into()))
    }

    #[test]
    fn each_servers_refusal_gives_its_figures() {
        let llama = r#"http 400: {"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error","n_prompt_tokens":10218,"n_ctx":8192}}"#;
        assert_eq!(refusal(llama), Some(ContextRefusal { context_tokens: Some(8192), prompt_tokens: Some(10218) }));
        let vllm_old = "http 400: This model's maximum context length is 4096 tokens. However, you requested 5000 tokens (4000 in the messages, 1000 in the completion). Please reduce the length of the messages or completion.";
        assert_eq!(refusal(vllm_old), Some(ContextRefusal { context_tokens: Some(4096), prompt_tokens: Some(4000) }));
        let vllm = "http 400: This model's maximum context length is 2048 tokens. However, your request has 3000 input tokens. Please reduce the length of the input messages.";
        assert_eq!(refusal(vllm), Some(ContextRefusal { context_tokens: Some(2048), prompt_tokens: Some(3000) }));
        let openai = r#"http 400: {"error":{"message":"This model's maximum context length is 8192 tokens. However, your messages resulted in 9000 tokens. Please reduce the length of the messages.","code":"context_length_exceeded"}}"#;
        assert_eq!(refusal(openai), Some(ContextRefusal { context_tokens: Some(8192), prompt_tokens: Some(9000) }));
        let local = "prompt of 9000 tokens exceeds the local context window of 8192 tokens";
        assert_eq!(refusal(local), Some(ContextRefusal { context_tokens: Some(8192), prompt_tokens: Some(9000) }));
        // A refusal without figures is still a refusal.
        assert_eq!(
            refusal("http 400: prompt is too long"),
            Some(ContextRefusal { context_tokens: None, prompt_tokens: None })
        );
    }

    #[test]
    fn other_errors_are_not_context_refusals() {
        assert_eq!(refusal("http 400: response_format json_schema is not supported"), None);
        assert_eq!(context_refusal(&LlmError::Unavailable("maximum context length is 4096 tokens".into())), None);
    }
}
