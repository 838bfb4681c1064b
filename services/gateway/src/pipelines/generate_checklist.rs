//! The `generate_checklist` pipeline: one checklist (generated from a record by a preset, from a
//! corpus, or given), refined when asked, as the result. Nothing is scored.

use assay_domain::{StageError, Violations};
use assay_proto::convert;
use assay_proto::gateway::v1 as gw;

use super::checklist::{ChecklistPlan, ChecklistSource, EvalRecord, Produced};
use super::stages::Stages;
use assay_runs::{Pipeline, RunCtx, RunOutcome};

/// A parsed generate-only pipeline.
pub struct GenerateChecklist {
    plan: ChecklistPlan,
    record: EvalRecord,
    stages: Stages,
}

impl GenerateChecklist {
    /// Parse and validate (fields named `pipeline.*`).
    pub fn parse(p: gw::GenerateChecklistPipeline, stages: Stages) -> Result<Self, StageError> {
        let gw::GenerateChecklistPipeline { source, record, generator_model, max_items, refiners, candidate_models } =
            p;
        let mut v = Violations::new();
        let no_refiners = refiners.is_empty();
        let plan = ChecklistPlan::parse(source, generator_model, max_items, refiners, candidate_models, &mut v);
        let record = EvalRecord::parse(record.unwrap_or_default(), "pipeline.record", &mut v);
        match plan.as_ref().map(|p| &p.source) {
            Some(ChecklistSource::Preset(_)) if record.input.trim().is_empty() => {
                v.push("pipeline.record.input", "must not be empty: the preset generates a checklist from it");
            }
            Some(ChecklistSource::Explicit(_)) if no_refiners => {
                v.push(
                    "pipeline.refiners",
                    "must not be empty when the source is an explicit checklist (nothing to do)",
                );
            }
            Some(ChecklistSource::Preset(_) | ChecklistSource::Explicit(_) | ChecklistSource::Corpus(_)) | None => {}
        }
        v.into_result()?;
        let Some(plan) = plan else { return Err(StageError::invalid("pipeline.source", "is invalid")) };
        let mut v = Violations::new();
        for (field, description) in
            plan.validate_generation(std::slice::from_ref(&record), |_| "pipeline.record".into())
        {
            v.push(field, description);
        }
        v.into_result()?;
        Ok(Self { plan, record, stages })
    }
}

#[async_trait::async_trait]
impl Pipeline for GenerateChecklist {
    fn kind(&self) -> gw::PipelineKind {
        gw::PipelineKind::GenerateChecklist
    }

    fn total(&self) -> u32 {
        0
    }

    async fn run(&self, ctx: &RunCtx) -> Result<RunOutcome, StageError> {
        let Produced { checklists, failures, .. } =
            self.plan.produce_all(ctx, &self.stages, std::slice::from_ref(&self.record)).await?;
        if let Some(why) = failures.into_iter().flatten().next() {
            return Err(StageError::Unavailable(format!("checklist generation failed: {why}")));
        }
        let checklist = checklists.into_iter().next().unwrap_or_default();
        Ok(RunOutcome {
            state: gw::RunState::Succeeded,
            result: Some(gw::run_result::Result::Checklist(convert::checklist_to(&checklist))),
        })
    }
}

impl super::Registered for assay_proto::pipelines::GenerateChecklist {
    fn parse(request: Self::Request, stages: super::Stages) -> Result<std::sync::Arc<dyn Pipeline>, StageError> {
        Ok(std::sync::Arc::new(GenerateChecklist::parse(request, stages)?))
    }
}
