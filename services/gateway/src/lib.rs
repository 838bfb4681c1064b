//! The gateway: pipelines composed over the stage services, persisted runs.
//!
//! - the run engine is the `assay-runs` crate below this one (store, gap-free event sequences,
//!   replay-then-follow, pause / resume / cancel, checkpoints, restart recovery); it knows no
//!   pipeline kinds.
//! - [`pipelines`]: one module per pipeline, plain async Rust over the stage traits of
//!   `assay-domain`, and the factory that parses a request into its pipeline.
//! - [`grpc`]: the gRPC adapter over the engine.
//! - [`admin`]: the admin page and its HTTP face of the gRPC service (JSON + server-sent events).

pub mod admin;
pub mod grpc;
pub mod pipelines;

pub use assay_runs::{Engine, RunStore};
pub use grpc::{GatewayGrpc, routes};
pub use pipelines::{Pipelines, RefinementStages, Stages};

/// The run store the configuration names (see [`store_path`]): a SQLite file, or a PostgreSQL
/// database shared with other gateways (`gateway.instance_id`, `gateway.lease_seconds`).
pub async fn open_store(
    config: &assay_runtime::assay_config::AssayConfig,
) -> Result<RunStore, assay_domain::StageError> {
    let store = RunStore::connect(&store_path(config), &config.gateway.instance_id, lease(config)).await?;
    tracing::info!(store = %store.describe(), "run store open");
    Ok(store)
}

/// How long this gateway's claim on a run lasts unrenewed (shared store).
pub fn lease(config: &assay_runtime::assay_config::AssayConfig) -> std::time::Duration {
    std::time::Duration::from_secs_f64(config.gateway.lease_seconds)
}

/// Where the gateway keeps runs: `gateway.store`, else `runs.db` in `gateway.data_dir`, else in
/// `ASSAY_DATA_DIR`, else `~/.local/share/assay`. `":memory:"` keeps runs in memory only; a
/// `postgres://` URL names a shared PostgreSQL store.
pub fn store_path(config: &assay_runtime::assay_config::AssayConfig) -> String {
    if !config.gateway.store.is_empty() {
        return config.gateway.store.clone();
    }
    let dir = if !config.gateway.data_dir.is_empty() {
        std::path::PathBuf::from(&config.gateway.data_dir)
    } else if let Some(d) = std::env::var_os("ASSAY_DATA_DIR").filter(|d| !d.is_empty()) {
        std::path::PathBuf::from(d)
    } else if let Some(h) = std::env::var_os("HOME").filter(|d| !d.is_empty()) {
        std::path::PathBuf::from(h).join(".local/share/assay")
    } else {
        std::path::PathBuf::from("assay-data")
    };
    dir.join("runs.db").display().to_string()
}
