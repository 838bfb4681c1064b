//! gRPC adapter of the delta-judge service. The fix verification stage is not built yet: every RPC answers
//! UNIMPLEMENTED with a message naming it, so clients see the full contract today.

use assay_proto::delta_judge::v1::delta_judge_service_server::{DeltaJudgeService, DeltaJudgeServiceServer};
use assay_proto::delta_judge::v1::{
    CheckConvergenceRequest, CheckConvergenceResponse, CheckQualityLocksRequest, CheckQualityLocksResponse,
    ReadabilityRequest, ReadabilityResponse, VerifyRequest, VerifyResponse,
};

use tonic::service::Routes;
use tonic::{Request, Response, Status};

/// The delta-judge service's gRPC face.
#[derive(Clone, Default)]
pub struct DeltaJudgeGrpc;

/// Routes serving the delta-judge service, with Assay's message limits.
pub fn routes() -> Routes {
    Routes::new(
        DeltaJudgeServiceServer::new(DeltaJudgeGrpc)
            .max_decoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES),
    )
}

fn not_yet(rpc: &str) -> Status {
    Status::unimplemented(format!(
        "{rpc} is not available yet: the delta-judge stage (fix verification) is not built in this release"
    ))
}

#[tonic::async_trait]
impl DeltaJudgeService for DeltaJudgeGrpc {
    async fn verify(&self, _: Request<VerifyRequest>) -> Result<Response<VerifyResponse>, Status> {
        Err(not_yet("Verify"))
    }

    async fn readability(&self, _: Request<ReadabilityRequest>) -> Result<Response<ReadabilityResponse>, Status> {
        Err(not_yet("Readability"))
    }

    async fn check_quality_locks(
        &self,
        _: Request<CheckQualityLocksRequest>,
    ) -> Result<Response<CheckQualityLocksResponse>, Status> {
        Err(not_yet("CheckQualityLocks"))
    }

    async fn check_convergence(
        &self,
        _: Request<CheckConvergenceRequest>,
    ) -> Result<Response<CheckConvergenceResponse>, Status> {
        Err(not_yet("CheckConvergence"))
    }
}
