//! Scores of a targeted refinement's judgings: the document's score, the mean per (section,
//! criterion), the quality locks taken on the first judging, the edits that break them, and which
//! judging is the best (FR-020..FR-024).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use super::{LockViolation, QualityLock, lock_violations};
use crate::document::{JudgeVerdict, Section, mean_score};
use crate::verify::DEFAULT_LOCK_MAX_DROP;

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

/// Mean scores per (section, criterion) over the verdicts that scored sections; per criterion
/// (empty section id) when none did. Sorted by section id, then criterion.
pub fn mean_scores(verdicts: &[JudgeVerdict]) -> Vec<MeanScore> {
    let mut sums: BTreeMap<(String, String), (f64, u32)> = BTreeMap::new();
    let sectioned: Vec<&JudgeVerdict> = verdicts.iter().filter(|v| !v.section_scores.is_empty()).collect();
    if sectioned.is_empty() {
        for v in verdicts {
            for (c, x) in &v.criterion_scores {
                let e = sums.entry((String::new(), c.clone())).or_default();
                e.0 += x;
                e.1 += 1;
            }
        }
    } else {
        for v in sectioned {
            for s in &v.section_scores {
                let e = sums.entry((s.section_id.clone(), s.criterion.clone())).or_default();
                e.0 += s.score;
                e.1 += 1;
            }
        }
    }
    sums.into_iter().map(|((s, c), (sum, n))| (s, c, sum / f64::from(n))).collect()
}

/// A per-(section, criterion) quality lock; an empty section id locks the document's criterion.
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

/// Sections edited since `before` (their content differs; paired by position) that break a
/// quality lock under the judging's mean `scores`, in document order, with the violations. A
/// section is held to its own locks and the document's (empty section id), scored by its own
/// means and the document's.
pub fn regressions(
    sections: &[Section],
    before: &[Section],
    locks: &[SectionLock],
    scores: &[MeanScore],
) -> Vec<(String, Vec<LockViolation>)> {
    let edited = sections.iter().zip(before).filter(|(now, was)| now.content != was.content).map(|(s, _)| &s.id);
    let mut out = Vec::new();
    for id in edited {
        let held: Vec<QualityLock> =
            locks.iter().filter(|l| l.section_id.is_empty() || l.section_id == *id).map(|l| l.lock.clone()).collect();
        let scored: BTreeMap<String, f64> =
            scores.iter().filter(|(s, _, _)| s.is_empty() || s == id).map(|(_, c, x)| (c.clone(), *x)).collect();
        let broken = lock_violations(&held, &scored);
        if !broken.is_empty() {
            out.push((id.clone(), broken));
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

    #[test]
    fn a_verdict_scores_its_criteria_else_its_overall_score() {
        assert_eq!(verdict_score(&verdict(&[("a", 0.5), ("b", 1.0)], &[], 0.1)), 0.75);
        assert_eq!(verdict_score(&verdict(&[], &[], 0.4)), 0.4);
        let both = [verdict(&[("a", 0.5), ("b", 1.0)], &[], 0.1), verdict(&[], &[], 0.25)];
        assert_eq!(document_score(&both), 0.5);
        assert_eq!(document_score(&[]), 0.0);
    }

    #[test]
    fn means_are_per_section_when_a_verdict_scored_sections() {
        let vs = [
            verdict(&[("clarity", 0.1)], &[("s2", "clarity", 0.6), ("s1", "clarity", 0.9)], 0.0),
            verdict(&[("clarity", 0.2)], &[("s2", "clarity", 0.8)], 0.0),
            // Criterion scores only: left out once any verdict scored sections.
            verdict(&[("clarity", 0.0)], &[], 0.0),
        ];
        let m = mean_scores(&vs);
        assert_eq!(m.len(), 2);
        assert_eq!((m[0].0.as_str(), m[0].1.as_str(), m[0].2), ("s1", "clarity", 0.9));
        assert_eq!((m[1].0.as_str(), m[1].1.as_str()), ("s2", "clarity"));
        assert!((m[1].2 - 0.7).abs() < 1e-12);
    }

    #[test]
    fn means_are_per_criterion_when_no_verdict_scored_sections() {
        let vs = [verdict(&[("tone", 0.5), ("accuracy", 1.0)], &[], 0.0), verdict(&[("tone", 0.7)], &[], 0.0)];
        assert_eq!(mean_scores(&vs), vec![ms("", "accuracy", 1.0), ms("", "tone", 0.6)]);
        assert!(mean_scores(&[]).is_empty());
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
        let r = regressions(&now, &before, &locks, &scores);
        let ids: Vec<&str> = r.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, vec!["s1", "s3"]);
        assert_eq!(r[0].1.len(), 1);
        assert_eq!((r[0].1[0].criterion.as_str(), r[0].1[0].current), ("accuracy", 0.8));
        // Nothing edited, nothing regressed.
        assert!(regressions(&before, &before, &locks, &scores).is_empty());
    }

    #[test]
    fn a_sections_own_lock_breaks_on_its_own_score() {
        let before = [section("s1", "a")];
        let now = [section("s1", "b")];
        let locks = quality_locks(&[ms("s1", "clarity", 0.9)], 0.85);
        let r = regressions(&now, &before, &locks, &[ms("s1", "clarity", 0.8)]);
        assert_eq!(r.len(), 1);
        assert_eq!((r[0].1[0].baseline, r[0].1[0].current), (0.9, 0.8));
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
