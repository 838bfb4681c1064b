//! A checklist evaluation's records as a run comparison sees them ([`RunResults`]): what
//! `CompareRuns` compares and what `assay compare` / `assay power` / `assay agreement` read for a
//! run id, so both give the same numbers as the runs' `--out` files.

use std::collections::BTreeMap;

use assay_domain::stats::runs::{RecordLine, RunMetric, RunResults};

use crate::common::v1 as common;
use crate::gateway::v1 as gw;

/// A checklist evaluation's records as a comparison sees them: the metric's score (None for a
/// failed record), the per-sample primary scores, the yes/no answers and the items' question
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
            let score = r.score.as_ref().filter(|_| r.error.is_empty());
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
        assert_eq!(run_results(&e, RunMetric::Primary).records[0].score, Some(0.25));
    }
}
