//! A report as Markdown for a pull-request comment: what ran, the aggregates with their
//! intervals, the comparisons, and a short table of the worst records (a refinement: the sections
//! changed and the issues left; a debate: accuracy and the problems). Untrusted text is escaped
//! ([`text`]: every Markdown punctuation a renderer acts on, pipes included, no raw HTML) or
//! quoted as code ([`code`]), on one line.

use std::fmt::Write as _;

use assay_proto::gateway::v1 as gw;

use super::{
    IssueEnd, Report, clip, count, decision, diff, evaluation, failed_items, level, method, p_value, pct, primary,
    score, tokens, verdict,
};
use crate::cmd::render::{cost_text, kind_name, outcome_name, plural, quality_name, severity_name, state_name};

/// Characters of one text cell.
const CELL: usize = 160;
/// Problems a debate's table lists.
const PROBLEMS: usize = 20;

/// Text as Markdown text on one line: every character a renderer could read as markup
/// backslash-escaped (CommonMark allows it before any ASCII punctuation), so `<script>` is
/// characters, `|` does not split a table cell, `[x](y)` is no link.
pub fn text(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in clip(s, CELL).chars() {
        match c {
            '\\' | '`' | '*' | '_' | '{' | '}' | '[' | ']' | '<' | '>' | '(' | ')' | '#' | '+' | '!' | '|' | '~'
            | '&' | '@' | ':' | '$' => {
                out.push('\\');
                out.push(c);
            }
            '\n' | '\r' | '\t' => out.push(' '),
            c => out.push(c),
        }
    }
    out
}

/// Text as an inline code span on one line (for ids and names): a fence longer than any run of
/// backticks inside, and `|` escaped (a GFM table reads a pipe even in a code span).
pub fn code(s: &str) -> String {
    let one_line: String = clip(s, CELL).chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    let longest = one_line.split(|c| c != '`').map(str::len).max().unwrap_or(0);
    let fence = "`".repeat(longest + 1);
    let pad = if one_line.starts_with('`') || one_line.ends_with('`') || one_line.is_empty() { " " } else { "" };
    format!("{fence}{pad}{}{pad}{fence}", one_line.replace('|', "\\|"))
}

fn row(cells: &[String]) -> String {
    format!("| {} |\n", cells.join(" | "))
}

fn head(cells: &[&str]) -> String {
    format!("| {} |\n|{}\n", cells.join(" | "), cells.iter().map(|_| "---|").collect::<String>())
}

/// The whole comment.
pub fn render(r: &Report) -> String {
    let run = &r.run;
    let mut s =
        format!("### Assay report: {} run {} ({})\n\n", kind_name(run.kind), code(&run.run_id), state_name(run.state));
    let u = run.usage.clone().unwrap_or_default();
    let mut facts: Vec<(&str, String)> = Vec::new();
    if !run.label.is_empty() {
        facts.push(("Label", text(&run.label)));
    }
    let error = super::run_error(run);
    if !error.is_empty() {
        facts.push(("Error", text(error)));
    }
    facts.push((
        "Usage",
        text(&format!("{} calls, {} tokens, {}", count(u64::from(u.calls)), count(tokens(&u)), cost_text(&u))),
    ));
    if !run.budget_exhausted.is_empty() {
        facts.push(("Stopped", text(&run.budget_exhausted)));
    }
    match run.result.as_ref().and_then(|x| x.result.as_ref()) {
        Some(gw::run_result::Result::ChecklistEval(_)) => checklist_eval(r, &mut facts, &mut s),
        Some(gw::run_result::Result::TargetedRefinement(t)) => refinement(r, t, &mut facts, &mut s),
        Some(gw::run_result::Result::Debate(d)) => debate(d, &mut facts, &mut s),
        Some(gw::run_result::Result::SelfRefine(x)) => {
            facts.push(("Stop reason", crate::cmd::render::stop_reason_name(x.stop_reason)));
            facts.push(("Passes", x.passes.len().to_string()));
            facts.push(("Changed", if x.changed { "yes".into() } else { "no".into() }));
            table_of(&facts, &mut s);
        }
        Some(gw::run_result::Result::Checklist(c)) => {
            facts.push(("Checklist", format!("{} ({})", code(&c.id), plural(c.items.len(), "item"))));
            table_of(&facts, &mut s);
        }
        None => table_of(&facts, &mut s),
    }
    let _ = write!(s, "\n<sub>Written by `assay report --format md` {}.</sub>\n", env!("CARGO_PKG_VERSION"));
    s
}

/// The run's facts as a two-column table, then whatever follows.
fn table_of(facts: &[(&str, String)], s: &mut String) {
    s.push_str(&head(&["", ""]));
    for (k, v) in facts {
        s.push_str(&row(&[format!("**{k}**"), v.clone()]));
    }
}

fn checklist_eval(r: &Report, facts: &mut Vec<(&str, String)>, s: &mut String) {
    let Some(e) = evaluation(&r.run) else { return };
    let a = e.aggregate.clone().unwrap_or_default();
    let what = if e.responders.is_empty() { "Records" } else { "Responses" };
    facts.push((what, format!("{} ({} without a score)", count(r.records.total), count(r.records.failed))));
    let mean = match &a.uncertainty {
        Some(u) => format!(
            "{} ({} interval \\[{}, {}\\])",
            score(a.mean_primary_score),
            level(u.alpha),
            score(u.ci_low),
            score(u.ci_high)
        ),
        None => score(a.mean_primary_score),
    };
    facts.push(("Mean primary score", mean));
    facts.push(("Macro / micro pass rate", format!("{} / {}", pct(a.macro_pass_rate), pct(a.micro_pass_rate))));
    if a.unscored_targets > 0 {
        facts.push(("Unscored (no answer could be read)", count(u64::from(a.unscored_targets))));
    }
    table_of(facts, s);
    if !e.responders.is_empty() {
        s.push_str("\n#### Responders\n\n");
        s.push_str(&head(&["Responder", "Model", "Mean primary", "95% interval", "Responses", "Failed"]));
        for (i, x) in e.responders.iter().enumerate() {
            let a = x.aggregate.clone().unwrap_or_default();
            let ci = a
                .uncertainty
                .as_ref()
                .map_or_else(|| "-".into(), |u| format!("\\[{}, {}\\]", score(u.ci_low), score(u.ci_high)));
            s.push_str(&row(&[
                format!("{}{}", code(&x.name), if i == 0 { " (baseline)" } else { "" }),
                x.model.as_ref().map_or_else(String::new, |m| code(&m.model)),
                if x.aggregate.is_some() { score(a.mean_primary_score) } else { "-".into() },
                ci,
                count(u64::from(x.responses)),
                count(u64::from(x.failed)),
            ]));
        }
    }
    if !e.comparisons.is_empty() {
        s.push_str("\n#### Comparisons (candidate − baseline, primary score)\n\n");
        s.push_str(&head(&["Candidate", "Baseline", "Difference", "Interval", "p", "Method", "Verdict"]));
        for c in &e.comparisons {
            s.push_str(&row(&[
                code(&c.candidate_run_id),
                code(&c.baseline_run_id),
                diff(c.diff),
                format!("{} \\[{}, {}\\]", level(c.alpha), diff(c.ci_low), diff(c.ci_high)),
                p_value(c.p_value),
                method(c.method),
                format!("**{}**", verdict(c)),
            ]));
        }
    }
    if let Some(q) = &e.sequential {
        s.push_str("\n#### Stopping when decided\n\n");
        let _ = writeln!(
            s,
            "{} after {} records (order seed {}): {} records not asked, about {} calls saved.\n",
            if q.stopped_early { "Stopped early" } else { "Every record asked" },
            count(u64::from(q.records_used)),
            q.seed,
            count(q.records_not_asked.len() as u64),
            count(q.calls_saved)
        );
        for c in &q.comparisons {
            let _ = writeln!(
                s,
                "- {} vs {}: {} \\[{}, {}\\] over {} pairs: **{}**",
                code(&c.candidate),
                code(&c.baseline),
                diff(c.mean_difference),
                diff(c.low),
                diff(c.high),
                c.pairs,
                decision(c.decision)
            );
        }
    }
    if !r.records.worst.is_empty() {
        let by_responder = r.records.worst.iter().any(|x| !x.responder.is_empty());
        let _ = write!(s, "\n#### Worst records (lowest primary scores of {})\n\n", count(r.records.total));
        let mut h = vec!["Record"];
        if by_responder {
            h.push("Responder");
        }
        h.extend(["Primary score", "Items answered no"]);
        s.push_str(&head(&h));
        let questions = super::questions(&e.checklists);
        for x in &r.records.worst {
            let items = questions.get(&x.checklist_id);
            let no: Vec<String> = failed_items(x)
                .iter()
                .map(|id| items.and_then(|m| m.get(id)).map_or_else(|| code(id), |q| text(q)))
                .collect();
            let mut cells = vec![code(&x.record_id)];
            if by_responder {
                cells.push(code(&x.responder));
            }
            cells.push(primary(x).map_or_else(|| "-".into(), score));
            cells.push(if no.is_empty() { "-".into() } else { no.join("; ") });
            s.push_str(&row(&cells));
        }
    }
}

fn refinement(r: &Report, t: &gw::TargetedRefinementResult, facts: &mut Vec<(&str, String)>, s: &mut String) {
    let views = super::sections(t, &r.refinement, r.document.as_deref());
    let history: Vec<String> = t.score_history.iter().map(|x| format!("{x:.3}")).collect();
    facts.push(("Outcome", format!("**{}** ({})", outcome_name(t.outcome), quality_name(t.quality))));
    facts.push(("Scores", history.join(" → ")));
    facts.push(("Iterations", format!("{} (returned: iteration {})", t.iterations, t.best_iteration)));
    if !t.stop_reason.is_empty() {
        facts.push(("Stop reason", text(&t.stop_reason)));
    }
    let changed: Vec<&super::SectionView> = views.iter().filter(|v| v.changed).collect();
    facts.push(("Sections changed", format!("{} of {}", changed.len(), views.len())));
    table_of(facts, s);
    if !changed.is_empty() {
        s.push_str("\n#### Sections changed\n\n");
        s.push_str(&head(&["Section", "Issues fixed", "Still unresolved", "Edits kept", "Section score"]));
        for v in changed {
            let fixed: Vec<String> =
                v.issues.iter().filter(|(_, e)| *e == IssueEnd::Fixed).map(|(i, _)| text(&i.description)).collect();
            let open = v.issues.iter().filter(|(_, e)| *e == IssueEnd::Unresolved).count();
            let kept = v.edits.iter().filter(|e| e.kept.is_ok()).count();
            let scores = match (v.score_before, v.score_after) {
                (Some(b), Some(a)) => format!("{} → {}", score(b), score(a)),
                (Some(b), None) => score(b),
                (None, _) => "-".into(),
            };
            s.push_str(&row(&[
                code(&v.id),
                if fixed.is_empty() { "-".into() } else { fixed.join("; ") },
                open.to_string(),
                format!("{kept} of {}", v.edits.len()),
                scores,
            ]));
        }
    }
    if !t.unresolved_issues.is_empty() {
        s.push_str("\n#### Unresolved issues\n\n");
        s.push_str(&head(&["Severity", "Section", "Criterion", "Description"]));
        for i in &t.unresolved_issues {
            s.push_str(&row(&[
                severity_name(i.severity),
                code(&i.section_id),
                text(&i.criterion),
                text(&i.description),
            ]));
        }
    }
}

fn debate(d: &gw::DebateRunResult, facts: &mut Vec<(&str, String)>, s: &mut String) {
    facts.push(("Problems", format!("{} ({} failed)", count(u64::from(d.problems_total)), d.problems_failed)));
    facts.push((
        "Accuracy",
        d.accuracy.map_or_else(|| "not graded".into(), |a| format!("{} ({}/{})", pct(a), d.correct, d.graded)),
    ));
    if let Some(a) = d.accuracy_all {
        facts.push(("Accuracy, failed counted wrong", pct(a)));
    }
    facts.push(("Consensus / changed rate", format!("{} / {}", pct(d.consensus_rate), pct(d.changed_rate))));
    if let Some(a) = d.single_model_accuracy {
        facts.push(("Single model accuracy", pct(a)));
    }
    if let Some(a) = d.self_consistency_accuracy {
        facts.push(("Self-consistency accuracy", pct(a)));
    }
    table_of(facts, s);
    if d.problems.is_empty() {
        return;
    }
    // Wrong and failed problems first: those are the ones a reviewer reads.
    let mut problems: Vec<&gw::DebateProblemResult> = d.problems.iter().collect();
    problems.sort_by_key(|p| (p.error.is_empty(), p.correct != Some(false), p.index));
    let shown = problems.len().min(PROBLEMS);
    let _ = write!(s, "\n#### Problems ({} of {}, wrong and failed first)\n\n", shown, d.problems.len());
    s.push_str(&head(&["Problem", "Final answer", "Reference", "Graded", "Decided by"]));
    for p in &problems[..shown] {
        let graded = match (p.error.is_empty(), p.correct) {
            (false, _) => format!("failed: {}", text(&p.error)),
            (true, Some(true)) => "correct".into(),
            (true, Some(false)) => "**incorrect**".into(),
            (true, None) => "-".into(),
        };
        s.push_str(&row(&[
            code(&p.id),
            text(&p.final_answer),
            text(&p.reference),
            graded,
            crate::cmd::render::debate::decision_name(p.decided_by),
        ]));
    }
}

#[cfg(test)]
mod tests {
    use assay_proto::common::v1 as common;

    use super::*;

    #[test]
    fn markup_and_pipes_are_escaped() {
        assert_eq!(text("a|b <img onerror=x> [l](u) *x*"), r"a\|b \<img onerror=x\> \[l\]\(u\) \*x\*");
        assert_eq!(text("two\nlines"), "two lines");
        assert_eq!(code("id|1"), r"`id\|1`");
        assert_eq!(code("a`b"), "``a`b``");
        assert_eq!(code("`x"), "`` `x ``");
    }

    fn record(index: u32, id: &str, responder: &str, primary: f64, no: &[&str]) -> gw::RecordResult {
        let items = ["q1", "q2"]
            .iter()
            .map(|i| common::ItemScore {
                item_id: (*i).into(),
                answer: if no.contains(i) { common::Answer::No as i32 } else { common::Answer::Yes as i32 },
                ..Default::default()
            })
            .collect();
        gw::RecordResult {
            index,
            record_id: id.into(),
            checklist_id: "c1".into(),
            responder: responder.into(),
            score: Some(common::Score {
                primary_score: primary,
                answered_count: 2,
                item_scores: items,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// A two-responder evaluation as a comment: the aggregates with their interval, each
    /// responder, the comparison and its verdict, and the worst records, hostile ids escaped.
    #[test]
    fn an_evaluation_with_responders_reads_as_a_pull_request_comment() {
        let hostile = "<script>alert(1)</script>|x";
        let e = gw::EvaluateResponse {
            aggregate: Some(common::AggregateScores {
                targets: 4,
                mean_primary_score: 0.75,
                macro_pass_rate: 0.75,
                micro_pass_rate: 0.75,
                uncertainty: Some(common::ScoreUncertainty {
                    alpha: 0.05,
                    ci_low: 0.5,
                    ci_high: 1.0,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            checklists: vec![common::Checklist {
                id: "c1".into(),
                items: vec![
                    common::ChecklistItem { id: "q1".into(), question: "Is it *right*?".into(), ..Default::default() },
                    common::ChecklistItem { id: "q2".into(), question: "Is it short?".into(), ..Default::default() },
                ],
                ..Default::default()
            }],
            responders: vec![
                gw::ResponderResult { name: "model-a".into(), responses: 2, ..Default::default() },
                gw::ResponderResult { name: "model-b".into(), responses: 2, failed: 0, ..Default::default() },
            ],
            comparisons: vec![gw::CompareRunsResponse {
                baseline_run_id: "model-a".into(),
                candidate_run_id: "model-b".into(),
                method: gw::CompareMethod::PairedT as i32,
                alpha: 0.05,
                diff: -0.5,
                ci_low: -0.9,
                ci_high: -0.1,
                p_value: 0.01,
                significant: true,
                ..Default::default()
            }],
            ..Default::default()
        };
        let mut report = Report {
            run: gw::Run {
                run_id: "run-1".into(),
                kind: gw::PipelineKind::ChecklistEval as i32,
                state: gw::RunState::Succeeded as i32,
                result: Some(gw::RunResult {
                    result: Some(gw::run_result::Result::ChecklistEval(e)),
                    error: String::new(),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        for (i, (id, who, p, no)) in [
            ("r1", "model-a", 1.0, &[][..]),
            ("r1", "model-b", 0.5, &["q1"][..]),
            (hostile, "model-a", 1.0, &[][..]),
            (hostile, "model-b", 0.5, &["q1"][..]),
        ]
        .into_iter()
        .enumerate()
        {
            report.records.push(record(i as u32, id, who, p, no), 100);
        }
        let md = render(&report);
        assert!(md.starts_with("### Assay report: checklist_eval run `run-1` (succeeded)\n"), "{md}");
        assert!(md.contains("| **Responses** | 4 (0 without a score) |"), "{md}");
        assert!(md.contains("| **Mean primary score** | 0.750 (95% interval \\[0.500, 1.000\\]) |"), "{md}");
        assert!(md.contains("| `model-a` (baseline) |"), "{md}");
        assert!(
            md.contains("| `model-b` | `model-a` | -0.5000 | 95% \\[-0.9000, -0.1000\\] | 0.0100 | paired_t | **significantly worse** |"),
            "{md}"
        );
        // The worst records: model-b's two answers, the question that failed escaped.
        assert!(md.contains("| `r1` | `model-b` | 0.500 | Is it \\*right\\*? |"), "{md}");
        assert!(md.contains("| `<script>alert(1)</script>\\|x` | `model-b` | 0.500 |"), "{md}");
        // Every table row has as many cells as its head: no pipe of a record id split one.
        for line in md.lines().filter(|l| l.starts_with('|')) {
            let cells = line.replace("\\|", "").matches('|').count();
            assert!(cells == 3 || cells == 7 || cells == 8 || cells == 5, "{line}");
        }
        assert!(!md.lines().any(|l| !l.contains('`') && l.contains("<script>")), "markup only inside code spans");
    }
}
