//! gRPC adapter: convert the request (`assay_proto::convert::generator`), call the core, map the
//! result.

use std::sync::Arc;

use assay_domain::generator::{ChecklistGenerator, CorpusProgress};
use assay_domain::no_events;
use assay_proto::convert::generator::{
    corpus_request, corpus_response_to, generate_request, generate_response_to, preset_info_to, progress_to,
    respond_done_to, respond_request,
};
use assay_proto::generator::v1 as pb;
use assay_proto::generator::v1::generate_corpus_stream_response::Event;
use assay_proto::generator::v1::generator_service_server::{GeneratorService, GeneratorServiceServer};
use assay_rpc::stream::{Emit, EventStream, in_stream, required_request};
use assay_rpc::{CallContext, run_with, serve_stream, to_status};
use tonic::service::Routes;
use tonic::{Request, Response, Status};

/// The generator's gRPC face over any [`ChecklistGenerator`].
#[derive(Clone)]
pub struct GeneratorGrpc {
    core: Arc<dyn ChecklistGenerator>,
}

impl GeneratorGrpc {
    pub fn new(core: Arc<dyn ChecklistGenerator>) -> Self {
        Self { core }
    }
}

/// Routes serving the generator, with Assay's message limits. Pass `Arc::new(Generator::new(hub))`
/// (or any other [`ChecklistGenerator`]).
pub fn routes(core: Arc<dyn ChecklistGenerator>) -> Routes {
    Routes::new(
        GeneratorServiceServer::new(GeneratorGrpc::new(core))
            .max_decoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES),
    )
}

#[tonic::async_trait]
impl GeneratorService for GeneratorGrpc {
    async fn generate(&self, request: Request<pb::GenerateRequest>) -> Result<Response<pb::GenerateResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let req = generate_request(request.into_inner()).map_err(to_status)?;
        let core = self.core.clone();
        let out = run_with(ctx, async move { core.generate(req).await }).await?;
        Ok(Response::new(generate_response_to(&out)))
    }

    async fn generate_corpus(
        &self,
        request: Request<pb::GenerateCorpusRequest>,
    ) -> Result<Response<pb::GenerateCorpusResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let req = corpus_request(request.into_inner()).map_err(to_status)?;
        let core = self.core.clone();
        let out = run_with(ctx, async move { core.generate_corpus(req, &no_events).await }).await?;
        Ok(Response::new(corpus_response_to(&out)))
    }

    type GenerateCorpusStreamStream = EventStream<pb::GenerateCorpusStreamResponse>;

    async fn generate_corpus_stream(
        &self,
        request: Request<pb::GenerateCorpusStreamRequest>,
    ) -> Result<Response<Self::GenerateCorpusStreamStream>, Status> {
        let ctx = CallContext::from_request(&request);
        let pb::GenerateCorpusStreamRequest { request: inner } = request.into_inner();
        let req = corpus_request(required_request(inner)?).map_err(|e| to_status(in_stream(e)))?;
        // Bad input fails the call itself, before the stream starts.
        req.validate().map_err(|e| to_status(in_stream(e)))?;
        let core = self.core.clone();
        let work = move |sink: Emit<CorpusProgress>| async move { core.generate_corpus(req, &*sink).await };
        let progress =
            |e: CorpusProgress| pb::GenerateCorpusStreamResponse { event: Some(Event::Progress(progress_to(&e))) };
        let result = |o| pb::GenerateCorpusStreamResponse { event: Some(Event::Result(corpus_response_to(&o))) };
        Ok(Response::new(serve_stream(ctx, work, progress, result)))
    }

    type RespondStream = EventStream<pb::RespondResponse>;

    async fn respond(&self, request: Request<pb::RespondRequest>) -> Result<Response<Self::RespondStream>, Status> {
        use pb::respond_response::Event as Respond;
        let ctx = CallContext::from_request(&request);
        // Bad input fails the call itself, before the stream starts.
        let req = respond_request(request.into_inner()).map_err(to_status)?;
        let core = self.core.clone();
        let work = move |sink: Emit<(u32, String)>| async move { core.respond(req, &*sink).await };
        let response = |(sample, text): (u32, String)| pb::RespondResponse {
            event: Some(Respond::Response(pb::SampleResponse { sample, text })),
        };
        let done = |o| pb::RespondResponse { event: Some(Respond::Done(respond_done_to(&o))) };
        Ok(Response::new(serve_stream(ctx, work, response, done)))
    }

    async fn list_presets(
        &self,
        request: Request<pb::ListPresetsRequest>,
    ) -> Result<Response<pb::ListPresetsResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let pb::ListPresetsRequest {} = request.into_inner();
        let core = self.core.clone();
        let presets = run_with(ctx, async move { core.list_presets().await }).await?;
        Ok(Response::new(pb::ListPresetsResponse { presets: presets.iter().map(preset_info_to).collect() }))
    }
}
