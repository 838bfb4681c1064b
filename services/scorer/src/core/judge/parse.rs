//! Reading a judge's reply: checked against the request, tolerant of shape, never inventing a
//! value (the rules are in the [`super`] module's docs).

use std::collections::{BTreeMap, HashSet};

use assay_domain::document::{Criterion, JudgeIssue, MAX_ISSUES_PER_VERDICT, Section, SectionScore};
use assay_domain::limits::MAX_TEXT_BYTES;
use assay_domain::{Severity, UnusableReply};
use serde_json::{Map, Value};

/// Longest description, fix instruction, location or context window kept per issue (what the
/// wire accepts back in a verdict).
const MAX_ISSUE_TEXT: usize = MAX_TEXT_BYTES / 16;

/// Longest context window taken from a section around a quoted location.
const MAX_CONTEXT_WINDOW: usize = 1_200;

/// A judge's reply, checked against the request.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedVerdict {
    pub criterion_scores: BTreeMap<String, f64>,
    pub issues: Vec<JudgeIssue>,
    pub section_scores: Vec<SectionScore>,
    pub unknown_section_issues: u32,
    /// What was dropped from the reply, and why.
    pub notes: Vec<String>,
}

/// First value under any of `keys`.
fn field<'v>(o: &'v Map<String, Value>, keys: &[&str]) -> Option<&'v Value> {
    keys.iter().find_map(|k| o.get(*k))
}

/// A string field ("" when missing; numbers are spelt out, other types are not text).
fn text(o: &Map<String, Value>, keys: &[&str]) -> String {
    match field(o, keys) {
        Some(Value::String(s)) => s.trim().to_string(),
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::Null | Value::Bool(_) | Value::Array(_) | Value::Object(_)) | None => String::new(),
    }
}

/// A score: a number or a numeric string, finite, in [0, 1].
fn unit_score(v: &Value, what: &str) -> Result<f64, UnusableReply> {
    let x = match v {
        Value::Number(n) => n.as_f64(),
        Value::String(s) => s.trim().parse::<f64>().ok(),
        Value::Object(o) => {
            return field(o, &["score", "value"])
                .map_or_else(|| Err(format!("{what} is not a number").into()), |s| unit_score(s, what));
        }
        Value::Null | Value::Bool(_) | Value::Array(_) => None,
    };
    match x {
        Some(x) if x.is_finite() && (0.0..=1.0).contains(&x) => Ok(x),
        Some(x) => Err(format!("{what} is {x}, outside [0, 1]").into()),
        None => Err(format!("{what} is not a number ({v})").into()),
    }
}

/// Cut `s` to at most `max` bytes on a character boundary.
fn capped(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// Resolve a name against known ones: exact, else trimmed and case-insensitive.
fn resolve<'a>(name: &str, known: impl Iterator<Item = &'a str> + Clone) -> Option<&'a str> {
    let name = name.trim();
    known.clone().find(|k| *k == name).or_else(|| known.clone().find(|k| k.trim().eq_ignore_ascii_case(name)))
}

/// The paragraph of `content` holding the quoted `location`, when the quote is found verbatim.
fn context_window(content: &str, location: &str) -> String {
    let quote = location.trim().trim_matches(|c: char| matches!(c, '"' | '\'' | '“' | '”' | '«' | '»')).trim();
    if quote.len() < 8 {
        return String::new();
    }
    let Some(at) = content.find(quote) else { return String::new() };
    let start = content[..at].rfind("\n\n").map_or(0, |p| p + 2);
    let end = content[at..].find("\n\n").map_or(content.len(), |p| at + p);
    capped(content[start..end].trim().to_string(), MAX_CONTEXT_WINDOW)
}

/// Check a judge's reply against the request (see the module docs for the rules). `Err` is why the
/// judge failed.
pub fn parse_verdict(
    value: &Value,
    judge_id: &str,
    sections: &[Section],
    criteria: &[Criterion],
) -> Result<ParsedVerdict, UnusableReply> {
    parse_verdict_with_context(value, judge_id, sections, &[], criteria)
}

/// [`parse_verdict`] for a focused judging: issues and section scores naming a `context` section
/// are dropped with a note (context is read-only), and section scores missing for judged sections
/// are noted (the focused prompt requires one per judged section and criterion). With empty
/// `context` this is [`parse_verdict`].
pub fn parse_verdict_with_context(
    value: &Value,
    judge_id: &str,
    sections: &[Section],
    context: &[Section],
    criteria: &[Criterion],
) -> Result<ParsedVerdict, UnusableReply> {
    let Value::Object(root) = value else { return Err("the reply is not a JSON object".into()) };
    let names = || criteria.iter().map(|c| c.name.as_str());
    let ids = || sections.iter().map(|s| s.id.as_str());
    let context_ids = || context.iter().map(|s| s.id.as_str());
    let mut notes = Vec::new();

    // Criterion scores: {"name": 0.8} (or {"name": {"score": 0.8}}), or [{"criterion", "score"}].
    let raw: Vec<(String, &Value)> = match field(root, &["criterion_scores", "scores", "criteria"]) {
        Some(Value::Object(m)) => m.iter().map(|(k, v)| (k.clone(), v)).collect(),
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|e| {
                let o = e.as_object()?;
                Some((text(o, &["criterion", "name"]), field(o, &["score", "value"])?))
            })
            .collect(),
        Some(other) => return Err(format!("criterion_scores is not an object ({other})").into()),
        None => return Err("the reply has no criterion_scores".into()),
    };
    let mut criterion_scores = BTreeMap::new();
    for name in names() {
        let found = raw
            .iter()
            .find(|(k, _)| k == name)
            .or_else(|| raw.iter().find(|(k, _)| k.trim().eq_ignore_ascii_case(name)));
        let Some((_, v)) = found else { return Err(format!("no score for criterion {name:?}").into()) };
        criterion_scores.insert(name.to_string(), unit_score(v, &format!("the score of {name:?}"))?);
    }

    // Issues.
    let mut issues = Vec::new();
    let mut unknown_section_issues = 0u32;
    let list: &[Value] = match field(root, &["issues"]) {
        Some(Value::Array(a)) => a,
        Some(Value::Null) | None => {
            notes.push("the reply has no issues list; read as no issues".to_string());
            &[]
        }
        Some(other) => return Err(format!("issues is not a list ({other})").into()),
    };
    let mut dropped = Vec::new();
    for (n, raw) in list.iter().enumerate() {
        let Value::Object(o) = raw else {
            dropped.push(format!("issue {} is not an object", n + 1));
            continue;
        };
        let criterion = text(o, &["criterion", "category"]);
        if criterion.is_empty() {
            dropped.push(format!("issue {} names no criterion", n + 1));
            continue;
        }
        let severity_text = text(o, &["severity"]);
        let Some(severity) = Severity::parse(&severity_text) else {
            dropped.push(format!("issue {} has unknown severity {severity_text:?}", n + 1));
            continue;
        };
        if issues.len() == MAX_ISSUES_PER_VERDICT {
            dropped.push(format!("issues past the first {MAX_ISSUES_PER_VERDICT}"));
            break;
        }
        let description = capped(text(o, &["description", "issue", "problem"]), MAX_ISSUE_TEXT);
        let fix_instruction =
            capped(text(o, &["fix_instruction", "fix_instructions", "fix", "suggestion"]), MAX_ISSUE_TEXT);
        if description.trim().is_empty() && fix_instruction.trim().is_empty() {
            dropped.push(format!("issue {} says neither what is wrong nor how to fix it", n + 1));
            continue;
        }
        let named = text(o, &["section_id", "section", "target_section_id"]);
        let section = if named.is_empty() { None } else { resolve(&named, ids()) };
        if section.is_none()
            && !named.is_empty()
            && let Some(read_only) = resolve(&named, context_ids())
        {
            dropped.push(format!("issue {} names the context section {read_only:?}, which is read-only", n + 1));
            continue;
        }
        if !named.is_empty() && section.is_none() {
            unknown_section_issues += 1;
        }
        let location = capped(text(o, &["location", "quote"]), MAX_ISSUE_TEXT);
        let context = section
            .and_then(|id| sections.iter().find(|s| s.id == id))
            .map(|s| context_window(&s.content, &location))
            .unwrap_or_default();
        issues.push(JudgeIssue {
            id: format!("{judge_id}-{}", issues.len() + 1),
            criterion: resolve(&criterion, names()).map_or(criterion.clone(), str::to_string),
            severity,
            section_id: section.unwrap_or_default().to_string(),
            description,
            fix_instruction,
            location,
            raised_by: Vec::new(),
            context_window: context,
        });
    }
    if !dropped.is_empty() {
        notes.push(format!("dropped: {}", dropped.join(", ")));
    }

    // Optional section scores.
    let mut section_scores = Vec::new();
    let mut seen = HashSet::new();
    let mut skipped = 0usize;
    let mut on_context = 0usize;
    let mut invalid: Vec<String> = Vec::new();
    if let Some(Value::Array(entries)) = field(root, &["section_scores"]) {
        for e in entries {
            let Value::Object(o) = e else {
                skipped += 1;
                continue;
            };
            let (sid, crit) = (text(o, &["section_id", "section"]), text(o, &["criterion", "name"]));
            if resolve(&sid, ids()).is_none() && resolve(&sid, context_ids()).is_some() {
                on_context += 1;
                continue;
            }
            let (Some(sid), Some(crit)) = (resolve(&sid, ids()), resolve(&crit, names())) else {
                skipped += 1;
                continue;
            };
            let Some(v) = field(o, &["score", "value"]) else {
                skipped += 1;
                continue;
            };
            // Section scores are optional: an unusable one is dropped and noted, never guessed.
            let score = match unit_score(v, &format!("the score of section {sid:?} on {crit:?}")) {
                Ok(x) => x,
                Err(why) => {
                    invalid.push(why.0);
                    continue;
                }
            };
            if seen.insert((sid, crit)) {
                section_scores.push(SectionScore { section_id: sid.to_string(), criterion: crit.to_string(), score });
            } else {
                skipped += 1;
            }
        }
    }
    if skipped > 0 {
        notes.push(format!("dropped {skipped} section score(s) naming unknown or repeated sections or criteria"));
    }
    if let Some(first) = invalid.first() {
        notes.push(format!("dropped {} unusable section score(s), e.g. {first}", invalid.len()));
    }
    if on_context > 0 {
        notes.push(format!("dropped {on_context} section score(s) naming context sections, which are read-only"));
    }
    let wanted = sections.len() * criteria.len();
    if !context.is_empty() && section_scores.len() < wanted {
        notes.push(format!(
            "section scores missing for {} of {wanted} judged section x criterion pairs",
            wanted - section_scores.len()
        ));
    }
    Ok(ParsedVerdict { criterion_scores, issues, section_scores, unknown_section_issues, notes })
}
