//! gRPC adapter of the arbiter service. ComputeAgreement is served; Consolidate, Route and Plan
//! are not built yet and answer UNIMPLEMENTED with a message naming them.

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

use tonic::service::Routes;
use tonic::{Request, Response, Status};

/// The arbiter service's gRPC face.
#[derive(Clone, Default)]
pub struct ArbiterGrpc;

/// Routes serving the arbiter service, with Assay's message limits.
pub fn routes() -> Routes {
    Routes::new(
        ArbiterServiceServer::new(ArbiterGrpc)
            .max_decoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES),
    )
}

fn not_yet(rpc: &str) -> Status {
    Status::unimplemented(format!(
        "{rpc} is not available yet: the arbiter stage (verdict consolidation, agreement, routing and plans) is not built in this release"
    ))
}

#[tonic::async_trait]
impl ArbiterService for ArbiterGrpc {
    async fn compute_agreement(
        &self,
        request: Request<ComputeAgreementRequest>,
    ) -> Result<Response<ComputeAgreementResponse>, Status> {
        let (data, level) = agreement_input(request.into_inner()).map_err(assay_rpc::status::to_status)?;
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

    async fn consolidate(&self, _: Request<ConsolidateRequest>) -> Result<Response<ConsolidateResponse>, Status> {
        Err(not_yet("Consolidate"))
    }

    async fn route(&self, _: Request<RouteRequest>) -> Result<Response<RouteResponse>, Status> {
        Err(not_yet("Route"))
    }

    async fn plan(&self, _: Request<PlanRequest>) -> Result<Response<PlanResponse>, Status> {
        Err(not_yet("Plan"))
    }
}
