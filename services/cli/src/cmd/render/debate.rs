//! The human lines of a debate: one per finished problem and the run's summary, as `assay debate`
//! prints them on standard error and `assay runs watch` per event. A problem's JSON line is the
//! problem's result in the proto3 JSON mapping ([`problem_json`]).

use assay_proto::debate::v1 as dpb;
use assay_proto::gateway::v1 as gw;
use serde_json::Value;

use super::json::to_json;
use super::lower;

fn pct(x: f64) -> String {
    format!("{:.1}%", x * 100.0)
}

fn grade(c: Option<bool>) -> &'static str {
    match c {
        Some(true) => "correct",
        Some(false) => "wrong",
        None => "ungraded",
    }
}

/// One line for a finished stage of a problem's debate (`q01: review round 1 done`).
pub fn stage_line(d: &gw::DebateStageEvent) -> String {
    let id = if d.problem_id.is_empty() { format!("#{}", d.index) } else { d.problem_id.clone() };
    match d.stage.as_ref() {
        Some(s) if s.round > 0 && s.stage != "judge" => format!("{id}: {} round {} done", s.stage, s.round),
        Some(s) => format!("{id}: {} done{}", s.stage, if s.consensus { " (consensus)" } else { "" }),
        None => format!("{id}: a stage done"),
    }
}

/// One progress line for a finished problem.
pub fn problem_line(p: &gw::DebateProblemResult) -> String {
    if !p.error.is_empty() {
        return format!("{}: failed: {}", p.id, p.error);
    }
    let calls = p.debate.as_ref().and_then(|d| d.usage.as_ref()).map_or(0, |u| u.calls);
    let mut line = format!(
        "{}: {:?} ({}, {}, {calls} calls)",
        p.id,
        p.final_answer,
        grade(p.correct),
        decision_name(p.decided_by)
    );
    if let Some(b) = &p.baselines {
        line.push_str(&format!(
            "; single {:?} ({}), self-consistency {:?} ({}, {}/{} votes)",
            b.single_model_answer,
            grade(b.single_model_correct),
            b.self_consistency_answer,
            grade(b.self_consistency_correct),
            b.votes,
            b.samples
        ));
    }
    line
}

/// A debate decision's name: judge, majority_vote, consensus.
pub fn decision_name(d: i32) -> String {
    lower(dpb::DebateDecision::try_from(d).map_or("unknown", |d| d.as_str_name()), "DEBATE_DECISION_")
}

/// One problem's output line: its result in the proto3 JSON mapping.
pub fn problem_json(p: &gw::DebateProblemResult) -> Result<Value, String> {
    to_json(p)
}

/// The summary printed on standard error.
pub fn summary_text(run_id: &str, d: &gw::DebateRunResult, baselines: bool) -> String {
    let mut s = format!("run {run_id}: {} problems, {} failed\n", d.problems_total, d.problems_failed);
    match d.accuracy {
        Some(a) => s.push_str(&format!(
            "  debate accuracy      {} ({}/{}) over the graded problems\n",
            pct(a),
            d.correct,
            d.graded
        )),
        // Problems with a reference that all failed are not "no references".
        None if d.failed_with_reference > 0 => s.push_str(&format!(
            "  debate accuracy      - (no problem with a reference finished; {} failed)\n",
            d.failed_with_reference
        )),
        None => s.push_str("  debate accuracy      - (no references)\n"),
    }
    if let Some(a) = d.accuracy_all {
        s.push_str(&format!(
            "  over all problems    {} ({}/{}, {} failed counted wrong)\n",
            pct(a),
            d.correct,
            d.graded + d.failed_with_reference,
            d.failed_with_reference
        ));
    }
    s.push_str(&format!("  consensus rate       {}\n", pct(d.consensus_rate)));
    s.push_str(&format!("  changed-answer rate  {}\n", pct(d.changed_rate)));
    let du = d.debate_usage.clone().unwrap_or_default();
    s.push_str(&format!(
        "  debate usage         {} calls, {} tokens ({} prompt + {} completion), {}, {} cache hits",
        d.calls,
        d.tokens,
        du.prompt_tokens,
        du.completion_tokens,
        super::cost_text(&du),
        du.cache_hits
    ));
    if baselines {
        let bu = d.baseline_usage.clone().unwrap_or_default();
        let none = if d.failed_with_reference > 0 && d.graded == 0 {
            "- (no problem with a reference finished)"
        } else {
            "- (no references)"
        };
        let acc = |a: Option<f64>| a.map_or_else(|| none.to_string(), pct);
        s.push_str(&format!("\n  single model         {}", acc(d.single_model_accuracy)));
        s.push_str(&format!("\n  self-consistency     {}", acc(d.self_consistency_accuracy)));
        s.push_str(&format!(
            "\n  baseline usage       {} calls, {} tokens, {}",
            bu.calls,
            bu.prompt_tokens + bu.completion_tokens,
            super::cost_text(&bu)
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn problem_lines_say_the_answer_its_grade_and_the_decision() {
        let p = gw::DebateProblemResult {
            id: "mul".into(),
            final_answer: "391".into(),
            correct: Some(true),
            decided_by: dpb::DebateDecision::Judge as i32,
            ..Default::default()
        };
        assert_eq!(problem_line(&p), "mul: \"391\" (correct, judge, 0 calls)");
        let failed = gw::DebateProblemResult { error: "solver down".into(), ..p };
        assert_eq!(problem_line(&failed), "mul: failed: solver down");
        assert_eq!(decision_name(99), "unknown");
    }

    #[test]
    fn the_summary_gives_accuracy_over_graded_and_over_all_problems() {
        let d = gw::DebateRunResult {
            problems_total: 4,
            problems_failed: 1,
            graded: 3,
            correct: 2,
            accuracy: Some(2.0 / 3.0),
            failed_with_reference: 1,
            accuracy_all: Some(0.5),
            ..Default::default()
        };
        let s = summary_text("r1", &d, false);
        assert!(s.contains("run r1: 4 problems, 1 failed"), "{s}");
        assert!(s.contains("debate accuracy      66.7% (2/3) over the graded problems"), "{s}");
        assert!(s.contains("over all problems    50.0% (2/4, 1 failed counted wrong)"), "{s}");
    }

    /// Every problem has a reference and none finished (a budget stopped them all): not "no
    /// references".
    #[test]
    fn a_run_whose_referenced_problems_all_failed_does_not_say_no_references() {
        let d = gw::DebateRunResult {
            problems_total: 30,
            problems_failed: 30,
            failed_with_reference: 30,
            accuracy_all: Some(0.0),
            ..Default::default()
        };
        let s = summary_text("r1", &d, true);
        assert!(!s.contains("no references"), "{s}");
        assert!(s.contains("debate accuracy      - (no problem with a reference finished; 30 failed)"), "{s}");
        assert!(s.contains("single model         - (no problem with a reference finished)"), "{s}");
    }
}
