//! `assay-refiners`: the refiners service on its own.

use std::sync::Arc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let spec = assay_runtime::StageSpec {
        binary: "assay-refiners",
        service_name: assay_proto::service_names::REFINERS,
        port: |p| p.refiners,
        uses_models: true,
    };
    assay_runtime::run_service(spec, &assay_runtime::default_loaders(), |hub, _config| {
        assay_refiners::routes(Arc::new(assay_refiners::ChecklistRefiners::new(hub)))
    })
    .await
}
