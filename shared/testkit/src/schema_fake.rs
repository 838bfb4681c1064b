//! Replies that follow whatever JSON schema a chat request asks for, so one scripted backend can serve
//! any client (Assay's stages, or another library run side by side in a benchmark) without knowing
//! its prompts. Deterministic: the same request gets the same reply.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use serde_json::{Map, Value, json};

use crate::scripted::{RecordedRequest, Reply, hash_embedding};

/// Items in arrays whose schema sets no bound.
const DEFAULT_ARRAY_LEN: usize = 6;

/// A conforming instance of the request's `response_format` JSON schema (with `$ref` into `$defs`
/// or `definitions` resolved). Without a schema: "YES". Embedding calls get hash embeddings.
pub fn schema_reply(request: &RecordedRequest) -> Reply {
    if request.is_embeddings() {
        return Reply::embeddings(request.embedding_inputs().iter().map(|t| hash_embedding(t, 32)).collect());
    }
    let schema = request.body.pointer("/response_format/json_schema/schema").cloned();
    match schema {
        Some(schema) => Reply::json(instance(&schema, &schema, 0, 0)),
        None => Reply::text("YES"),
    }
}

/// A handler answering every call with [`schema_reply`] after `latency`.
pub fn schema_handler(latency: Duration) -> impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static {
    move |request| {
        let reply = schema_reply(request);
        if latency.is_zero() { reply } else { reply.delay(latency) }
    }
}

/// Faults injected per attempt: shares of attempts answered 429 (no `Retry-After`), 5xx (500,
/// 502, 503 in turn) and never answered; the rest reach the wrapped handler.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FaultMix {
    pub rate_limited: f64,
    pub server_error: f64,
    pub unanswered: f64,
}

/// What [`with_faults`] injected.
#[derive(Debug, Default)]
pub struct FaultCounts {
    pub attempts: AtomicUsize,
    pub rate_limited: AtomicUsize,
    pub server_error: AtomicUsize,
    pub unanswered: AtomicUsize,
}

/// `handler` behind faults drawn from `mix` with a seeded generator (SplitMix64): the same seed
/// gives the same sequence of draws (which attempt meets which depends on arrival order).
pub fn with_faults(
    handler: impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static,
    mix: FaultMix,
    seed: u64,
    counts: Arc<FaultCounts>,
) -> impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static {
    let state = AtomicU64::new(seed);
    move |request| {
        counts.attempts.fetch_add(1, Ordering::Relaxed);
        let mut z = state.fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed).wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        let x = ((z ^ (z >> 31)) >> 11) as f64 / (1u64 << 53) as f64;
        if x < mix.rate_limited {
            counts.rate_limited.fetch_add(1, Ordering::Relaxed);
            return Reply::status(429);
        }
        if x < mix.rate_limited + mix.server_error {
            let n = counts.server_error.fetch_add(1, Ordering::Relaxed);
            return Reply::status([500, 502, 503][n % 3]);
        }
        if x < mix.rate_limited + mix.server_error + mix.unanswered {
            counts.unanswered.fetch_add(1, Ordering::Relaxed);
            return Reply::hang();
        }
        handler(request)
    }
}

fn resolve<'a>(root: &'a Value, schema: &'a Value) -> &'a Value {
    let Some(reference) = schema.get("$ref").and_then(Value::as_str) else { return schema };
    let Some(path) = reference.strip_prefix('#') else { return schema };
    root.pointer(path).map_or(schema, |target| resolve(root, target))
}

/// `position` is the index of the enclosing array element (0 outside arrays); `depth` bounds recursion.
fn instance(root: &Value, schema: &Value, position: usize, depth: usize) -> Value {
    let schema = resolve(root, schema);
    if depth > 16 {
        return Value::Null;
    }
    if let Some(choices) = schema.get("enum").and_then(Value::as_array).filter(|c| !c.is_empty()) {
        return choices[position % choices.len()].clone();
    }
    if let Some(c) = schema.get("const") {
        return c.clone();
    }
    for key in ["anyOf", "oneOf", "allOf"] {
        if let Some(first) = schema.get(key).and_then(Value::as_array).and_then(|a| a.first()) {
            return instance(root, first, position, depth + 1);
        }
    }
    let kind = match schema.get("type") {
        Some(Value::String(s)) => s.as_str(),
        Some(Value::Array(types)) => types.iter().filter_map(Value::as_str).find(|t| *t != "null").unwrap_or("null"),
        Some(_) | None if schema.get("properties").is_some() => "object",
        Some(_) | None => "string",
    };
    match kind {
        "object" => {
            let mut out = Map::new();
            if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                for (name, prop) in props {
                    out.insert(name.clone(), property(root, name, prop, position, depth));
                }
            }
            Value::Object(out)
        }
        "array" => {
            let min = schema.get("minItems").and_then(Value::as_u64).unwrap_or(0) as usize;
            let max = schema.get("maxItems").and_then(Value::as_u64).map_or(usize::MAX, |m| m as usize);
            let len = DEFAULT_ARRAY_LEN.clamp(min, max.max(min));
            let items = schema.get("items").cloned().unwrap_or_else(|| json!({"type": "string"}));
            Value::Array((0..len).map(|i| instance(root, &items, i, depth + 1)).collect())
        }
        "integer" => json!(position + 1),
        // Within the schema's bounds (e.g. a score in [0, 1]).
        "number" => {
            let min = schema.get("minimum").and_then(Value::as_f64).unwrap_or(f64::NEG_INFINITY);
            let max = schema.get("maximum").and_then(Value::as_f64).unwrap_or(f64::INFINITY);
            let low = min.max(0.0);
            json!(if max < 50.0 { low + (max - low) * 0.75 } else { 50.0f64.max(min) })
        }
        "boolean" => json!(true),
        "null" => Value::Null,
        _ => json!(format!("Does the response address requirement {}?", position + 1)),
    }
}

/// Property values keyed by common names, else by schema.
fn property(root: &Value, name: &str, schema: &Value, position: usize, depth: usize) -> Value {
    let resolved = resolve(root, schema);
    let is_integer = resolved.get("type").and_then(Value::as_str) == Some("integer");
    let lower = name.to_ascii_lowercase();
    if is_integer && (lower.contains("index") || lower == "id" || lower == "number") {
        return json!(position + 1);
    }
    if (lower == "weight" || lower == "importance")
        && matches!(resolved.get("type").and_then(Value::as_str), Some("integer" | "number"))
    {
        let min = resolved.get("minimum").and_then(Value::as_f64).unwrap_or(0.0);
        let max = resolved.get("maximum").and_then(Value::as_f64).unwrap_or(100.0);
        let w = (50.0f64).clamp(min, max);
        return if is_integer { json!(w as i64) } else { json!(w) };
    }
    instance(root, schema, position, depth + 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_stay_within_their_bounds() {
        let unit = json!({"type": "number", "minimum": 0, "maximum": 1});
        assert_eq!(instance(&unit, &unit, 0, 0), json!(0.75));
        let open = json!({"type": "number"});
        assert_eq!(instance(&open, &open, 0, 0), json!(50.0));
    }

    #[test]
    fn follows_refs_enums_and_bounds() {
        let schema = json!({
            "type": "object",
            "$defs": {"A": {"type": "object", "properties": {
                "question_index": {"type": "integer"},
                "answer": {"type": "string", "enum": ["YES", "NO"]}
            }}},
            "properties": {"answers": {"type": "array", "items": {"$ref": "#/$defs/A"}, "maxItems": 3}}
        });
        let v = instance(&schema, &schema, 0, 0);
        let answers = v["answers"].as_array().unwrap();
        assert_eq!(answers.len(), 3);
        assert_eq!(answers[2]["question_index"], 3);
        assert_eq!(answers[0]["answer"], "YES");
        assert_eq!(answers[1]["answer"], "NO");
    }

    #[test]
    fn min_items_wins_over_default_length() {
        let schema = json!({"type": "array", "minItems": 9, "items": {"type": "string"}});
        assert_eq!(instance(&schema, &schema, 0, 0).as_array().unwrap().len(), 9);
    }
}
