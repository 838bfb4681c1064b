//! gRPC adapter: convert, call the core, map the result.

use std::sync::Arc;

use assay_domain::judge::{JudgeEvent, SectionJudge};
use assay_domain::{ScoreEvent, Scorer};
use assay_proto::convert;
use assay_proto::convert::judge as convert_judge;
use assay_proto::scorer::v1::judge_sections_stream_response::Event as JudgeStreamEvent;
use assay_proto::scorer::v1::score_stream_response::Event;
use assay_proto::scorer::v1::scorer_service_server::{ScorerService, ScorerServiceServer};
use assay_proto::scorer::v1::{
    JudgeSectionsRequest, JudgeSectionsResponse, JudgeSectionsStreamRequest, JudgeSectionsStreamResponse, ScoreRequest,
    ScoreResponse, ScoreStreamRequest, ScoreStreamResponse, TargetScored,
};
use assay_rpc::stream::{Emit, EventStream, required_request};
use assay_rpc::{CallContext, run_with, serve_stream, to_status};
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

#[tonic::async_trait]
impl ScorerService for ScorerGrpc {
    async fn score(&self, request: Request<ScoreRequest>) -> Result<Response<ScoreResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let req = convert::score_request(request.into_inner(), "").map_err(to_status)?;
        let core = self.core.clone();
        let out = run_with(ctx, async move { core.score(req, &assay_domain::no_events).await }).await?;
        Ok(Response::new(convert::score_response_to(&out)))
    }

    type ScoreStreamStream = EventStream<ScoreStreamResponse>;

    async fn score_stream(
        &self,
        request: Request<ScoreStreamRequest>,
    ) -> Result<Response<Self::ScoreStreamStream>, Status> {
        let ctx = CallContext::from_request(&request);
        let inner = required_request(request.into_inner().request)?;
        let req = convert::score_request(inner, "request").map_err(to_status)?;
        let core = self.core.clone();
        // Errors the core finds (e.g. an unknown backend) end the stream, their field paths under
        // `request` as the conversion's are.
        let work = move |sink: Emit<ScoreEvent>| async move { core.score(req, &*sink).await };
        let scored = |e: ScoreEvent| match e {
            ScoreEvent::TargetScored { index, score } => ScoreStreamResponse {
                event: Some(Event::TargetScored(TargetScored { index, score: Some(convert::score_to(&score)) })),
            },
        };
        let result = |o| ScoreStreamResponse { event: Some(Event::Result(convert::score_response_to(&o))) };
        Ok(Response::new(serve_stream(ctx, work, scored, result)))
    }

    async fn judge_sections(
        &self,
        request: Request<JudgeSectionsRequest>,
    ) -> Result<Response<JudgeSectionsResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let req = convert_judge::judge_sections_request(request.into_inner(), "").map_err(to_status)?;
        let judge = self.judge.clone();
        let out = run_with(ctx, async move { judge.judge_sections(req, &assay_domain::no_events).await }).await?;
        Ok(Response::new(convert_judge::judge_sections_response_to(&out)))
    }

    type JudgeSectionsStreamStream = EventStream<JudgeSectionsStreamResponse>;

    async fn judge_sections_stream(
        &self,
        request: Request<JudgeSectionsStreamRequest>,
    ) -> Result<Response<Self::JudgeSectionsStreamStream>, Status> {
        let ctx = CallContext::from_request(&request);
        let inner = required_request(request.into_inner().request)?;
        let req = convert_judge::judge_sections_request(inner, "request").map_err(to_status)?;
        let judge = self.judge.clone();
        // A client going away drops the panel with every judge's model call; errors the core finds
        // (e.g. an unknown backend) end the stream, their field paths under `request`.
        let work = move |sink: Emit<JudgeEvent>| async move { judge.judge_sections(req, &*sink).await };
        let finished = |e: JudgeEvent| match e {
            JudgeEvent::JudgeFinished { index, result } => JudgeSectionsStreamResponse {
                event: Some(JudgeStreamEvent::JudgeFinished(convert_judge::judge_finished_to(index, &result))),
            },
        };
        let result = |o| JudgeSectionsStreamResponse {
            event: Some(JudgeStreamEvent::Result(convert_judge::judge_sections_response_to(&o))),
        };
        Ok(Response::new(serve_stream(ctx, work, finished, result)))
    }
}
