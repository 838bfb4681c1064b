//! Consolidation without model calls: agreement over the judges' scores, the agreement band,
//! issue matching across judges (given a similarity), the agreement filter, conflict resolution
//! by criterion priority and the fallback instruction of a section.

use std::collections::{BTreeMap, BTreeSet};

use assay_domain::arbiter::{AgreementLevel, ConflictResolution, MeasurementLevel, SectionInstruction};
use assay_domain::document::{Criterion, JudgeIssue, JudgeVerdict, Section, Severity, priority_of};

use super::alpha::{self, Level, Undefined};

/// Units alpha is measured over: the judges' criterion scores (each criterion a unit, each
/// judge a rater).
pub const UNITS_CRITERION: &str = "criterion";

pub fn level(l: MeasurementLevel) -> Level {
    match l {
        MeasurementLevel::Nominal => Level::Nominal,
        MeasurementLevel::Ordinal => Level::Ordinal,
        MeasurementLevel::Interval => Level::Interval,
        MeasurementLevel::Ratio => Level::Ratio,
    }
}

/// The reliability matrix of the verdicts: judges x the criteria at least two judges scored
/// (sorted; a criterion one judge scored pairs with nothing). Section scores are never units:
/// alpha is measured the same way at every judging, whether the judges volunteered section scores
/// (or a focused judging's board carried them) or not, so the band that filters issues does not
/// move because of how a judging was made.
pub fn ratings(verdicts: &[JudgeVerdict]) -> (alpha::Ratings, &'static str) {
    let mut raters: BTreeMap<&str, usize> = BTreeMap::new();
    for v in verdicts {
        for c in v.criterion_scores.keys() {
            *raters.entry(c).or_default() += 1;
        }
    }
    let units: Vec<&str> = raters.into_iter().filter(|(_, n)| *n >= 2).map(|(u, _)| u).collect();
    let data = verdicts.iter().map(|v| units.iter().map(|c| v.criterion_scores.get(*c).copied()).collect()).collect();
    (data, UNITS_CRITERION)
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

/// Judges that must raise an issue for it to survive the middle band, of `judges` verdicts: two
/// (of a panel of up to three), and at least two thirds of the judges when more were asked
/// for (four judges: three; nine: six).
pub fn moderate_quorum(judges: usize) -> usize {
    (2 * judges).div_ceil(3).max(2)
}

/// Whether an issue survives the agreement band of a consolidation of `judges` verdicts (`None`:
/// a single verdict, every issue kept).
pub fn keep(band: Option<AgreementLevel>, judges: usize, issue: &JudgeIssue) -> bool {
    match band {
        None | Some(AgreementLevel::High) => true,
        Some(AgreementLevel::Moderate) => issue.raised_by.len() >= moderate_quorum(judges),
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

    fn section(id: &str, criterion: &str, score: f64) -> SectionScore {
        SectionScore { section_id: id.into(), criterion: criterion.into(), score }
    }

    #[test]
    fn units_are_the_criteria_two_judges_scored_never_section_scores() {
        let a = verdict("a", &[("x", 0.5), ("y", 0.9)], vec![]);
        let b = verdict("b", &[("y", 0.8)], vec![]);
        let (data, units) = ratings(&[a.clone(), b.clone()]);
        assert_eq!(units, UNITS_CRITERION);
        // x was scored by one judge only: it pairs with nothing and is left out.
        assert_eq!(data, vec![vec![Some(0.9)], vec![Some(0.8)]]);
        // Both judges scored the same section unit: it is still not a unit.
        let (mut c, mut d) = (b, a);
        c.section_scores = vec![section("s1", "y", 0.7)];
        d.section_scores = vec![section("s1", "y", 0.6)];
        assert_eq!(ratings(&[d, c]), (vec![vec![Some(0.9)], vec![Some(0.8)]], UNITS_CRITERION));
    }

    #[test]
    fn section_scores_judges_disagree_on_do_not_move_the_band() {
        // Three judges close on every criterion: high agreement.
        let scores = [("x", 0.9), ("y", 0.6), ("z", 0.3)];
        let near = [("x", 0.88), ("y", 0.61), ("z", 0.31)];
        let plain = [verdict("a", &scores, vec![]), verdict("b", &near, vec![]), verdict("c", &scores, vec![])];
        let without = measure(&plain, Level::Interval);
        assert_eq!(without.band, Some(AgreementLevel::High), "{without:?}");
        // The same judging with section scores all three gave and disagree on (as a focused
        // judging's board carries them): the same alpha, the same band.
        let mut with = plain.clone();
        for (v, x) in with.iter_mut().zip([0.1, 0.9, 0.5]) {
            v.section_scores = vec![section("s1", "x", x), section("s2", "y", 1.0 - x)];
        }
        let m = measure(&with, Level::Interval);
        assert_eq!((m.alpha, m.band, m.units), (without.alpha, without.band, UNITS_CRITERION), "{m:?}");
    }

    #[test]
    fn the_middle_band_needs_two_judges_of_three_and_two_thirds_of_more() {
        assert_eq!([2, 3, 4, 5, 6, 9].map(moderate_quorum), [2, 2, 3, 4, 4, 6]);
        let mut issue = JudgeIssue {
            id: "i".into(),
            criterion: "x".into(),
            severity: Severity::Major,
            section_id: "s1".into(),
            description: String::new(),
            fix_instruction: String::new(),
            location: String::new(),
            raised_by: vec!["a".into(), "b".into()],
            context_window: String::new(),
        };
        assert!(keep(Some(AgreementLevel::Moderate), 3, &issue));
        assert!(!keep(Some(AgreementLevel::Moderate), 4, &issue), "two of four judges is not two thirds");
        issue.raised_by.push("c".into());
        assert!(keep(Some(AgreementLevel::Moderate), 4, &issue));
        assert!(!keep(Some(AgreementLevel::Moderate), 6, &issue));
    }

    #[test]
    fn sparse_section_scores_never_collapse_agreement() {
        let scores = [("x", 0.9), ("y", 0.6), ("z", 0.3)];
        let near = [("x", 0.85), ("y", 0.6), ("z", 0.35)];
        let mut vs = [verdict("a", &scores, vec![]), verdict("b", &near, vec![]), verdict("c", &scores, vec![])];
        vs[0].section_scores = vec![section("s1", "x", 0.2), section("s2", "y", 0.95)];
        vs[1].section_scores = vec![section("s3", "x", 0.9)];
        vs[2].section_scores = vec![section("s4", "z", 0.1)];
        let m = measure(&vs, Level::Interval);
        assert_eq!(m.units, UNITS_CRITERION);
        assert_eq!(m.band, Some(AgreementLevel::High), "{m:?}");
        assert!(!m.flagged);
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
        assert!(keep(Some(AgreementLevel::Moderate), 3, &two));
        assert!(!keep(Some(AgreementLevel::Moderate), 3, &one_critical));
        assert!(!keep(Some(AgreementLevel::Low), 3, &two));
        assert!(keep(Some(AgreementLevel::Low), 3, &one_critical));
        assert!(keep(Some(AgreementLevel::High), 3, &one_critical) && keep(None, 1, &two));
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
