//! gRPC adapter of the arbiter service: convert, call the core, map the result.

use assay_proto::arbiter::v1::arbiter_service_server::{ArbiterService, ArbiterServiceServer};
use assay_proto::arbiter::v1::{
    ComputeAgreementRequest, ComputeAgreementResponse, ConsolidateRequest, ConsolidateResponse, LevelOfMeasurement,
    PlanRequest, PlanResponse, RouteRequest, RouteResponse,
};

use crate::core::alpha::{self, Level};
use assay_domain::{StageError, Violations};

/// Most raters of one agreement request.
pub const MAX_RATERS: usize = 1_000;
/// Most values (raters x units) of one agreement request.
pub const MAX_VALUES: usize = 1_000_000;

/// The reliability data and level of a request, checked (fields named as on the wire).
fn agreement_input(r: ComputeAgreementRequest) -> Result<(alpha::Ratings, Level), StageError> {
    let mut v = Violations::new();
    let level = match LevelOfMeasurement::try_from(r.level) {
        Ok(LevelOfMeasurement::Nominal) => Level::Nominal,
        Ok(LevelOfMeasurement::Ordinal) => Level::Ordinal,
        Ok(LevelOfMeasurement::Interval | LevelOfMeasurement::Unspecified) => Level::Interval,
        Ok(LevelOfMeasurement::Ratio) => Level::Ratio,
        Err(_) => {
            v.push(
                "level",
                format!(
                    "unknown value {} (0 unspecified = interval, 1 nominal, 2 ordinal, 3 interval, 4 ratio)",
                    r.level
                ),
            );
            Level::Interval
        }
    };
    if r.raters.is_empty() {
        v.push("raters", "must not be empty: one row of values per rater");
    }
    if r.raters.len() > MAX_RATERS {
        v.push("raters", format!("has {} raters; the limit is {MAX_RATERS}", r.raters.len()));
    }
    let values: usize = r.raters.iter().map(|row| row.values.len()).sum();
    if values > MAX_VALUES {
        v.push("raters", format!("hold {values} values; the limit is {MAX_VALUES}"));
    }
    v.into_result()?;
    let mut v = Violations::new();
    let data: alpha::Ratings = r
        .raters
        .into_iter()
        .enumerate()
        .map(|(i, row)| {
            row.values
                .into_iter()
                .enumerate()
                .map(|(u, x)| {
                    if let Some(x) = x.value.filter(|x| !x.is_finite()) {
                        v.push(format!("raters[{i}].values[{u}].value"), format!("must be a finite number (got {x})"));
                    }
                    x.value
                })
                .collect()
        })
        .collect();
    v.into_result()?;
    Ok((data, level))
}

use std::sync::Arc;

use assay_domain::arbiter::Arbiter;
use assay_proto::convert::arbiter as convert;
use assay_rpc::{CallContext, run_with, to_status};
use tonic::service::Routes;
use tonic::{Request, Response, Status};

/// The arbiter service's gRPC face over any [`Arbiter`].
#[derive(Clone)]
pub struct ArbiterGrpc {
    core: Arc<dyn Arbiter>,
}

impl ArbiterGrpc {
    pub fn new(core: Arc<dyn Arbiter>) -> Self {
        Self { core }
    }
}

/// Routes serving the arbiter service, with Assay's message limits.
pub fn routes(core: Arc<dyn Arbiter>) -> Routes {
    Routes::new(
        ArbiterServiceServer::new(ArbiterGrpc::new(core))
            .max_decoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES),
    )
}

#[tonic::async_trait]
impl ArbiterService for ArbiterGrpc {
    async fn compute_agreement(
        &self,
        request: Request<ComputeAgreementRequest>,
    ) -> Result<Response<ComputeAgreementResponse>, Status> {
        let (data, level) = agreement_input(request.into_inner()).map_err(to_status)?;
        // Up to a million values: off the async workers.
        let agreement = tokio::task::spawn_blocking(move || alpha::agreement(&data, level))
            .await
            .map_err(|e| Status::internal(format!("agreement computation failed: {e}")))?;
        Ok(Response::new(ComputeAgreementResponse {
            alpha: agreement.alpha.ok(),
            pairable_units: agreement.pairable_units as u32,
            undefined_reason: agreement.alpha.err().map(|e| e.to_string()).unwrap_or_default(),
        }))
    }

    async fn consolidate(&self, request: Request<ConsolidateRequest>) -> Result<Response<ConsolidateResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let req = convert::consolidate_request(request.into_inner()).map_err(to_status)?;
        let core = self.core.clone();
        let out = run_with(ctx, async move { core.consolidate(req).await }).await?;
        Ok(Response::new(convert::consolidation_to(&out)))
    }

    async fn route(&self, request: Request<RouteRequest>) -> Result<Response<RouteResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let req = convert::route_request(request.into_inner()).map_err(to_status)?;
        let core = self.core.clone();
        let out = run_with(ctx, async move { core.route(req).await }).await?;
        Ok(Response::new(convert::routing_to(&out)))
    }

    async fn plan(&self, request: Request<PlanRequest>) -> Result<Response<PlanResponse>, Status> {
        let ctx = CallContext::from_request(&request);
        let req = convert::plan_request(request.into_inner()).map_err(to_status)?;
        let core = self.core.clone();
        let out = run_with(ctx, async move { core.plan(req).await }).await?;
        Ok(Response::new(convert::plan_to(&out)))
    }
}
