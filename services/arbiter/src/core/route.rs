//! Routing and batching (no model calls): which action fixes each section, when the whole
//! document is regenerated, which tasks run together, and what they are estimated to cost.

use std::collections::{BTreeMap, HashMap, HashSet};

use assay_domain::arbiter::{
    Batch, CRITICAL_SECTION_SHARE, FixAction, FixTask, RouteRequest, Routing, STRUCTURE_FLOOR, SectionInstruction,
};
use assay_domain::document::{JudgeIssue, Section, Severity, priority_of};

use super::consolidate::demand;

/// Criteria whose critical or major issues regenerate the section.
pub const REGENERATING_CRITERIA: [&str; 2] = ["factual_accuracy", "completeness"];
/// Criterion whose score decides a full regeneration.
pub const STRUCTURE_CRITERION: &str = "pedagogical_structure";

/// Instruction of the patch a consistency check leads to when it finds section N+1 inconsistent
/// with the regenerated section N.
pub const CONSISTENCY_INSTRUCTION: &str = "The previous section was regenerated. Keep this section consistent with it: \
     fix references, terms and transitions that no longer fit, and change nothing else.";

/// The action one issue asks for: a critical or major issue on a regenerating criterion
/// regenerates the section, any other issue is a surgical edit.
pub fn action_for(issue: &JudgeIssue) -> FixAction {
    if REGENERATING_CRITERIA.contains(&issue.criterion.as_str())
        && matches!(issue.severity, Severity::Critical | Severity::Major)
    {
        FixAction::RegenerateSection
    } else {
        FixAction::SurgicalEdit
    }
}

/// Tokens of a text, estimated at four characters per token.
pub fn tokens(text: &str) -> u32 {
    (text.chars().count() as u32).div_ceil(4)
}

/// Prompt overhead of one fix or verification call (instructions of the template).
const CALL_OVERHEAD: u32 = 250;
/// Most characters of an anchor the fixer sees.
pub const ANCHOR_CHARS: usize = 1_500;

/// Completion tokens of a YES/NO consistency check.
pub const CHECK_OUTPUT_TOKENS: u32 = 4;

/// Estimated tokens of a consistency check of `section` against the regenerated `previous` (both
/// sections in, the previous one a fifth longer as a regeneration writes it; a few tokens out).
pub fn check_estimate(section: &Section, previous: Option<&Section>) -> u32 {
    let previous = previous.map_or(0, |s| {
        let body = tokens(&s.content) + tokens(&s.title);
        body + body / 5
    });
    CALL_OVERHEAD + tokens(&section.content) + tokens(&section.title) + previous + CHECK_OUTPUT_TOKENS
}

/// Estimated tokens (prompt + completion) of a task: the fix call (the section, the anchors and
/// the instruction in; the section out, a fifth longer when regenerated) and one verification
/// call per issue (the section before and after in, one token out). A task that exists only for
/// a consistency check (flagged, no issue) is estimated as the check ([`check_estimate`]): the
/// patch happens only when the check says NO.
pub fn estimate(task: &FixTask, section: &Section, previous: Option<&Section>, next: Option<&Section>) -> u32 {
    if task.consistency_check && task.issue_ids.is_empty() {
        return check_estimate(section, previous);
    }
    let anchor = |s: Option<&Section>| s.map_or(0, |s| tokens(&s.content).min(ANCHOR_CHARS as u32 / 4));
    let body = tokens(&section.content) + tokens(&section.title);
    let instruction = tokens(&task.instruction) + task.constraints.iter().map(|c| tokens(c)).sum::<u32>();
    let output = match task.action {
        FixAction::RegenerateSection => body + body / 5,
        FixAction::SurgicalEdit | FixAction::FullRegenerate => body,
    };
    let fix = CALL_OVERHEAD + body + anchor(previous) + anchor(next) + instruction + output;
    let checks = task.issue_ids.len().max(1) as u32;
    let verify = checks * (CALL_OVERHEAD + body + output + 1);
    fix + verify
}

/// Route issues to tasks (one per section with issues), or to a full regeneration
/// (pedagogical_structure below 0.6, or more than 40% of sections with a CRITICAL issue).
pub fn route(request: &RouteRequest) -> Routing {
    let RouteRequest { issues, sections, criterion_scores, instructions, locked_section_ids, criteria } = request;
    let known: HashSet<&str> = sections.iter().map(|s| s.id.as_str()).collect();
    let unassigned_issue_ids: Vec<String> =
        issues.iter().filter(|i| !known.contains(i.section_id.as_str())).map(|i| i.id.clone()).collect();
    let critical: HashSet<&str> = issues
        .iter()
        .filter(|i| i.severity == Severity::Critical && known.contains(i.section_id.as_str()))
        .map(|i| i.section_id.as_str())
        .collect();
    let critical_section_ratio = if sections.is_empty() { 0.0 } else { critical.len() as f64 / sections.len() as f64 };
    let structure = criterion_scores.get(STRUCTURE_CRITERION).copied();
    let full = if let Some(s) = structure.filter(|s| *s < STRUCTURE_FLOOR) {
        Some(format!("{STRUCTURE_CRITERION} scored {s:.2}, below {STRUCTURE_FLOOR}"))
    } else if critical_section_ratio > CRITICAL_SECTION_SHARE {
        Some(format!(
            "{} of {} sections ({:.0}%) have a critical issue, more than {:.0}%",
            critical.len(),
            sections.len(),
            critical_section_ratio * 100.0,
            CRITICAL_SECTION_SHARE * 100.0
        ))
    } else {
        None
    };
    if let Some(reason) = full {
        return Routing {
            full_regenerate: true,
            full_regenerate_reason: reason,
            tasks: vec![],
            skipped_locked_section_ids: vec![],
            unassigned_issue_ids,
            critical_section_ratio,
        };
    }
    let locked: HashSet<&str> = locked_section_ids.iter().map(String::as_str).collect();
    let given: HashMap<&str, &SectionInstruction> = instructions.iter().map(|i| (i.section_id.as_str(), i)).collect();
    let mut by_section: BTreeMap<usize, Vec<&JudgeIssue>> = BTreeMap::new();
    let position: HashMap<&str, usize> = sections.iter().enumerate().map(|(i, s)| (s.id.as_str(), i)).collect();
    for i in issues {
        if let Some(&p) = position.get(i.section_id.as_str()) {
            by_section.entry(p).or_default().push(i);
        }
    }
    let mut tasks: Vec<FixTask> = Vec::new();
    let mut skipped = Vec::new();
    let mut regenerated: Vec<usize> = Vec::new();
    for (&p, mine) in &by_section {
        let section = &sections[p];
        if locked.contains(section.id.as_str()) {
            skipped.push(section.id.clone());
            continue;
        }
        let mut mine = mine.clone();
        mine.sort_by_key(|i| (priority_of(criteria, &i.criterion), i.severity));
        let action = if mine.iter().any(|i| action_for(i) == FixAction::RegenerateSection) {
            regenerated.push(p);
            FixAction::RegenerateSection
        } else {
            FixAction::SurgicalEdit
        };
        let (instruction, constraints) = match given.get(section.id.as_str()) {
            Some(g) => (g.instruction.clone(), g.constraints.clone()),
            None => (demand(&mine), vec![]),
        };
        tasks.push(FixTask {
            id: String::new(),
            section_id: section.id.clone(),
            action,
            instruction,
            constraints,
            issue_ids: mine.iter().map(|i| i.id.clone()).collect(),
            consistency_check: false,
            priority: priority_of(criteria, &mine[0].criterion),
            criterion: mine[0].criterion.clone(),
            severity: mine.iter().map(|i| i.severity).min(),
            previous_section_id: String::new(),
            next_section_id: String::new(),
            estimated_tokens: 0,
        });
    }
    // N+1 consistency: the section after a regenerated one is re-checked for consistency: a task of its
    // own is flagged; otherwise a check-only task (no issue) is added, which the caller runs as a
    // YES/NO check and turns into a patch (with CONSISTENCY_INSTRUCTION) only on NO.
    for p in regenerated {
        let Some(next) = sections.get(p + 1) else { continue };
        if locked.contains(next.id.as_str()) {
            continue;
        }
        // The check inherits the priority of the regeneration that causes it.
        let priority = tasks.iter().find(|t| t.section_id == sections[p].id).map_or(1, |t| t.priority);
        if let Some(t) = tasks.iter_mut().find(|t| t.section_id == next.id) {
            t.consistency_check = true;
        } else {
            tasks.push(FixTask {
                id: String::new(),
                section_id: next.id.clone(),
                action: FixAction::SurgicalEdit,
                instruction: CONSISTENCY_INSTRUCTION.to_string(),
                constraints: vec![],
                issue_ids: vec![],
                consistency_check: true,
                priority,
                criterion: String::new(),
                severity: None,
                previous_section_id: String::new(),
                next_section_id: String::new(),
                estimated_tokens: 0,
            });
        }
    }
    tasks.sort_by_key(|t| position[t.section_id.as_str()]);
    for (n, t) in tasks.iter_mut().enumerate() {
        let p = position[t.section_id.as_str()];
        let previous = p.checked_sub(1).map(|q| &sections[q]);
        let next = sections.get(p + 1);
        t.id = format!("task-{}", n + 1);
        t.previous_section_id = previous.map(|s| s.id.clone()).unwrap_or_default();
        t.next_section_id = next.map(|s| s.id.clone()).unwrap_or_default();
        t.estimated_tokens = estimate(t, &sections[p], previous, next);
    }
    Routing {
        full_regenerate: false,
        full_regenerate_reason: String::new(),
        tasks,
        skipped_locked_section_ids: skipped,
        unassigned_issue_ids,
        critical_section_ratio,
    }
}

/// Execution batches: section expanders one per batch and alone;
/// patchers of non-adjacent sections together, at most `max_patchers` per batch. Tasks are
/// placed by priority (then document order) into the first batch that can take them, except
/// that anything done to the section after a regenerated one (its own task or its consistency
/// check) goes in a later batch than that regeneration, whatever the priorities: the
/// regeneration is placed first when it has not been yet.
pub fn batches(tasks: &[FixTask], sections: &[Section], max_patchers: u32) -> Vec<Batch> {
    let position: HashMap<&str, usize> = sections.iter().enumerate().map(|(i, s)| (s.id.as_str(), i)).collect();
    let pos = |t: &FixTask| position.get(t.section_id.as_str()).copied().unwrap_or(usize::MAX);
    let mut order: Vec<usize> = (0..tasks.len()).collect();
    order.sort_by_key(|&i| (tasks[i].action != FixAction::RegenerateSection, tasks[i].priority, pos(&tasks[i])));
    // The regeneration task of each section, by position.
    let regeneration: HashMap<usize, usize> = tasks
        .iter()
        .enumerate()
        .filter(|(_, t)| t.action == FixAction::RegenerateSection)
        .map(|(i, t)| (pos(t), i))
        .collect();
    let max = max_patchers.max(1) as usize;
    let mut out: Vec<Vec<&FixTask>> = Vec::new();
    // Batch of each placed task (by index), and of the regeneration of each position.
    let mut placed: HashMap<usize, usize> = HashMap::new();
    let mut regenerated_in: HashMap<usize, usize> = HashMap::new();
    for first in order {
        // The chain of unplaced regenerations before this task, nearest last: placed first.
        let mut chain = vec![first];
        let mut p = pos(&tasks[first]);
        while let Some(&r) = p.checked_sub(1).and_then(|q| regeneration.get(&q)) {
            if placed.contains_key(&r) || chain.contains(&r) {
                break;
            }
            chain.push(r);
            p -= 1;
        }
        for &i in chain.iter().rev() {
            if placed.contains_key(&i) {
                continue;
            }
            let t = &tasks[i];
            let p = pos(t);
            let earliest = p.checked_sub(1).and_then(|q| regenerated_in.get(&q)).map_or(0, |b| b + 1);
            let slot = match t.action {
                FixAction::RegenerateSection | FixAction::FullRegenerate => None,
                FixAction::SurgicalEdit => (earliest..out.len()).find(|&b| {
                    let batch = &out[b];
                    batch.len() < max
                        && batch.iter().all(|o| o.action == FixAction::SurgicalEdit && pos(o).abs_diff(p) > 1)
                }),
            };
            let b = match slot {
                Some(b) => b,
                None => {
                    out.push(Vec::new());
                    out.len() - 1
                }
            };
            out[b].push(t);
            placed.insert(i, b);
            if t.action == FixAction::RegenerateSection {
                regenerated_in.insert(p, b);
            }
        }
    }
    out.into_iter()
        .enumerate()
        .map(|(i, mut ts)| {
            ts.sort_by_key(|t| pos(t));
            Batch {
                index: i as u32,
                estimated_tokens: ts.iter().map(|t| t.estimated_tokens).sum(),
                tasks: ts.into_iter().cloned().collect(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use assay_domain::document::default_criteria;

    fn sections(n: usize) -> Vec<Section> {
        (1..=n)
            .map(|i| Section {
                id: format!("s{i}"),
                index: i as u32,
                title: format!("Part {i}"),
                content: "Some text. ".repeat(20),
            })
            .collect()
    }

    fn issue(section: &str, criterion: &str, severity: Severity) -> JudgeIssue {
        JudgeIssue {
            id: format!("{section}-{criterion}"),
            criterion: criterion.into(),
            severity,
            section_id: section.into(),
            description: format!("{criterion} problem"),
            fix_instruction: format!("fix {criterion}"),
            location: String::new(),
            raised_by: vec![],
            context_window: String::new(),
        }
    }

    fn request(n: usize, issues: Vec<JudgeIssue>) -> RouteRequest {
        RouteRequest { issues, sections: sections(n), criteria: default_criteria(), ..Default::default() }
    }

    fn ids(b: &Batch) -> Vec<&str> {
        b.tasks.iter().map(|t| t.section_id.as_str()).collect()
    }

    #[test]
    fn low_structure_regenerates_everything() {
        let mut r = request(5, vec![issue("s1", "clarity_readability", Severity::Minor)]);
        r.criterion_scores.insert(STRUCTURE_CRITERION.into(), 0.59);
        let out = route(&r);
        assert!(out.full_regenerate && out.tasks.is_empty(), "{out:?}");
        assert!(out.full_regenerate_reason.contains("0.59"), "{}", out.full_regenerate_reason);
        r.criterion_scores.insert(STRUCTURE_CRITERION.into(), 0.6);
        assert!(!route(&r).full_regenerate);
    }

    #[test]
    fn more_than_forty_percent_critical_sections_regenerate_everything() {
        // 2 of 5 = 40%: not more than 40%.
        let two = vec![
            issue("s1", "clarity_readability", Severity::Critical),
            issue("s3", "factual_accuracy", Severity::Critical),
        ];
        let out = route(&request(5, two.clone()));
        assert!(!out.full_regenerate);
        assert!((out.critical_section_ratio - 0.4).abs() < 1e-12);
        let mut three = two;
        three.push(issue("s5", "engagement_examples", Severity::Critical));
        let out = route(&request(5, three));
        assert!(out.full_regenerate, "{out:?}");
        assert!(out.full_regenerate_reason.contains("3 of 5"), "{}", out.full_regenerate_reason);
    }

    #[test]
    fn actions_follow_criterion_and_severity() {
        let out = route(&request(
            8,
            vec![
                issue("s1", "factual_accuracy", Severity::Major),
                issue("s3", "completeness", Severity::Critical),
                issue("s5", "factual_accuracy", Severity::Minor),
                issue("s6", "clarity_readability", Severity::Major),
                issue("s7", "engagement_examples", Severity::Minor),
            ],
        ));
        let by: HashMap<&str, &FixTask> = out.tasks.iter().map(|t| (t.section_id.as_str(), t)).collect();
        assert_eq!(by["s1"].action, FixAction::RegenerateSection);
        assert_eq!(by["s3"].action, FixAction::RegenerateSection);
        assert_eq!(by["s5"].action, FixAction::SurgicalEdit, "minor factual issues are surgical");
        assert_eq!(by["s6"].action, FixAction::SurgicalEdit);
        assert_eq!(by["s7"].action, FixAction::SurgicalEdit);
        // N+1 of a regenerated section: s2 gets a consistency task, s4 too.
        assert!(by["s2"].consistency_check && by["s2"].issue_ids.is_empty());
        assert!(by["s4"].consistency_check);
        assert!(!by["s6"].consistency_check);
        // Anchors: first section has none before.
        assert_eq!((by["s1"].previous_section_id.as_str(), by["s1"].next_section_id.as_str()), ("", "s2"));
        assert!(out.tasks.iter().all(|t| t.estimated_tokens > 0));
    }

    #[test]
    fn an_existing_next_task_is_flagged_not_duplicated() {
        let out = route(&request(
            3,
            vec![
                issue("s1", "factual_accuracy", Severity::Critical),
                issue("s2", "clarity_readability", Severity::Minor),
            ],
        ));
        assert_eq!(out.tasks.len(), 2);
        assert!(out.tasks[1].consistency_check && out.tasks[1].issue_ids == vec!["s2-clarity_readability"]);
    }

    #[test]
    fn locked_and_unknown_sections_are_reported() {
        let mut r = request(
            3,
            vec![issue("s2", "clarity_readability", Severity::Minor), issue("", "completeness", Severity::Minor)],
        );
        r.locked_section_ids = vec!["s2".into()];
        let out = route(&r);
        assert!(out.tasks.is_empty());
        assert_eq!(out.skipped_locked_section_ids, vec!["s2"]);
        assert_eq!(out.unassigned_issue_ids, vec!["-completeness"]);
    }

    #[test]
    fn non_adjacent_patches_share_a_batch() {
        let patch = |ss: &[&str]| {
            route(&request(8, ss.iter().map(|s| issue(s, "clarity_readability", Severity::Minor)).collect())).tasks
        };
        let s = sections(8);
        let b = batches(&patch(&["s2", "s4"]), &s, 3);
        assert_eq!(b.len(), 1);
        assert_eq!(ids(&b[0]), vec!["s2", "s4"]);
        let b = batches(&patch(&["s2", "s3"]), &s, 3);
        assert_eq!(b.iter().map(ids).collect::<Vec<_>>(), vec![vec!["s2"], vec!["s3"]]);
        let b = batches(&patch(&["s1", "s3", "s5", "s7"]), &s, 3);
        assert_eq!(b.iter().map(ids).collect::<Vec<_>>(), vec![vec!["s1", "s3", "s5"], vec!["s7"]]);
        assert_eq!(b[0].estimated_tokens, b[0].tasks.iter().map(|t| t.estimated_tokens).sum::<u32>());
    }

    #[test]
    fn expanders_run_alone_and_consistency_checks_follow_them() {
        let s = sections(8);
        let tasks = route(&request(
            8,
            vec![
                issue("s1", "factual_accuracy", Severity::Critical),
                issue("s5", "completeness", Severity::Major),
                issue("s7", "clarity_readability", Severity::Minor),
            ],
        ))
        .tasks;
        let b = batches(&tasks, &s, 3);
        for batch in &b {
            let expanders = batch.tasks.iter().filter(|t| t.action == FixAction::RegenerateSection).count();
            assert!(expanders == 0 || batch.tasks.len() == 1, "expander not alone: {batch:?}");
        }
        let batch_of = |id: &str| b.iter().position(|x| x.tasks.iter().any(|t| t.section_id == id)).unwrap();
        assert!(batch_of("s2") > batch_of("s1"));
        assert!(batch_of("s6") > batch_of("s5"));
        assert_eq!(b.iter().map(|x| x.tasks.len()).sum::<usize>(), tasks.len());
    }
    #[test]
    fn a_check_only_task_has_no_issue_and_costs_a_check_not_a_patch() {
        let out = route(&request(4, vec![issue("s2", "factual_accuracy", Severity::Critical)]));
        let s3 = out.tasks.iter().find(|t| t.section_id == "s3").expect("s3 is checked");
        assert!(s3.consistency_check && s3.issue_ids.is_empty(), "{s3:?}");
        assert_eq!(s3.instruction, CONSISTENCY_INSTRUCTION);
        let s = sections(4);
        assert_eq!(s3.estimated_tokens, check_estimate(&s[2], Some(&s[1])));
        // Both sections in, a few tokens out: far below the patch and its verification.
        let body = tokens(&s[2].content) + tokens(&s[2].title);
        let previous = tokens(&s[1].content) + tokens(&s[1].title);
        assert_eq!(s3.estimated_tokens, CALL_OVERHEAD + body + previous + previous / 5 + CHECK_OUTPUT_TOKENS);
        let patch = FixTask { consistency_check: false, ..s3.clone() };
        assert!(s3.estimated_tokens * 2 < estimate(&patch, &s[2], Some(&s[1]), Some(&s[3])));
        // A flagged task with its own issues keeps the estimate of its patch.
        let out = route(&request(
            3,
            vec![
                issue("s1", "factual_accuracy", Severity::Critical),
                issue("s2", "clarity_readability", Severity::Minor),
            ],
        ));
        let s2 = &out.tasks[1];
        assert!(s2.consistency_check);
        let unflagged = FixTask { consistency_check: false, ..s2.clone() };
        let s = sections(3);
        assert_eq!(s2.estimated_tokens, estimate(&unflagged, &s[1], Some(&s[0]), Some(&s[2])));
    }

    #[test]
    fn section_n_plus_one_waits_for_the_regeneration_of_n_whatever_the_priorities() {
        let s = sections(6);
        // s2's regeneration (factual_accuracy, priority 1) outranks s1's (completeness, 6).
        let tasks = route(&request(
            6,
            vec![
                issue("s1", "completeness", Severity::Major),
                issue("s2", "factual_accuracy", Severity::Critical),
                issue("s4", "completeness", Severity::Major),
                issue("s5", "clarity_readability", Severity::Minor),
            ],
        ))
        .tasks;
        let b = batches(&tasks, &s, 3);
        let batch_of = |id: &str| b.iter().position(|x| x.tasks.iter().any(|t| t.section_id == id)).unwrap();
        assert!(batch_of("s2") > batch_of("s1"), "{b:?}");
        assert!(batch_of("s3") > batch_of("s2"), "{b:?}");
        assert!(batch_of("s5") > batch_of("s4"), "{b:?}");
        assert_eq!(b.iter().map(|x| x.tasks.len()).sum::<usize>(), tasks.len());
        // A patch of N+1 not flagged as a check (a caller's own task list) waits too, even with
        // the top priority.
        let mut tasks = route(&request(3, vec![issue("s1", "completeness", Severity::Major)])).tasks;
        tasks.retain(|t| t.section_id == "s1");
        let mut patch = tasks[0].clone();
        patch.section_id = "s2".into();
        patch.action = FixAction::SurgicalEdit;
        patch.priority = 1;
        tasks.push(patch);
        let b = batches(&tasks, &sections(3), 3);
        assert_eq!(b.iter().map(ids).collect::<Vec<_>>(), vec![vec!["s1"], vec!["s2"]]);
    }
}
