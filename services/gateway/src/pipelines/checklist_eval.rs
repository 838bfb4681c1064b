//! The `checklist_eval` pipeline: get the checklists (explicit, per distinct input from a preset, or
//! from a corpus; refined when asked), then score every record against its checklist, one
//! checkpoint per record, and aggregate.

use std::collections::{HashSet, VecDeque};
use std::sync::Arc;

use assay_domain::limits::MAX_RECORDS;
use assay_domain::{
    AggregateScores, Checklist, ModelRecord, ModelSpec, ScoreRequest, ScoreTarget, ScorerSettings, StageError, Usage,
    Violations,
};
use assay_proto::convert;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::run_event::Event;
use futures::StreamExt;
use futures::stream::FuturesUnordered;

use super::checklist::{ChecklistPlan, EvalRecord};
use super::reserve::Reserve;
use super::stages::Stages;
use assay_runs::{Pipeline, RunCtx, RunOutcome, Writes};

mod open;
mod respond;
mod spread;

/// Checkpoint key prefix of the scored records (each under its index, in eight digits).
pub const RESULT_PREFIX: &str = "record:";
const RECORD: &str = RESULT_PREFIX;

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
    /// With responders, once they answered: the targets to score.
    derived: std::sync::OnceLock<super::responders::Derived>,
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
        Ok(Self {
            plan,
            records,
            scorer,
            scorer_model,
            concurrency,
            stages,
            open,
            responders,
            derived: std::sync::OnceLock::new(),
        })
    }

    /// A result named by its responder and sample, with the response (with responders).
    fn labelled(&self, mut r: gw::RecordResult) -> gw::RecordResult {
        if let Some(d) = self.derived.get() {
            let response = d.response(r.index as usize);
            super::responders::label(&mut r, &self.responders, response);
        }
        r
    }

    /// The records scored: the request's, or with responders the targets they made.
    fn records(&self) -> &[EvalRecord] {
        match self.derived.get() {
            Some(d) => &d.targets,
            None => &self.records,
        }
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

    fn target(&self, checklist: &Checklist, i: usize) -> ScoreTarget {
        target_of(checklist, &self.records()[i], i)
    }

    /// Score target `i` against its checklist (with responders, answered first); and what
    /// answering it cost now.
    #[allow(clippy::type_complexity)]
    async fn score_one(
        &self,
        ctx: &RunCtx,
        checklist: &Checklist,
        config: &ScorerSettings,
        i: usize,
    ) -> Result<(Usage, Result<(gw::RecordResult, Usage, ModelRecord), StageError>), StageError> {
        match self.derived.get() {
            Some(d) => self.answer_and_score_target(ctx, d, checklist, config, i).await,
            None => Ok((Usage::default(), self.score_record(checklist, config, i, &self.records[i]).await)),
        }
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
            targets: (0..self.records().len()).map(|i| self.target(checklist, i)).collect(),
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
            .map(|(i, s)| {
                record_result(i, &self.records()[i], &checklist.id, Some(convert::score_to(s)), String::new())
            })
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
        };
        Ok(RunOutcome { state, result: Some(gw::run_result::Result::ChecklistEval(response)) })
    }

    /// The evaluation result from every stored record, in record order.
    async fn result(&self, ctx: &RunCtx, checklists: &[Checklist]) -> Result<gw::EvaluateResponse, StageError> {
        // A call the budget could not pay for left records unrun: the run says why.
        ctx.spending.record_budget_stop();
        let records: Vec<gw::RecordResult> =
            ctx.checkpoints.all::<gw::RecordResult>(RECORD).await?.into_iter().map(|(_, r)| r).collect();
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
        })
    }

    /// The run's end: aggregate event, then the outcome by how many records failed.
    async fn finish(&self, ctx: &RunCtx, checklists: &[Checklist], cancelled: bool) -> Result<RunOutcome, StageError> {
        let mut result = self.result(ctx, checklists).await?;
        if let Some(d) = self.derived.get() {
            self.annotate(&mut result, d);
        }
        let failed = result.results.iter().filter(|r| r.score.is_none()).count();
        let state = if cancelled {
            gw::RunState::Cancelled
        } else if failed == 0 {
            gw::RunState::Succeeded
        } else if failed == self.records().len() {
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

    /// Each record is scored as soon as its checklist exists: generation (one per distinct
    /// input) and scoring overlap, so the run's critical path is one generation and one scoring.
    async fn run(&self, ctx: &RunCtx) -> Result<RunOutcome, StageError> {
        if self.open {
            return self.run_open(ctx).await;
        }
        if !self.responders.is_empty() && self.derived.get().is_none() {
            let derived = self.prepare(ctx).await?;
            let _ = self.derived.set(derived);
        }
        // Under a budget, checklists are generated only so far ahead of the records being scored
        // (a round of records, then one more per record finished), so what the budget pays for is
        // records evaluated, not checklists of records it never reaches.
        let lookahead = ctx.spending.has_budget().then(|| Arc::new(tokio::sync::Semaphore::new(self.concurrency)));
        let (mut production, mut producing) =
            self.plan.production(ctx, &self.stages, self.records(), lookahead.clone()).await?;
        // A record finished (scored, failed or not run): one more generation may start.
        let finished = |t: usize| {
            if let Some(l) = &lookahead
                && self.derived.get().is_none_or(|d| d.layout.get(t).is_some_and(|(_, j, s)| *j == 0 && *s == 0))
            {
                l.add_permits(1);
            }
        };
        if ctx.is_ephemeral()
            && production.checklist_count() == 1
            && !ctx.spending.has_budget()
            && self.responders.is_empty()
        {
            // Evaluate with one checklist: nothing to overlap; every record in one scorer call.
            // (With a budget, records go one scorer call each, so those scored before it ran
            // out are kept.)
            if let Some((k, out)) = producing.next().await {
                production.accept(ctx, k, out).await?;
            }
            drop(producing);
            if let Some(checklist) = production.found[0].take() {
                return self.score_together(ctx, &checklist, &self.scorer).await;
            }
            return Err(StageError::Internal("the checklist was neither produced nor failed".into()));
        }
        let done: HashSet<u32> =
            ctx.checkpoints.all::<gw::RecordResult>(RECORD).await?.iter().map(|(_, r)| r.index).collect();
        ctx.progress.set_done(done.len() as u32);
        // Per checklist, its records still to score, released to `queue` once it exists.
        let mut waiting: Vec<Vec<usize>> = vec![Vec::new(); production.checklist_count()];
        for i in (0..self.records().len()).filter(|i| !done.contains(&(*i as u32))) {
            waiting[production.record_checklist[i]].push(i);
        }
        let mut ready: Vec<Option<Arc<Checklist>>> = vec![None; production.checklist_count()];
        let mut queue: VecDeque<usize> = VecDeque::new();
        for (k, c) in production.found.iter().enumerate() {
            if let Some(c) = c {
                ready[k] = Some(Arc::new(c.clone()));
                queue.extend(std::mem::take(&mut waiting[k]));
            }
        }
        let config = &self.scorer;
        let mut scoring = FuturesUnordered::new();
        let mut generating = true;
        // Checkpoints and events are queued, not waited for one by one: the run's writer stores
        // them in order, many per transaction, while this loop goes on starting scorer calls.
        let mut writes = Writes::default();
        // Under a budget, no more records in flight than what is left pays for.
        let mut reserve = Reserve::default();
        loop {
            // A spent budget starts no new record: the ones waiting are not run, and say why.
            // (Checked only while records wait: a budget spent by the last records in flight
            // stopped nothing, and the run does not say it did.)
            if !queue.is_empty()
                && let Some(why) = ctx.spending.budget_exhausted()
            {
                for i in std::mem::take(&mut queue) {
                    let checklist_id =
                        ready[production.record_checklist[i]].as_ref().map(|c| c.id.clone()).unwrap_or_default();
                    let result =
                        record_result(i, &self.records()[i], &checklist_id, None, format!("not run: {}", why.message));
                    let result = self.labelled(result);
                    writes.push(ctx.checkpoints.queued(&record_key(i), &result));
                    ctx.progress.add_done();
                    finished(i);
                    writes.push(ctx.log.emit_queued(Event::RecordScored(result)));
                }
            }
            let affordable = ctx.spending.budget_left().map_or(usize::MAX, |left| reserve.in_flight(&left));
            while scoring.len() < self.concurrency.min(affordable) {
                let Some(i) = queue.pop_front() else { break };
                let Some(checklist) = ready[production.record_checklist[i]].clone() else { continue };
                scoring.push(async move {
                    // Paused runs start no new record; in-flight ones finish.
                    ctx.gate.wait().await?;
                    let (answering, scored) = self.score_one(ctx, &checklist, config, i).await?;
                    Ok::<_, StageError>((i, answering, scored))
                });
            }
            if !generating && scoring.is_empty() {
                break;
            }
            tokio::select! {
                next = producing.next(), if generating => {
                    let Some((k, out)) = next else {
                        generating = false;
                        continue;
                    };
                    production.accept_queued(ctx, k, out, &mut writes)?;
                    if let Some(c) = &production.found[k] {
                        ready[k] = Some(Arc::new(c.clone()));
                        queue.extend(std::mem::take(&mut waiting[k]));
                        continue;
                    }
                    // Records whose checklist could not be produced fail on their own; the others go on.
                    let why = production.failures[k]
                        .as_ref()
                        .map_or_else(|| "checklist generation failed".to_string(), generation_failure);
                    for i in std::mem::take(&mut waiting[k]) {
                        let why = why.clone();
                        let result = self.labelled(record_result(i, &self.records()[i], "", None, why));
                        ctx.checkpoints.put(&record_key(i), &result).await?;
                        ctx.progress.add_done();
                        finished(i);
                        ctx.log.emit(Event::RecordScored(result)).await?;
                    }
                }
                Some(next) = scoring.next(), if !scoring.is_empty() => {
                    let (i, answering, scored) = match next {
                        Ok(x) => x,
                        Err(StageError::Cancelled(_)) if ctx.gate.is_cancelled() => break,
                        Err(e) => return Err(e),
                    };
                    reserve.charge(&answering);
                    let checklist_id = ready[production.record_checklist[i]].as_ref().map(|c| c.id.clone()).unwrap_or_default();
                    let result = self.labelled(settle(ctx, &mut reserve, i, &self.records()[i], &checklist_id, scored)?);
                    writes.push(ctx.checkpoints.queued(&record_key(i), &result));
                    ctx.progress.add_done();
                    finished(i);
                    writes.push(ctx.log.emit_queued(Event::RecordScored(result)));
                }
                e = writes.next_error() => return Err(e),
                () = ctx.gate.cancelled() => break,
            }
        }
        drop(scoring);
        drop(producing);
        writes.flush().await?;
        let ok: Vec<Checklist> = production.found.into_iter().flatten().collect();
        self.finish(ctx, &ok, ctx.gate.is_cancelled()).await
    }
}

/// A record's scoring as its result: the usage and model counted when it was scored; a call the
/// budget refused says "not run"; a transient failure fails the record; bad input or a refused
/// request fails the run.
pub(super) fn settle(
    ctx: &RunCtx,
    reserve: &mut Reserve,
    i: usize,
    r: &EvalRecord,
    checklist_id: &str,
    scored: Result<(gw::RecordResult, Usage, ModelRecord), StageError>,
) -> Result<gw::RecordResult, StageError> {
    Ok(match scored {
        Ok((result, usage, model)) => {
            reserve.add(&usage);
            ctx.spending.add_usage(&usage);
            ctx.progress.add_model(&model);
            result
        }
        Err(
            e @ (StageError::InvalidArgument(_) | StageError::FailedPrecondition(_) | StageError::Unimplemented(_)),
        ) => {
            return Err(e);
        }
        Err(StageError::BudgetExhausted(m)) => record_result(i, r, checklist_id, None, format!("not run: {m}")),
        Err(e) => record_result(i, r, checklist_id, None, e.to_string()),
    })
}

/// Why the records of a checklist that could not be produced fail (each on its own): not run when
/// a budget or cap refused the generation.
pub(super) fn generation_failure(e: &StageError) -> String {
    if let StageError::BudgetExhausted(why) = e {
        format!("not run: {}", why.message)
    } else {
        format!("checklist generation failed: {e}")
    }
}

/// Whether a failed generation fails the whole run: a request the generator refused (the others
/// fail only their records, unless the run has a single checklist).
pub(super) fn generation_fails_run(e: &StageError, single: bool) -> bool {
    single
        || matches!(
            e,
            StageError::InvalidArgument(_)
                | StageError::FailedPrecondition(_)
                | StageError::Unimplemented(_)
                | StageError::Cancelled(_)
        )
}

pub(super) fn record_key(i: usize) -> String {
    format!("{RECORD}{i:08}")
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

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(tokens: u64, usd: f64) -> assay_domain::Usage {
        assay_domain::Usage { calls: 1, prompt_tokens: tokens, cost_usd: usd, ..Default::default() }
    }

    #[test]
    fn a_budget_lets_as_many_records_fly_as_it_still_pays_for() {
        let mut r = Reserve::default();
        let tokens = |t| assay_budget::Limits { max_tokens: Some(t), max_cost_usd: None };
        assert_eq!(r.in_flight(&tokens(1_000_000)), 4, "nothing known yet");
        r.add(&usage(100, 0.001));
        r.add(&usage(120, 0.001));
        assert_eq!(r.in_flight(&tokens(1_100)), 10, "1,100 tokens left at 110 a record");
        assert_eq!(r.in_flight(&tokens(1_101)), 11, "a part of a record left starts one more");
        assert_eq!(r.in_flight(&tokens(0)), 1, "the budget's own check stops the last one");
        let both = assay_budget::Limits { max_tokens: Some(1_100), max_cost_usd: Some(0.003) };
        assert_eq!(r.in_flight(&both), 3, "the tighter limit decides");
        assert_eq!(r.in_flight(&assay_budget::Limits::default()), usize::MAX, "no limit");
        let mut free = Reserve::default();
        free.add(&usage(100, 0.0));
        let dollars = assay_budget::Limits { max_tokens: None, max_cost_usd: Some(1.0) };
        assert_eq!(free.in_flight(&dollars), usize::MAX, "records that cost nothing are not limited by dollars");
    }
}
