//! gRPC adapter of the refiners service: convert, call the core, map the result. Every RPC is
//! served by [`ChecklistRefiners`]: the checklist refiners, the content refiners (Patch,
//! ExpandSection) and self-refine (SelfRefine, SelfRefineStream).

use std::sync::Arc;

use assay_domain::content::ContentRefiner;
use assay_domain::self_refine::SelfRefinePassEvent;
use assay_proto::convert::refiners as convert;
use assay_proto::convert::self_refine as sr;
use assay_proto::refiners::v1::refine_checklist_stream_response::Event;
use assay_proto::refiners::v1::refiners_service_server::{RefinersService, RefinersServiceServer};
use assay_proto::refiners::v1::self_refine_stream_response::Event as SrEvent;
use assay_proto::refiners::v1::{
    DeduplicateRequest, DeduplicateResponse, ExpandSectionRequest, ExpandSectionResponse, PatchRequest, PatchResponse,
    RefineChecklistRequest, RefineChecklistResponse, RefineChecklistStreamRequest, RefineChecklistStreamResponse,
    SelectRequest, SelectResponse, SelfRefineRequest, SelfRefineResponse, SelfRefineStreamRequest,
    SelfRefineStreamResponse, TagRequest, TagResponse, UnitTestRequest, UnitTestResponse,
};
use assay_rpc::stream::{Emit, EventStream, in_stream, required_request};
use assay_rpc::{CallContext, run_with, serve_stream, to_status};
use tonic::service::Routes;
use tonic::{Request, Response, Status};

use crate::core::{ChecklistRefiners, StepReport};

/// The refiners service's gRPC face.
#[derive(Clone)]
pub struct RefinersGrpc {
    core: Arc<ChecklistRefiners>,
}

impl RefinersGrpc {
    pub fn new(core: Arc<ChecklistRefiners>) -> Self {
        Self { core }
    }
}

/// Routes serving the refiners service, with Assay's message limits.
pub fn routes(core: Arc<ChecklistRefiners>) -> Routes {
    Routes::new(
        RefinersServiceServer::new(RefinersGrpc::new(core))
            .max_decoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES),
    )
}

#[tonic::async_trait]
impl RefinersService for RefinersGrpc {
    async fn deduplicate(&self, request: Request<DeduplicateRequest>) -> Result<Response<DeduplicateResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let (items, options) = convert::deduplicate_request(request.into_inner()).map_err(to_status)?;
        let core = self.core.clone();
        let out = run_with(ctx, async move { core.deduplicate(items, &options).await }).await?;
        Ok(Response::new(convert::deduplicate_response_to(&out)))
    }

    async fn tag(&self, request: Request<TagRequest>) -> Result<Response<TagResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let (items, options) = convert::tag_request(request.into_inner()).map_err(to_status)?;
        let core = self.core.clone();
        let out = run_with(ctx, async move { core.tag(items, &options).await }).await?;
        Ok(Response::new(convert::tag_response_to(&out)))
    }

    async fn unit_test(&self, request: Request<UnitTestRequest>) -> Result<Response<UnitTestResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let (items, options) = convert::unit_test_request(request.into_inner()).map_err(to_status)?;
        let core = self.core.clone();
        let out = run_with(ctx, async move { core.unit_test(items, &options).await }).await?;
        Ok(Response::new(convert::unit_test_response_to(&out)))
    }

    async fn select(&self, request: Request<SelectRequest>) -> Result<Response<SelectResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let (items, options) = convert::select_request(request.into_inner()).map_err(to_status)?;
        let core = self.core.clone();
        let out = run_with(ctx, async move { core.select(items, &options).await }).await?;
        Ok(Response::new(convert::select_response_to(&out)))
    }

    async fn refine_checklist(
        &self,
        request: Request<RefineChecklistRequest>,
    ) -> Result<Response<RefineChecklistResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let (items, steps) = convert::refine_checklist_request(request.into_inner(), "").map_err(to_status)?;
        let core = self.core.clone();
        let out = run_with(ctx, async move { core.run_chain(items, &steps, &assay_domain::no_events).await }).await?;
        Ok(Response::new(convert::refine_checklist_response_to(&out)))
    }

    type RefineChecklistStreamStream = EventStream<RefineChecklistStreamResponse>;

    async fn refine_checklist_stream(
        &self,
        request: Request<RefineChecklistStreamRequest>,
    ) -> Result<Response<Self::RefineChecklistStreamStream>, Status> {
        let ctx = CallContext::from_request(&request);
        let inner = required_request(request.into_inner().request)?;
        let (items, steps) = convert::refine_checklist_request(inner, "request").map_err(to_status)?;
        // Bad input fails the call itself, before the stream starts.
        assay_domain::refiners::validate_chain(&items, &steps).map_err(|e| to_status(in_stream(e)))?;
        let core = self.core.clone();
        let work = move |sink: Emit<StepReport>| async move { core.run_chain(items, &steps, &*sink).await };
        let step = |r: StepReport| RefineChecklistStreamResponse {
            event: Some(Event::StepCompleted(convert::step_completed_to(&r))),
        };
        let result =
            |o| RefineChecklistStreamResponse { event: Some(Event::Result(convert::refine_checklist_response_to(&o))) };
        Ok(Response::new(serve_stream(ctx, work, step, result)))
    }

    async fn self_refine(&self, request: Request<SelfRefineRequest>) -> Result<Response<SelfRefineResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let req = sr::self_refine_request(request.into_inner(), "").map_err(to_status)?;
        let core = self.core.clone();
        let out = run_with(ctx, async move { core.run_self_refine(req, &assay_domain::no_events).await }).await?;
        Ok(Response::new(sr::self_refine_response_to(&out)))
    }

    type SelfRefineStreamStream = EventStream<SelfRefineStreamResponse>;

    async fn self_refine_stream(
        &self,
        request: Request<SelfRefineStreamRequest>,
    ) -> Result<Response<Self::SelfRefineStreamStream>, Status> {
        let ctx = CallContext::from_request(&request);
        let req = sr::self_refine_stream_request(request.into_inner()).map_err(to_status)?;
        // Bad input (an unknown backend included) fails the call itself, before the stream starts.
        self.core.check_self_refine(&req).map_err(|e| to_status(in_stream(e)))?;
        let core = self.core.clone();
        let work = move |sink: Emit<SelfRefinePassEvent>| async move { core.run_self_refine(req, &*sink).await };
        let pass = |e: SelfRefinePassEvent| match e {
            SelfRefinePassEvent::PassFinished(p) => {
                SelfRefineStreamResponse { event: Some(SrEvent::Pass(sr::pass_to(&p))) }
            }
        };
        let result = |o| SelfRefineStreamResponse { event: Some(SrEvent::Result(sr::self_refine_response_to(&o))) };
        Ok(Response::new(serve_stream(ctx, work, pass, result)))
    }

    async fn patch(&self, request: Request<PatchRequest>) -> Result<Response<PatchResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let req = convert::patch_request(request.into_inner()).map_err(to_status)?;
        let core = self.core.clone();
        let out = run_with(ctx, async move { ContentRefiner::patch(core.as_ref(), req).await }).await?;
        Ok(Response::new(convert::patch_response_to(&out)))
    }

    async fn expand_section(
        &self,
        request: Request<ExpandSectionRequest>,
    ) -> Result<Response<ExpandSectionResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let req = convert::expand_request(request.into_inner()).map_err(to_status)?;
        let core = self.core.clone();
        let out = run_with(ctx, async move { core.expand_section(req).await }).await?;
        Ok(Response::new(convert::expand_response_to(&out)))
    }
}
