//! gRPC adapter of the debate service: convert, call the core, map the result.

use std::sync::Arc;

use assay_domain::debate::{Debate, DebateEvent};
use assay_proto::convert::debate as convert;
use assay_proto::debate::v1::debate_service_server::{DebateService, DebateServiceServer};
use assay_proto::debate::v1::run_debate_stream_response::Event;
use assay_proto::debate::v1::{
    JudgeDebateRequest, JudgeDebateResponse, RefineSolutionsRequest, RefineSolutionsResponse, ReviewRequest,
    ReviewResponse, RunDebateRequest, RunDebateResponse, RunDebateStreamRequest, RunDebateStreamResponse, SolveRequest,
    SolveResponse,
};
use assay_rpc::stream::{Emit, EventStream, required_request};
use assay_rpc::{CallContext, run_with, serve_stream, to_status};
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

#[tonic::async_trait]
impl DebateService for DebateGrpc {
    async fn solve(&self, request: Request<SolveRequest>) -> Result<Response<SolveResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let req = convert::solve_request(request.into_inner(), "").map_err(to_status)?;
        let core = self.core.clone();
        let out = run_with(ctx, async move { core.solve(req).await }).await?;
        Ok(Response::new(convert::solve_response_to(&out)))
    }

    async fn review(&self, request: Request<ReviewRequest>) -> Result<Response<ReviewResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let req = convert::review_request(request.into_inner(), "").map_err(to_status)?;
        let core = self.core.clone();
        let out = run_with(ctx, async move { core.review(req).await }).await?;
        Ok(Response::new(convert::review_response_to(&out)))
    }

    async fn refine_solutions(
        &self,
        request: Request<RefineSolutionsRequest>,
    ) -> Result<Response<RefineSolutionsResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let req = convert::refine_request(request.into_inner(), "").map_err(to_status)?;
        let core = self.core.clone();
        let out = run_with(ctx, async move { core.refine(req).await }).await?;
        Ok(Response::new(convert::refine_response_to(&out)))
    }

    async fn judge_debate(
        &self,
        request: Request<JudgeDebateRequest>,
    ) -> Result<Response<JudgeDebateResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let req = convert::judge_request(request.into_inner(), "").map_err(to_status)?;
        let core = self.core.clone();
        let out = run_with(ctx, async move { core.judge(req).await }).await?;
        Ok(Response::new(convert::judgment_to(&out)))
    }

    async fn run_debate(&self, request: Request<RunDebateRequest>) -> Result<Response<RunDebateResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let req = convert::run_debate_request(request.into_inner(), "").map_err(to_status)?;
        let core = self.core.clone();
        let out = run_with(ctx, async move { core.run_debate(req, &assay_domain::no_events).await }).await?;
        Ok(Response::new(convert::run_debate_response_to(&out)))
    }

    type RunDebateStreamStream = EventStream<RunDebateStreamResponse>;

    async fn run_debate_stream(
        &self,
        request: Request<RunDebateStreamRequest>,
    ) -> Result<Response<Self::RunDebateStreamStream>, Status> {
        let ctx = CallContext::from_request(&request);
        let inner = required_request(request.into_inner().request)?;
        let req = convert::run_debate_request(inner, "request").map_err(to_status)?;
        let core = self.core.clone();
        // A client going away drops the debate with every model call in flight; errors the core
        // finds (e.g. an unknown backend) end the stream, their field paths under `request`.
        let work = move |sink: Emit<DebateEvent>| async move { core.run_debate(req, &*sink).await };
        let stage = |e: DebateEvent| RunDebateStreamResponse {
            event: Some(Event::StageCompleted(convert::stage_completed_to(&e))),
        };
        let result = |o| RunDebateStreamResponse { event: Some(Event::Result(convert::run_debate_response_to(&o))) };
        Ok(Response::new(serve_stream(ctx, work, stage, result)))
    }
}
