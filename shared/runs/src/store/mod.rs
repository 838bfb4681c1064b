//! Persistent run state: runs, their event logs and their checkpoints (opaque bytes under keys a
//! pipeline chooses), so a restarted gateway can resume a run and replay its events. The store
//! knows no pipeline kinds.
//!
//! Two implementations of [`RunStorage`], chosen by `gateway.store`:
//! - SQLite (a file, or `:memory:`): the embedded default, one gateway per file;
//! - PostgreSQL (`postgres://...`): shared by several gateways. Each run is executed by one
//!   gateway at a time, the one holding its lease; every write of a run's events, summary and
//!   checkpoints is fenced by that lease, so a gateway that lost a run can no longer change it.
//!   Another gateway takes over a run whose lease expired and resumes it from its checkpoints.

mod contract;
mod handle;
mod observed;
mod postgres;
pub(crate) mod result_keys;
mod sqlite;

pub use contract::{
    Appended, Chunk, ChunkCommit, ChunkRow, ChunkStorage, Claim, ControlOutcome, ControlRefusal, HoldOutcome,
    NewRecord, PostedControl, RecordStorage, RecordsPage, RunStorage, RunWrite, SpendHold, SpendLedger, StoredRun,
    state_refused,
};
pub use handle::RunStore;
pub use observed::ObservedStore;
pub use postgres::{PostgresStore, redact_url};
pub use sqlite::SqliteStore;
