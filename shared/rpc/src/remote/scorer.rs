//! The scorer service over gRPC.

use assay_domain::judge::{JudgeEvent, JudgeSectionsRequest, PanelOutcome, SectionJudge};
use assay_domain::{EventSink, ScoreEvent, ScoreOutcome, ScoreRequest, Scorer, StageError};
use assay_proto::convert;
use assay_proto::convert::judge as convert_judge;
use assay_proto::scorer::v1::judge_sections_stream_response::Event as JudgeStreamEvent;
use assay_proto::scorer::v1::scorer_service_client::ScorerServiceClient;
use assay_proto::scorer::v1::{JudgeSectionsStreamRequest, JudgeSectionsStreamResponse};
use tonic::codegen::InterceptedService;
use tonic::transport::Channel;

use crate::auth::BearerInterceptor;
use crate::remote::ResendUnsent;
use crate::stream::{Streamed, consume_stream};
use crate::{from_status, outgoing};

/// The scorer, reached over gRPC.
#[derive(Clone)]
pub struct RemoteScorer {
    client: ScorerServiceClient<InterceptedService<ResendUnsent<Channel>, BearerInterceptor>>,
}

impl RemoteScorer {
    pub fn new(channel: Channel, token: Option<&str>) -> Self {
        let client = ScorerServiceClient::with_interceptor(ResendUnsent::new(channel), BearerInterceptor::new(token))
            .max_decoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES);
        Self { client }
    }
}

#[async_trait::async_trait]
impl Scorer for RemoteScorer {
    async fn score(
        &self,
        request: ScoreRequest,
        events: EventSink<'_, ScoreEvent>,
    ) -> Result<ScoreOutcome, StageError> {
        let msg = convert::score_request_to(&request);
        let mut client = self.client.clone();
        let reply = client.score(outgoing(msg)).await.map_err(from_status)?;
        let out = convert::score_response_from(reply.into_inner());
        for (i, s) in out.scores.iter().enumerate() {
            events(ScoreEvent::TargetScored { index: i as u32, score: s.clone() });
        }
        Ok(out)
    }
}

/// The section judge panel over JudgeSectionsStream: each finished judge is relayed to the sink as
/// it completes, then the result is returned.
#[async_trait::async_trait]
impl SectionJudge for RemoteScorer {
    async fn judge_sections(
        &self,
        request: JudgeSectionsRequest,
        events: EventSink<'_, JudgeEvent>,
    ) -> Result<PanelOutcome, StageError> {
        let msg = JudgeSectionsStreamRequest { request: Some(convert_judge::judge_sections_request_to(&request)) };
        let mut client = self.client.clone();
        let read = |reply: JudgeSectionsStreamResponse| {
            Ok(match reply.event {
                Some(JudgeStreamEvent::JudgeFinished(f)) => Streamed::Event(convert_judge::judge_finished_from(f)?),
                Some(JudgeStreamEvent::Result(r)) => Streamed::Done(convert_judge::judge_sections_response_from(r)?),
                Some(JudgeStreamEvent::Progress(_)) | None => Streamed::Skip,
            })
        };
        let call = client.judge_sections_stream(outgoing(msg));
        consume_stream(call, events, read, "the scorer's judge stream").await
    }
}
