//! `assay report`: one finished run as a file to share. [`Report`] is what the verb read from the
//! gateway (the run, its records a page at a time, the events a report needs); [`html`] writes it
//! as one self-contained page (inline CSS, inline SVG, a small inline pager; its
//! Content-Security-Policy allows nothing from the network), [`markdown`] as a pull-request
//! comment. The views both forms share (the worst records, a refinement's sections before and
//! after) are built here, once. Untrusted text (record ids, answers, inputs, documents, model
//! replies) is always written as text: escaped for HTML, escaped or code-quoted for Markdown.

pub mod html;
pub mod markdown;
mod svg;

use std::collections::{BTreeMap, BTreeSet};

use assay_proto::common::v1 as common;
use assay_proto::gateway::v1 as gw;

/// Records listed under "worst records".
pub const WORST: usize = 10;

/// Everything a report shows.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// The run as GetRun returns it (a checklist evaluation's per-record results are in `records`).
    pub run: gw::Run,
    /// A checklist evaluation's records, read a page at a time.
    pub records: Records,
    /// A run that stopped when decided: its comparisons as they narrowed (`comparison_updated`).
    pub updates: Vec<gw::ComparisonUpdated>,
    /// A targeted refinement's events, in order.
    pub refinement: Vec<gw::RefinementEvent>,
    /// A refinement's document as given (`--document`): the gateway does not keep it.
    pub document: Option<Vec<common::Section>>,
}

/// A checklist evaluation's records: the first ones in record order, and what is known of all.
#[derive(Debug, Clone, Default)]
pub struct Records {
    /// The first records in record order (at most the verb's `--records`).
    pub shown: Vec<gw::RecordResult>,
    /// Every result read.
    pub total: u64,
    /// Results without a score: failed, not run, or no item answered.
    pub failed: u64,
    /// The lowest-scored results over every record, lowest first (at most [`WORST`]).
    pub worst: Vec<gw::RecordResult>,
}

impl Records {
    /// Take one more result (in record order), keeping at most `keep` in `shown`.
    pub fn push(&mut self, r: gw::RecordResult, keep: usize) {
        self.total += 1;
        match primary(&r) {
            None => self.failed += 1,
            Some(score) => {
                let worse_than_last = self.worst.last().and_then(primary).is_none_or(|last| score < last);
                if self.worst.len() < WORST || worse_than_last {
                    let at = self.worst.partition_point(|w| primary(w).is_some_and(|x| x <= score));
                    let mut slim = r.clone();
                    slim.response = clip(&slim.response, RESPONSE_CHARS);
                    self.worst.insert(at, slim);
                    self.worst.truncate(WORST);
                }
            }
        }
        if self.shown.len() < keep {
            self.shown.push(r);
        }
    }
}

/// Characters of a responder's response a report keeps per record.
pub const RESPONSE_CHARS: usize = 600;

/// A record's primary score, when it has one (a score with no item answered is no score).
pub fn primary(r: &gw::RecordResult) -> Option<f64> {
    r.score.as_ref().filter(|s| s.answered_count > 0).map(|s| s.primary_score)
}

/// `text` cut to `n` characters, with an ellipsis when cut.
pub fn clip(text: &str, n: usize) -> String {
    match text.char_indices().nth(n) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// Questions by checklist id and item id, from the checklists the result carries.
pub fn questions(checklists: &[common::Checklist]) -> BTreeMap<String, BTreeMap<String, String>> {
    checklists
        .iter()
        .map(|c| (c.id.clone(), c.items.iter().map(|i| (i.id.clone(), i.question.clone())).collect()))
        .collect()
}

/// An item's answer as one letter: `y`, `n`, or `-` (no answer).
pub fn answer_letter(a: i32) -> char {
    match common::Answer::try_from(a) {
        Ok(common::Answer::Yes) => 'y',
        Ok(common::Answer::No) => 'n',
        Ok(common::Answer::Unspecified) | Err(_) => '-',
    }
}

/// The items a record's judge answered no, by id.
pub fn failed_items(r: &gw::RecordResult) -> Vec<String> {
    r.score
        .iter()
        .flat_map(|s| &s.item_scores)
        .filter(|i| answer_letter(i.answer) == 'n')
        .map(|i| i.item_id.clone())
        .collect()
}

/// `0.812`, or `-` for a value that is not a number.
pub fn score(x: f64) -> String {
    if x.is_finite() { format!("{x:.3}") } else { "-".into() }
}

/// `81.2%`.
pub fn pct(x: f64) -> String {
    if x.is_finite() { format!("{:.1}%", x * 100.0) } else { "-".into() }
}

/// A signed difference: `+0.0123`.
pub fn diff(x: f64) -> String {
    if x.is_finite() { format!("{x:+.4}") } else { "-".into() }
}

/// `95%` from a significance level (0 means 0.05).
pub fn level(alpha: f64) -> String {
    let a = if alpha > 0.0 && alpha < 1.0 { alpha } else { 0.05 };
    format!("{:.0}%", (1.0 - a) * 100.0)
}

/// A p-value: `< 0.0001` or four decimals.
pub fn p_value(p: f64) -> String {
    if !p.is_finite() {
        "-".into()
    } else if p < 0.0001 {
        "< 0.0001".into()
    } else {
        format!("{p:.4}")
    }
}

/// Prompt plus completion tokens.
pub fn tokens(u: &common::Usage) -> u64 {
    u.prompt_tokens + u.completion_tokens
}

/// A number with thousands separators: `12,345`.
pub fn count(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::new();
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A comparison's verdict in words (the regression gate first, then significance).
pub fn verdict(c: &gw::CompareRunsResponse) -> &'static str {
    match (&c.gate, c.significant) {
        (Some(g), _) if g.regressed => "significantly worse",
        (_, true) if c.diff > 0.0 => "significantly better",
        (_, true) if c.diff < 0.0 => "significantly worse",
        (_, true) => "significantly different",
        (_, false) => "no significant difference",
    }
}

/// A comparison's method (`paired_t`).
pub fn method(m: i32) -> String {
    gw::CompareMethod::try_from(m)
        .map(|m| super::lower(m.as_str_name(), "COMPARE_METHOD_"))
        .unwrap_or_else(|_| m.to_string())
}

/// A sequential decision (`worse`).
pub fn decision(d: i32) -> String {
    gw::SequentialDecision::try_from(d)
        .map(|x| super::lower(x.as_str_name(), "SEQUENTIAL_DECISION_"))
        .unwrap_or_else(|_| d.to_string())
}

/// The evaluation of a checklist_eval run, if it has one.
pub fn evaluation(run: &gw::Run) -> Option<&gw::EvaluateResponse> {
    match run.result.as_ref()?.result.as_ref()? {
        gw::run_result::Result::ChecklistEval(e) => Some(e),
        gw::run_result::Result::Checklist(_)
        | gw::run_result::Result::SelfRefine(_)
        | gw::run_result::Result::Debate(_)
        | gw::run_result::Result::TargetedRefinement(_) => None,
    }
}

/// The run's error, when it failed.
pub fn run_error(run: &gw::Run) -> &str {
    run.result.as_ref().map_or("", |r| r.error.as_str())
}

// ---------------------------------------------------------------------------------------------
// A refinement, section by section
// ---------------------------------------------------------------------------------------------

/// Where an issue raised on a section ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IssueEnd {
    /// The delta judge verified a kept fix of it.
    Fixed,
    /// Among the result's unresolved issues.
    Unresolved,
    /// Not raised at the last judging, with no verified fix naming it.
    Gone,
}

impl IssueEnd {
    pub fn word(self) -> &'static str {
        match self {
            Self::Fixed => "fixed",
            Self::Unresolved => "unresolved",
            Self::Gone => "no longer raised",
        }
    }
}

/// One edit proposed for a section.
#[derive(Debug, Clone)]
pub struct Edit {
    pub iteration: u32,
    pub action: i32,
    pub summary: String,
    /// Kept (the delta judge accepted it), or the reason it was not.
    pub kept: Result<(), String>,
}

/// A section of a refinement: its text before and after, the issues raised on it, its edits.
#[derive(Debug, Clone)]
pub struct SectionView {
    pub id: String,
    pub title: String,
    /// The text as given, when known (`--document`).
    pub before: Option<String>,
    pub after: String,
    pub changed: bool,
    pub locked: bool,
    /// Mean of the judges' section scores at the first judging and at the last one that judged it.
    pub score_before: Option<f64>,
    pub score_after: Option<f64>,
    pub issues: Vec<(common::JudgeIssue, IssueEnd)>,
    pub edits: Vec<Edit>,
}

/// Every section of a refinement's result, with what the events say of it.
pub fn sections(
    r: &gw::TargetedRefinementResult,
    events: &[gw::RefinementEvent],
    document: Option<&[common::Section]>,
) -> Vec<SectionView> {
    use gw::refinement_event::Event as E;
    let changed: BTreeSet<&str> = r.changed_section_ids.iter().map(String::as_str).collect();
    let locked: BTreeSet<&str> = r.locked_section_ids.iter().map(String::as_str).collect();
    // Issues raised, first seen first (the same problem raised again is one issue).
    let mut raised: Vec<common::JudgeIssue> = Vec::new();
    let mut fixed: BTreeSet<String> = BTreeSet::new();
    let mut edits: BTreeMap<String, Vec<Edit>> = BTreeMap::new();
    let mut first_scores: Option<BTreeMap<String, f64>> = None;
    let mut last_scores: BTreeMap<String, f64> = BTreeMap::new();
    for ev in events {
        match ev.event.as_ref() {
            Some(E::RefinementStart(s) | E::IterationStarted(s)) => {
                let issues = s.plan.as_ref().and_then(|p| p.consolidation.as_ref()).map(|c| c.issues.as_slice());
                for i in issues.unwrap_or_default() {
                    let same = |k: &common::JudgeIssue| {
                        k.id == i.id
                            || (k.section_id == i.section_id
                                && k.criterion == i.criterion
                                && k.description == i.description)
                    };
                    if !raised.iter().any(same) {
                        raised.push(i.clone());
                    }
                }
            }
            Some(E::PatchApplied(p)) => edits.entry(p.section_id.clone()).or_default().push(Edit {
                iteration: ev.iteration,
                action: p.action,
                summary: p.diff_summary.clone(),
                kept: Ok(()),
            }),
            Some(E::PatchRejected(p)) => edits.entry(p.section_id.clone()).or_default().push(Edit {
                iteration: ev.iteration,
                action: p.action,
                summary: p.diff_summary.clone(),
                kept: Err(if p.reason.is_empty() { "rejected".into() } else { p.reason.clone() }),
            }),
            Some(E::VerificationResult(v)) if v.accepted && !v.rolled_back => {
                let verified = v.verification.as_ref().map(|x| x.issues.as_slice()).unwrap_or_default();
                fixed.extend(verified.iter().filter(|i| i.fixed).map(|i| i.issue_id.clone()));
            }
            Some(E::Judged(j)) => {
                let scores = section_scores(j);
                if first_scores.is_none() {
                    first_scores = Some(scores.clone());
                }
                last_scores.extend(scores);
            }
            Some(_) | None => {}
        }
    }
    let unresolved = |i: &common::JudgeIssue| {
        r.unresolved_issues
            .iter()
            .any(|u| u.id == i.id || (u.section_id == i.section_id && u.description == i.description))
    };
    let given = |id: &str| document.and_then(|d| d.iter().find(|s| s.id == id));
    r.sections
        .iter()
        .map(|s| {
            let mut issues: Vec<(common::JudgeIssue, IssueEnd)> = raised
                .iter()
                .filter(|i| i.section_id == s.id)
                .map(|i| {
                    let end = if unresolved(i) {
                        IssueEnd::Unresolved
                    } else if fixed.contains(&i.id) {
                        IssueEnd::Fixed
                    } else {
                        IssueEnd::Gone
                    };
                    (i.clone(), end)
                })
                .collect();
            // Unresolved issues no plan held (held back by the agreement filter, raised last).
            for u in r.unresolved_issues.iter().filter(|u| u.section_id == s.id) {
                if !issues.iter().any(|(i, _)| i.id == u.id || i.description == u.description) {
                    issues.push((u.clone(), IssueEnd::Unresolved));
                }
            }
            let before = given(&s.id).map(|g| g.content.clone());
            let changed = changed.contains(s.id.as_str()) || before.as_ref().is_some_and(|b| *b != s.content);
            SectionView {
                id: s.id.clone(),
                title: if s.title.is_empty() {
                    given(&s.id).map(|g| g.title.clone()).unwrap_or_default()
                } else {
                    s.title.clone()
                },
                before,
                after: s.content.clone(),
                changed,
                locked: locked.contains(s.id.as_str()),
                score_before: first_scores.as_ref().and_then(|m| m.get(&s.id).copied()),
                score_after: last_scores.get(&s.id).copied(),
                issues,
                edits: edits.remove(&s.id).unwrap_or_default(),
            }
        })
        .collect()
}

/// Mean of the judges' section scores, per section, at one judging.
fn section_scores(j: &gw::Judged) -> BTreeMap<String, f64> {
    let mut sums: BTreeMap<String, (f64, u32)> = BTreeMap::new();
    for v in j.judges.iter().filter_map(|r| r.verdict.as_ref()) {
        for s in &v.section_scores {
            let e = sums.entry(s.section_id.clone()).or_default();
            e.0 += s.score;
            e.1 += 1;
        }
    }
    sums.into_iter().map(|(id, (sum, n))| (id, sum / f64::from(n.max(1)))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(index: u32, id: &str, primary: Option<f64>) -> gw::RecordResult {
        gw::RecordResult {
            index,
            record_id: id.into(),
            score: primary.map(|p| common::Score { primary_score: p, answered_count: 1, ..Default::default() }),
            error: if primary.is_none() { "boom".into() } else { String::new() },
            ..Default::default()
        }
    }

    #[test]
    fn records_keep_the_first_ones_and_the_worst_of_all() {
        let mut r = Records::default();
        for i in 0..100u32 {
            let score = if i % 10 == 3 { None } else { Some(f64::from((i * 37) % 100) / 100.0) };
            r.push(rec(i, &format!("r{i}"), score), 5);
        }
        assert_eq!((r.total, r.failed, r.shown.len()), (100, 10, 5));
        let worst: Vec<f64> = r.worst.iter().filter_map(primary).collect();
        let mut all: Vec<f64> =
            (0..100u32).filter(|i| i % 10 != 3).map(|i| f64::from((i * 37) % 100) / 100.0).collect();
        all.sort_by(f64::total_cmp);
        assert_eq!(worst, all[..WORST].to_vec());
    }

    #[test]
    fn counts_and_clips() {
        assert_eq!(count(0), "0");
        assert_eq!(count(999), "999");
        assert_eq!(count(1000), "1,000");
        assert_eq!(count(1234567), "1,234,567");
        assert_eq!(clip("héllo", 2), "hé…");
        assert_eq!(clip("hé", 2), "hé");
    }
}
