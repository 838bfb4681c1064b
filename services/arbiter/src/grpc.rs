//! gRPC adapter of the arbiter service. The verdict consolidation, agreement, routing and plans stage is not built yet: every RPC answers
//! UNIMPLEMENTED with a message naming it, so clients see the full contract today.

use assay_proto::arbiter::v1::arbiter_service_server::{ArbiterService, ArbiterServiceServer};
use assay_proto::arbiter::v1::{
    ComputeAgreementRequest, ComputeAgreementResponse, ConsolidateRequest, ConsolidateResponse, PlanRequest,
    PlanResponse, RouteRequest, RouteResponse,
};

use tonic::service::Routes;
use tonic::{Request, Response, Status};

/// The arbiter service's gRPC face.
#[derive(Clone, Default)]
pub struct ArbiterGrpc;

/// Routes serving the arbiter service, with Assay's message limits.
pub fn routes() -> Routes {
    Routes::new(
        ArbiterServiceServer::new(ArbiterGrpc)
            .max_decoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES),
    )
}

fn not_yet(rpc: &str) -> Status {
    Status::unimplemented(format!(
        "{rpc} is not available yet: the arbiter stage (verdict consolidation, agreement, routing and plans) is not built in this release"
    ))
}

#[tonic::async_trait]
impl ArbiterService for ArbiterGrpc {
    async fn compute_agreement(
        &self,
        _: Request<ComputeAgreementRequest>,
    ) -> Result<Response<ComputeAgreementResponse>, Status> {
        Err(not_yet("ComputeAgreement"))
    }

    async fn consolidate(&self, _: Request<ConsolidateRequest>) -> Result<Response<ConsolidateResponse>, Status> {
        Err(not_yet("Consolidate"))
    }

    async fn route(&self, _: Request<RouteRequest>) -> Result<Response<RouteResponse>, Status> {
        Err(not_yet("Route"))
    }

    async fn plan(&self, _: Request<PlanRequest>) -> Result<Response<PlanResponse>, Status> {
        Err(not_yet("Plan"))
    }
}
