//! The gateway's pipelines, one module each, over stage traits from `assay-domain`:
//! [`checklist_eval`] and [`generate_checklist`] (sharing [`checklist`], where checklists come
//! from), [`targeted_refinement`], [`self_refine`] and [`debate`]; [`self_refine_hook`] post-processes
//! the text outputs of the last two. [`Pipelines`] parses a request into the pipeline that runs it.

pub mod checklist;
pub mod checklist_eval;
pub mod debate;
mod gated;
pub mod generate_checklist;
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

impl PipelineFactory for Pipelines {
    fn parse(&self, request: &gw::RunPipelineRequest) -> Result<Arc<dyn Pipeline>, StageError> {
        match request.pipeline.clone() {
            Some(Kind::ChecklistEval(p)) => Ok(Arc::new(checklist_eval::ChecklistEval::parse(p, self.stages.clone())?)),
            Some(Kind::GenerateChecklist(p)) => {
                Ok(Arc::new(generate_checklist::GenerateChecklist::parse(p, self.stages.clone())?))
            }
            Some(Kind::TargetedRefinement(p)) => {
                Ok(Arc::new(targeted_refinement::TargetedRefinement::parse(p, self.stages.clone())?))
            }
            Some(Kind::SelfRefine(p)) => Ok(Arc::new(self_refine::SelfRefine::parse(p, self.stages.clone())?)),
            Some(Kind::Debate(p)) => Ok(Arc::new(debate::DebatePipeline::parse(p, self.stages.clone())?)),
            None => Err(StageError::invalid(
                "pipeline",
                "is required (checklist_eval, generate_checklist, targeted_refinement, self_refine or debate)",
            )),
        }
    }
}
