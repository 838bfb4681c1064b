//! The `self_refine` pipeline: one critique / revise loop over a draft (the refiners service's
//! SelfRefine), each pass relayed as a `self_refine_pass` event as it finishes, the outcome stored
//! with the run.
//!
//! The loop is one stage call. A gateway restart while it runs starts it again from the draft
//! (passes are not resumable mid-way: the regression guard measures against the original and the
//! best draft, which only the stage holds); a finished loop is never redone.

use assay_domain::StageError;
use assay_domain::self_refine::{SelfRefineOutcome, SelfRefinePassEvent, SelfRefineRequest};
use assay_proto::convert;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::run_event::Event;
use tokio::sync::mpsc;

use super::stages::Stages;
use crate::engine::{Pipeline, RunCtx, RunOutcome};

/// Checkpoint key of the finished loop.
const DONE: &str = "self_refine:outcome";

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
        if let Some(done) = ctx.load_json::<SelfRefineOutcome>(DONE).await? {
            return Ok(done);
        }
        let (tx, mut rx) = mpsc::unbounded_channel::<SelfRefinePassEvent>();
        let sink = move |e: SelfRefinePassEvent| {
            let _ = tx.send(e);
        };
        let call = self.stages.self_refiner()?.self_refine(self.request.clone(), &sink);
        tokio::pin!(call);
        let outcome = loop {
            tokio::select! {
                biased;
                out = &mut call => {
                    while let Ok(e) = rx.try_recv() {
                        self.relay(ctx, e).await?;
                    }
                    break out?;
                }
                Some(e) = rx.recv() => self.relay(ctx, e).await?,
            }
        };
        ctx.add_usage(&outcome.usage);
        ctx.add_model(&outcome.model);
        ctx.checkpoint_json(DONE, &outcome).await?;
        Ok(outcome)
    }

    async fn relay(&self, ctx: &RunCtx, event: SelfRefinePassEvent) -> Result<(), StageError> {
        let SelfRefinePassEvent::PassFinished(pass) = event;
        ctx.add_done();
        ctx.emit(Event::SelfRefinePass(convert::self_refine::pass_to(&pass))).await
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
            () = ctx.cancelled() => return Err(StageError::Cancelled("the run was cancelled".into())),
            outcome = self.refine(ctx) => outcome?,
        };
        ctx.set_done(outcome.passes.len() as u32);
        Ok(RunOutcome {
            state: gw::RunState::Succeeded,
            result: Some(gw::run_result::Result::SelfRefine(convert::self_refine::self_refine_response_to(&outcome))),
        })
    }
}
