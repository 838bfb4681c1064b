//! Serving: health, reflection v1 + v1alpha, auth, tracing, graceful shutdown with draining.

use std::any::Any;
use std::future::Future;
use std::sync::OnceLock;
use std::time::Duration;

use tokio::net::TcpListener;
use tonic::service::Routes;
use tonic::transport::server::TcpIncoming;
use tonic_health::ServingStatus;
use tonic_health::server::HealthReporter;

use crate::auth::AuthLayer;
use crate::tls::ServerTls;

/// Health state of one service binary (every service name it hosts plus "").
#[derive(Clone)]
pub struct Readiness {
    reporter: HealthReporter,
    names: Vec<&'static str>,
    service: tonic_health::pb::health_server::HealthServer<tonic_health::server::HealthService>,
}

impl Readiness {
    /// Starts NOT_SERVING for each name and for "".
    pub async fn new(names: &[&'static str]) -> Readiness {
        let reporter = HealthReporter::new();
        let service = tonic_health::pb::health_server::HealthServer::new(
            tonic_health::server::HealthService::from_health_reporter(reporter.clone()),
        );
        let r = Readiness { reporter, names: names.to_vec(), service };
        r.set(ServingStatus::NotServing).await;
        r
    }

    async fn set(&self, status: ServingStatus) {
        self.reporter.set_service_status("", status).await;
        for n in &self.names {
            self.reporter.set_service_status(*n, status).await;
        }
    }

    /// Report SERVING for every hosted service.
    pub async fn set_serving(&self) {
        self.set(ServingStatus::Serving).await;
        tracing::info!(services = ?self.names, "serving");
    }

    /// Report NOT_SERVING (on shutdown or lost readiness).
    pub async fn set_not_serving(&self) {
        self.set(ServingStatus::NotServing).await;
    }
}

/// Serving options.
#[derive(Clone)]
pub struct ServeOptions {
    pub auth_token: Option<String>,
    /// How long in-flight calls may run after shutdown starts.
    pub drain: Duration,
    /// Serve TLS only (and ask for client certificates, per [`ServerTls`]); `None` = plaintext.
    pub tls: Option<ServerTls>,
    /// Close each connection gracefully once it is this old (GOAWAY: calls in flight finish, the
    /// client's next calls open a new connection, which may land on another pod); `None` = never.
    pub max_connection_age: Option<Duration>,
}

impl Default for ServeOptions {
    fn default() -> Self {
        Self { auth_token: None, drain: Duration::from_secs(30), tls: None, max_connection_age: None }
    }
}

impl std::fmt::Debug for ServeOptions {
    // By hand: the token must never reach a log line.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ServeOptions { auth_token, drain, tls, max_connection_age } = self;
        f.debug_struct("ServeOptions")
            .field("auth_token", &auth_token.as_ref().map(|_| "<redacted>"))
            .field("drain", drain)
            .field("tls", tls)
            .field("max_connection_age", max_connection_age)
            .finish()
    }
}

/// Serve `routes` plus health and reflection on `listener` until `shutdown` resolves; then report
/// NOT_SERVING, stop accepting, and wait for in-flight calls (at most `options.drain`). With
/// `options.tls` every connection must complete a TLS handshake first (a plaintext client, or one
/// without a required client certificate, is dropped during it).
pub async fn serve(
    listener: TcpListener,
    routes: Routes,
    readiness: Readiness,
    options: ServeOptions,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<(), tonic::transport::Error> {
    // Built once per process: decoding the descriptor sets takes milliseconds of CPU, and a mesh in
    // one process (`assay up`, `assay eval`) starts seven servers at once.
    static REFLECTION_V1: OnceLock<Box<dyn Any + Send + Sync>> = OnceLock::new();
    static REFLECTION_V1ALPHA: OnceLock<Box<dyn Any + Send + Sync>> = OnceLock::new();
    let reflection_v1 = built_once(&REFLECTION_V1, || reflection().build_v1().expect("descriptor sets are valid"));
    let reflection_v1alpha =
        built_once(&REFLECTION_V1ALPHA, || reflection().build_v1alpha().expect("descriptor sets are valid"));
    let routes =
        routes.add_service(readiness.service.clone()).add_service(reflection_v1).add_service(reflection_v1alpha);
    let addr = listener.local_addr().ok();
    let incoming = TcpIncoming::from(listener).with_nodelay(Some(true));
    let (drain_tx, drain_rx) = tokio::sync::oneshot::channel::<()>();
    let ready = readiness.clone();
    let signal = async move {
        shutdown.await;
        tracing::info!(addr = ?addr, "shutdown requested, draining in-flight calls");
        ready.set_not_serving().await;
        let _ = drain_tx.send(());
    };
    let mut builder = tonic::transport::Server::builder();
    if let Some(tls) = &options.tls {
        builder = builder.tls_config(tls.config())?;
    }
    if let Some(age) = options.max_connection_age {
        // Graceful: no grace limit, so a long stream (WatchRun) is never cut by its connection's age.
        builder = builder.max_connection_age(age);
    }
    let mutual_tls = options.tls.as_ref().is_some_and(ServerTls::requires_client_cert);
    tracing::debug!(addr = ?addr, tls = options.tls.is_some(), mutual_tls, "starting server");
    let server = builder
        .layer(crate::metrics::MetricsLayer::new())
        .layer(AuthLayer::new(options.auth_token.clone()))
        .layer(crate::decode_error::DecodeErrorLayer)
        .trace_fn(|req: &http::Request<()>| {
            let path = req.uri().path();
            let (service, method) = path.trim_start_matches('/').split_once('/').unwrap_or((path, ""));
            let span = tracing::info_span!(
                "rpc",
                otel.name = %path.trim_start_matches('/'),
                otel.kind = "server",
                "rpc.system" = "grpc",
                "rpc.service" = %service,
                "rpc.method" = %method,
                path = %path,
            );
            assay_telemetry::set_parent_from_headers(&span, req.headers());
            span
        })
        .add_routes(routes)
        .serve_with_incoming_shutdown(incoming, signal);
    let drain = options.drain;
    tokio::select! {
        r = server => r,
        () = async move {
            if drain_rx.await.is_ok() {
                tokio::time::sleep(drain).await;
            } else {
                std::future::pending::<()>().await;
            }
        } => {
            tracing::warn!(drain_seconds = drain.as_secs(), "drain period over, closing remaining calls");
            Ok(())
        }
    }
}

fn reflection() -> tonic_reflection::server::Builder<'static> {
    tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(assay_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
}

/// The value in `cell`, built by `build` on first use (`T` may be an unnameable `impl` type).
fn built_once<T: Clone + Send + Sync + 'static>(
    cell: &'static OnceLock<Box<dyn Any + Send + Sync>>,
    build: impl FnOnce() -> T,
) -> T {
    cell.get_or_init(|| Box::new(build())).downcast_ref::<T>().expect("a cell holds values of one type").clone()
}

/// Resolves on SIGTERM or SIGINT.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = term => {},
    }
}
