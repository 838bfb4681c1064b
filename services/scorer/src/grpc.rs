//! gRPC adapter: convert, call the core, map the result.

use std::pin::Pin;
use std::sync::Arc;

use assay_domain::judge::{JudgeEvent, SectionJudge};
use assay_domain::{ScoreEvent, Scorer, StageError};
use assay_proto::convert;
use assay_proto::convert::judge as convert_judge;
use assay_proto::scorer::v1::judge_sections_stream_response::Event as JudgeStreamEvent;
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

/// The scorer's gRPC face over any [`Scorer`] and [`SectionJudge`].
#[derive(Clone)]
pub struct ScorerGrpc {
    core: Arc<dyn Scorer>,
    judge: Arc<dyn SectionJudge>,
}

impl ScorerGrpc {
    pub fn new(core: Arc<dyn Scorer>, judge: Arc<dyn SectionJudge>) -> Self {
        Self { core, judge }
    }
}

/// Routes serving the scorer (checklist scoring and the section judge panel from one core), with
/// Assay's message limits.
pub fn routes<C: Scorer + SectionJudge + 'static>(core: Arc<C>) -> Routes {
    Routes::new(
        ScorerServiceServer::new(ScorerGrpc::new(core.clone(), core))
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
        tokio::spawn(tracing::Instrument::in_current_span(async move {
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
            // Field paths of errors the core finds (e.g. an unknown backend) get the same
            // `request.` prefix as the conversion's.
            let work = async {
                run_with(ctx, core.score(req, &sink)).await.map_err(|e| e.map_fields(|f| format!("request.{f}")))
            };
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
        }));
        Ok(Response::new(Box::pin(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))))
    }

    async fn judge_sections(
        &self,
        request: Request<JudgeSectionsRequest>,
    ) -> Result<Response<JudgeSectionsResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let req = convert_judge::judge_sections_request(request.into_inner(), "").map_err(to_status)?;
        let judge = self.judge.clone();
        let out = run_with(ctx, async move { judge.judge_sections(req, &assay_domain::no_events).await })
            .await
            .map_err(to_status)?;
        Ok(Response::new(convert_judge::judge_sections_response_to(&out)))
    }

    type JudgeSectionsStreamStream = Pin<Box<dyn Stream<Item = Result<JudgeSectionsStreamResponse, Status>> + Send>>;

    async fn judge_sections_stream(
        &self,
        request: Request<JudgeSectionsStreamRequest>,
    ) -> Result<Response<Self::JudgeSectionsStreamStream>, Status> {
        let ctx = CallContext::from_request(&request);
        let inner =
            request.into_inner().request.ok_or_else(|| to_status(StageError::invalid("request", "is required")))?;
        let req = convert_judge::judge_sections_request(inner, "request").map_err(to_status)?;
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel::<Result<JudgeSectionsStreamResponse, Status>>();
        let judge = self.judge.clone();
        // The task ends when the client goes away: the send side sees the receiver closed and the
        // panel future (with every judge's model call) is dropped.
        tokio::spawn(tracing::Instrument::in_current_span(async move {
            let events_tx = tx.clone();
            let sink = move |e: JudgeEvent| match e {
                JudgeEvent::JudgeFinished { index, result } => {
                    let _ = events_tx.send(Ok(JudgeSectionsStreamResponse {
                        event: Some(JudgeStreamEvent::JudgeFinished(convert_judge::judge_finished_to(index, &result))),
                    }));
                }
            };
            // Field paths of errors the core finds (e.g. an unknown backend) get the same
            // `request.` prefix as the conversion's.
            let work = async {
                run_with(ctx, judge.judge_sections(req, &sink))
                    .await
                    .map_err(|e| e.map_fields(|f| format!("request.{f}")))
            };
            let closed = tx.clone();
            tokio::select! {
                out = work => {
                    let msg = match out {
                        Ok(o) => Ok(JudgeSectionsStreamResponse {
                            event: Some(JudgeStreamEvent::Result(convert_judge::judge_sections_response_to(&o))),
                        }),
                        Err(e) => Err(to_status(e)),
                    };
                    let _ = tx.send(msg);
                }
                () = closed.closed() => {}
            }
        }));
        Ok(Response::new(Box::pin(tokio_stream::wrappers::UnboundedReceiverStream::new(rx))))
    }
}
