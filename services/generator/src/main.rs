//! `assay-generator`: the generator service on its own.

use std::sync::Arc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let spec = assay_runtime::StageSpec {
        binary: "assay-generator",
        service_name: assay_proto::service_names::GENERATOR,
        port: |p| p.generator,
        uses_models: true,
    };
    assay_runtime::run_service(spec, &assay_runtime::default_loaders(), |hub, _config| {
        assay_generator::routes(Arc::new(assay_generator::Generator::new(hub)))
    })
    .await
}
