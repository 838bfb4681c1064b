//! The tasks of a full-regeneration iteration (the arbiter routed FULL_REGENERATE): one section
//! regeneration per unlocked section, in document order, one batch each.

use crate::arbiter::{FixAction, FixTask, Plan};
use crate::content::regeneration_instruction;
use crate::document::{JudgeIssue, Section};

/// Criterion a regeneration task works on.
pub const REGENERATION_CRITERION: &str = "pedagogical_structure";

/// One regeneration per section not in `locked`, in document order; the task at position `n`
/// runs in batch `n`. Each takes the arbiter's instruction for its section (a non-blank one),
/// else [`regeneration_instruction`] with the plan's reason; its section's `issues` (their ids,
/// the most severe severity); its neighbours in the whole document (locked ones included); and
/// an estimate of half the section's bytes plus 600 tokens.
pub fn regeneration_tasks(sections: &[Section], locked: &[String], issues: &[JudgeIssue], plan: &Plan) -> Vec<FixTask> {
    let reason = &plan.routing.full_regenerate_reason;
    sections
        .iter()
        .enumerate()
        .filter(|(_, s)| !locked.contains(&s.id))
        .map(|(i, s)| {
            let own: Vec<&JudgeIssue> = issues.iter().filter(|x| x.section_id == s.id).collect();
            let instruction = plan
                .consolidation
                .instructions
                .iter()
                .find(|x| x.section_id == s.id && !x.instruction.trim().is_empty());
            FixTask {
                id: format!("regenerate-{}", s.id),
                section_id: s.id.clone(),
                action: FixAction::RegenerateSection,
                instruction: instruction.map_or_else(|| regeneration_instruction(reason), |x| x.instruction.clone()),
                constraints: instruction.map(|x| x.constraints.clone()).unwrap_or_default(),
                issue_ids: own.iter().map(|x| x.id.clone()).collect(),
                consistency_check: false,
                priority: 1,
                criterion: REGENERATION_CRITERION.into(),
                severity: own.iter().map(|x| x.severity).min(),
                previous_section_id: i.checked_sub(1).map(|p| sections[p].id.clone()).unwrap_or_default(),
                next_section_id: sections.get(i + 1).map(|x| x.id.clone()).unwrap_or_default(),
                estimated_tokens: (s.content.len() / 2 + 600) as u32,
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::arbiter::{Consolidation, Routing, SectionInstruction};
    use crate::document::Severity;

    fn section(id: &str, content: &str) -> Section {
        Section { id: id.into(), content: content.into(), ..Section::default() }
    }

    fn issue(id: &str, section: &str, severity: Severity) -> JudgeIssue {
        JudgeIssue {
            id: id.into(),
            criterion: "clarity".into(),
            severity,
            section_id: section.into(),
            description: "d".into(),
            fix_instruction: String::new(),
            location: String::new(),
            raised_by: Vec::new(),
            context_window: String::new(),
        }
    }

    fn plan(reason: &str, instructions: Vec<SectionInstruction>) -> Plan {
        Plan {
            consolidation: Consolidation { instructions, ..Consolidation::default() },
            routing: Routing { full_regenerate: true, full_regenerate_reason: reason.into(), ..Routing::default() },
            ..Plan::default()
        }
    }

    #[test]
    fn one_task_per_unlocked_section_in_document_order() {
        let sections = [section("a", "1234"), section("b", "xy"), section("c", "")];
        let issues = [
            issue("i1", "c", Severity::Minor),
            issue("i2", "c", Severity::Major),
            issue("i3", "b", Severity::Critical),
        ];
        let tasks = regeneration_tasks(&sections, &["b".to_string()], &issues, &plan("structure 0.40", Vec::new()));
        let ids: Vec<&str> = tasks.iter().map(|t| t.id.as_str()).collect();
        assert_eq!(ids, vec!["regenerate-a", "regenerate-c"]);
        let (a, c) = (&tasks[0], &tasks[1]);
        assert_eq!((a.previous_section_id.as_str(), a.next_section_id.as_str()), ("", "b"));
        // A locked neighbour is still the anchor.
        assert_eq!((c.previous_section_id.as_str(), c.next_section_id.as_str()), ("b", ""));
        assert_eq!(a.estimated_tokens, 602);
        assert_eq!(c.estimated_tokens, 600);
        assert_eq!((a.issue_ids.len(), a.severity), (0, None));
        assert_eq!(
            (c.issue_ids.clone(), c.severity),
            (vec!["i1".to_string(), "i2".to_string()], Some(Severity::Major))
        );
        assert!(tasks.iter().all(|t| t.action == FixAction::RegenerateSection
            && t.priority == 1
            && !t.consistency_check
            && t.criterion == REGENERATION_CRITERION));
        assert_eq!(a.instruction, regeneration_instruction("structure 0.40"));
        assert!(a.constraints.is_empty());
    }

    #[test]
    fn the_arbiters_instruction_wins_unless_it_is_blank() {
        let sections = [section("a", ""), section("b", "")];
        let given = |id: &str, text: &str| SectionInstruction {
            section_id: id.into(),
            instruction: text.into(),
            constraints: vec![format!("keep {id}")],
            ..SectionInstruction::default()
        };
        let p = plan("why", vec![given("a", "Rewrite a."), given("b", "  ")]);
        let tasks = regeneration_tasks(&sections, &[], &[], &p);
        assert_eq!(
            (tasks[0].instruction.as_str(), tasks[0].constraints.clone()),
            ("Rewrite a.", vec!["keep a".to_string()])
        );
        assert_eq!(tasks[1].instruction, regeneration_instruction("why"));
        assert!(tasks[1].constraints.is_empty());
    }
}
