//! The section judge panel (Stage 6 judges): N judges, each its own model, score a sectioned
//! document per criterion and raise targeted issues. One judge is one model call; a judge that
//! fails is reported as failed (never as a zero score) and the other judges' verdicts stand.

use std::collections::{HashMap, HashSet};

use crate::Usage;

use crate::document::{
    Brief, Criterion, JudgeVerdict, MAX_JUDGES, MAX_SECTIONS, Section, check_criteria, check_sections,
};
use crate::error::{StageError, Violations};
use crate::limits::{MAX_ID_BYTES, MAX_TEXT_BYTES};
use crate::model::{ModelRecord, ModelSpec};
use crate::stage::EventSink;

/// Configuration phase the judges resolve their models for.
pub const JUDGE_PHASE: &str = "stage_6_judge";

/// Temperatures of the default panel, one judge each.
pub const DEFAULT_PANEL_TEMPERATURES: [f64; 3] = [0.0, 0.3, 0.6];

/// One judge of a panel.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PanelJudge {
    /// Unique within the panel.
    pub id: String,
    pub model: ModelSpec,
}

/// Judge a sectioned document with a panel.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct JudgeSectionsRequest {
    pub sections: Vec<Section>,
    pub brief: Brief,
    /// Never empty once converted (empty on the wire means the six defaults).
    pub criteria: Vec<Criterion>,
    /// Empty: [`default_panel`].
    pub judges: Vec<PanelJudge>,
    /// Read-only context (focused judging): sections of the same document shown beside the
    /// judged ones (typically their neighbours), never judged. Empty: the sections are the whole
    /// document. See [`check_context`] for its rules.
    pub context: Vec<Section>,
}

/// One judge's outcome.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct JudgeResult {
    pub judge_id: String,
    /// Set when the judge produced a usable verdict.
    pub verdict: Option<JudgeVerdict>,
    /// Without a verdict: why the judge failed. With a verdict: non-fatal notes about parts of the
    /// reply that were dropped (e.g. an issue with an unknown severity); empty when there are none.
    pub error: String,
    /// Model calls of this judge, whether it succeeded or not.
    pub usage: Usage,
    pub model_record: Option<ModelRecord>,
}

impl JudgeResult {
    pub fn succeeded(&self) -> bool {
        self.verdict.is_some()
    }
}

/// The panel's results in judge order.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PanelOutcome {
    pub results: Vec<JudgeResult>,
    /// Judges that produced a verdict.
    pub succeeded: u32,
    /// Judges that failed.
    pub failed: u32,
    pub usage: Usage,
}

impl PanelOutcome {
    /// Counts and summed usage over `results`.
    pub fn from_results(results: Vec<JudgeResult>) -> Self {
        let mut usage = Usage::default();
        let mut succeeded = 0;
        for r in &results {
            usage.add(&r.usage);
            succeeded += u32::from(r.succeeded());
        }
        let failed = results.len() as u32 - succeeded;
        Self { results, succeeded, failed, usage }
    }

    /// The verdicts of the judges that succeeded, in judge order.
    pub fn verdicts(&self) -> Vec<JudgeVerdict> {
        self.results.iter().filter_map(|r| r.verdict.clone()).collect()
    }
}

/// Progress of a panel.
#[derive(Debug, Clone, PartialEq)]
pub enum JudgeEvent {
    /// The judge at `index` (position in the panel) finished, successfully or not.
    JudgeFinished { index: u32, result: JudgeResult },
}

/// The section judge panel stage.
#[async_trait::async_trait]
pub trait SectionJudge: Send + Sync {
    async fn judge_sections(
        &self,
        request: JudgeSectionsRequest,
        events: EventSink<'_, JudgeEvent>,
    ) -> Result<PanelOutcome, StageError>;
}

/// Three judges "judge-1".."judge-3" on the phase's model at temperatures 0.0, 0.3 and 0.6.
pub fn default_panel() -> Vec<PanelJudge> {
    DEFAULT_PANEL_TEMPERATURES
        .iter()
        .enumerate()
        .map(|(i, t)| PanelJudge {
            id: default_judge_id(i),
            model: ModelSpec { temperature: Some(*t), ..ModelSpec::default() },
        })
        .collect()
}

/// Id of the judge at `index` when the caller gave none.
pub fn default_judge_id(index: usize) -> String {
    format!("judge-{}", index + 1)
}

/// The panel of a request: empty means [`default_panel`]; empty ids become "judge-<i+1>".
pub fn panel_or_default(judges: Vec<PanelJudge>) -> Vec<PanelJudge> {
    if judges.is_empty() {
        return default_panel();
    }
    judges
        .into_iter()
        .enumerate()
        .map(|(i, mut j)| {
            if j.id.is_empty() {
                j.id = default_judge_id(i);
            }
            j
        })
        .collect()
}

/// Check a panel (ids already defaulted): at most [`MAX_JUDGES`], unique ids of bounded length.
/// Model specs are checked where they are converted.
pub fn check_judges(judges: &[PanelJudge], field: &str, v: &mut Violations) {
    if judges.len() > MAX_JUDGES {
        v.push(field, format!("has {} judges; the limit is {MAX_JUDGES}", judges.len()));
        return;
    }
    let mut seen = HashSet::new();
    for (i, j) in judges.iter().enumerate() {
        if j.id.trim().is_empty() {
            v.push(format!("{field}[{i}].id"), "must not be blank");
        } else if j.id.len() > MAX_ID_BYTES {
            v.push(format!("{field}[{i}].id"), format!("is {} bytes; the limit is {MAX_ID_BYTES}", j.id.len()));
        } else if !seen.insert(j.id.as_str()) {
            v.push(format!("{field}[{i}].id"), format!("duplicate judge id {:?}", j.id));
        }
    }
}

/// Check the read-only context of a focused judging against the judged `sections` (field names:
/// `context_field[i].id`, `sections_field[i].index`). Empty context is always fine. Otherwise the
/// same limits as sections apply to each entry (non-empty id of at most [`MAX_ID_BYTES`] bytes,
/// unique, non-empty content; at most [`MAX_TEXT_BYTES`] of context text), plus:
/// - no context id repeats a judged section's id (a section is judged or context, not both);
/// - sections and context together are at most [`MAX_SECTIONS`] (they are parts of one document);
/// - every section and context entry has a distinct `index`: the index is the document order that
///   places each context excerpt before or after the judged sections.
pub fn check_context(
    sections: &[Section],
    context: &[Section],
    sections_field: &str,
    context_field: &str,
    v: &mut Violations,
) {
    if context.is_empty() {
        return;
    }
    if sections.len() + context.len() > MAX_SECTIONS {
        v.push(
            context_field,
            format!(
                "has {} sections beside {} judged ones; the limit is {MAX_SECTIONS} together",
                context.len(),
                sections.len()
            ),
        );
        return;
    }
    let judged: HashMap<&str, usize> = sections.iter().enumerate().map(|(i, s)| (s.id.as_str(), i)).collect();
    let mut seen = HashSet::new();
    let mut total = 0usize;
    for (i, s) in context.iter().enumerate() {
        let id = format!("{context_field}[{i}].id");
        if s.id.trim().is_empty() {
            v.push(id, "must not be empty");
        } else if s.id.len() > MAX_ID_BYTES {
            v.push(id, format!("is {} bytes; the limit is {MAX_ID_BYTES}", s.id.len()));
        } else if let Some(j) = judged.get(s.id.as_str()) {
            v.push(
                id,
                format!("repeats the id {:?} of {sections_field}[{j}]: a section is judged or context, not both", s.id),
            );
        } else if !seen.insert(s.id.as_str()) {
            v.push(id, format!("duplicate section id {:?}", s.id));
        }
        if s.content.trim().is_empty() {
            v.push(format!("{context_field}[{i}].content"), "must not be empty");
        }
        total += s.content.len() + s.title.len();
    }
    if total > MAX_TEXT_BYTES {
        v.push(context_field, format!("hold {total} bytes of text; the limit is {MAX_TEXT_BYTES} bytes"));
    }
    // Document order: one index per section, judged or context.
    let mut indexes: HashMap<u32, String> = HashMap::new();
    let all = sections
        .iter()
        .enumerate()
        .map(|(i, s)| (sections_field, i, s))
        .chain(context.iter().enumerate().map(|(i, s)| (context_field, i, s)));
    for (field, i, s) in all {
        let here = format!("{field}[{i}]");
        if let Some(first) = indexes.get(&s.index) {
            v.push(
                format!("{here}.index"),
                format!(
                    "repeats index {} of {first}: with context, every section needs its own index (document order)",
                    s.index
                ),
            );
        } else {
            indexes.insert(s.index, here);
        }
    }
}

/// Check a model spec's sampling ranges (the same rules as the wire conversion).
pub fn check_model_spec(spec: &ModelSpec, field: &str, v: &mut Violations) {
    if spec.temperature.is_some_and(|t| !(0.0..=2.0).contains(&t)) {
        v.push(format!("{field}.temperature"), "must be between 0 and 2");
    }
    if spec.top_p.is_some_and(|t| !(0.0..=1.0).contains(&t)) {
        v.push(format!("{field}.top_p"), "must be between 0 and 1");
    }
    if spec.max_tokens == Some(0) {
        v.push(format!("{field}.max_tokens"), "must be at least 1 when set");
    }
}

impl JudgeSectionsRequest {
    /// Every check of a domain request (in-process callers skip the wire conversion): sections,
    /// the read-only context ([`check_context`]), criteria (must be non-empty here: defaults are
    /// filled at the edge), the panel and its model specs.
    pub fn check(&self) -> Result<(), StageError> {
        let mut v = Violations::new();
        check_sections(&self.sections, "sections", &mut v);
        check_context(&self.sections, &self.context, "sections", "context", &mut v);
        if self.criteria.is_empty() {
            v.push("criteria", "must not be empty (use document::default_criteria())");
        }
        check_criteria(&self.criteria, "criteria", &mut v);
        check_judges(&self.judges, "judges", &mut v);
        for (i, j) in self.judges.iter().enumerate() {
            check_model_spec(&j.model, &format!("judges[{i}].model"), &mut v);
        }
        v.into_result()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::document::default_criteria;

    fn request() -> JudgeSectionsRequest {
        JudgeSectionsRequest {
            sections: vec![Section { id: "s1".into(), content: "text".into(), ..Default::default() }],
            criteria: default_criteria(),
            judges: default_panel(),
            ..Default::default()
        }
    }

    #[test]
    fn default_panel_is_three_judges_at_rising_temperatures() {
        let p = panel_or_default(Vec::new());
        let got: Vec<(String, Option<f64>)> = p.iter().map(|j| (j.id.clone(), j.model.temperature)).collect();
        assert_eq!(
            got,
            vec![("judge-1".into(), Some(0.0)), ("judge-2".into(), Some(0.3)), ("judge-3".into(), Some(0.6))]
        );
        assert!(request().check().is_ok());
    }

    #[test]
    fn empty_ids_are_filled_and_duplicates_rejected() {
        let p =
            panel_or_default(vec![PanelJudge::default(), PanelJudge { id: "judge-1".into(), ..Default::default() }]);
        assert_eq!(p[0].id, "judge-1");
        let mut r = request();
        r.judges = p;
        let e = r.check().unwrap_err().to_string();
        assert!(e.contains("judges[1].id: duplicate judge id"), "{e}");
    }

    #[test]
    fn panel_size_and_temperatures_are_bounded() {
        let mut r = request();
        r.judges = panel_or_default(vec![PanelJudge::default(); MAX_JUDGES + 1]);
        assert!(r.check().unwrap_err().to_string().contains("judges: has 10 judges"));
        let mut r = request();
        r.judges[2].model.temperature = Some(2.5);
        assert!(r.check().unwrap_err().to_string().contains("judges[2].model.temperature"));
    }

    fn section(id: &str, index: u32) -> Section {
        Section { id: id.into(), index, content: "text".into(), ..Default::default() }
    }

    #[test]
    fn context_is_checked_against_the_judged_sections() {
        let mut r = request();
        r.context = vec![section("s0", 1), section("s2", 2)];
        assert!(r.check().is_ok());

        // A context id repeating a judged one, a duplicate and a blank id, an empty content.
        r.context = vec![section("s1", 1), section("s2", 2), section("s2", 3), section(" ", 4)];
        r.context[3].content = " ".into();
        let e = r.check().unwrap_err().to_string();
        assert!(e.contains("context[0].id: repeats the id \"s1\" of sections[0]"), "{e}");
        assert!(e.contains("context[2].id: duplicate section id \"s2\""), "{e}");
        assert!(e.contains("context[3].id: must not be empty"), "{e}");
        assert!(e.contains("context[3].content: must not be empty"), "{e}");

        // Document order needs one index per section once there is context.
        r.context = vec![section("s2", 0)];
        let e = r.check().unwrap_err().to_string();
        assert!(e.contains("context[0].index: repeats index 0 of sections[0]"), "{e}");

        // Sections and context are one document: at most MAX_SECTIONS together.
        r.context = (1..=MAX_SECTIONS as u32).map(|i| section(&format!("c{i}"), i)).collect();
        let e = r.check().unwrap_err().to_string();
        assert!(e.contains("context: has 200 sections beside 1 judged ones; the limit is 200 together"), "{e}");
    }

    #[test]
    fn outcome_counts_and_sums() {
        let ok = JudgeResult {
            judge_id: "a".into(),
            verdict: Some(JudgeVerdict::default()),
            usage: Usage { calls: 1, prompt_tokens: 10, ..Default::default() },
            ..Default::default()
        };
        let bad = JudgeResult {
            judge_id: "b".into(),
            error: "no".into(),
            usage: Usage { calls: 1, prompt_tokens: 5, ..Default::default() },
            ..Default::default()
        };
        let o = PanelOutcome::from_results(vec![ok, bad]);
        assert_eq!((o.succeeded, o.failed, o.usage.calls, o.usage.prompt_tokens), (1, 1, 2, 15));
        assert_eq!(o.verdicts().len(), 1);
    }
}
