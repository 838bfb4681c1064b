//! The comparison of two evaluation runs, whatever they come from (a results file written by
//! `assay eval --out`, or a run in the gateway's store): records paired by id, the statistics of
//! [`compare`](super::compare) and the paired bootstrap, the checklist items that flipped, the
//! records that regressed most, the records found on one side only or never scored, and the
//! regression gate. One core for `assay compare` and `GatewayService.CompareRuns`, so both give the
//! same numbers on the same records.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Value, json};

use super::{BOOTSTRAP_RESAMPLES, BootstrapInterval, Comparison, StatsError, compare, paired_bootstrap};

/// Records listed as the worst regressions.
pub const WORST_RECORDS: usize = 10;

/// The per-record score compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RunMetric {
    /// The scorer's primary metric (`primary_score`); per-sample scores, when a record has them,
    /// are its observations.
    Primary,
    /// The share of items answered yes.
    PassRate,
    /// `weighted_score`.
    Weighted,
    /// `normalized_score`.
    Normalized,
}

impl RunMetric {
    /// The field of an `assay eval --out` line (and the `metric` of the JSON report).
    pub fn field(self) -> &'static str {
        match self {
            Self::Primary => "primary_score",
            Self::PassRate => "pass_rate",
            Self::Weighted => "weighted_score",
            Self::Normalized => "normalized_score",
        }
    }
}

/// One record's result, as a comparison sees it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RecordLine {
    /// The record's id (records pair by it).
    pub id: String,
    /// The compared score; None when the record failed or carries no score.
    pub score: Option<f64>,
    /// Per-sample scores of the primary metric when the record was judged several times (empty
    /// otherwise); when present they are the record's observations instead of `score`.
    pub samples: Vec<f64>,
    /// Checklist item id -> answered yes (`Some(true)`), no (`Some(false)`) or left unanswered
    /// (`None`).
    pub answers: BTreeMap<String, Option<bool>>,
    /// Checklist item id -> question text, when known (flips are then keyed by the text).
    pub questions: BTreeMap<String, String>,
}

impl RecordLine {
    /// The item key of an answer: its question text when `by_text`, else its id.
    fn key<'a>(&'a self, item: &'a str, by_text: bool) -> &'a str {
        if by_text { self.questions.get(item).map_or(item, String::as_str) } else { item }
    }
}

/// The results of one run, lines in order; a record id may repeat (each line a sample of it).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunResults {
    pub records: Vec<RecordLine>,
}

impl RunResults {
    /// Scored observations `(id, score)`: a record's samples when it has them, else its score;
    /// repeated lines kept (they are samples of one record).
    pub fn observations(&self) -> Vec<(&str, f64)> {
        let mut out = Vec::new();
        for l in &self.records {
            let Some(score) = l.score else { continue };
            if l.samples.is_empty() {
                out.push((l.id.as_str(), score));
            } else {
                out.extend(l.samples.iter().map(|s| (l.id.as_str(), *s)));
            }
        }
        out
    }

    /// Per-record mean scores.
    pub fn means(&self) -> BTreeMap<&str, f64> {
        let mut by: BTreeMap<&str, (f64, usize)> = BTreeMap::new();
        for (id, s) in self.observations() {
            let e = by.entry(id).or_insert((0.0, 0));
            e.0 += s;
            e.1 += 1;
        }
        by.into_iter().map(|(k, (s, n))| (k, s / n as f64)).collect()
    }

    /// Every record id.
    pub fn ids(&self) -> BTreeSet<&str> {
        self.records.iter().map(|l| l.id.as_str()).collect()
    }

    /// Records without a score on any line.
    pub fn unscored(&self) -> Vec<&str> {
        let scored: BTreeSet<&str> = self.records.iter().filter(|l| l.score.is_some()).map(|l| l.id.as_str()).collect();
        self.ids().into_iter().filter(|id| !scored.contains(id)).collect()
    }

    /// The first line of each record (its checklist answers).
    pub fn first_lines(&self) -> BTreeMap<&str, &RecordLine> {
        let mut m = BTreeMap::new();
        for l in &self.records {
            m.entry(l.id.as_str()).or_insert(l);
        }
        m
    }
}

/// How often one checklist item flipped across the shared records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ItemFlips {
    /// The question text (the item id when a side does not know the text).
    pub item: String,
    /// Shared records where both runs answered the item.
    pub compared: usize,
    pub yes_to_no: usize,
    pub no_to_yes: usize,
}

/// One record whose score dropped.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordDiff {
    pub id: String,
    /// Per-record mean scores.
    pub baseline: f64,
    pub candidate: f64,
}

impl RecordDiff {
    /// Candidate minus baseline.
    pub fn diff(&self) -> f64 {
        self.candidate - self.baseline
    }
}

/// The regression gate's verdict.
#[derive(Debug, Clone, PartialEq)]
pub struct Gate {
    /// The interval on the difference lies entirely below `-min_effect`.
    pub regressed: bool,
    pub min_effect: f64,
    /// One line saying why.
    pub reason: String,
}

/// Everything a comparison of two runs reports; differences are candidate minus baseline.
#[derive(Debug, Clone, PartialEq)]
pub struct RunComparison {
    pub metric: RunMetric,
    /// The statistics; `a` is the candidate, `b` the baseline.
    pub comparison: Comparison,
    /// The paired bootstrap interval (None when unpaired).
    pub bootstrap: Option<BootstrapInterval>,
    /// Per item, most yes->no flips first.
    pub items: Vec<ItemFlips>,
    /// At most [`WORST_RECORDS`], most negative difference first.
    pub worst: Vec<RecordDiff>,
    pub baseline_only: Vec<String>,
    pub candidate_only: Vec<String>,
    pub unscored_baseline: Vec<String>,
    pub unscored_candidate: Vec<String>,
    /// Set when a minimum effect was given.
    pub gate: Option<Gate>,
}

/// Why two runs cannot be compared.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RunCompareError {
    /// No scored record id is on both sides.
    #[error(
        "no shared records: the baseline ({baseline} scored) and the candidate ({candidate} scored) have no scored \
         record id in common"
    )]
    NoSharedRecords { baseline: usize, candidate: usize },
    /// The statistics refused the data (too few observations, a bad alpha, a non-finite score).
    #[error("cannot compare: {0}")]
    Stats(#[from] StatsError),
}

/// Options of a comparison.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CompareOptions {
    pub metric: RunMetric,
    /// Significance level; intervals are at `1 - alpha`.
    pub alpha: f64,
    /// Seed of the paired bootstrap.
    pub seed: u64,
    /// The gate's smallest drop that counts; None: no gate.
    pub min_effect: Option<f64>,
}

/// Compare `candidate` against `baseline` (records paired by id). A record both runs hold but one
/// of them did not score (failed, or no item answered: an unparseable judge reply) is left out of
/// both sides, so the pairs are the records scored on both; `unscored_*` name them and a note
/// says how many were left out.
pub fn compare_runs(
    baseline: &RunResults,
    candidate: &RunResults,
    options: CompareOptions,
) -> Result<RunComparison, RunCompareError> {
    let (bids, cids) = (baseline.ids(), candidate.ids());
    let (bu, cu) = (baseline.unscored(), candidate.unscored());
    let left_out: BTreeSet<&str> =
        bu.iter().chain(cu.iter()).copied().filter(|id| bids.contains(id) && cids.contains(id)).collect();
    let keep = |r: &RunResults| RunResults {
        records: r.records.iter().filter(|l| !left_out.contains(l.id.as_str())).cloned().collect(),
    };
    let (baseline_all, candidate_all) = (baseline, candidate);
    let kept = (!left_out.is_empty()).then(|| (keep(baseline), keep(candidate)));
    let (baseline, candidate) = match &kept {
        Some((b, c)) => (b, c),
        None => (baseline, candidate),
    };
    let (bm, cm) = (baseline.means(), candidate.means());
    let shared: Vec<&str> = bm.keys().filter(|k| cm.contains_key(*k)).copied().collect();
    if shared.is_empty() {
        return Err(RunCompareError::NoSharedRecords { baseline: bm.len(), candidate: cm.len() });
    }
    let comparison = compare(&candidate.observations(), &baseline.observations(), options.alpha)?;
    let bootstrap = if comparison.paired {
        let diffs: Vec<f64> = comparison.pairs.iter().map(|(_, a, b)| a - b).collect();
        paired_bootstrap(&diffs, options.alpha, BOOTSTRAP_RESAMPLES, options.seed)
    } else {
        None
    };
    let mut worst: Vec<RecordDiff> = shared
        .iter()
        .map(|id| RecordDiff { id: (*id).to_string(), baseline: bm[id], candidate: cm[id] })
        .filter(|r| r.candidate < r.baseline)
        .collect();
    worst.sort_by(|x, y| x.diff().total_cmp(&y.diff()).then_with(|| x.id.cmp(&y.id)));
    worst.truncate(WORST_RECORDS);
    let mut comparison = comparison;
    if !left_out.is_empty() {
        comparison.notes.push(format!(
            "{} record(s) held by both runs but scored on one side only left out of both (see the unscored records).",
            left_out.len()
        ));
    }
    let gate = options.min_effect.map(|m| gate(&comparison, m));
    Ok(RunComparison {
        metric: options.metric,
        items: flips(baseline, candidate),
        bootstrap,
        worst,
        baseline_only: bids.difference(&cids).map(|s| (*s).to_string()).collect(),
        candidate_only: cids.difference(&bids).map(|s| (*s).to_string()).collect(),
        unscored_baseline: baseline_all.unscored().into_iter().map(str::to_string).collect(),
        unscored_candidate: candidate_all.unscored().into_iter().map(str::to_string).collect(),
        comparison,
        gate,
    })
}

/// Two sides of one run (its responders) compared on the records both have a score for: a record
/// one side lacks (not reached before a budget stopped the run, or failed) is left out of both, so
/// the comparison stays paired on what was completed. Each side's `unscored_*` lists the records it
/// lacks, and a note says how many records were left out. With every record scored on both sides
/// this is [`compare_runs`].
pub fn compare_complete(
    baseline: &RunResults,
    candidate: &RunResults,
    options: CompareOptions,
) -> Result<RunComparison, RunCompareError> {
    let (bm, cm) = (baseline.means(), candidate.means());
    let both: BTreeSet<&str> = bm.keys().filter(|k| cm.contains_key(*k)).copied().collect();
    let keep = |r: &RunResults| RunResults {
        records: r.records.iter().filter(|l| l.score.is_some() && both.contains(l.id.as_str())).cloned().collect(),
    };
    let mut out = compare_runs(&keep(baseline), &keep(candidate), options)?;
    let (bids, cids) = (baseline.ids(), candidate.ids());
    let all: BTreeSet<&str> = bids.union(&cids).copied().collect();
    out.baseline_only = bids.difference(&cids).map(|s| (*s).to_string()).collect();
    out.candidate_only = cids.difference(&bids).map(|s| (*s).to_string()).collect();
    out.unscored_baseline = all.iter().filter(|id| !bm.contains_key(*id)).map(|s| (*s).to_string()).collect();
    out.unscored_candidate = all.iter().filter(|id| !cm.contains_key(*id)).map(|s| (*s).to_string()).collect();
    let left_out = all.len() - both.len();
    if left_out > 0 {
        out.comparison.notes.push(format!(
            "Compared on the {} records both sides have a score for; {left_out} left out (see the unscored records).",
            both.len()
        ));
    }
    Ok(out)
}

/// Per item over the records on both sides: yes->no and no->yes. Items are keyed by question text
/// when both sides of a record know it, else by item id.
fn flips(base: &RunResults, cand: &RunResults) -> Vec<ItemFlips> {
    let (bl, cl) = (base.first_lines(), cand.first_lines());
    let mut by: BTreeMap<String, ItemFlips> = BTreeMap::new();
    for (id, b) in &bl {
        let Some(c) = cl.get(id) else { continue };
        let by_text = !b.questions.is_empty() && !c.questions.is_empty();
        let cand_answers: BTreeMap<&str, bool> =
            c.answers.iter().filter_map(|(item, yes)| Some((c.key(item, by_text), (*yes)?))).collect();
        for (item, yes_b) in b.answers.iter().filter_map(|(item, yes)| Some((item, yes.as_ref()?))) {
            let key = b.key(item, by_text);
            let Some(yes_c) = cand_answers.get(key) else { continue };
            let e = by.entry(key.to_string()).or_insert_with(|| ItemFlips {
                item: key.to_string(),
                compared: 0,
                yes_to_no: 0,
                no_to_yes: 0,
            });
            e.compared += 1;
            e.yes_to_no += usize::from(*yes_b && !yes_c);
            e.no_to_yes += usize::from(!yes_b && *yes_c);
        }
    }
    let mut items: Vec<ItemFlips> = by.into_values().collect();
    items.sort_by(|x, y| y.yes_to_no.cmp(&x.yes_to_no).then(y.no_to_yes.cmp(&x.no_to_yes)).then(x.item.cmp(&y.item)));
    items
}

/// The regression gate: regressed when the interval on the difference lies entirely below
/// `-min_effect`; with the line saying why. A difference, interval or p-value that is not a finite
/// number decides nothing, and the gate fails closed on it (regressed, the reason saying so).
pub fn gate(c: &Comparison, min_effect: f64) -> Gate {
    let conf = 100.0 * (1.0 - c.alpha);
    let interval = format!("diff {:+.4}, {conf:.0}% CI [{:+.4}, {:+.4}]", c.diff, c.ci.0, c.ci.1);
    if ![c.diff, c.ci.0, c.ci.1, c.p_value].iter().all(|x| x.is_finite()) {
        let reason = format!(
            "no verdict: {interval}, p = {:.4} ({}) holds a value that is not a number; the gate fails closed",
            c.p_value,
            c.method.as_str()
        );
        return Gate { regressed: true, min_effect, reason };
    }
    let regressed = c.ci.1 < -min_effect;
    let bound = if min_effect > 0.0 { format!("-{min_effect}") } else { "0".to_string() };
    let reason = if regressed {
        format!("regression: {interval} lies entirely below {bound} ({})", c.method.as_str())
    } else {
        format!("no significant regression: {interval} does not lie entirely below {bound}")
    };
    Gate { regressed, min_effect, reason }
}

/// The report as one JSON object (what `assay compare --json` prints).
pub fn to_json(r: &RunComparison) -> Value {
    let c = &r.comparison;
    json!({
        "metric": r.metric.field(),
        "method": c.method.as_str(),
        "paired": c.paired,
        "alpha": c.alpha,
        "n_pairs": c.n_pairs,
        "n_baseline": c.n_records_b,
        "n_candidate": c.n_records_a,
        "mean_baseline": c.mean_b,
        "mean_candidate": c.mean_a,
        "diff": c.diff,
        "ci_low": c.ci.0,
        "ci_high": c.ci.1,
        "p_value": c.p_value,
        "significant": c.significant(),
        "variance_reduction": c.variance_reduction,
        "effective_n": c.effective_n,
        "n_discordant": c.n_discordant,
        "odds_ratio": c.odds_ratio,
        "ci_odds_ratio": c.ci_odds_ratio.map(|(l, h)| json!([l, h])),
        "bootstrap_ci_low": r.bootstrap.map(|b| b.low),
        "bootstrap_ci_high": r.bootstrap.map(|b| b.high),
        "bootstrap_resamples": r.bootstrap.map(|b| b.resamples),
        "bootstrap_seed": r.bootstrap.map(|b| b.seed),
        "warnings": c.warnings,
        "notes": c.notes,
        "items": r.items.iter().map(|i| json!({
            "item": i.item, "compared": i.compared, "yes_to_no": i.yes_to_no, "no_to_yes": i.no_to_yes,
        })).collect::<Vec<_>>(),
        "worst_regressions": r.worst.iter().map(|w| json!({
            "id": w.id, "baseline": w.baseline, "candidate": w.candidate, "diff": w.diff(),
        })).collect::<Vec<_>>(),
        "unmatched": {"baseline_only": r.baseline_only, "candidate_only": r.candidate_only},
        "unscored": {"baseline": r.unscored_baseline, "candidate": r.unscored_candidate},
        "regression": r.gate.as_ref().map(|g| g.regressed),
        "gate": r.gate.as_ref().map(|g| g.reason.clone()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{DEFAULT_BOOTSTRAP_SEED, Method};

    fn line(id: &str, score: Option<f64>, samples: &[f64], answers: &[(&str, bool)]) -> RecordLine {
        RecordLine {
            id: id.into(),
            score,
            samples: samples.to_vec(),
            answers: answers.iter().map(|(k, v)| ((*k).to_string(), Some(*v))).collect(),
            questions: BTreeMap::new(),
        }
    }

    fn options(min_effect: Option<f64>) -> CompareOptions {
        CompareOptions { metric: RunMetric::Primary, alpha: 0.05, seed: DEFAULT_BOOTSTRAP_SEED, min_effect }
    }

    /// Ten records; the baseline lacks r7-r9 and the candidate r6-r9 (a budget stopped the run):
    /// compared paired on r0-r5, the same numbers as comparing those six alone, and the records
    /// left out named per side.
    #[test]
    fn responders_are_compared_on_the_records_both_have() {
        let score = |i: usize, shift: f64| 0.5 + (i % 3) as f64 / 10.0 + shift;
        let side = |lacks: usize, shift: f64| RunResults {
            records: (0..10).map(|i| line(&format!("r{i}"), (i < lacks).then(|| score(i, shift)), &[], &[])).collect(),
        };
        let (base, cand) = (side(7, 0.0), side(6, -0.05));
        let r = compare_complete(&base, &cand, options(Some(0.0))).unwrap();
        let six = |shift: f64| RunResults {
            records: (0..6).map(|i| line(&format!("r{i}"), Some(score(i, shift)), &[], &[])).collect(),
        };
        let alone = compare_runs(&six(0.0), &six(-0.05), options(Some(0.0))).unwrap();
        assert!(r.comparison.paired && r.comparison.n_pairs == Some(6), "{:?}", r.comparison);
        assert_eq!(
            (r.comparison.diff, r.comparison.ci, r.comparison.p_value),
            (alone.comparison.diff, alone.comparison.ci, alone.comparison.p_value)
        );
        assert_eq!(r.unscored_baseline, ["r7", "r8", "r9"]);
        assert_eq!(r.unscored_candidate, ["r6", "r7", "r8", "r9"]);
        assert!(
            r.comparison
                .notes
                .iter()
                .any(|n| n.contains("on the 6 records both sides have") && n.contains("4 left out"))
        );
        // compare_runs leaves out the records one side did not score too (issue 59, point 1; it
        // fell back to unpaired here, 6 of 7 scored records shared being under the threshold).
        let runs = compare_runs(&base, &cand, options(None)).unwrap();
        assert!(runs.comparison.paired && runs.comparison.n_pairs == Some(6), "{:?}", runs.comparison);
        assert_eq!(runs.comparison.diff, alone.comparison.diff);
        // Everything scored on both sides: compare_runs, note and all.
        let full = compare_complete(&six(0.0), &six(-0.05), options(Some(0.0))).unwrap();
        assert_eq!(full, alone);
    }

    #[test]
    fn samples_are_the_observations_and_are_averaged_per_record() {
        let base = RunResults {
            records: (0..6).map(|i| line(&format!("r{i}"), Some(0.5), &[0.25, 0.75, 0.5], &[])).collect(),
        };
        let cand = RunResults {
            records: (0..6)
                .map(|i| line(&format!("r{i}"), Some(0.9), &[0.1, 0.2, 0.3 + i as f64 / 10.0], &[]))
                .collect(),
        };
        assert_eq!(base.observations().len(), 18);
        let r = compare_runs(&base, &cand, options(None)).unwrap();
        // Per-record means of the samples, not the line's score.
        let want: f64 = (0..6).map(|i| (0.6 + i as f64 / 10.0) / 3.0 - 0.5).sum::<f64>() / 6.0;
        assert!((r.comparison.diff - want).abs() < 1e-12, "{} vs {want}", r.comparison.diff);
        assert_eq!(r.comparison.method, Method::PairedT);
        assert!(r.comparison.notes.iter().any(|n| n.contains("aggregated")));
    }

    #[test]
    fn repeated_lines_are_samples_of_one_record_and_flips_use_the_first_line() {
        let mut base = RunResults::default();
        let mut cand = RunResults::default();
        for i in 0..5 {
            let id = format!("r{i}");
            base.records.push(line(&id, Some(1.0), &[], &[("q1", true)]));
            base.records.push(line(&id, Some(0.0), &[], &[("q1", false)]));
            cand.records.push(line(&id, Some(0.0), &[], &[("q1", false)]));
        }
        let r = compare_runs(&base, &cand, options(None)).unwrap();
        assert!((r.comparison.diff + 0.5).abs() < 1e-12);
        assert_eq!(r.items, vec![ItemFlips { item: "q1".into(), compared: 5, yes_to_no: 5, no_to_yes: 0 }]);
    }

    #[test]
    fn flips_are_keyed_by_question_text_when_both_sides_know_it() {
        let mut b = line("r1", Some(1.0), &[], &[("a", true)]);
        b.questions.insert("a".into(), "Is it short?".into());
        let mut c = line("r1", Some(0.0), &[], &[("x", false)]);
        c.questions.insert("x".into(), "Is it short?".into());
        let base = RunResults { records: vec![b, line("r2", Some(0.5), &[], &[])] };
        let cand = RunResults { records: vec![c, line("r2", Some(0.5), &[], &[])] };
        let r = compare_runs(&base, &cand, options(None)).unwrap();
        assert_eq!(r.items, vec![ItemFlips { item: "Is it short?".into(), compared: 1, yes_to_no: 1, no_to_yes: 0 }]);
    }

    #[test]
    fn unmatched_unscored_worst_and_the_gate() {
        let mut base = RunResults::default();
        let mut cand = RunResults::default();
        for i in 0..20 {
            let id = format!("r{i:02}");
            base.records.push(line(&id, Some(0.8), &[], &[]));
            cand.records.push(line(&id, Some(0.3 + (i % 3) as f64 / 100.0), &[], &[]));
        }
        base.records.push(line("gone", Some(1.0), &[], &[]));
        cand.records.push(line("new", None, &[], &[]));
        let r = compare_runs(&base, &cand, options(Some(0.1))).unwrap();
        assert_eq!(r.baseline_only, vec!["gone"]);
        assert_eq!(r.candidate_only, vec!["new"]);
        assert_eq!(r.unscored_candidate, vec!["new"]);
        assert_eq!(r.worst.len(), WORST_RECORDS);
        assert_eq!(r.worst[0].id, "r00");
        let g = r.gate.as_ref().unwrap();
        assert!(g.regressed && g.reason.starts_with("regression: diff -0.4"), "{g:?}");
        assert!(!gate(&r.comparison, 0.9).regressed);
        let v = to_json(&r);
        assert_eq!(v["regression"], true);
        assert_eq!(v["unmatched"]["baseline_only"], json!(["gone"]));
    }

    /// Issue 59, point 1: ten of fifty candidate records unscored (their judge replies unreadable).
    /// They are left out of both sides, the other forty paired; before, the unscored ones were
    /// either zeros or, left out of one side only, pushed the coverage under 90% and the
    /// comparison fell back to an unpaired test.
    #[test]
    fn records_scored_on_one_side_only_are_left_out_of_both() {
        let mut base = RunResults::default();
        let mut cand = RunResults::default();
        for i in 0..50 {
            let id = format!("r{i:02}");
            base.records.push(line(&id, Some(0.5 + (i % 5) as f64 / 10.0), &[], &[]));
            cand.records.push(line(&id, (i % 5 != 0).then_some(0.5 + (i % 5) as f64 / 10.0 - 0.05), &[], &[]));
        }
        let r = compare_runs(&base, &cand, options(None)).unwrap();
        assert!(r.comparison.paired, "{:?}", r.comparison);
        assert_eq!((r.comparison.n_pairs, r.comparison.n_records_b, r.comparison.n_records_a), (Some(40), 40, 40));
        assert!((r.comparison.diff + 0.05).abs() < 1e-12, "{}", r.comparison.diff);
        assert_eq!(r.unscored_candidate.len(), 10);
        assert!(r.unscored_baseline.is_empty() && r.baseline_only.is_empty());
        assert!(
            r.comparison.notes.iter().any(|n| n.starts_with("10 record(s) held by both runs but scored on one side"))
        );
        assert!(
            !r.comparison.warnings.iter().any(|w| w.contains("Pairing unavailable")),
            "{:?}",
            r.comparison.warnings
        );
    }

    #[test]
    fn a_statistic_that_is_not_a_number_never_passes_the_gate() {
        // One candidate record on many lines: the unpaired interval is NaN.
        let base = RunResults { records: (0..50).map(|i| line(&format!("r{i}"), Some(0.9), &[], &[])).collect() };
        let cand = RunResults { records: (0..50).map(|_| line("r0", Some(0.36), &[], &[])).collect() };
        let r = compare_runs(&base, &cand, options(Some(0.0))).unwrap();
        assert!(r.comparison.ci.1.is_nan(), "{:?}", r.comparison);
        let g = r.gate.unwrap();
        assert!(g.regressed && g.reason.starts_with("no verdict: diff -0.54"), "{g:?}");
        assert!(g.reason.contains("NaN") && g.reason.contains("fails closed"), "{g:?}");
    }

    #[test]
    fn no_shared_records_is_an_error() {
        let base = RunResults { records: vec![line("a", Some(1.0), &[], &[]), line("b", Some(0.0), &[], &[])] };
        let cand = RunResults { records: vec![line("c", Some(1.0), &[], &[]), line("d", Some(0.0), &[], &[])] };
        assert_eq!(
            compare_runs(&base, &cand, options(None)).unwrap_err(),
            RunCompareError::NoSharedRecords { baseline: 2, candidate: 2 }
        );
    }
}
