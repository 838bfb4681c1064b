//! Why the mesh (or one of its services) could not be wired or stopped.

use assay_domain::StageError;
use assay_runtime::RuntimeError;

/// Errors of wiring the stage table into services, and of stopping them.
#[derive(Debug, thiserror::Error)]
pub enum MeshError {
    /// A client the table's `calls` should have connected (a wiring bug, reported rather than
    /// panicking).
    #[error("no client to {0} was connected (missing from the stage table's calls)")]
    NotConnected(&'static str),
    /// The gateway's row has no core of its own: its run engine is built instead.
    #[error("{0} has no core of its own: it is built by its run engine")]
    NoCore(&'static str),
    /// A row names a stage no remote client reaches (the gateway).
    #[error("no stage calls {0}")]
    NotCalled(&'static str),
    /// An upstream address a channel cannot be made to.
    #[error("upstreams.{key}: invalid address {url:?}: {source}")]
    InvalidAddress { key: &'static str, url: String, source: StageError },
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error("cannot open the run store: {0}")]
    Store(#[source] StageError),
    /// The daily spend caps (`backends.<name>.daily_spend_usd`) cannot be kept.
    #[error(transparent)]
    SpendCaps(assay_config::ConfigError),
    #[error("cannot bind {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("no local address: {0}")]
    LocalAddr(#[source] std::io::Error),
    #[error("admin page failed: {0}")]
    Admin(#[source] std::io::Error),
    #[error("server failed: {0}")]
    Server(#[source] tonic::transport::Error),
    #[error("{what} task failed: {source}")]
    Task { what: &'static str, source: tokio::task::JoinError },
}
