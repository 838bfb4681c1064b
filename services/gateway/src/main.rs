//! `assay-gateway`: the gateway on its own, reaching the stages at their configured addresses.

use std::sync::Arc;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let spec = assay_runtime::StageSpec {
        binary: "assay-gateway",
        service_name: assay_proto::service_names::GATEWAY,
        port: |p| p.gateway,
        uses_models: false,
    };
    assay_runtime::run_service(spec, &[], |_hub, config| {
        let upstream = assay_runtime::upstream_url(config, &config.upstreams.scorer, config.ports.scorer);
        let channel = assay_rpc::remote::channel(&upstream).expect("scorer upstream url is valid");
        let token = assay_runtime::serve_options(config).auth_token;
        let scorer = Arc::new(assay_rpc::remote::RemoteScorer::new(channel, token.as_deref()));
        let store = assay_gateway::RunStore::open(&assay_gateway::store_path(config)).expect("run store opens");
        let generator_url = assay_runtime::upstream_url(config, &config.upstreams.generator, config.ports.generator);
        let generator_channel = assay_rpc::remote::channel(&generator_url).expect("generator upstream url is valid");
        let generator = Arc::new(assay_generator::RemoteGenerator::new(generator_channel, token.as_deref()));
        let refiners_url = assay_runtime::upstream_url(config, &config.upstreams.refiners, config.ports.refiners);
        let refiners_channel = assay_rpc::remote::channel(&refiners_url).expect("refiners upstream url is valid");
        let runs = assay_gateway::Runs::new(store, scorer.clone(), config.gateway.concurrency as usize)
            .with_generator(generator.clone())
            .with_corpus(generator)
            .with_refiner(Arc::new(assay_gateway::stages::RemoteRefiners::new(refiners_channel, token.as_deref())));
        let resume = runs.clone();
        tokio::spawn(async move {
            match resume.resume_unfinished().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(runs = n, "resumed unfinished runs"),
                Err(e) => tracing::error!(error = %e, "could not resume unfinished runs"),
            }
        });
        assay_gateway::routes(Arc::new(assay_gateway::GatewayCore::new(scorer)), runs)
    })
    .await
}
