//! Stage traits implemented over gRPC: what a service holds for another stage in production.
//! One client per service, each implementing that service's stage trait from `assay-domain`.

mod arbiter;
mod debate;
mod delta_judge;
mod endpoint;
mod generator;
mod refiners;
mod replicas;
mod resend;
mod scorer;

use assay_domain::StageError;
use tonic::transport::Channel;

use crate::tls::{ClientTls, https_url};
use endpoint::endpoint;

pub use arbiter::RemoteArbiter;
pub use debate::RemoteDebate;
pub use delta_judge::RemoteDeltaJudge;
pub use generator::RemoteGenerator;
pub use refiners::RemoteRefiners;
pub use replicas::{PROBE_EVERY, RESOLVE_EVERY, Upstream};
pub use resend::{MAX_SENDS, ResendUnsent, never_sent};
pub use scorer::RemoteScorer;

/// A channel to a stage, connected lazily (the stage may start after the gateway): plaintext, or
/// TLS with the system's roots for an `https://` address.
pub fn channel(url: &str) -> Result<Channel, StageError> {
    channel_with(url, None)
}

/// A channel to a stage, connected lazily. With `tls` the stage is dialled over TLS (an `http://`
/// address as `https://`), trusting and presenting what `tls` holds; without it as [`channel`].
pub fn channel_with(url: &str, tls: Option<&ClientTls>) -> Result<Channel, StageError> {
    let system_roots = ClientTls::new();
    let (url, tls) = match tls {
        Some(t) => (https_url(url), Some(t)),
        None if url.starts_with("https://") => (url.to_string(), Some(&system_roots)),
        None => (url.to_string(), None),
    };
    let mut endpoint = endpoint(&url)?;
    if let Some(t) = tls {
        endpoint = endpoint
            .tls_config(t.config())
            .map_err(|e| StageError::Internal(format!("tls for upstream {url:?}: {e}")))?;
    }
    Ok(endpoint.connect_lazy())
}

/// The channel to a stage as `upstreams.<stage>` names it: one address ([`channel_with`]), or
/// replicas balanced per call ([`Upstream`]: a list of addresses, or `dns:///host:port`), each
/// kept in the balancer while it answers SERVING for `service`.
pub fn upstream_channel(spec: &str, tls: Option<&ClientTls>, service: &'static str) -> Result<Channel, StageError> {
    match Upstream::parse(spec).map_err(|e| StageError::invalid("upstream", e))? {
        Upstream::Single(url) => channel_with(&url, tls),
        Upstream::Replicas(targets) => replicas::balanced(targets, tls, service),
    }
}
