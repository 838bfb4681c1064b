//! Arbiter messages: wire <-> domain, checked with full field paths.

use std::collections::HashSet;

use assay_domain as d;
use assay_domain::Violations;
use assay_domain::arbiter as a;
use assay_domain::content::{MAX_CONSTRAINTS, MAX_EDIT_ISSUES, MAX_INSTRUCTION_BYTES};
use assay_domain::document::{MAX_ISSUES_PER_VERDICT, MAX_JUDGES, MAX_SECTIONS, check_unit};
use assay_domain::limits::MAX_ID_BYTES;

use super::document::{
    brief, brief_to, criteria, criterion_to, issue, issue_to, section_to, sections, severity_to, verdict, verdict_to,
};
use super::{
    enum_value, model_record_from, model_record_to, model_spec, model_spec_to, text_limit, usage_from, usage_to,
};
use crate::arbiter::v1 as pb;

fn level(value: i32, field: &str, v: &mut Violations) -> a::MeasurementLevel {
    match enum_value::<pb::LevelOfMeasurement>(
        value,
        field,
        "0 unspecified = interval, 1 nominal, 2 ordinal, 3 interval, 4 ratio",
        v,
    ) {
        Some(pb::LevelOfMeasurement::Nominal) => a::MeasurementLevel::Nominal,
        Some(pb::LevelOfMeasurement::Ordinal) => a::MeasurementLevel::Ordinal,
        Some(pb::LevelOfMeasurement::Ratio) => a::MeasurementLevel::Ratio,
        Some(pb::LevelOfMeasurement::Interval | pb::LevelOfMeasurement::Unspecified) | None => {
            a::MeasurementLevel::Interval
        }
    }
}

fn level_to(l: a::MeasurementLevel) -> pb::LevelOfMeasurement {
    match l {
        a::MeasurementLevel::Nominal => pb::LevelOfMeasurement::Nominal,
        a::MeasurementLevel::Ordinal => pb::LevelOfMeasurement::Ordinal,
        a::MeasurementLevel::Interval => pb::LevelOfMeasurement::Interval,
        a::MeasurementLevel::Ratio => pb::LevelOfMeasurement::Ratio,
    }
}

/// Section ids (locked sections): each one of the document's sections.
fn ids(list: &[String], sections: &[d::Section], field: &str, v: &mut Violations) {
    if list.len() > MAX_SECTIONS {
        v.push(field, format!("has {} ids; the limit is {MAX_SECTIONS}", list.len()));
    }
    let known: HashSet<&str> = sections.iter().map(|s| s.id.as_str()).collect();
    for (i, id) in list.iter().enumerate() {
        if id.trim().is_empty() || id.len() > MAX_ID_BYTES {
            v.push(format!("{field}[{i}]"), format!("must be a section id of 1 to {MAX_ID_BYTES} bytes"));
        } else if !known.contains(id.as_str()) {
            v.push(format!("{field}[{i}]"), format!("names no section of the document ({id:?})"));
        }
    }
}

/// Every verdict's section scores name a section of the document and one of the request's
/// criteria, at most once each: a score for a unit nobody else can rate would shift the agreement.
fn check_section_scores(
    verdicts: &[d::JudgeVerdict],
    sections: &[d::Section],
    criteria: &[d::Criterion],
    v: &mut Violations,
) {
    let ids: HashSet<&str> = sections.iter().map(|s| s.id.as_str()).collect();
    let names: HashSet<&str> = criteria.iter().map(|c| c.name.as_str()).collect();
    for (i, x) in verdicts.iter().enumerate() {
        let mut seen = HashSet::new();
        for (j, s) in x.section_scores.iter().enumerate() {
            let field = format!("verdicts[{i}].section_scores[{j}]");
            if !ids.contains(s.section_id.as_str()) {
                v.push(format!("{field}.section_id"), format!("names no section of the document ({:?})", s.section_id));
            }
            if !names.contains(s.criterion.as_str()) {
                v.push(format!("{field}.criterion"), format!("names no criterion of the request ({:?})", s.criterion));
            }
            if !seen.insert((s.section_id.as_str(), s.criterion.as_str())) {
                v.push(
                    field,
                    format!("repeats the score of section {:?} on {:?} (one score a unit)", s.section_id, s.criterion),
                );
            }
        }
    }
}

/// Route's caller-supplied instructions, held to what Patch and ExpandSection accept: one per
/// section of the document, within the edit limits.
fn check_instructions(instructions: &[pb::SectionInstruction], sections: &[d::Section], v: &mut Violations) {
    if instructions.len() > MAX_SECTIONS {
        v.push("instructions", format!("has {} instructions; the limit is {MAX_SECTIONS}", instructions.len()));
    }
    let known: HashSet<&str> = sections.iter().map(|s| s.id.as_str()).collect();
    let mut seen = HashSet::new();
    for (i, x) in instructions.iter().enumerate() {
        let field = format!("instructions[{i}]");
        if !known.contains(x.section_id.as_str()) {
            v.push(format!("{field}.section_id"), format!("names no section of the document ({:?})", x.section_id));
        } else if !seen.insert(x.section_id.as_str()) {
            v.push(format!("{field}.section_id"), format!("repeats the instruction of section {:?}", x.section_id));
        }
        text_limit(&x.instruction, &format!("{field}.instruction"), MAX_INSTRUCTION_BYTES, v);
        if x.constraints.len() > MAX_CONSTRAINTS {
            v.push(
                format!("{field}.constraints"),
                format!("has {} constraints; the limit is {MAX_CONSTRAINTS}", x.constraints.len()),
            );
        }
        for (j, c) in x.constraints.iter().enumerate() {
            text_limit(c, &format!("{field}.constraints[{j}]"), MAX_INSTRUCTION_BYTES, v);
        }
        if x.issue_ids.len() > MAX_EDIT_ISSUES {
            v.push(
                format!("{field}.issue_ids"),
                format!("has {} ids; the limit is {MAX_EDIT_ISSUES}", x.issue_ids.len()),
            );
        }
        for (name, text) in [("primary_criterion", &x.primary_criterion), ("error", &x.error)] {
            text_limit(text, &format!("{field}.{name}"), MAX_INSTRUCTION_BYTES, v);
        }
    }
}

/// Route's issues: unique ids, and no more a section than one edit fixes (Patch's limit).
fn check_route_issues(issues: &[d::JudgeIssue], v: &mut Violations) {
    let mut seen = HashSet::new();
    let mut per_section: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
    for (i, x) in issues.iter().enumerate() {
        if !seen.insert(x.id.as_str()) {
            v.push(format!("issues[{i}].id"), format!("duplicate issue id {:?}", x.id));
        }
        let n = per_section.entry(x.section_id.as_str()).or_default();
        *n += 1;
        if *n == MAX_EDIT_ISSUES + 1 {
            v.push(
                format!("issues[{i}].section_id"),
                format!("section {:?} has more than {MAX_EDIT_ISSUES} issues, more than one edit fixes", x.section_id),
            );
        }
    }
}

/// The fields Consolidate and Plan share, checked: 1 to 9 verdicts with unique judge ids (empty
/// ones become "judge-<n>"), the sections, criteria (empty: defaults), the match threshold in
/// [0, 1] (unset: 0.75).
#[allow(clippy::too_many_arguments)]
fn consolidate_parts(
    verdicts: Vec<crate::common::v1::JudgeVerdict>,
    secs: Vec<crate::common::v1::Section>,
    lvl: i32,
    crit: Vec<crate::common::v1::Criterion>,
    brf: Option<crate::common::v1::Brief>,
    model: Option<crate::common::v1::ModelSpec>,
    embedding_model: Option<crate::common::v1::ModelSpec>,
    match_threshold: Option<f64>,
    skip_synthesis: bool,
    v: &mut Violations,
) -> a::ConsolidateRequest {
    if verdicts.is_empty() {
        v.push("verdicts", "must not be empty: give 1 to 9 judges' verdicts");
    }
    if verdicts.len() > MAX_JUDGES {
        v.push("verdicts", format!("has {} verdicts; the limit is {MAX_JUDGES}", verdicts.len()));
    }
    let mut seen = HashSet::new();
    let verdicts: Vec<d::JudgeVerdict> = verdicts
        .into_iter()
        .take(MAX_JUDGES)
        .enumerate()
        .map(|(i, p)| {
            let mut x = verdict(p, &format!("verdicts[{i}]"), v);
            if x.judge_id.is_empty() {
                x.judge_id = format!("judge-{}", i + 1);
            }
            if !seen.insert(x.judge_id.clone()) {
                v.push(format!("verdicts[{i}].judge_id"), format!("duplicate judge id {:?}", x.judge_id));
            }
            x
        })
        .collect();
    let threshold = match match_threshold {
        Some(t) => {
            check_unit(t, "match_threshold", v);
            t
        }
        None => a::DEFAULT_MATCH_THRESHOLD,
    };
    let sections = sections(secs, "sections", v);
    let criteria = criteria(crit, "criteria", v);
    check_section_scores(&verdicts, &sections, &criteria, v);
    a::ConsolidateRequest {
        verdicts,
        sections,
        level: level(lvl, "level", v),
        criteria,
        brief: brief(brf, "brief", v),
        model: model_spec(model, "model", v),
        embedding_model: model_spec(embedding_model, "embedding_model", v),
        match_threshold: threshold,
        skip_synthesis,
    }
}

pub fn consolidate_request(p: pb::ConsolidateRequest) -> Result<a::ConsolidateRequest, d::StageError> {
    let pb::ConsolidateRequest {
        verdicts,
        sections,
        level,
        criteria,
        brief,
        model,
        embedding_model,
        match_threshold,
        skip_synthesis,
    } = p;
    let mut v = Violations::new();
    let out = consolidate_parts(
        verdicts,
        sections,
        level,
        criteria,
        brief,
        model,
        embedding_model,
        match_threshold,
        skip_synthesis,
        &mut v,
    );
    v.into_result()?;
    Ok(out)
}

pub fn consolidate_request_to(r: &a::ConsolidateRequest) -> pb::ConsolidateRequest {
    pb::ConsolidateRequest {
        verdicts: r.verdicts.iter().map(verdict_to).collect(),
        sections: r.sections.iter().map(section_to).collect(),
        level: level_to(r.level) as i32,
        criteria: r.criteria.iter().map(criterion_to).collect(),
        brief: Some(brief_to(&r.brief)),
        model: Some(model_spec_to(&r.model)),
        embedding_model: Some(model_spec_to(&r.embedding_model)),
        match_threshold: Some(r.match_threshold),
        skip_synthesis: r.skip_synthesis,
    }
}

fn agreement_to(l: Option<a::AgreementLevel>) -> pb::AgreementLevel {
    match l {
        None => pb::AgreementLevel::Unspecified,
        Some(a::AgreementLevel::High) => pb::AgreementLevel::High,
        Some(a::AgreementLevel::Moderate) => pb::AgreementLevel::Moderate,
        Some(a::AgreementLevel::Low) => pb::AgreementLevel::Low,
    }
}

fn agreement_from(value: i32) -> Option<a::AgreementLevel> {
    match pb::AgreementLevel::try_from(value) {
        Ok(pb::AgreementLevel::High) => Some(a::AgreementLevel::High),
        Ok(pb::AgreementLevel::Moderate) => Some(a::AgreementLevel::Moderate),
        Ok(pb::AgreementLevel::Low) => Some(a::AgreementLevel::Low),
        Ok(pb::AgreementLevel::Unspecified) | Err(_) => None,
    }
}

fn instruction_to(i: &a::SectionInstruction) -> pb::SectionInstruction {
    pb::SectionInstruction {
        section_id: i.section_id.clone(),
        instruction: i.instruction.clone(),
        constraints: i.constraints.clone(),
        issue_ids: i.issue_ids.clone(),
        primary_criterion: i.primary_criterion.clone(),
        synthesized: i.synthesized,
        error: i.error.clone(),
    }
}

fn instruction_from(p: pb::SectionInstruction) -> a::SectionInstruction {
    let pb::SectionInstruction {
        section_id,
        instruction,
        constraints,
        issue_ids,
        primary_criterion,
        synthesized,
        error,
    } = p;
    a::SectionInstruction { section_id, instruction, constraints, issue_ids, primary_criterion, synthesized, error }
}

fn conflict_to(c: &a::ConflictResolution) -> pb::ConflictResolution {
    pb::ConflictResolution {
        section_id: c.section_id.clone(),
        winning_criterion: c.winning_criterion.clone(),
        losing_criterion: c.losing_criterion.clone(),
        constraint: c.constraint.clone(),
    }
}

pub fn consolidation_to(c: &a::Consolidation) -> pb::ConsolidateResponse {
    pb::ConsolidateResponse {
        alpha: c.alpha,
        agreement: agreement_to(c.agreement) as i32,
        issues: c.issues.iter().map(issue_to).collect(),
        conflicts: c.conflicts.iter().map(conflict_to).collect(),
        flagged_for_review: c.flagged_for_review,
        criterion_scores: c.criterion_scores.iter().map(|(k, x)| (k.clone(), *x)).collect(),
        issues_dropped: c.issues_dropped,
        instructions: c.instructions.iter().map(instruction_to).collect(),
        alpha_undefined_reason: c.alpha_undefined_reason.clone(),
        issues_merged: c.issues_merged,
        unassigned_issues: c.unassigned_issues,
        overall_score: c.overall_score,
        agreement_units: c.agreement_units.clone(),
        usage: Some(usage_to(&c.usage)),
        model_record: c.model_record.as_ref().map(model_record_to),
        localizations: c.localizations.iter().map(localization_to).collect(),
        held_critical_issues: c.held_critical.iter().map(issue_to).collect(),
        similarity_degraded: c.similarity_degraded.clone(),
    }
}

fn localization_to(l: &a::IssueLocalization) -> pb::IssueLocalization {
    pb::IssueLocalization {
        issue_id: l.issue_id.clone(),
        section_ids: l.section_ids.clone(),
        issue_ids: l.issue_ids.clone(),
        method: l.method.clone(),
        reason: l.reason.clone(),
    }
}

fn localization_from(p: pb::IssueLocalization) -> a::IssueLocalization {
    let pb::IssueLocalization { issue_id, section_ids, issue_ids, method, reason } = p;
    a::IssueLocalization { issue_id, section_ids, issue_ids, method, reason }
}

/// A consolidation from the wire (trusted: it comes from the arbiter).
pub fn consolidation_from(p: pb::ConsolidateResponse) -> a::Consolidation {
    let mut v = Violations::new();
    a::Consolidation {
        alpha: p.alpha,
        alpha_undefined_reason: p.alpha_undefined_reason,
        agreement: agreement_from(p.agreement),
        issues: p.issues.into_iter().enumerate().map(|(i, x)| issue(x, &format!("issues[{i}]"), &mut v)).collect(),
        conflicts: p
            .conflicts
            .into_iter()
            .map(|c| a::ConflictResolution {
                section_id: c.section_id,
                winning_criterion: c.winning_criterion,
                losing_criterion: c.losing_criterion,
                constraint: c.constraint,
            })
            .collect(),
        flagged_for_review: p.flagged_for_review,
        criterion_scores: p.criterion_scores.into_iter().collect(),
        issues_dropped: p.issues_dropped,
        instructions: p.instructions.into_iter().map(instruction_from).collect(),
        issues_merged: p.issues_merged,
        unassigned_issues: p.unassigned_issues,
        overall_score: p.overall_score,
        agreement_units: p.agreement_units,
        usage: usage_from(p.usage),
        model_record: p.model_record.map(|r| model_record_from(Some(r))),
        localizations: p.localizations.into_iter().map(localization_from).collect(),
        held_critical: p
            .held_critical_issues
            .into_iter()
            .enumerate()
            .map(|(i, x)| issue(x, &format!("held_critical_issues[{i}]"), &mut v))
            .collect(),
        similarity_degraded: p.similarity_degraded,
    }
}

pub fn fix_action_to(x: a::FixAction) -> pb::FixAction {
    match x {
        a::FixAction::SurgicalEdit => pb::FixAction::SurgicalEdit,
        a::FixAction::RegenerateSection => pb::FixAction::RegenerateSection,
        a::FixAction::FullRegenerate => pb::FixAction::FullRegenerate,
    }
}

fn action_from(value: i32) -> a::FixAction {
    match pb::FixAction::try_from(value) {
        Ok(pb::FixAction::RegenerateSection) => a::FixAction::RegenerateSection,
        Ok(pb::FixAction::FullRegenerate) => a::FixAction::FullRegenerate,
        Ok(pb::FixAction::SurgicalEdit | pb::FixAction::Unspecified) | Err(_) => a::FixAction::SurgicalEdit,
    }
}

pub fn task_to(t: &a::FixTask) -> pb::FixTask {
    pb::FixTask {
        id: t.id.clone(),
        section_id: t.section_id.clone(),
        action: fix_action_to(t.action) as i32,
        instruction: t.instruction.clone(),
        constraints: t.constraints.clone(),
        issue_ids: t.issue_ids.clone(),
        consistency_check: t.consistency_check,
        priority: t.priority,
        criterion: t.criterion.clone(),
        severity: t.severity.map_or(crate::common::v1::Severity::Unspecified, severity_to) as i32,
        previous_section_id: t.previous_section_id.clone(),
        next_section_id: t.next_section_id.clone(),
        estimated_tokens: t.estimated_tokens,
    }
}

pub fn task_from(p: pb::FixTask) -> a::FixTask {
    let severity = match crate::common::v1::Severity::try_from(p.severity) {
        Ok(crate::common::v1::Severity::Critical) => Some(d::Severity::Critical),
        Ok(crate::common::v1::Severity::Major) => Some(d::Severity::Major),
        Ok(crate::common::v1::Severity::Minor) => Some(d::Severity::Minor),
        Ok(crate::common::v1::Severity::Unspecified) | Err(_) => None,
    };
    a::FixTask {
        id: p.id,
        section_id: p.section_id,
        action: action_from(p.action),
        instruction: p.instruction,
        constraints: p.constraints,
        issue_ids: p.issue_ids,
        consistency_check: p.consistency_check,
        priority: p.priority,
        criterion: p.criterion,
        severity,
        previous_section_id: p.previous_section_id,
        next_section_id: p.next_section_id,
        estimated_tokens: p.estimated_tokens,
    }
}

pub fn route_request(p: pb::RouteRequest) -> Result<a::RouteRequest, d::StageError> {
    let pb::RouteRequest { issues, sections: secs, criterion_scores, instructions, locked_section_ids, criteria: crit } =
        p;
    let mut v = Violations::new();
    let sections = sections(secs, "sections", &mut v);
    // What a full panel can raise (Consolidate's limit).
    let max_issues = MAX_JUDGES * MAX_ISSUES_PER_VERDICT;
    if issues.len() > max_issues {
        v.push("issues", format!("has {} issues; the limit is {max_issues}", issues.len()));
    }
    let issues: Vec<d::JudgeIssue> = issues
        .into_iter()
        .enumerate()
        .map(|(i, x)| {
            let mut x = issue(x, &format!("issues[{i}]"), &mut v);
            if x.id.is_empty() {
                x.id = format!("issue-{}", i + 1);
            }
            x
        })
        .collect();
    check_route_issues(&issues, &mut v);
    for (c, x) in &criterion_scores {
        check_unit(*x, &format!("criterion_scores[{c:?}]"), &mut v);
    }
    ids(&locked_section_ids, &sections, "locked_section_ids", &mut v);
    check_instructions(&instructions, &sections, &mut v);
    let criteria = criteria(crit, "criteria", &mut v);
    v.into_result()?;
    Ok(a::RouteRequest {
        issues,
        sections,
        criterion_scores: criterion_scores.into_iter().collect(),
        instructions: instructions.into_iter().map(instruction_from).collect(),
        locked_section_ids,
        criteria,
    })
}

pub fn route_request_to(r: &a::RouteRequest) -> pb::RouteRequest {
    pb::RouteRequest {
        issues: r.issues.iter().map(issue_to).collect(),
        sections: r.sections.iter().map(section_to).collect(),
        criterion_scores: r.criterion_scores.iter().map(|(k, x)| (k.clone(), *x)).collect(),
        instructions: r.instructions.iter().map(instruction_to).collect(),
        locked_section_ids: r.locked_section_ids.clone(),
        criteria: r.criteria.iter().map(criterion_to).collect(),
    }
}

pub fn routing_to(r: &a::Routing) -> pb::RouteResponse {
    pb::RouteResponse {
        full_regenerate: r.full_regenerate,
        full_regenerate_reason: r.full_regenerate_reason.clone(),
        tasks: r.tasks.iter().map(task_to).collect(),
        skipped_locked_section_ids: r.skipped_locked_section_ids.clone(),
        unassigned_issue_ids: r.unassigned_issue_ids.clone(),
        critical_section_ratio: r.critical_section_ratio,
    }
}

pub fn routing_from(p: pb::RouteResponse) -> a::Routing {
    a::Routing {
        full_regenerate: p.full_regenerate,
        full_regenerate_reason: p.full_regenerate_reason,
        tasks: p.tasks.into_iter().map(task_from).collect(),
        skipped_locked_section_ids: p.skipped_locked_section_ids,
        unassigned_issue_ids: p.unassigned_issue_ids,
        critical_section_ratio: p.critical_section_ratio,
    }
}

pub fn plan_request(p: pb::PlanRequest) -> Result<a::PlanRequest, d::StageError> {
    let pb::PlanRequest {
        verdicts,
        sections,
        locked_section_ids,
        max_parallel_patchers,
        criteria,
        brief,
        model,
        embedding_model,
        level,
        match_threshold,
        skip_synthesis,
    } = p;
    let mut v = Violations::new();
    let consolidate = consolidate_parts(
        verdicts,
        sections,
        level,
        criteria,
        brief,
        model,
        embedding_model,
        match_threshold,
        skip_synthesis,
        &mut v,
    );
    ids(&locked_section_ids, &consolidate.sections, "locked_section_ids", &mut v);
    let max = max_parallel_patchers.unwrap_or(a::MAX_PARALLEL_PATCHERS);
    if !(1..=a::MAX_PARALLEL_PATCHERS).contains(&max) {
        v.push("max_parallel_patchers", format!("must be 1 to {} (got {max})", a::MAX_PARALLEL_PATCHERS));
    }
    v.into_result()?;
    Ok(a::PlanRequest { consolidate, locked_section_ids, max_parallel_patchers: max })
}

pub fn plan_request_to(r: &a::PlanRequest) -> pb::PlanRequest {
    let c = consolidate_request_to(&r.consolidate);
    pb::PlanRequest {
        verdicts: c.verdicts,
        sections: c.sections,
        locked_section_ids: r.locked_section_ids.clone(),
        max_parallel_patchers: Some(r.max_parallel_patchers),
        criteria: c.criteria,
        brief: c.brief,
        model: c.model,
        embedding_model: c.embedding_model,
        level: c.level,
        match_threshold: c.match_threshold,
        skip_synthesis: c.skip_synthesis,
    }
}

pub fn plan_to(p: &a::Plan) -> pb::PlanResponse {
    pb::PlanResponse {
        consolidation: Some(consolidation_to(&p.consolidation)),
        routing: Some(routing_to(&p.routing)),
        batches: p
            .batches
            .iter()
            .map(|b| pb::Batch {
                index: b.index,
                tasks: b.tasks.iter().map(task_to).collect(),
                estimated_tokens: b.estimated_tokens,
            })
            .collect(),
        estimated_tokens: p.estimated_tokens,
    }
}

pub fn plan_from(p: pb::PlanResponse) -> a::Plan {
    a::Plan {
        consolidation: consolidation_from(p.consolidation.unwrap_or_default()),
        routing: routing_from(p.routing.unwrap_or_default()),
        batches: p
            .batches
            .into_iter()
            .map(|b| a::Batch {
                index: b.index,
                tasks: b.tasks.into_iter().map(task_from).collect(),
                estimated_tokens: b.estimated_tokens,
            })
            .collect(),
        estimated_tokens: p.estimated_tokens,
    }
}
