//! gRPC adapter: convert, call the core, map the result.

use std::pin::Pin;
use std::sync::Arc;

use assay_domain::{ScoreEvent, Scorer, StageError};
use assay_proto::convert;
use assay_proto::scorer::v1::score_stream_response::Event;
use assay_proto::scorer::v1::scorer_service_server::{ScorerService, ScorerServiceServer};
use assay_proto::scorer::v1::{
    JudgeSectionsRequest, JudgeSectionsResponse, JudgeSectionsStreamRequest, JudgeSectionsStreamResponse, ScoreRequest,
    ScoreResponse, ScoreStreamRequest, ScoreStreamResponse, TargetScored,
};
use assay_rpc::{CallContext, run_with, to_status};
use futures::Stream;
use tonic::service::Routes;
use tonic::{Request, Response, Status};

/// The scorer's gRPC face over any [`Scorer`].
#[derive(Clone)]
pub struct ScorerGrpc {
    core: Arc<dyn Scorer>,
}

impl ScorerGrpc {
    pub fn new(core: Arc<dyn Scorer>) -> Self {
        Self { core }
    }
}

/// Routes serving the scorer, with Assay's message limits.
pub fn routes(core: Arc<dyn Scorer>) -> Routes {
    Routes::new(
        ScorerServiceServer::new(ScorerGrpc::new(core))
            .max_decoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES),
    )
}

type ScoreEventStream = Pin<Box<dyn Stream<Item = Result<ScoreStreamResponse, Status>> + Send>>;

#[tonic::async_trait]
impl ScorerService for ScorerGrpc {
    async fn score(&self, request: Request<ScoreRequest>) -> Result<Response<ScoreResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let req = convert::score_request(request.into_inner(), "").map_err(to_status)?;
        let core = self.core.clone();
        let out =
            run_with(ctx, async move { core.score(req, &assay_domain::no_events).await }).await.map_err(to_status)?;
        Ok(Response::new(convert::score_response_to(&out)))
    }

    type ScoreStreamStream = ScoreEventStream;

    async fn score_stream(
        &self,
        request: Request<ScoreStreamRequest>,
    ) -> Result<Response<Self::ScoreStreamStream>, Status> {
        let ctx = CallContext::from_request(&request);
        let inner =
            request.into_inner().request.ok_or_else(|| to_status(StageError::invalid("request", "is required")))?;
        let req = convert::score_request(inner, "request").map_err(to_status)?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Result<ScoreStreamResponse, Status>>();
        let core = self.core.clone();
        // The task ends when the client goes away: the send fails and the scoring future is dropped.
        tokio::spawn(async move {
            let events_tx = tx.clone();
            let sink = move |e: ScoreEvent| match e {
                ScoreEvent::TargetScored { index, score } => {
                    let _ = events_tx.send(Ok(ScoreStreamResponse {
                        event: Some(Event::TargetScored(TargetScored {
                            index,
                            score: Some(convert::score_to(&score)),
                        })),
                    }));
                }
            };
            let work = run_with(ctx, core.score(req, &sink));
            let closed = tx.clone();
            tokio::select! {
                out = work => {
                    let msg = match out {
                        Ok(o) => Ok(ScoreStreamResponse { event: Some(Event::Result(convert::score_response_to(&o))) }),
                        Err(e) => Err(to_status(e)),
                    };
                    let _ = tx.send(msg);
                }
                () = closed.closed() => {}
            }
        });
        Ok(Response::new(Box::pin(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))))
    }

    async fn judge_sections(
        &self,
        _: Request<JudgeSectionsRequest>,
    ) -> Result<Response<JudgeSectionsResponse>, Status> {
        Err(Status::unimplemented("JudgeSections is being built"))
    }

    type JudgeSectionsStreamStream = Pin<Box<dyn Stream<Item = Result<JudgeSectionsStreamResponse, Status>> + Send>>;

    async fn judge_sections_stream(
        &self,
        _: Request<JudgeSectionsStreamRequest>,
    ) -> Result<Response<Self::JudgeSectionsStreamStream>, Status> {
        Err(Status::unimplemented("JudgeSectionsStream is being built"))
    }
}
