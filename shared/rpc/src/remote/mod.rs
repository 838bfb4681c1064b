//! Stage traits implemented over gRPC: what a service holds for another stage in production.
//! One client per service, each implementing that service's stage trait from `assay-domain`.

mod arbiter;
mod debate;
mod delta_judge;
mod generator;
mod refiners;
mod scorer;

use std::time::Duration;

use assay_domain::StageError;
use tonic::transport::{Channel, Endpoint};

pub use arbiter::RemoteArbiter;
pub use debate::RemoteDebate;
pub use delta_judge::RemoteDeltaJudge;
pub use generator::RemoteGenerator;
pub use refiners::RemoteRefiners;
pub use scorer::RemoteScorer;

/// A channel to a stage, connected lazily (the stage may start after the gateway).
pub fn channel(url: &str) -> Result<Channel, StageError> {
    let endpoint = Endpoint::from_shared(url.to_string())
        .map_err(|e| StageError::Internal(format!("bad upstream url {url:?}: {e}")))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_while_idle(true);
    Ok(endpoint.connect_lazy())
}
