//! gRPC adapter of the delta-judge service. Readability is served; Verify, CheckQualityLocks and
//! CheckConvergence are not built yet and answer UNIMPLEMENTED with a message naming them.

use assay_proto::delta_judge::v1::delta_judge_service_server::{DeltaJudgeService, DeltaJudgeServiceServer};
use assay_proto::delta_judge::v1::{
    CheckConvergenceRequest, CheckConvergenceResponse, CheckQualityLocksRequest, CheckQualityLocksResponse,
    ReadabilityRequest, ReadabilityResponse, VerifyRequest, VerifyResponse,
};

use assay_domain::limits::MAX_TEXT_BYTES;
use assay_domain::{StageError, Violations};
use tonic::service::Routes;

use crate::core::readability::{self, Readability};

/// The wire form of readability figures.
pub fn readability_to(r: &Readability) -> ReadabilityResponse {
    ReadabilityResponse {
        average_sentence_words: r.average_sentence_words,
        max_sentence_words: r.max_sentence_words as u32,
        paragraph_break_ratio: r.paragraph_break_ratio,
        sentences: r.sentences as u32,
        paragraphs: r.paragraphs as u32,
        long_sentences: r.long_sentences.clone(),
        dense_text: r.dense_text,
        within_targets: r.within_targets,
    }
}

fn readability_input(r: &ReadabilityRequest) -> Result<(), StageError> {
    let mut v = Violations::new();
    if r.text.trim().is_empty() {
        v.push("text", "must not be blank: there is nothing to measure");
    }
    if r.text.len() > MAX_TEXT_BYTES {
        v.push("text", format!("is {} bytes; the limit is {MAX_TEXT_BYTES} bytes", r.text.len()));
    }
    v.into_result()
}
use tonic::{Request, Response, Status};

/// The delta-judge service's gRPC face.
#[derive(Clone, Default)]
pub struct DeltaJudgeGrpc;

/// Routes serving the delta-judge service, with Assay's message limits.
pub fn routes() -> Routes {
    Routes::new(
        DeltaJudgeServiceServer::new(DeltaJudgeGrpc)
            .max_decoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES),
    )
}

fn not_yet(rpc: &str) -> Status {
    Status::unimplemented(format!(
        "{rpc} is not available yet: the delta-judge stage (fix verification) is not built in this release"
    ))
}

#[tonic::async_trait]
impl DeltaJudgeService for DeltaJudgeGrpc {
    async fn verify(&self, _: Request<VerifyRequest>) -> Result<Response<VerifyResponse>, Status> {
        Err(not_yet("Verify"))
    }

    async fn readability(&self, request: Request<ReadabilityRequest>) -> Result<Response<ReadabilityResponse>, Status> {
        let request = request.into_inner();
        readability_input(&request).map_err(assay_rpc::status::to_status)?;
        Ok(Response::new(readability_to(&readability::measure(&request.text))))
    }

    async fn check_quality_locks(
        &self,
        _: Request<CheckQualityLocksRequest>,
    ) -> Result<Response<CheckQualityLocksResponse>, Status> {
        Err(not_yet("CheckQualityLocks"))
    }

    async fn check_convergence(
        &self,
        _: Request<CheckConvergenceRequest>,
    ) -> Result<Response<CheckConvergenceResponse>, Status> {
        Err(not_yet("CheckConvergence"))
    }
}
