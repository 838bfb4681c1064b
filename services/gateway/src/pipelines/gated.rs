//! Every stage a pipeline calls, behind its run's pause gate: a call waits while the run is paused
//! (and fails with CANCELLED once it is cancelled) before it starts, so no pipeline can start a
//! model call on a paused run however it is written. [`super::Stages`] wraps each stage it is
//! given; outside a run (no gate in scope) a call goes straight through.

use std::sync::Arc;

use assay_domain::arbiter::{self, Arbiter};
use assay_domain::content::{self, ContentRefiner};
use assay_domain::debate::{self, Debate};
use assay_domain::generator::{self, ChecklistGenerator};
use assay_domain::judge::{self, SectionJudge};
use assay_domain::refiners::{self, ChecklistRefiner};
use assay_domain::self_refine::{self, SelfRefiner};
use assay_domain::similarity::CompareOutcome;
use assay_domain::verify::{self, DeltaJudge};
use assay_domain::{ChecklistItem, EventSink, ScoreEvent, ScoreOutcome, ScoreRequest, Scorer, StageError};

use crate::engine::stage_gate;

/// A stage behind the pause gate of the run calling it.
pub struct Gated<S: ?Sized>(pub Arc<S>);

impl<S: ?Sized> Gated<S> {
    pub fn wrap(stage: Arc<S>) -> Arc<Self> {
        Arc::new(Self(stage))
    }
}

#[async_trait::async_trait]
impl Scorer for Gated<dyn Scorer> {
    async fn score(
        &self,
        request: ScoreRequest,
        events: EventSink<'_, ScoreEvent>,
    ) -> Result<ScoreOutcome, StageError> {
        stage_gate().await?;
        self.0.score(request, events).await
    }
}

#[async_trait::async_trait]
impl ChecklistGenerator for Gated<dyn ChecklistGenerator> {
    async fn generate(&self, request: generator::GenerateRequest) -> Result<generator::GenerateOutcome, StageError> {
        stage_gate().await?;
        self.0.generate(request).await
    }

    async fn generate_corpus(
        &self,
        request: generator::CorpusRequest,
        events: EventSink<'_, generator::corpus::CorpusProgress>,
    ) -> Result<generator::corpus::CorpusOutcome, StageError> {
        stage_gate().await?;
        self.0.generate_corpus(request, events).await
    }

    async fn list_presets(&self) -> Result<Vec<generator::PresetInfo>, StageError> {
        // No model call.
        self.0.list_presets().await
    }
}

#[async_trait::async_trait]
impl ChecklistRefiner for Gated<dyn ChecklistRefiner> {
    async fn refine(
        &self,
        items: Vec<ChecklistItem>,
        steps: Vec<refiners::RefinerStep>,
        events: EventSink<'_, refiners::StepReport>,
    ) -> Result<refiners::ChainOutcome, StageError> {
        stage_gate().await?;
        self.0.refine(items, steps, events).await
    }
}

#[async_trait::async_trait]
impl SectionJudge for Gated<dyn SectionJudge> {
    async fn judge_sections(
        &self,
        request: judge::JudgeSectionsRequest,
        events: EventSink<'_, judge::JudgeEvent>,
    ) -> Result<judge::PanelOutcome, StageError> {
        stage_gate().await?;
        self.0.judge_sections(request, events).await
    }
}

#[async_trait::async_trait]
impl Arbiter for Gated<dyn Arbiter> {
    async fn consolidate(&self, request: arbiter::ConsolidateRequest) -> Result<arbiter::Consolidation, StageError> {
        stage_gate().await?;
        self.0.consolidate(request).await
    }

    async fn route(&self, request: arbiter::RouteRequest) -> Result<arbiter::Routing, StageError> {
        stage_gate().await?;
        self.0.route(request).await
    }

    async fn plan(&self, request: arbiter::PlanRequest) -> Result<arbiter::Plan, StageError> {
        stage_gate().await?;
        self.0.plan(request).await
    }
}

#[async_trait::async_trait]
impl ContentRefiner for Gated<dyn ContentRefiner> {
    async fn patch(&self, request: content::SectionEditRequest) -> Result<content::SectionEdit, StageError> {
        stage_gate().await?;
        self.0.patch(request).await
    }

    async fn expand_section(&self, request: content::SectionEditRequest) -> Result<content::SectionEdit, StageError> {
        stage_gate().await?;
        self.0.expand_section(request).await
    }
}

#[async_trait::async_trait]
impl DeltaJudge for Gated<dyn DeltaJudge> {
    async fn verify(&self, request: verify::VerifyRequest) -> Result<verify::VerifyOutcome, StageError> {
        stage_gate().await?;
        self.0.verify(request).await
    }

    async fn compare_texts(&self, request: verify::CompareRequest) -> Result<CompareOutcome, StageError> {
        stage_gate().await?;
        self.0.compare_texts(request).await
    }

    async fn check_consistency(
        &self,
        request: verify::ConsistencyRequest,
    ) -> Result<verify::ConsistencyOutcome, StageError> {
        stage_gate().await?;
        self.0.check_consistency(request).await
    }
}

#[async_trait::async_trait]
impl SelfRefiner for Gated<dyn SelfRefiner> {
    async fn self_refine(
        &self,
        request: self_refine::SelfRefineRequest,
        events: EventSink<'_, self_refine::SelfRefinePassEvent>,
    ) -> Result<self_refine::SelfRefineOutcome, StageError> {
        stage_gate().await?;
        self.0.self_refine(request, events).await
    }
}

#[async_trait::async_trait]
impl Debate for Gated<dyn Debate> {
    async fn solve(&self, request: debate::SolveRequest) -> Result<debate::SolveOutcome, StageError> {
        stage_gate().await?;
        self.0.solve(request).await
    }

    async fn review(&self, request: debate::ReviewRequest) -> Result<debate::ReviewOutcome, StageError> {
        stage_gate().await?;
        self.0.review(request).await
    }

    async fn refine(&self, request: debate::RefineRequest) -> Result<debate::RefineOutcome, StageError> {
        stage_gate().await?;
        self.0.refine(request).await
    }

    async fn judge(&self, request: debate::JudgeRequest) -> Result<debate::Judgment, StageError> {
        stage_gate().await?;
        self.0.judge(request).await
    }

    async fn run_debate(
        &self,
        request: debate::DebateRequest,
        events: EventSink<'_, debate::DebateEvent>,
    ) -> Result<debate::DebateOutcome, StageError> {
        stage_gate().await?;
        self.0.run_debate(request, events).await
    }
}
