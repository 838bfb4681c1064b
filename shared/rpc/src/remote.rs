//! Stage traits implemented over gRPC: what the gateway holds in production.

use std::time::Duration;

use assay_domain::{EventSink, ScoreEvent, ScoreOutcome, ScoreRequest, Scorer, StageError};
use assay_proto::convert;
use assay_proto::scorer::v1::scorer_service_client::ScorerServiceClient;
use tonic::codegen::InterceptedService;
use tonic::transport::{Channel, Endpoint};

use crate::auth::BearerInterceptor;
use crate::{from_status, outgoing};

/// A channel to a stage, connected lazily (the stage may start after the gateway).
pub fn channel(url: &str) -> Result<Channel, StageError> {
    let endpoint = Endpoint::from_shared(url.to_string())
        .map_err(|e| StageError::Internal(format!("bad upstream url {url:?}: {e}")))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_while_idle(true);
    Ok(endpoint.connect_lazy())
}

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
