//! gRPC adapter of the debate service. The multi-LLM debate stage is not built yet: every RPC answers
//! UNIMPLEMENTED with a message naming it, so clients see the full contract today.

use std::pin::Pin;

use assay_proto::debate::v1::debate_service_server::{DebateService, DebateServiceServer};
use assay_proto::debate::v1::{
    JudgeDebateRequest, JudgeDebateResponse, RefineSolutionsRequest, RefineSolutionsResponse, ReviewRequest,
    ReviewResponse, RunDebateRequest, RunDebateResponse, RunDebateStreamRequest, RunDebateStreamResponse, SolveRequest,
    SolveResponse,
};
use futures::Stream;
use tonic::service::Routes;
use tonic::{Request, Response, Status};

/// The debate service's gRPC face.
#[derive(Clone, Default)]
pub struct DebateGrpc;

/// Routes serving the debate service, with Assay's message limits.
pub fn routes() -> Routes {
    Routes::new(
        DebateServiceServer::new(DebateGrpc)
            .max_decoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES),
    )
}

fn not_yet(rpc: &str) -> Status {
    Status::unimplemented(format!(
        "{rpc} is not available yet: the debate stage (multi-LLM debate) is not built in this release"
    ))
}

type EventStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl DebateService for DebateGrpc {
    async fn solve(&self, _: Request<SolveRequest>) -> Result<Response<SolveResponse>, Status> {
        Err(not_yet("Solve"))
    }

    async fn review(&self, _: Request<ReviewRequest>) -> Result<Response<ReviewResponse>, Status> {
        Err(not_yet("Review"))
    }

    async fn refine_solutions(
        &self,
        _: Request<RefineSolutionsRequest>,
    ) -> Result<Response<RefineSolutionsResponse>, Status> {
        Err(not_yet("RefineSolutions"))
    }

    async fn judge_debate(&self, _: Request<JudgeDebateRequest>) -> Result<Response<JudgeDebateResponse>, Status> {
        Err(not_yet("JudgeDebate"))
    }

    async fn run_debate(&self, _: Request<RunDebateRequest>) -> Result<Response<RunDebateResponse>, Status> {
        Err(not_yet("RunDebate"))
    }

    type RunDebateStreamStream = EventStream<RunDebateStreamResponse>;

    async fn run_debate_stream(
        &self,
        _: Request<RunDebateStreamRequest>,
    ) -> Result<Response<Self::RunDebateStreamStream>, Status> {
        Err(not_yet("RunDebateStream"))
    }
}
