//! `assay-gateway`: the gateway on its own, reaching the stages at their configured addresses.

use std::sync::Arc;

use assay_rpc::remote::{
    RemoteArbiter, RemoteDebate, RemoteDeltaJudge, RemoteGenerator, RemoteRefiners, RemoteScorer, channel_with,
};

/// mimalloc: less time in allocation and contention than the system allocator under load.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> std::process::ExitCode {
    assay_runtime::main(run)
}

async fn run() -> std::process::ExitCode {
    let spec = assay_runtime::StageSpec {
        binary: "assay-gateway",
        service_name: assay_proto::service_names::GATEWAY,
        port: |p| p.gateway,
        uses_models: false,
    };
    assay_runtime::run_service(spec, &[], |_hub, config| {
        let token = assay_runtime::auth_token(config);
        let token = token.as_deref();
        // Over TLS when [tls] is set (checked when the configuration was loaded).
        let tls = assay_runtime::client_tls(config).unwrap_or_else(|e| panic!("{e}"));
        let upstream = |configured: &str, port: u16, what: &str| {
            channel_with(&assay_runtime::upstream_url(config, configured, port), tls.as_ref())
                .unwrap_or_else(|e| panic!("{what} upstream url is invalid: {e}"))
        };
        let u = &config.upstreams;
        let scorer = Arc::new(RemoteScorer::new(upstream(&u.scorer, config.ports.scorer, "scorer"), token));
        let refiners = Arc::new(RemoteRefiners::new(upstream(&u.refiners, config.ports.refiners, "refiners"), token));
        let stages = assay_gateway::Stages::new(scorer.clone(), config.gateway.concurrency as usize)
            .with_generator(Arc::new(RemoteGenerator::new(
                upstream(&u.generator, config.ports.generator, "generator"),
                token,
            )))
            .with_refiners(refiners.clone())
            .with_self_refiner(refiners.clone())
            .with_debate(Arc::new(RemoteDebate::new(upstream(&u.debate, config.ports.debate, "debate"), token)))
            .with_refinement(assay_gateway::RefinementStages {
                judge: scorer,
                arbiter: Arc::new(RemoteArbiter::new(upstream(&u.arbiter, config.ports.arbiter, "arbiter"), token)),
                editor: refiners,
                delta: Arc::new(RemoteDeltaJudge::new(
                    upstream(&u.delta_judge, config.ports.delta_judge, "delta judge"),
                    token,
                )),
            });
        // Opened before serving (a shared store may need a moment to connect and migrate).
        let store = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(assay_gateway::open_store(config))
        })
        .unwrap_or_else(|e| {
            tracing::error!(error = %e, "cannot open the run store");
            std::process::exit(1)
        });
        let engine = assay_gateway::Engine::new(store, Arc::new(assay_gateway::Pipelines::new(stages)))
            .with_max_active_runs(config.gateway.max_active_runs as usize);
        if let Some(port) = config.ports.admin {
            // The configured token; else a fresh one, printed once below (unless admin.no_auth).
            let auth = assay_gateway::admin::AdminAuth::resolve(token, config.admin.no_auth);
            let (bind, admin_engine) = (config.clone(), engine.clone());
            tokio::spawn(async move {
                match assay_runtime::bind(&bind, port).await {
                    Ok(l) => {
                        let addr = match l.local_addr() {
                            Ok(a) => a,
                            Err(e) => return tracing::error!(error = %e, "admin page: no local address"),
                        };
                        tracing::info!(%addr, "admin page listening");
                        if let assay_gateway::admin::AdminAuth::Generated(_) = auth {
                            // On stderr, not through the log pipeline: the one place the token shows.
                            eprintln!("admin page: {}", auth.page_url(addr));
                        }
                        let router = assay_gateway::admin::router(admin_engine, addr, &auth, &bind.admin.allowed_hosts);
                        if let Err(e) = assay_gateway::admin::serve(l, router, assay_rpc::shutdown_signal()).await {
                            tracing::error!(error = %e, "admin page stopped");
                        }
                    }
                    Err(e) => tracing::error!(error = %e, port, "cannot bind the admin page"),
                }
            });
        }
        let resume = engine.clone();
        let lease = assay_gateway::lease(config);
        tokio::spawn(async move {
            match resume.resume_unfinished().await {
                Ok(0) => {}
                Ok(n) => tracing::info!(runs = n, "resumed unfinished runs"),
                Err(e) => tracing::error!(error = %e, "could not resume unfinished runs"),
            }
            resume.supervise(lease).await;
        });
        assay_gateway::routes(engine)
    })
    .await
}
