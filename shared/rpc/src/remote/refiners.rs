//! The refiners service over gRPC: the checklist chain, the content refiners (patch, expand) and
//! self-refine.

use assay_domain::refiners::{ChainOutcome, ChecklistRefiner, RefinerStep, StepReport};
use assay_domain::{ChecklistItem, EventSink, StageError};
use assay_proto::convert::refiners as convert;
use assay_proto::refiners::v1::refine_checklist_stream_response::Event;
use assay_proto::refiners::v1::refiners_service_client::RefinersServiceClient;
use assay_proto::refiners::v1::{RefineChecklistStreamRequest, RefineChecklistStreamResponse};
use tonic::codegen::InterceptedService;
use tonic::transport::Channel;

use crate::auth::BearerInterceptor;
use crate::remote::ResendUnsent;
use crate::stream::{Streamed, consume_stream};
use crate::{from_status, outgoing};

/// The refiners stage over gRPC (RefineChecklistStream: each finished step is reported as it
/// completes).
#[derive(Clone)]
pub struct RemoteRefiners {
    client: RefinersServiceClient<InterceptedService<ResendUnsent<Channel>, BearerInterceptor>>,
}

impl RemoteRefiners {
    /// A client on `channel` (see [`super::channel`]).
    pub fn new(channel: Channel, token: Option<&str>) -> Self {
        let client = RefinersServiceClient::with_interceptor(ResendUnsent::new(channel), BearerInterceptor::new(token))
            .max_decoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES);
        Self { client }
    }
}

#[async_trait::async_trait]
impl ChecklistRefiner for RemoteRefiners {
    async fn refine(
        &self,
        items: Vec<ChecklistItem>,
        steps: Vec<RefinerStep>,
        events: EventSink<'_, StepReport>,
    ) -> Result<ChainOutcome, StageError> {
        let mut client = self.client.clone();
        let msg = RefineChecklistStreamRequest { request: Some(convert::refine_checklist_request_to(&items, &steps)) };
        let mut reports = Vec::new();
        let read = |reply: RefineChecklistStreamResponse| {
            Ok(match reply.event {
                Some(Event::StepCompleted(s)) => {
                    let report = convert::step_completed_from(s);
                    reports.push(report.clone());
                    Streamed::Event(report)
                }
                Some(Event::Result(r)) => Streamed::Done(convert::refine_checklist_response_from(r)?),
                Some(Event::Progress(_)) | None => Streamed::Skip,
            })
        };
        let call = client.refine_checklist_stream(outgoing(msg));
        let mut out = consume_stream(call, events, read, "the refiners' chain stream").await?;
        out.steps = reports;
        Ok(out)
    }
}

#[async_trait::async_trait]
impl assay_domain::content::ContentRefiner for RemoteRefiners {
    async fn patch(
        &self,
        request: assay_domain::content::SectionEditRequest,
    ) -> Result<assay_domain::content::SectionEdit, StageError> {
        let reply =
            self.client.clone().patch(outgoing(convert::patch_request_to(&request))).await.map_err(from_status)?;
        Ok(convert::patch_response_from(reply.into_inner()))
    }

    async fn expand_section(
        &self,
        request: assay_domain::content::SectionEditRequest,
    ) -> Result<assay_domain::content::SectionEdit, StageError> {
        let reply = self
            .client
            .clone()
            .expand_section(outgoing(convert::expand_request_to(&request)))
            .await
            .map_err(from_status)?;
        Ok(convert::expand_response_from(reply.into_inner()))
    }
}

/// Self-refine over SelfRefineStream: each finished pass goes to the sink as it arrives, then the
/// result. Field paths of an INVALID_ARGUMENT come back relative to the request (`draft`, not
/// `request.draft`).
#[async_trait::async_trait]
impl assay_domain::self_refine::SelfRefiner for RemoteRefiners {
    async fn self_refine(
        &self,
        request: assay_domain::self_refine::SelfRefineRequest,
        events: EventSink<'_, assay_domain::self_refine::SelfRefinePassEvent>,
    ) -> Result<assay_domain::self_refine::SelfRefineOutcome, StageError> {
        use assay_domain::self_refine::SelfRefinePassEvent;
        use assay_proto::convert::self_refine as sr;
        use assay_proto::refiners::v1::self_refine_stream_response::Event as SelfRefineEvent;
        use assay_proto::refiners::v1::{SelfRefineStreamRequest, SelfRefineStreamResponse};

        let mut client = self.client.clone();
        let msg = SelfRefineStreamRequest { request: Some(sr::self_refine_request_to(&request)) };
        let read = |reply: SelfRefineStreamResponse| {
            Ok(match reply.event {
                Some(SelfRefineEvent::Pass(p)) => Streamed::Event(SelfRefinePassEvent::PassFinished(sr::pass_from(p))),
                Some(SelfRefineEvent::Result(r)) => Streamed::Done(sr::self_refine_response_from(r)),
                None => Streamed::Skip,
            })
        };
        let call = client.self_refine_stream(outgoing(msg));
        consume_stream(call, events, read, "the refiners' self-refine stream").await
    }
}
