//! gRPC adapter of the delta-judge service: convert the request, call the core, map the result.
//! Verify, CompareTexts and CheckConsistency go through a [`DeltaJudge`] (deadlines and
//! cancellation propagate);
//! Readability, CheckQualityLocks and CheckConvergence are pure and answered here.

use assay_proto::delta_judge::v1::delta_judge_service_server::{DeltaJudgeService, DeltaJudgeServiceServer};
use assay_proto::delta_judge::v1::{
    CheckConsistencyRequest, CheckConsistencyResponse, CheckConvergenceRequest, CheckConvergenceResponse,
    CheckQualityLocksRequest, CheckQualityLocksResponse, CompareTextsRequest, CompareTextsResponse, ReadabilityRequest,
    ReadabilityResponse, VerifyRequest, VerifyResponse,
};

use assay_domain::{StageError, Violations};
use tonic::service::Routes;

use assay_domain::iteration::{self, QualityLock as Lock};
use assay_domain::limits::MAX_ID_BYTES;
use assay_proto::delta_judge::v1::LockViolation;

/// Most locks, scores, iterations or sections of one request.
pub const MAX_ENTRIES: usize = 1_000;

fn unit_interval(x: f64, field: &str, v: &mut Violations) {
    if !(0.0..=1.0).contains(&x) {
        v.push(field, format!("must be in [0, 1] (got {x})"));
    }
}

fn locks_input(r: &CheckQualityLocksRequest) -> Result<Vec<Lock>, StageError> {
    let mut v = Violations::new();
    if r.locks.len() > MAX_ENTRIES || r.criterion_scores.len() > MAX_ENTRIES {
        v.push("locks", format!("at most {MAX_ENTRIES} locks and {MAX_ENTRIES} scores"));
    }
    let mut seen = std::collections::HashSet::new();
    for (i, l) in r.locks.iter().enumerate() {
        let f = format!("locks[{i}]");
        if l.criterion.trim().is_empty() {
            v.push(format!("{f}.criterion"), "must not be empty");
        } else if l.criterion.len() > MAX_ID_BYTES {
            v.push(format!("{f}.criterion"), format!("is {} bytes; the limit is {MAX_ID_BYTES}", l.criterion.len()));
        } else if !seen.insert(l.criterion.as_str()) {
            v.push(format!("{f}.criterion"), format!("duplicate criterion {:?}", l.criterion));
        } else if !r.criterion_scores.contains_key(&l.criterion) {
            v.push("criterion_scores", format!("has no score for the locked criterion {:?}", l.criterion));
        }
        unit_interval(l.baseline, &format!("{f}.baseline"), &mut v);
        if let Some(d) = l.max_drop {
            unit_interval(d, &format!("{f}.max_drop"), &mut v);
        }
    }
    for (c, x) in &r.criterion_scores {
        unit_interval(*x, &format!("criterion_scores[{c:?}]"), &mut v);
    }
    v.into_result()?;
    Ok(r.locks
        .iter()
        .map(|l| Lock { criterion: l.criterion.clone(), baseline: l.baseline, max_drop: l.max_drop })
        .collect())
}

fn convergence_input(r: &CheckConvergenceRequest) -> Result<(), StageError> {
    let mut v = Violations::new();
    if r.scores.is_empty() {
        v.push("scores", "must not be empty: the score before any edit comes first");
    }
    if r.scores.len() > MAX_ENTRIES || r.section_edits.len() > MAX_ENTRIES {
        v.push("scores", format!("at most {MAX_ENTRIES} scores and {MAX_ENTRIES} sections"));
    }
    for (i, x) in r.scores.iter().enumerate() {
        unit_interval(*x, &format!("scores[{i}]"), &mut v);
    }
    for id in r.section_edits.keys() {
        if id.is_empty() || id.len() > MAX_ID_BYTES {
            v.push("section_edits", format!("section ids are 1 to {MAX_ID_BYTES} bytes (got {} bytes)", id.len()));
        }
    }
    v.into_result()
}

use assay_domain::verify::DeltaJudge;
use assay_proto::convert::delta_judge as convert;
use assay_rpc::{CallContext, run_with, to_status};
use std::sync::Arc;
use tonic::{Request, Response, Status};

/// The delta-judge service's gRPC face over any [`DeltaJudge`].
#[derive(Clone)]
pub struct DeltaJudgeGrpc {
    core: Arc<dyn DeltaJudge>,
}

impl DeltaJudgeGrpc {
    pub fn new(core: Arc<dyn DeltaJudge>) -> Self {
        Self { core }
    }
}

/// Routes serving the delta-judge service, with Assay's message limits.
pub fn routes(core: Arc<dyn DeltaJudge>) -> Routes {
    Routes::new(
        DeltaJudgeServiceServer::new(DeltaJudgeGrpc::new(core))
            .max_decoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES),
    )
}

#[tonic::async_trait]
impl DeltaJudgeService for DeltaJudgeGrpc {
    async fn verify(&self, request: Request<VerifyRequest>) -> Result<Response<VerifyResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let req = convert::verify_request(request.into_inner(), "").map_err(to_status)?;
        let core = self.core.clone();
        let out = run_with(ctx, async move { core.verify(req).await }).await?;
        Ok(Response::new(convert::verify_response_to(&out)))
    }

    async fn readability(&self, request: Request<ReadabilityRequest>) -> Result<Response<ReadabilityResponse>, Status> {
        let report = self.core.readability(request.into_inner().text).await.map_err(assay_rpc::status::to_status)?;
        Ok(Response::new(assay_proto::convert::delta_judge::readability_to(&report)))
    }

    async fn check_quality_locks(
        &self,
        request: Request<CheckQualityLocksRequest>,
    ) -> Result<Response<CheckQualityLocksResponse>, Status> {
        let request = request.into_inner();
        let locks = locks_input(&request).map_err(assay_rpc::status::to_status)?;
        let scores: std::collections::BTreeMap<String, f64> = request.criterion_scores.into_iter().collect();
        let violations: Vec<LockViolation> = iteration::lock_violations(&locks, &scores)
            .iter()
            .map(assay_proto::convert::delta_judge::lock_violation_to)
            .collect();
        Ok(Response::new(CheckQualityLocksResponse { ok: violations.is_empty(), violations }))
    }

    async fn check_convergence(
        &self,
        request: Request<CheckConvergenceRequest>,
    ) -> Result<Response<CheckConvergenceResponse>, Status> {
        let request = request.into_inner();
        convergence_input(&request).map_err(assay_rpc::status::to_status)?;
        let edits: std::collections::BTreeMap<String, u32> = request.section_edits.into_iter().collect();
        let c = iteration::convergence(&request.scores, &edits, request.tokens_used, request.elapsed_ms);
        Ok(Response::new(CheckConvergenceResponse {
            converged: c.stop.is_some(),
            reason: c.stop.map(|s| s.name().to_string()).unwrap_or_default(),
            locked_section_ids: c.locked_sections,
            best_iteration: c.best_iteration as u32,
        }))
    }

    async fn compare_texts(
        &self,
        request: Request<CompareTextsRequest>,
    ) -> Result<Response<CompareTextsResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let req = convert::compare_request(request.into_inner(), "").map_err(to_status)?;
        let core = self.core.clone();
        let out = run_with(ctx, async move { core.compare_texts(req).await }).await?;
        Ok(Response::new(convert::compare_response_to(&out)))
    }

    async fn check_consistency(
        &self,
        request: Request<CheckConsistencyRequest>,
    ) -> Result<Response<CheckConsistencyResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let req = convert::consistency_request(request.into_inner(), "").map_err(to_status)?;
        let core = self.core.clone();
        let out = run_with(ctx, async move { core.check_consistency(req).await }).await?;
        Ok(Response::new(convert::consistency_response_to(&out)))
    }
}
