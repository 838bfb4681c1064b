//! What the engine runs: a pipeline, parsed from its request by a factory.

use std::sync::Arc;

use assay_domain::StageError;
use assay_proto::gateway::v1 as gw;

use crate::ctx::RunCtx;

/// How a pipeline ended: its final state (SUCCEEDED, PARTIAL, FAILED or CANCELLED) and result.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOutcome {
    pub state: gw::RunState,
    pub result: Option<gw::run_result::Result>,
}

/// What a pipeline-specific control did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlEffect {
    /// Taken; the run goes on.
    Taken,
    /// Taken; the run ends because of it (the engine answers once it has).
    Ends,
}

/// One pipeline run, parsed from its request.
#[async_trait::async_trait]
pub trait Pipeline: Send + Sync {
    fn kind(&self) -> gw::PipelineKind;
    /// Units of work the run reports progress in (records), 0 when it has none.
    fn total(&self) -> u32;
    /// Run to the end (or until cancelled), resuming from the run's checkpoints. An error fails
    /// the run; observe [`crate::Gate::wait`] before starting new work.
    async fn run(&self, ctx: &RunCtx) -> Result<RunOutcome, StageError>;
    /// A pipeline-specific control: accept, review, edit_section, and resume while the run awaits
    /// a human. Validate it against the run's state, then post it with [`crate::Inbox::post_action`]
    /// (which audits it) for the run to consume.
    async fn control(&self, ctx: &RunCtx, request: &gw::ControlRunRequest) -> Result<ControlEffect, StageError> {
        let _ = (ctx, request);
        Err(StageError::FailedPrecondition(
            "accept, review and edit_section apply to targeted refinement runs only".into(),
        ))
    }
}

/// Builds pipelines from requests: at start (the request is parsed once, here) and after a
/// restart (from the stored request).
pub trait PipelineFactory: Send + Sync {
    fn parse(&self, request: &gw::RunPipelineRequest) -> Result<Arc<dyn Pipeline>, StageError>;
}
