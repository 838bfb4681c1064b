//! gRPC adapter of the generator service. The checklist generation stage is not built yet: every RPC answers
//! UNIMPLEMENTED with a message naming it, so clients see the full contract today.

use std::pin::Pin;

use assay_proto::generator::v1::generator_service_server::{GeneratorService, GeneratorServiceServer};
use assay_proto::generator::v1::{
    GenerateCorpusRequest, GenerateCorpusResponse, GenerateCorpusStreamRequest, GenerateCorpusStreamResponse,
    GenerateRequest, GenerateResponse, ListPresetsRequest, ListPresetsResponse,
};
use futures::Stream;
use tonic::service::Routes;
use tonic::{Request, Response, Status};

/// The generator service's gRPC face.
#[derive(Clone, Default)]
pub struct GeneratorGrpc;

/// Routes serving the generator service, with Assay's message limits.
pub fn routes() -> Routes {
    Routes::new(
        GeneratorServiceServer::new(GeneratorGrpc)
            .max_decoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES),
    )
}

fn not_yet(rpc: &str) -> Status {
    Status::unimplemented(format!(
        "{rpc} is not available yet: the generator stage (checklist generation) is not built in this release"
    ))
}

type EventStream<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

#[tonic::async_trait]
impl GeneratorService for GeneratorGrpc {
    async fn generate(&self, _: Request<GenerateRequest>) -> Result<Response<GenerateResponse>, Status> {
        Err(not_yet("Generate"))
    }

    async fn generate_corpus(
        &self,
        _: Request<GenerateCorpusRequest>,
    ) -> Result<Response<GenerateCorpusResponse>, Status> {
        Err(not_yet("GenerateCorpus"))
    }

    type GenerateCorpusStreamStream = EventStream<GenerateCorpusStreamResponse>;

    async fn generate_corpus_stream(
        &self,
        _: Request<GenerateCorpusStreamRequest>,
    ) -> Result<Response<Self::GenerateCorpusStreamStream>, Status> {
        Err(not_yet("GenerateCorpusStream"))
    }

    async fn list_presets(&self, _: Request<ListPresetsRequest>) -> Result<Response<ListPresetsResponse>, Status> {
        Err(not_yet("ListPresets"))
    }
}
