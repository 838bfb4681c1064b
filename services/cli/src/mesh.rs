//! Start and stop the whole mesh in-process.

use std::net::SocketAddr;
use std::sync::Arc;

use assay_config::AssayConfig;
use assay_domain::ModelHub;
use assay_proto::service_names as names;
use assay_rpc::Readiness;
use assay_rpc::remote::{RemoteArbiter, RemoteDebate, RemoteDeltaJudge, RemoteGenerator, RemoteRefiners, RemoteScorer};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tonic::service::Routes;

/// Where each service listens.
#[derive(Debug, Clone, Copy)]
pub struct MeshAddrs {
    pub gateway: SocketAddr,
    pub generator: SocketAddr,
    pub refiners: SocketAddr,
    pub scorer: SocketAddr,
    pub arbiter: SocketAddr,
    pub delta_judge: SocketAddr,
    pub debate: SocketAddr,
    /// The admin page (HTTP), when `ports.admin` is set.
    pub admin: Option<SocketAddr>,
}

impl MeshAddrs {
    /// (service name, address) of every service.
    pub fn all(&self) -> [(&'static str, SocketAddr); 7] {
        [
            (names::GATEWAY, self.gateway),
            (names::GENERATOR, self.generator),
            (names::REFINERS, self.refiners),
            (names::SCORER, self.scorer),
            (names::ARBITER, self.arbiter),
            (names::DELTA_JUDGE, self.delta_judge),
            (names::DEBATE, self.debate),
        ]
    }
}

/// A running mesh.
pub struct Mesh {
    pub addrs: MeshAddrs,
    readiness: Vec<Readiness>,
    shutdown: tokio::sync::watch::Sender<bool>,
    tasks: Vec<JoinHandle<Result<(), tonic::transport::Error>>>,
    admin: Option<JoinHandle<std::io::Result<()>>>,
    admin_auth: assay_gateway::admin::AdminAuth,
    engine: assay_gateway::Engine,
    lease: std::time::Duration,
}

impl Mesh {
    /// Report SERVING on every service (call once models are ready), then resume runs a previous
    /// gateway left unfinished.
    pub async fn set_serving(&self) {
        for r in &self.readiness {
            r.set_serving().await;
        }
        // Registers every unfinished run before returning (their work continues in the background),
        // so a client reattaching right away follows them live.
        match self.engine.resume_unfinished().await {
            Ok(0) => {}
            Ok(n) => tracing::info!(runs = n, "resumed unfinished runs"),
            Err(e) => tracing::error!(error = %e, "could not resume unfinished runs"),
        }
        let (engine, lease) = (self.engine.clone(), self.lease);
        tokio::spawn(async move { engine.supervise(lease).await });
    }

    /// How the admin page authenticates (a generated token when none is configured).
    pub fn admin_auth(&self) -> &assay_gateway::admin::AdminAuth {
        &self.admin_auth
    }

    /// The admin page's URL, with the token in the fragment when it was generated for this start
    /// (`http://127.0.0.1:50050/#token=...`); `None` when the page is off.
    pub fn admin_url(&self) -> Option<String> {
        self.addrs.admin.map(|a| self.admin_auth.page_url(a))
    }

    /// The gateway's run engine.
    pub fn engine(&self) -> &assay_gateway::Engine {
        &self.engine
    }

    /// Graceful stop: NOT_SERVING, drain in-flight calls, wait for every server.
    pub async fn shutdown(self) -> Result<(), String> {
        self.engine.halt();
        let _ = self.shutdown.send(true);
        let mut err = None;
        if let Some(t) = self.admin {
            match t.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => err = Some(format!("admin page failed: {e}")),
                Err(e) => err = Some(format!("admin page task failed: {e}")),
            }
        }
        for t in self.tasks {
            match t.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => err = Some(format!("server failed: {e}")),
                Err(e) => err = Some(format!("server task failed: {e}")),
            }
        }
        err.map_or(Ok(()), Err)
    }
}

async fn listener(config: &AssayConfig, port: u16) -> Result<TcpListener, String> {
    assay_runtime::bind(config, port).await.map_err(|e| format!("cannot bind {}:{port}: {e}", config.bind))
}

/// Bind every service at its configured port (0 = any free port) and serve. Services start
/// NOT_SERVING; with `ready = true` they report SERVING at once.
pub async fn start_mesh(config: &AssayConfig, hub: Arc<ModelHub>, ready: bool) -> Result<Mesh, String> {
    let p = config.ports;
    let gateway_l = listener(config, p.gateway).await?;
    let generator_l = listener(config, p.generator).await?;
    let refiners_l = listener(config, p.refiners).await?;
    let scorer_l = listener(config, p.scorer).await?;
    let arbiter_l = listener(config, p.arbiter).await?;
    let delta_l = listener(config, p.delta_judge).await?;
    let debate_l = listener(config, p.debate).await?;
    let admin_l = match p.admin {
        Some(port) => Some(listener(config, port).await?),
        None => None,
    };
    let addr = |l: &TcpListener| l.local_addr().map_err(|e| e.to_string());
    let addrs = MeshAddrs {
        gateway: addr(&gateway_l)?,
        generator: addr(&generator_l)?,
        refiners: addr(&refiners_l)?,
        scorer: addr(&scorer_l)?,
        arbiter: addr(&arbiter_l)?,
        delta_judge: addr(&delta_l)?,
        debate: addr(&debate_l)?,
        admin: admin_l.as_ref().map(addr).transpose()?,
    };
    let options = assay_runtime::serve_options(config)?;
    let token = options.auth_token.clone();

    // Every stage reaches the others over real gRPC on loopback, as in Kubernetes (over TLS, and
    // presenting a client certificate when asked, when [tls] is set).
    let tls = assay_runtime::client_tls(config)?;
    let channel = |addr: SocketAddr| {
        assay_rpc::remote::channel_with(&format!("http://{addr}"), tls.as_ref()).map_err(|e| e.to_string())
    };
    let token = token.as_deref();
    let scorer_remote = Arc::new(RemoteScorer::new(channel(addrs.scorer)?, token));
    let refiners_remote = Arc::new(RemoteRefiners::new(channel(addrs.refiners)?, token));
    let generator_remote = Arc::new(RemoteGenerator::new(channel(addrs.generator)?, token));
    let scorer_core = Arc::new(assay_scorer::ScorerCore::new(hub.clone(), config.scorer.concurrency as usize));
    let store = assay_gateway::open_store(config).await.map_err(|e| e.to_string())?;
    let stages = assay_gateway::Stages::new(scorer_remote.clone(), config.gateway.concurrency as usize)
        .with_generator(generator_remote)
        .with_refiners(refiners_remote.clone())
        .with_refinement(assay_gateway::RefinementStages {
            judge: scorer_remote.clone(),
            arbiter: Arc::new(RemoteArbiter::new(channel(addrs.arbiter)?, token)),
            editor: refiners_remote.clone(),
            delta: Arc::new(RemoteDeltaJudge::new(channel(addrs.delta_judge)?, token)),
        })
        .with_self_refiner(refiners_remote.clone())
        .with_debate(Arc::new(RemoteDebate::new(channel(addrs.debate)?, token)));
    let engine = assay_gateway::Engine::new(store, Arc::new(assay_gateway::Pipelines::new(stages)))
        .with_max_active_runs(config.gateway.max_active_runs as usize);
    let services: Vec<(TcpListener, &'static str, Routes)> = vec![
        (gateway_l, names::GATEWAY, assay_gateway::routes(engine.clone())),
        (
            generator_l,
            names::GENERATOR,
            assay_generator::routes(Arc::new(
                assay_generator::Generator::new(hub.clone()).with_refiners(refiners_remote),
            )),
        ),
        (
            refiners_l,
            names::REFINERS,
            assay_refiners::routes(Arc::new(
                assay_refiners::ChecklistRefiners::new(hub.clone())
                    .with_concurrency(config.scorer.concurrency as usize)
                    .with_scorer(scorer_remote),
            )),
        ),
        (scorer_l, names::SCORER, assay_scorer::routes(scorer_core)),
        (arbiter_l, names::ARBITER, assay_arbiter::routes(Arc::new(assay_arbiter::ArbiterCore::new(hub.clone())))),
        (
            delta_l,
            names::DELTA_JUDGE,
            assay_delta_judge::routes(Arc::new(assay_delta_judge::DeltaJudgeCore::new(hub.clone()))),
        ),
        (debate_l, names::DEBATE, assay_debate::routes(Arc::new(assay_debate::DebateCore::new(hub.clone())))),
    ];
    let (tx, rx) = tokio::sync::watch::channel(false);
    let admin_auth = assay_gateway::admin::AdminAuth::resolve(options.auth_token.as_deref(), config.admin.no_auth);
    let admin = admin_l.zip(addrs.admin).map(|(l, addr)| {
        let router = assay_gateway::admin::router(engine.clone(), addr, &admin_auth, &config.admin.allowed_hosts);
        let mut rx = rx.clone();
        tokio::spawn(assay_gateway::admin::serve(l, router, async move {
            let _ = rx.wait_for(|s| *s).await;
        }))
    });
    let mut readiness = Vec::new();
    let mut tasks = Vec::new();
    for (l, name, routes) in services {
        let r = Readiness::new(&[name]).await;
        readiness.push(r.clone());
        let mut rx = rx.clone();
        let shutdown = async move {
            let _ = rx.wait_for(|s| *s).await;
        };
        tasks.push(tokio::spawn(assay_rpc::serve(l, routes, r, options.clone(), shutdown)));
    }
    let mesh =
        Mesh { addrs, readiness, shutdown: tx, tasks, admin, admin_auth, engine, lease: assay_gateway::lease(config) };
    if ready {
        mesh.set_serving().await;
    }
    Ok(mesh)
}
