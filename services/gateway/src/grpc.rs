//! gRPC adapter of the gateway: requests go to the run engine as they are (the pipelines parse
//! them, once), results and errors come back through `to_status`.

use std::pin::Pin;

use assay_domain::limits::{MAX_ACTOR_CHARS, MAX_REASON_CHARS};
use assay_domain::{StageError, Violations};
use assay_proto::gateway::v1::gateway_service_server::{GatewayService, GatewayServiceServer};
use assay_proto::gateway::v1::{
    AppendRecordsRequest, AppendRecordsResponse, CompareRunsRequest, CompareRunsResponse, ControlRunRequest,
    ControlRunResponse, DeleteRunRequest, DeleteRunResponse, EvaluateRequest, EvaluateResponse, GetRunRequest,
    GetRunResponse, ListRunResultsRequest, ListRunResultsResponse, ListRunsRequest, ListRunsResponse,
    RunPipelineRequest, RunPipelineResponse, WatchRunRequest, WatchRunResponse,
};
use assay_proto::pipelines::{self, PipelineContract, result_of};
use assay_rpc::{CallContext, run_with, to_status};
use futures::{Stream, StreamExt};
use tonic::service::Routes;
use tonic::{Request, Response, Status};

use assay_runs::Engine;

pub mod compare;

/// The gateway's gRPC face.
#[derive(Clone)]
pub struct GatewayGrpc {
    engine: Engine,
}

/// Routes serving the gateway, with Assay's message limits.
impl GatewayGrpc {
    pub fn new(engine: Engine) -> Self {
        Self { engine }
    }
}

pub fn routes(engine: Engine) -> Routes {
    Routes::new(
        GatewayServiceServer::new(GatewayGrpc { engine })
            .max_decoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES),
    )
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

/// A control's own fields (the action is the engine's and the pipeline's to check): a run id, and
/// an actor and a reason short enough to keep in the audit log every GetRun returns, with no
/// control character (a NUL, an ESC, a CR or LF would reach log lines and terminals as they are:
/// a forged log line, a rewritten screen).
fn check_control(req: &ControlRunRequest) -> Result<(), StageError> {
    let ControlRunRequest { run_id, action: _, actor, reason } = req;
    let mut v = Violations::new();
    if run_id.is_empty() {
        v.push("run_id", "must not be empty");
    }
    for (field, text, limit) in [("actor", actor, MAX_ACTOR_CHARS), ("reason", reason, MAX_REASON_CHARS)] {
        let chars = text.chars().count();
        if chars > limit {
            v.push(field, format!("is {chars} characters; the limit is {limit} characters"));
        } else if let Some((at, c)) = text.chars().enumerate().find(|(_, c)| c.is_control()) {
            v.push(
                field,
                format!(
                    "must not contain control characters (U+0000-U+001F, U+007F-U+009F); U+{:04X} at character {at}",
                    u32::from(c)
                ),
            );
        }
    }
    v.into_result()
}

#[tonic::async_trait]
impl GatewayService for GatewayGrpc {
    /// A checklist evaluation run to the end and answered at once (stored finished).
    async fn evaluate(&self, request: Request<EvaluateRequest>) -> Result<Response<EvaluateResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let EvaluateRequest { pipeline, budget } = request.into_inner();
        let Some(pipeline) = pipeline else {
            return Err(to_status(StageError::invalid("pipeline", "is required")));
        };
        let request = RunPipelineRequest {
            pipeline: Some(pipelines::ChecklistEval::wrap_request(pipeline)),
            label: "evaluate".into(),
            budget,
            open: false,
        };
        let engine = self.engine.clone();
        let run = run_with(ctx, async move { engine.run_unpersisted(request).await }).await?;
        match result_of::<pipelines::ChecklistEval>(run.result) {
            Some(e) => Ok(Response::new(e)),
            None => Err(to_status(StageError::Internal(format!("run {} ended without an evaluation", run.run_id)))),
        }
    }

    type RunPipelineStream = EventStream<RunPipelineResponse>;

    async fn run_pipeline(
        &self,
        request: Request<RunPipelineRequest>,
    ) -> Result<Response<Self::RunPipelineStream>, Status> {
        let run_id = self.engine.start(request.into_inner()).await.map_err(to_status)?;
        // Follow from the first event; the run goes on if the client leaves (reattach with WatchRun).
        let stream = self.engine.watch(&run_id, 0).await.map_err(to_status)?;
        Ok(Response::new(Box::pin(
            stream.map(|r| r.map(|e| RunPipelineResponse { event: Some(e) }).map_err(to_status)),
        )))
    }

    async fn get_run(&self, request: Request<GetRunRequest>) -> Result<Response<GetRunResponse>, Status> {
        let GetRunRequest { run_id } = request.into_inner();
        if run_id.is_empty() {
            return Err(to_status(StageError::invalid("run_id", "must not be empty")));
        }
        let run = self.engine.get(&run_id).await.map_err(to_status)?;
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
        let mut runs = self.engine.store().list(kind, state, cursor, size + 1).await.map_err(to_status)?;
        let next = if runs.len() > size {
            runs.truncate(size);
            runs.last().map(page_token).unwrap_or_default()
        } else {
            String::new()
        };
        // Pages stay light: results and the refinement's document, tasks and issues are in GetRun.
        for r in &mut runs {
            r.result = None;
            if let Some(assay_proto::gateway::v1::run::Progress::Refinement(p)) = r.progress.as_mut() {
                p.sections.clear();
                p.tasks.clear();
                p.unresolved_issues.clear();
            }
        }
        Ok(Response::new(ListRunsResponse { runs, next_page_token: next }))
    }

    type WatchRunStream = EventStream<WatchRunResponse>;

    async fn watch_run(&self, request: Request<WatchRunRequest>) -> Result<Response<Self::WatchRunStream>, Status> {
        let WatchRunRequest { run_id, after_sequence } = request.into_inner();
        if run_id.is_empty() {
            return Err(to_status(StageError::invalid("run_id", "must not be empty")));
        }
        let stream = self.engine.watch(&run_id, after_sequence).await.map_err(to_status)?;
        Ok(Response::new(Box::pin(stream.map(|r| r.map(|e| WatchRunResponse { event: Some(e) }).map_err(to_status)))))
    }

    async fn control_run(&self, request: Request<ControlRunRequest>) -> Result<Response<ControlRunResponse>, Status> {
        let req = request.into_inner();
        check_control(&req).map_err(to_status)?;
        let run = self.engine.control(req).await.map_err(to_status)?;
        Ok(Response::new(ControlRunResponse { run: Some(run) }))
    }

    async fn delete_run(&self, request: Request<DeleteRunRequest>) -> Result<Response<DeleteRunResponse>, Status> {
        let DeleteRunRequest { run_id } = request.into_inner();
        if run_id.is_empty() {
            return Err(to_status(StageError::invalid("run_id", "must not be empty")));
        }
        let run = self.engine.delete(&run_id).await.map_err(to_status)?;
        Ok(Response::new(DeleteRunResponse { run: Some(run) }))
    }

    /// Records into an open run, message by message: each message is appended (all of it or
    /// none) as it arrives, so a call broken midway keeps what it sent before; the answer says
    /// what the run holds.
    async fn append_records(
        &self,
        request: Request<tonic::Streaming<AppendRecordsRequest>>,
    ) -> Result<Response<AppendRecordsResponse>, Status> {
        let mut stream = request.into_inner();
        let mut run: Option<String> = None;
        let mut reply = AppendRecordsResponse::default();
        let mut n = 0usize;
        while let Some(message) = stream.message().await? {
            let AppendRecordsRequest { run_id, records, seal } = message;
            let run_id = match &run {
                Some(first) if run_id.is_empty() || &run_id == first => first.clone(),
                Some(first) => {
                    return Err(to_status(StageError::invalid(
                        "run_id",
                        format!("message {n} names run {run_id:?}; this call appends to {first:?}"),
                    )));
                }
                None => run_id,
            };
            let appended = self
                .engine
                .append(&run_id, records, seal)
                .await
                .map_err(|e| to_status(e.map_fields(|f| if n == 0 { f } else { format!("messages[{n}].{f}") })))?;
            reply.appended += appended.total - appended.first;
            reply.records_total = appended.total;
            reply.sealed = appended.sealed;
            reply.run_id.clone_from(&run_id);
            run = Some(run_id);
            n += 1;
        }
        if run.is_none() {
            return Err(to_status(StageError::invalid("run_id", "the call sent no message")));
        }
        Ok(Response::new(reply))
    }

    async fn list_run_results(
        &self,
        request: Request<ListRunResultsRequest>,
    ) -> Result<Response<ListRunResultsResponse>, Status> {
        let reply = crate::pipelines::checklist_eval::list_run_results(&self.engine, request.into_inner())
            .await
            .map_err(to_status)?;
        Ok(Response::new(reply))
    }

    /// Two stored checklist_eval runs compared by the core `assay compare` uses.
    async fn compare_runs(
        &self,
        request: Request<CompareRunsRequest>,
    ) -> Result<Response<CompareRunsResponse>, Status> {
        let reply = compare::compare_runs(&self.engine, request.into_inner()).await.map_err(to_status)?;
        Ok(Response::new(reply))
    }
}
