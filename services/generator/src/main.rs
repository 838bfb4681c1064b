//! `assay-generator`: the generator service on its own.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let spec = assay_runtime::StageSpec {
        binary: "assay-generator",
        service_name: assay_proto::service_names::GENERATOR,
        port: |p| p.generator,
        uses_models: false,
    };
    assay_runtime::run_service(spec, &[], |_hub, _config| assay_generator::routes()).await
}
