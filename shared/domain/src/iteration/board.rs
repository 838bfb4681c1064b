//! Incremental re-judging: each judge's standing view of the document, so a judging of the
//! changed sections alone (their neighbours as read-only context) updates the document's scores
//! without reading the rest again.
//!
//! The one rule: **a criterion's shortfall belongs to the issues raised on it.** Per judge:
//! - After a full judging, the judge's clean level L is its mean score over the criteria it raised
//!   no issue on (its highest criterion score when it raised issues on all). A criterion c it
//!   scored D_c below L while raising issues on it owes the shortfall `L - D_c` to those issues,
//!   shared by severity weight (critical 3, major 2, minor 1). The criterion's standing score is
//!   `base_c - (the shares of its open issues)`, with `base_c = D_c + (those shares)`: exactly
//!   the judge's own score after a full judging.
//! - A focused judging replaces the issues (and explicit section scores) of the sections it
//!   judged; the other sections' issues, document-level issues included, are carried. An issue
//!   no longer raised gives its share back; one still or newly raised costs its severity weight
//!   times the criterion's share per weight (the judge's mean share per weight on criteria with
//!   no shortfall of their own, else 0.05).
//! - The document's score is the mean over criteria, then over judges, of the standing scores,
//!   clamped to [0, 1] (the formula of [`super::document_score`]).
//!
//! So a fix counts for what the judges charged the issue it fixed, and a section that still has
//! its problem keeps its cost. A judge that fails a focused judging keeps its earlier view.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::document::{JudgeIssue, JudgeVerdict, Section, SectionScore, Severity};

/// Share per severity weight when a judge's own scores give none.
pub const DEFAULT_SHARE_PER_WEIGHT: f64 = 0.05;

/// Weight of an issue's severity in its criterion's shortfall.
pub fn severity_weight(s: Severity) -> f64 {
    match s {
        Severity::Critical => 3.0,
        Severity::Major => 2.0,
        Severity::Minor => 1.0,
    }
}

/// One judge's standing view.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct JudgeBoard {
    /// The judge's latest verdict (identity, model, usage of its last call); its issues and
    /// section scores are the standing ones.
    pub verdict: JudgeVerdict,
    /// Criterion -> score with no open issue.
    pub base: BTreeMap<String, f64>,
    /// Criterion -> share of the shortfall per severity weight.
    pub per_weight: BTreeMap<String, f64>,
    /// Issue id -> its share of its criterion's shortfall.
    pub shares: BTreeMap<String, f64>,
    /// Issues numbered so far (new issues get fresh ids).
    pub issued: u32,
    /// Ids of the issues placed from no section into one (see [`Board::place`]).
    #[serde(default)]
    pub placed: BTreeSet<String>,
}

/// Every judge's standing view, in judge order of the full judging.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct Board {
    pub judges: Vec<JudgeBoard>,
}

impl Board {
    /// The board of a full judging.
    pub fn from_full(verdicts: &[JudgeVerdict]) -> Self {
        Self { judges: verdicts.iter().map(JudgeBoard::full).collect() }
    }

    /// Replace the issues and section scores of the `judged` sections with a focused judging's
    /// verdicts (judges the board does not know are ignored).
    pub fn update_focused(&mut self, verdicts: &[JudgeVerdict], judged: &[String]) {
        for v in verdicts {
            if let Some(b) = self.judges.iter_mut().find(|b| b.verdict.judge_id == v.judge_id) {
                b.focused(v, judged);
            }
        }
    }

    /// Put the issues and section scores of sections back as `earlier` had them (a section
    /// restored to the content `earlier` judged).
    pub fn restore(&mut self, earlier: &Board, ids: &[String]) {
        for b in &mut self.judges {
            let Some(e) = earlier.judges.iter().find(|e| e.verdict.judge_id == b.verdict.judge_id) else { continue };
            let gone: Vec<String> =
                b.verdict.issues.iter().filter(|i| ids.contains(&i.section_id)).map(|i| i.id.clone()).collect();
            for id in &gone {
                b.shares.remove(id);
            }
            b.verdict.issues.retain(|i| !ids.contains(&i.section_id));
            for i in e.verdict.issues.iter().filter(|i| ids.contains(&i.section_id)) {
                b.shares.insert(i.id.clone(), e.shares.get(&i.id).copied().unwrap_or(0.0));
                b.verdict.issues.push(i.clone());
            }
            b.verdict.section_scores.retain(|s| !ids.contains(&s.section_id));
            b.verdict
                .section_scores
                .extend(e.verdict.section_scores.iter().filter(|s| ids.contains(&s.section_id)).cloned());
        }
    }

    /// An issue that named no section, placed by the arbiter in `sections` (FR: localization),
    /// belongs to them from now on: each judge that raised it (`raised_by`) has its section-less
    /// issue on the same criterion (`id` for the judge whose issue the arbiter kept, else that
    /// judge's first section-less issue on the criterion) moved into the first placed section, or
    /// copied into each (`<id>@<section>`, its share split evenly). A focused judging of the
    /// section then replaces it like any issue of the section: fixed, it gives its share back; a
    /// section that was never judged again keeps it. Returns how many judges' issues moved.
    pub fn place(&mut self, id: &str, criterion: &str, raised_by: &[String], sections: &[String]) -> usize {
        if sections.is_empty() {
            return 0;
        }
        let mut moved = 0;
        for b in &mut self.judges {
            if !raised_by.contains(&b.verdict.judge_id) && !b.verdict.issues.iter().any(|i| i.id == id) {
                continue;
            }
            let unplaced = |i: &JudgeIssue| i.section_id.is_empty() && i.criterion == criterion;
            let Some(at) = b
                .verdict
                .issues
                .iter()
                .position(|i| i.id == id && unplaced(i))
                .or_else(|| b.verdict.issues.iter().position(unplaced))
            else {
                continue;
            };
            let issue = b.verdict.issues.remove(at);
            let share = b.shares.remove(&issue.id).unwrap_or(0.0) / sections.len() as f64;
            for s in sections {
                let id = if sections.len() == 1 { issue.id.clone() } else { format!("{}@{s}", issue.id) };
                b.shares.insert(id.clone(), share);
                b.placed.insert(id.clone());
                b.verdict.issues.push(JudgeIssue { id, section_id: s.clone(), ..issue.clone() });
            }
            moved += 1;
        }
        moved
    }

    /// Each judge's standing verdict: criterion scores from the open issues' shares, the
    /// standing section scores and issues.
    pub fn verdicts(&self) -> Vec<JudgeVerdict> {
        self.judges.iter().map(JudgeBoard::standing).collect()
    }
}

impl JudgeBoard {
    fn full(v: &JudgeVerdict) -> Self {
        let scores = &v.criterion_scores;
        let mut weights: BTreeMap<&str, f64> = BTreeMap::new();
        for i in &v.issues {
            if scores.contains_key(&i.criterion) {
                *weights.entry(i.criterion.as_str()).or_default() += severity_weight(i.severity);
            }
        }
        let clean: Vec<f64> =
            scores.iter().filter(|(c, _)| !weights.contains_key(c.as_str())).map(|(_, x)| *x).collect();
        let level = if clean.is_empty() {
            scores.values().copied().fold(f64::NAN, f64::max)
        } else {
            clean.iter().sum::<f64>() / clean.len() as f64
        };
        let mut per_weight = BTreeMap::new();
        for (c, w) in &weights {
            let shortfall = level - scores[*c];
            if shortfall > 0.0 && *w > 0.0 {
                per_weight.insert((*c).to_string(), shortfall / w);
            }
        }
        let mean_unit = if per_weight.is_empty() {
            DEFAULT_SHARE_PER_WEIGHT
        } else {
            per_weight.values().sum::<f64>() / per_weight.len() as f64
        };
        for c in scores.keys() {
            per_weight.entry(c.clone()).or_insert(if weights.contains_key(c.as_str()) { 0.0 } else { mean_unit });
        }
        let mut b = Self {
            verdict: v.clone(),
            base: scores.clone(),
            per_weight,
            shares: BTreeMap::new(),
            issued: v.issues.len() as u32,
            placed: BTreeSet::new(),
        };
        for i in &v.issues {
            let share = b.share_of(i);
            b.shares.insert(i.id.clone(), share);
            if let Some(x) = b.base.get_mut(&i.criterion) {
                *x += share;
            }
        }
        b
    }

    fn share_of(&self, i: &JudgeIssue) -> f64 {
        self.per_weight.get(&i.criterion).copied().unwrap_or(0.0) * severity_weight(i.severity)
    }

    fn focused(&mut self, v: &JudgeVerdict, judged: &[String]) {
        // A placed issue stays open while the judge still raises it without a section (on the
        // same criterion): judging its section did not find it fixed.
        let still_raised = |i: &JudgeIssue| {
            self.placed.contains(&i.id)
                && v.issues.iter().any(|n| n.section_id.is_empty() && n.criterion == i.criterion)
        };
        let gone: Vec<String> = self
            .verdict
            .issues
            .iter()
            .filter(|i| judged.contains(&i.section_id) && !still_raised(i))
            .map(|i| i.id.clone())
            .collect();
        for id in &gone {
            self.shares.remove(id);
        }
        let mut issues: Vec<JudgeIssue> =
            self.verdict.issues.iter().filter(|i| !gone.contains(&i.id)).cloned().collect();
        self.placed.retain(|id| !gone.contains(id));
        for i in v.issues.iter().filter(|i| judged.contains(&i.section_id)) {
            self.issued += 1;
            let i = JudgeIssue { id: format!("{}-{}", self.verdict.judge_id, self.issued), ..i.clone() };
            self.shares.insert(i.id.clone(), self.share_of(&i));
            issues.push(i);
        }
        let mut section_scores: Vec<SectionScore> =
            self.verdict.section_scores.iter().filter(|s| !judged.contains(&s.section_id)).cloned().collect();
        section_scores.extend(v.section_scores.iter().filter(|s| judged.contains(&s.section_id)).cloned());
        let criterion_scores = std::mem::take(&mut self.verdict.criterion_scores);
        self.verdict = JudgeVerdict { issues, section_scores, criterion_scores, ..v.clone() };
    }

    fn standing(&self) -> JudgeVerdict {
        let mut criterion_scores = self.base.clone();
        for i in &self.verdict.issues {
            if let Some(x) = criterion_scores.get_mut(&i.criterion) {
                *x -= self.shares.get(&i.id).copied().unwrap_or(0.0);
            }
        }
        criterion_scores.values_mut().for_each(|x| *x = x.clamp(0.0, 1.0));
        let overall_score = if criterion_scores.is_empty() {
            self.verdict.overall_score
        } else {
            crate::document::mean_score(&criterion_scores)
        };
        JudgeVerdict { criterion_scores, overall_score, ..self.verdict.clone() }
    }
}

/// The sections to judge after an iteration (those whose content differs from the last judged
/// content, in document order) and their read-only context (the neighbours of a judged section
/// that are not judged themselves).
pub fn focus(sections: &[Section], judged_before: &[Section]) -> (Vec<Section>, Vec<Section>) {
    let changed: Vec<usize> = sections
        .iter()
        .enumerate()
        .filter(|(_, s)| judged_before.iter().find(|b| b.id == s.id).is_none_or(|b| b.content != s.content))
        .map(|(i, _)| i)
        .collect();
    let mut context: BTreeSet<usize> = BTreeSet::new();
    for &i in &changed {
        for j in [i.checked_sub(1), Some(i + 1)].into_iter().flatten() {
            if j < sections.len() && !changed.contains(&j) {
                context.insert(j);
            }
        }
    }
    (changed.iter().map(|&i| sections[i].clone()).collect(), context.into_iter().map(|i| sections[i].clone()).collect())
}

/// Estimated tokens of a panel judging: per judge, the prompt (instructions, brief, the judged
/// sections, about 150 tokens per context excerpt) and a reply (scores, section scores and a few
/// issues), at four characters a token.
pub fn judging_estimate(judges: usize, brief_chars: usize, judged: &[Section], context: usize) -> u64 {
    const INSTRUCTIONS: u64 = 800;
    const REPLY: u64 = 200;
    const REPLY_PER_SECTION: u64 = 80;
    const EXCERPT: u64 = 150;
    let text: usize = judged.iter().map(|s| s.content.chars().count() + s.title.chars().count() + 40).sum();
    let per_judge = INSTRUCTIONS
        + (brief_chars as u64).div_ceil(4)
        + (text as u64).div_ceil(4)
        + EXCERPT * context as u64
        + REPLY
        + REPLY_PER_SECTION * judged.len() as u64;
    per_judge * judges as u64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::iteration::document_score;

    fn secs(ids: &[&str]) -> Vec<Section> {
        ids.iter()
            .map(|id| Section { id: (*id).into(), content: format!("text of {id}"), ..Section::default() })
            .collect()
    }

    fn issue(n: usize, section: &str, criterion: &str, severity: Severity) -> JudgeIssue {
        JudgeIssue {
            id: format!("a-{n}"),
            criterion: criterion.into(),
            severity,
            section_id: section.into(),
            description: "wrong".into(),
            fix_instruction: String::new(),
            location: String::new(),
            raised_by: vec![],
            context_window: String::new(),
        }
    }

    fn verdict(judge: &str, scores: &[(&str, f64)], issues: Vec<JudgeIssue>) -> JudgeVerdict {
        JudgeVerdict {
            judge_id: judge.into(),
            criterion_scores: scores.iter().map(|(c, x)| ((*c).to_string(), *x)).collect(),
            issues,
            ..JudgeVerdict::default()
        }
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    const SCORES: [(&str, f64); 3] = [("accuracy", 0.6), ("clarity", 0.9), ("tone", 0.8)];

    #[test]
    fn a_full_judging_keeps_the_judges_own_scores() {
        let v = vec![
            verdict("a", &SCORES, vec![issue(1, "s2", "accuracy", Severity::Critical)]),
            verdict("b", &[("accuracy", 0.7), ("clarity", 0.8), ("tone", 0.8)], vec![]),
        ];
        let board = Board::from_full(&v);
        let standing = board.verdicts();
        assert!(close(document_score(&standing), document_score(&v)));
        for (a, b) in standing.iter().zip(&v) {
            assert_eq!(a.criterion_scores, b.criterion_scores);
        }
    }

    #[test]
    fn a_fixed_issue_gives_its_share_back_and_a_kept_one_keeps_it() {
        // Clean level 0.85 (clarity, tone); accuracy owes 0.25 to its two issues: critical 3/5,
        // major 2/5.
        let v = vec![verdict(
            "a",
            &SCORES,
            vec![issue(1, "s2", "accuracy", Severity::Critical), issue(2, "s3", "accuracy", Severity::Major)],
        )];
        let mut board = Board::from_full(&v);
        // s2 fixed; s3 judged again and still wrong.
        let again = verdict("a", &SCORES, vec![issue(1, "s3", "accuracy", Severity::Major)]);
        board.update_focused(&[again], &["s2".into(), "s3".into()]);
        let standing = &board.verdicts()[0];
        assert!(close(standing.criterion_scores["accuracy"], 0.6 + 0.25 * 3.0 / 5.0), "{standing:?}");
        let ids: Vec<&str> = standing.issues.iter().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, vec!["a-3"], "the new issue gets a fresh id");
        // Both fixed: the clean level.
        board.update_focused(&[verdict("a", &SCORES, vec![])], &["s3".into()]);
        assert!(close(board.verdicts()[0].criterion_scores["accuracy"], 0.85));
    }

    #[test]
    fn a_placed_section_less_issue_is_credited_once_its_section_is_fixed() {
        // Two judges raised "the objectives are missing" without a section; the arbiter placed it
        // in s1 (judge a's issue kept).
        let objectives =
            |judge: &str, n| JudgeIssue { id: format!("{judge}-{n}"), ..issue(n, "", "accuracy", Severity::Major) };
        let v = vec![
            verdict("a", &SCORES, vec![objectives("a", 1)]),
            verdict("b", &[("accuracy", 0.7), ("clarity", 0.9), ("tone", 0.9)], vec![objectives("b", 1)]),
        ];
        let full = document_score(&v);
        let mut board = Board::from_full(&v);
        let judges = ["a".to_string(), "b".to_string()];
        assert_eq!(board.place("a-1", "accuracy", &judges, &["s1".into()]), 2);
        assert!(board.verdicts().iter().all(|v| v.issues.iter().all(|i| i.section_id == "s1")));
        assert!(close(document_score(&board.verdicts()), full), "placing moves no score");
        // s1 patched and judged again, the problem gone: both judges give the share back.
        let clean = |j: &str| verdict(j, &SCORES, vec![]);
        board.update_focused(&[clean("a"), clean("b")], &["s1".into()]);
        let standing = board.verdicts();
        assert!(standing.iter().all(|v| v.issues.is_empty()), "{standing:?}");
        assert!(document_score(&standing) > full + 0.01, "the fix is credited");
        // A judge that still raises it without a section keeps it open in its section.
        let mut kept = Board::from_full(&v);
        kept.place("a-1", "accuracy", &judges, &["s1".into()]);
        let again = |j: &str| verdict(j, &SCORES, vec![objectives(j, 9)]);
        kept.update_focused(&[again("a"), again("b")], &["s1".into()]);
        assert!(close(document_score(&kept.verdicts()), full), "not credited");
        assert!(kept.verdicts().iter().all(|v| v.issues.len() == 1 && v.issues[0].section_id == "s1"));
        // Without the placement the section-less issues were carried with their cost.
        let mut unplaced = Board::from_full(&v);
        unplaced.update_focused(&[clean("a"), clean("b")], &["s1".into()]);
        assert!(close(document_score(&unplaced.verdicts()), full));
        // Placed in two sections: one copy each, the share split; nothing placed: nothing moves.
        let mut two = Board::from_full(&v[..1]);
        assert_eq!(two.place("a-1", "accuracy", &judges[..1], &["s1".into(), "s2".into()]), 1);
        let ids: Vec<String> = two.verdicts()[0].issues.iter().map(|i| i.id.clone()).collect();
        assert_eq!(ids, ["a-1@s1", "a-1@s2"]);
        assert!(close(document_score(&two.verdicts()), document_score(&v[..1])));
        assert_eq!(Board::from_full(&v).place("a-1", "accuracy", &judges, &[]), 0);
    }

    #[test]
    fn issues_of_sections_not_judged_again_are_carried_with_their_cost() {
        let v = vec![verdict(
            "a",
            &SCORES,
            vec![issue(1, "s1", "accuracy", Severity::Major), issue(2, "", "accuracy", Severity::Major)],
        )];
        let mut board = Board::from_full(&v);
        board.update_focused(&[verdict("a", &SCORES, vec![])], &["s1".into()]);
        let standing = &board.verdicts()[0];
        assert!(close(standing.criterion_scores["accuracy"], 0.6 + 0.125));
        assert_eq!(standing.issues.len(), 1, "the document-level issue stays");
    }

    #[test]
    fn a_new_issue_costs_the_judges_share_per_weight() {
        let v = vec![verdict("a", &SCORES, vec![issue(1, "s1", "accuracy", Severity::Major)])];
        let mut board = Board::from_full(&v);
        // Accuracy's share per weight is 0.25 / 2; a new major clarity issue costs the mean
        // share per weight (0.125) times 2.
        board
            .update_focused(&[verdict("a", &SCORES, vec![issue(1, "s2", "clarity", Severity::Major)])], &["s2".into()]);
        assert!(close(board.verdicts()[0].criterion_scores["clarity"], 0.9 - 0.25));
        // With no issue anywhere, the default share applies.
        let mut clean = Board::from_full(&[verdict("a", &SCORES, vec![])]);
        clean.update_focused(&[verdict("a", &SCORES, vec![issue(1, "s1", "tone", Severity::Minor)])], &["s1".into()]);
        assert!(close(clean.verdicts()[0].criterion_scores["tone"], 0.8 - DEFAULT_SHARE_PER_WEIGHT));
    }

    #[test]
    fn a_judge_that_failed_the_focused_judging_keeps_its_view() {
        let v = vec![
            verdict("a", &SCORES, vec![issue(1, "s1", "accuracy", Severity::Major)]),
            verdict("b", &SCORES, vec![issue(1, "s1", "accuracy", Severity::Major)]),
        ];
        let mut board = Board::from_full(&v);
        board.update_focused(&[verdict("a", &SCORES, vec![])], &["s1".into()]);
        let standing = board.verdicts();
        assert!(close(standing[0].criterion_scores["accuracy"], 0.85));
        assert!(close(standing[1].criterion_scores["accuracy"], 0.6));
    }

    #[test]
    fn a_restored_section_gets_its_earlier_issues_back() {
        let v = vec![verdict("a", &SCORES, vec![issue(1, "s1", "accuracy", Severity::Major)])];
        let earlier = Board::from_full(&v);
        let mut board = earlier.clone();
        board.update_focused(&[verdict("a", &SCORES, vec![])], &["s1".into()]);
        assert!(board.verdicts()[0].issues.is_empty());
        board.restore(&earlier, &["s1".into()]);
        assert_eq!(board.verdicts(), earlier.verdicts());
    }

    #[test]
    fn focus_is_the_changed_sections_and_context_their_neighbours() {
        let before = secs(&["a", "b", "c", "d", "e"]);
        let mut now = before.clone();
        now[1].content = "changed".into();
        now[2].content = "changed too".into();
        let (judged, context) = focus(&now, &before);
        let ids = |v: &[Section]| v.iter().map(|s| s.id.clone()).collect::<Vec<_>>();
        assert_eq!(ids(&judged), vec!["b", "c"]);
        assert_eq!(ids(&context), vec!["a", "d"]);
        assert!(focus(&before, &before).0.is_empty());
    }
}
