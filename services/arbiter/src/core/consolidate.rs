//! Consolidation without model calls: agreement over the judges' scores, the agreement band,
//! issue matching across judges (given a similarity), the agreement filter, conflict resolution
//! by criterion priority and the fallback instruction of a section.

use std::collections::{BTreeMap, BTreeSet};

use assay_domain::arbiter::{AgreementLevel, ConflictResolution, MeasurementLevel, SectionInstruction};
use assay_domain::document::{Criterion, JudgeIssue, JudgeVerdict, Section, Severity, priority_of};

use super::alpha::{self, Level, Undefined};

/// Units alpha is measured over.
pub const UNITS_SECTION_CRITERION: &str = "section_criterion";
pub const UNITS_CRITERION: &str = "criterion";

pub fn level(l: MeasurementLevel) -> Level {
    match l {
        MeasurementLevel::Nominal => Level::Nominal,
        MeasurementLevel::Ordinal => Level::Ordinal,
        MeasurementLevel::Interval => Level::Interval,
        MeasurementLevel::Ratio => Level::Ratio,
    }
}

/// The reliability matrix of the verdicts: judges x units, where units are section x criterion
/// pairs when every judge scored sections, else criteria (a judge without section scores would
/// otherwise count as missing everywhere). Unit order is sorted (deterministic).
pub fn ratings(verdicts: &[JudgeVerdict]) -> (alpha::Ratings, &'static str) {
    if !verdicts.is_empty() && verdicts.iter().all(|v| !v.section_scores.is_empty()) {
        let units: BTreeSet<(&str, &str)> = verdicts
            .iter()
            .flat_map(|v| v.section_scores.iter().map(|s| (s.section_id.as_str(), s.criterion.as_str())))
            .collect();
        let data = verdicts
            .iter()
            .map(|v| {
                let by_unit: BTreeMap<(&str, &str), f64> =
                    v.section_scores.iter().map(|s| ((s.section_id.as_str(), s.criterion.as_str()), s.score)).collect();
                units.iter().map(|u| by_unit.get(u).copied()).collect()
            })
            .collect();
        (data, UNITS_SECTION_CRITERION)
    } else {
        let units: BTreeSet<&str> =
            verdicts.iter().flat_map(|v| v.criterion_scores.keys().map(String::as_str)).collect();
        let data =
            verdicts.iter().map(|v| units.iter().map(|u| v.criterion_scores.get(*u).copied()).collect()).collect();
        (data, UNITS_CRITERION)
    }
}

/// What the agreement measurement decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Measured {
    pub alpha: Option<f64>,
    pub undefined_reason: String,
    /// `None` with fewer than two verdicts.
    pub band: Option<AgreementLevel>,
    pub flagged: bool,
    pub units: &'static str,
}

/// Alpha and the band of the verdicts. Identical scores from every judge (alpha undefined for
/// lack of variation) are perfect agreement; no pairable unit means agreement cannot be measured,
/// which is treated as low agreement and flagged.
pub fn measure(verdicts: &[JudgeVerdict], level: Level) -> Measured {
    let (data, units) = ratings(verdicts);
    if verdicts.len() < 2 {
        return Measured {
            alpha: None,
            undefined_reason: "a single verdict: there is nothing to agree with".into(),
            band: None,
            flagged: false,
            units,
        };
    }
    let a = alpha::agreement(&data, level);
    match a.alpha {
        Ok(x) => {
            let band = AgreementLevel::of(x);
            Measured {
                alpha: Some(x),
                undefined_reason: String::new(),
                band: Some(band),
                flagged: band == AgreementLevel::Low,
                units,
            }
        }
        Err(why) if a.pairable_units > 0 && why != Undefined::NoPairableUnit => Measured {
            alpha: None,
            undefined_reason: format!("{why}: the judges agree exactly"),
            band: Some(AgreementLevel::High),
            flagged: false,
            units,
        },
        Err(why) => Measured {
            alpha: None,
            undefined_reason: format!("{why}: agreement cannot be measured"),
            band: Some(AgreementLevel::Low),
            flagged: true,
            units,
        },
    }
}

/// One judge's issue, by position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IssueRef {
    pub judge: usize,
    pub index: usize,
}

/// Every issue of every verdict in judge order.
pub fn all_issues(verdicts: &[JudgeVerdict]) -> Vec<IssueRef> {
    verdicts
        .iter()
        .enumerate()
        .flat_map(|(judge, v)| (0..v.issues.len()).map(move |index| IssueRef { judge, index }))
        .collect()
}

fn issue(verdicts: &[JudgeVerdict], r: IssueRef) -> &JudgeIssue {
    &verdicts[r.judge].issues[r.index]
}

/// The issues that need a similarity: those whose section + criterion group holds issues of two
/// judges or more (only they can match across judges).
pub fn needs_similarity(verdicts: &[JudgeVerdict], issues: &[IssueRef]) -> Vec<bool> {
    let mut judges: BTreeMap<(&str, &str), BTreeSet<usize>> = BTreeMap::new();
    for r in issues {
        let i = issue(verdicts, *r);
        judges.entry((i.section_id.as_str(), i.criterion.as_str())).or_default().insert(r.judge);
    }
    issues
        .iter()
        .map(|r| {
            let i = issue(verdicts, *r);
            judges[&(i.section_id.as_str(), i.criterion.as_str())].len() > 1
        })
        .collect()
}

/// Group the issues into distinct problems: two issues of different judges on the same section
/// and criterion are one problem when `similarity(a, b) >= threshold` (positions into `issues`).
/// A problem holds at most one issue per judge; an issue joins the problem it is most similar to
/// (single linkage), first come first served in judge order.
pub fn cluster(
    verdicts: &[JudgeVerdict],
    issues: &[IssueRef],
    similarity: impl Fn(usize, usize) -> f64,
    threshold: f64,
) -> Vec<Vec<usize>> {
    let mut clusters: Vec<Vec<usize>> = Vec::new();
    for (a, r) in issues.iter().enumerate() {
        let i = issue(verdicts, *r);
        let best = clusters
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                let first = issue(verdicts, issues[c[0]]);
                first.section_id == i.section_id
                    && first.criterion == i.criterion
                    && c.iter().all(|&m| issues[m].judge != r.judge)
            })
            .map(|(ci, c)| (ci, c.iter().map(|&m| similarity(a, m)).fold(f64::NEG_INFINITY, f64::max)))
            .filter(|(_, s)| *s >= threshold)
            .max_by(|x, y| x.1.total_cmp(&y.1));
        match best {
            Some((ci, _)) => clusters[ci].push(a),
            None => clusters.push(vec![a]),
        }
    }
    clusters
}

/// One issue per problem: the most severe member (first on ties) with `raised_by` naming every
/// judge that raised it.
pub fn merge(verdicts: &[JudgeVerdict], issues: &[IssueRef], cluster: &[usize]) -> JudgeIssue {
    let rep = cluster.iter().copied().min_by_key(|&m| issue(verdicts, issues[m]).severity).unwrap_or(cluster[0]);
    let mut merged = issue(verdicts, issues[rep]).clone();
    merged.raised_by = Vec::new();
    for &m in cluster {
        let judge = &verdicts[issues[m].judge].judge_id;
        if !merged.raised_by.contains(judge) {
            merged.raised_by.push(judge.clone());
        }
    }
    merged
}

/// Whether an issue survives the agreement band (`None`: a single verdict, every issue kept).
pub fn keep(band: Option<AgreementLevel>, issue: &JudgeIssue) -> bool {
    match band {
        None | Some(AgreementLevel::High) => true,
        Some(AgreementLevel::Moderate) => issue.raised_by.len() >= 2,
        Some(AgreementLevel::Low) => issue.severity == Severity::Critical,
    }
}

/// Mean score per criterion across the verdicts that scored it.
pub fn mean_scores(verdicts: &[JudgeVerdict]) -> BTreeMap<String, f64> {
    let mut sums: BTreeMap<String, (f64, u32)> = BTreeMap::new();
    for v in verdicts {
        for (c, x) in &v.criterion_scores {
            let e = sums.entry(c.clone()).or_default();
            e.0 += x;
            e.1 += 1;
        }
    }
    sums.into_iter().map(|(c, (s, n))| (c, s / f64::from(n))).collect()
}

/// What one section must change: its issues by criterion priority, the conflicts between
/// criteria and the fallback instruction.
#[derive(Debug, Clone, PartialEq)]
pub struct SectionDemands<'a> {
    pub section: &'a Section,
    /// The section's kept issues, highest-priority criterion first (then most severe).
    pub issues: Vec<&'a JudgeIssue>,
    pub conflicts: Vec<ConflictResolution>,
    pub instruction: SectionInstruction,
}

fn sentence(s: &str) -> String {
    let s = s.trim();
    if s.is_empty() || s.ends_with(['.', '!', '?']) { s.to_string() } else { format!("{s}.") }
}

/// The fix instructions of issues, one sentence each (the description when an issue has none).
pub fn demand(issues: &[&JudgeIssue]) -> String {
    let mut out: Vec<String> = Vec::new();
    for i in issues {
        let s = sentence(if i.fix_instruction.trim().is_empty() { &i.description } else { &i.fix_instruction });
        if !s.is_empty() && !out.contains(&s) {
            out.push(s);
        }
    }
    out.join(" ")
}

/// Group kept issues by section (document order), resolve conflicts between criteria by priority
/// (the winner is the highest-priority criterion; every lower one's demand becomes a constraint
/// on it) and build the fallback instruction (every demand, in priority order).
pub fn section_demands<'a>(
    sections: &'a [Section],
    issues: &'a [JudgeIssue],
    criteria: &[Criterion],
) -> Vec<SectionDemands<'a>> {
    sections
        .iter()
        .filter_map(|section| {
            let mut mine: Vec<&JudgeIssue> = issues.iter().filter(|i| i.section_id == section.id).collect();
            if mine.is_empty() {
                return None;
            }
            mine.sort_by(|a, b| {
                (priority_of(criteria, &a.criterion), &a.criterion, a.severity).cmp(&(
                    priority_of(criteria, &b.criterion),
                    &b.criterion,
                    b.severity,
                ))
            });
            let winner = mine[0].criterion.clone();
            let mut losers: Vec<&str> = Vec::new();
            for i in &mine {
                if i.criterion != winner && !losers.contains(&i.criterion.as_str()) {
                    losers.push(&i.criterion);
                }
            }
            let conflicts: Vec<ConflictResolution> = losers
                .iter()
                .map(|l| {
                    let theirs: Vec<&JudgeIssue> = mine.iter().copied().filter(|i| i.criterion == *l).collect();
                    ConflictResolution {
                        section_id: section.id.clone(),
                        winning_criterion: winner.clone(),
                        losing_criterion: l.to_string(),
                        constraint: demand(&theirs),
                    }
                })
                .collect();
            let instruction = SectionInstruction {
                section_id: section.id.clone(),
                instruction: demand(&mine),
                constraints: conflicts.iter().map(|c| c.constraint.clone()).filter(|c| !c.is_empty()).collect(),
                issue_ids: mine.iter().map(|i| i.id.clone()).collect(),
                primary_criterion: winner,
                synthesized: false,
                error: String::new(),
            };
            Some(SectionDemands { section, issues: mine, conflicts, instruction })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use assay_domain::document::{SectionScore, default_criteria};

    fn issue(id: &str, section: &str, criterion: &str, severity: Severity, fix: &str) -> JudgeIssue {
        JudgeIssue {
            id: id.into(),
            criterion: criterion.into(),
            severity,
            section_id: section.into(),
            description: fix.into(),
            fix_instruction: fix.into(),
            location: String::new(),
            raised_by: vec![],
            context_window: String::new(),
        }
    }

    fn verdict(judge: &str, scores: &[(&str, f64)], issues: Vec<JudgeIssue>) -> JudgeVerdict {
        JudgeVerdict {
            judge_id: judge.into(),
            criterion_scores: scores.iter().map(|(c, x)| (c.to_string(), *x)).collect(),
            issues,
            ..Default::default()
        }
    }

    #[test]
    fn units_are_criteria_unless_judges_score_sections() {
        let a = verdict("a", &[("x", 0.5), ("y", 0.9)], vec![]);
        let b = verdict("b", &[("y", 0.8)], vec![]);
        let (data, units) = ratings(&[a.clone(), b.clone()]);
        assert_eq!(units, UNITS_CRITERION);
        assert_eq!(data, vec![vec![Some(0.5), Some(0.9)], vec![None, Some(0.8)]]);
        let mut c = b;
        c.section_scores = vec![SectionScore { section_id: "s1".into(), criterion: "y".into(), score: 0.7 }];
        // One judge without section scores: criteria stay the units.
        assert_eq!(ratings(&[a.clone(), c.clone()]).1, UNITS_CRITERION);
        let mut d = a;
        d.section_scores = vec![SectionScore { section_id: "s2".into(), criterion: "y".into(), score: 0.4 }];
        let (data, units) = ratings(&[d, c]);
        assert_eq!(units, UNITS_SECTION_CRITERION);
        assert_eq!(data, vec![vec![None, Some(0.4)], vec![Some(0.7), None]]);
    }

    #[test]
    fn bands_follow_the_thresholds() {
        assert_eq!(AgreementLevel::of(0.80), AgreementLevel::High);
        assert_eq!(AgreementLevel::of(0.7999), AgreementLevel::Moderate);
        assert_eq!(AgreementLevel::of(0.67), AgreementLevel::Moderate);
        assert_eq!(AgreementLevel::of(0.6699), AgreementLevel::Low);
        // Identical scores: alpha undefined, perfect agreement.
        let same = [verdict("a", &[("x", 0.5), ("y", 0.5)], vec![]), verdict("b", &[("x", 0.5), ("y", 0.5)], vec![])];
        let m = measure(&same, Level::Interval);
        assert_eq!((m.alpha, m.band, m.flagged), (None, Some(AgreementLevel::High), false));
        // Disjoint criteria: nothing pairable, low and flagged.
        let disjoint = [verdict("a", &[("x", 0.5)], vec![]), verdict("b", &[("y", 0.9)], vec![])];
        let m = measure(&disjoint, Level::Interval);
        assert_eq!((m.alpha, m.band, m.flagged), (None, Some(AgreementLevel::Low), true));
        // One verdict: no band, nothing flagged.
        assert_eq!(measure(&disjoint[..1], Level::Interval).band, None);
    }

    #[test]
    fn issues_match_within_section_and_criterion_once_per_judge() {
        let vs = [
            verdict(
                "a",
                &[],
                vec![
                    issue("a1", "s1", "clarity", Severity::Minor, "p"),
                    issue("a2", "s1", "clarity", Severity::Major, "q"),
                ],
            ),
            verdict(
                "b",
                &[],
                vec![
                    issue("b1", "s1", "clarity", Severity::Critical, "p'"),
                    issue("b2", "s2", "clarity", Severity::Minor, "p"),
                ],
            ),
        ];
        let refs = all_issues(&vs);
        // a1~b1 similar, a2 unlike both; b2 on another section never matches.
        let sim = |x: usize, y: usize| {
            let pair = (x.min(y), x.max(y));
            if pair == (0, 2) { 0.9 } else { 0.1 }
        };
        let clusters = cluster(&vs, &refs, sim, 0.75);
        assert_eq!(clusters, vec![vec![0, 2], vec![1], vec![3]]);
        let merged = merge(&vs, &refs, &clusters[0]);
        assert_eq!(merged.id, "b1", "the most severe member represents the problem");
        assert_eq!(merged.raised_by, vec!["a", "b"]);
        assert_eq!(needs_similarity(&vs, &refs), vec![true, true, true, false]);
    }

    #[test]
    fn bands_filter_issues() {
        let mut two = issue("i", "s", "c", Severity::Minor, "x");
        two.raised_by = vec!["a".into(), "b".into()];
        let mut one_critical = issue("j", "s", "c", Severity::Critical, "x");
        one_critical.raised_by = vec!["a".into()];
        assert!(keep(Some(AgreementLevel::Moderate), &two));
        assert!(!keep(Some(AgreementLevel::Moderate), &one_critical));
        assert!(!keep(Some(AgreementLevel::Low), &two));
        assert!(keep(Some(AgreementLevel::Low), &one_critical));
        assert!(keep(Some(AgreementLevel::High), &one_critical) && keep(None, &two));
    }

    #[test]
    fn the_funnel_conflict_keeps_completeness_as_a_constraint() {
        let sections = [Section { id: "s2".into(), content: "Funnels.".into(), ..Default::default() }];
        let issues = [
            issue("a1", "s2", "completeness", Severity::Major, "Add more details about funnel stages"),
            issue("b1", "s2", "clarity_readability", Severity::Major, "Simplify the language"),
        ];
        let d = section_demands(&sections, &issues, &default_criteria());
        assert_eq!(d.len(), 1);
        assert_eq!(
            d[0].conflicts,
            vec![ConflictResolution {
                section_id: "s2".into(),
                winning_criterion: "clarity_readability".into(),
                losing_criterion: "completeness".into(),
                constraint: "Add more details about funnel stages.".into(),
            }]
        );
        assert_eq!(d[0].instruction.primary_criterion, "clarity_readability");
        assert_eq!(d[0].instruction.instruction, "Simplify the language. Add more details about funnel stages.");
        assert_eq!(d[0].instruction.issue_ids, vec!["b1", "a1"]);
    }
}
