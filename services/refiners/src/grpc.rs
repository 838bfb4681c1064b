//! gRPC adapter of the refiners service. The checklist and content refiners stage is not built yet: every RPC answers
//! UNIMPLEMENTED with a message naming it, so clients see the full contract today.

use std::pin::Pin;

use assay_proto::refiners::v1::refiners_service_server::{RefinersService, RefinersServiceServer};
use assay_proto::refiners::v1::{
    DeduplicateRequest, DeduplicateResponse, ExpandSectionRequest, ExpandSectionResponse, PatchRequest, PatchResponse,
    RefineChecklistRequest, RefineChecklistResponse, RefineChecklistStreamRequest, RefineChecklistStreamResponse,
    SelectRequest, SelectResponse, SelfRefineRequest, SelfRefineResponse, SelfRefineStreamRequest,
    SelfRefineStreamResponse, TagRequest, TagResponse, UnitTestRequest, UnitTestResponse,
};
use futures::Stream;
use tonic::service::Routes;
use tonic::{Request, Response, Status};

/// The refiners service's gRPC face.
#[derive(Clone, Default)]
pub struct RefinersGrpc;

/// Routes serving the refiners service, with Assay's message limits.
pub fn routes() -> Routes {
    Routes::new(
        RefinersServiceServer::new(RefinersGrpc)
            .max_decoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES),
    )
}

fn not_yet(rpc: &str) -> Status {
    Status::unimplemented(format!(
        "{rpc} is not available yet: the refiners stage (checklist and content refiners) is not built in this release"
    ))
}

type EventStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl RefinersService for RefinersGrpc {
    async fn deduplicate(&self, _: Request<DeduplicateRequest>) -> Result<Response<DeduplicateResponse>, Status> {
        Err(not_yet("Deduplicate"))
    }

    async fn tag(&self, _: Request<TagRequest>) -> Result<Response<TagResponse>, Status> {
        Err(not_yet("Tag"))
    }

    async fn unit_test(&self, _: Request<UnitTestRequest>) -> Result<Response<UnitTestResponse>, Status> {
        Err(not_yet("UnitTest"))
    }

    async fn select(&self, _: Request<SelectRequest>) -> Result<Response<SelectResponse>, Status> {
        Err(not_yet("Select"))
    }

    async fn refine_checklist(
        &self,
        _: Request<RefineChecklistRequest>,
    ) -> Result<Response<RefineChecklistResponse>, Status> {
        Err(not_yet("RefineChecklist"))
    }

    type RefineChecklistStreamStream = EventStream<RefineChecklistStreamResponse>;

    async fn refine_checklist_stream(
        &self,
        _: Request<RefineChecklistStreamRequest>,
    ) -> Result<Response<Self::RefineChecklistStreamStream>, Status> {
        Err(not_yet("RefineChecklistStream"))
    }

    async fn self_refine(&self, _: Request<SelfRefineRequest>) -> Result<Response<SelfRefineResponse>, Status> {
        Err(not_yet("SelfRefine"))
    }

    type SelfRefineStreamStream = EventStream<SelfRefineStreamResponse>;

    async fn self_refine_stream(
        &self,
        _: Request<SelfRefineStreamRequest>,
    ) -> Result<Response<Self::SelfRefineStreamStream>, Status> {
        Err(not_yet("SelfRefineStream"))
    }

    async fn patch(&self, _: Request<PatchRequest>) -> Result<Response<PatchResponse>, Status> {
        Err(not_yet("Patch"))
    }

    async fn expand_section(
        &self,
        _: Request<ExpandSectionRequest>,
    ) -> Result<Response<ExpandSectionResponse>, Status> {
        Err(not_yet("ExpandSection"))
    }
}
