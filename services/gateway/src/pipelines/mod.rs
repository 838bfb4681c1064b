//! The gateway's pipelines, one module each, over stage traits from `assay-domain`:
//! [`checklist_eval`] and [`generate_checklist`] (sharing [`checklist`], where checklists come
//! from). [`Pipelines`] parses a request into the pipeline that runs it.

pub mod checklist;
pub mod checklist_eval;
pub mod generate_checklist;

use std::sync::Arc;

use assay_domain::{ChecklistGenerator, ChecklistRefiner, Scorer, StageError};
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::run_pipeline_request::Pipeline as Kind;

use crate::engine::{Pipeline, PipelineFactory};

/// The stages pipelines call: remote gRPC clients in production, in-process cores in tests.
#[derive(Clone)]
pub struct Stages {
    pub scorer: Arc<dyn Scorer>,
    pub generator: Option<Arc<dyn ChecklistGenerator>>,
    pub refiners: Option<Arc<dyn ChecklistRefiner>>,
    /// Concurrent stage calls per run (checklists produced, records scored).
    pub concurrency: usize,
}

impl Stages {
    pub fn new(scorer: Arc<dyn Scorer>, concurrency: usize) -> Self {
        Self { scorer, generator: None, refiners: None, concurrency: concurrency.max(1) }
    }

    /// Generate checklists (instance presets and corpora) with this generator.
    pub fn with_generator(mut self, generator: Arc<dyn ChecklistGenerator>) -> Self {
        self.generator = Some(generator);
        self
    }

    /// Refine checklists with this refiners stage.
    pub fn with_refiners(mut self, refiners: Arc<dyn ChecklistRefiner>) -> Self {
        self.refiners = Some(refiners);
        self
    }

    pub(crate) fn generator(&self) -> Result<&Arc<dyn ChecklistGenerator>, StageError> {
        self.generator
            .as_ref()
            .ok_or_else(|| StageError::Unimplemented("this gateway has no generator configured".into()))
    }

    pub(crate) fn refiners(&self) -> Result<&Arc<dyn ChecklistRefiner>, StageError> {
        self.refiners
            .as_ref()
            .ok_or_else(|| StageError::Unimplemented("this gateway has no refiners service configured".into()))
    }
}

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
            Some(Kind::TargetedRefinement(_) | Kind::SelfRefine(_) | Kind::Debate(_)) => {
                Err(StageError::Unimplemented(
                    "this pipeline is not available yet; checklist_eval and generate_checklist are".into(),
                ))
            }
            None => Err(StageError::invalid("pipeline", "is required (checklist_eval or generate_checklist)")),
        }
    }
}
