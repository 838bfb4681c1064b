//! Where a verb's gateway is: one already running (`--gateway`) or a mesh started in this process
//! on ephemeral ports for the duration of the command.

use std::sync::Arc;

use assay_config::AssayConfig;
use assay_proto::gateway::v1 as gw;
use assay_rpc::auth::BearerInterceptor;
use tonic::codegen::InterceptedService;
use tonic::transport::Channel;

use super::error::CliError;

/// A gateway client that carries the configured bearer token.
pub type Client = gw::gateway_service_client::GatewayServiceClient<InterceptedService<Channel, BearerInterceptor>>;

/// Start the whole mesh in this process and wait until every service is SERVING.
pub async fn start(config: &AssayConfig) -> Result<assay_cli::Mesh, CliError> {
    let (hub, loading) = assay_runtime::build_hub(config, &assay_runtime::default_loaders())?;
    let mesh =
        assay_cli::start_mesh(config, Arc::new(hub), false).await.map_err(|e| CliError::Failed(e.to_string()))?;
    eprintln!("services listening (NOT_SERVING until model backends are ready)");
    let started = std::time::Instant::now();
    loading.await.map_err(|e| CliError::Failed(e.to_string()))?;
    mesh.set_serving().await;
    eprintln!("model backends ready in {:.1?}; every service SERVING", started.elapsed());
    for (name, addr) in mesh.addrs.all() {
        tracing::info!(service = name, %addr, "serving");
    }
    Ok(mesh)
}

/// A gateway client for `url` with the configured token (over TLS when `[tls]` is set).
pub fn client(config: &AssayConfig, url: &str) -> Result<Client, CliError> {
    let channel = assay_runtime::channel(config, url)?;
    let token = assay_runtime::auth_token(config);
    Ok(gw::gateway_service_client::GatewayServiceClient::with_interceptor(
        channel,
        BearerInterceptor::new(token.as_deref()),
    )
    .max_decoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES)
    .max_encoding_message_size(assay_domain::limits::MAX_MESSAGE_BYTES))
}

/// Where a command's gateway is: the one given, or a mesh of our own (stopped by [`Session::close`]).
pub struct Session {
    pub client: Client,
    mesh: Option<assay_cli::Mesh>,
}

impl Session {
    /// Connect to `gateway`, or start an in-process mesh on ephemeral ports when it is absent.
    pub async fn open(config: &AssayConfig, gateway: Option<&str>) -> Result<Self, CliError> {
        match gateway {
            Some(url) => Ok(Self { client: client(config, url)?, mesh: None }),
            None => {
                let mut config = config.clone();
                config.ports = assay_config::Ports::ephemeral();
                let mesh = start(&config).await?;
                let url = format!("http://{}", mesh.addrs.gateway);
                Ok(Self { client: client(&config, &url)?, mesh: Some(mesh) })
            }
        }
    }

    /// The gateway address of the in-process mesh, if this session started one.
    pub fn local_gateway(&self) -> Option<String> {
        self.mesh.as_ref().map(|m| format!("http://{}", m.addrs.gateway))
    }

    /// Stop the in-process mesh, if any.
    pub async fn close(self) -> Result<(), CliError> {
        match self.mesh {
            Some(mesh) => mesh.shutdown().await.map_err(|e| CliError::Failed(e.to_string())),
            None => Ok(()),
        }
    }
}

/// The gateway address of a running mesh from the configuration (`http://127.0.0.1:<gateway port>`
/// when bound to all interfaces).
pub fn configured_gateway(config: &AssayConfig) -> String {
    let host = match config.bind.as_str() {
        "0.0.0.0" | "::" | "[::]" | "" => "127.0.0.1",
        other => other,
    };
    format!("http://{host}:{}", config.ports.gateway)
}
