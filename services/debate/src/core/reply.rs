//! Reply schemas (strict-mode compatible: every property required, no extra keys, bounded lists
//! and texts so a small constrained model finishes within its token budget) and tolerant parsers
//! that never invent a value.
//!
//! The bounds must not cut what a stronger model writes, since a backend that enforces the schema
//! (constrained decoding, strict structured output) stops a list or a text at its bound, and the
//! reply token limit is derived from them. So they are sized from the request where the request
//! says how much there is to say, and set well above what a careful answer needs elsewhere:
//! - a review may list as many errors as the reviewed solution has steps (at least
//!   [`SCHEMA_LIST`]), and up to [`SCHEMA_LIST`] strengths, weaknesses and suggested changes;
//! - a refinement may accept, and reject, every critique (weakness, error, suggested change) of
//!   the reviews it was given, and may write as many steps as the solution it refines had (at
//!   least [`SCHEMA_STEPS`]);
//! - a solution has up to [`SCHEMA_STEPS`] steps; an answer up to [`SCHEMA_ANSWER_CHARS`]
//!   characters (a list of values, an expression, a sentence), every other text up to
//!   [`SCHEMA_TEXT_CHARS`].
//!
//! Every list is also bounded by what a request may carry back ([`MAX_ARTIFACT_ITEMS`]). The
//! parsers: a reply without a final answer or with a confidence that is missing,
//! non-numeric or outside [0, 1] is unusable (the caller retries once), a missing list reads as
//! empty, an error with an unknown severity is kept without one. Texts and lists are capped at the
//! limits a request may carry them back with.

use assay_domain::debate::{
    MAX_ARTIFACT_ITEMS, MAX_ARTIFACT_TEXT_BYTES, RefinedSolution, RejectedCritique, Review, Solution, SolutionError,
    normalize_answer,
};
use assay_domain::{Severity, UnusableReply};
use assay_llm::json::lenient_bool;
use serde_json::{Map, Value, json};

/// Most characters of one text the schemas allow.
pub const SCHEMA_TEXT_CHARS: usize = 240;
/// Most characters of a final answer the schemas allow (was 120, which cut answers such as a list
/// of values or a worded result).
pub const SCHEMA_ANSWER_CHARS: usize = 1000;
/// Most reasoning steps of a solution (was 8; a refinement may also match the solution it refines).
pub const SCHEMA_STEPS: usize = 24;
/// Most strengths, weaknesses and suggested changes of a review, and the least number of errors it
/// may list (was 3 for every list of a review and of a refinement).
pub const SCHEMA_LIST: usize = 8;

fn text_schema(min: usize) -> Value {
    json!({"type": "string", "minLength": min, "maxLength": SCHEMA_TEXT_CHARS})
}

fn list_schema(items: Value, min: usize, max: usize) -> Value {
    json!({"type": "array", "minItems": min, "maxItems": max, "items": items})
}

fn object_schema(properties: &[(&str, Value)]) -> Value {
    let names: Vec<&str> = properties.iter().map(|(n, _)| *n).collect();
    let props: Map<String, Value> = properties.iter().map(|(n, s)| ((*n).to_string(), s.clone())).collect();
    json!({"type": "object", "properties": props, "required": names, "additionalProperties": false})
}

fn answer_schema() -> Value {
    json!({"type": "string", "minLength": 1, "maxLength": SCHEMA_ANSWER_CHARS})
}

fn confidence_schema() -> Value {
    json!({"type": "number", "minimum": 0, "maximum": 1})
}

/// Stage 1: approach, steps, final answer, confidence (reasoning before the answer).
pub fn solution_schema() -> Value {
    object_schema(&[
        ("approach", text_schema(1)),
        ("reasoning_steps", list_schema(text_schema(1), 1, SCHEMA_STEPS)),
        ("final_answer", answer_schema()),
        ("confidence", confidence_schema()),
    ])
}

/// Stage 2: strengths, weaknesses, errors (location, type, severity, description), changes. The
/// reviewed solution has `target_steps` steps: the review may name an error in each.
pub fn review_schema(target_steps: usize) -> Value {
    let errors = target_steps.clamp(SCHEMA_LIST, MAX_ARTIFACT_ITEMS);
    let error = object_schema(&[
        ("location", json!({"type": "string", "maxLength": 80})),
        ("error_type", json!({"type": "string", "minLength": 1, "maxLength": 40})),
        ("severity", json!({"type": "string", "enum": ["critical", "major", "minor"]})),
        ("description", text_schema(1)),
    ]);
    object_schema(&[
        ("strengths", list_schema(text_schema(1), 0, SCHEMA_LIST)),
        ("weaknesses", list_schema(text_schema(1), 0, SCHEMA_LIST)),
        ("errors", list_schema(error, 0, errors)),
        ("suggested_changes", list_schema(text_schema(1), 0, SCHEMA_LIST)),
    ])
}

/// Stage 3: the critiques weighed, then the refined solution. The reviews given hold `critiques`
/// critiques (see [`critiques_of`]): each may be accepted or rejected; the refined solution may
/// have as many steps as the solution it refines (`own_steps`), at least [`SCHEMA_STEPS`].
pub fn refinement_schema(own_steps: usize, critiques: usize) -> Value {
    let critiques = critiques.min(MAX_ARTIFACT_ITEMS);
    let steps = own_steps.clamp(SCHEMA_STEPS, MAX_ARTIFACT_ITEMS);
    let rejected = object_schema(&[("critique", text_schema(1)), ("reason", text_schema(1))]);
    object_schema(&[
        ("critiques_accepted", list_schema(text_schema(1), 0, critiques)),
        ("critiques_rejected", list_schema(rejected, 0, critiques)),
        ("refinement_reasoning", text_schema(1)),
        ("reasoning_steps", list_schema(text_schema(1), 1, steps)),
        ("final_answer", answer_schema()),
        ("confidence", confidence_schema()),
        ("changed_from_original", json!({"type": "boolean"})),
        ("improvement_explanation", text_schema(1)),
    ])
}

/// Critiques of `reviews` a refinement weighs: their weaknesses, errors and suggested changes.
pub fn critiques_of(reviews: &[&Review]) -> usize {
    reviews.iter().map(|r| r.weaknesses.len() + r.errors.len() + r.suggested_changes.len()).sum()
}

/// Stage 4: reasoning, then the winner (one of `ids`) and the confidence.
pub fn judgment_schema(ids: &[String]) -> Value {
    object_schema(&[
        ("reasoning", text_schema(1)),
        ("winner", json!({"type": "string", "enum": ids})),
        ("confidence", confidence_schema()),
    ])
}

/// Most characters of a compact JSON value matching `schema` (as the schemas above bound every
/// string and list; an unbounded string or list counts as [`SCHEMA_TEXT_CHARS`] / [`SCHEMA_LIST`]).
pub fn max_reply_chars(schema: &Value) -> usize {
    let get = |k: &str| schema.get(k).and_then(Value::as_u64).map(|n| n as usize);
    if let Some(options) = schema.get("enum").and_then(Value::as_array) {
        return options.iter().map(|o| o.to_string().len()).max().unwrap_or(0);
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("string") => get("maxLength").unwrap_or(SCHEMA_TEXT_CHARS) + 2,
        Some("number" | "integer") => 12,
        Some("boolean") => 5,
        Some("array") => {
            let item = schema.get("items").map_or(SCHEMA_TEXT_CHARS, max_reply_chars);
            2 + get("maxItems").unwrap_or(SCHEMA_LIST) * (item + 1)
        }
        Some("object") => {
            let props = schema.get("properties").and_then(Value::as_object);
            2 + props.map_or(0, |p| p.iter().map(|(k, v)| k.len() + 4 + max_reply_chars(v)).sum())
        }
        Some(_) | None => SCHEMA_TEXT_CHARS,
    }
}

/// Most reply tokens [`reply_tokens`] asks for: the output ceiling of many hosted models (a
/// backend may refuse a call asking for more), and 16 KiB of reply at the four characters a token
/// of a large model's prose. The longest solution (7,153 characters) fits even at two characters a
/// token; the longest review of a 3-step solution (9,356) and refinement with 6 critiques (12,024)
/// fit at four. The phase's `max_tokens` setting (or the request's model spec) overrides it.
pub const MAX_REPLY_TOKENS: u32 = 4_096;

/// Reply tokens for `schema` when the configuration sets none: room for its longest reply at two
/// characters a token (small models spend more tokens a character than prose needs), so a reply
/// that fills every field still closes its JSON, at most [`MAX_REPLY_TOKENS`].
pub fn reply_tokens(schema: &Value) -> u32 {
    (max_reply_chars(schema) / 2 + 64).min(MAX_REPLY_TOKENS as usize) as u32
}

// ---------------------------------------------------------------------------------------------

/// First value under any of `keys`.
fn field<'v>(o: &'v Map<String, Value>, keys: &[&str]) -> Option<&'v Value> {
    keys.iter().find_map(|k| o.get(*k))
}

/// Cut `s` to at most `max` bytes on a character boundary.
fn capped(s: &str, max: usize) -> String {
    let s = s.trim();
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// A scalar as text ("" for null, lists and objects).
fn scalar_text(v: &Value) -> String {
    match v {
        Value::String(s) => capped(s, MAX_ARTIFACT_TEXT_BYTES),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        Value::Null | Value::Array(_) | Value::Object(_) => String::new(),
    }
}

/// A text field ("" when missing).
fn text(o: &Map<String, Value>, keys: &[&str]) -> String {
    field(o, keys).map(scalar_text).unwrap_or_default()
}

/// The first text inside an object entry of a list (`{"step": "..."}`).
fn entry_text(v: &Value) -> String {
    match v {
        Value::Object(o) => o.values().map(scalar_text).find(|t| !t.is_empty()).unwrap_or_default(),
        Value::String(_) | Value::Number(_) | Value::Bool(_) | Value::Null | Value::Array(_) => scalar_text(v),
    }
}

/// A list of texts: a list (empty entries dropped), or a text read as one entry per line; missing
/// is empty. At most [`MAX_ARTIFACT_ITEMS`] entries.
fn texts(o: &Map<String, Value>, keys: &[&str]) -> Vec<String> {
    let out: Vec<String> = match field(o, keys) {
        Some(Value::Array(a)) => a.iter().map(entry_text).filter(|t| !t.is_empty()).collect(),
        Some(Value::String(s)) => {
            s.lines().map(|l| capped(l, MAX_ARTIFACT_TEXT_BYTES)).filter(|l| !l.is_empty()).collect()
        }
        Some(Value::Number(_) | Value::Bool(_) | Value::Object(_) | Value::Null) | None => Vec::new(),
    };
    out.into_iter().take(MAX_ARTIFACT_ITEMS).collect()
}

/// The final answer: a non-empty text or a number.
fn final_answer(o: &Map<String, Value>) -> Result<String, UnusableReply> {
    let answer = match field(o, &["final_answer", "finalAnswer", "answer", "final"]) {
        Some(v @ (Value::String(_) | Value::Number(_) | Value::Bool(_))) => scalar_text(v),
        Some(other @ (Value::Array(_) | Value::Object(_))) => {
            return Err(format!("final_answer is not a text ({other})").into());
        }
        Some(Value::Null) | None => return Err("the reply has no final_answer".into()),
    };
    if answer.is_empty() { Err("final_answer is empty".into()) } else { Ok(answer) }
}

/// The confidence: a number or a numeric text in [0, 1] (the scale is never guessed).
fn confidence(o: &Map<String, Value>) -> Result<f64, UnusableReply> {
    let Some(v) = field(o, &["confidence", "confidence_score"]) else {
        return Err("the reply has no confidence".into());
    };
    let x = match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        Value::Null | Value::Bool(_) | Value::Array(_) | Value::Object(_) => None,
    };
    match x {
        Some(x) if x.is_finite() && (0.0..=1.0).contains(&x) => Ok(x),
        Some(x) => Err(format!("confidence is {x}, outside [0, 1]").into()),
        None => Err(format!("confidence is not a number ({v})").into()),
    }
}

fn object(v: &Value) -> Result<&Map<String, Value>, UnusableReply> {
    match v {
        Value::Object(o) => Ok(o),
        Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) | Value::Array(_) => {
            Err("the reply is not a JSON object".into())
        }
    }
}

/// A stage 1 reply.
pub fn parse_solution(v: &Value, solver_id: &str) -> Result<Solution, UnusableReply> {
    let o = object(v)?;
    Ok(Solution {
        solver_id: solver_id.to_string(),
        final_answer: final_answer(o)?,
        confidence: confidence(o)?,
        reasoning_steps: texts(o, &["reasoning_steps", "steps", "reasoning"]),
        approach: text(o, &["approach", "method"]),
        model: None,
        raw_replies: Vec::new(),
    })
}

/// A stage 2 reply. At least one of the four lists must be there.
pub fn parse_review(v: &Value, reviewer_id: &str, target_solver_id: &str) -> Result<Review, UnusableReply> {
    let o = object(v)?;
    const KEYS: [&str; 4] = ["strengths", "weaknesses", "errors", "suggested_changes"];
    if !KEYS.iter().any(|k| o.contains_key(*k)) {
        return Err("the reply holds no review (strengths, weaknesses, errors, suggested_changes)".into());
    }
    let errors = match field(o, &["errors"]) {
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|e| match e {
                Value::Object(e) => {
                    let severity_text = text(e, &["severity"]);
                    Some(SolutionError {
                        location: text(e, &["location", "step"]),
                        error_type: text(e, &["error_type", "type"]),
                        severity: Severity::parse(&severity_text),
                        description: text(e, &["description", "error", "detail"]),
                    })
                }
                other @ (Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) | Value::Array(_)) => {
                    let description = entry_text(other);
                    (!description.is_empty()).then(|| SolutionError { description, ..SolutionError::default() })
                }
            })
            .take(MAX_ARTIFACT_ITEMS)
            .collect(),
        Some(_) | None => Vec::new(),
    };
    Ok(Review {
        reviewer_id: reviewer_id.to_string(),
        target_solver_id: target_solver_id.to_string(),
        strengths: texts(o, &["strengths"]),
        weaknesses: texts(o, &["weaknesses"]),
        errors,
        suggested_changes: texts(o, &["suggested_changes", "suggestions"]),
        model: None,
        raw_replies: Vec::new(),
    })
}

/// A stage 3 reply. Without a usable `changed_from_original`, whether the answer changed is read
/// from the answers (normalised).
pub fn parse_refinement(v: &Value, solver_id: &str, original_answer: &str) -> Result<RefinedSolution, UnusableReply> {
    let o = object(v)?;
    let answer = final_answer(o)?;
    let changed = field(o, &["changed_from_original", "changed"])
        .and_then(lenient_bool)
        .unwrap_or_else(|| normalize_answer(&answer) != normalize_answer(original_answer));
    let critiques_rejected = match field(o, &["critiques_rejected"]) {
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|c| match c {
                Value::Object(c) => {
                    let critique = text(c, &["critique", "text"]);
                    (!critique.is_empty()).then(|| RejectedCritique { critique, reason: text(c, &["reason", "why"]) })
                }
                other @ (Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) | Value::Array(_)) => {
                    let critique = entry_text(other);
                    (!critique.is_empty()).then(|| RejectedCritique { critique, reason: String::new() })
                }
            })
            .take(MAX_ARTIFACT_ITEMS)
            .collect(),
        Some(_) | None => Vec::new(),
    };
    Ok(RefinedSolution {
        solver_id: solver_id.to_string(),
        critiques_accepted: texts(o, &["critiques_accepted"]),
        critiques_rejected,
        refinement_reasoning: text(o, &["refinement_reasoning"]),
        reasoning_steps: texts(o, &["reasoning_steps", "steps", "reasoning"]),
        confidence: confidence(o)?,
        final_answer: answer,
        changed,
        improvement_explanation: text(o, &["improvement_explanation"]),
        model: None,
        raw_replies: Vec::new(),
    })
}

/// The judge's decision.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedJudgment {
    pub winner_solver_id: String,
    pub confidence: f64,
    pub reasoning: String,
}

/// A stage 4 reply: the winner must name one of `ids` (exactly, else ignoring case, punctuation and
/// spaces: "Solver 2" is "solver_2").
pub fn parse_judgment(v: &Value, ids: &[String]) -> Result<ParsedJudgment, UnusableReply> {
    let o = object(v)?;
    let winner = match field(o, &["winner", "winner_solver_id", "winner_id", "best_solver"]) {
        Some(v @ (Value::String(_) | Value::Number(_))) => scalar_text(v),
        Some(other) => return Err(format!("winner is not a solver id ({other})").into()),
        None => return Err("the reply has no winner".into()),
    };
    let resolved = ids.iter().find(|id| **id == winner).or_else(|| {
        let matches: Vec<&String> = ids.iter().filter(|id| normalize_answer(id) == normalize_answer(&winner)).collect();
        if matches.len() == 1 { Some(matches[0]) } else { None }
    });
    let Some(winner_solver_id) = resolved else {
        return Err(format!("the winner {winner:?} is not one of the solvers ({})", ids.join(", ")).into());
    };
    Ok(ParsedJudgment {
        winner_solver_id: winner_solver_id.clone(),
        confidence: confidence(o)?,
        reasoning: text(o, &["reasoning", "explanation", "rationale"]),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_solution_needs_an_answer_and_a_confidence_in_range() {
        let s = parse_solution(
            &json!({"approach": "sum", "reasoning_steps": ["a", "", {"step": "b"}], "final_answer": 42, "confidence": "0.8"}),
            "s1",
        )
        .unwrap();
        assert_eq!((s.final_answer.as_str(), s.confidence, s.reasoning_steps.len()), ("42", 0.8, 2));
        assert!(
            parse_solution(&json!({"final_answer": "4", "confidence": 80}), "s1")
                .unwrap_err()
                .as_str()
                .contains("outside")
        );
        assert!(parse_solution(&json!({"confidence": 0.5}), "s1").unwrap_err().as_str().contains("no final_answer"));
        assert!(
            parse_solution(&json!({"final_answer": " ", "confidence": 0.5}), "s1")
                .unwrap_err()
                .as_str()
                .contains("empty")
        );
        assert!(parse_solution(&json!({"final_answer": "4"}), "s1").unwrap_err().as_str().contains("no confidence"));
        assert!(parse_solution(&json!([1]), "s1").is_err());
    }

    #[test]
    fn a_review_keeps_errors_without_a_known_severity() {
        let r = parse_review(
            &json!({"strengths": ["clear"], "errors": [
                {"location": "step 2", "error_type": "calculation", "severity": "Critical", "description": "3*4 is 12"},
                {"location": "", "error_type": "logic", "severity": "huge", "description": "x"},
                "a plain text error"]}),
            "a",
            "b",
        )
        .unwrap();
        assert_eq!(r.errors[0].severity, Some(Severity::Critical));
        assert_eq!(r.errors[1].severity, None);
        assert_eq!(r.errors[2].description, "a plain text error");
        assert!(r.weaknesses.is_empty());
        assert!(parse_review(&json!({"verdict": "fine"}), "a", "b").is_err());
    }

    #[test]
    fn a_refinement_reads_changed_from_the_answers_when_unsaid() {
        let r = parse_refinement(
            &json!({"final_answer": "12", "confidence": 0.9, "critiques_rejected": [{"critique": "c", "reason": "r"}, "d"]}),
            "a",
            "11",
        )
        .unwrap();
        assert!(r.changed);
        assert_eq!(r.critiques_rejected.len(), 2);
        let r = parse_refinement(
            &json!({"final_answer": "12", "confidence": 0.9, "changed_from_original": "no"}),
            "a",
            "11",
        )
        .unwrap();
        assert!(!r.changed);
    }

    #[test]
    fn the_winner_must_be_a_solver() {
        let ids: Vec<String> = ["solver_1", "solver_2", "solver_3"].map(String::from).to_vec();
        let j = parse_judgment(&json!({"winner": "Solver 2", "confidence": 0.7, "reasoning": "r"}), &ids).unwrap();
        assert_eq!(j.winner_solver_id, "solver_2");
        assert!(
            parse_judgment(&json!({"winner": "solver_9", "confidence": 0.7}), &ids)
                .unwrap_err()
                .as_str()
                .contains("not one of")
        );
        assert!(parse_judgment(&json!({"winner": "solver_1"}), &ids).is_err());
    }

    #[test]
    fn reply_tokens_cover_the_longest_reply() {
        assert_eq!(max_reply_chars(&json!({"type": "string", "maxLength": 10})), 12);
        assert_eq!(max_reply_chars(&json!({"type": "array", "maxItems": 2, "items": {"type": "boolean"}})), 14);
        let ids: Vec<String> = vec!["solver_1".into()];
        // At two characters a token (a small model) for the smaller schemas, at four (a large
        // model's prose) for every schema at its usual size.
        for schema in [solution_schema(), judgment_schema(&ids)] {
            let chars = max_reply_chars(&schema);
            assert!(reply_tokens(&schema) as usize * 2 > chars && chars > 100, "{chars}");
        }
        for schema in [review_schema(3), refinement_schema(3, 6)] {
            let chars = max_reply_chars(&schema);
            assert!(reply_tokens(&schema) as usize * 4 > chars && chars > 100, "{chars}");
        }
        assert_eq!(reply_tokens(&refinement_schema(24, 48)), MAX_REPLY_TOKENS);
    }

    /// The bounds follow the request: errors per reviewed step, every critique of the reviews
    /// given, as many steps as the refined solution had; never more than a request may carry.
    #[test]
    fn schema_bounds_are_sized_from_the_request() {
        let max = |s: &Value, key: &str| s["properties"][key]["maxItems"].as_u64().unwrap() as usize;
        assert_eq!(max(&review_schema(2), "errors"), SCHEMA_LIST);
        assert_eq!(max(&review_schema(20), "errors"), 20);
        assert_eq!(max(&review_schema(500), "errors"), MAX_ARTIFACT_ITEMS);
        let r = refinement_schema(30, 14);
        assert_eq!((max(&r, "critiques_accepted"), max(&r, "critiques_rejected")), (14, 14));
        assert_eq!(max(&r, "reasoning_steps"), 30);
        assert_eq!(max(&refinement_schema(2, 0), "reasoning_steps"), SCHEMA_STEPS);
        assert_eq!(max(&refinement_schema(2, 999), "critiques_accepted"), MAX_ARTIFACT_ITEMS);
        assert_eq!(solution_schema()["properties"]["final_answer"]["maxLength"], json!(SCHEMA_ANSWER_CHARS));
        let review = Review {
            weaknesses: vec!["w".into(); 4],
            errors: vec![SolutionError::default(); 2],
            suggested_changes: vec!["s".into(); 3],
            strengths: vec!["not a critique".into()],
            ..Review::default()
        };
        assert_eq!(critiques_of(&[&review, &review]), 18);
    }

    #[test]
    fn schemas_require_every_property() {
        for schema in [solution_schema(), review_schema(3), refinement_schema(3, 6), judgment_schema(&["a".into()])] {
            let props = schema["properties"].as_object().unwrap();
            let required: Vec<&str> = schema["required"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
            assert_eq!(props.len(), required.len());
            assert_eq!(schema["additionalProperties"], json!(false));
        }
    }
}
