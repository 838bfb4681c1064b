//! Sections, briefs, criteria, issues and verdicts: wire <-> domain. Incoming messages are checked
//! field by field with full paths; outgoing conversions are infallible.

use assay_domain as d;
use assay_domain::Violations;
use assay_domain::document::{MAX_CRITERIA, MAX_ISSUES_PER_VERDICT, check_unit};
use assay_domain::limits::{MAX_ID_BYTES, MAX_TEXT_BYTES};

use super::{enum_value, model_record_from, model_record_to, text_limit, usage_from, usage_to};
use crate::common::v1 as pb;

pub fn section(p: pb::Section) -> d::Section {
    let pb::Section { id, index, title, content } = p;
    d::Section { id, index, title, content }
}

/// Sections from the wire, checked (non-empty, unique ids, limits). Document order is list order.
pub fn sections(p: Vec<pb::Section>, field: &str, v: &mut Violations) -> Vec<d::Section> {
    let out: Vec<d::Section> = p.into_iter().map(section).collect();
    d::document::check_sections(&out, field, v);
    out
}

pub fn section_to(s: &d::Section) -> pb::Section {
    pb::Section { id: s.id.clone(), index: s.index, title: s.title.clone(), content: s.content.clone() }
}

pub fn brief(p: Option<pb::Brief>, field: &str, v: &mut Violations) -> d::Brief {
    let Some(pb::Brief { objectives, audience, language, description }) = p else {
        return d::Brief::default();
    };
    if objectives.len() > MAX_CRITERIA {
        v.push(
            format!("{field}.objectives"),
            format!("has {} objectives; the limit is {MAX_CRITERIA}", objectives.len()),
        );
    }
    for (i, o) in objectives.iter().enumerate() {
        text_limit(o, &format!("{field}.objectives[{i}]"), MAX_ID_BYTES * 8, v);
    }
    text_limit(&audience, &format!("{field}.audience"), MAX_ID_BYTES * 8, v);
    text_limit(&language, &format!("{field}.language"), MAX_ID_BYTES, v);
    text_limit(&description, &format!("{field}.description"), MAX_TEXT_BYTES / 8, v);
    d::Brief { objectives, audience, language, description }
}

pub fn brief_to(b: &d::Brief) -> pb::Brief {
    pb::Brief {
        objectives: b.objectives.clone(),
        audience: b.audience.clone(),
        language: b.language.clone(),
        description: b.description.clone(),
    }
}

/// Criteria from the wire, checked; empty means the six defaults.
pub fn criteria(p: Vec<pb::Criterion>, field: &str, v: &mut Violations) -> Vec<d::Criterion> {
    let out: Vec<d::Criterion> = p
        .into_iter()
        .map(|pb::Criterion { name, description, priority }| d::Criterion { name, description, priority })
        .collect();
    d::document::check_criteria(&out, field, v);
    for (i, c) in out.iter().enumerate() {
        text_limit(&c.description, &format!("{field}[{i}].description"), MAX_ID_BYTES * 8, v);
    }
    d::document::criteria_or_default(out)
}

pub fn criterion_to(c: &d::Criterion) -> pb::Criterion {
    pb::Criterion { name: c.name.clone(), description: c.description.clone(), priority: c.priority }
}

pub fn severity_to(s: d::Severity) -> pb::Severity {
    match s {
        d::Severity::Critical => pb::Severity::Critical,
        d::Severity::Major => pb::Severity::Major,
        d::Severity::Minor => pb::Severity::Minor,
    }
}

/// Severity from the wire; unspecified and unknown numbers are violations.
pub fn severity(value: i32, field: &str, v: &mut Violations) -> d::Severity {
    match enum_value::<pb::Severity>(value, field, "1 critical, 2 major, 3 minor", v) {
        Some(pb::Severity::Critical) => d::Severity::Critical,
        Some(pb::Severity::Major) => d::Severity::Major,
        Some(pb::Severity::Minor) => d::Severity::Minor,
        Some(pb::Severity::Unspecified) => {
            v.push(field, "must be set (1 critical, 2 major, 3 minor)");
            d::Severity::Minor
        }
        None => d::Severity::Minor,
    }
}

pub fn issue(p: pb::JudgeIssue, field: &str, v: &mut Violations) -> d::JudgeIssue {
    let pb::JudgeIssue {
        id,
        criterion,
        severity: sev,
        section_id,
        description,
        fix_instruction,
        location,
        raised_by,
        context_window,
        // Output only (a refinement's unresolved issues): an input issue is planned like any.
        held_back: _,
    } = p;
    if criterion.trim().is_empty() {
        v.push(format!("{field}.criterion"), "must not be empty");
    }
    text_limit(&id, &format!("{field}.id"), MAX_ID_BYTES, v);
    text_limit(&criterion, &format!("{field}.criterion"), MAX_ID_BYTES, v);
    text_limit(&section_id, &format!("{field}.section_id"), MAX_ID_BYTES, v);
    for (name, text) in [
        ("description", &description),
        ("fix_instruction", &fix_instruction),
        ("location", &location),
        ("context_window", &context_window),
    ] {
        text_limit(text, &format!("{field}.{name}"), MAX_TEXT_BYTES / 16, v);
    }
    let severity = severity(sev, &format!("{field}.severity"), v);
    d::JudgeIssue {
        id,
        criterion,
        severity,
        section_id,
        description,
        fix_instruction,
        location,
        raised_by,
        context_window,
    }
}

pub fn issue_to(i: &d::JudgeIssue) -> pb::JudgeIssue {
    pb::JudgeIssue {
        id: i.id.clone(),
        criterion: i.criterion.clone(),
        severity: severity_to(i.severity) as i32,
        section_id: i.section_id.clone(),
        description: i.description.clone(),
        fix_instruction: i.fix_instruction.clone(),
        location: i.location.clone(),
        raised_by: i.raised_by.clone(),
        context_window: i.context_window.clone(),
        held_back: false,
    }
}

/// A verdict from the wire: scores in [0, 1], issues checked. Empty issue ids become
/// `"<judge>-<n>"`.
pub fn verdict(p: pb::JudgeVerdict, field: &str, v: &mut Violations) -> d::JudgeVerdict {
    let pb::JudgeVerdict {
        judge_id,
        model,
        criterion_scores,
        issues,
        overall_score,
        section_scores,
        usage,
        model_record,
        unknown_section_issues,
    } = p;
    text_limit(&judge_id, &format!("{field}.judge_id"), MAX_ID_BYTES, v);
    if criterion_scores.len() > MAX_CRITERIA {
        v.push(
            format!("{field}.criterion_scores"),
            format!("has {} criteria; the limit is {MAX_CRITERIA}", criterion_scores.len()),
        );
    }
    for (c, x) in &criterion_scores {
        check_unit(*x, &format!("{field}.criterion_scores[{c:?}]"), v);
    }
    check_unit(overall_score, &format!("{field}.overall_score"), v);
    if issues.len() > MAX_ISSUES_PER_VERDICT {
        v.push(
            format!("{field}.issues"),
            format!("has {} issues; the limit is {MAX_ISSUES_PER_VERDICT}", issues.len()),
        );
    }
    if section_scores.len() > d::document::MAX_SECTIONS * MAX_CRITERIA {
        v.push(format!("{field}.section_scores"), "has too many entries (at most one per section and criterion)");
    }
    let section_scores = section_scores
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            check_unit(s.score, &format!("{field}.section_scores[{i}].score"), v);
            d::SectionScore { section_id: s.section_id, criterion: s.criterion, score: s.score }
        })
        .collect();
    let issues = issues
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            let mut issue = issue(p, &format!("{field}.issues[{i}]"), v);
            if issue.id.is_empty() {
                issue.id = format!("{}-{}", if judge_id.is_empty() { "judge" } else { &judge_id }, i + 1);
            }
            issue
        })
        .collect();
    d::JudgeVerdict {
        judge_id,
        model,
        criterion_scores: criterion_scores.into_iter().collect(),
        issues,
        overall_score,
        section_scores,
        usage: usage_from(usage),
        model_record: model_record.map(|r| model_record_from(Some(r))),
        unknown_section_issues,
    }
}

pub fn verdict_to(x: &d::JudgeVerdict) -> pb::JudgeVerdict {
    pb::JudgeVerdict {
        judge_id: x.judge_id.clone(),
        model: x.model.clone(),
        criterion_scores: x.criterion_scores.iter().map(|(k, v)| (k.clone(), *v)).collect(),
        issues: x.issues.iter().map(issue_to).collect(),
        overall_score: x.overall_score,
        section_scores: x
            .section_scores
            .iter()
            .map(|s| pb::SectionScore {
                section_id: s.section_id.clone(),
                criterion: s.criterion.clone(),
                score: s.score,
            })
            .collect(),
        usage: Some(usage_to(&x.usage)),
        model_record: x.model_record.as_ref().map(model_record_to),
        unknown_section_issues: x.unknown_section_issues,
    }
}
