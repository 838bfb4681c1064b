//! The generator reached over gRPC: the [`ChecklistGenerator`] the gateway holds in production.

use assay_domain::StageError;
use assay_proto::generator::v1::ListPresetsRequest;
use assay_proto::generator::v1::generator_service_client::GeneratorServiceClient;
use assay_rpc::auth::BearerInterceptor;
use assay_rpc::{from_status, outgoing};
use tonic::codegen::InterceptedService;
use tonic::transport::Channel;

use crate::core::{ChecklistGenerator, GenerateOutcome, GenerateRequest, PresetInfo};
use crate::grpc::{generate_request_to, generate_response_from, preset_infos_from};

/// The generator stage over gRPC (deadline and trace context forwarded, bearer token attached).
#[derive(Clone)]
pub struct RemoteGenerator {
    client: GeneratorServiceClient<InterceptedService<Channel, BearerInterceptor>>,
}

impl RemoteGenerator {
    /// A client on `channel` (see `assay_rpc::remote::channel`).
    pub fn new(channel: Channel, token: Option<&str>) -> Self {
        let client = GeneratorServiceClient::with_interceptor(channel, BearerInterceptor::new(token))
            .max_decoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES);
        Self { client }
    }
}

#[async_trait::async_trait]
impl ChecklistGenerator for RemoteGenerator {
    async fn generate(&self, request: GenerateRequest) -> Result<GenerateOutcome, StageError> {
        let mut client = self.client.clone();
        let reply = client.generate(outgoing(generate_request_to(&request))).await.map_err(from_status)?;
        generate_response_from(reply.into_inner())
    }

    async fn list_presets(&self) -> Result<Vec<PresetInfo>, StageError> {
        let mut client = self.client.clone();
        let reply = client.list_presets(outgoing(ListPresetsRequest {})).await.map_err(from_status)?;
        Ok(preset_infos_from(reply.into_inner()))
    }
}
