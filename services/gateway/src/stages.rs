//! Streaming stage calls the gateway relays progress from: corpus generation and the checklist
//! refiner chain. Wire types in and out (the run manager stores and forwards them as they are);
//! production implementations are the gRPC clients below.

use assay_domain::StageError;
use assay_proto::common::v1 as pb;
use assay_proto::generator::v1 as gen_pb;
use assay_proto::refiners::v1 as ref_pb;
use assay_proto::refiners::v1::refiners_service_client::RefinersServiceClient;
use assay_rpc::auth::BearerInterceptor;
use assay_rpc::{from_status, outgoing};
use futures::StreamExt;
use futures::stream::BoxStream;
use tonic::codegen::InterceptedService;
use tonic::transport::Channel;

/// An event of a streaming stage call: progress, then exactly one result.
#[derive(Debug, Clone, PartialEq)]
pub enum StageEvent<T> {
    Progress(pb::Progress),
    Done(T),
}

/// Events of one streaming stage call.
pub type StageStream<T> = BoxStream<'static, Result<StageEvent<T>, StageError>>;

/// Corpus-level checklist generation.
#[async_trait::async_trait]
pub trait CorpusGenerator: Send + Sync {
    async fn generate_corpus(
        &self,
        request: gen_pb::GenerateCorpusRequest,
    ) -> Result<StageStream<gen_pb::GenerateCorpusResponse>, StageError>;
}

/// An ordered chain of checklist refiners.
#[async_trait::async_trait]
pub trait ChecklistRefiner: Send + Sync {
    async fn refine(
        &self,
        request: ref_pb::RefineChecklistRequest,
    ) -> Result<StageStream<ref_pb::RefineChecklistResponse>, StageError>;
}

/// The generator's corpus RPC over gRPC (GenerateCorpusStream), through the generator's own client.
#[async_trait::async_trait]
impl CorpusGenerator for assay_generator::RemoteGenerator {
    async fn generate_corpus(
        &self,
        request: gen_pb::GenerateCorpusRequest,
    ) -> Result<StageStream<gen_pb::GenerateCorpusResponse>, StageError> {
        let stream = self.corpus_stream(request).await?;
        Ok(relay(stream, |m| match m.event {
            Some(gen_pb::generate_corpus_stream_response::Event::Progress(p)) => Some(StageEvent::Progress(p)),
            Some(gen_pb::generate_corpus_stream_response::Event::Result(r)) => Some(StageEvent::Done(r)),
            None => None,
        })
        .map(|e| e.map_err(assay_generator::remote::from_stream))
        .boxed())
    }
}

/// The refiners service's chain RPC over gRPC (RefineChecklistStream).
#[derive(Clone)]
pub struct RemoteRefiners {
    client: RefinersServiceClient<InterceptedService<Channel, BearerInterceptor>>,
}

impl RemoteRefiners {
    pub fn new(channel: Channel, token: Option<&str>) -> Self {
        let client = RefinersServiceClient::with_interceptor(channel, BearerInterceptor::new(token))
            .max_decoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES);
        Self { client }
    }
}

#[async_trait::async_trait]
impl ChecklistRefiner for RemoteRefiners {
    async fn refine(
        &self,
        request: ref_pb::RefineChecklistRequest,
    ) -> Result<StageStream<ref_pb::RefineChecklistResponse>, StageError> {
        let mut client = self.client.clone();
        let stream = client
            .refine_checklist_stream(outgoing(ref_pb::RefineChecklistStreamRequest { request: Some(request) }))
            .await
            .map_err(from_status)?
            .into_inner();
        Ok(relay(stream, |m| match m.event {
            Some(ref_pb::refine_checklist_stream_response::Event::Progress(p)) => Some(StageEvent::Progress(p)),
            Some(ref_pb::refine_checklist_stream_response::Event::StepCompleted(s)) => {
                Some(StageEvent::Progress(step_progress(&s)))
            }
            Some(ref_pb::refine_checklist_stream_response::Event::Result(r)) => Some(StageEvent::Done(r)),
            None => None,
        }))
    }
}

/// A finished refiner step as progress: items in (total) and out (done), and what happened.
fn step_progress(s: &ref_pb::StepCompleted) -> pb::Progress {
    let changed = s.actions.iter().filter(|a| a.kind != ref_pb::ActionKind::Kept as i32).count();
    pb::Progress {
        stage: s.refiner.clone(),
        message: format!("{} items in, {} out ({changed} removed, merged or failed)", s.items_in, s.items_out),
        done: s.items_out,
        total: s.items_in,
    }
}

/// A server stream as stage events: `split` maps each message to progress or the result (or nothing).
fn relay<M: Send + 'static, T: Send + 'static>(
    stream: tonic::Streaming<M>,
    split: fn(M) -> Option<StageEvent<T>>,
) -> StageStream<T> {
    stream
        .filter_map(move |m| async move {
            match m {
                Err(s) => Some(Err(from_status(s))),
                Ok(m) => split(m).map(Ok),
            }
        })
        .boxed()
}
