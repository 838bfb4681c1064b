//! Responders of a checklist evaluation (models under test): their checked form, the prompt each
//! sends for a record, and where each scored target comes from. The pipeline's use of them is in
//! `checklist_eval/respond.rs`.

use assay_domain::{ModelSpec, StageError, Usage, Violations};
use assay_proto::convert;
use assay_proto::gateway::v1 as gw;

use super::checklist::EvalRecord;

/// The checklist generator's seed in an evaluation with responders unless the caller sets one.
pub const GENERATION_SEED: u64 = 20_260_326;
/// Responders one evaluation takes at most.
pub const MAX_RESPONDERS: usize = 8;
/// Checkpoint key prefix of a record's responses from one responder (`response:{i:08}:{j}`).
pub(crate) const RESPONSE: &str = "response:";
/// The template when a responder sets none.
const DEFAULT_TEMPLATE: &str = "{input}";

/// A responder, checked.
#[derive(Debug, Clone)]
pub struct Responder {
    pub name: String,
    pub model: ModelSpec,
    pub system_prompt: String,
    pub template: String,
    pub samples: u32,
}

/// What a responder answered to one record (a checkpoint).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub(crate) struct Answered {
    pub(crate) responses: Vec<String>,
    pub(crate) error: String,
    pub(crate) usage: Usage,
}

/// The responders of a request, checked (fields named `pipeline.responders[j].*`), with their
/// names made unique.
pub fn parse(responders: Vec<gw::Responder>, v: &mut Violations) -> Vec<Responder> {
    if responders.len() > MAX_RESPONDERS {
        v.push("pipeline.responders", format!("has {}; the limit is {MAX_RESPONDERS}", responders.len()));
    }
    let mut out: Vec<Responder> = Vec::new();
    for (j, r) in responders.into_iter().enumerate() {
        let f = format!("pipeline.responders[{j}]");
        let model = convert::model_spec(r.model, &format!("{f}.model"), v);
        let limit = assay_domain::limits::MAX_TEMPLATE_BYTES;
        if r.template.len() > limit {
            v.push(format!("{f}.template"), format!("is {} bytes; the limit is {limit} bytes", r.template.len()));
        }
        if r.system_prompt.len() > limit {
            v.push(
                format!("{f}.system_prompt"),
                format!("is {} bytes; the limit is {limit} bytes", r.system_prompt.len()),
            );
        }
        let max = assay_domain::generator::MAX_RESPONSE_SAMPLES;
        if r.samples > max {
            v.push(format!("{f}.samples"), format!("is {}; the limit is {max}", r.samples));
        }
        let base = if !r.name.is_empty() {
            r.name.clone()
        } else {
            model.model.clone().filter(|m| !m.is_empty()).unwrap_or_else(|| format!("responder-{}", j + 1))
        };
        let mut name = base.clone();
        let mut n = 1;
        while out.iter().any(|o| o.name == name) {
            if !r.name.is_empty() {
                v.push(format!("{f}.name"), format!("duplicate name {name:?}"));
                break;
            }
            n += 1;
            name = format!("{base}#{n}");
        }
        let template = if r.template.is_empty() { DEFAULT_TEMPLATE.to_string() } else { r.template };
        out.push(Responder { name, model, system_prompt: r.system_prompt, template, samples: r.samples.max(1) });
    }
    out
}

/// A responder's prompt for a record: its template with the record's fields.
pub(crate) fn render(template: &str, r: &EvalRecord, i: usize) -> String {
    template
        .replace("{input}", &r.input)
        .replace("{id}", &r.id_or(i))
        .replace("{reference}", &r.reference)
        .replace("{history}", &r.history)
}

pub(crate) fn key(i: usize, j: usize) -> String {
    format!("{RESPONSE}{i:08}:{j}")
}

/// One (record, responder)'s answer once asked (or read back); a failure is kept for the pair's
/// other samples, not stored.
pub(crate) type AnswerCell = tokio::sync::OnceCell<Result<Answered, StageError>>;

/// Where each scored target comes from: (record, responder, sample).
pub type Layout = Vec<(usize, usize, u32)>;

/// The targets responders make of `records`, record by record, responder by responder, sample by
/// sample.
pub fn layout(records: usize, responders: &[Responder]) -> Layout {
    let mut out = Vec::new();
    for i in 0..records {
        for (j, r) in responders.iter().enumerate() {
            out.extend((0..r.samples).map(|s| (i, j, s)));
        }
    }
    out
}

/// Responses each record makes: the responders' samples summed.
pub fn per_record(responders: &[Responder]) -> usize {
    responders.iter().map(|r| r.samples as usize).sum()
}

/// Where target `t` comes from, (record, responder, sample): the targets of a record follow each
/// other, responder by responder, sample by sample (as [`layout`] lists them).
pub(crate) fn target_of(t: usize, responders: &[Responder]) -> Option<(usize, usize, u32)> {
    let per = per_record(responders);
    if per == 0 {
        return None;
    }
    let mut k = t % per;
    for (j, r) in responders.iter().enumerate() {
        if k < r.samples as usize {
            return Some((t / per, j, k as u32));
        }
        k -= r.samples as usize;
    }
    None
}

/// Name result `r` (its index a target) by its responder and sample, with the response.
pub(crate) fn label(r: &mut gw::RecordResult, responders: &[Responder], response: Option<&str>) {
    let Some((_, j, s)) = target_of(r.index as usize, responders) else { return };
    r.responder.clone_from(&responders[j].name);
    r.sample = s;
    r.response = response.unwrap_or_default().to_string();
}
