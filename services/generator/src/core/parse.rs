//! Reply schemas and lenient parsing of generator replies.

use assay_llm::ChatResponse;
use assay_llm::json::{preview, reply_json};
use serde_json::{Map, Value, json};

use assay_domain::UnusableReply;
use assay_domain::generator::ItemShape;

/// Category of an explicit requirement of the request (openrubrics).
pub const HARD_RULE: &str = "hard_rule";
/// Category of a general quality principle (openrubrics).
pub const PRINCIPLE: &str = "principle";

/// Longest question the schema allows (characters).
pub const MAX_QUESTION_CHARS: u32 = 200;

/// The JSON schema a preset's reply must match: `{"items": [{"question": str, ...}]}` with
/// `weight` (integer 0-100) for weighted presets and `category` (hard_rule | principle) for
/// categorized ones. Strict-mode compatible (every property required, no extra properties).
/// Questions are capped at [`MAX_QUESTION_CHARS`] and the list at `max_items`, so a constrained
/// local model always finishes its JSON within the token budget.
pub fn schema(shape: ItemShape, max_items: u32) -> Value {
    let question = json!({"type": "string", "minLength": 1, "maxLength": MAX_QUESTION_CHARS});
    let (props, required) = match shape {
        ItemShape::Plain => (json!({"question": question}), json!(["question"])),
        ItemShape::Weighted => (
            json!({"question": question, "weight": {"type": "integer", "minimum": 0, "maximum": 100}}),
            json!(["question", "weight"]),
        ),
        ItemShape::Categorized => (
            json!({"question": question, "category": {"type": "string", "enum": [HARD_RULE, PRINCIPLE]}}),
            json!(["question", "category"]),
        ),
    };
    json!({
        "type": "object",
        "properties": {
            "items": {
                "type": "array",
                "minItems": 1,
                "maxItems": max_items,
                "items": {"type": "object", "properties": props, "required": required, "additionalProperties": false}
            }
        },
        "required": ["items"],
        "additionalProperties": false
    })
}

/// One question as the model wrote it, cleaned: question trimmed and non-empty, weight clamped
/// to 0..=100 when the model gave one, category normalized.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedItem {
    pub question: String,
    pub weight: Option<f64>,
    pub category: Option<String>,
}

/// What a reply held.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ParsedReply {
    pub items: Vec<ParsedItem>,
    /// Entries skipped because their question was empty.
    pub skipped_empty: u32,
}

/// Keys under which models put the list of questions, in order of preference.
const LIST_KEYS: &[&str] = &["items", "questions", "checklist", "criteria", "rubric", "rubrics"];
/// Keys holding the question text of one entry.
const QUESTION_KEYS: &[&str] = &["question", "text", "criterion", "rubric", "item"];

/// Parse a reply: the structured JSON when present, else the JSON found in the text. Accepts
/// `{"items": [...]}` (or `questions`, `checklist`, `criteria`, `rubric(s)`), a bare array, and
/// entries that are plain strings. Errors say why nothing usable was found.
pub fn parse_reply(reply: &ChatResponse, shape: ItemShape) -> Result<ParsedReply, UnusableReply> {
    let value = reply_json(reply).ok_or_else(|| {
        UnusableReply::from(format!(
            "the reply holds no JSON value (reply starts with {:?})",
            preview(&reply.text, PREVIEW_CHARS)
        ))
    })?;
    let list = assay_llm::json::find_list(&value, LIST_KEYS)
        .ok_or_else(|| UnusableReply::from("the reply's JSON has no list of questions"))?;
    let mut out = ParsedReply::default();
    for entry in list {
        match parse_entry(entry, shape) {
            Some(item) => out.items.push(item),
            None => out.skipped_empty += 1,
        }
    }
    Ok(out)
}

/// Characters of a reply quoted in an error about it.
pub(crate) const PREVIEW_CHARS: usize = 80;

fn parse_entry(entry: &Value, shape: ItemShape) -> Option<ParsedItem> {
    let (text, weight, category) = match entry {
        Value::String(s) => (s.clone(), None, None),
        Value::Object(o) => (question_of(o)?, o.get("weight").or_else(|| o.get("importance")).and_then(number_of), {
            o.get("category").or_else(|| o.get("type")).and_then(Value::as_str).map(str::to_string)
        }),
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::Array(_) => return None,
    };
    let question = clean_question(&text);
    // A label prefix ("[Hard Rule] ...") and a trailing weight ("... (95)") are read only where
    // the preset asks for them; elsewhere they are part of the question.
    let (question, label) = match shape {
        ItemShape::Categorized => strip_label(question),
        ItemShape::Plain | ItemShape::Weighted => (question, None),
    };
    let (question, trailing_weight) = match shape {
        ItemShape::Weighted => strip_trailing_weight(question),
        ItemShape::Plain | ItemShape::Categorized => (question, None),
    };
    if is_fragment(&question) {
        return None;
    }
    let weight = match shape {
        ItemShape::Weighted => weight.or(trailing_weight).map(clamp_weight),
        ItemShape::Plain | ItemShape::Categorized => None,
    };
    let category = match shape {
        ItemShape::Categorized => {
            category.and_then(|c| normalize_category(&c)).or_else(|| label.and_then(|l| normalize_category(&l)))
        }
        ItemShape::Plain | ItemShape::Weighted => None,
    };
    Some(ParsedItem { question, weight, category })
}

fn question_of(o: &Map<String, Value>) -> Option<String> {
    QUESTION_KEYS
        .iter()
        .find_map(|k| o.get(*k).and_then(Value::as_str))
        .or_else(|| o.values().find_map(Value::as_str))
        .map(str::to_string)
}

fn number_of(v: &Value) -> Option<f64> {
    match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().trim_end_matches('%').trim().parse().ok(),
        Value::Null | Value::Bool(_) | Value::Array(_) | Value::Object(_) => None,
    }
}

/// Trim, and drop list markers a model may copy from examples ("- ", "1. ", "Q3: ").
/// Fewer than three words and no question mark ("Is", "Does it"): a fragment a small model cut
/// short, not a question. Terse questions ("Tone?") stay.
pub(crate) fn is_fragment(question: &str) -> bool {
    !question.trim_end().ends_with('?') && question.split_whitespace().count() < 3
}

pub(crate) fn clean_question(text: &str) -> String {
    let mut t = text.trim();
    for marker in ["- ", "* ", "• "] {
        if let Some(rest) = t.strip_prefix(marker) {
            t = rest.trim_start();
        }
    }
    let digits = t.bytes().take_while(u8::is_ascii_digit).count();
    if digits > 0 && digits < 4 {
        let rest = &t[digits..];
        if let Some(r) = rest.strip_prefix(". ").or_else(|| rest.strip_prefix(") ")) {
            t = r.trim_start();
        }
    }
    t.trim().to_string()
}

/// `[Hard Rule] Does ...` -> ("Does ...", Some("Hard Rule")).
fn strip_label(q: String) -> (String, Option<String>) {
    if let Some(rest) = q.strip_prefix('[')
        && let Some(end) = rest.find(']')
    {
        let label = rest[..end].trim().to_string();
        let question = rest[end + 1..].trim_start_matches([':', ' ']).trim().to_string();
        if !label.is_empty() && label.len() <= 20 {
            return (question, Some(label));
        }
    }
    (q, None)
}

/// `Is it about cats? (100)` -> ("Is it about cats?", Some(100.0)).
fn strip_trailing_weight(q: String) -> (String, Option<f64>) {
    if let Some(body) = q.strip_suffix(')')
        && let Some(open) = body.rfind('(')
        && let Ok(w) = body[open + 1..].trim().parse::<f64>()
    {
        return (body[..open].trim_end().to_string(), Some(w));
    }
    (q, None)
}

fn clamp_weight(w: f64) -> f64 {
    if w.is_nan() { assay_domain::DEFAULT_WEIGHT } else { w.clamp(0.0, 100.0) }
}

/// `Hard Rule`, `[hard-rule]`, `HARD_RULE` -> `hard_rule`; `Principles` -> `principle`; other
/// labels are kept in snake case; empty -> none.
pub fn normalize_category(c: &str) -> Option<String> {
    let c: String = c
        .trim()
        .trim_matches(['[', ']'])
        .trim()
        .chars()
        .map(|ch| if ch == ' ' || ch == '-' { '_' } else { ch.to_ascii_lowercase() })
        .collect();
    match c.as_str() {
        "" => None,
        "hard_rule" | "hard_rules" | "hardrule" => Some(HARD_RULE.to_string()),
        "principle" | "principles" => Some(PRINCIPLE.to_string()),
        _ => Some(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply_text(text: &str) -> ChatResponse {
        ChatResponse { text: text.into(), ..Default::default() }
    }

    #[test]
    fn weighted_items_are_parsed_and_clamped() {
        let r = reply_text(
            r#"{"items": [{"question": " Is it about cats? ", "weight": 100}, {"question": "Short?", "weight": 140},
                {"question": "Tone?", "weight": "-5"}, {"question": "  ", "weight": 50}, {"question": "Any?"}]}"#,
        );
        let p = parse_reply(&r, ItemShape::Weighted).unwrap();
        let got: Vec<(&str, Option<f64>)> = p.items.iter().map(|i| (i.question.as_str(), i.weight)).collect();
        assert_eq!(
            got,
            vec![("Is it about cats?", Some(100.0)), ("Short?", Some(100.0)), ("Tone?", Some(0.0)), ("Any?", None)]
        );
        assert_eq!(p.skipped_empty, 1);
    }

    #[test]
    fn lenient_shapes_are_accepted() {
        let r = reply_text(
            "Here you go:\n```json\n{\"questions\": [\"- Is it a poem?\", \"2. Does it rhyme? (80)\"]}\n```",
        );
        let p = parse_reply(&r, ItemShape::Weighted).unwrap();
        assert_eq!(p.items[0].question, "Is it a poem?");
        assert_eq!((p.items[1].question.as_str(), p.items[1].weight), ("Does it rhyme?", Some(80.0)));
        let p = parse_reply(&reply_text(r#"[{"text": "Q?"}]"#), ItemShape::Plain).unwrap();
        assert_eq!(p.items[0].question, "Q?");
    }

    #[test]
    fn categories_are_normalized_and_labels_stripped() {
        let r = reply_text(
            r#"{"items": [{"question": "Under 100 words?", "category": "Hard Rule"},
                {"question": "[Principle] Is the reasoning clear?"}, {"question": "Cites?", "category": "PRINCIPLES"}]}"#,
        );
        let p = parse_reply(&r, ItemShape::Categorized).unwrap();
        let got: Vec<(&str, Option<&str>)> =
            p.items.iter().map(|i| (i.question.as_str(), i.category.as_deref())).collect();
        assert_eq!(
            got,
            vec![
                ("Under 100 words?", Some("hard_rule")),
                ("Is the reasoning clear?", Some("principle")),
                ("Cites?", Some("principle"))
            ]
        );
    }

    #[test]
    fn plain_shape_ignores_weights_and_categories() {
        let r = reply_text(r#"{"items": [{"question": "A?", "weight": 10, "category": "x"}]}"#);
        let p = parse_reply(&r, ItemShape::Plain).unwrap();
        assert_eq!(p.items[0], ParsedItem { question: "A?".into(), weight: None, category: None });
    }

    #[test]
    fn fragments_are_dropped() {
        let r = reply_text(r#"{"items": ["Does", "Is it", "Tone?", "Uses metric units throughout"]}"#);
        let p = parse_reply(&r, ItemShape::Plain).unwrap();
        let got: Vec<&str> = p.items.iter().map(|i| i.question.as_str()).collect();
        assert_eq!(got, ["Tone?", "Uses metric units throughout"]);
    }

    #[test]
    fn no_json_or_no_list_is_an_error() {
        assert!(parse_reply(&reply_text("I cannot help with that."), ItemShape::Plain).is_err());
        assert!(parse_reply(&reply_text(r#"{"answer": "none"}"#), ItemShape::Plain).is_err());
    }

    #[test]
    fn schema_is_strict_compatible() {
        let s = schema(ItemShape::Weighted, 7);
        assert_eq!(s["properties"]["items"]["items"]["required"], json!(["question", "weight"]));
        assert_eq!(s["additionalProperties"], false);
    }
}
