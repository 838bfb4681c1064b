//! Time stamps and state names the engine's parts share.

use std::time::{SystemTime, UNIX_EPOCH};

use assay_proto::gateway::v1 as gw;

/// Now, as a protobuf time stamp.
pub(crate) fn now() -> prost_types::Timestamp {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    prost_types::Timestamp { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}

/// The name of a stored state (`RUN_STATE_PAUSED`).
pub(crate) fn state_name(state: i32) -> &'static str {
    gw::RunState::try_from(state).map(|s| s.as_str_name()).unwrap_or("RUN_STATE_UNKNOWN")
}

/// Whether a stored state is one a run ends in.
pub(crate) fn is_terminal(state: i32) -> bool {
    [gw::RunState::Succeeded, gw::RunState::Partial, gw::RunState::Failed, gw::RunState::Cancelled]
        .iter()
        .any(|s| *s as i32 == state)
}
