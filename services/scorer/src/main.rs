//! `assay-scorer`: the scorer service on its own.

use std::sync::Arc;

/// mimalloc: less time in allocation and contention than the system allocator under load.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    assay_runtime::main(run)
}

async fn run() -> std::process::ExitCode {
    let spec = assay_runtime::StageSpec {
        binary: "assay-scorer",
        service_name: assay_proto::service_names::SCORER,
        port: |p| p.scorer,
        uses_models: true,
    };
    assay_runtime::run_service(spec, &assay_runtime::default_loaders(), |hub, config| {
        assay_scorer::routes(Arc::new(assay_scorer::ScorerCore::new(hub, config.scorer.concurrency as usize)))
    })
    .await
}
