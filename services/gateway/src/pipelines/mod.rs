//! The gateway's pipelines, one module each, over stage traits from `assay-domain`:
//! [`checklist_eval`] and [`generate_checklist`] (sharing [`checklist`], where checklists come
//! from), [`targeted_refinement`], [`self_refine`] and [`debate`]; [`self_refine_hook`] post-processes
//! the text outputs of the last two. [`Pipelines`] parses a request into the pipeline that runs it.

pub mod checklist;
pub mod checklist_eval;
pub mod debate;
mod gated;
pub mod generate_checklist;
mod reserve;
pub mod responders;
mod rounds;
pub mod self_refine;
pub mod self_refine_hook;
mod stages;
pub mod targeted_refinement;

use std::sync::Arc;

use assay_domain::StageError;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::run_pipeline_request::Pipeline as Kind;

pub use stages::{RefinementStages, Stages};

use assay_proto::pipelines::{self as contract, PipelineContract};
use assay_runs::{Pipeline, PipelineFactory};

/// Every pipeline this gateway runs.
#[derive(Clone)]
pub struct Pipelines {
    stages: Stages,
}

impl Pipelines {
    pub fn new(stages: Stages) -> Self {
        Self { stages }
    }
}

/// One registered pipeline kind as this gateway runs it: its request parsed (and checked) into
/// the pipeline.
pub trait Registered: PipelineContract {
    fn parse(request: Self::Request, stages: Stages) -> Result<Arc<dyn Pipeline>, StageError>;
    /// The pipeline of a run created open (`RunPipelineRequest.open`: its records appended as
    /// rows of the run store); refused unless the kind takes its records so.
    fn parse_open(request: Self::Request, stages: Stages) -> Result<Arc<dyn Pipeline>, StageError> {
        let _ = (request, stages);
        Err(StageError::invalid(
            "open",
            format!("only checklist_eval runs are created open, not {}", Self::KIND.as_str_name()),
        ))
    }
}

/// The pipeline of `request`, of kind `C`: `None` when it is of another kind.
fn parse_as<C: Registered>(
    request: Kind,
    stages: &Stages,
    open: bool,
) -> Option<Result<Arc<dyn Pipeline>, StageError>> {
    C::request(request).map(|r| if open { C::parse_open(r, stages.clone()) } else { C::parse(r, stages.clone()) })
}

type Parse = fn(Kind, &Stages, bool) -> Option<Result<Arc<dyn Pipeline>, StageError>>;

/// Every pipeline this gateway runs: one line per kind registered in the contract
/// (`assay_proto::pipelines`), with its parser.
const REGISTRY: &[(gw::PipelineKind, Parse)] = &[
    (contract::ChecklistEval::KIND, parse_as::<contract::ChecklistEval>),
    (contract::GenerateChecklist::KIND, parse_as::<contract::GenerateChecklist>),
    (contract::TargetedRefinement::KIND, parse_as::<contract::TargetedRefinement>),
    (contract::SelfRefine::KIND, parse_as::<contract::SelfRefine>),
    (contract::Debate::KIND, parse_as::<contract::Debate>),
];

impl PipelineFactory for Pipelines {
    fn parse(&self, request: &gw::RunPipelineRequest) -> Result<Arc<dyn Pipeline>, StageError> {
        let Some(pipeline) = &request.pipeline else {
            return Err(StageError::invalid("pipeline", format!("is required ({})", contract::kind_names())));
        };
        // One lookup by kind, then one copy of the request for the parser that owns it.
        let kind = contract::kind_of(pipeline);
        REGISTRY
            .iter()
            .find(|(k, _)| *k == kind)
            .and_then(|(_, parse)| parse(pipeline.clone(), &self.stages, request.open))
            .unwrap_or_else(|| {
                Err(StageError::Unimplemented(format!(
                    "pipeline {} is not registered in this gateway",
                    kind.as_str_name()
                )))
            })
    }

    fn take_records(&self, request: &mut gw::RunPipelineRequest) -> Vec<gw::EvalRecord> {
        match &mut request.pipeline {
            Some(Kind::ChecklistEval(p)) => std::mem::take(&mut p.records),
            Some(Kind::GenerateChecklist(_) | Kind::TargetedRefinement(_) | Kind::SelfRefine(_) | Kind::Debate(_))
            | None => Vec::new(),
        }
    }
}
