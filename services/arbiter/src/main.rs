//! `assay-arbiter`: the arbiter service on its own.

/// mimalloc: less time in allocation and contention than the system allocator under load.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    assay_runtime::main(run)
}

async fn run() -> std::process::ExitCode {
    let spec = assay_runtime::StageSpec {
        binary: "assay-arbiter",
        service_name: assay_proto::service_names::ARBITER,
        port: |p| p.arbiter,
        uses_models: true,
    };
    assay_runtime::run_service(spec, &assay_runtime::default_loaders(), |hub, _config| {
        assay_arbiter::routes(std::sync::Arc::new(assay_arbiter::ArbiterCore::new(hub)))
    })
    .await
}
