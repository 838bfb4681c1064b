//! `assay-delta-judge`: the delta-judge service on its own.

/// mimalloc: less time in allocation and contention than the system allocator under load.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    assay_runtime::main(run)
}

async fn run() -> std::process::ExitCode {
    let spec = assay_runtime::StageSpec {
        binary: "assay-delta-judge",
        service_name: assay_proto::service_names::DELTA_JUDGE,
        port: |p| p.delta_judge,
        uses_models: true,
    };
    assay_runtime::run_service(spec, &assay_runtime::default_loaders(), |hub, _config| {
        assay_delta_judge::routes(std::sync::Arc::new(assay_delta_judge::DeltaJudgeCore::new(hub)))
    })
    .await
}
