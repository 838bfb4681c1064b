//! The run engine: durable runs of any pipeline. It stores the request, gives a run gap-free event
//! sequences (persisted, then broadcast), replays then follows them for watchers, pauses, resumes and
//! cancels, keeps checkpoints, and after a restart rebuilds each unfinished pipeline from its stored
//! request through the [`PipelineFactory`]. It knows no pipeline kinds: a pipeline is a
//! [`Pipeline`] (the gateway's pipelines implement it). Below the gateway: it depends on no service.

mod clock;
mod ctx;
mod engine;
mod meter;
mod metrics;
mod pipeline;
mod spend;
pub mod store;
mod stream;

pub use ctx::{
    Checkpoints, EventLog, Gate, Inbox, Inputs, Progress, Results, RunCtx, Spending, Writes, Written, relay_with,
    stage_gate,
};
pub use engine::Engine;
pub use meter::metered;
pub use pipeline::{ControlEffect, Pipeline, PipelineFactory, RunOutcome};
pub use spend::SpendCaps;
pub use store::{PostgresStore, RunStorage, RunStore, SqliteStore, StoredRun};
