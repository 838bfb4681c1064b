//! `assay-delta-judge`: the delta-judge service on its own.

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let spec = assay_runtime::StageSpec {
        binary: "assay-delta-judge",
        service_name: assay_proto::service_names::DELTA_JUDGE,
        port: |p| p.delta_judge,
        uses_models: false,
    };
    assay_runtime::run_service(spec, &[], |_hub, _config| assay_delta_judge::routes()).await
}
