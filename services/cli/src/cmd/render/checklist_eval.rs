//! What `assay eval` and `assay score` print: one line per record to `--out` (a contract: its
//! format is fixed here and nowhere else), progress notes, and the run's summary (a line on
//! standard error, or with `--json` the evaluation in the proto3 JSON mapping).

use assay_proto::common::v1 as common;
use assay_proto::gateway::v1 as gw;
use serde_json::{Value, json};

use super::json::run_output;

/// One record's result as a JSON line of `--out`. A contract: `id`, `index`, `checklist_id`,
/// `error`, the four scores, `unanswered` and `answers` (item id to yes / no / null), as they were
/// when `assay eval` was first published; do not derive it from the proto. Additive since: with
/// repeated judging `sample_scores` (each sample's primary score) and `flaky_items` (ids of the
/// items the samples disagreed on), and `abstentions` when some sample gave no answer. A record
/// judged once has none of them. An unscored record (no item answered: its judge reply could not
/// be read) has the four scores null, as a failed record has, with its `unanswered` count and
/// `error` null: null is "no score", never a zero.
pub fn record_json(r: &gw::RecordResult) -> Value {
    let answers: serde_json::Map<String, Value> = r
        .score
        .iter()
        .flat_map(|s| s.item_scores.iter())
        .map(|i| {
            let a = match common::Answer::try_from(i.answer) {
                Ok(common::Answer::Yes) => json!("yes"),
                Ok(common::Answer::No) => json!("no"),
                Ok(common::Answer::Unspecified) | Err(_) => Value::Null,
            };
            (i.item_id.clone(), a)
        })
        .collect();
    let scored = r.score.as_ref().filter(|s| s.answered_count > 0);
    let mut line = json!({
        "index": r.index,
        "id": r.record_id,
        "checklist_id": r.checklist_id,
        "error": if r.error.is_empty() { Value::Null } else { r.error.clone().into() },
        "pass_rate": scored.map(|s| s.pass_rate),
        "weighted_score": scored.map(|s| s.weighted_score),
        "normalized_score": scored.map(|s| s.normalized_score),
        "primary_score": scored.map(|s| s.primary_score),
        "unanswered": r.score.as_ref().map(|s| s.unanswered_count),
        "answers": answers,
    });
    if let (false, Value::Object(o)) = (r.responder.is_empty(), &mut line) {
        o.insert("responder".into(), json!(r.responder));
        o.insert("sample".into(), json!(r.sample));
        o.insert("response".into(), json!(r.response));
    }
    if let (Some(s), Value::Object(o)) = (&r.score, &mut line) {
        if !s.sample_primary_scores.is_empty() {
            o.insert("sample_scores".into(), json!(s.sample_primary_scores));
            let flaky: Vec<&str> = s.item_scores.iter().filter(|i| i.flaky).map(|i| i.item_id.as_str()).collect();
            o.insert("flaky_items".into(), json!(flaky));
        }
        if s.abstentions > 0 {
            o.insert("abstentions".into(), s.abstentions.into());
        }
    }
    line
}

/// The mean primary score with the half-width of its 95% interval when the aggregate has one:
/// `0.676 ± 0.054 (95% CI)`.
pub fn mean_with_interval(a: &common::AggregateScores) -> String {
    match &a.uncertainty {
        Some(u) => {
            let level = ((1.0 - u.alpha) * 100.0).round();
            format!("{:.3} ± {:.3} ({level}% CI)", a.mean_primary_score, (u.ci_high - u.ci_low) / 2.0)
        }
        None => format!("{:.3}", a.mean_primary_score),
    }
}

/// One line for a scored (or failed) record, as `assay runs watch` prints it. The items are counted
/// from the score's answered and unanswered counts: an open run's events carry no item scores.
pub fn record_line(r: &gw::RecordResult) -> String {
    let who = if r.responder.is_empty() { String::new() } else { format!(" ({}, sample {})", r.responder, r.sample) };
    let id = if r.record_id.is_empty() { format!("#{}", r.index) } else { r.record_id.clone() };
    match r.score.as_ref() {
        _ if !r.error.is_empty() => format!("record {id}{who}: failed: {}", r.error),
        Some(s) if s.answered_count > 0 => {
            format!(
                "record {id}{who}: pass rate {:.4}, {}/{} items answered",
                s.pass_rate,
                s.answered_count,
                s.answered_count + s.unanswered_count
            )
        }
        Some(_) | None => format!("record {id}{who}: unscored (no item answered)"),
    }
}

/// Where a run that stops when decided stands: each responder against the first, its interval on
/// the mean difference and its decision.
pub fn comparison_line(c: &gw::ComparisonUpdated) -> String {
    let each: Vec<String> = c.comparisons.iter().map(sequential_words).collect();
    format!("comparison after {} records: {}", c.records_used, each.join("; "))
}

/// One sequential comparison in words: `b vs a: +0.120 [+0.031, +0.209] better`.
pub fn sequential_words(s: &gw::SequentialComparison) -> String {
    let decision = match gw::SequentialDecision::try_from(s.decision) {
        Ok(gw::SequentialDecision::Better) => "better",
        Ok(gw::SequentialDecision::Worse) => "worse",
        Ok(gw::SequentialDecision::Equivalent) => "equivalent",
        Ok(gw::SequentialDecision::Undecided | gw::SequentialDecision::Unspecified) | Err(_) => "undecided",
    };
    format!(
        "{} vs {}: {:+.3} [{:+.3}, {:+.3}] {decision} ({} pairs)",
        s.candidate, s.baseline, s.mean_difference, s.low, s.high, s.pairs
    )
}

/// The note of a checklist ready for some records.
pub fn checklist_ready_line(c: &gw::ChecklistReady) -> String {
    let n = c.checklist.as_ref().map_or(0, |c| c.items.len());
    format!("checklist ready: {n} items for {} records", c.record_indices.len())
}

/// The responses a run asked: a run stopped when decided asked fewer records than it holds (an open
/// run's results are paged, not in the evaluation: its responders say how many they answered).
fn asked(total: usize, e: &gw::EvaluateResponse) -> usize {
    match &e.sequential {
        Some(q) if q.stopped_early && !e.results_paged => e.results.len(),
        Some(q) if q.stopped_early => e.responders.iter().map(|r| r.responses as usize).sum(),
        Some(_) | None => total,
    }
}

/// The summary line on standard error.
pub fn summary_line(run_id: &str, total: usize, failed: u64, e: &gw::EvaluateResponse, pipeline_s: f64) -> String {
    let total = asked(total, e);
    let a = e.aggregate.clone().unwrap_or_default();
    let u = e.usage.clone().unwrap_or_default();
    let scores = || e.results.iter().filter_map(|r| r.score.as_ref());
    // With repeated judging: the items the samples disagreed on, and the samples that gave no answer.
    let sampled = if scores().any(|s| !s.sample_primary_scores.is_empty()) {
        let flaky: usize = scores().map(|s| s.item_scores.iter().filter(|i| i.flaky).count()).sum();
        let abstentions: u32 = scores().map(|s| s.abstentions).sum();
        format!("{flaky} flaky items, {abstentions} abstentions; ")
    } else {
        String::new()
    };
    // Records scored nothing (their judge reply unreadable): not in the means, counted here.
    let unscored = match a.unscored_targets {
        0 => String::new(),
        n => format!(", {n} unscored (no answer could be read; not in the means)"),
    };
    let stopped =
        if e.budget_exhausted.is_empty() { String::new() } else { format!("; stopped: {}", e.budget_exhausted) };
    // With responders each record is scored once per responder and sample: those are counted.
    let what = if e.responders.is_empty() { "records" } else { "responses" };
    format!(
        "run {run_id}: {total} {what}, {failed} failed{unscored}; mean primary {}, macro pass {:.3}, micro pass {:.3}; \
         {sampled}{} calls, {} tokens, {}, {} cache hits; {pipeline_s:.2} s{stopped}",
        mean_with_interval(&a),
        a.macro_pass_rate,
        a.micro_pass_rate,
        u.calls,
        u.prompt_tokens + u.completion_tokens,
        super::cost_text(&u),
        u.cache_hits
    )
}

/// Missing records a responder line names (`--json` has them all).
const MISSING_SHOWN: usize = 10;

/// With responders: a line per responder (its mean and interval, responses, what answering cost,
/// the records it has no scored response for), then a line per comparison with the first.
pub fn responder_lines(e: &gw::EvaluateResponse) -> Vec<String> {
    let mut lines: Vec<String> = e
        .responders
        .iter()
        .map(|r| {
            let a = r.aggregate.clone().unwrap_or_default();
            let u = r.usage.clone().unwrap_or_default();
            let missing = match r.missing.len() {
                0 => String::new(),
                n => {
                    let shown: Vec<&str> = r.missing.iter().take(MISSING_SHOWN).map(String::as_str).collect();
                    let more =
                        if n > MISSING_SHOWN { format!(" and {} more", n - MISSING_SHOWN) } else { String::new() };
                    format!("; {n} records without a scored response: {}{more}", shown.join(", "))
                }
            };
            let mean = match &r.aggregate {
                Some(_) => mean_with_interval(&a),
                None => "- (unscored: no response could be scored)".to_string(),
            };
            format!(
                "  responder {}: mean primary {}, {} responses, {} failed; answering {} calls, {} tokens, {}{missing}",
                r.name,
                mean,
                r.responses,
                r.failed,
                u.calls,
                u.prompt_tokens + u.completion_tokens,
                super::cost_text(&u)
            )
        })
        .collect();
    for c in &e.comparisons {
        let method = gw::CompareMethod::try_from(c.method)
            .map(|m| m.as_str_name().trim_start_matches("COMPARE_METHOD_").to_lowercase())
            .unwrap_or_default();
        let verdict = match (&c.gate, c.significant) {
            (Some(g), _) if g.regressed => "significantly worse",
            (_, true) if c.diff > 0.0 => "significantly better",
            (_, true) => "significantly different",
            (_, false) => "no significant difference",
        };
        lines.push(format!(
            "  {} vs {}: diff {:+.4}, {:.0}% CI [{:.4}, {:.4}] ({method}, {} pairs), p = {:.4}: {verdict}",
            c.candidate_run_id,
            c.baseline_run_id,
            c.diff,
            (1.0 - c.alpha) * 100.0,
            c.ci_low,
            c.ci_high,
            c.n_pairs.unwrap_or(0),
            c.p_value
        ));
    }
    if let Some(q) = &e.sequential {
        let stopped = if q.stopped_early {
            format!(
                "stopped early: {} records not asked, about {} calls saved",
                q.records_not_asked.len(),
                q.calls_saved
            )
        } else {
            "every record asked".to_string()
        };
        lines.push(format!(
            "  stop when decided (order seed {}): {} records compared; {stopped}",
            q.seed, q.records_used
        ));
        for c in &q.comparisons {
            lines.push(format!("  sequence {}", sequential_words(c)));
        }
    }
    lines
}

/// The summary of `--json`: the evaluation in the proto3 JSON mapping without its per-record
/// results (those are the lines), with the run, the record counts and the pipeline time.
pub fn summary_json(
    run_id: &str,
    state: i32,
    total: usize,
    failed: u64,
    e: &gw::EvaluateResponse,
    pipeline_s: f64,
) -> Result<Value, String> {
    let summary = gw::EvaluateResponse { results: Vec::new(), ..e.clone() };
    let mut v = run_output(run_id, state, &summary)?;
    if let Value::Object(o) = &mut v {
        o.remove("results");
        o.insert("records".into(), asked(total, e).into());
        o.insert("failed".into(), failed.into());
        o.insert("pipelineSeconds".into(), ((pipeline_s * 1e3).round() / 1e3).into());
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An open run's events carry scores without their item scores: the line counts the items from
    /// the score's counts, as it does for a full result.
    #[test]
    fn a_record_line_from_an_open_runs_event_counts_its_items() {
        let score = common::Score {
            pass_rate: 0.5,
            answered_count: 6,
            unanswered_count: 1,
            item_scores: Vec::new(),
            ..Default::default()
        };
        let r = gw::RecordResult { record_id: "r9".into(), score: Some(score), ..Default::default() };
        assert_eq!(record_line(&r), "record r9: pass rate 0.5000, 6/7 items answered");
    }

    /// The `--out` line is a contract: its exact text for a scored and a failed record.
    #[test]
    fn record_lines_keep_their_format() {
        let scored = gw::RecordResult {
            index: 1,
            record_id: "r1".into(),
            checklist_id: "c1".into(),
            score: Some(common::Score {
                pass_rate: 0.5,
                weighted_score: 0.25,
                normalized_score: 0.5,
                primary_score: 0.5,
                answered_count: 2,
                unanswered_count: 1,
                item_scores: vec![
                    common::ItemScore {
                        item_id: "q1".into(),
                        answer: common::Answer::Yes as i32,
                        ..Default::default()
                    },
                    common::ItemScore { item_id: "q2".into(), answer: common::Answer::No as i32, ..Default::default() },
                    common::ItemScore { item_id: "q3".into(), ..Default::default() },
                ],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            record_json(&scored).to_string(),
            r#"{"answers":{"q1":"yes","q2":"no","q3":null},"checklist_id":"c1","error":null,"id":"r1","index":1,"normalized_score":0.5,"pass_rate":0.5,"primary_score":0.5,"unanswered":1,"weighted_score":0.25}"#
        );
        let failed =
            gw::RecordResult { index: 2, record_id: "r2".into(), error: "scorer down".into(), ..Default::default() };
        assert_eq!(
            record_json(&failed).to_string(),
            r#"{"answers":{},"checklist_id":"","error":"scorer down","id":"r2","index":2,"normalized_score":null,"pass_rate":null,"primary_score":null,"unanswered":null,"weighted_score":null}"#
        );
        // Issue 59, point 1: a record whose judge reply could not be read has no score (null),
        // not 0, and its unanswered items counted; before, its line said primary_score 0.
        let unscored = gw::RecordResult {
            index: 3,
            record_id: "r3".into(),
            checklist_id: "c1".into(),
            score: Some(common::Score {
                unanswered_count: 2,
                item_scores: vec![
                    common::ItemScore { item_id: "q1".into(), ..Default::default() },
                    common::ItemScore { item_id: "q2".into(), ..Default::default() },
                ],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            record_json(&unscored).to_string(),
            r#"{"answers":{"q1":null,"q2":null},"checklist_id":"c1","error":null,"id":"r3","index":3,"normalized_score":null,"pass_rate":null,"primary_score":null,"unanswered":2,"weighted_score":null}"#
        );
    }

    /// With repeated judging the `--out` line gains `sample_scores`, `flaky_items` and
    /// `abstentions`, every older field as it was.
    #[test]
    fn sampled_record_lines_add_their_fields() {
        let flaky = common::ItemScore {
            item_id: "q1".into(),
            answer: common::Answer::No as i32,
            flaky: true,
            sample_answers: vec![common::Answer::Yes as i32, common::Answer::No as i32, 0],
            abstentions: 1,
            ..Default::default()
        };
        let steady =
            common::ItemScore { item_id: "q2".into(), answer: common::Answer::Yes as i32, ..Default::default() };
        let scored = gw::RecordResult {
            index: 0,
            record_id: "r1".into(),
            checklist_id: "c1".into(),
            score: Some(common::Score {
                pass_rate: 0.5,
                weighted_score: 0.5,
                normalized_score: 0.5,
                primary_score: 0.5,
                sample_primary_scores: vec![1.0, 0.5, 0.0],
                sample_spread: Some(0.5),
                abstentions: 1,
                answered_count: 2,
                item_scores: vec![flaky, steady],
                ..Default::default()
            }),
            ..Default::default()
        };
        assert_eq!(
            record_json(&scored).to_string(),
            r#"{"abstentions":1,"answers":{"q1":"no","q2":"yes"},"checklist_id":"c1","error":null,"flaky_items":["q1"],"id":"r1","index":0,"normalized_score":0.5,"pass_rate":0.5,"primary_score":0.5,"sample_scores":[1.0,0.5,0.0],"unanswered":0,"weighted_score":0.5}"#
        );
    }

    #[test]
    fn the_summary_line_shows_the_interval_and_the_flaky_items() {
        let uncertainty =
            common::ScoreUncertainty { mean: 0.676, alpha: 0.05, ci_low: 0.622, ci_high: 0.73, ..Default::default() };
        let aggregate = common::AggregateScores {
            mean_primary_score: 0.676,
            macro_pass_rate: 0.7,
            micro_pass_rate: 0.71,
            uncertainty: Some(uncertainty),
            ..Default::default()
        };
        let mut e = gw::EvaluateResponse {
            aggregate: Some(aggregate),
            usage: Some(common::Usage {
                calls: 6,
                cache_hits: 2,
                prompt_tokens: 500,
                completion_tokens: 100,
                cost_usd: Some(0.0125),
                ..Default::default()
            }),
            ..Default::default()
        };
        let line = summary_line("r1", 3, 0, &e, 1.5);
        assert_eq!(
            line,
            "run r1: 3 records, 0 failed; mean primary 0.676 ± 0.054 (95% CI), macro pass 0.700, micro pass 0.710; \
             6 calls, 600 tokens, $0.0125, 2 cache hits; 1.50 s"
        );
        let sampled = |flaky: bool, abstentions: u32| gw::RecordResult {
            score: Some(common::Score {
                sample_primary_scores: vec![1.0, 0.0],
                abstentions,
                item_scores: vec![common::ItemScore { flaky, ..Default::default() }],
                ..Default::default()
            }),
            ..Default::default()
        };
        e.results = vec![sampled(true, 1), sampled(true, 0), sampled(false, 2), gw::RecordResult::default()];
        assert!(
            summary_line("r1", 4, 1, &e, 1.5)
                .contains("(95% CI), macro pass 0.700, micro pass 0.710; 2 flaky items, 3 abstentions; 6 calls")
        );
        // Unscored records are counted apart (issue 59, point 1).
        e.aggregate.as_mut().unwrap().unscored_targets = 1;
        assert!(
            summary_line("r1", 4, 1, &e, 1.5).starts_with(
                "run r1: 4 records, 1 failed, 1 unscored (no answer could be read; not in the means); mean"
            )
        );
        e.aggregate.as_mut().unwrap().unscored_targets = 0;
        // No interval (fewer than two observations): the mean alone.
        e.aggregate.as_mut().unwrap().uncertainty = None;
        assert!(summary_line("r1", 1, 0, &e, 1.5).contains("mean primary 0.676, macro"));
    }

    #[test]
    fn the_json_summary_is_the_evaluation_without_its_records() {
        let e = gw::EvaluateResponse {
            run_id: "r1".into(),
            results: vec![gw::RecordResult::default()],
            usage: Some(common::Usage { calls: 6, ..Default::default() }),
            ..Default::default()
        };
        let v = summary_json("r1", gw::RunState::Partial as i32, 3, 1, &e, 1.23456).unwrap();
        assert_eq!((v["records"].as_u64(), v["failed"].as_u64()), (Some(3), Some(1)));
        assert_eq!((v["runId"].as_str(), v["state"].as_str()), (Some("r1"), Some("RUN_STATE_PARTIAL")));
        assert_eq!(v["usage"]["calls"], 6);
        assert_eq!(v["pipelineSeconds"], 1.235);
        assert!(v.get("results").is_none() && v.get("aggregate").is_none());
    }
}
