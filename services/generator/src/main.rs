//! `assay-generator`: the generator service on its own, refining corpus checklists through the
//! refiners service at its configured address.

use std::sync::Arc;

/// mimalloc: less time in allocation and contention than the system allocator under load.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    assay_runtime::main(run)
}

async fn run() -> std::process::ExitCode {
    let spec = assay_runtime::StageSpec {
        binary: "assay-generator",
        service_name: assay_proto::service_names::GENERATOR,
        port: |p| p.generator,
        uses_models: true,
    };
    assay_runtime::run_service(spec, &assay_runtime::default_loaders(), |hub, config| {
        let url = assay_runtime::upstream_url(config, &config.upstreams.refiners, config.ports.refiners);
        let channel = assay_runtime::channel(config, &url).expect("refiners upstream url and tls are valid");
        let token = assay_runtime::auth_token(config);
        let refiners = Arc::new(assay_rpc::remote::RemoteRefiners::new(channel, token.as_deref()));
        assay_generator::routes(Arc::new(assay_generator::Generator::new(hub).with_refiners(refiners)))
    })
    .await
}
