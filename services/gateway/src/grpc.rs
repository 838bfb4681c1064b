//! gRPC adapter of the gateway.

use std::pin::Pin;
use std::sync::Arc;

use assay_domain::limits::MAX_TEXT_BYTES;
use assay_domain::{StageError, Violations};
use assay_proto::convert;
use assay_proto::gateway::v1::checklist_source::Source;
use assay_proto::gateway::v1::gateway_service_server::{GatewayService, GatewayServiceServer};
use assay_proto::gateway::v1::{
    ControlRunRequest, ControlRunResponse, EvaluateRequest, EvaluateResponse, GetRunRequest, GetRunResponse,
    ListRunsRequest, ListRunsResponse, RecordResult, RunPipelineRequest, RunPipelineResponse, WatchRunRequest,
    WatchRunResponse,
};
use assay_rpc::{CallContext, run_with, to_status};
use futures::Stream;
use tonic::service::Routes;
use tonic::{Request, Response, Status};

use crate::core::{EvalRecord, Evaluation, EvaluationOutcome, GatewayCore};

/// The gateway's gRPC face.
#[derive(Clone)]
pub struct GatewayGrpc {
    core: Arc<GatewayCore>,
}

/// Routes serving the gateway, with Assay's message limits.
pub fn routes(core: Arc<GatewayCore>) -> Routes {
    Routes::new(
        GatewayServiceServer::new(GatewayGrpc { core })
            .max_decoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES),
    )
}

fn evaluation(req: EvaluateRequest) -> Result<Evaluation, StageError> {
    let EvaluateRequest { pipeline } = req;
    let Some(p) = pipeline else {
        return Err(StageError::invalid("pipeline", "is required"));
    };
    let assay_proto::gateway::v1::ChecklistEvalPipeline {
        source,
        records,
        scorer,
        generator_model: _,
        scorer_model,
        max_items: _,
        refiners,
        concurrency: _,
    } = p;
    let mut v = Violations::new();
    let checklist = match source.and_then(|s| s.source) {
        Some(Source::Checklist(c)) => convert::checklist(Some(c), "pipeline.source.checklist", &mut v),
        Some(Source::Preset(_)) => {
            return Err(StageError::Unimplemented(
                "checklist generation from a preset is not available yet; pass pipeline.source.checklist".into(),
            ));
        }
        Some(Source::Corpus(_)) => {
            return Err(StageError::Unimplemented(
                "corpus checklist generation is not available yet; pass pipeline.source.checklist".into(),
            ));
        }
        None => {
            v.push("pipeline.source", "is required (a checklist)");
            Default::default()
        }
    };
    if !refiners.is_empty() {
        return Err(StageError::Unimplemented(
            "checklist refiners are not available yet; leave pipeline.refiners empty".into(),
        ));
    }
    let records = records
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            let assay_proto::gateway::v1::EvalRecord { id, input, target, reference, history, candidates: _ } = r;
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
            EvalRecord { id, input, target, reference, history }
        })
        .collect();
    let scorer = convert::scorer_config(scorer, "pipeline.scorer", &mut v);
    let scorer_model = convert::model_spec(scorer_model, "pipeline.scorer_model", &mut v);
    v.into_result()?;
    Ok(Evaluation { checklist, records, scorer, scorer_model })
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

const RUNS_LATER: &str =
    "pipeline runs (RunPipeline, GetRun, ListRuns, WatchRun, ControlRun) are not available yet; use Evaluate";

#[tonic::async_trait]
impl GatewayService for GatewayGrpc {
    async fn evaluate(&self, request: Request<EvaluateRequest>) -> Result<Response<EvaluateResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let eval = evaluation(request.into_inner()).map_err(to_status)?;
        let core = self.core.clone();
        let out = run_with(ctx, async move { core.evaluate(eval).await }).await.map_err(to_status)?;
        Ok(Response::new(evaluate_response(&out)))
    }

    type RunPipelineStream = EventStream<RunPipelineResponse>;

    async fn run_pipeline(&self, _: Request<RunPipelineRequest>) -> Result<Response<Self::RunPipelineStream>, Status> {
        Err(Status::unimplemented(RUNS_LATER))
    }

    async fn get_run(&self, _: Request<GetRunRequest>) -> Result<Response<GetRunResponse>, Status> {
        Err(Status::unimplemented(RUNS_LATER))
    }

    async fn list_runs(&self, _: Request<ListRunsRequest>) -> Result<Response<ListRunsResponse>, Status> {
        Err(Status::unimplemented(RUNS_LATER))
    }

    type WatchRunStream = EventStream<WatchRunResponse>;

    async fn watch_run(&self, _: Request<WatchRunRequest>) -> Result<Response<Self::WatchRunStream>, Status> {
        Err(Status::unimplemented(RUNS_LATER))
    }

    async fn control_run(&self, _: Request<ControlRunRequest>) -> Result<Response<ControlRunResponse>, Status> {
        Err(Status::unimplemented(RUNS_LATER))
    }
}
