//! gRPC adapter of the gateway.

use std::pin::Pin;
use std::sync::Arc;

use assay_domain::limits::MAX_TEXT_BYTES;
use assay_domain::{StageError, Violations};
use assay_proto::convert;
use assay_proto::gateway::v1::checklist_source::Source;
use assay_proto::gateway::v1::gateway_service_server::{GatewayService, GatewayServiceServer};
use assay_proto::gateway::v1::{ChecklistSource, GenerateChecklistPipeline};
use assay_proto::gateway::v1::{
    ControlRunRequest, ControlRunResponse, EvaluateRequest, EvaluateResponse, GetRunRequest, GetRunResponse,
    ListRunsRequest, ListRunsResponse, RecordResult, RunPipelineRequest, RunPipelineResponse, WatchRunRequest,
    WatchRunResponse,
};
use assay_proto::generator::v1::GenerateCorpusRequest;
use assay_proto::refiners::v1::RefinerStep;
use assay_rpc::{CallContext, run_with, to_status};
use futures::{Stream, StreamExt};
use tonic::service::Routes;
use tonic::{Request, Response, Status};

use crate::core::{EvalRecord, Evaluation, EvaluationOutcome, GatewayCore};
use crate::runs::Runs;

/// The gateway's gRPC face.
#[derive(Clone)]
pub struct GatewayGrpc {
    core: Arc<GatewayCore>,
    runs: Runs,
}

/// Routes serving the gateway, with Assay's message limits.
pub fn routes(core: Arc<GatewayCore>, runs: Runs) -> Routes {
    Routes::new(
        GatewayServiceServer::new(GatewayGrpc { core, runs })
            .max_decoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES),
    )
}

fn evaluation(req: EvaluateRequest) -> Result<Evaluation, StageError> {
    let EvaluateRequest { pipeline } = req;
    let Some(p) = pipeline else {
        return Err(StageError::invalid("pipeline", "is required"));
    };
    evaluation_from(p)
}

/// Parse and validate a checklist evaluation pipeline (fields named `pipeline.*`).
pub fn evaluation_from(p: assay_proto::gateway::v1::ChecklistEvalPipeline) -> Result<Evaluation, StageError> {
    let assay_proto::gateway::v1::ChecklistEvalPipeline {
        source,
        records,
        scorer,
        generator_model,
        scorer_model,
        max_items,
        refiners,
        concurrency: _,
    } = p;
    let mut v = Violations::new();
    let scorer_set = scorer.is_some();
    let (checklist, preset, corpus) = checklist_source(source, &mut v);
    check_refiners(&refiners, &mut v);
    let records = records
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            let assay_proto::gateway::v1::EvalRecord { id, input, target, reference, history, candidates } = r;
            let f = format!("pipeline.records[{i}]");
            if target.trim().is_empty() {
                v.push(format!("{f}.target"), "must not be empty");
            }
            for (name, text) in
                [("input", &input), ("target", &target), ("reference", &reference), ("history", &history)]
            {
                if text.len() > MAX_TEXT_BYTES {
                    v.push(
                        format!("{f}.{name}"),
                        format!("is {} bytes; the limit is {MAX_TEXT_BYTES} bytes", text.len()),
                    );
                }
            }
            if preset.is_some() && input.trim().is_empty() {
                v.push(format!("{f}.input"), "must not be empty: the preset generates a checklist from it");
            }
            let candidates = candidates.into_iter().map(|c| c.text).collect();
            EvalRecord { id, input, target, reference, history, candidates }
        })
        .collect();
    if max_items.is_some_and(|m| m == 0 || m > 500) {
        v.push("pipeline.max_items", "must be between 1 and 500");
    }
    let generator_model = convert::model_spec(generator_model, "pipeline.generator_model", &mut v);
    let scorer = convert::scorer_config(scorer, "pipeline.scorer", &mut v);
    let scorer_model = convert::model_spec(scorer_model, "pipeline.scorer_model", &mut v);
    v.into_result()?;
    Ok(Evaluation {
        checklist,
        preset,
        generator_model,
        max_items,
        records,
        scorer,
        scorer_set,
        scorer_model,
        corpus,
        refiners,
    })
}

type Source3 = (assay_domain::Checklist, Option<assay_generator::Preset>, Option<GenerateCorpusRequest>);

/// The checklist source: an explicit checklist, an instance preset or a corpus request.
fn checklist_source(source: Option<ChecklistSource>, v: &mut Violations) -> Source3 {
    match source.and_then(|s| s.source) {
        Some(Source::Checklist(c)) => (convert::checklist(Some(c), "pipeline.source.checklist", v), None, None),
        Some(Source::Preset(p)) => match assay_generator::grpc::preset_from(p, "pipeline.source.preset") {
            Ok(p) => (Default::default(), Some(p), None),
            Err(f) => {
                v.push(f.field, f.description);
                (Default::default(), None, None)
            }
        },
        Some(Source::Corpus(c)) => {
            check_corpus(&c, v);
            (Default::default(), None, Some(c))
        }
        None => {
            v.push("pipeline.source", "is required (a preset, a checklist or a corpus)");
            Default::default()
        }
    }
}

/// A corpus request checked up front with the generator's own rules (fields named
/// `pipeline.source.corpus.*`), so a bad request fails before a run is created.
fn check_corpus(c: &GenerateCorpusRequest, v: &mut Violations) {
    let checked =
        assay_generator::grpc::corpus_request(c.clone()).and_then(|r| assay_generator::core::corpus::validate(&r));
    if let Err(StageError::InvalidArgument(violations)) = checked {
        for f in violations {
            v.push(format!("pipeline.source.corpus.{}", f.field), f.description);
        }
    }
}

/// The refiner chain checked up front with the refiners' own rules (fields named
/// `pipeline.refiners[i].*`), so a bad chain fails before a run is created.
fn check_refiners(steps: &[RefinerStep], v: &mut Violations) {
    for (i, step) in steps.iter().enumerate() {
        if step.step.is_none() {
            v.push(format!("pipeline.refiners[{i}]"), "must set one of deduplicate, tag, unit_test or select");
            continue;
        }
        let request =
            assay_proto::refiners::v1::RefineChecklistRequest { items: Vec::new(), steps: vec![step.clone()] };
        let checked = assay_refiners::convert::refine_checklist_request(request, "")
            .and_then(|(_, steps)| assay_refiners::ChecklistRefiners::validate_steps(&steps));
        if let Err(StageError::InvalidArgument(violations)) = checked {
            for f in violations {
                if let Some(rest) = f.field.strip_prefix("steps[0]") {
                    v.push(format!("pipeline.refiners[{i}]{rest}"), f.description);
                }
            }
        }
    }
}

/// Parse and validate a generate-only pipeline (fields named `pipeline.*`) as an evaluation with one
/// record and no scoring.
pub fn generation_from(p: GenerateChecklistPipeline) -> Result<Evaluation, StageError> {
    let GenerateChecklistPipeline { source, record, generator_model, max_items, refiners } = p;
    let mut v = Violations::new();
    let (checklist, preset, corpus) = checklist_source(source, &mut v);
    check_refiners(&refiners, &mut v);
    let record = record.unwrap_or_default();
    if preset.is_some() && record.input.trim().is_empty() {
        v.push("pipeline.record.input", "must not be empty: the preset generates a checklist from it");
    }
    if preset.is_none() && corpus.is_none() && refiners.is_empty() {
        v.push("pipeline.refiners", "must not be empty when the source is an explicit checklist (nothing to do)");
    }
    if max_items.is_some_and(|m| m == 0 || m > 500) {
        v.push("pipeline.max_items", "must be between 1 and 500");
    }
    let generator_model = convert::model_spec(generator_model, "pipeline.generator_model", &mut v);
    v.into_result()?;
    let assay_proto::gateway::v1::EvalRecord { id, input, target, reference, history, candidates } = record;
    Ok(Evaluation {
        checklist,
        preset,
        generator_model,
        max_items,
        records: vec![EvalRecord {
            id,
            input,
            target,
            reference,
            history,
            candidates: candidates.into_iter().map(|c| c.text).collect(),
        }],
        corpus,
        refiners,
        ..Default::default()
    })
}

fn evaluate_response(o: &EvaluationOutcome) -> EvaluateResponse {
    EvaluateResponse {
        run_id: o.run_id.clone(),
        results: o
            .results
            .iter()
            .map(|r| RecordResult {
                index: r.index,
                record_id: r.record_id.clone(),
                checklist_id: r.checklist_id.clone(),
                score: r.score.as_ref().map(convert::score_to),
                error: r.error.clone(),
            })
            .collect(),
        aggregate: Some(convert::aggregate_to(&o.aggregate)),
        checklists: o.checklists.iter().map(convert::checklist_to).collect(),
        usage: Some(convert::usage_to(&o.usage)),
        models: o.models.iter().map(convert::model_record_to).collect(),
    }
}

type EventStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Longest page of ListRuns.
const MAX_PAGE: u32 = 500;

fn page_token(run: &assay_proto::gateway::v1::Run) -> String {
    format!("{}:{}", run.created_at.map_or(0, |t| t.seconds), run.run_id)
}

fn parse_page_token(t: &str) -> Result<Option<(i64, String)>, StageError> {
    if t.is_empty() {
        return Ok(None);
    }
    let (ts, id) =
        t.split_once(':').ok_or_else(|| StageError::invalid("page_token", "is not a token from ListRuns"))?;
    let ts = ts.parse().map_err(|_| StageError::invalid("page_token", "is not a token from ListRuns"))?;
    Ok(Some((ts, id.to_string())))
}

#[tonic::async_trait]
impl GatewayService for GatewayGrpc {
    async fn evaluate(&self, request: Request<EvaluateRequest>) -> Result<Response<EvaluateResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let inner = request.into_inner();
        let eval = evaluation(inner.clone()).map_err(to_status)?;
        if eval.needs_checklist_stages() {
            // Generation or refinement + scoring: the full pipeline, waited for.
            let request = RunPipelineRequest {
                pipeline: inner.pipeline.map(assay_proto::gateway::v1::run_pipeline_request::Pipeline::ChecklistEval),
                label: "evaluate".into(),
            };
            let runs = self.runs.clone();
            let out = run_with(ctx, async move {
                let (run_id, _rx) = runs.start(request).await?;
                let mut stream = Box::pin(runs.watch(&run_id, 0).await?);
                while let Some(ev) = stream.next().await {
                    if let Some(assay_proto::gateway::v1::run_event::Event::Completed(c)) = ev?.event {
                        return match c.result.and_then(|r| if r.error.is_empty() { r.result } else { None }) {
                            Some(assay_proto::gateway::v1::run_result::Result::ChecklistEval(e)) => Ok(e),
                            _ => Err(StageError::Unavailable(format!("run {run_id} did not complete"))),
                        };
                    }
                }
                Err(StageError::Unavailable(format!("run {run_id} ended without a result")))
            })
            .await
            .map_err(to_status)?;
            return Ok(Response::new(out));
        }
        let core = self.core.clone();
        let out = run_with(ctx, async move { core.evaluate(eval).await }).await.map_err(to_status)?;
        let response = evaluate_response(&out);
        // Stored as a finished run (off the response path) so GetRun/ListRuns see it.
        let runs = self.runs.clone();
        let (req, resp) = (inner.pipeline.unwrap_or_default(), response.clone());
        tokio::spawn(async move {
            if let Err(e) = runs.record_finished(req, resp).await {
                tracing::warn!(error = %e, "could not store the evaluation run");
            }
        });
        Ok(Response::new(response))
    }

    type RunPipelineStream = EventStream<RunPipelineResponse>;

    async fn run_pipeline(
        &self,
        request: Request<RunPipelineRequest>,
    ) -> Result<Response<Self::RunPipelineStream>, Status> {
        let (run_id, _rx) = self.runs.start(request.into_inner()).await.map_err(to_status)?;
        // Follow from the first event; the run goes on if the client leaves (reattach with WatchRun).
        let stream = self.runs.watch(&run_id, 0).await.map_err(to_status)?;
        Ok(Response::new(Box::pin(
            stream.map(|r| r.map(|e| RunPipelineResponse { event: Some(e) }).map_err(to_status)),
        )))
    }

    async fn get_run(&self, request: Request<GetRunRequest>) -> Result<Response<GetRunResponse>, Status> {
        let GetRunRequest { run_id } = request.into_inner();
        if run_id.is_empty() {
            return Err(to_status(StageError::invalid("run_id", "must not be empty")));
        }
        let run = self.runs.get(&run_id).await.map_err(to_status)?;
        Ok(Response::new(GetRunResponse { run: Some(run) }))
    }

    async fn list_runs(&self, request: Request<ListRunsRequest>) -> Result<Response<ListRunsResponse>, Status> {
        let ListRunsRequest { page_size, page_token: token, kind, state } = request.into_inner();
        let mut v = Violations::new();
        if page_size > MAX_PAGE {
            v.push("page_size", format!("the limit is {MAX_PAGE}"));
        }
        if assay_proto::gateway::v1::PipelineKind::try_from(kind).is_err() {
            v.push("kind", format!("unknown enum value {kind}"));
        }
        if assay_proto::gateway::v1::RunState::try_from(state).is_err() {
            v.push("state", format!("unknown enum value {state}"));
        }
        v.into_result().map_err(to_status)?;
        let cursor = parse_page_token(&token).map_err(to_status)?;
        let size = if page_size == 0 { 50 } else { page_size } as usize;
        let mut runs = self.runs.store().list(kind, state, cursor, size + 1).await.map_err(to_status)?;
        let next = if runs.len() > size {
            runs.truncate(size);
            runs.last().map(page_token).unwrap_or_default()
        } else {
            String::new()
        };
        for r in &mut runs {
            r.result = None;
        }
        Ok(Response::new(ListRunsResponse { runs, next_page_token: next }))
    }

    type WatchRunStream = EventStream<WatchRunResponse>;

    async fn watch_run(&self, request: Request<WatchRunRequest>) -> Result<Response<Self::WatchRunStream>, Status> {
        let WatchRunRequest { run_id, after_sequence } = request.into_inner();
        if run_id.is_empty() {
            return Err(to_status(StageError::invalid("run_id", "must not be empty")));
        }
        let stream = self.runs.watch(&run_id, after_sequence).await.map_err(to_status)?;
        Ok(Response::new(Box::pin(stream.map(|r| r.map(|e| WatchRunResponse { event: Some(e) }).map_err(to_status)))))
    }

    async fn control_run(&self, request: Request<ControlRunRequest>) -> Result<Response<ControlRunResponse>, Status> {
        let req = request.into_inner();
        if req.run_id.is_empty() {
            return Err(to_status(StageError::invalid("run_id", "must not be empty")));
        }
        let run = self.runs.control(req).await.map_err(to_status)?;
        Ok(Response::new(ControlRunResponse { run: Some(run) }))
    }
}
