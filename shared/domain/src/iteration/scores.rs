//! Scores of a targeted refinement's judgings: the document's score, the mean per (section,
//! criterion), the quality locks taken on the first judging, the edits that break them, and which
//! judging is the best.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::limits::lock_violations;
use crate::document::{JudgeVerdict, Section, mean_score};
use crate::verify::DEFAULT_LOCK_MAX_DROP;
use crate::verify::{LockViolation, QualityLock};

/// Default score at which a section's criterion is locked against regressions.
pub const DEFAULT_LOCK_THRESHOLD: f64 = 0.85;

/// A mean score: (section id, criterion, score); an empty section id scores the whole document.
pub type MeanScore = (String, String, f64);

/// Score of a verdict: the mean of its criterion scores (its overall score when it has none).
pub fn verdict_score(v: &JudgeVerdict) -> f64 {
    if v.criterion_scores.is_empty() { v.overall_score } else { mean_score(&v.criterion_scores) }
}

/// Score of a judging: the mean of its verdicts' scores (0 without verdicts).
pub fn document_score(verdicts: &[JudgeVerdict]) -> f64 {
    if verdicts.is_empty() {
        return 0.0;
    }
    verdicts.iter().map(verdict_score).sum::<f64>() / verdicts.len() as f64
}

/// Mean scores of the verdicts at both levels: per criterion (under an empty section id) over the
/// verdicts that scored it, and per (section, criterion) over the verdicts that scored that
/// section explicitly. Quality locks and regressions compare the same unit in both judgings.
pub fn mean_scores(verdicts: &[JudgeVerdict]) -> Vec<MeanScore> {
    let mut sums: BTreeMap<(String, String), (f64, u32)> = BTreeMap::new();
    for v in verdicts {
        for (c, x) in &v.criterion_scores {
            let e = sums.entry((String::new(), c.clone())).or_default();
            e.0 += x;
            e.1 += 1;
        }
        for s in &v.section_scores {
            let e = sums.entry((s.section_id.clone(), s.criterion.clone())).or_default();
            e.0 += s.score;
            e.1 += 1;
        }
    }
    sums.into_iter().map(|((s, c), (sum, n))| (s, c, sum / f64::from(n))).collect()
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SectionLock {
    pub section_id: String,
    pub lock: QualityLock,
}

/// Quality locks from the first judging's mean scores: every (section, criterion) at or above
/// `threshold`, its score the baseline, [`DEFAULT_LOCK_MAX_DROP`] allowed.
pub fn quality_locks(scores: &[MeanScore], threshold: f64) -> Vec<SectionLock> {
    scores
        .iter()
        .filter(|(_, _, x)| *x >= threshold)
        .map(|(s, c, x)| SectionLock {
            section_id: s.clone(),
            lock: QualityLock { criterion: c.clone(), baseline: *x, max_drop: Some(DEFAULT_LOCK_MAX_DROP) },
        })
        .collect()
}

/// The (section, criterion) pairs whose issues grew since the judging before: the severity weight
/// of their issues (critical 3, major 2, minor 1; mean over each judging's verdicts) is higher in
/// `now` than in `before`. A new issue, or one that became more severe.
pub fn issues_gained(now: &[JudgeVerdict], before: &[JudgeVerdict]) -> BTreeSet<(String, String)> {
    let weights = |verdicts: &[JudgeVerdict]| {
        let mut w: BTreeMap<(String, String), f64> = BTreeMap::new();
        for v in verdicts {
            for i in &v.issues {
                *w.entry((i.section_id.clone(), i.criterion.clone())).or_default() +=
                    super::board::severity_weight(i.severity) / verdicts.len() as f64;
            }
        }
        w
    };
    let (now, before) = (weights(now), weights(before));
    now.into_iter().filter(|(k, w)| *w > before.get(k).copied().unwrap_or(0.0) + 1e-9).map(|(k, _)| k).collect()
}

/// Quality-lock regressions of the sections edited since `before`: for each edited section and
/// locked criterion, like is compared with like. The section's own unit (section x criterion)
/// when both the lock's judging and the current one scored it; else the criterion's
/// document-level unit in both. A document-level lock is never compared with a volunteered
/// section score, nor the reverse.
///
/// A document-level drop is blamed on the edited sections whose issues explain it (`gained`, see
/// [`issues_gained`]): those that gained issues on the criterion, else those that gained issues
/// on any criterion; only when no edited section gained an issue is every edited section blamed
/// (nothing tells them apart, and the lock still holds). A fix the delta judge accepted in a
/// section with no new issue is not sent back for another section's regression.
pub fn regressions(
    sections: &[Section],
    before: &[Section],
    locks: &[SectionLock],
    scores: &[MeanScore],
    gained: &BTreeSet<(String, String)>,
) -> Vec<(String, Vec<LockViolation>)> {
    let edited: Vec<&String> =
        sections.iter().zip(before).filter(|(now, was)| now.content != was.content).map(|(s, _)| &s.id).collect();
    let gained_on =
        |id: &str, criterion: Option<&str>| gained.iter().any(|(s, c)| s == id && criterion.is_none_or(|x| x == c));
    // Who a document-level drop on a criterion is blamed on.
    let blamed = |criterion: &str| -> Vec<&String> {
        let on: Vec<&String> = edited.iter().copied().filter(|id| gained_on(id, Some(criterion))).collect();
        if !on.is_empty() {
            return on;
        }
        let any: Vec<&String> = edited.iter().copied().filter(|id| gained_on(id, None)).collect();
        if any.is_empty() { edited.clone() } else { any }
    };
    let score = |section: &str, criterion: &str| {
        scores.iter().find(|(s, c, _)| s == section && c == criterion).map(|(_, _, x)| *x)
    };
    let lock = |section: &str, criterion: &str| {
        locks.iter().find(|l| l.section_id == section && l.lock.criterion == criterion).map(|l| &l.lock)
    };
    let mut criteria: Vec<&str> = locks.iter().map(|l| l.lock.criterion.as_str()).collect();
    criteria.sort_unstable();
    criteria.dedup();
    let mut out = Vec::new();
    for id in edited.iter().copied() {
        let mut broken = Vec::new();
        for c in &criteria {
            // The section's own unit when both judgings scored it, else the document's (when the
            // drop is blamed on this section).
            let own = lock(id, c).zip(score(id, c));
            let pair = own.or_else(|| lock("", c).zip(score("", c)).filter(|_| blamed(c).contains(&id)));
            if let Some((l, current)) = pair {
                let scored: BTreeMap<String, f64> = [(l.criterion.clone(), current)].into();
                broken.extend(lock_violations(std::slice::from_ref(l), &scored));
            }
        }
        if !broken.is_empty() {
            out.push((id.clone(), broken));
        }
    }
    out
}

/// A focused judging's scores of the sections it judged where its verdicts gave no section score:
/// the judges read only those sections (their neighbours as context), so each verdict's criterion
/// score stands for them. (section, criterion, mean over the verdicts that scored the criterion),
/// for each judged section and criterion no verdict scored explicitly for that section.
pub fn focused_scores(verdicts: &[JudgeVerdict], judged: &[String]) -> Vec<MeanScore> {
    let mut sums: BTreeMap<&str, (f64, u32)> = BTreeMap::new();
    for v in verdicts {
        for (c, x) in &v.criterion_scores {
            let e = sums.entry(c.as_str()).or_default();
            e.0 += x;
            e.1 += 1;
        }
    }
    let explicit = |s: &str, c: &str| {
        verdicts.iter().any(|v| v.section_scores.iter().any(|x| x.section_id == s && x.criterion == c))
    };
    let mut out = Vec::new();
    for s in judged {
        for (c, (sum, n)) in &sums {
            if !explicit(s, c) {
                out.push((s.clone(), (*c).to_string(), sum / f64::from(*n)));
            }
        }
    }
    out
}

/// Quality-lock regressions that only a focused judging's criterion scores show:
/// a patched section whose focused judging scores a locked criterion lower than the lock allows
/// without raising an issue (see [`focused_scores`]). The section's own lock when there is one;
/// else the document-level lock, for a section that had no open issue on the criterion before
/// (`open_before`: the issues of the judging the edits started from), since such a section stood
/// at the document's locked level. A section being fixed for that criterion is judged by its
/// issues, not here. When several sections were judged together, the drop is blamed as
/// [`regressions`] blames a document-level drop (those that gained issues, else all of them).
pub fn focused_regressions(
    focused: &[MeanScore],
    locks: &[SectionLock],
    open_before: &[crate::document::JudgeIssue],
    gained: &BTreeSet<(String, String)>,
) -> Vec<(String, Vec<LockViolation>)> {
    let mut judged: Vec<&String> = focused.iter().map(|(s, _, _)| s).collect();
    judged.dedup();
    let gained_on =
        |id: &str, criterion: Option<&str>| gained.iter().any(|(s, c)| s == id && criterion.is_none_or(|x| x == c));
    let blamed = |id: &str, criterion: &str| {
        if judged.len() < 2 {
            return true;
        }
        let on: Vec<&&String> = judged.iter().filter(|s| gained_on(s, Some(criterion))).collect();
        if !on.is_empty() {
            return on.iter().any(|s| s.as_str() == id);
        }
        let any: Vec<&&String> = judged.iter().filter(|s| gained_on(s, None)).collect();
        any.is_empty() || any.iter().any(|s| s.as_str() == id)
    };
    let mut out: Vec<(String, Vec<LockViolation>)> = Vec::new();
    for (id, c, current) in focused {
        let own = locks.iter().find(|l| &l.section_id == id && &l.lock.criterion == c);
        let clean = !open_before.iter().any(|i| &i.section_id == id && &i.criterion == c);
        let document = locks.iter().find(|l| l.section_id.is_empty() && &l.lock.criterion == c).filter(|_| clean);
        let Some(l) = own.or(document) else { continue };
        if !blamed(id, c) {
            continue;
        }
        let scored: BTreeMap<String, f64> = [(c.clone(), *current)].into();
        let broken = lock_violations(std::slice::from_ref(&l.lock), &scored);
        if broken.is_empty() {
            continue;
        }
        match out.iter_mut().find(|(s, _)| s == id) {
            Some((_, v)) => v.extend(broken),
            None => out.push((id.clone(), broken)),
        }
    }
    out
}

/// Index of the first highest-scoring judging, given each judging's (score, content holds a
/// human's edits); on a tie a judging of human-edited content wins over earlier ones (a human's
/// edit is not thrown away for an equal score). 0 when there is none.
pub fn best_judging(judgings: &[(f64, bool)]) -> usize {
    let mut best = 0;
    for (i, (score, human_edited)) in judgings.iter().enumerate() {
        let top = judgings[best].0;
        if *score > top || (*score == top && *human_edited) {
            best = i;
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::document::SectionScore;

    fn verdict(criteria: &[(&str, f64)], sections: &[(&str, &str, f64)], overall: f64) -> JudgeVerdict {
        JudgeVerdict {
            criterion_scores: criteria.iter().map(|(c, x)| ((*c).to_string(), *x)).collect(),
            section_scores: sections
                .iter()
                .map(|(s, c, x)| SectionScore { section_id: (*s).into(), criterion: (*c).into(), score: *x })
                .collect(),
            overall_score: overall,
            ..JudgeVerdict::default()
        }
    }

    fn section(id: &str, content: &str) -> Section {
        Section { id: id.into(), content: content.into(), ..Section::default() }
    }

    fn ms(s: &str, c: &str, x: f64) -> MeanScore {
        (s.into(), c.into(), x)
    }

    fn none() -> BTreeSet<(String, String)> {
        BTreeSet::new()
    }

    fn issue(section: &str, criterion: &str, severity: crate::document::Severity) -> crate::document::JudgeIssue {
        crate::document::JudgeIssue {
            id: format!("{section}-{criterion}"),
            criterion: criterion.into(),
            severity,
            section_id: section.into(),
            description: String::new(),
            fix_instruction: String::new(),
            location: String::new(),
            raised_by: Vec::new(),
            context_window: String::new(),
        }
    }

    #[test]
    fn a_document_level_drop_restores_only_the_sections_whose_new_issues_explain_it() {
        use crate::document::Severity::{Critical, Major, Minor};
        let before = [section("s1", "a"), section("s2", "b"), section("s3", "c")];
        let now = [section("s1", "a2"), section("s2", "b"), section("s3", "c2")];
        // Only a document-level lock on accuracy: no section scores.
        let locks = quality_locks(&[ms("", "accuracy", 0.9)], 0.85);
        let scores = [ms("", "accuracy", 0.7)];
        let was = [JudgeVerdict { issues: vec![issue("s1", "accuracy", Minor)], ..JudgeVerdict::default() }];
        // s1 and s3 edited; only s3 gets a new critical accuracy issue (s1's minor one stays).
        let is = [JudgeVerdict {
            issues: vec![issue("s1", "accuracy", Minor), issue("s3", "accuracy", Critical)],
            ..JudgeVerdict::default()
        }];
        let gained = issues_gained(&is, &was);
        assert_eq!(gained, [("s3".to_string(), "accuracy".to_string())].into());
        let r = regressions(&now, &before, &locks, &scores, &gained);
        let ids: Vec<&str> = r.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, vec!["s3"], "only s3 is restored: {r:?}");
        // A new issue on another criterion explains it when none is on the lock's criterion.
        let other = [JudgeVerdict { issues: vec![issue("s1", "tone", Major)], ..JudgeVerdict::default() }];
        let r = regressions(&now, &before, &locks, &scores, &issues_gained(&other, &[]));
        assert_eq!(r.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(), vec!["s1"]);
        // An issue that became more severe is gained; one that went away is not.
        let worse = [JudgeVerdict { issues: vec![issue("s1", "accuracy", Major)], ..JudgeVerdict::default() }];
        assert_eq!(issues_gained(&worse, &was), [("s1".to_string(), "accuracy".to_string())].into());
        assert!(issues_gained(&[JudgeVerdict::default()], &was).is_empty());
        // No edited section gained an issue: nothing tells them apart, both are restored.
        let r = regressions(&now, &before, &locks, &scores, &none());
        assert_eq!(r.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(), vec!["s1", "s3"]);
    }

    #[test]
    fn a_verdict_scores_its_criteria_else_its_overall_score() {
        assert_eq!(verdict_score(&verdict(&[("a", 0.5), ("b", 1.0)], &[], 0.1)), 0.75);
        assert_eq!(verdict_score(&verdict(&[], &[], 0.4)), 0.4);
        let both = [verdict(&[("a", 0.5), ("b", 1.0)], &[], 0.1), verdict(&[], &[], 0.25)];
        assert_eq!(document_score(&both), 0.5);
        assert_eq!(document_score(&[]), 0.0);
    }

    #[test]
    fn means_are_kept_at_both_levels() {
        let vs = [
            verdict(&[("clarity", 0.1)], &[("s2", "clarity", 0.6), ("s1", "clarity", 0.9)], 0.0),
            verdict(&[("clarity", 0.2)], &[("s2", "clarity", 0.8)], 0.0),
            verdict(&[("clarity", 0.0)], &[], 0.0),
        ];
        let m = mean_scores(&vs);
        assert_eq!(m.len(), 3);
        assert_eq!((m[0].0.as_str(), m[0].1.as_str()), ("", "clarity"));
        assert!((m[0].2 - 0.1).abs() < 1e-12);
        assert_eq!((m[1].0.as_str(), m[1].1.as_str(), m[1].2), ("s1", "clarity", 0.9));
        assert!((m[2].2 - 0.7).abs() < 1e-12);
        let vs = [verdict(&[("tone", 0.5), ("accuracy", 1.0)], &[], 0.0), verdict(&[("tone", 0.7)], &[], 0.0)];
        assert_eq!(mean_scores(&vs), vec![ms("", "accuracy", 1.0), ms("", "tone", 0.6)]);
        assert!(mean_scores(&[]).is_empty());
    }

    #[test]
    fn a_document_lock_is_never_compared_with_a_volunteered_section_score() {
        let before = [section("s1", "a"), section("s2", "b")];
        let now = [section("s1", "a2"), section("s2", "b")];
        // The first judging scored clarity for the document only (0.9): a document lock.
        let locks = quality_locks(&[ms("", "clarity", 0.9)], 0.85);
        // The re-judging volunteers a low score for s1 but the document's clarity held.
        let r = regressions(&now, &before, &locks, &[ms("", "clarity", 0.9), ms("s1", "clarity", 0.5)], &none());
        assert!(r.is_empty(), "{r:?}");
        // A section lock whose section was not scored again falls back to the document unit in
        // both judgings.
        let locks = quality_locks(&[ms("s1", "clarity", 0.95), ms("", "clarity", 0.9)], 0.85);
        assert!(regressions(&now, &before, &locks, &[ms("", "clarity", 0.88)], &none()).is_empty());
        let r = regressions(&now, &before, &locks, &[ms("", "clarity", 0.7)], &none());
        assert_eq!((r[0].1[0].baseline, r[0].1[0].current), (0.9, 0.7));
    }

    #[test]
    fn locks_are_taken_at_or_above_the_threshold() {
        let scores = [ms("s1", "clarity", 0.85), ms("s1", "tone", 0.84), ms("", "accuracy", 0.9)];
        let locks = quality_locks(&scores, DEFAULT_LOCK_THRESHOLD);
        let taken: Vec<(&str, &str, f64)> =
            locks.iter().map(|l| (l.section_id.as_str(), l.lock.criterion.as_str(), l.lock.baseline)).collect();
        assert_eq!(taken, vec![("s1", "clarity", 0.85), ("", "accuracy", 0.9)]);
        assert!(locks.iter().all(|l| l.lock.max_drop == Some(DEFAULT_LOCK_MAX_DROP)));
    }

    #[test]
    fn only_edited_sections_regress_on_their_own_or_the_documents_locks() {
        let before = [section("s1", "a"), section("s2", "b"), section("s3", "c")];
        let now = [section("s1", "a2"), section("s2", "b"), section("s3", "c2")];
        let locks = quality_locks(&[ms("s1", "clarity", 0.9), ms("s2", "clarity", 0.9), ms("", "accuracy", 0.9)], 0.85);
        let scores = [
            ms("s1", "clarity", 0.86), // a drop of 0.04: allowed
            ms("s2", "clarity", 0.1),  // not edited: never a regression
            ms("s3", "clarity", 0.1),  // no lock on s3's clarity
            ms("", "accuracy", 0.8),   // the document's lock: broken for every edited section
        ];
        let r = regressions(&now, &before, &locks, &scores, &none());
        let ids: Vec<&str> = r.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, vec!["s1", "s3"]);
        assert_eq!(r[0].1.len(), 1);
        assert_eq!((r[0].1[0].criterion.as_str(), r[0].1[0].current), ("accuracy", 0.8));
        // Nothing edited, nothing regressed.
        assert!(regressions(&before, &before, &locks, &scores, &none()).is_empty());
    }

    #[test]
    fn a_sections_own_lock_breaks_on_its_own_score() {
        let before = [section("s1", "a")];
        let now = [section("s1", "b")];
        let locks = quality_locks(&[ms("s1", "clarity", 0.9)], 0.85);
        let r = regressions(&now, &before, &locks, &[ms("s1", "clarity", 0.8)], &none());
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].1[0].baseline, r[0].1[0].current), (0.9, 0.8));
    }

    #[test]
    fn a_focused_drop_without_an_issue_breaks_the_documents_lock() {
        use crate::document::Severity;
        // The first judging: clarity 0.92 for the document, no section scores.
        let locks = quality_locks(&[ms("", "clarity", 0.92), ms("", "accuracy", 0.7)], 0.85);
        // A focused judging of s3 after its patch: clarity 0.70, no issue, no section score.
        let focused = verdict(&[("clarity", 0.70), ("accuracy", 0.72)], &[], 0.0);
        let scores = focused_scores(std::slice::from_ref(&focused), &["s3".into()]);
        assert_eq!(scores, vec![ms("s3", "accuracy", 0.72), ms("s3", "clarity", 0.70)]);
        let r = focused_regressions(&scores, &locks, &[], &none());
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].0, "s3");
        assert_eq!((r[0].1[0].criterion.as_str(), r[0].1[0].baseline, r[0].1[0].current), ("clarity", 0.92, 0.70));
        // The old rule (board scores only) saw nothing: the document's clarity had not moved.
        let board = mean_scores(&[verdict(&[("clarity", 0.92)], &[], 0.0)]);
        let (before, now) = ([section("s3", "a")], [section("s3", "b")]);
        assert!(regressions(&now, &before, &locks, &board, &none()).is_empty());
        // Within the allowed drop: nothing.
        let slight = focused_scores(&[verdict(&[("clarity", 0.88)], &[], 0.0)], &["s3".into()]);
        assert!(focused_regressions(&slight, &locks, &[], &none()).is_empty());
        // A section that was being fixed for clarity is judged by its issues, not the document's lock.
        let open = [issue("s3", "clarity", Severity::Major)];
        assert!(focused_regressions(&scores, &locks, &open, &none()).is_empty());
        // An explicit section score is the section's own unit: no stand-in from the criterion score.
        let explicit = verdict(&[("clarity", 0.70)], &[("s3", "clarity", 0.95)], 0.0);
        assert!(focused_scores(&[explicit], &["s3".into()]).is_empty());
        // Two sections judged together: the one that gained an issue is blamed.
        let both = focused_scores(&[focused], &["s2".into(), "s3".into()]);
        let gained: BTreeSet<(String, String)> = [("s2".to_string(), "accuracy".to_string())].into();
        let r = focused_regressions(&both, &locks, &[], &gained);
        assert_eq!(r.iter().map(|(id, _)| id.as_str()).collect::<Vec<_>>(), vec!["s2"]);
    }

    #[test]
    fn the_best_judging_is_the_first_highest_unless_a_human_edited_a_tie() {
        assert_eq!(best_judging(&[]), 0);
        assert_eq!(best_judging(&[(0.5, false), (0.7, false), (0.7, false), (0.6, false)]), 1);
        assert_eq!(best_judging(&[(0.5, false), (0.7, false), (0.7, true), (0.6, true)]), 2);
        // A human's edit does not win over a higher score.
        assert_eq!(best_judging(&[(0.8, false), (0.7, true)]), 0);
    }
}
