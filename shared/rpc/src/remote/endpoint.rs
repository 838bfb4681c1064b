//! The endpoint settings every channel to a stage has (one address, or each replica of one).

use std::time::Duration;

use assay_domain::StageError;
use tonic::transport::Endpoint;

/// The endpoint of a stage at `url`, with the settings every channel to a stage has.
pub(super) fn endpoint(url: &str) -> Result<Endpoint, StageError> {
    Ok(Endpoint::from_shared(url.to_string())
        .map_err(|e| StageError::Internal(format!("bad upstream url {url:?}: {e}")))?
        .tcp_nodelay(true)
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(30))
        .keep_alive_while_idle(true))
}
