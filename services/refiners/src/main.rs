//! `assay-refiners`: the refiners service on its own, scoring the UnitTester's rewrites through
//! the scorer service at its configured address.

use std::sync::Arc;

/// mimalloc: less time in allocation and contention than the system allocator under load.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    assay_runtime::main(run)
}

async fn run() -> std::process::ExitCode {
    let spec = assay_runtime::StageSpec {
        binary: "assay-refiners",
        service_name: assay_proto::service_names::REFINERS,
        port: |p| p.refiners,
        uses_models: true,
    };
    assay_runtime::run_service(spec, &assay_runtime::default_loaders(), |hub, config| {
        let url = assay_runtime::upstream_url(config, &config.upstreams.scorer, config.ports.scorer);
        let channel = assay_runtime::channel(config, &url).expect("scorer upstream url and tls are valid");
        let token = assay_runtime::auth_token(config);
        let scorer = Arc::new(assay_rpc::remote::RemoteScorer::new(channel, token.as_deref()));
        assay_refiners::routes(Arc::new(assay_refiners::ChecklistRefiners::new(hub).with_scorer(scorer)))
    })
    .await
}
