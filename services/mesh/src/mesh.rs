//! The whole mesh in one process (`assay up`, the whole-mesh tests): every service on its own
//! listener, built from the stage table, calling the others over real gRPC on loopback (the same
//! code paths as separate Deployments).

use std::net::SocketAddr;
use std::sync::Arc;

use assay_config::AssayConfig;
use assay_llm::ModelHub;
use assay_proto::service_names as names;
use assay_rpc::Readiness;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tonic::service::Routes;

use crate::MeshError;
use crate::remotes::Remotes;
use crate::table::{STAGES, Stage};

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

    /// Where `stage` listens.
    pub fn of(&self, stage: Stage) -> SocketAddr {
        match stage {
            Stage::Gateway => self.gateway,
            Stage::Generator => self.generator,
            Stage::Refiners => self.refiners,
            Stage::Scorer => self.scorer,
            Stage::Arbiter => self.arbiter,
            Stage::DeltaJudge => self.delta_judge,
            Stage::Debate => self.debate,
        }
    }

    /// Every address from `addr` of each stage.
    fn from_fn(addr: impl Fn(Stage) -> SocketAddr, admin: Option<SocketAddr>) -> MeshAddrs {
        MeshAddrs {
            gateway: addr(Stage::Gateway),
            generator: addr(Stage::Generator),
            refiners: addr(Stage::Refiners),
            scorer: addr(Stage::Scorer),
            arbiter: addr(Stage::Arbiter),
            delta_judge: addr(Stage::DeltaJudge),
            debate: addr(Stage::Debate),
            admin,
        }
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
    /// `gateway.retention_days`, as a period (None = keep every run).
    retention: Option<std::time::Duration>,
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
        crate::gateway::resume_unfinished(&self.engine).await;
        let (engine, lease, days) = (self.engine.clone(), self.lease, self.retention);
        tokio::spawn(async move { tokio::join!(engine.supervise(lease), engine.retain(days)) });
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
    pub async fn shutdown(self) -> Result<(), MeshError> {
        self.engine.halt();
        let _ = self.shutdown.send(true);
        let mut err = None;
        if let Some(t) = self.admin {
            match t.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => err = Some(MeshError::Admin(e)),
                Err(e) => err = Some(MeshError::Task { what: "admin page", source: e }),
            }
        }
        for t in self.tasks {
            match t.await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => err = Some(MeshError::Server(e)),
                Err(e) => err = Some(MeshError::Task { what: "server", source: e }),
            }
        }
        err.map_or(Ok(()), Err)
    }
}

async fn listener(config: &AssayConfig, port: u16) -> Result<TcpListener, MeshError> {
    assay_runtime::bind(config, port)
        .await
        .map_err(|source| MeshError::Bind { addr: format!("{}:{port}", config.bind), source })
}

/// Clients to every stage the mesh's services call, at its listeners: the stages any row calls.
pub fn loopback_remotes(config: &AssayConfig, addrs: &MeshAddrs) -> Result<Remotes, MeshError> {
    let called: Vec<Stage> = STAGES.iter().filter(|d| d.connect.is_some()).map(|d| d.stage).collect();
    Remotes::loopback(config, |stage| addrs.of(stage), &called)
}

/// Bind every service at its configured port (0 = any free port) and serve. Services start
/// NOT_SERVING; with `ready = true` they report SERVING at once.
pub async fn start_mesh(config: &AssayConfig, hub: Arc<ModelHub>, ready: bool) -> Result<Mesh, MeshError> {
    let mut listeners = Vec::with_capacity(STAGES.len());
    for def in &STAGES {
        listeners.push(listener(config, (def.port)(&config.ports)).await?);
    }
    let admin_l = match config.ports.admin {
        Some(port) => Some(listener(config, port).await?),
        None => None,
    };
    let addr = |l: &TcpListener| l.local_addr().map_err(MeshError::LocalAddr);
    let mut bound = Vec::with_capacity(listeners.len());
    for l in &listeners {
        bound.push(addr(l)?);
    }
    let at = |stage: Stage| STAGES.iter().position(|d| d.stage == stage).map_or(bound[0], |i| bound[i]);
    let addrs = MeshAddrs::from_fn(at, admin_l.as_ref().map(addr).transpose()?);
    let options = assay_runtime::serve_options(config)?;

    // Every stage reaches the others over real gRPC on loopback, as in Kubernetes (over TLS, and
    // presenting a client certificate when asked, when [tls] is set).
    let remotes = loopback_remotes(config, &addrs)?;
    let engine = crate::gateway::engine(config, &remotes).await?;
    let mut services: Vec<(TcpListener, &'static str, Routes)> = Vec::with_capacity(STAGES.len());
    for (def, l) in STAGES.iter().zip(listeners) {
        let routes = match def.stage {
            Stage::Gateway => assay_gateway::routes(engine.clone()),
            Stage::Generator | Stage::Refiners | Stage::Scorer | Stage::Arbiter | Stage::DeltaJudge | Stage::Debate => {
                def.build(config, hub.clone(), &remotes)?.core.routes()
            }
        };
        services.push((l, def.service_name, routes));
    }
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
    let mesh = Mesh {
        addrs,
        readiness,
        shutdown: tx,
        tasks,
        admin,
        admin_auth,
        engine,
        lease: assay_gateway::lease(config),
        retention: config.gateway.retention(),
    };
    if ready {
        mesh.set_serving().await;
    }
    Ok(mesh)
}
