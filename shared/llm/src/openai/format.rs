//! The structured-output fallback ladder: how a request's JSON schema is delivered
//! (`json_schema`, then `json_object` with the schema, then the schema in the prompt), when a
//! backend's answer counts as rejecting the form, and the memory of the form that worked.

use std::sync::atomic::{AtomicU8, Ordering};

use crate::types::{LlmError, ResponseFormat};

/// How the JSON schema of a request is delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SchemaDelivery {
    None,
    /// `response_format: {"type": "json_schema", ...}` (OpenAI, vLLM, llama.cpp server, Ollama).
    ResponseFormat,
    /// `response_format: {"type": "json_object", "schema": ...}` plus the schema in the prompt:
    /// servers that enforce the schema this way (llama-cpp-python) or JSON mode at least.
    JsonObject,
    /// The schema written into the last user message only.
    Prompt,
}

impl SchemaDelivery {
    const LEVELS: [SchemaDelivery; 3] = [Self::ResponseFormat, Self::JsonObject, Self::Prompt];

    fn level(self) -> u8 {
        match self {
            Self::ResponseFormat | Self::None => 0,
            Self::JsonObject => 1,
            Self::Prompt => 2,
        }
    }

    /// The next, weaker form after a rejection (None after the prompt form).
    pub(super) fn weaker(self) -> Option<Self> {
        match self {
            Self::ResponseFormat => Some(Self::JsonObject),
            Self::JsonObject => Some(Self::Prompt),
            Self::Prompt | Self::None => None,
        }
    }

    /// Whether this is a fallback form (the schema is not sent as native `json_schema`).
    pub(super) fn fell_back(self) -> bool {
        matches!(self, Self::JsonObject | Self::Prompt)
    }
}

/// The first schema delivery a backend accepted after a rejection: 0 native json_schema,
/// 1 json_object with the schema, 2 the schema in the prompt. Only ever moves down the ladder.
#[derive(Debug, Default)]
pub(super) struct SchemaMemory {
    level: AtomicU8,
}

impl SchemaMemory {
    /// The form to try first for a request with this response format.
    pub(super) fn first_form(&self, format: &ResponseFormat, supports_json_schema: bool) -> SchemaDelivery {
        match format {
            ResponseFormat::JsonSchema { .. } if supports_json_schema => {
                let level = self.level.load(Ordering::Relaxed) as usize;
                SchemaDelivery::LEVELS[level.min(SchemaDelivery::LEVELS.len() - 1)]
            }
            ResponseFormat::JsonSchema { .. } => SchemaDelivery::Prompt,
            ResponseFormat::Text | ResponseFormat::Choice(_) => SchemaDelivery::None,
        }
    }

    /// Remember a form that worked after a fallback (never moves back up the ladder).
    pub(super) fn remember(&self, worked: SchemaDelivery) {
        self.level.fetch_max(worked.level(), Ordering::Relaxed);
    }

    /// Whether the native JSON schema form has been rejected.
    pub(super) fn rejected(&self) -> bool {
        self.level.load(Ordering::Relaxed) > 0
    }

    /// The remembered form: `json_schema`, `json_object` or `prompt`.
    pub(super) fn name(&self) -> &'static str {
        match self.level.load(Ordering::Relaxed) {
            0 => "json_schema",
            1 => "json_object",
            _ => "prompt",
        }
    }
}

/// Whether an error body is about the structured-output request (`response_format` / `json_schema`).
pub(super) fn complains_about_schema(body: &[u8]) -> bool {
    let text = String::from_utf8_lossy(body).to_ascii_lowercase();
    text.contains("response_format") || text.contains("json_schema")
}

/// Whether a failed call (after retries) rejected the structured-output form, so a weaker form
/// should be tried: any 400, or another error status whose message names the form.
pub(super) fn is_schema_rejection(status: u16, error: &LlmError) -> bool {
    status == 400 || (status >= 400 && complains_about_schema(error.to_string().as_bytes()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn ladder_goes_down_and_is_remembered() {
        let memory = SchemaMemory::default();
        let schema = ResponseFormat::JsonSchema { name: "s".into(), schema: json!({"type": "object"}) };
        assert_eq!(memory.first_form(&schema, true), SchemaDelivery::ResponseFormat);
        assert_eq!(memory.first_form(&schema, false), SchemaDelivery::Prompt);
        assert_eq!(memory.first_form(&ResponseFormat::Text, true), SchemaDelivery::None);
        assert_eq!(SchemaDelivery::ResponseFormat.weaker(), Some(SchemaDelivery::JsonObject));
        assert_eq!(SchemaDelivery::Prompt.weaker(), None);
        assert!(!memory.rejected());
        memory.remember(SchemaDelivery::Prompt);
        memory.remember(SchemaDelivery::JsonObject);
        assert!(memory.rejected());
        assert_eq!(memory.name(), "prompt");
        assert_eq!(memory.first_form(&schema, true), SchemaDelivery::Prompt);
    }

    #[test]
    fn schema_rejections() {
        assert!(is_schema_rejection(400, &LlmError::InvalidRequest("anything".into())));
        assert!(is_schema_rejection(500, &LlmError::Unavailable("http 500: bad response_format".into())));
        assert!(!is_schema_rejection(500, &LlmError::Unavailable("http 500: boom".into())));
        assert!(!is_schema_rejection(200, &LlmError::MalformedReply("json_schema".into())));
    }
}
