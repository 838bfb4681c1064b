//! gRPC adapter of the debate service: convert, call the core, map the result.

use std::pin::Pin;
use std::sync::Arc;

use assay_domain::StageError;
use assay_domain::debate::{Debate, DebateEvent};
use assay_proto::convert::debate as convert;
use assay_proto::debate::v1::debate_service_server::{DebateService, DebateServiceServer};
use assay_proto::debate::v1::run_debate_stream_response::Event;
use assay_proto::debate::v1::{
    JudgeDebateRequest, JudgeDebateResponse, RefineSolutionsRequest, RefineSolutionsResponse, ReviewRequest,
    ReviewResponse, RunDebateRequest, RunDebateResponse, RunDebateStreamRequest, RunDebateStreamResponse, SolveRequest,
    SolveResponse,
};
use assay_rpc::{CallContext, run_with, to_status};
use futures::Stream;
use tonic::service::Routes;
use tonic::{Request, Response, Status};

/// The debate service's gRPC face over any [`Debate`].
#[derive(Clone)]
pub struct DebateGrpc {
    core: Arc<dyn Debate>,
}

impl DebateGrpc {
    pub fn new(core: Arc<dyn Debate>) -> Self {
        Self { core }
    }
}

/// Routes serving the debate service, with Assay's message limits.
pub fn routes(core: Arc<dyn Debate>) -> Routes {
    Routes::new(
        DebateServiceServer::new(DebateGrpc::new(core))
            .max_decoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES),
    )
}

type EventStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl DebateService for DebateGrpc {
    async fn solve(&self, request: Request<SolveRequest>) -> Result<Response<SolveResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let req = convert::solve_request(request.into_inner(), "").map_err(to_status)?;
        let core = self.core.clone();
        let out = run_with(ctx, async move { core.solve(req).await }).await.map_err(to_status)?;
        Ok(Response::new(convert::solve_response_to(&out)))
    }

    async fn review(&self, request: Request<ReviewRequest>) -> Result<Response<ReviewResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let req = convert::review_request(request.into_inner(), "").map_err(to_status)?;
        let core = self.core.clone();
        let out = run_with(ctx, async move { core.review(req).await }).await.map_err(to_status)?;
        Ok(Response::new(convert::review_response_to(&out)))
    }

    async fn refine_solutions(
        &self,
        request: Request<RefineSolutionsRequest>,
    ) -> Result<Response<RefineSolutionsResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let req = convert::refine_request(request.into_inner(), "").map_err(to_status)?;
        let core = self.core.clone();
        let out = run_with(ctx, async move { core.refine(req).await }).await.map_err(to_status)?;
        Ok(Response::new(convert::refine_response_to(&out)))
    }

    async fn judge_debate(
        &self,
        request: Request<JudgeDebateRequest>,
    ) -> Result<Response<JudgeDebateResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let req = convert::judge_request(request.into_inner(), "").map_err(to_status)?;
        let core = self.core.clone();
        let out = run_with(ctx, async move { core.judge(req).await }).await.map_err(to_status)?;
        Ok(Response::new(convert::judgment_to(&out)))
    }

    async fn run_debate(&self, request: Request<RunDebateRequest>) -> Result<Response<RunDebateResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let req = convert::run_debate_request(request.into_inner(), "").map_err(to_status)?;
        let core = self.core.clone();
        let out = run_with(ctx, async move { core.run_debate(req, &assay_domain::no_events).await })
            .await
            .map_err(to_status)?;
        Ok(Response::new(convert::run_debate_response_to(&out)))
    }

    type RunDebateStreamStream = EventStream<RunDebateStreamResponse>;

    async fn run_debate_stream(
        &self,
        request: Request<RunDebateStreamRequest>,
    ) -> Result<Response<Self::RunDebateStreamStream>, Status> {
        let ctx = CallContext::from_request(&request);
        let inner =
            request.into_inner().request.ok_or_else(|| to_status(StageError::invalid("request", "is required")))?;
        let req = convert::run_debate_request(inner, "request").map_err(to_status)?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Result<RunDebateStreamResponse, Status>>();
        let core = self.core.clone();
        // The task ends when the client goes away: the send side sees the receiver closed and the
        // debate future (with every model call in flight) is dropped.
        tokio::spawn(tracing::Instrument::in_current_span(async move {
            let events_tx = tx.clone();
            let sink = move |e: DebateEvent| {
                let _ = events_tx.send(Ok(RunDebateStreamResponse {
                    event: Some(Event::StageCompleted(convert::stage_completed_to(&e))),
                }));
            };
            // Field paths of errors the core finds (e.g. an unknown backend) get the same
            // `request.` prefix as the conversion's.
            let work = async {
                run_with(ctx, core.run_debate(req, &sink)).await.map_err(|e| e.map_fields(|f| format!("request.{f}")))
            };
            let closed = tx.clone();
            tokio::select! {
                out = work => {
                    let msg = match out {
                        Ok(o) => Ok(RunDebateStreamResponse { event: Some(Event::Result(convert::run_debate_response_to(&o))) }),
                        Err(e) => Err(to_status(e)),
                    };
                    let _ = tx.send(msg);
                }
                () = closed.closed() => {}
            }
        }));
        Ok(Response::new(Box::pin(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))))
    }
}
