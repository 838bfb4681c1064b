//! Every stage a pipeline calls, behind its run's pause gate: a call waits while the run is paused
//! (and fails with CANCELLED once it is cancelled) before it starts, so no pipeline can start a
//! model call on a paused run however it is written, and runs on a slice of the run's budget
//! ([`assay_runs::metered`]). [`super::Stages`] wraps each stage it is given; outside a run
//! (no gate in scope) a call goes straight through.

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
use assay_domain::{ChecklistItem, EventSink, ScoreEvent, ScoreOutcome, ScoreRequest, Scorer, StageError, Usage};

use assay_runs::{metered, stage_gate};

/// A stage call of `kind` behind the run's pause gate, on a slice of the run's budget.
async fn gated<T, Fut>(
    kind: &str,
    usage_of: impl Fn(&T) -> Usage + Send,
    call: impl FnMut() -> Fut + Send,
) -> Result<T, StageError>
where
    Fut: std::future::Future<Output = Result<T, StageError>> + Send,
{
    stage_gate().await?;
    metered(kind, usage_of, call).await
}

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
        gated("scorer.score", |o: &ScoreOutcome| o.usage.clone(), || self.0.score(request.clone(), events)).await
    }
}

#[async_trait::async_trait]
impl ChecklistGenerator for Gated<dyn ChecklistGenerator> {
    async fn generate(&self, request: generator::GenerateRequest) -> Result<generator::GenerateOutcome, StageError> {
        gated(
            "generator.generate",
            |o: &generator::GenerateOutcome| o.usage.clone(),
            || self.0.generate(request.clone()),
        )
        .await
    }

    async fn generate_corpus(
        &self,
        request: generator::CorpusRequest,
        events: EventSink<'_, generator::corpus::CorpusProgress>,
    ) -> Result<generator::corpus::CorpusOutcome, StageError> {
        gated(
            "generator.generate_corpus",
            |o: &generator::corpus::CorpusOutcome| o.usage.clone(),
            || self.0.generate_corpus(request.clone(), events),
        )
        .await
    }

    async fn list_presets(&self) -> Result<Vec<generator::PresetInfo>, StageError> {
        // No model call.
        self.0.list_presets().await
    }

    async fn respond(
        &self,
        request: generator::RespondRequest,
        events: EventSink<'_, (u32, String)>,
    ) -> Result<generator::RespondOutcome, StageError> {
        gated(
            "generator.respond",
            |o: &generator::RespondOutcome| o.usage.clone(),
            || self.0.respond(request.clone(), events),
        )
        .await
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
        gated(
            "refiners.refine",
            |o: &refiners::ChainOutcome| o.usage.clone(),
            || self.0.refine(items.clone(), steps.clone(), events),
        )
        .await
    }
}

#[async_trait::async_trait]
impl SectionJudge for Gated<dyn SectionJudge> {
    async fn judge_sections(
        &self,
        request: judge::JudgeSectionsRequest,
        events: EventSink<'_, judge::JudgeEvent>,
    ) -> Result<judge::PanelOutcome, StageError> {
        gated(
            "scorer.judge_sections",
            |o: &judge::PanelOutcome| o.usage.clone(),
            || self.0.judge_sections(request.clone(), events),
        )
        .await
    }
}

#[async_trait::async_trait]
impl Arbiter for Gated<dyn Arbiter> {
    async fn consolidate(&self, request: arbiter::ConsolidateRequest) -> Result<arbiter::Consolidation, StageError> {
        gated(
            "arbiter.consolidate",
            |o: &arbiter::Consolidation| o.usage.clone(),
            || self.0.consolidate(request.clone()),
        )
        .await
    }

    async fn route(&self, request: arbiter::RouteRequest) -> Result<arbiter::Routing, StageError> {
        gated("arbiter.route", |_: &arbiter::Routing| Usage::default(), || self.0.route(request.clone())).await
    }

    async fn plan(&self, request: arbiter::PlanRequest) -> Result<arbiter::Plan, StageError> {
        gated("arbiter.plan", |o: &arbiter::Plan| o.consolidation.usage.clone(), || self.0.plan(request.clone())).await
    }
}

#[async_trait::async_trait]
impl ContentRefiner for Gated<dyn ContentRefiner> {
    async fn patch(&self, request: content::SectionEditRequest) -> Result<content::SectionEdit, StageError> {
        gated("refiners.patch", |o: &content::SectionEdit| o.usage.clone(), || self.0.patch(request.clone())).await
    }

    async fn expand_section(&self, request: content::SectionEditRequest) -> Result<content::SectionEdit, StageError> {
        gated(
            "refiners.expand_section",
            |o: &content::SectionEdit| o.usage.clone(),
            || self.0.expand_section(request.clone()),
        )
        .await
    }
}

#[async_trait::async_trait]
impl DeltaJudge for Gated<dyn DeltaJudge> {
    async fn verify(&self, request: verify::VerifyRequest) -> Result<verify::VerifyOutcome, StageError> {
        gated("delta_judge.verify", |o: &verify::VerifyOutcome| o.usage.clone(), || self.0.verify(request.clone()))
            .await
    }

    async fn compare_texts(&self, request: verify::CompareRequest) -> Result<CompareOutcome, StageError> {
        gated(
            "delta_judge.compare_texts",
            |_: &CompareOutcome| Usage::default(),
            || self.0.compare_texts(request.clone()),
        )
        .await
    }

    async fn check_consistency(
        &self,
        request: verify::ConsistencyRequest,
    ) -> Result<verify::ConsistencyOutcome, StageError> {
        gated(
            "delta_judge.check_consistency",
            |o: &verify::ConsistencyOutcome| o.usage.clone(),
            || self.0.check_consistency(request.clone()),
        )
        .await
    }

    async fn readability(&self, text: String) -> Result<verify::ReadabilityReport, StageError> {
        gated(
            "delta_judge.readability",
            |_: &verify::ReadabilityReport| Usage::default(),
            || self.0.readability(text.clone()),
        )
        .await
    }
}

#[async_trait::async_trait]
impl SelfRefiner for Gated<dyn SelfRefiner> {
    async fn self_refine(
        &self,
        request: self_refine::SelfRefineRequest,
        events: EventSink<'_, self_refine::SelfRefinePassEvent>,
    ) -> Result<self_refine::SelfRefineOutcome, StageError> {
        gated(
            "refiners.self_refine",
            |o: &self_refine::SelfRefineOutcome| o.usage.clone(),
            || self.0.self_refine(request.clone(), events),
        )
        .await
    }
}

#[async_trait::async_trait]
impl Debate for Gated<dyn Debate> {
    async fn solve(&self, request: debate::SolveRequest) -> Result<debate::SolveOutcome, StageError> {
        gated("debate.solve", |o: &debate::SolveOutcome| o.usage.clone(), || self.0.solve(request.clone())).await
    }

    async fn review(&self, request: debate::ReviewRequest) -> Result<debate::ReviewOutcome, StageError> {
        gated("debate.review", |o: &debate::ReviewOutcome| o.usage.clone(), || self.0.review(request.clone())).await
    }

    async fn refine(&self, request: debate::RefineRequest) -> Result<debate::RefineOutcome, StageError> {
        gated("debate.refine", |o: &debate::RefineOutcome| o.usage.clone(), || self.0.refine(request.clone())).await
    }

    async fn judge(&self, request: debate::JudgeRequest) -> Result<debate::Judgment, StageError> {
        gated("debate.judge", |o: &debate::Judgment| o.usage.clone(), || self.0.judge(request.clone())).await
    }

    async fn run_debate(
        &self,
        request: debate::DebateRequest,
        events: EventSink<'_, debate::DebateEvent>,
    ) -> Result<debate::DebateOutcome, StageError> {
        gated(
            "debate.run_debate",
            |o: &debate::DebateOutcome| o.usage.clone(),
            || self.0.run_debate(request.clone(), events),
        )
        .await
    }
}
