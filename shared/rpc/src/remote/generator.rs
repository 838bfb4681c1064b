//! The generator service over gRPC.

use assay_domain::generator::{
    ChecklistGenerator, CorpusOutcome, CorpusProgress, CorpusRequest, GenerateOutcome, GenerateRequest, PresetInfo,
    RespondOutcome, RespondRequest,
};
use assay_domain::{EventSink, StageError};
use assay_proto::convert::generator as convert;
use assay_proto::generator::v1::generate_corpus_stream_response::Event;
use assay_proto::generator::v1::generator_service_client::GeneratorServiceClient;
use assay_proto::generator::v1::{GenerateCorpusStreamRequest, GenerateCorpusStreamResponse, ListPresetsRequest};
use tonic::codegen::InterceptedService;
use tonic::transport::Channel;

use crate::auth::BearerInterceptor;
use crate::remote::ResendUnsent;
use crate::stream::{Streamed, consume_stream};
use crate::{from_status, outgoing};

/// The generator stage over gRPC (deadline and trace context forwarded, bearer token attached).
#[derive(Clone)]
pub struct RemoteGenerator {
    client: GeneratorServiceClient<InterceptedService<ResendUnsent<Channel>, BearerInterceptor>>,
}

impl RemoteGenerator {
    /// A client on `channel` (see [`super::channel`]).
    pub fn new(channel: Channel, token: Option<&str>) -> Self {
        let client =
            GeneratorServiceClient::with_interceptor(ResendUnsent::new(channel), BearerInterceptor::new(token))
                .max_decoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES)
                .max_encoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES);
        Self { client }
    }
}

#[async_trait::async_trait]
impl ChecklistGenerator for RemoteGenerator {
    async fn generate(&self, request: GenerateRequest) -> Result<GenerateOutcome, StageError> {
        let mut client = self.client.clone();
        let reply = client.generate(outgoing(convert::generate_request_to(&request))).await.map_err(from_status)?;
        convert::generate_response_from(reply.into_inner())
    }

    /// Over GenerateCorpusStream, so progress reaches `events` as the remote stage reports it. A
    /// rejected request's field paths are the domain request's (`observations`, not
    /// `request.observations`).
    async fn generate_corpus(
        &self,
        request: CorpusRequest,
        events: EventSink<'_, CorpusProgress>,
    ) -> Result<CorpusOutcome, StageError> {
        let mut client = self.client.clone();
        let msg = GenerateCorpusStreamRequest { request: Some(convert::corpus_request_to(&request)) };
        let read = |reply: GenerateCorpusStreamResponse| {
            Ok(match reply.event {
                Some(Event::Progress(p)) => Streamed::Event(convert::progress_from(p)),
                Some(Event::Result(r)) => Streamed::Done(convert::corpus_response_from(r)?),
                None => Streamed::Skip,
            })
        };
        let call = client.generate_corpus_stream(outgoing(msg));
        consume_stream(call, events, read, "the generator's corpus stream").await
    }

    /// Over Respond: each response reaches `events` as the remote stage finishes it.
    async fn respond(
        &self,
        request: RespondRequest,
        events: EventSink<'_, (u32, String)>,
    ) -> Result<RespondOutcome, StageError> {
        use assay_proto::generator::v1::respond_response::Event as Respond;
        let mut client = self.client.clone();
        let read = |reply: assay_proto::generator::v1::RespondResponse| {
            Ok(match reply.event {
                Some(Respond::Response(r)) => Streamed::Event((r.sample, r.text)),
                Some(Respond::Done(d)) => Streamed::Done(convert::respond_done_from(d)),
                None => Streamed::Skip,
            })
        };
        let call = client.respond(outgoing(convert::respond_request_to(&request)));
        consume_stream(call, events, read, "the generator's respond stream").await
    }

    async fn list_presets(&self) -> Result<Vec<PresetInfo>, StageError> {
        let mut client = self.client.clone();
        let reply = client.list_presets(outgoing(ListPresetsRequest {})).await.map_err(from_status)?;
        Ok(convert::preset_infos_from(reply.into_inner()))
    }
}
