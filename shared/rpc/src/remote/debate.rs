//! The debate service over gRPC.

use assay_domain::debate::{
    Debate, DebateEvent, DebateOutcome, DebateRequest, JudgeRequest, Judgment, RefineOutcome, RefineRequest,
    ReviewOutcome, ReviewRequest, SolveOutcome, SolveRequest,
};
use assay_domain::{EventSink, StageError};
use assay_proto::convert::debate as convert;
use assay_proto::debate::v1::debate_service_client::DebateServiceClient;
use assay_proto::debate::v1::run_debate_stream_response::Event;
use assay_proto::debate::v1::{RunDebateStreamRequest, RunDebateStreamResponse};
use tonic::codegen::InterceptedService;
use tonic::transport::Channel;

use crate::auth::BearerInterceptor;
use crate::remote::ResendUnsent;
use crate::stream::{Streamed, consume_stream};
use crate::{from_status, outgoing};

/// The debate service, reached over gRPC.
#[derive(Clone)]
pub struct RemoteDebate {
    client: DebateServiceClient<InterceptedService<ResendUnsent<Channel>, BearerInterceptor>>,
}

impl RemoteDebate {
    pub fn new(channel: Channel, token: Option<&str>) -> Self {
        let client = DebateServiceClient::with_interceptor(ResendUnsent::new(channel), BearerInterceptor::new(token))
            .max_decoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES);
        Self { client }
    }
}

#[async_trait::async_trait]
impl Debate for RemoteDebate {
    async fn solve(&self, request: SolveRequest) -> Result<SolveOutcome, StageError> {
        let reply =
            self.client.clone().solve(outgoing(convert::solve_request_to(&request))).await.map_err(from_status)?;
        Ok(convert::solve_response_from(reply.into_inner()))
    }

    async fn review(&self, request: ReviewRequest) -> Result<ReviewOutcome, StageError> {
        let reply =
            self.client.clone().review(outgoing(convert::review_request_to(&request))).await.map_err(from_status)?;
        Ok(convert::review_response_from(reply.into_inner()))
    }

    async fn refine(&self, request: RefineRequest) -> Result<RefineOutcome, StageError> {
        let reply = self
            .client
            .clone()
            .refine_solutions(outgoing(convert::refine_request_to(&request)))
            .await
            .map_err(from_status)?;
        Ok(convert::refine_response_from(reply.into_inner()))
    }

    async fn judge(&self, request: JudgeRequest) -> Result<Judgment, StageError> {
        let reply = self
            .client
            .clone()
            .judge_debate(outgoing(convert::judge_request_to(&request)))
            .await
            .map_err(from_status)?;
        Ok(convert::judgment_from(reply.into_inner()))
    }

    /// Over RunDebateStream: every finished stage is relayed to the sink as it completes, then the
    /// result is returned.
    async fn run_debate(
        &self,
        request: DebateRequest,
        events: EventSink<'_, DebateEvent>,
    ) -> Result<DebateOutcome, StageError> {
        let msg = RunDebateStreamRequest { request: Some(convert::run_debate_request_to(&request)) };
        let mut client = self.client.clone();
        let read = |reply: RunDebateStreamResponse| {
            Ok(match reply.event {
                Some(Event::StageCompleted(e)) => Streamed::Event(convert::stage_completed_from(e)?),
                Some(Event::Result(r)) => Streamed::Done(convert::run_debate_response_from(r)),
                None => Streamed::Skip,
            })
        };
        consume_stream(client.run_debate_stream(outgoing(msg)), events, read, "the debate stream").await
    }
}
