//! The delta judge service over gRPC.

use assay_domain::StageError;
use assay_domain::verify::{
    CompareOutcome, CompareRequest, ConsistencyOutcome, ConsistencyRequest, DeltaJudge, ReadabilityReport,
    VerifyOutcome, VerifyRequest,
};
use assay_proto::convert::delta_judge as convert;
use assay_proto::delta_judge::v1::delta_judge_service_client::DeltaJudgeServiceClient;
use tonic::codegen::InterceptedService;
use tonic::transport::Channel;

use crate::auth::BearerInterceptor;
use crate::remote::ResendUnsent;
use crate::{from_status, outgoing};

/// The delta judge, reached over gRPC.
#[derive(Clone)]
pub struct RemoteDeltaJudge {
    client: DeltaJudgeServiceClient<InterceptedService<ResendUnsent<Channel>, BearerInterceptor>>,
}

impl RemoteDeltaJudge {
    pub fn new(channel: Channel, token: Option<&str>) -> Self {
        let client =
            DeltaJudgeServiceClient::with_interceptor(ResendUnsent::new(channel), BearerInterceptor::new(token))
                .max_decoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES)
                .max_encoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES);
        Self { client }
    }
}

#[async_trait::async_trait]
impl DeltaJudge for RemoteDeltaJudge {
    async fn verify(&self, request: VerifyRequest) -> Result<VerifyOutcome, StageError> {
        let mut client = self.client.clone();
        let reply = client.verify(outgoing(convert::verify_request_to(&request))).await.map_err(from_status)?;
        Ok(convert::verify_response_from(reply.into_inner()))
    }

    async fn compare_texts(&self, request: CompareRequest) -> Result<CompareOutcome, StageError> {
        let mut client = self.client.clone();
        let reply = client.compare_texts(outgoing(convert::compare_request_to(&request))).await.map_err(from_status)?;
        Ok(convert::compare_response_from(reply.into_inner()))
    }

    async fn check_consistency(&self, request: ConsistencyRequest) -> Result<ConsistencyOutcome, StageError> {
        let mut client = self.client.clone();
        let reply =
            client.check_consistency(outgoing(convert::consistency_request_to(&request))).await.map_err(from_status)?;
        Ok(convert::consistency_response_from(reply.into_inner()))
    }

    async fn readability(&self, text: String) -> Result<ReadabilityReport, StageError> {
        let mut client = self.client.clone();
        let request = assay_proto::delta_judge::v1::ReadabilityRequest { text };
        let reply = client.readability(outgoing(request)).await.map_err(from_status)?;
        Ok(convert::readability_from(Some(reply.into_inner())))
    }
}
