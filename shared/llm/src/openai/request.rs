//! The chat request body: sampling fields, the token limit under its configured name, and the
//! response format written in the given schema delivery form.

use serde_json::{Value, json};

use super::api::Api;
use super::config::OpenAiConfig;
use super::format::{SchemaDelivery, for_grammar};
use crate::types::{ChatRequest, Message, ResponseFormat, Role};

fn append_to_last_user(messages: &mut Vec<Message>, instruction: &str) {
    match messages.iter_mut().rev().find(|m| m.role == Role::User) {
        Some(message) => {
            message.content.push_str("\n\n");
            message.content.push_str(instruction);
        }
        None => messages.push(Message::user(instruction)),
    }
}

/// The instruction appended to the prompt when a schema cannot go in `response_format`.
pub fn schema_instruction(schema: &Value) -> String {
    format!("Reply with only a JSON value matching this JSON schema: {schema}")
}

/// The GBNF grammar holding a [`ResponseFormat::Choice`] reply to its options (their case
/// variants included: see [`crate::grammar::choice_grammar`]), so the first token is an answer and
/// its logprobs are the model's preference between them; `None` for other formats.
pub(super) fn choice_grammar(request: &ChatRequest) -> Option<String> {
    match &request.response_format {
        ResponseFormat::Choice(options) => crate::grammar::choice_grammar(options).ok(),
        ResponseFormat::Text | ResponseFormat::JsonSchema { .. } => None,
    }
}

/// The instruction appended to the prompt for [`ResponseFormat::Choice`].
pub fn choice_instruction(options: &[String]) -> String {
    format!("Answer with exactly one of: {}", options.join(", "))
}

/// The chat body for `request` in the backend's API ([`Api`]): see [`openai_body`] and
/// [`ollama_body`]. `llama_cpp`: the server said it is llama.cpp's (its `/props`), whose grammar
/// from a JSON schema leaves a number's bounds out: the native schema goes with bounded numbers
/// as enums ([`for_grammar`]), as the `json_object` form always does.
pub(super) fn chat_body(
    config: &OpenAiConfig,
    request: &ChatRequest,
    model: &str,
    delivery: SchemaDelivery,
    (choice_grammar, llama_cpp): (bool, bool),
) -> Value {
    match config.api() {
        Api::OpenAi => openai_body(config, request, model, delivery, (choice_grammar, llama_cpp)),
        Api::Ollama => ollama_body(config, request, model, delivery),
    }
}

/// The body of Ollama's native `/api/chat`: not streamed, sampling settings under `options`
/// (`num_predict` for the token limit), and the schema in `format` (which Ollama holds replies to
/// by grammar) with the schema in the prompt too, as Ollama advises; JSON mode is
/// `format: "json"`. Choices go in the prompt (Ollama takes no GBNF grammar).
pub(super) fn ollama_body(
    config: &OpenAiConfig,
    request: &ChatRequest,
    model: &str,
    delivery: SchemaDelivery,
) -> Value {
    let mut messages = request.messages.clone();
    let mut body = serde_json::Map::new();
    match (&request.response_format, delivery) {
        (
            ResponseFormat::JsonSchema { schema, .. },
            SchemaDelivery::ResponseFormat | SchemaDelivery::JsonObject | SchemaDelivery::Tgi,
        ) => {
            body.insert("format".into(), for_grammar(schema));
            append_to_last_user(&mut messages, &schema_instruction(schema));
        }
        (ResponseFormat::JsonSchema { schema, .. }, SchemaDelivery::JsonMode) => {
            body.insert("format".into(), json!("json"));
            append_to_last_user(&mut messages, &schema_instruction(schema));
        }
        (ResponseFormat::JsonSchema { schema, .. }, SchemaDelivery::Prompt | SchemaDelivery::None) => {
            append_to_last_user(&mut messages, &schema_instruction(schema));
        }
        (ResponseFormat::Choice(options), _) => append_to_last_user(&mut messages, &choice_instruction(options)),
        (ResponseFormat::Text, _) => {}
    }
    body.insert("model".into(), json!(model));
    body.insert("messages".into(), json!(messages));
    body.insert("stream".into(), json!(false));
    let mut options = serde_json::Map::new();
    if let Some(t) = request.temperature {
        options.insert("temperature".into(), json!(t));
    }
    if let Some(p) = request.top_p {
        options.insert("top_p".into(), json!(p));
    }
    if let Some(seed) = request.seed {
        options.insert("seed".into(), json!(seed));
    }
    if let Some(max) = request.max_tokens {
        options.insert("num_predict".into(), json!(max));
    }
    if !request.stop.is_empty() {
        options.insert("stop".into(), json!(request.stop));
    }
    if !options.is_empty() {
        body.insert("options".into(), Value::Object(options));
    }
    if let Some(k) = request.top_logprobs
        && config.supports_logprobs
    {
        body.insert("logprobs".into(), json!(true));
        body.insert("top_logprobs".into(), json!(k.clamp(1, 20)));
    }
    Value::Object(body)
}

/// The `/chat/completions` body for `request`, with its schema delivered as `delivery`, and a
/// choice's options as a GBNF `grammar` too when `choice_grammar` (llama.cpp's servers hold the
/// reply to it; see [`choice_grammar`]).
pub(super) fn openai_body(
    config: &OpenAiConfig,
    request: &ChatRequest,
    model: &str,
    delivery: SchemaDelivery,
    (choice_grammar, llama_cpp): (bool, bool),
) -> Value {
    let mut messages = request.messages.clone();
    let mut body = serde_json::Map::new();
    if choice_grammar && let Some(grammar) = self::choice_grammar(request) {
        body.insert("grammar".into(), json!(grammar));
    }
    match (&request.response_format, delivery) {
        (ResponseFormat::JsonSchema { name, schema }, SchemaDelivery::ResponseFormat) => {
            let schema = if llama_cpp { for_grammar(schema) } else { schema.clone() };
            body.insert(
                "response_format".into(),
                json!({"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": true}}),
            );
        }
        (ResponseFormat::JsonSchema { schema, .. }, SchemaDelivery::JsonObject) => {
            body.insert("response_format".into(), json!({"type": "json_object", "schema": for_grammar(schema)}));
            append_to_last_user(&mut messages, &schema_instruction(schema));
        }
        (ResponseFormat::JsonSchema { schema, .. }, SchemaDelivery::Tgi) => {
            body.insert("response_format".into(), json!({"type": "json", "value": for_grammar(schema)}));
            append_to_last_user(&mut messages, &schema_instruction(schema));
        }
        (ResponseFormat::JsonSchema { schema, .. }, SchemaDelivery::JsonMode) => {
            body.insert("response_format".into(), json!({"type": "json_object"}));
            append_to_last_user(&mut messages, &schema_instruction(schema));
        }
        (ResponseFormat::JsonSchema { schema, .. }, SchemaDelivery::Prompt | SchemaDelivery::None) => {
            append_to_last_user(&mut messages, &schema_instruction(schema));
        }
        (ResponseFormat::Choice(options), _) => append_to_last_user(&mut messages, &choice_instruction(options)),
        (ResponseFormat::Text, _) => {}
    }
    body.insert("model".into(), json!(model));
    body.insert("messages".into(), json!(messages));
    if let Some(t) = request.temperature {
        body.insert("temperature".into(), json!(t));
    }
    if let Some(p) = request.top_p {
        body.insert("top_p".into(), json!(p));
    }
    if let Some(seed) = request.seed {
        body.insert("seed".into(), json!(seed));
    }
    if let Some(max) = request.max_tokens {
        body.insert(config.max_tokens_field.as_str().into(), json!(max));
    }
    if !request.stop.is_empty() {
        body.insert("stop".into(), json!(request.stop));
    }
    if let Some(k) = request.top_logprobs
        && config.supports_logprobs
    {
        body.insert("logprobs".into(), json!(true));
        body.insert("top_logprobs".into(), json!(k.clamp(1, 20)));
    }
    Value::Object(body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::openai::config::MaxTokensField;

    #[test]
    fn body_has_fields_and_configured_max_tokens_name() {
        let config = OpenAiConfig { max_tokens_field: MaxTokensField::MaxCompletionTokens, ..OpenAiConfig::default() };
        let request = ChatRequest {
            messages: vec![Message::system("s"), Message::user("q")],
            temperature: Some(0.0),
            seed: Some(7),
            max_tokens: Some(12),
            stop: vec!["\n".into()],
            top_logprobs: Some(50),
            ..ChatRequest::default()
        };
        let body = chat_body(&config, &request, "m", SchemaDelivery::None, (true, false));
        assert_eq!(body["max_completion_tokens"], 12);
        assert!(body.get("max_tokens").is_none());
        assert_eq!(body["seed"], 7);
        assert_eq!(body["logprobs"], true);
        assert_eq!(body["top_logprobs"], 20);
        assert_eq!(body["stop"], json!(["\n"]));
        assert!(body.get("response_format").is_none());
        assert!(body.get("top_p").is_none());
        assert!(body.get("grammar").is_none(), "free text has no grammar");
    }

    #[test]
    fn a_choice_carries_its_grammar_unless_refused() {
        let config = OpenAiConfig::default();
        let request = ChatRequest {
            messages: vec![Message::user("Is it short?")],
            response_format: ResponseFormat::Choice(vec!["YES".into(), "NO".into()]),
            ..ChatRequest::default()
        };
        let body = chat_body(&config, &request, "m", SchemaDelivery::None, (true, false));
        let grammar = body["grammar"].as_str().unwrap();
        assert!(
            grammar.starts_with("root ::=") && grammar.contains("\"YES\"") && grammar.contains("\"No\""),
            "{grammar}"
        );
        assert!(body["messages"][0]["content"].as_str().unwrap().ends_with("Answer with exactly one of: YES, NO"));
        assert!(chat_body(&config, &request, "m", SchemaDelivery::None, (false, false)).get("grammar").is_none());
    }

    #[test]
    fn schema_delivery_forms() {
        let config = OpenAiConfig::default();
        let schema = json!({"type": "object"});
        let request = ChatRequest {
            messages: vec![Message::user("q"), Message::assistant("a")],
            response_format: ResponseFormat::JsonSchema { name: "s".into(), schema: schema.clone() },
            ..ChatRequest::default()
        };
        let native = chat_body(&config, &request, "m", SchemaDelivery::ResponseFormat, (true, false));
        assert_eq!(native["response_format"]["json_schema"]["strict"], true);
        let bounded = json!({"type": "object", "properties": {"p": {"type": "number", "minimum": 0, "maximum": 1}}});
        let bounded_request = ChatRequest {
            response_format: ResponseFormat::JsonSchema { name: "s".into(), schema: bounded.clone() },
            ..request.clone()
        };
        let elsewhere = chat_body(&config, &bounded_request, "m", SchemaDelivery::ResponseFormat, (true, false));
        assert_eq!(elsewhere["response_format"]["json_schema"]["schema"], bounded, "sent as it is");
        let llama = chat_body(&config, &bounded_request, "m", SchemaDelivery::ResponseFormat, (true, true));
        let p = &llama["response_format"]["json_schema"]["schema"]["properties"]["p"];
        assert_eq!(p["enum"].as_array().map(Vec::len), Some(101), "llama.cpp's grammar keeps an enum: {p}");
        assert_eq!(native["messages"][0]["content"], "q");
        let prompt = chat_body(&config, &request, "m", SchemaDelivery::Prompt, (true, false));
        assert!(prompt.get("response_format").is_none());
        let content = prompt["messages"][0]["content"].as_str().unwrap();
        assert!(content.starts_with("q\n\n") && content.contains(&schema.to_string()));
        let tgi = chat_body(&config, &request, "m", SchemaDelivery::Tgi, (true, false));
        assert_eq!(tgi["response_format"], json!({"type": "json", "value": schema}));
        assert!(tgi["messages"][0]["content"].as_str().unwrap().contains(&schema.to_string()));
    }

    #[test]
    fn ollama_native_bodies() {
        let config = OpenAiConfig::new("http://127.0.0.1:11434/api");
        let schema = json!({"type": "object", "properties": {"p": {"type": "number", "minimum": 0, "maximum": 1}}});
        let request = ChatRequest {
            messages: vec![Message::user("q")],
            response_format: ResponseFormat::JsonSchema { name: "s".into(), schema: schema.clone() },
            temperature: Some(0.0),
            max_tokens: Some(64),
            seed: Some(3),
            stop: vec!["END".into()],
            top_logprobs: Some(5),
            ..ChatRequest::default()
        };
        let native = chat_body(&config, &request, "m", SchemaDelivery::ResponseFormat, (true, false));
        assert_eq!(native["stream"], false);
        assert_eq!(native["format"]["properties"]["p"]["enum"].as_array().map(Vec::len), Some(101), "bounds as enums");
        assert_eq!(native["options"], json!({"temperature": 0.0, "seed": 3, "num_predict": 64, "stop": ["END"]}));
        assert_eq!((native["logprobs"].clone(), native["top_logprobs"].clone()), (json!(true), json!(5)));
        assert!(native.get("response_format").is_none() && native.get("max_tokens").is_none());
        assert!(native["messages"][0]["content"].as_str().unwrap().contains(&schema.to_string()));
        assert_eq!(chat_body(&config, &request, "m", SchemaDelivery::JsonMode, (true, false))["format"], "json");
        assert!(chat_body(&config, &request, "m", SchemaDelivery::Prompt, (true, false)).get("format").is_none());
        let choice = ChatRequest {
            messages: vec![Message::user("Is it short?")],
            response_format: ResponseFormat::Choice(vec!["YES".into(), "NO".into()]),
            ..ChatRequest::default()
        };
        let body = chat_body(&config, &choice, "m", SchemaDelivery::None, (true, false));
        assert!(body.get("grammar").is_none() && body.get("options").is_none());
    }
}
