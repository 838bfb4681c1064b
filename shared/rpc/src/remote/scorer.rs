//! The scorer service over gRPC.

use assay_domain::{EventSink, ScoreEvent, ScoreOutcome, ScoreRequest, Scorer, StageError};
use assay_proto::convert;
use assay_proto::scorer::v1::scorer_service_client::ScorerServiceClient;
use tonic::codegen::InterceptedService;
use tonic::transport::Channel;

use crate::auth::BearerInterceptor;
use crate::{from_status, outgoing};

/// The scorer, reached over gRPC.
#[derive(Clone)]
pub struct RemoteScorer {
    client: ScorerServiceClient<InterceptedService<Channel, BearerInterceptor>>,
}

impl RemoteScorer {
    pub fn new(channel: Channel, token: Option<&str>) -> Self {
        let client = ScorerServiceClient::with_interceptor(channel, BearerInterceptor::new(token))
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
