//! The `self_refine` pipeline: one critique / revise loop over a draft (the refiners service's
//! SelfRefine), each pass relayed as a `self_refine_pass` event as it finishes, the outcome stored
//! with the run.
//!
//! The loop runs one pass per stage call, each pass stored as it finishes and handed back to the
//! stage as `prior_passes` on the next call: a paused run stops between passes (no model call while
//! paused) and a resumed or restarted run goes on from the pass reached; a finished loop is never
//! redone.
//!
//! A refiner error keeps the previous draft and is reported, on every pass
//! alike: the stage records a failed model call of a later pass in that pass, and a stage call that
//! fails as a whole (a very first model call that failed outright, or the stage itself out of
//! reach) becomes the same outcome here ([`SelfRefineOutcome::refiner_failed`]). A 400 (context too
//! long), a 401 (bad credentials) or a timeout on pass 1 leaves the run SUCCEEDED with the draft
//! unchanged and the error in pass 1, as on pass 2: nothing was lost but the polish. Only a wrong
//! request, a mesh without the stage, a bug or a cancel end the run.

use assay_domain::StageError;
use assay_domain::model::ModelRecord;
use assay_domain::self_refine::{SelfRefineOutcome, SelfRefinePass, SelfRefinePassEvent, SelfRefineRequest};
use assay_proto::convert;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::run_event::Event;
use tokio::sync::mpsc;

use super::stages::Stages;
use assay_runs::{Pipeline, RunCtx, RunOutcome};

/// Checkpoint key of the finished loop.
const DONE: &str = "self_refine:outcome";
/// Checkpoint key of the passes run so far (the loop not finished).
const PASSES: &str = "self_refine:passes";

/// A parsed self-refine run.
pub struct SelfRefine {
    request: SelfRefineRequest,
    stages: Stages,
}

impl SelfRefine {
    /// Parse and validate (fields named `pipeline.request.*`).
    pub fn parse(p: gw::SelfRefinePipeline, stages: Stages) -> Result<Self, StageError> {
        let Some(request) = p.request else {
            return Err(StageError::invalid("pipeline.request", "is required (draft, instruction, max_passes, ...)"));
        };
        let request = convert::self_refine::self_refine_request(request, "pipeline.request")?;
        stages.self_refiner()?;
        Ok(Self { request, stages })
    }

    async fn refine(&self, ctx: &RunCtx) -> Result<SelfRefineOutcome, StageError> {
        if let Some(done) = ctx.checkpoints.load_json::<SelfRefineOutcome>(DONE).await? {
            return Ok(done);
        }
        let mut passes: Vec<SelfRefinePass> = ctx.checkpoints.load_json(PASSES).await?.unwrap_or_default();
        // The refiner's record, from the last call that reported one.
        let mut model = ModelRecord::default();
        loop {
            // Between passes: a paused run waits here, and goes on from the pass reached.
            ctx.gate.wait().await?;
            let (tx, mut rx) = mpsc::unbounded_channel::<SelfRefinePassEvent>();
            let sink = move |e: SelfRefinePassEvent| {
                let _ = tx.send(e);
            };
            let request =
                SelfRefineRequest { prior_passes: passes.clone(), passes_this_call: 1, ..self.request.clone() };
            let call = self.stages.self_refiner()?.self_refine(request, &sink);
            let outcome = match assay_runs::relay_with(&mut rx, call, |e| Self::relay(ctx, e)).await? {
                Ok(outcome) => outcome,
                // A refiner error keeps the previous draft and is reported, whichever
                // pass it hit: the stage reported nothing but its failure, so the text the passes
                // so far left (the draft on pass 1) is the outcome, the error in a pass of its own.
                Err(e) if keeps_the_draft(&e) => {
                    tracing::warn!(pass = passes.len() + 1, error = %e, "self-refine pass failed; the previous draft is kept");
                    let outcome = SelfRefineOutcome::refiner_failed(
                        &self.request.draft,
                        passes.clone(),
                        e.to_string(),
                        model.clone(),
                    );
                    if let Some(failed) = outcome.passes.last() {
                        Self::relay(ctx, SelfRefinePassEvent::PassFinished(failed.clone())).await?;
                    }
                    outcome
                }
                Err(e) => return Err(e),
            };
            // This call's passes (the earlier ones came back as they were sent).
            for p in outcome.passes.iter().skip(passes.len()) {
                ctx.spending.add_usage(&p.usage);
            }
            if outcome.model != ModelRecord::default() {
                ctx.progress.add_model(&outcome.model);
                model.clone_from(&outcome.model);
            }
            if outcome.finished(self.request.max_passes) {
                ctx.checkpoints.put_json(DONE, &outcome).await?;
                return Ok(outcome);
            }
            passes.clone_from(&outcome.passes);
            ctx.checkpoints.put_json(PASSES, &passes).await?;
        }
    }

    /// A finished pass, as a `self_refine_pass` event (and one more step done).
    async fn relay(ctx: &RunCtx, event: SelfRefinePassEvent) -> Result<(), StageError> {
        let SelfRefinePassEvent::PassFinished(pass) = event;
        ctx.progress.add_done();
        ctx.log.emit(Event::SelfRefinePass(convert::self_refine::pass_to(&pass))).await
    }
}

/// Whether a failed refiner call is a refiner error that keeps the previous draft (and is
/// reported), as opposed to one that ends the run. The same rule on every pass: exactly the errors
/// a refiner's model call fails with (what the stage records in a later pass), whatever pass it
/// was: the backend down, overloaded or its breaker open; the request refused (a 400: context too
/// long; a 401 or 403: credentials; a backend that cannot do it); a timeout; the run's budget
/// refusing the call (the run records why). A finished text is never thrown away for them. What
/// ends the run instead: a request the stage finds wrong, a mesh without the stage, a bug, a
/// cancel.
fn keeps_the_draft(e: &StageError) -> bool {
    match e {
        StageError::Unavailable(_)
        | StageError::RateLimited(_)
        | StageError::CircuitOpen(_)
        | StageError::ResourceExhausted(_)
        | StageError::FailedPrecondition(_)
        | StageError::DeadlineExceeded(_)
        | StageError::BudgetExhausted(_) => true,
        StageError::InvalidArgument(_)
        | StageError::NotFound(_)
        | StageError::Cancelled(_)
        | StageError::Unimplemented(_)
        | StageError::Internal(_) => false,
    }
}

#[async_trait::async_trait]
impl Pipeline for SelfRefine {
    fn kind(&self) -> gw::PipelineKind {
        gw::PipelineKind::SelfRefine
    }

    /// Progress is counted in passes (at most `max_passes`).
    fn total(&self) -> u32 {
        self.request.max_passes
    }

    async fn run(&self, ctx: &RunCtx) -> Result<RunOutcome, StageError> {
        let outcome = tokio::select! {
            biased;
            () = ctx.gate.cancelled() => return Err(StageError::Cancelled("the run was cancelled".into())),
            outcome = self.refine(ctx) => outcome?,
        };
        ctx.progress.set_done(outcome.passes.len() as u32);
        Ok(RunOutcome {
            state: gw::RunState::Succeeded,
            result: Some(gw::run_result::Result::SelfRefine(convert::self_refine::self_refine_response_to(&outcome))),
        })
    }
}

impl super::Registered for assay_proto::pipelines::SelfRefine {
    fn parse(request: Self::Request, stages: super::Stages) -> Result<std::sync::Arc<dyn Pipeline>, StageError> {
        Ok(std::sync::Arc::new(SelfRefine::parse(request, stages)?))
    }
}
