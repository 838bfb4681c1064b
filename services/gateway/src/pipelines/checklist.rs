//! Where a checklist pipeline's checklists come from: an explicit checklist, one generated per
//! distinct input by an instance preset, or one generated from a corpus; then the optional refiner
//! chain. Parsed once from the pipeline request; produced with stage progress relayed as run
//! events and each checklist checkpointed, so a resumed run scores against exactly the same ones.

use std::collections::HashMap;
use std::sync::Arc;

use assay_domain::generator::{Candidate, CorpusRequest, GenerateRequest, Preset};
use assay_domain::limits::{MAX_ID_BYTES, MAX_TEXT_BYTES};
use assay_domain::refiners::{ActionKind, RefinerStep, StepReport};
use assay_domain::{Checklist, ModelSpec, StageError, Violations};
use assay_proto::common::v1 as pb;
use assay_proto::convert;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::checklist_source::Source;
use assay_proto::gateway::v1::run_event::Event;
use assay_proto::refiners::v1 as ref_pb;
use futures::StreamExt;
use sha2::Digest;

use super::stages::Stages;
use assay_runs::{RunCtx, Writes};

/// One record of a checklist pipeline.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EvalRecord {
    pub id: String,
    pub input: String,
    pub target: String,
    pub reference: String,
    pub history: String,
    /// Contrastive candidates (rlcf_candidate, openrubrics_*: chosen first, rejected second).
    pub candidates: Vec<String>,
}

impl EvalRecord {
    /// A wire record, its texts checked (fields named `{field}.*`).
    pub fn parse(r: gw::EvalRecord, field: &str, v: &mut Violations) -> Self {
        let gw::EvalRecord { id, input, target, reference, history, candidates } = r;
        if id.len() > MAX_ID_BYTES {
            v.push(format!("{field}.id"), format!("is {} bytes; the limit is {MAX_ID_BYTES} bytes", id.len()));
        }
        for (name, text) in [("input", &input), ("target", &target), ("reference", &reference), ("history", &history)] {
            if text.len() > MAX_TEXT_BYTES {
                v.push(
                    format!("{field}.{name}"),
                    format!("is {} bytes; the limit is {MAX_TEXT_BYTES} bytes", text.len()),
                );
            }
        }
        EvalRecord {
            id,
            input,
            target,
            reference,
            history,
            candidates: candidates.into_iter().map(|c| c.text).collect(),
        }
    }

    /// The record's id, else its index.
    pub fn id_or(&self, index: usize) -> String {
        if self.id.is_empty() { index.to_string() } else { self.id.clone() }
    }
}

/// The checklist source.
#[derive(Debug, Clone, PartialEq)]
pub enum ChecklistSource {
    Explicit(Checklist),
    Preset(Preset),
    Corpus(Box<CorpusRequest>),
}

/// How a pipeline gets its checklists.
#[derive(Debug, Clone, PartialEq)]
pub struct ChecklistPlan {
    pub source: ChecklistSource,
    pub generator_model: ModelSpec,
    pub max_items: Option<u32>,
    /// Refiner chain applied to every checklist.
    pub refiners: Vec<RefinerStep>,
    /// Models that write candidates for the presets that need them, when a record brings none.
    pub candidate_models: Vec<ModelSpec>,
}

/// Whether a preset can generate its candidates from candidate models.
fn req_uses_candidate_models(preset: Preset) -> bool {
    preset.candidate_source() == assay_domain::generator::CandidateSource::PassedOrGenerated
}

/// The checklists of a run: per record the index of its checklist, and per checklist why it could
/// not be produced.
pub struct Produced {
    pub checklists: Vec<Checklist>,
    pub record_checklist: Vec<usize>,
    pub failures: Vec<Option<StageError>>,
}

impl ChecklistPlan {
    /// Parse the source, generation settings and refiner chain of a pipeline, checked with the
    /// stages' own rules (fields named `pipeline.*`), so a bad request fails before a run exists.
    pub fn parse(
        source: Option<gw::ChecklistSource>,
        generator_model: Option<pb::ModelSpec>,
        max_items: Option<u32>,
        refiners: Vec<ref_pb::RefinerStep>,
        candidate_models: Vec<pb::ModelSpec>,
        v: &mut Violations,
    ) -> Option<Self> {
        let source = match source.and_then(|s| s.source) {
            Some(Source::Checklist(c)) => {
                Some(ChecklistSource::Explicit(convert::checklist(Some(c), "pipeline.source.checklist", v)))
            }
            Some(Source::Preset(p)) => match convert::generator::preset_from(p, "pipeline.source.preset") {
                Ok(p) => Some(ChecklistSource::Preset(p)),
                Err(f) => {
                    v.push(f.field, f.description);
                    None
                }
            },
            Some(Source::Corpus(c)) => {
                match convert::generator::corpus_request(c).and_then(|r| r.validate().map(|()| r)) {
                    Ok(r) => Some(ChecklistSource::Corpus(Box::new(r))),
                    Err(e) => {
                        push_renamed(e, v, |f| format!("pipeline.source.corpus.{f}"));
                        None
                    }
                }
            }
            None => {
                v.push("pipeline.source", "is required (a preset, a checklist or a corpus)");
                None
            }
        };
        let steps = parse_refiners(refiners, v);
        if max_items.is_some_and(|m| m == 0 || m > 500) {
            v.push("pipeline.max_items", "must be between 1 and 500");
        }
        let generator_model = convert::model_spec(generator_model, "pipeline.generator_model", v);
        let candidate_models: Vec<ModelSpec> = candidate_models
            .into_iter()
            .enumerate()
            .map(|(i, m)| convert::model_spec(Some(m), &format!("pipeline.candidate_models[{i}]"), v))
            .collect();
        Some(ChecklistPlan { source: source?, generator_model, max_items, refiners: steps, candidate_models })
    }

    /// The `source_method` the plan's checklists carry (the preset's name; an explicit checklist's
    /// own), which picks the scorer's defaults.
    pub fn source_method(&self) -> &str {
        match &self.source {
            ChecklistSource::Preset(p) => p.name(),
            ChecklistSource::Corpus(c) => c.preset.name(),
            ChecklistSource::Explicit(c) => &c.source_method,
        }
    }

    pub fn preset(&self) -> Option<Preset> {
        match &self.source {
            ChecklistSource::Preset(p) => Some(*p),
            ChecklistSource::Explicit(_) | ChecklistSource::Corpus(_) => None,
        }
    }

    /// Whether checklists need stage calls (generation or refinement) before scoring.
    pub fn needs_stages(&self) -> bool {
        !matches!(self.source, ChecklistSource::Explicit(_)) || !self.refiners.is_empty()
    }

    /// The generation request for a record under a preset.
    pub fn generate_request(&self, preset: Preset, r: &EvalRecord) -> GenerateRequest {
        let mut req = GenerateRequest::new(preset, r.input.clone());
        req.reference = r.reference.clone();
        req.history = r.history.clone();
        req.max_items = self.max_items;
        req.model = self.generator_model.clone();
        if req_uses_candidate_models(preset) {
            req.candidate_models.clone_from(&self.candidate_models);
        }
        match preset {
            Preset::OpenRubricsPairwise => {
                req.chosen = r.candidates.first().cloned().unwrap_or_default();
                req.rejected = r.candidates.get(1).cloned().unwrap_or_default();
            }
            Preset::Tick
            | Preset::RocketEval
            | Preset::RlcfDirect
            | Preset::RlcfCandidate
            | Preset::RlcfCandidatesOnly
            | Preset::OpenRubricsListwise => {
                req.candidates = r
                    .candidates
                    .iter()
                    .enumerate()
                    .map(|(i, t)| Candidate { id: i.to_string(), text: t.clone(), model: String::new() })
                    .collect();
            }
        }
        req
    }

    /// Every record's generation request checked up front (fields named `{records}[i].*`).
    pub fn validate_generation(
        &self,
        records: &[EvalRecord],
        record_field: impl Fn(usize) -> String,
    ) -> Vec<(String, String)> {
        let Some(preset) = self.preset() else { return Vec::new() };
        let mut out = Vec::new();
        for (i, r) in records.iter().enumerate() {
            if let Err(StageError::InvalidArgument(vs)) = self.generate_request(preset, r).validate() {
                for f in vs {
                    out.push((generation_field(&f.field, &record_field(i)), f.description));
                }
            }
        }
        out
    }

    /// Key of the checklist a record is scored against.
    pub fn key(&self, r: &EvalRecord) -> String {
        match &self.source {
            ChecklistSource::Preset(_) => {
                let mut h = sha2::Sha256::new();
                for part in [&r.input, &r.reference, &r.history] {
                    h.update((part.len() as u64).to_le_bytes());
                    h.update(part.as_bytes());
                }
                for c in &r.candidates {
                    h.update((c.len() as u64).to_le_bytes());
                    h.update(c.as_bytes());
                }
                format!("gen:{}", hex::encode(h.finalize()))
            }
            ChecklistSource::Corpus(_) => "corpus".to_string(),
            ChecklistSource::Explicit(_) => "explicit".to_string(),
        }
    }

    /// The run's checklists: one per distinct generation input with a preset, else one. Stored
    /// ones are reused; missing ones are produced concurrently (`concurrency`). A transient stage
    /// failure for one of several inputs fails only that input's records; bad input or a rejected
    /// request fails the run.
    pub async fn produce_all(
        &self,
        ctx: &RunCtx,
        stages: &Stages,
        records: &[EvalRecord],
    ) -> Result<Produced, StageError> {
        let (mut production, mut producing) = self.production(ctx, stages, records, None).await?;
        loop {
            // Cancel drops the productions in flight (their stage calls with them).
            let next = tokio::select! {
                next = producing.next() => next,
                () = ctx.gate.cancelled() => return Err(StageError::Cancelled("the run was cancelled".into())),
            };
            let Some((k, out)) = next else { break };
            production.accept(ctx, k, out).await?;
        }
        drop(producing);
        Ok(production.into_produced())
    }

    /// Start producing the run's checklists: what is known at once (which checklist each record
    /// needs, the stored ones) and the stream of the missing ones as they finish, each to be
    /// handed to [`Production::accept`]. The stream is cancel-safe to poll in a `select!`. With
    /// `lookahead`, each generation first takes one of its permits (the caller gives them back as
    /// records finish), so generation runs only so far ahead of scoring.
    pub async fn production<'a>(
        &'a self,
        ctx: &'a RunCtx,
        stages: &'a Stages,
        records: &'a [EvalRecord],
        lookahead: Option<Arc<tokio::sync::Semaphore>>,
    ) -> Result<(Production, ProductionStream<'a>), StageError> {
        let mut keys: Vec<String> = Vec::new();
        let mut index: HashMap<String, usize> = HashMap::new();
        let mut record_checklist = Vec::with_capacity(records.len());
        for r in records {
            let key = self.key(r);
            let k = *index.entry(key.clone()).or_insert_with(|| {
                keys.push(key);
                keys.len() - 1
            });
            record_checklist.push(k);
        }
        let mut found: Vec<Option<Checklist>> = vec![None; keys.len()];
        for (key, c) in ctx.checkpoints.all::<pb::Checklist>(CHECKLIST).await? {
            if let Some(&k) = key.strip_prefix(CHECKLIST).and_then(|key| index.get(key)) {
                found[k] = Some(decode_checklist(c)?);
            }
        }
        let missing: Vec<usize> = (0..keys.len()).filter(|k| found[*k].is_none()).collect();
        let firsts: Vec<usize> =
            missing.iter().map(|k| record_checklist.iter().position(|x| x == k).unwrap_or(0)).collect();
        let producing = futures::stream::iter(missing.into_iter().zip(firsts))
            .map(move |(k, first)| {
                let lookahead = lookahead.clone();
                async move {
                    if let Some(l) = &lookahead
                        && let Ok(permit) = l.acquire().await
                    {
                        permit.forget();
                    }
                    let out = match ctx.gate.wait().await {
                        Ok(()) => self.produce(ctx, stages, &records[first], first).await,
                        Err(e) => Err(e),
                    };
                    (k, out)
                }
            })
            .buffer_unordered(stages.concurrency)
            .boxed();
        let failures = vec![None; keys.len()];
        Ok((Production { keys, record_checklist, found, failures }, producing))
    }

    /// Produce one checklist (generate or take the given one), then run the refiner chain on it.
    pub async fn produce(
        &self,
        ctx: &RunCtx,
        stages: &Stages,
        record: &EvalRecord,
        index: usize,
    ) -> Result<Checklist, StageError> {
        let mut checklist = match &self.source {
            ChecklistSource::Preset(preset) => {
                let generator = stages.generator()?;
                let request = self.generate_request(*preset, record);
                let out = super::rounds::in_rounds("generate", || generator.generate(request.clone()))
                    .await
                    .map_err(|e| e.map_fields(|f| generation_field(&f, &format!("pipeline.records[{index}]"))))?;
                ctx.spending.add_usage(&out.usage);
                ctx.progress.add_model(&out.model);
                out.checklist
            }
            ChecklistSource::Corpus(request) => {
                let generator = stages.generator()?;
                let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
                let sink = move |p| {
                    let _ = tx.send(convert::generator::progress_to(&p));
                };
                let out = ctx
                    .progress
                    .relay("generator", &mut rx, generator.generate_corpus((**request).clone(), &sink))
                    .await?
                    .map_err(|e| e.map_fields(|f| format!("pipeline.source.corpus.{f}")))?;
                ctx.spending.add_usage(&out.usage);
                ctx.progress.add_model(&out.model);
                out.checklist
            }
            ChecklistSource::Explicit(c) => {
                let mut c = c.clone();
                if c.id.is_empty() {
                    c.id = format!("checklist-{}", uuid::Uuid::now_v7());
                }
                if c.source_method.is_empty() {
                    c.source_method = "explicit".into();
                }
                c
            }
        };
        if self.refiners.is_empty() {
            return Ok(checklist);
        }
        let refiners = stages.refiners()?;
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let sink = move |s: StepReport| {
            let _ = tx.send(step_progress(&s));
        };
        let out = ctx
            .progress
            .relay("refiners", &mut rx, refiners.refine(checklist.items.clone(), self.refiners.clone(), &sink))
            .await?
            .map_err(|e| {
                e.map_fields(|f| match f.strip_prefix("steps") {
                    Some(rest) => format!("pipeline.refiners{rest}"),
                    None => format!("pipeline.refiners.{f}"),
                })
            })?;
        ctx.spending.add_usage(&out.usage);
        if out.items.is_empty() {
            let removed: Vec<String> = out
                .actions
                .iter()
                .filter(|a| a.kind != ActionKind::Kept)
                .take(3)
                .map(|a| format!("{} {}: {}", a.refiner, a.item_id, a.reason))
                .collect();
            return Err(StageError::Unavailable(format!(
                "the refiner chain removed every one of the {} items of checklist {} (first: {})",
                checklist.items.len(),
                checklist.id,
                removed.join("; ")
            )));
        }
        checklist.items = out.items;
        checklist
            .metadata
            .insert("refiners".into(), self.refiners.iter().map(RefinerStep::refiner).collect::<Vec<_>>().join(","));
        Ok(checklist)
    }
}

/// Checklists finishing, by index, with their outcome.
pub type ProductionStream<'a> = futures::stream::BoxStream<'a, (usize, Result<Checklist, StageError>)>;

/// A run's checklists while they are produced.
pub struct Production {
    keys: Vec<String>,
    /// Per record, the index of its checklist.
    pub record_checklist: Vec<usize>,
    /// Per checklist, the checklist once produced (or stored).
    pub found: Vec<Option<Checklist>>,
    /// Per checklist, why it could not be produced.
    pub failures: Vec<Option<StageError>>,
}

impl Production {
    /// How many checklists the run needs.
    pub fn checklist_count(&self) -> usize {
        self.keys.len()
    }

    /// Take a finished production: checkpoint it and say so (`ChecklistReady`), or note why it
    /// failed. A transient failure of one of several checklists fails only its records; bad input,
    /// a rejected request or the only checklist failing fails the run.
    pub async fn accept(
        &mut self,
        ctx: &RunCtx,
        k: usize,
        out: Result<Checklist, StageError>,
    ) -> Result<(), StageError> {
        let mut writes = Writes::default();
        self.accept_queued(ctx, k, out, &mut writes)?;
        writes.flush().await
    }

    /// [`Production::accept`] without waiting for the checkpoint and the event to be stored: they
    /// are queued (in order) into `writes`.
    pub fn accept_queued(
        &mut self,
        ctx: &RunCtx,
        k: usize,
        out: Result<Checklist, StageError>,
        writes: &mut Writes,
    ) -> Result<(), StageError> {
        let checklist = match out {
            Ok(c) => c,
            Err(
                e @ (StageError::InvalidArgument(_)
                | StageError::FailedPrecondition(_)
                | StageError::Unimplemented(_)
                | StageError::Cancelled(_)),
            ) => return Err(e),
            Err(e) if self.keys.len() == 1 => return Err(e),
            Err(e) => {
                tracing::warn!(run_id = %ctx.run_id(), error = %e, "checklist generation failed for one input");
                self.failures[k] = Some(e);
                return Ok(());
            }
        };
        let wire = (!ctx.is_ephemeral()).then(|| convert::checklist_to(&checklist));
        self.found[k] = Some(checklist);
        // A run kept in memory is never resumed nor watched.
        let Some(wire) = wire else { return Ok(()) };
        writes.push(ctx.checkpoints.queued(&format!("{CHECKLIST}{}", self.keys[k]), &wire));
        let indices =
            self.record_checklist.iter().enumerate().filter(|(_, x)| **x == k).map(|(i, _)| i as u32).collect();
        writes.push(
            ctx.log.emit_queued(Event::ChecklistReady(gw::ChecklistReady {
                checklist: Some(wire),
                record_indices: indices,
            })),
        );
        Ok(())
    }

    /// The run's checklists once every production is accepted.
    pub fn into_produced(self) -> Produced {
        Produced {
            checklists: self.found.into_iter().map(Option::unwrap_or_default).collect(),
            record_checklist: self.record_checklist,
            failures: self.failures,
        }
    }
}

/// A generation request's field as the pipeline's: settings shared by every record are the
/// pipeline's (`pipeline.generator_model.backend`), the rest the record's (`{record}.input`).
fn generation_field(field: &str, record: &str) -> String {
    match field {
        "preset" => "pipeline.source.preset".to_string(),
        "max_items" => "pipeline.max_items".to_string(),
        f if f == "model" || f.starts_with("model.") => format!("pipeline.generator_{f}"),
        "chosen" | "rejected" => format!("{record}.candidates"),
        f if f.starts_with("candidate_models") => format!("pipeline.{f}"),
        other => format!("{record}.{other}"),
    }
}

/// Checkpoint key prefix of the run's checklists.
pub const CHECKLIST: &str = "checklist:";

/// A finished refiner step as progress: items in (total) and out (done), and what happened.
fn step_progress(s: &StepReport) -> pb::Progress {
    let changed = s.actions.iter().filter(|a| a.kind != ActionKind::Kept).count();
    pb::Progress {
        stage: s.refiner.clone(),
        message: format!("{} items in, {} out ({changed} removed, merged or failed)", s.items_in, s.items_out),
        done: s.items_out,
        total: s.items_in,
    }
}

/// A stored wire checklist as a domain one (validated).
pub fn decode_checklist(c: pb::Checklist) -> Result<Checklist, StageError> {
    let mut v = Violations::new();
    let c = convert::checklist(Some(c), "checklist", &mut v);
    v.into_result().map(|()| c)
}

fn push_renamed(e: StageError, v: &mut Violations, rename: impl Fn(&str) -> String) {
    if let StageError::InvalidArgument(vs) = e {
        for f in vs {
            v.push(rename(&f.field), f.description);
        }
    }
}

/// The refiner chain, converted and checked step by step with the refiners' own rules (fields
/// named `pipeline.refiners[i].*`), so every bad step is reported at once.
fn parse_refiners(steps: Vec<ref_pb::RefinerStep>, v: &mut Violations) -> Vec<RefinerStep> {
    let mut out = Vec::with_capacity(steps.len());
    for (i, step) in steps.into_iter().enumerate() {
        if step.step.is_none() {
            v.push(format!("pipeline.refiners[{i}]"), "must set one of deduplicate, tag, unit_test or select");
            continue;
        }
        let request = ref_pb::RefineChecklistRequest { items: Vec::new(), steps: vec![step] };
        let checked = convert::refiners::refine_checklist_request(request, "")
            .and_then(|(_, steps)| assay_domain::refiners::validate_steps(&steps).map(|()| steps));
        match checked {
            Ok(steps) => out.extend(steps),
            Err(e) => push_renamed(e, v, |f| match f.strip_prefix("steps[0]") {
                Some(rest) => format!("pipeline.refiners[{i}]{rest}"),
                None => format!("pipeline.refiners[{i}].{f}"),
            }),
        }
    }
    out
}
