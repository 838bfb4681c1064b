//! `assay-arbiter`: the arbiter service on its own.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let spec = assay_runtime::StageSpec {
        binary: "assay-arbiter",
        service_name: assay_proto::service_names::ARBITER,
        port: |p| p.arbiter,
        uses_models: false,
    };
    assay_runtime::run_service(spec, &[], |_hub, _config| assay_arbiter::routes()).await
}
