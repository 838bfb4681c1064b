//! The human lines of a targeted refinement: one per refinement event (a few indented lines more
//! for failed judges, hints and unresolved issues), as `assay refine` prints them on standard
//! error and `assay runs watch` prints them per event.

use assay_proto::gateway::v1 as gw;

use super::{action_name, agreement_name, outcome_name, plural, quality_name, severity_name};

fn scores(history: &[f64]) -> String {
    history.iter().map(|s| format!("{s:.2}")).collect::<Vec<_>>().join(" → ")
}

/// The progress line of one refinement event, as `assay refine` prints it on standard error (a few
/// indented lines more for judges that failed, hints and unresolved issues). None for an event
/// without a payload.
pub fn progress_line(run_id: &str, r: &gw::RefinementEvent) -> Option<String> {
    use gw::refinement_event::Event as E;
    let i = r.iteration;
    Some(match r.event.as_ref()? {
        E::Judged(j) => judged_line(i, j),
        E::RefinementStart(s) | E::IterationStarted(s) => start_line(i, s),
        E::BatchStarted(b) => format!(
            "  batch {}/{}: {}",
            b.batch_index.saturating_add(1),
            b.batches_total,
            if b.task_ids.is_empty() { "no tasks".to_string() } else { b.task_ids.join(", ") }
        ),
        E::TaskStarted(t) => task_line(t),
        E::PatchApplied(p) => {
            format!("  patch {}: {}", p.section_id, if p.diff_summary.is_empty() { "edited" } else { &p.diff_summary })
        }
        E::PatchRejected(p) => {
            format!("  patch {} not kept: {}", p.section_id, if p.reason.is_empty() { "rejected" } else { &p.reason })
        }
        E::VerificationResult(v) => verification_line(v),
        E::ConsistencyChecked(c) => {
            let verdict = if c.consistent { "consistent, no edit" } else { "inconsistent, patching" };
            let confidence = c.confidence.map(|p| format!(" (p={p:.2})")).unwrap_or_default();
            let reason = if c.reason.is_empty() { String::new() } else { format!(": {}", c.reason) };
            format!("  check {} after {}: {verdict}{confidence}{reason}", c.section_id, c.previous_section_id)
        }
        E::BatchComplete(b) => format!(
            "  batch {} done: {} completed, {} failed, {} skipped",
            b.batch_index.saturating_add(1),
            b.tasks_completed,
            b.tasks_failed,
            b.tasks_skipped
        ),
        E::SectionLocked(s) => format!("  section {} locked ({})", s.section_id, plural(s.edit_count as usize, "edit")),
        E::IterationComplete(c) => iteration_line(i, c),
        E::ConvergenceDetected(c) => format!("converged: {}", c.reason),
        E::BestEffortSelected(b) => best_effort_line(&b.best_effort.clone().unwrap_or_default()),
        E::EscalationTriggered(e) => escalation_line(run_id, e),
        E::RefinementComplete(c) => format!(
            "refinement complete: {}, final score {:.2} after {}",
            outcome_name(c.outcome),
            c.final_score,
            plural(c.iterations as usize, "iteration")
        ),
    })
}

fn judged_line(iteration: u32, j: &gw::Judged) -> String {
    let ok = j.judges.iter().filter(|r| r.verdict.is_some()).count();
    let when = if iteration == 0 { "document as given".to_string() } else { format!("iteration {iteration}") };
    let when = if j.focused { format!("{when} ({} re-judged)", j.judged_section_ids.join(", ")) } else { when };
    let mut line = format!(
        "{when}: judged {:.2} by {ok}/{} judges, {} ({} critical)",
        j.score,
        j.judges.len(),
        plural(j.open_issues as usize, "open issue"),
        j.critical_issues
    );
    for r in j.judges.iter().filter(|r| r.verdict.is_none()) {
        line.push_str(&format!("\n  judge {} failed: {}", r.judge_id, r.error));
    }
    line
}

fn start_line(iteration: u32, s: &gw::RefinementStart) -> String {
    let plan = s.plan.clone().unwrap_or_default();
    let in_batches: usize = plan.batches.iter().map(|b| b.tasks.len()).sum();
    let tasks = if in_batches > 0 { in_batches } else { plan.routing.as_ref().map_or(0, |r| r.tasks.len()) };
    let c = plan.consolidation.unwrap_or_default();
    let mut agreement = match c.alpha {
        Some(a) => format!("agreement {a:.2} {}", agreement_name(c.agreement)),
        None => format!("agreement {}", agreement_name(c.agreement)),
    };
    if c.flagged_for_review {
        agreement.push_str(", flagged for review");
    }
    let what = if s.full_regenerate {
        format!("full regeneration ({})", s.full_regenerate_reason)
    } else {
        "plan".to_string()
    };
    let mut line = format!(
        "iteration {iteration}: {what} {} in {} ({agreement}, ~{} tokens)",
        plural(tasks, "task"),
        plural(plan.batches.len(), "batch"),
        plan.estimated_tokens
    );
    if !s.locked_section_ids.is_empty() {
        line.push_str(&format!("; locked: {}", s.locked_section_ids.join(", ")));
    }
    line
}

fn task_line(t: &gw::TaskStarted) -> String {
    let task = t.task.clone().unwrap_or_default();
    let mut line = format!("  task {} {}: {}", task.id, task.section_id, action_name(task.action));
    if !task.criterion.is_empty() {
        line.push_str(&format!(" ({}, {})", task.criterion, severity_name(task.severity)));
    }
    if task.consistency_check {
        line.push_str(", consistency check");
    }
    line
}

fn verification_line(v: &gw::VerificationResult) -> String {
    let who = if v.human_edit { " (human edit)" } else { "" };
    if v.accepted {
        return format!("  verified {}{who}: accepted (edits {})", v.section_id, v.edit_count);
    }
    let reasons = v.verification.as_ref().map(|c| c.rejection_reasons.join("; ")).unwrap_or_default();
    let reason = [v.reason.as_str(), reasons.as_str()].into_iter().find(|r| !r.is_empty()).unwrap_or("no reason given");
    let undo = if v.rolled_back { ", rolled back" } else { "" };
    format!("  verified {}{who}: rejected: {reason}{undo}", v.section_id)
}

fn iteration_line(iteration: u32, c: &gw::IterationComplete) -> String {
    let mut line = format!(
        "iteration {iteration} complete: score {:.2} (history {}), {} tokens",
        c.score,
        scores(&c.score_history),
        c.tokens_used
    );
    if c.tasks_failed > 0 {
        line.push_str(&format!(", {} tasks completed, {} failed", c.tasks_completed, c.tasks_failed));
    }
    if !c.restored_section_ids.is_empty() {
        line.push_str(&format!("; restored (quality lock): {}", c.restored_section_ids.join(", ")));
    }
    line
}

fn best_effort_line(b: &gw::BestEffort) -> String {
    let mut line = format!(
        "best effort: {}, best score {:.2} at iteration {}, {}",
        quality_name(b.quality),
        b.best_score,
        b.best_iteration,
        plural(b.unresolved_issues_count as usize, "unresolved issue")
    );
    if !b.unresolved_categories.is_empty() {
        line.push_str(&format!(" ({})", b.unresolved_categories.join(", ")));
    }
    for h in &b.improvement_hints {
        line.push_str(&format!("\n  hint: {h}"));
    }
    line
}

/// Unresolved issues listed under an escalation before "and N more".
const LISTED_ISSUES: usize = 10;

fn escalation_line(run_id: &str, e: &gw::EscalationTriggered) -> String {
    let mut line = format!(
        "escalated: awaiting a human (run {run_id}): use assay runs edit/resume/accept/review\n  \
         reason: {}; best score {:.2} at iteration {}, {}",
        e.reason,
        e.best_score,
        e.best_iteration,
        plural(e.unresolved_issues.len(), "unresolved issue")
    );
    for i in e.unresolved_issues.iter().take(LISTED_ISSUES) {
        let at = if i.section_id.is_empty() { "(no section)" } else { i.section_id.as_str() };
        line.push_str(&format!("\n  - [{}] {} in {at}: {}", severity_name(i.severity), i.criterion, i.description));
    }
    if e.unresolved_issues.len() > LISTED_ISSUES {
        line.push_str(&format!("\n  ... and {} more", e.unresolved_issues.len() - LISTED_ISSUES));
    }
    line
}

#[cfg(test)]
mod tests {
    use assay_proto::arbiter::v1 as arb;
    use assay_proto::common::v1 as common;

    use super::*;

    fn line(iteration: u32, event: gw::refinement_event::Event) -> String {
        progress_line("run-1", &gw::RefinementEvent { iteration, event: Some(event) }).unwrap()
    }

    fn task(id: &str, section: &str) -> arb::FixTask {
        arb::FixTask {
            id: id.into(),
            section_id: section.into(),
            action: arb::FixAction::SurgicalEdit as i32,
            ..Default::default()
        }
    }

    #[test]
    fn progress_lines_speak_human() {
        use gw::refinement_event::Event as E;
        let plan = arb::PlanResponse {
            consolidation: Some(arb::ConsolidateResponse {
                alpha: Some(0.82),
                agreement: arb::AgreementLevel::High as i32,
                ..Default::default()
            }),
            batches: vec![
                arb::Batch {
                    index: 0,
                    tasks: vec![task("t1", "stages"), task("t2", "summary")],
                    estimated_tokens: 1600,
                },
                arb::Batch { index: 1, tasks: vec![task("t3", "intro")], estimated_tokens: 800 },
            ],
            estimated_tokens: 2400,
            ..Default::default()
        };
        let start = E::RefinementStart(gw::RefinementStart { plan: Some(plan), ..Default::default() });
        assert_eq!(line(1, start), "iteration 1: plan 3 tasks in 2 batches (agreement 0.82 high, ~2400 tokens)");
        let started = E::TaskStarted(gw::TaskStarted { task: Some(task("t1", "stages")), batch_index: 0 });
        assert_eq!(line(1, started), "  task t1 stages: surgical_edit");
        let patch = E::PatchApplied(gw::PatchApplied {
            section_id: "stages".into(),
            diff_summary: "+2 -1 lines".into(),
            ..Default::default()
        });
        assert_eq!(line(1, patch), "  patch stages: +2 -1 lines");
        let ok = E::VerificationResult(gw::VerificationResult {
            section_id: "stages".into(),
            accepted: true,
            edit_count: 1,
            ..Default::default()
        });
        assert_eq!(line(1, ok), "  verified stages: accepted (edits 1)");
        let rejected = E::VerificationResult(gw::VerificationResult {
            section_id: "stages".into(),
            rolled_back: true,
            verification: Some(assay_proto::delta_judge::v1::VerifyResponse {
                rejection_reasons: vec!["issue i1 not fixed".into()],
                ..Default::default()
            }),
            ..Default::default()
        });
        assert_eq!(line(1, rejected), "  verified stages: rejected: issue i1 not fixed, rolled back");
        let locked = E::SectionLocked(gw::SectionLocked { section_id: "stages".into(), edit_count: 2 });
        assert_eq!(line(1, locked), "  section stages locked (2 edits)");
        let done = E::IterationComplete(gw::IterationComplete {
            score: 0.81,
            score_history: vec![0.62, 0.81],
            tokens_used: 2300,
            ..Default::default()
        });
        assert_eq!(line(1, done), "iteration 1 complete: score 0.81 (history 0.62 → 0.81), 2300 tokens");
        let converged = E::ConvergenceDetected(gw::ConvergenceDetected {
            reason: "gain_below_threshold".into(),
            ..Default::default()
        });
        assert_eq!(line(2, converged), "converged: gain_below_threshold");
        let best = E::BestEffortSelected(gw::BestEffortSelected {
            best_effort: Some(gw::BestEffort {
                best_score: 0.68,
                best_iteration: 2,
                quality: gw::QualityStatus::BelowStandard as i32,
                unresolved_issues_count: 1,
                improvement_hints: vec!["Name the four stages".into()],
                ..Default::default()
            }),
        });
        assert_eq!(
            line(2, best),
            "best effort: below_standard, best score 0.68 at iteration 2, 1 unresolved issue\n  hint: Name the four stages"
        );
        let escalated = E::EscalationTriggered(gw::EscalationTriggered {
            reason: "below the semi-auto thresholds".into(),
            best_score: 0.7,
            best_iteration: 1,
            unresolved_issues: vec![common::JudgeIssue {
                criterion: "completeness".into(),
                severity: common::Severity::Major as i32,
                section_id: "stages".into(),
                description: "Stages not named".into(),
                ..Default::default()
            }],
        });
        let text = line(2, escalated);
        assert!(
            text.starts_with("escalated: awaiting a human (run run-1): use assay runs edit/resume/accept/review\n")
        );
        assert!(text.ends_with("\n  - [major] completeness in stages: Stages not named"), "{text}");
        let batch = E::BatchStarted(gw::BatchStarted { batch_index: 0, batches_total: 2, task_ids: vec!["t1".into()] });
        assert_eq!(line(1, batch), "  batch 1/2: t1");
        assert_eq!(progress_line("run-1", &gw::RefinementEvent { iteration: 0, event: None }), None);
    }
}
