//! The gateway: pipelines composed over the stage services.

pub mod core;
pub mod grpc;
pub mod runs;
pub mod stages;
pub mod store;

pub use core::{EvalRecord, Evaluation, EvaluationOutcome, GatewayCore, RecordOutcome};
pub use grpc::{GatewayGrpc, routes};
pub use runs::Runs;
pub use store::RunStore;

/// Where the gateway keeps runs: `gateway.store`, else `runs.db` in `gateway.data_dir`, else in
/// `ASSAY_DATA_DIR`, else `~/.local/share/assay`. `":memory:"` keeps runs in memory only.
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
