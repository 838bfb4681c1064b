//! A service on its own (`assay serve <stage>`, one Kubernetes Deployment): its row of the stage
//! table, served with the standard runtime, reaching the stages it calls at their configured
//! addresses.

use std::process::ExitCode;
use std::sync::Arc;

use assay_config::AssayConfig;
use assay_llm::ModelHub;
use tonic::service::Routes;

use crate::MeshError;
use crate::cores::Built;
use crate::remotes::Remotes;
use crate::table::Stage;

/// Serve `stage` until SIGTERM/SIGINT (configuration from `--config` / `ASSAY_CONFIG` and
/// `ASSAY__*`), with its own telemetry (service name `assay-<stage>`, info lines): the whole
/// process of `assay serve <stage>`, on the standard runtime (`assay_runtime::main`) and before
/// any other telemetry init.
pub async fn run(stage: Stage) -> ExitCode {
    let def = stage.def();
    let spec = assay_runtime::StageSpec {
        binary: def.binary,
        service_name: def.service_name,
        port: def.port,
        uses_models: def.uses_models,
    };
    let loaders = if def.uses_models { assay_runtime::default_loaders() } else { Vec::new() };
    assay_runtime::run_service(spec, &loaders, |hub, config| routes(stage, hub, config)).await
}

/// `stage`'s core as it is built on its own: its table row, with clients to the stages it calls
/// at their configured addresses.
pub fn build(stage: Stage, config: &AssayConfig, hub: Arc<ModelHub>) -> Result<Built, MeshError> {
    let def = stage.def();
    def.build(config, hub, &Remotes::configured(config, def.calls)?)
}

fn routes(stage: Stage, hub: Arc<ModelHub>, config: &AssayConfig) -> Result<Routes, MeshError> {
    match stage {
        Stage::Gateway => gateway_routes(config),
        Stage::Generator | Stage::Refiners | Stage::Scorer | Stage::Arbiter | Stage::DeltaJudge | Stage::Debate => {
            warn_if_open(stage, config);
            Ok(build(stage, config, hub)?.core.routes())
        }
    }
}

/// A stage reachable beyond this machine without a token serves anyone who reaches its port:
/// model calls outside any run, so outside every budget and daily spend cap (enforced at the
/// gateway and the stages it calls). Said once at start; in Kubernetes the NetworkPolicy lets only
/// the gateway reach the stages.
fn warn_if_open(stage: Stage, config: &AssayConfig) {
    let loopback =
        config.bind.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback()) || config.bind == "localhost";
    if !loopback && assay_runtime::auth_token(config).is_none() {
        tracing::warn!(
            stage = ?stage,
            bind = %config.bind,
            "stage bound beyond loopback without auth_token: a client reaching this port calls models outside every \
             run's budget and daily spend cap (set ASSAY_AUTH_TOKEN, or let only the gateway reach it)"
        );
    }
}

/// The gateway: its engine over the configured store and stages, the admin page when
/// `ports.admin` is set, and the runs a previous gateway left unfinished resumed.
fn gateway_routes(config: &AssayConfig) -> Result<Routes, MeshError> {
    let remotes = Remotes::configured(config, Stage::Gateway.def().calls)?;
    // Opened before serving (a shared store may need a moment to connect and migrate).
    let engine = tokio::task::block_in_place(|| {
        tokio::runtime::Handle::current().block_on(crate::gateway::engine(config, &remotes))
    })?;
    if let Some(port) = config.ports.admin {
        spawn_admin(config, port, engine.clone());
    }
    crate::gateway::resume_and_supervise(engine.clone(), config);
    Ok(assay_gateway::routes(engine))
}

/// Serve the admin page on `port` until SIGTERM/SIGINT, with the configured token, else a fresh
/// one printed once (unless `admin.no_auth`).
fn spawn_admin(config: &AssayConfig, port: u16, engine: assay_gateway::Engine) {
    let token = assay_runtime::auth_token(config);
    let auth = assay_gateway::admin::AdminAuth::resolve(token.as_deref(), config.admin.no_auth);
    let config = config.clone();
    tokio::spawn(async move {
        let l = match assay_runtime::bind(&config, port).await {
            Ok(l) => l,
            Err(e) => return tracing::error!(error = %e, port, "cannot bind the admin page"),
        };
        let addr = match l.local_addr() {
            Ok(a) => a,
            Err(e) => return tracing::error!(error = %e, "admin page: no local address"),
        };
        tracing::info!(%addr, "admin page listening");
        if let assay_gateway::admin::AdminAuth::Generated(_) = auth {
            // On stderr, not through the log pipeline: the one place the token shows.
            eprintln!("admin page: {}", auth.page_url(addr));
        }
        let router = assay_gateway::admin::router(engine, addr, &auth, &config.admin.allowed_hosts);
        if let Err(e) = assay_gateway::admin::serve(l, router, assay_rpc::shutdown_signal()).await {
            tracing::error!(error = %e, "admin page stopped");
        }
    });
}
