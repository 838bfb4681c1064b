//! The stages pipelines call, each behind the calling run's pause gate ([`super::gated`]).

use std::sync::Arc;

use assay_domain::arbiter::Arbiter;
use assay_domain::content::ContentRefiner;
use assay_domain::debate::Debate;
use assay_domain::judge::SectionJudge;
use assay_domain::self_refine::SelfRefiner;
use assay_domain::verify::DeltaJudge;
use assay_domain::{ChecklistGenerator, ChecklistRefiner, Scorer, StageError};

use super::gated::Gated;

/// The stages pipelines call: remote gRPC clients in production, in-process cores in tests. The
/// constructor and the `with_*` methods put each behind the pause gate of the run calling it.
#[derive(Clone)]
pub struct Stages {
    pub scorer: Arc<dyn Scorer>,
    pub generator: Option<Arc<dyn ChecklistGenerator>>,
    pub refiners: Option<Arc<dyn ChecklistRefiner>>,
    /// Targeted refinement: the judge panel, the arbiter, the patcher / section expander and the
    /// delta judge.
    pub refinement: Option<RefinementStages>,
    /// Self-refine (the refiners service).
    pub self_refiner: Option<Arc<dyn SelfRefiner>>,
    /// Debate (the debate service).
    pub debate: Option<Arc<dyn Debate>>,
    /// Concurrent stage calls per run (checklists produced, records scored).
    pub concurrency: usize,
}

impl Stages {
    pub fn new(scorer: Arc<dyn Scorer>, concurrency: usize) -> Self {
        Self {
            scorer: Gated::wrap(scorer),
            generator: None,
            refiners: None,
            refinement: None,
            self_refiner: None,
            debate: None,
            concurrency: concurrency.max(1),
        }
    }

    /// Generate checklists (instance presets and corpora) with this generator.
    pub fn with_generator(mut self, generator: Arc<dyn ChecklistGenerator>) -> Self {
        self.generator = Some(Gated::wrap(generator));
        self
    }

    /// Refine checklists with this refiners stage.
    pub fn with_refiners(mut self, refiners: Arc<dyn ChecklistRefiner>) -> Self {
        self.refiners = Some(Gated::wrap(refiners));
        self
    }

    /// Run targeted refinement with these stages.
    pub fn with_refinement(mut self, stages: RefinementStages) -> Self {
        let RefinementStages { judge, arbiter, editor, delta } = stages;
        self.refinement = Some(RefinementStages {
            judge: Gated::wrap(judge),
            arbiter: Gated::wrap(arbiter),
            editor: Gated::wrap(editor),
            delta: Gated::wrap(delta),
        });
        self
    }

    /// Self-refine drafts with this stage.
    pub fn with_self_refiner(mut self, stage: Arc<dyn SelfRefiner>) -> Self {
        self.self_refiner = Some(Gated::wrap(stage));
        self
    }

    /// Run debates with this stage.
    pub fn with_debate(mut self, stage: Arc<dyn Debate>) -> Self {
        self.debate = Some(Gated::wrap(stage));
        self
    }

    pub(crate) fn debate(&self) -> Result<&Arc<dyn Debate>, StageError> {
        self.debate
            .as_ref()
            .ok_or_else(|| StageError::Unimplemented("this gateway has no debate stage configured".into()))
    }

    pub(crate) fn self_refiner(&self) -> Result<&Arc<dyn SelfRefiner>, StageError> {
        self.self_refiner
            .as_ref()
            .ok_or_else(|| StageError::Unimplemented("this gateway has no self-refine stage configured".into()))
    }

    pub(crate) fn refinement(&self) -> Result<&RefinementStages, StageError> {
        self.refinement.as_ref().ok_or_else(|| {
            StageError::Unimplemented(
                "this gateway has no judge / arbiter / delta judge / content refiner stages configured".into(),
            )
        })
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

/// The stages of targeted refinement.
#[derive(Clone)]
pub struct RefinementStages {
    pub judge: Arc<dyn SectionJudge>,
    pub arbiter: Arc<dyn Arbiter>,
    pub editor: Arc<dyn ContentRefiner>,
    pub delta: Arc<dyn DeltaJudge>,
}
