//! Sectioned documents and what judges say about them: sections, the brief, criteria, issues and
//! verdicts. Shared by the judge panel, the arbiter, the delta judge and the content refiners.

use std::collections::{BTreeMap, HashSet};

use serde::{Deserialize, Serialize};

use crate::Usage;
use crate::error::Violations;
use crate::limits::{MAX_ID_BYTES, MAX_TEXT_BYTES};
use crate::model::ModelRecord;

/// Most sections of one document.
pub const MAX_SECTIONS: usize = 200;
/// Most judges of one panel or verdicts of one consolidation.
pub const MAX_JUDGES: usize = 9;
/// Most criteria of one request.
pub const MAX_CRITERIA: usize = 32;
/// Most issues of one verdict.
pub const MAX_ISSUES_PER_VERDICT: usize = 1_000;

/// One section of a sectioned document.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Section {
    pub id: String,
    pub index: u32,
    pub title: String,
    pub content: String,
}

/// What a document is for.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Brief {
    pub objectives: Vec<String>,
    pub audience: String,
    pub language: String,
    pub description: String,
}

impl Brief {
    /// The brief as prompt text, one line per field that is set.
    pub fn prompt_text(&self) -> String {
        let mut out = Vec::new();
        if !self.description.trim().is_empty() {
            out.push(format!("Description: {}", self.description.trim()));
        }
        if !self.objectives.is_empty() {
            let list: Vec<&str> = self.objectives.iter().map(|o| o.trim()).collect();
            out.push(format!("Objectives: {}", list.join("; ")));
        }
        if !self.audience.trim().is_empty() {
            out.push(format!("Audience: {}", self.audience.trim()));
        }
        if !self.language.trim().is_empty() {
            out.push(format!("Language: {}", self.language.trim()));
        }
        if out.is_empty() { "(no brief given)".into() } else { out.join("\n") }
    }
}

/// A judging criterion; priority 1 is the highest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Criterion {
    pub name: String,
    pub description: String,
    pub priority: u32,
}

/// Issue severity, most severe first (so `min` is the most severe).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Critical,
    Major,
    Minor,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Critical => "critical",
            Severity::Major => "major",
            Severity::Minor => "minor",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "critical" => Some(Severity::Critical),
            "major" => Some(Severity::Major),
            "minor" => Some(Severity::Minor),
            _ => None,
        }
    }
}

/// One issue a judge raised.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JudgeIssue {
    pub id: String,
    pub criterion: String,
    pub severity: Severity,
    /// Empty when the judge named no known section.
    pub section_id: String,
    pub description: String,
    pub fix_instruction: String,
    pub location: String,
    /// Judges that raised it (filled on consolidation).
    pub raised_by: Vec<String>,
    pub context_window: String,
}

/// A judge's score of one criterion on one section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SectionScore {
    pub section_id: String,
    pub criterion: String,
    pub score: f64,
}

/// A judge's verdict on a document.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct JudgeVerdict {
    pub judge_id: String,
    pub model: String,
    /// Criterion -> score in [0, 1].
    pub criterion_scores: BTreeMap<String, f64>,
    pub issues: Vec<JudgeIssue>,
    pub overall_score: f64,
    pub section_scores: Vec<SectionScore>,
    pub usage: Usage,
    pub model_record: Option<ModelRecord>,
    pub unknown_section_issues: u32,
}

/// Mean of the scores (0 when there are none).
pub fn mean_score(scores: &BTreeMap<String, f64>) -> f64 {
    if scores.is_empty() { 0.0 } else { scores.values().sum::<f64>() / scores.len() as f64 }
}

/// The six Stage 6 criteria in priority order.
pub fn default_criteria() -> Vec<Criterion> {
    [
        ("factual_accuracy", "Facts, figures, definitions and claims are correct."),
        ("learning_objective_alignment", "The content serves the brief's learning objectives."),
        ("pedagogical_structure", "Sections build on each other in a sound teaching order."),
        ("clarity_readability", "Plain, concise language for the audience; short sentences."),
        ("engagement_examples", "Concrete examples, questions or activities keep the reader engaged."),
        ("completeness", "Every objective and announced topic is covered in enough depth."),
    ]
    .into_iter()
    .enumerate()
    .map(|(i, (name, description))| Criterion {
        name: name.to_string(),
        description: description.to_string(),
        priority: i as u32 + 1,
    })
    .collect()
}

/// Priority of a criterion name; an unknown name ranks just below every known one.
pub fn priority_of(criteria: &[Criterion], name: &str) -> u32 {
    criteria
        .iter()
        .find(|c| c.name == name)
        .map_or_else(|| criteria.iter().map(|c| c.priority).max().unwrap_or(0) + 1, |c| c.priority)
}

/// Check a section list: 1 to [`MAX_SECTIONS`], unique non-empty ids, bounded text.
pub fn check_sections(sections: &[Section], field: &str, v: &mut Violations) {
    if sections.is_empty() {
        v.push(field, "must not be empty: give the document's sections");
    }
    if sections.len() > MAX_SECTIONS {
        v.push(field, format!("has {} sections; the limit is {MAX_SECTIONS}", sections.len()));
        return;
    }
    let mut seen = HashSet::new();
    let mut total = 0usize;
    for (i, s) in sections.iter().enumerate() {
        if s.id.trim().is_empty() {
            v.push(format!("{field}[{i}].id"), "must not be empty");
        } else if s.id.len() > MAX_ID_BYTES {
            v.push(format!("{field}[{i}].id"), format!("is {} bytes; the limit is {MAX_ID_BYTES}", s.id.len()));
        } else if !seen.insert(s.id.as_str()) {
            v.push(format!("{field}[{i}].id"), format!("duplicate section id {:?}", s.id));
        }
        if s.content.trim().is_empty() {
            v.push(format!("{field}[{i}].content"), "must not be empty");
        }
        total += s.content.len() + s.title.len();
    }
    if total > MAX_TEXT_BYTES {
        v.push(field, format!("hold {total} bytes of text; the limit is {MAX_TEXT_BYTES} bytes"));
    }
}

/// Check criteria: unique non-empty names, at most [`MAX_CRITERIA`]; empty means the defaults.
pub fn check_criteria(criteria: &[Criterion], field: &str, v: &mut Violations) {
    if criteria.len() > MAX_CRITERIA {
        v.push(field, format!("has {} criteria; the limit is {MAX_CRITERIA}", criteria.len()));
        return;
    }
    let mut seen = HashSet::new();
    for (i, c) in criteria.iter().enumerate() {
        if c.name.trim().is_empty() {
            v.push(format!("{field}[{i}].name"), "must not be empty");
        } else if c.name.len() > MAX_ID_BYTES {
            v.push(format!("{field}[{i}].name"), format!("is {} bytes; the limit is {MAX_ID_BYTES}", c.name.len()));
        } else if !seen.insert(c.name.as_str()) {
            v.push(format!("{field}[{i}].name"), format!("duplicate criterion {:?}", c.name));
        }
        if c.priority == 0 {
            v.push(format!("{field}[{i}].priority"), "must be at least 1 (1 is the highest)");
        }
    }
}

/// The criteria of a request: the given ones, or the defaults when none are given.
pub fn criteria_or_default(criteria: Vec<Criterion>) -> Vec<Criterion> {
    if criteria.is_empty() { default_criteria() } else { criteria }
}

/// Check a score in [0, 1].
pub fn check_unit(x: f64, field: &str, v: &mut Violations) {
    if !x.is_finite() || !(0.0..=1.0).contains(&x) {
        v.push(field, format!("must be in [0, 1] (got {x})"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn section(id: &str) -> Section {
        Section { id: id.into(), content: "text".into(), ..Default::default() }
    }

    #[test]
    fn sections_are_checked() {
        let mut v = Violations::new();
        check_sections(&[], "sections", &mut v);
        check_sections(&[section("a"), section("a"), section("")], "doc", &mut v);
        let e = v.into_result().unwrap_err().to_string();
        assert!(e.contains("sections: must not be empty"), "{e}");
        assert!(e.contains("doc[1].id: duplicate section id \"a\""), "{e}");
        assert!(e.contains("doc[2].id: must not be empty"), "{e}");
    }

    #[test]
    fn default_priorities_follow_the_reference_order() {
        let c = default_criteria();
        assert_eq!(priority_of(&c, "factual_accuracy"), 1);
        assert!(priority_of(&c, "clarity_readability") < priority_of(&c, "completeness"));
        assert_eq!(priority_of(&c, "tone"), 7);
        assert!(Severity::Critical < Severity::Minor);
    }
}
