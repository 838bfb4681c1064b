//! Wire <-> domain conversions of the refiners' messages. Wire -> domain collects every invalid
//! field into [`Violations`] with its full path (range checks on options are the core's, so the
//! library and the wire give the same errors); domain -> wire is infallible.

use assay_domain::refiners::{
    ActionKind, ChainOutcome, CoverageEntry, DedupOptions, ItemEnforceability, ItemTag, RefinerAction, RefinerStep,
    Sample, SelectOptions, StepOutcome, StepReport, TagOptions, UnitTestOptions,
};
use assay_domain::{Answer, ChecklistItem, StageError, Violations};

use crate::common::v1 as common;
use crate::convert::{checklist_item, checklist_item_to, model_spec, model_spec_to, usage_from, usage_to};
use crate::refiners::v1 as pb;
use crate::refiners::v1::refiner_step::Step;

fn join(prefix: &str, field: &str) -> String {
    if prefix.is_empty() { field.to_string() } else { format!("{prefix}.{field}") }
}

/// Items from the wire; an empty id becomes its 1-based position (as for checklists).
pub fn items(p: Vec<common::ChecklistItem>, field: &str, v: &mut Violations) -> Vec<ChecklistItem> {
    p.into_iter()
        .enumerate()
        .map(|(i, it)| {
            let mut item = checklist_item(it, &format!("{field}[{i}]"), v);
            if item.id.is_empty() {
                item.id = (i + 1).to_string();
            }
            item
        })
        .collect()
}

fn dedup_options(
    p: pb::DeduplicateRequest,
    prefix: &str,
    v: &mut Violations,
) -> (Vec<common::ChecklistItem>, DedupOptions) {
    let pb::DeduplicateRequest { items, threshold, model, embedding_model } = p;
    let options = DedupOptions {
        threshold,
        model: model_spec(model, &join(prefix, "model"), v),
        embedding_model: model_spec(embedding_model, &join(prefix, "embedding_model"), v),
    };
    (items, options)
}

fn tag_options(p: pb::TagRequest, prefix: &str, v: &mut Violations) -> (Vec<common::ChecklistItem>, TagOptions) {
    let pb::TagRequest { items, model, concurrency } = p;
    (items, TagOptions { model: model_spec(model, &join(prefix, "model"), v), concurrency: concurrency as usize })
}

fn answer(value: i32, field: String, v: &mut Violations) -> Option<Answer> {
    match common::Answer::try_from(value) {
        Ok(common::Answer::Yes) => Some(Answer::Yes),
        Ok(common::Answer::No) => Some(Answer::No),
        Ok(common::Answer::Unspecified) | Err(_) => {
            v.push(field, format!("must be ANSWER_YES or ANSWER_NO (got {value})"));
            None
        }
    }
}

fn unit_test_options(
    p: pb::UnitTestRequest,
    prefix: &str,
    v: &mut Violations,
) -> (Vec<common::ChecklistItem>, UnitTestOptions) {
    let pb::UnitTestRequest { items, samples, input, threshold, max_samples, seed, model, concurrency } = p;
    let samples_field = join(prefix, "samples");
    let samples = samples
        .into_iter()
        .enumerate()
        .map(|(i, s)| {
            let pb::Sample { id, text, answers } = s;
            let mut answers: Vec<(String, i32)> = answers.into_iter().collect();
            answers.sort();
            let answers = answers
                .into_iter()
                .filter_map(|(item_id, a)| {
                    let f = format!("{samples_field}[{i}].answers[{item_id:?}]");
                    answer(a, f, v).map(|a| (item_id, a))
                })
                .collect();
            Sample { id: if id.is_empty() { (i + 1).to_string() } else { id }, text, answers }
        })
        .collect();
    let options = UnitTestOptions {
        samples,
        input,
        threshold,
        max_samples,
        seed,
        model: model_spec(model, &join(prefix, "model"), v),
        concurrency: concurrency as usize,
    };
    (items, options)
}

fn select_options(
    p: pb::SelectRequest,
    prefix: &str,
    v: &mut Violations,
) -> (Vec<common::ChecklistItem>, SelectOptions) {
    let pb::SelectRequest { items, max_questions, beam_width, length_penalty, alpha, coverage, embedding_model } = p;
    let options = SelectOptions {
        max_questions,
        beam_width,
        length_penalty,
        alpha,
        coverage: coverage
            .into_iter()
            .map(|c| {
                let pb::CoverageEntry { observation, item_ids } = c;
                CoverageEntry { observation, item_ids }
            })
            .collect(),
        embedding_model: model_spec(embedding_model, &join(prefix, "embedding_model"), v),
    };
    (items, options)
}

/// Deduplicate request -> (items, options).
pub fn deduplicate_request(p: pb::DeduplicateRequest) -> Result<(Vec<ChecklistItem>, DedupOptions), StageError> {
    let mut v = Violations::new();
    let (wire_items, options) = dedup_options(p, "", &mut v);
    let items = items(wire_items, "items", &mut v);
    v.into_result()?;
    Ok((items, options))
}

/// Tag request -> (items, options).
pub fn tag_request(p: pb::TagRequest) -> Result<(Vec<ChecklistItem>, TagOptions), StageError> {
    let mut v = Violations::new();
    let (wire_items, options) = tag_options(p, "", &mut v);
    let items = items(wire_items, "items", &mut v);
    v.into_result()?;
    Ok((items, options))
}

/// UnitTest request -> (items, options).
pub fn unit_test_request(p: pb::UnitTestRequest) -> Result<(Vec<ChecklistItem>, UnitTestOptions), StageError> {
    let mut v = Violations::new();
    let (wire_items, options) = unit_test_options(p, "", &mut v);
    let items = items(wire_items, "items", &mut v);
    v.into_result()?;
    Ok((items, options))
}

/// Select request -> (items, options).
pub fn select_request(p: pb::SelectRequest) -> Result<(Vec<ChecklistItem>, SelectOptions), StageError> {
    let mut v = Violations::new();
    let (wire_items, options) = select_options(p, "", &mut v);
    let items = items(wire_items, "items", &mut v);
    v.into_result()?;
    Ok((items, options))
}

/// Chain request -> (items, steps); field paths relative to `prefix`. Each step's own `items`
/// field is ignored (the chain feeds it).
pub fn refine_checklist_request(
    p: pb::RefineChecklistRequest,
    prefix: &str,
) -> Result<(Vec<ChecklistItem>, Vec<RefinerStep>), StageError> {
    let pb::RefineChecklistRequest { items: wire_items, steps } = p;
    let mut v = Violations::new();
    let items = items(wire_items, &join(prefix, "items"), &mut v);
    let steps = steps
        .into_iter()
        .enumerate()
        .filter_map(|(i, s)| {
            let field = join(prefix, &format!("steps[{i}]"));
            match s.step {
                Some(Step::Deduplicate(r)) => {
                    Some(RefinerStep::Deduplicate(dedup_options(r, &format!("{field}.deduplicate"), &mut v).1))
                }
                Some(Step::Tag(r)) => Some(RefinerStep::Tag(tag_options(r, &format!("{field}.tag"), &mut v).1)),
                Some(Step::UnitTest(r)) => {
                    Some(RefinerStep::UnitTest(unit_test_options(r, &format!("{field}.unit_test"), &mut v).1))
                }
                Some(Step::Select(r)) => {
                    Some(RefinerStep::Select(select_options(r, &format!("{field}.select"), &mut v).1))
                }
                None => {
                    v.push(field, "is required: set one of deduplicate, tag, unit_test, select");
                    None
                }
            }
        })
        .collect();
    v.into_result()?;
    Ok((items, steps))
}

pub fn action_kind_to(k: ActionKind) -> pb::ActionKind {
    match k {
        ActionKind::Kept => pb::ActionKind::Kept,
        ActionKind::Removed => pb::ActionKind::Removed,
        ActionKind::Merged => pb::ActionKind::Merged,
        ActionKind::Error => pb::ActionKind::Error,
    }
}

pub fn action_to(a: &RefinerAction) -> pb::RefinerAction {
    pb::RefinerAction {
        refiner: a.refiner.clone(),
        item_id: a.item_id.clone(),
        kind: action_kind_to(a.kind) as i32,
        reason: a.reason.clone(),
        result_item_id: a.result_item_id.clone(),
    }
}

fn actions_to(actions: &[RefinerAction]) -> Vec<pb::RefinerAction> {
    actions.iter().map(action_to).collect()
}

fn items_to(items: &[ChecklistItem]) -> Vec<common::ChecklistItem> {
    items.iter().map(checklist_item_to).collect()
}

pub fn tag_to(t: &ItemTag) -> pb::ItemTag {
    pb::ItemTag {
        item_id: t.item_id.clone(),
        generally_applicable: t.generally_applicable,
        section_specific: t.section_specific,
        reasoning: t.reasoning.clone(),
        error: t.error.clone().unwrap_or_default(),
    }
}

pub fn enforceability_to(e: &ItemEnforceability) -> pb::ItemEnforceability {
    pb::ItemEnforceability {
        item_id: e.item_id.clone(),
        samples: e.samples,
        correct_failures: e.correct_failures,
        rate: e.rate,
        kept: e.kept,
        unchecked: e.unchecked,
    }
}

pub fn deduplicate_response_to(o: &StepOutcome) -> pb::DeduplicateResponse {
    pb::DeduplicateResponse {
        items: items_to(&o.items),
        actions: actions_to(&o.actions),
        clusters_merged: o.clusters_merged,
        usage: Some(usage_to(&o.usage)),
    }
}

pub fn tag_response_to(o: &StepOutcome) -> pb::TagResponse {
    pb::TagResponse {
        items: items_to(&o.items),
        tags: o.tags.iter().map(tag_to).collect(),
        actions: actions_to(&o.actions),
        parse_failures: o.parse_failures,
        usage: Some(usage_to(&o.usage)),
    }
}

pub fn unit_test_response_to(o: &StepOutcome) -> pb::UnitTestResponse {
    pb::UnitTestResponse {
        items: items_to(&o.items),
        results: o.enforceability.iter().map(enforceability_to).collect(),
        actions: actions_to(&o.actions),
        usage: Some(usage_to(&o.usage)),
    }
}

pub fn select_response_to(o: &StepOutcome) -> pb::SelectResponse {
    pb::SelectResponse {
        items: items_to(&o.items),
        diversity: o.diversity,
        coverage: o.coverage,
        score: o.score,
        passthrough: o.passthrough,
        actions: actions_to(&o.actions),
        usage: Some(usage_to(&o.usage)),
    }
}

pub fn refine_checklist_response_to(o: &ChainOutcome) -> pb::RefineChecklistResponse {
    pb::RefineChecklistResponse {
        items: items_to(&o.items),
        actions: actions_to(&o.actions),
        usage: Some(usage_to(&o.usage)),
    }
}

pub fn step_completed_to(r: &StepReport) -> pb::StepCompleted {
    pb::StepCompleted {
        refiner: r.refiner.clone(),
        items_in: r.items_in,
        items_out: r.items_out,
        actions: actions_to(&r.actions),
    }
}

fn answer_to(a: Answer) -> common::Answer {
    match a {
        Answer::Yes => common::Answer::Yes,
        Answer::No => common::Answer::No,
    }
}

/// A domain step as a wire step (its own `items` empty: the chain feeds it).
pub fn refiner_step_to(s: &RefinerStep) -> pb::RefinerStep {
    let step = match s {
        RefinerStep::Deduplicate(o) => Step::Deduplicate(pb::DeduplicateRequest {
            items: Vec::new(),
            threshold: o.threshold,
            model: Some(model_spec_to(&o.model)),
            embedding_model: Some(model_spec_to(&o.embedding_model)),
        }),
        RefinerStep::Tag(o) => Step::Tag(pb::TagRequest {
            items: Vec::new(),
            model: Some(model_spec_to(&o.model)),
            concurrency: o.concurrency as u32,
        }),
        RefinerStep::UnitTest(o) => Step::UnitTest(pb::UnitTestRequest {
            items: Vec::new(),
            samples: o
                .samples
                .iter()
                .map(|s| pb::Sample {
                    id: s.id.clone(),
                    text: s.text.clone(),
                    answers: s.answers.iter().map(|(k, a)| (k.clone(), answer_to(*a) as i32)).collect(),
                })
                .collect(),
            input: o.input.clone(),
            threshold: o.threshold,
            max_samples: o.max_samples,
            seed: o.seed,
            model: Some(model_spec_to(&o.model)),
            concurrency: o.concurrency as u32,
        }),
        RefinerStep::Select(o) => Step::Select(pb::SelectRequest {
            items: Vec::new(),
            max_questions: o.max_questions,
            beam_width: o.beam_width,
            length_penalty: o.length_penalty,
            alpha: o.alpha,
            coverage: o
                .coverage
                .iter()
                .map(|c| pb::CoverageEntry { observation: c.observation.clone(), item_ids: c.item_ids.clone() })
                .collect(),
            embedding_model: Some(model_spec_to(&o.embedding_model)),
        }),
    };
    pb::RefinerStep { step: Some(step) }
}

/// A chain as a wire request.
pub fn refine_checklist_request_to(items: &[ChecklistItem], steps: &[RefinerStep]) -> pb::RefineChecklistRequest {
    pb::RefineChecklistRequest { items: items_to(items), steps: steps.iter().map(refiner_step_to).collect() }
}

fn action_kind_from(value: i32) -> ActionKind {
    match pb::ActionKind::try_from(value) {
        Ok(pb::ActionKind::Kept) => ActionKind::Kept,
        Ok(pb::ActionKind::Removed) => ActionKind::Removed,
        Ok(pb::ActionKind::Merged) => ActionKind::Merged,
        Ok(pb::ActionKind::Error | pb::ActionKind::Unspecified) | Err(_) => ActionKind::Error,
    }
}

fn actions_from(p: Vec<pb::RefinerAction>) -> Vec<RefinerAction> {
    p.into_iter()
        .map(|a| {
            let pb::RefinerAction { refiner, item_id, kind, reason, result_item_id } = a;
            RefinerAction { refiner, item_id, kind: action_kind_from(kind), reason, result_item_id }
        })
        .collect()
}

/// Items a stage returned (validated as any wire checklist's items).
fn items_from(p: Vec<common::ChecklistItem>, field: &str) -> Result<Vec<ChecklistItem>, StageError> {
    let mut v = Violations::new();
    let items = items(p, field, &mut v);
    v.into_result().map_err(|e| StageError::Unavailable(format!("the refiners returned invalid items: {e}")))?;
    Ok(items)
}

/// A chain's wire result as the domain outcome (step reports arrive as their own events).
pub fn refine_checklist_response_from(p: pb::RefineChecklistResponse) -> Result<ChainOutcome, StageError> {
    let pb::RefineChecklistResponse { items, actions, usage } = p;
    Ok(ChainOutcome {
        items: items_from(items, "items")?,
        actions: actions_from(actions),
        steps: Vec::new(),
        usage: usage_from(usage),
    })
}

/// A finished step as the domain report (usage is reported once, with the chain's result).
pub fn step_completed_from(p: pb::StepCompleted) -> StepReport {
    let pb::StepCompleted { refiner, items_in, items_out, actions } = p;
    StepReport { refiner, items_in, items_out, actions: actions_from(actions), usage: Default::default() }
}

// ---- Content refiners (Patch, ExpandSection) ----

pub use assay_domain::content::{MAX_CONSTRAINTS, MAX_EDIT_ISSUES, MAX_INSTRUCTION_BYTES};
use assay_domain::content::{MAX_TARGET_WORDS, SectionEdit, SectionEditRequest};
use assay_domain::limits::{MAX_ID_BYTES, MAX_TEXT_BYTES};

fn edit_section(
    p: Option<common::Section>,
    field: &str,
    required: bool,
    v: &mut Violations,
) -> Option<assay_domain::Section> {
    let Some(p) = p else {
        if required {
            v.push(field, "is required");
        }
        return None;
    };
    let s = crate::convert::document::section(p);
    if s.id.trim().is_empty() || s.id.len() > MAX_ID_BYTES {
        v.push(format!("{field}.id"), format!("must be 1 to {MAX_ID_BYTES} bytes"));
    }
    if s.content.trim().is_empty() {
        v.push(format!("{field}.content"), "must not be empty");
    }
    if s.content.len() > MAX_TEXT_BYTES {
        v.push(
            format!("{field}.content"),
            format!("is {} bytes; the limit is {MAX_TEXT_BYTES} bytes", s.content.len()),
        );
    }
    Some(s)
}

#[allow(clippy::too_many_arguments)]
fn edit_request(
    section: Option<common::Section>,
    issues: Vec<common::JudgeIssue>,
    instruction: String,
    constraints: Vec<String>,
    previous: Option<common::Section>,
    next: Option<common::Section>,
    brief: Option<common::Brief>,
    target_words: u32,
    model: Option<common::ModelSpec>,
) -> Result<SectionEditRequest, StageError> {
    let mut v = Violations::new();
    let section = edit_section(section, "section", true, &mut v).unwrap_or_default();
    let previous = edit_section(previous, "previous", false, &mut v);
    let next = edit_section(next, "next", false, &mut v);
    for (name, anchor) in [("previous", &previous), ("next", &next)] {
        if anchor.as_ref().is_some_and(|a| !a.id.is_empty() && a.id == section.id) {
            v.push(format!("{name}.id"), "must differ from the edited section's id");
        }
    }
    if issues.len() > MAX_EDIT_ISSUES {
        v.push("issues", format!("has {} issues; the limit is {MAX_EDIT_ISSUES}", issues.len()));
    }
    let issues: Vec<_> = issues
        .into_iter()
        .enumerate()
        .map(|(i, x)| crate::convert::document::issue(x, &format!("issues[{i}]"), &mut v))
        .collect();
    if instruction.trim().is_empty() && issues.is_empty() {
        v.push("instruction", "must not be empty when no issues are given: say what to fix");
    }
    if instruction.len() > MAX_INSTRUCTION_BYTES {
        v.push("instruction", format!("is {} bytes; the limit is {MAX_INSTRUCTION_BYTES} bytes", instruction.len()));
    }
    if constraints.len() > MAX_CONSTRAINTS {
        v.push("constraints", format!("has {} constraints; the limit is {MAX_CONSTRAINTS}", constraints.len()));
    }
    for (i, c) in constraints.iter().enumerate() {
        if c.len() > MAX_INSTRUCTION_BYTES {
            v.push(
                format!("constraints[{i}]"),
                format!("is {} bytes; the limit is {MAX_INSTRUCTION_BYTES} bytes", c.len()),
            );
        }
    }
    if target_words > MAX_TARGET_WORDS {
        v.push("target_words", format!("must be at most {MAX_TARGET_WORDS} (got {target_words})"));
    }
    let brief = crate::convert::document::brief(brief, "brief", &mut v);
    let model = model_spec(model, "model", &mut v);
    v.into_result()?;
    Ok(SectionEditRequest { section, issues, instruction, constraints, previous, next, brief, target_words, model })
}

pub fn patch_request(p: pb::PatchRequest) -> Result<SectionEditRequest, StageError> {
    let pb::PatchRequest { section, issues, instruction, constraints, previous, model, next, brief } = p;
    edit_request(section, issues, instruction, constraints, previous, next, brief, 0, model)
}

pub fn expand_request(p: pb::ExpandSectionRequest) -> Result<SectionEditRequest, StageError> {
    let pb::ExpandSectionRequest {
        section,
        issues,
        instruction,
        target_words,
        model,
        previous,
        next,
        brief,
        constraints,
    } = p;
    edit_request(section, issues, instruction, constraints, previous, next, brief, target_words, model)
}

pub fn patch_request_to(r: &SectionEditRequest) -> pb::PatchRequest {
    use crate::convert::document::{brief_to, issue_to, section_to};
    pb::PatchRequest {
        section: Some(section_to(&r.section)),
        issues: r.issues.iter().map(issue_to).collect(),
        instruction: r.instruction.clone(),
        constraints: r.constraints.clone(),
        previous: r.previous.as_ref().map(section_to),
        model: Some(model_spec_to(&r.model)),
        next: r.next.as_ref().map(section_to),
        brief: Some(brief_to(&r.brief)),
    }
}

pub fn expand_request_to(r: &SectionEditRequest) -> pb::ExpandSectionRequest {
    let p = patch_request_to(r);
    pb::ExpandSectionRequest {
        section: p.section,
        issues: p.issues,
        instruction: p.instruction,
        target_words: r.target_words,
        model: p.model,
        previous: p.previous,
        next: p.next,
        brief: p.brief,
        constraints: p.constraints,
    }
}

pub fn patch_response_to(e: &SectionEdit) -> pb::PatchResponse {
    pb::PatchResponse {
        section: e.section.as_ref().map(crate::convert::document::section_to),
        diff_summary: e.diff_summary.clone(),
        usage: Some(usage_to(&e.usage)),
        model: Some(crate::convert::model_record_to(&e.model)),
        rejected_reason: e.rejected_reason.clone(),
    }
}

pub fn expand_response_to(e: &SectionEdit) -> pb::ExpandSectionResponse {
    let p = patch_response_to(e);
    pb::ExpandSectionResponse {
        section: p.section,
        diff_summary: p.diff_summary,
        usage: p.usage,
        model: p.model,
        rejected_reason: p.rejected_reason,
    }
}

pub fn patch_response_from(p: pb::PatchResponse) -> SectionEdit {
    let pb::PatchResponse { section, diff_summary, usage, model, rejected_reason } = p;
    SectionEdit {
        section: section.map(crate::convert::document::section),
        diff_summary,
        rejected_reason,
        usage: usage_from(usage),
        model: crate::convert::model_record_from(model),
    }
}

pub fn expand_response_from(p: pb::ExpandSectionResponse) -> SectionEdit {
    let pb::ExpandSectionResponse { section, diff_summary, usage, model, rejected_reason } = p;
    patch_response_from(pb::PatchResponse { section, diff_summary, usage, model, rejected_reason })
}
