//! The structured-output ladder: how a request's JSON schema is delivered (`json_schema`, then
//! `json_object` with the schema, then JSON mode with the schema in the prompt, then the schema in
//! the prompt only), when a backend's answer counts as rejecting the form, and the memory of the
//! form that worked, per model, negotiated once.
//!
//! A form can also be accepted and not enforced (vLLM ignores keys it no longer knows with a 200,
//! llama.cpp ignores a grammar it cannot parse): every structured reply is checked against the
//! schema it was asked for ([`Validators`]), and [`VIOLATIONS_TO_DEMOTE`] replies that do not
//! even have its shape under a form that claims enforcement move the model one step down
//! ([`ModelForms::violated`]). A reply that has the shape and breaks a bound is counted, not
//! evidence: grammars enforce shapes and may leave bounds out.

use std::collections::HashMap;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use serde_json::{Value, json};

use super::api::Api;
use crate::context::refuses_the_request;
use crate::types::{LlmError, ResponseFormat};

/// How the JSON schema of a request is delivered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SchemaDelivery {
    None,
    /// `response_format: {"type": "json_schema", ...}` (OpenAI, vLLM, llama.cpp's llama-server,
    /// Ollama's OpenAI endpoint).
    ResponseFormat,
    /// `response_format: {"type": "json_object", "schema": ...}` plus the schema in the prompt:
    /// servers that enforce the schema this way (llama-cpp-python, by grammar).
    JsonObject,
    /// `response_format: {"type": "json", "value": ...}` plus the schema in the prompt: Hugging
    /// Face's text-generation-inference (TGI), which holds replies to it by grammar and refuses the
    /// OpenAI forms with a 422 asking for `value`.
    Tgi,
    /// `response_format: {"type": "json_object"}` (JSON mode, no schema) plus the schema in the
    /// prompt.
    JsonMode,
    /// The schema written into the last user message only.
    Prompt,
}

impl SchemaDelivery {
    const LEVELS: [SchemaDelivery; 5] =
        [Self::ResponseFormat, Self::JsonObject, Self::Tgi, Self::JsonMode, Self::Prompt];

    fn level(self) -> u8 {
        match self {
            Self::ResponseFormat | Self::None => 0,
            Self::JsonObject => 1,
            Self::Tgi => 2,
            Self::JsonMode => 3,
            Self::Prompt => 4,
        }
    }

    /// The next, weaker form after a rejection whose message is `rejection` (None after the
    /// prompt form). A rejection in TGI's words ([`asks_for_tgi_grammar`]) goes to TGI's form; one
    /// that names `json_object` skips JSON mode (that type is refused); TGI's form is followed by
    /// the prompt (TGI's JSON mode needs a schema too). Ollama's native API has two forms below
    /// its schema `format`: `format: "json"` (JSON mode) and the prompt.
    pub(super) fn weaker(self, rejection: &str, api: Api) -> Option<Self> {
        let refuses_json_object = rejection.to_ascii_lowercase().contains("json_object");
        let tgi = asks_for_tgi_grammar(rejection);
        match self {
            Self::ResponseFormat | Self::JsonObject | Self::Tgi if api == Api::Ollama => Some(Self::JsonMode),
            Self::ResponseFormat | Self::JsonObject if tgi => Some(Self::Tgi),
            Self::ResponseFormat => Some(Self::JsonObject),
            Self::JsonObject if refuses_json_object => Some(Self::Prompt),
            Self::JsonObject => Some(Self::JsonMode),
            Self::Tgi | Self::JsonMode => Some(Self::Prompt),
            Self::Prompt | Self::None => None,
        }
    }

    /// Whether this form is further down the ladder than `other`.
    pub(super) fn weaker_than(self, other: Self) -> bool {
        self.level() > other.level()
    }

    /// Whether the server claims to hold replies to the schema in this form (native
    /// `json_schema`, and `json_object` with a schema, which llama.cpp turns into a grammar).
    pub(super) fn enforces(self) -> bool {
        matches!(self, Self::ResponseFormat | Self::JsonObject | Self::Tgi)
    }

    /// Whether this is a fallback form (the schema is not sent as native `json_schema`).
    pub(super) fn fell_back(self) -> bool {
        matches!(self, Self::JsonObject | Self::Tgi | Self::JsonMode | Self::Prompt)
    }

    /// The form's name: `json_schema`, `json_object`, `json_mode` or `prompt`.
    pub(super) fn name(self) -> &'static str {
        match self {
            Self::ResponseFormat | Self::None => "json_schema",
            Self::JsonObject => "json_object",
            Self::Tgi => "tgi",
            Self::JsonMode => "json_mode",
            Self::Prompt => "prompt",
        }
    }
}

/// Whether a rejection is text-generation-inference's: its router reads `response_format` as
/// `{"type": "json" | "json_object" | "regex" | ..., "value": ...}`, so the OpenAI forms fail to
/// deserialize with "missing field `value`" (TGI 2.x-3.x) or "unknown variant `json_schema`,
/// expected `json` or `regex`" (TGI 1.x-2.0).
pub(super) fn asks_for_tgi_grammar(rejection: &str) -> bool {
    let text = rejection.to_ascii_lowercase();
    text.contains("missing field `value`") || text.contains("expected `json`")
}

/// How structured output is sent to a backend (`backends.<name>.structured_output`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum StructuredOutput {
    /// Negotiated once per model: the forms are tried strongest first, the first that works is
    /// kept for the process.
    #[default]
    Auto,
    /// `response_format: json_schema` only.
    JsonSchema,
    /// `response_format: {"type": "json_object", "schema": ...}` (llama-cpp-python).
    JsonObject,
    /// `response_format: {"type": "json", "value": ...}` (text-generation-inference).
    Tgi,
    /// `response_format: {"type": "json_object"}` with the schema in the prompt.
    JsonMode,
    /// The schema in the prompt only.
    Prompt,
}

impl StructuredOutput {
    /// Parse a configuration value: `auto`, `json_schema`, `json_object`, `tgi`, `json_mode` or
    /// `prompt`.
    pub fn parse(value: &str) -> Option<Self> {
        Some(match value {
            "auto" => Self::Auto,
            "json_schema" => Self::JsonSchema,
            "json_object" => Self::JsonObject,
            "tgi" => Self::Tgi,
            "json_mode" => Self::JsonMode,
            "prompt" => Self::Prompt,
            _ => return None,
        })
    }

    /// The one form a fixed setting sends; `None` for `auto`.
    pub(super) fn fixed(self) -> Option<SchemaDelivery> {
        match self {
            Self::Auto => None,
            Self::JsonSchema => Some(SchemaDelivery::ResponseFormat),
            Self::JsonObject => Some(SchemaDelivery::JsonObject),
            Self::Tgi => Some(SchemaDelivery::Tgi),
            Self::JsonMode => Some(SchemaDelivery::JsonMode),
            Self::Prompt => Some(SchemaDelivery::Prompt),
        }
    }
}

/// What one model of a backend accepts: the first schema delivery that worked (0 native
/// json_schema ... 4 the prompt; only ever moves down the ladder), whether it was negotiated, and
/// the gate that makes a first burst of calls negotiate once.
#[derive(Debug, Default)]
pub(super) struct ModelForms {
    level: AtomicU8,
    negotiated: AtomicBool,
    /// Held by the call that negotiates; the others of the first burst wait on it.
    pub(super) gate: tokio::sync::Mutex<()>,
    /// Replies that broke their schema under an enforcing form: (the form's level, how many).
    violations: Mutex<(u8, u32)>,
    /// The server refused a choice's `grammar` field (OpenAI: "Unrecognized request argument"):
    /// later choices go without it.
    grammar_refused: AtomicBool,
}

/// Replies that break their schema under a form that claims enforcement before the model moves
/// one step down the ladder. Under a form that is enforced they do not happen (replies cut at the
/// token limit and empty replies, a refusal, are not counted), so a few are evidence enough; one
/// could be a server's slip.
pub(super) const VIOLATIONS_TO_DEMOTE: u32 = 3;

impl ModelForms {
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

    /// The form a schema request starts in now.
    pub(super) fn current(&self) -> SchemaDelivery {
        SchemaDelivery::LEVELS[(self.level() as usize).min(SchemaDelivery::LEVELS.len() - 1)]
    }

    /// Remember a form that worked (never moves back up the ladder).
    pub(super) fn remember(&self, worked: SchemaDelivery) {
        self.level.fetch_max(worked.level(), Ordering::Relaxed);
    }

    /// Note a reply sent in `form` that broke its schema. When it is the
    /// [`VIOLATIONS_TO_DEMOTE`]th under the form the model uses now, the model moves to the next
    /// weaker form, returned; the other calls already sent in the form count toward nothing more.
    pub(super) fn violated(&self, form: SchemaDelivery, api: Api) -> Option<SchemaDelivery> {
        if !form.enforces() {
            return None;
        }
        let mut violations = self.violations.lock().unwrap_or_else(PoisonError::into_inner);
        if self.level() != form.level() {
            return None;
        }
        if violations.0 != form.level() {
            *violations = (form.level(), 0);
        }
        violations.1 += 1;
        if violations.1 < VIOLATIONS_TO_DEMOTE {
            return None;
        }
        let weaker = form.weaker("", api)?;
        self.level.fetch_max(weaker.level(), Ordering::Relaxed);
        *violations = (weaker.level(), 0);
        Some(weaker)
    }

    /// Whether a choice is sent with its grammar.
    pub(super) fn sends_grammar(&self) -> bool {
        !self.grammar_refused.load(Ordering::Relaxed)
    }

    /// The server refused the grammar field; true the first time.
    pub(super) fn refuse_grammar(&self) -> bool {
        !self.grammar_refused.swap(true, Ordering::AcqRel)
    }

    /// Mark the form settled; true the first time.
    pub(super) fn settle(&self) -> bool {
        !self.negotiated.swap(true, Ordering::AcqRel)
    }

    fn level(&self) -> u8 {
        self.level.load(Ordering::Relaxed)
    }
}

/// The forms every model of one backend accepts, by model name.
#[derive(Debug, Default)]
pub(super) struct SchemaMemory {
    models: std::sync::Mutex<HashMap<String, Arc<ModelForms>>>,
}

impl SchemaMemory {
    /// The forms of `model` (created on first use).
    pub(super) fn of(&self, model: &str) -> Arc<ModelForms> {
        let mut models = self.models.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        models.entry(model.to_string()).or_default().clone()
    }

    fn weakest(&self) -> u8 {
        let models = self.models.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        models.values().map(|m| m.level()).max().unwrap_or(0)
    }

    /// Whether a model of this backend has rejected the native JSON schema form.
    pub(super) fn rejected(&self) -> bool {
        self.weakest() > 0
    }

    /// The weakest form a model of this backend uses: `json_schema`, `json_object`, `json_mode`
    /// or `prompt`.
    pub(super) fn name(&self) -> &'static str {
        SchemaDelivery::LEVELS[(self.weakest() as usize).min(SchemaDelivery::LEVELS.len() - 1)].name()
    }
}

/// What a reply's JSON says against the schema it was asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Conformance {
    /// It matches the schema.
    Matches,
    /// It has the schema's shape (types, properties, required keys, enums) but breaks a bound
    /// (`maxItems`, `minimum`, `maxLength`, `pattern`...): a server that enforces the shape by
    /// grammar may leave bounds out (llama.cpp ignores `minimum` / `maximum`), so this says the
    /// form is enforced in part, not ignored.
    BreaksBounds,
    /// Not even the shape: no JSON, or the wrong keys or types, as from a server that ignored the
    /// schema.
    BreaksShape,
}

/// The keywords [`shape_of`] leaves out: bounds, not structure.
const BOUND_KEYWORDS: [&str; 14] = [
    "minItems",
    "maxItems",
    "uniqueItems",
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minProperties",
    "maxProperties",
];

/// `schema` without its bounds ([`BOUND_KEYWORDS`]) at any depth; property names are kept as
/// they are (a property may be called `pattern`).
fn shape_of(schema: &Value) -> Value {
    match schema {
        Value::Object(o) => Value::Object(
            o.iter()
                .filter(|(k, _)| !BOUND_KEYWORDS.contains(&k.as_str()))
                .map(|(k, v)| {
                    let v = match (k.as_str(), v) {
                        ("properties" | "$defs" | "definitions" | "patternProperties", Value::Object(props)) => {
                            Value::Object(props.iter().map(|(name, p)| (name.clone(), shape_of(p))).collect())
                        }
                        _ => shape_of(v),
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(shape_of).collect()),
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => schema.clone(),
    }
}

/// A schema's validators: the schema, and its shape ([`shape_of`]).
type Compiled = Option<Arc<(jsonschema::Validator, jsonschema::Validator)>>;

/// Compiled JSON schema validators by schema text: each schema a backend is sent is compiled once.
pub(super) struct Validators {
    compiled: Mutex<lru::LruCache<String, Compiled>>,
}

impl Default for Validators {
    fn default() -> Self {
        Self { compiled: Mutex::new(lru::LruCache::new(NonZeroUsize::new(64).unwrap_or(NonZeroUsize::MIN))) }
    }
}

impl std::fmt::Debug for Validators {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Validators").finish_non_exhaustive()
    }
}

impl Validators {
    /// How `reply` (the JSON read from a reply, `None` when it held none) stands against
    /// `schema`; `None` when the schema itself cannot be compiled (nothing is then said).
    pub(super) fn check(&self, schema: &Value, reply: Option<&Value>) -> Option<Conformance> {
        let key = schema.to_string();
        let validators = {
            let mut compiled = self.compiled.lock().unwrap_or_else(PoisonError::into_inner);
            compiled
                .get_or_insert(key, || {
                    let full = jsonschema::validator_for(schema).ok()?;
                    let shape = jsonschema::validator_for(&shape_of(schema)).ok()?;
                    Some(Arc::new((full, shape)))
                })
                .clone()
        }?;
        let (full, shape) = &*validators;
        Some(match reply {
            Some(value) if full.is_valid(value) => Conformance::Matches,
            Some(value) if shape.is_valid(value) => Conformance::BreaksBounds,
            Some(_) | None => Conformance::BreaksShape,
        })
    }
}

/// Whether an error body is about the structured-output request (`response_format` / `json_schema`).
pub(super) fn complains_about_schema(body: &[u8]) -> bool {
    let text = String::from_utf8_lossy(body).to_ascii_lowercase();
    text.contains("response_format") || text.contains("json_schema")
}

/// Whether a failed call (after retries) rejected the structured-output form, so a weaker form
/// should be tried: a 400 that does not refuse the request itself
/// ([`crate::context::refuses_the_request`]: a
/// context-length 400 fails at once instead of walking the ladder, three more requests refused
/// the same way), or another error status whose message names the form.
pub(super) fn is_schema_rejection(status: u16, error: &LlmError) -> bool {
    let message = error.to_string();
    if refuses_the_request(&message) && !complains_about_schema(message.as_bytes()) {
        return false;
    }
    status == 400 || (status >= 400 && complains_about_schema(message.as_bytes()))
}

/// Whether a failed call refused the `grammar` field of a choice (a client error naming it:
/// OpenAI's "Unrecognized request argument supplied: grammar", a server that forbids extra fields),
/// so the choice should go without it.
pub(super) fn is_grammar_rejection(status: u16, error: &LlmError) -> bool {
    status >= 400 && error.to_string().to_ascii_lowercase().contains("grammar")
}

/// Most integers a bounded integer may be spelt out as (see [`for_grammar`]).
const GRAMMAR_MAX_INTEGERS: i64 = 1_000;
/// Steps a bounded number's range is cut into (see [`for_grammar`]).
const GRAMMAR_NUMBER_STEPS: u32 = 100;

/// `schema` as sent in the `json_object` form, which llama-cpp-python turns into a grammar: its
/// grammar ignores `minimum` and `maximum` (a small model then writes a confidence of 4 under a
/// schema bounding it to [0, 1]), but it keeps an `enum` exactly. So a number bounded on both sides
/// becomes the enum of its range in hundredths (0, 0.01, ... 1 for [0, 1]), and an integer bounded
/// on both sides the enum of its values when there are at most a thousand; everything else is
/// sent as it is.
pub(super) fn for_grammar(schema: &Value) -> Value {
    match schema {
        Value::Object(o) => {
            if let Some(values) = bounded_values(o) {
                return json!({"enum": values});
            }
            Value::Object(o.iter().map(|(k, v)| (k.clone(), for_grammar(v))).collect())
        }
        Value::Array(items) => Value::Array(items.iter().map(for_grammar).collect()),
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => schema.clone(),
    }
}

/// The values a bounded number or integer may take, spelt out (see [`for_grammar`]).
fn bounded_values(o: &serde_json::Map<String, Value>) -> Option<Vec<Value>> {
    if o.contains_key("enum") || o.contains_key("const") {
        return None;
    }
    let (min, max) = (o.get("minimum")?.as_f64()?, o.get("maximum")?.as_f64()?);
    if !(min.is_finite() && max.is_finite() && min < max) {
        return None;
    }
    match o.get("type").and_then(Value::as_str)? {
        "integer" => {
            let (low, high) = (min.ceil() as i64, max.floor() as i64);
            (low <= high && high - low < GRAMMAR_MAX_INTEGERS).then(|| (low..=high).map(Value::from).collect())
        }
        "number" => Some(
            (0..=GRAMMAR_NUMBER_STEPS)
                .map(|i| {
                    let x = min + (max - min) * f64::from(i) / f64::from(GRAMMAR_NUMBER_STEPS);
                    // Rounded to the step's precision, so 0.3 is written 0.3 (not 0.30000000000000004).
                    let x = (x * 1e6).round() / 1e6;
                    Value::from(x)
                })
                .collect(),
        ),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn ladder_goes_down_and_is_remembered_per_model() {
        let memory = SchemaMemory::default();
        let forms = memory.of("m1");
        let schema = ResponseFormat::JsonSchema { name: "s".into(), schema: json!({"type": "object"}) };
        assert_eq!(forms.first_form(&schema, true), SchemaDelivery::ResponseFormat);
        assert_eq!(forms.first_form(&schema, false), SchemaDelivery::Prompt);
        assert_eq!(forms.first_form(&ResponseFormat::Text, true), SchemaDelivery::None);
        assert_eq!(SchemaDelivery::ResponseFormat.weaker("500", Api::OpenAi), Some(SchemaDelivery::JsonObject));
        assert_eq!(SchemaDelivery::JsonObject.weaker("bad schema", Api::OpenAi), Some(SchemaDelivery::JsonMode));
        assert_eq!(
            SchemaDelivery::JsonObject.weaker("json_object is not supported", Api::OpenAi),
            Some(SchemaDelivery::Prompt)
        );
        assert_eq!(SchemaDelivery::Prompt.weaker("", Api::OpenAi), None);
        // text-generation-inference's words, from its two generations of routers.
        let tgi3 = "Failed to deserialize the JSON body into the target type: response_format: missing field `value` at line 1 column 212";
        let tgi1 = "response_format: unknown variant `json_schema`, expected `json` or `regex` at line 1 column 80";
        assert_eq!(SchemaDelivery::ResponseFormat.weaker(tgi3, Api::OpenAi), Some(SchemaDelivery::Tgi));
        assert_eq!(SchemaDelivery::ResponseFormat.weaker(tgi1, Api::OpenAi), Some(SchemaDelivery::Tgi));
        assert_eq!(SchemaDelivery::JsonObject.weaker(tgi3, Api::OpenAi), Some(SchemaDelivery::Tgi));
        assert_eq!(SchemaDelivery::Tgi.weaker(tgi3, Api::OpenAi), Some(SchemaDelivery::Prompt));
        assert!(SchemaDelivery::Tgi.enforces() && SchemaDelivery::Tgi.weaker_than(SchemaDelivery::JsonObject));
        assert!(SchemaDelivery::JsonMode.weaker_than(SchemaDelivery::Tgi));
        assert_eq!(StructuredOutput::parse("tgi"), Some(StructuredOutput::Tgi));
        // Ollama's native API: its schema `format`, then `format: "json"`, then the prompt.
        assert_eq!(SchemaDelivery::ResponseFormat.weaker("400", Api::Ollama), Some(SchemaDelivery::JsonMode));
        assert_eq!(SchemaDelivery::JsonMode.weaker("400", Api::Ollama), Some(SchemaDelivery::Prompt));
        assert!(!memory.rejected());
        forms.remember(SchemaDelivery::Prompt);
        forms.remember(SchemaDelivery::JsonObject);
        assert!(memory.rejected());
        assert_eq!(memory.name(), "prompt");
        assert_eq!(forms.first_form(&schema, true), SchemaDelivery::Prompt);
        // Another model of the backend starts at the top.
        assert_eq!(memory.of("m2").first_form(&schema, true), SchemaDelivery::ResponseFormat);
        assert!(forms.settle() && !forms.settle(), "settled once");
        assert_eq!(StructuredOutput::parse("json_mode"), Some(StructuredOutput::JsonMode));
        assert_eq!(StructuredOutput::parse("xml"), None);
    }

    #[test]
    fn bounded_numbers_reach_a_grammar_as_enums() {
        let schema = json!({"type": "object", "properties": {
            "confidence": {"type": "number", "minimum": 0, "maximum": 1},
            "index": {"type": "integer", "minimum": 1, "maximum": 3},
            "many": {"type": "integer", "minimum": 0, "maximum": 5000},
            "free": {"type": "number", "minimum": 0},
            "pick": {"type": "integer", "minimum": 1, "maximum": 3, "enum": [1, 3]},
            "list": {"type": "array", "items": {"type": "number", "minimum": -1, "maximum": 1}}
        }});
        let g = for_grammar(&schema);
        let p = &g["properties"];
        let confidence = p["confidence"]["enum"].as_array().unwrap();
        assert_eq!(confidence.len(), 101);
        assert_eq!(
            (confidence[0].clone(), confidence[30].clone(), confidence[100].clone()),
            (json!(0.0), json!(0.3), json!(1.0))
        );
        assert_eq!(p["index"], json!({"enum": [1, 2, 3]}));
        assert_eq!(p["many"], schema["properties"]["many"], "too many integers to spell out");
        assert_eq!(p["free"], schema["properties"]["free"], "bounded on one side only");
        assert_eq!(p["pick"], schema["properties"]["pick"], "an enum already");
        assert_eq!(p["list"]["items"]["enum"].as_array().unwrap()[50], json!(0.0));
        assert_eq!(g["type"], "object");
    }

    #[test]
    fn a_reply_that_breaks_a_bound_keeps_the_shape() {
        let v = Validators::default();
        let schema = json!({"type": "object", "required": ["items"], "additionalProperties": false, "properties": {
            "items": {"type": "array", "maxItems": 2, "items": {"type": "object", "required": ["pattern"],
                "properties": {"pattern": {"type": "string", "maxLength": 3}}}},
            "score": {"type": "number", "minimum": 0, "maximum": 1}}});
        let check = |reply: Value| v.check(&schema, Some(&reply));
        assert_eq!(check(json!({"items": [{"pattern": "abc"}], "score": 0.5})), Some(Conformance::Matches));
        let many = json!({"items": [{"pattern": "a"}, {"pattern": "b"}, {"pattern": "toolong"}], "score": 4});
        assert_eq!(check(many), Some(Conformance::BreaksBounds));
        assert_eq!(check(json!({"note": "no schema seen"})), Some(Conformance::BreaksShape));
        assert_eq!(check(json!({"items": [{"pattern": 3}]})), Some(Conformance::BreaksShape));
        assert_eq!(v.check(&schema, None), Some(Conformance::BreaksShape));
        assert_eq!(v.check(&json!({"type": 12}), Some(&json!(1))), None, "a schema that cannot compile says nothing");
    }

    #[test]
    fn schema_rejections() {
        assert!(is_schema_rejection(400, &LlmError::InvalidRequest("anything".into())));
        assert!(is_schema_rejection(500, &LlmError::Unavailable("http 500: bad response_format".into())));
        assert!(!is_schema_rejection(500, &LlmError::Unavailable("http 500: boom".into())));
        assert!(!is_schema_rejection(200, &LlmError::MalformedReply("json_schema".into())));
        // A 400 that refuses the request itself is no verdict on the form (issue 60).
        for refused in [
            "http 400: This model's maximum context length is 2048 tokens. However, you requested 2600 tokens",
            r#"http 400: {"error":{"code":400,"message":"the request exceeds the available context size, try increasing it","type":"exceed_context_size_error"}}"#,
            r#"http 400: {"error":{"code":"context_length_exceeded","message":"Please reduce the length of the messages."}}"#,
            "http 400: prompt is too long: 210000 tokens > 200000 maximum",
        ] {
            assert!(!is_schema_rejection(400, &LlmError::InvalidRequest(refused.into())), "{refused}");
        }
        // One that names the form is about the form, whatever else it says.
        let both = "http 400: response_format json_schema is not supported for this context length";
        assert!(is_schema_rejection(400, &LlmError::InvalidRequest(both.into())));
    }
}
