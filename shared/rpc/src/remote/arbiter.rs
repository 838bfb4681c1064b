//! The arbiter service over gRPC.

use assay_domain::StageError;
use assay_domain::arbiter::{Arbiter, ConsolidateRequest, Consolidation, Plan, PlanRequest, RouteRequest, Routing};
use assay_proto::arbiter::v1::arbiter_service_client::ArbiterServiceClient;
use assay_proto::convert::arbiter as convert;
use tonic::codegen::InterceptedService;
use tonic::transport::Channel;

use crate::auth::BearerInterceptor;
use crate::remote::ResendUnsent;
use crate::{from_status, outgoing};

/// The arbiter, reached over gRPC.
#[derive(Clone)]
pub struct RemoteArbiter {
    client: ArbiterServiceClient<InterceptedService<ResendUnsent<Channel>, BearerInterceptor>>,
}

impl RemoteArbiter {
    pub fn new(channel: Channel, token: Option<&str>) -> Self {
        let client = ArbiterServiceClient::with_interceptor(ResendUnsent::new(channel), BearerInterceptor::new(token))
            .max_decoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES);
        Self { client }
    }
}

#[async_trait::async_trait]
impl Arbiter for RemoteArbiter {
    async fn consolidate(&self, request: ConsolidateRequest) -> Result<Consolidation, StageError> {
        let reply = self
            .client
            .clone()
            .consolidate(outgoing(convert::consolidate_request_to(&request)))
            .await
            .map_err(from_status)?;
        Ok(convert::consolidation_from(reply.into_inner()))
    }

    async fn route(&self, request: RouteRequest) -> Result<Routing, StageError> {
        let reply =
            self.client.clone().route(outgoing(convert::route_request_to(&request))).await.map_err(from_status)?;
        Ok(convert::routing_from(reply.into_inner()))
    }

    async fn plan(&self, request: PlanRequest) -> Result<Plan, StageError> {
        let reply =
            self.client.clone().plan(outgoing(convert::plan_request_to(&request))).await.map_err(from_status)?;
        Ok(convert::plan_from(reply.into_inner()))
    }
}
