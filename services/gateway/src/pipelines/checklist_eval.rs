//! The `checklist_eval` pipeline: get the checklists (explicit, per distinct input from a preset, or
//! from a corpus; refined when asked), then score every record against its checklist, one
//! checkpoint per record, and aggregate.

use std::collections::HashSet;

use assay_domain::limits::MAX_RECORDS;
use assay_domain::{
    AggregateScores, Checklist, ModelRecord, ModelSpec, ScoreRequest, ScoreTarget, ScorerSettings, StageError, Usage,
    Violations,
};
use assay_proto::convert;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::run_event::Event;

use super::checklist::{ChecklistPlan, EvalRecord};
use super::stages::Stages;
use assay_runs::{Pipeline, RunCtx, RunOutcome};

mod decide;
mod inline;
mod lane;
mod open;
mod respond;
mod results;
mod spread;

pub use results::{complete_paged, list_run_results};

/// A parsed checklist evaluation.
pub struct ChecklistEval {
    plan: ChecklistPlan,
    records: Vec<EvalRecord>,
    /// The caller's scorer settings; the scorer fills unset fields from the defaults of the preset
    /// each checklist comes from.
    scorer: ScorerSettings,
    scorer_model: ModelSpec,
    /// Records scored at once (the caller's cap, else the gateway's).
    concurrency: usize,
    stages: Stages,
    /// An open run: its records are rows of the run store (`records` holds only those that came
    /// with the request, already stored as rows).
    open: bool,
    /// Models under test: each answers every record, and its answers are what is scored.
    responders: Vec<super::responders::Responder>,
    /// Stop once the responders' comparisons are decided (runs with responders).
    stop: Option<decide::Stop>,
}

impl ChecklistEval {
    /// Parse and validate (fields named `pipeline.*`).
    pub fn parse(p: gw::ChecklistEvalPipeline, stages: Stages) -> Result<Self, StageError> {
        Self::parse_as(p, stages, false)
    }

    /// Parse an open run's pipeline: its records may be none (they are appended).
    pub fn parse_open(p: gw::ChecklistEvalPipeline, stages: Stages) -> Result<Self, StageError> {
        Self::parse_as(p, stages, true)
    }

    fn parse_as(p: gw::ChecklistEvalPipeline, stages: Stages, open: bool) -> Result<Self, StageError> {
        let gw::ChecklistEvalPipeline {
            source,
            records,
            scorer,
            generator_model,
            scorer_model,
            max_items,
            refiners,
            concurrency,
            candidate_models,
            responders,
            stop_when_decided,
        } = p;
        let mut v = Violations::new();
        let responders = super::responders::parse(responders, &mut v);
        if concurrency > 256 {
            v.push("pipeline.concurrency", format!("is {concurrency}; the limit is 256"));
        }
        // With responders, checklists are generated with a fixed seed unless the caller set one:
        // a seeded call is cached, so a re-run with one more responder generates nothing again.
        let generator_model = if responders.is_empty() {
            generator_model
        } else {
            let mut m = generator_model.unwrap_or_default();
            m.seed.get_or_insert(super::responders::GENERATION_SEED);
            Some(m)
        };
        let plan = ChecklistPlan::parse(source, generator_model, max_items, refiners, candidate_models, &mut v);
        if records.is_empty() && !open {
            v.push("pipeline.records", "must not be empty");
        }
        if records.len() > MAX_RECORDS {
            v.push(
                "pipeline.records",
                format!(
                    "has {} records; the limit is {MAX_RECORDS} per request (a run created open takes up to {} with AppendRecords)",
                    records.len(),
                    assay_domain::limits::MAX_RUN_RECORDS
                ),
            );
        }
        // With responders every record is scored once per responder and sample: the results a run
        // holds are capped as the records are.
        let per_record: usize = responders.iter().map(|r| r.samples as usize).sum();
        if !open && records.len() <= MAX_RECORDS && records.len() * per_record > MAX_RECORDS {
            v.push(
                "pipeline.responders",
                format!(
                    "make {} responses to score ({} records x {per_record} responses per record); the limit is \
                     {MAX_RECORDS} per request: send fewer records or responders, or create the run open",
                    records.len() * per_record,
                    records.len()
                ),
            );
        }
        let stop = stop_when_decided.and_then(|s| decide::parse(s, &responders, &records, open, &mut v));
        let needs_input = plan.as_ref().and_then(ChecklistPlan::preset).is_some();
        check_ids(&records, "pipeline.records", &mut v);
        let records: Vec<EvalRecord> = records
            .into_iter()
            .enumerate()
            .map(|(i, r)| {
                let f = format!("pipeline.records[{i}]");
                if responders.is_empty() && r.target.trim().is_empty() {
                    v.push(format!("{f}.target"), "must not be empty");
                }
                if !responders.is_empty() && r.input.trim().is_empty() {
                    v.push(format!("{f}.input"), "must not be empty: the responders answer it");
                }
                if needs_input && r.input.trim().is_empty() {
                    v.push(format!("{f}.input"), "must not be empty: the preset generates a checklist from it");
                }
                EvalRecord::parse(r, &f, &mut v)
            })
            .collect();
        let scorer = convert::scorer_config(scorer, "pipeline.scorer", &mut v);
        let scorer_model = convert::model_spec(scorer_model, "pipeline.scorer_model", &mut v);
        v.into_result()?;
        let Some(plan) = plan else { return Err(StageError::invalid("pipeline.source", "is invalid")) };
        let mut v = Violations::new();
        for (field, description) in plan.validate_generation(&records, |i| format!("pipeline.records[{i}]")) {
            v.push(field, description);
        }
        // The settings as the scorer will resolve them, checked before any checklist is made.
        scorer
            .resolve(&assay_domain::generator::default_scorer_for(plan.source_method()))
            .check("pipeline.scorer", &mut v);
        v.into_result()?;
        let concurrency = if concurrency > 0 { concurrency as usize } else { stages.concurrency };
        Ok(Self { plan, records, scorer, scorer_model, concurrency, stages, open, responders, stop })
    }

    /// Records for an open run, checked as the request's are (fields named `records[i].*`).
    fn rows(&self, records: Vec<gw::EvalRecord>) -> Result<Vec<assay_runs::store::NewRecord>, StageError> {
        let needs_input = self.plan.preset().is_some();
        let mut v = Violations::new();
        check_ids(&records, "records", &mut v);
        let parsed: Vec<EvalRecord> = records
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let f = format!("records[{i}]");
                if self.responders.is_empty() && r.target.trim().is_empty() {
                    v.push(format!("{f}.target"), "must not be empty");
                }
                if !self.responders.is_empty() && r.input.trim().is_empty() {
                    v.push(format!("{f}.input"), "must not be empty: the responders answer it");
                }
                if needs_input && r.input.trim().is_empty() {
                    v.push(format!("{f}.input"), "must not be empty: the preset generates a checklist from it");
                }
                EvalRecord::parse(r.clone(), &f, &mut v)
            })
            .collect();
        for (field, description) in self.plan.validate_generation(&parsed, |i| format!("records[{i}]")) {
            v.push(field, description);
        }
        v.into_result()?;
        Ok(records
            .into_iter()
            .map(|r| assay_runs::store::NewRecord { id: r.id.clone(), record: prost::Message::encode_to_vec(&r) })
            .collect())
    }

    /// Score record `r` (index `i`) against its checklist.
    async fn score_record(
        &self,
        checklist: &Checklist,
        config: &ScorerSettings,
        i: usize,
        r: &EvalRecord,
    ) -> Result<(gw::RecordResult, Usage, ModelRecord), StageError> {
        let request = ScoreRequest {
            checklist: checklist.clone(),
            targets: vec![target_of(checklist, r, i)],
            config: config.clone(),
            model: self.scorer_model.clone(),
        };
        let out =
            super::rounds::in_rounds("score", || self.stages.scorer.score(request.clone(), &assay_domain::no_events))
                .await?;
        let score =
            out.scores.into_iter().next().ok_or_else(|| StageError::Internal("scorer returned no score".into()))?;
        let mut wire = convert::score_to(&score);
        wire.target_id = r.id_or(i);
        Ok((record_result(i, r, &checklist.id, Some(wire), String::new()), out.usage, out.model))
    }
}

/// What the scorer is asked about record `r` (index `i`).
fn target_of(checklist: &Checklist, r: &EvalRecord, i: usize) -> ScoreTarget {
    ScoreTarget {
        id: r.id_or(i),
        input: if r.input.is_empty() { checklist.input.clone() } else { r.input.clone() },
        target: r.target.clone(),
        reference: r.reference.clone(),
        history: r.history.clone(),
    }
}

impl ChecklistEval {
    /// Without persistence (Evaluate) and with one checklist: every record in one scorer call (the
    /// scorer runs targets concurrently); its errors are the pipeline's.
    async fn score_together(
        &self,
        ctx: &RunCtx,
        checklist: &Checklist,
        config: &ScorerSettings,
    ) -> Result<RunOutcome, StageError> {
        // One scorer call for every record: the pipeline's cap on records at once is the call's cap.
        let mut config = config.clone();
        config.concurrency = config.concurrency.or(Some(self.concurrency as u32));
        let request = ScoreRequest {
            checklist: checklist.clone(),
            targets: self.records.iter().enumerate().map(|(i, r)| target_of(checklist, r, i)).collect(),
            config,
            model: self.scorer_model.clone(),
        };
        let out = self.stages.scorer.score(request, &assay_domain::no_events).await.map_err(scorer_fields)?;
        ctx.spending.add_usage(&out.usage);
        ctx.progress.add_model(&out.model);
        ctx.progress.set_done(out.scores.len() as u32);
        let results: Vec<gw::RecordResult> = out
            .scores
            .iter()
            .enumerate()
            .map(|(i, s)| record_result(i, &self.records[i], &checklist.id, Some(convert::score_to(s)), String::new()))
            .collect();
        let state =
            if results.iter().all(|r| r.score.is_some()) { gw::RunState::Succeeded } else { gw::RunState::Partial };
        let response = gw::EvaluateResponse {
            run_id: ctx.run_id().to_string(),
            results,
            aggregate: Some(convert::aggregate_to(&out.aggregate)),
            checklists: vec![convert::checklist_to(checklist)],
            usage: Some(ctx.spending.usage()),
            models: ctx.progress.models().iter().map(convert::model_record_to).collect(),
            // One scorer call without a budget: nothing to stop.
            budget_exhausted: String::new(),
            results_paged: false,
            responders: Vec::new(),
            comparisons: Vec::new(),
            sequential: None,
        };
        Ok(RunOutcome { state, result: Some(gw::run_result::Result::ChecklistEval(response)) })
    }

    /// The evaluation result from every stored record, in record order.
    async fn result(&self, ctx: &RunCtx, checklists: &[Checklist]) -> Result<gw::EvaluateResponse, StageError> {
        // A call the budget could not pay for left records unrun: the run says why.
        ctx.spending.record_budget_stop();
        let records: Vec<gw::RecordResult> = ctx.results.all().await?.into_iter().map(|(_, r)| r).collect();
        let scored: Vec<(assay_domain::Score, &Checklist)> = records
            .iter()
            .filter_map(|r| {
                let cl = checklists.iter().find(|c| c.id == r.checklist_id)?;
                Some((convert::score_from(r.score.clone()?), cl))
            })
            .collect();
        let aggregate = AggregateScores::compute(scored.iter().map(|(s, c)| (s, *c)));
        Ok(gw::EvaluateResponse {
            run_id: ctx.run_id().to_string(),
            results: records,
            aggregate: Some(convert::aggregate_to(&aggregate)),
            checklists: checklists.iter().map(convert::checklist_to).collect(),
            usage: Some(ctx.spending.usage()),
            models: ctx.progress.models().iter().map(convert::model_record_to).collect(),
            budget_exhausted: ctx.snapshot().budget_exhausted,
            results_paged: false,
            responders: Vec::new(),
            comparisons: Vec::new(),
            sequential: None,
        })
    }

    /// The run's end: aggregate event, then the outcome by how many records failed.
    /// `asked`: the records the run asked (all but those a decided comparison left), by position.
    async fn finish(
        &self,
        ctx: &RunCtx,
        checklists: &[Checklist],
        cancelled: bool,
        asked: &[usize],
        sequential: Option<gw::SequentialResult>,
    ) -> Result<RunOutcome, StageError> {
        let mut result = self.result(ctx, checklists).await?;
        if !self.responders.is_empty() {
            let ids: Vec<String> = asked.iter().map(|i| self.records[*i].id_or(*i)).collect();
            self.annotate(ctx, &mut result, &ids).await?;
        }
        result.sequential = sequential;
        let failed = result.results.iter().filter(|r| r.score.is_none()).count();
        let state = if cancelled {
            gw::RunState::Cancelled
        } else if failed == 0 {
            gw::RunState::Succeeded
        } else if failed == result.results.len() {
            gw::RunState::Failed
        } else {
            gw::RunState::Partial
        };
        if !cancelled {
            ctx.log.emit(Event::Aggregate(gw::AggregateReady { aggregate: result.aggregate.clone() })).await?;
        }
        Ok(RunOutcome { state, result: Some(gw::run_result::Result::ChecklistEval(result)) })
    }
}

#[async_trait::async_trait]
impl Pipeline for ChecklistEval {
    fn kind(&self) -> gw::PipelineKind {
        gw::PipelineKind::ChecklistEval
    }

    fn total(&self) -> u32 {
        if self.responders.is_empty() {
            self.records.len() as u32
        } else {
            super::responders::layout(self.records.len(), &self.responders).len() as u32
        }
    }

    /// With responders each record makes several results, each keyed by its own index.
    fn max_records(&self) -> u64 {
        let per = super::responders::per_record(&self.responders).max(1) as u64;
        assay_domain::limits::MAX_RUN_RECORDS / per
    }

    fn check_records(&self, records: Vec<gw::EvalRecord>) -> Result<Vec<assay_runs::store::NewRecord>, StageError> {
        if !self.open {
            return Err(StageError::FailedPrecondition(
                "the run was not created open (RunPipelineRequest.open): its records came with its request".into(),
            ));
        }
        self.rows(records)
    }

    /// An open run spread over the gateways sharing the store: claim chunks of its records.
    async fn help(&self, ctx: &RunCtx) -> Result<(), StageError> {
        if !self.open {
            return Ok(());
        }
        self.help_spread(ctx).await
    }

    /// Each record is scored as soon as its checklist exists (see [`lane`]).
    async fn run(&self, ctx: &RunCtx) -> Result<RunOutcome, StageError> {
        if self.open { self.run_open(ctx).await } else { self.run_inline(ctx).await }
    }
}

pub(super) fn record_result(
    i: usize,
    r: &EvalRecord,
    checklist_id: &str,
    score: Option<assay_proto::common::v1::Score>,
    error: String,
) -> gw::RecordResult {
    gw::RecordResult {
        index: i as u32,
        record_id: r.id_or(i),
        checklist_id: checklist_id.to_string(),
        score,
        error,
        ..Default::default()
    }
}

/// A scorer's field names (`targets[i].target`, `checklist.items`) as the pipeline's
/// (`pipeline.records[i].target`, `pipeline.source.checklist.items`).
fn scorer_fields(e: StageError) -> StageError {
    e.map_fields(|field| {
        if let Some(rest) = field.strip_prefix("targets") {
            format!("pipeline.records{rest}")
        } else if let Some(rest) = field.strip_prefix("checklist") {
            format!("pipeline.source.checklist{rest}")
        } else if let Some(rest) = field.strip_prefix("config") {
            format!("pipeline.scorer{rest}")
        } else if let Some(rest) = field.strip_prefix("model") {
            format!("pipeline.scorer_model{rest}")
        } else {
            format!("pipeline.{field}")
        }
    })
}

impl super::Registered for assay_proto::pipelines::ChecklistEval {
    fn parse(request: Self::Request, stages: super::Stages) -> Result<std::sync::Arc<dyn Pipeline>, StageError> {
        Ok(std::sync::Arc::new(ChecklistEval::parse(request, stages)?))
    }

    fn parse_open(request: Self::Request, stages: super::Stages) -> Result<std::sync::Arc<dyn Pipeline>, StageError> {
        Ok(std::sync::Arc::new(ChecklistEval::parse_open(request, stages)?))
    }
}

/// Record ids are optional (the position stands in) and unique when given, as item ids are. Given
/// for some records only, an empty id would take its position, which may be another record's id
/// (`[{id:"1"}, {id:""}]` made two records "1"): refused, naming the record.
fn check_ids(records: &[gw::EvalRecord], field: &str, v: &mut Violations) {
    let mut ids = HashSet::new();
    for (i, r) in records.iter().enumerate() {
        if !r.id.is_empty() && !ids.insert(r.id.as_str()) {
            v.push(format!("{field}[{i}].id"), format!("duplicate id {:?}", r.id));
        }
    }
    if let Some(named) = records.iter().position(|r| !r.id.is_empty()) {
        for (i, _) in records.iter().enumerate().filter(|(_, r)| r.id.is_empty()) {
            v.push(
                format!("{field}[{i}].id"),
                format!(
                    "is empty while other records have ids ({field}[{named}].id is {:?}): give every record an \
                     id, or none (a record without one is known by its position)",
                    records[named].id
                ),
            );
        }
    }
}
