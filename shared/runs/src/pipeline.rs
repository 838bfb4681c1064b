//! What the engine runs: a pipeline, parsed from its request by a factory.

use std::sync::Arc;

use assay_domain::StageError;
use assay_proto::gateway::v1 as gw;

use crate::ctx::RunCtx;
use crate::store::NewRecord;

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
    /// Work on a run another gateway executes, with `ctx` from [`RunCtx`]'s helper form: claim
    /// chunks of its records, score them and store their results, until nothing is left to
    /// claim. Only pipelines whose records can be spread do anything.
    async fn help(&self, ctx: &RunCtx) -> Result<(), StageError> {
        let _ = ctx;
        Ok(())
    }
    /// A pipeline-specific control: accept, review, edit_section, and resume while the run awaits
    /// a human. Validate it against the run's state, then post it with [`crate::Inbox::post_action`]
    /// (which audits it) for the run to consume.
    /// Records appended to an open run, checked as the pipeline's own (fields named
    /// `records[i].*`), as rows to store. Pipelines that take no appended records refuse them.
    fn check_records(&self, records: Vec<gw::EvalRecord>) -> Result<Vec<NewRecord>, StageError> {
        let _ = records;
        Err(StageError::FailedPrecondition("only open checklist_eval runs take appended records".into()))
    }
    /// Records an open run of this pipeline holds at most (a pipeline that makes several results
    /// of each record holds fewer).
    fn max_records(&self) -> u64 {
        assay_domain::limits::MAX_RUN_RECORDS
    }
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
    /// An open run's records that came with its request, taken out of it (they become rows; the
    /// request is stored without them).
    fn take_records(&self, request: &mut gw::RunPipelineRequest) -> Vec<gw::EvalRecord> {
        let _ = request;
        Vec::new()
    }
}
