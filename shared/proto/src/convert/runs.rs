//! A checklist evaluation's records as a run comparison sees them ([`RunResults`]): what
//! `CompareRuns` compares and what `assay compare` / `assay power` / `assay agreement` read for a
//! run id, so both give the same numbers as the runs' `--out` files.

use std::collections::BTreeMap;

use assay_domain::stats::Method;
use assay_domain::stats::runs::{RecordLine, RunComparison, RunMetric, RunResults};

use crate::common::v1 as common;
use crate::gateway::v1 as gw;

/// A checklist evaluation's records as a comparison sees them: the metric's score (None for a
/// failed record, and for an unscored one: no item answered, so a comparison pairs it with nothing
/// and lists it as unscored rather than comparing a zero), the per-sample primary scores, the yes/no answers and the items' question
/// texts from the run's checklists.
pub fn run_results(e: &gw::EvaluateResponse, metric: RunMetric) -> RunResults {
    let questions: BTreeMap<&str, BTreeMap<String, String>> = e
        .checklists
        .iter()
        .map(|c| (c.id.as_str(), c.items.iter().map(|i| (i.id.clone(), i.question.clone())).collect()))
        .collect();
    let records = e
        .results
        .iter()
        .map(|r| {
            let score = r.score.as_ref().filter(|s| r.error.is_empty() && s.answered_count > 0);
            let value = score.map(|s| match metric {
                RunMetric::Primary => s.primary_score,
                RunMetric::PassRate => s.pass_rate,
                RunMetric::Weighted => s.weighted_score,
                RunMetric::Normalized => s.normalized_score,
            });
            let samples = match (metric, score) {
                (RunMetric::Primary, Some(s)) => s.sample_primary_scores.clone(),
                (RunMetric::Primary | RunMetric::PassRate | RunMetric::Weighted | RunMetric::Normalized, _) => {
                    Vec::new()
                }
            };
            let answers = score
                .iter()
                .flat_map(|s| s.item_scores.iter())
                .map(|i| {
                    let answer = match common::Answer::try_from(i.answer) {
                        Ok(common::Answer::Yes) => Some(true),
                        Ok(common::Answer::No) => Some(false),
                        Ok(common::Answer::Unspecified) | Err(_) => None,
                    };
                    (i.item_id.clone(), answer)
                })
                .collect();
            RecordLine {
                id: r.record_id.clone(),
                score: value,
                samples: if samples.len() > 1 { samples } else { Vec::new() },
                answers,
                questions: questions.get(r.checklist_id.as_str()).cloned().unwrap_or_default(),
            }
        })
        .collect();
    RunResults { records }
}

/// A comparison metric on the wire.
pub fn metric_to_proto(m: RunMetric) -> gw::CompareMetric {
    match m {
        RunMetric::Primary => gw::CompareMetric::Primary,
        RunMetric::PassRate => gw::CompareMetric::PassRate,
        RunMetric::Weighted => gw::CompareMetric::Weighted,
        RunMetric::Normalized => gw::CompareMetric::Normalized,
    }
}

/// A comparison method on the wire.
pub fn method_to_proto(m: Method) -> gw::CompareMethod {
    match m {
        Method::PairedT => gw::CompareMethod::PairedT,
        Method::McNemar => gw::CompareMethod::Mcnemar,
        Method::WelchT => gw::CompareMethod::WelchT,
        Method::TwoProportion => gw::CompareMethod::TwoProportion,
    }
}

/// A comparison report as CompareRuns answers it (`baseline` and `candidate` name the sides: run
/// ids, or responders of one run).
pub fn comparison_to(baseline: String, candidate: String, r: &RunComparison) -> gw::CompareRunsResponse {
    let c = &r.comparison;
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    gw::CompareRunsResponse {
        baseline_run_id: baseline,
        candidate_run_id: candidate,
        metric: metric_to_proto(r.metric) as i32,
        method: method_to_proto(c.method) as i32,
        paired: c.paired,
        alpha: c.alpha,
        n_pairs: c.n_pairs.map(count),
        n_baseline: count(c.n_records_b),
        n_candidate: count(c.n_records_a),
        mean_baseline: c.mean_b,
        mean_candidate: c.mean_a,
        diff: c.diff,
        ci_low: c.ci.0,
        ci_high: c.ci.1,
        p_value: c.p_value,
        significant: c.significant(),
        variance_reduction: c.variance_reduction,
        effective_n: c.effective_n,
        n_discordant: c.n_discordant,
        odds_ratio: c.odds_ratio,
        odds_ratio_ci_low: c.ci_odds_ratio.map(|x| x.0),
        odds_ratio_ci_high: c.ci_odds_ratio.map(|x| x.1),
        bootstrap: r.bootstrap.map(|b| gw::CompareBootstrap {
            ci_low: b.low,
            ci_high: b.high,
            resamples: count(b.resamples),
            seed: b.seed,
        }),
        warnings: c.warnings.clone(),
        notes: c.notes.clone(),
        items: r
            .items
            .iter()
            .map(|i| gw::CompareItemFlips {
                item: i.item.clone(),
                compared: count(i.compared),
                yes_to_no: count(i.yes_to_no),
                no_to_yes: count(i.no_to_yes),
            })
            .collect(),
        worst_regressions: r
            .worst
            .iter()
            .map(|w| gw::CompareRecordDiff {
                record_id: w.id.clone(),
                baseline: w.baseline,
                candidate: w.candidate,
                diff: w.diff(),
            })
            .collect(),
        baseline_only: r.baseline_only.clone(),
        candidate_only: r.candidate_only.clone(),
        unscored_baseline: r.unscored_baseline.clone(),
        unscored_candidate: r.unscored_candidate.clone(),
        gate: r.gate.as_ref().map(|g| gw::CompareGate {
            regressed: g.regressed,
            min_effect: g.min_effect,
            reason: g.reason.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn failed_records_are_unscored_and_questions_come_from_the_checklist() {
        let e = gw::EvaluateResponse {
            results: vec![
                gw::RecordResult {
                    record_id: "r1".into(),
                    checklist_id: "c".into(),
                    score: Some(common::Score {
                        pass_rate: 0.5,
                        primary_score: 0.25,
                        answered_count: 1,
                        item_scores: vec![common::ItemScore {
                            item_id: "q1".into(),
                            answer: common::Answer::Yes as i32,
                            ..Default::default()
                        }],
                        ..Default::default()
                    }),
                    ..Default::default()
                },
                gw::RecordResult { record_id: "r2".into(), error: "scorer down".into(), ..Default::default() },
                // Issue 59, point 1: judged, nothing answered (an unparseable reply): unscored, not 0.
                gw::RecordResult {
                    record_id: "r3".into(),
                    checklist_id: "c".into(),
                    score: Some(common::Score {
                        unanswered_count: 1,
                        item_scores: vec![common::ItemScore { item_id: "q1".into(), ..Default::default() }],
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            ],
            checklists: vec![common::Checklist {
                id: "c".into(),
                items: vec![common::ChecklistItem { id: "q1".into(), question: "Short?".into(), ..Default::default() }],
                ..Default::default()
            }],
            ..Default::default()
        };
        let r = run_results(&e, RunMetric::PassRate);
        assert_eq!(r.records[0].score, Some(0.5));
        assert_eq!(r.records[0].questions["q1"], "Short?");
        assert_eq!(r.records[0].answers["q1"], Some(true));
        assert_eq!(r.records[1].score, None);
        assert_eq!(r.records[2].score, None);
        assert_eq!(r.unscored(), vec!["r2", "r3"]);
        assert_eq!(run_results(&e, RunMetric::Primary).records[0].score, Some(0.25));
    }
}
