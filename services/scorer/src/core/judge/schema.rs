//! The reply the judges are asked for: its JSON schema (whole-document and focused) and the reply
//! tokens it is given.

use assay_domain::document::{Criterion, Section};
use serde_json::{Map, Value, json};

/// Reply tokens allowed per required section score of a focused judging (one small JSON object).
const SECTION_SCORE_TOKENS: usize = 25;

/// Most characters of an issue's text the reply schema allows.
pub const SCHEMA_TEXT_CHARS: usize = 400;
/// Most issues a section the reply schema allows.
pub const MAX_ISSUES_PER_SECTION: usize = 3;

/// Reply tokens when the configuration sets none: room for scores plus a few issues per section.
pub fn default_max_tokens(sections: usize, criteria: usize) -> u32 {
    (600 + 250 * sections + 30 * criteria).min(8_192) as u32
}

/// Reply tokens of a focused judging when the configuration sets none: [`default_max_tokens`] over
/// the judged sections only (context is never scored), plus room for the required section score of
/// every judged section and criterion.
pub fn focused_max_tokens(judged: usize, criteria: usize) -> u32 {
    (default_max_tokens(judged, criteria) as usize + SECTION_SCORE_TOKENS * judged * criteria).min(8_192) as u32
}

/// The reply schema (strict-mode compatible: every property required, no extra keys). Section ids
/// are an enum of the document's ids plus "" (the whole document), criteria an enum of the
/// requested names; lists and texts are bounded ([`MAX_ISSUES_PER_SECTION`] issues a section,
/// [`SCHEMA_TEXT_CHARS`] characters a text), so a small constrained model cannot run away in a string
/// or a list and miss the end of its token budget. The parser stays tolerant for backends that
/// do not enforce the schema.
pub fn reply_schema(criteria: &[Criterion], sections: &[Section]) -> Value {
    let score = json!({"type": "number", "minimum": 0, "maximum": 1});
    let text = json!({"type": "string", "maxLength": SCHEMA_TEXT_CHARS});
    let said = json!({"type": "string", "minLength": 8, "maxLength": SCHEMA_TEXT_CHARS});
    let names: Vec<&str> = criteria.iter().map(|c| c.name.as_str()).collect();
    let scores: Map<String, Value> = names.iter().map(|n| (n.to_string(), score.clone())).collect();
    let mut ids: Vec<&str> = sections.iter().map(|s| s.id.as_str()).collect();
    ids.push("");
    json!({
        "type": "object",
        "properties": {
            "criterion_scores": {
                "type": "object",
                "properties": scores,
                "required": names,
                "additionalProperties": false
            },
            "issues": {
                "type": "array",
                "maxItems": (MAX_ISSUES_PER_SECTION * sections.len()).min(100),
                "items": {
                    "type": "object",
                    "properties": {
                        "section_id": {"type": "string", "enum": ids},
                        "criterion": {"type": "string", "enum": names},
                        "severity": {"type": "string", "enum": ["critical", "major", "minor"]},
                        "description": said,
                        "fix_instruction": said,
                        "location": text
                    },
                    "required": ["section_id", "criterion", "severity", "description", "fix_instruction", "location"],
                    "additionalProperties": false
                }
            },
            "section_scores": {
                "type": "array",
                "maxItems": sections.len() * names.len(),
                "items": {
                    "type": "object",
                    "properties": {
                        "section_id": {"type": "string", "enum": ids[..ids.len() - 1]},
                        "criterion": {"type": "string", "enum": names},
                        "score": score
                    },
                    "required": ["section_id", "criterion", "score"],
                    "additionalProperties": false
                }
            }
        },
        "required": ["criterion_scores", "issues", "section_scores"],
        "additionalProperties": false
    })
}

/// The reply schema of a focused judging: [`reply_schema`] over the judged sections, except that an
/// issue must name a judged section (no "" for the whole document: the judges see only part of it)
/// and `section_scores` must hold one entry per judged section and criterion (`minItems`).
pub fn focused_reply_schema(criteria: &[Criterion], sections: &[Section]) -> Value {
    let mut schema = reply_schema(criteria, sections);
    let ids: Vec<&str> = sections.iter().map(|s| s.id.as_str()).collect();
    schema["properties"]["issues"]["items"]["properties"]["section_id"]["enum"] = json!(ids);
    schema["properties"]["section_scores"]["minItems"] = json!(sections.len() * criteria.len());
    schema
}
