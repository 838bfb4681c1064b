//! `assay-refiners`: the refiners service on its own.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let spec = assay_runtime::StageSpec {
        binary: "assay-refiners",
        service_name: assay_proto::service_names::REFINERS,
        port: |p| p.refiners,
        uses_models: false,
    };
    assay_runtime::run_service(spec, &[], |_hub, _config| assay_refiners::routes()).await
}
