//! Run metrics, observed at each export of the global meter ([`assay_telemetry::meter`]):
//!
//! - `assay.runs` ({run}) by `assay.run.state`: the runs in the run store, every state reported
//!   (0 included). On a shared store every gateway reports the same totals: aggregate with max,
//!   not sum.
//! - `assay.runs.executing` ({run}): the runs this gateway executes now.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use assay_proto::gateway::v1 as gw;
use opentelemetry::KeyValue;

use crate::store::{RunStorage, RunStore};

/// How long one export waits for the store's counts before it reports none.
const COUNT_TIMEOUT: Duration = Duration::from_secs(2);

/// Register the gauges of `store` and of this gateway's executing runs (`active`), while they live.
/// Needs a Tokio runtime (the counts are store queries); without one, registers nothing.
pub(super) fn observe(store: &RunStore, active: &Arc<AtomicUsize>) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else {
        return;
    };
    let meter = assay_telemetry::meter();
    let weak: Weak<dyn RunStorage> = store.downgrade();
    let _runs = meter
        .i64_observable_gauge("assay.runs")
        .with_unit("{run}")
        .with_description("Runs in the run store by state")
        .with_callback(move |o| {
            let Some(counts) = counts(&handle, &weak) else {
                return;
            };
            for state in ALL_STATES {
                let n = counts.iter().find(|(s, _)| *s == state as i32).map_or(0, |(_, n)| *n);
                o.observe(n, &[KeyValue::new("assay.run.state", state_name(state))]);
            }
        })
        .build();
    let active = Arc::downgrade(active);
    let _executing = meter
        .i64_observable_gauge("assay.runs.executing")
        .with_unit("{run}")
        .with_description("Runs this gateway executes now")
        .with_callback(move |o| {
            if let Some(a) = active.upgrade() {
                o.observe(i64::try_from(a.load(Ordering::Relaxed)).unwrap_or(i64::MAX), &[]);
            }
        })
        .build();
}

const ALL_STATES: [gw::RunState; 8] = [
    gw::RunState::Pending,
    gw::RunState::Running,
    gw::RunState::Paused,
    gw::RunState::AwaitingHuman,
    gw::RunState::Succeeded,
    gw::RunState::Partial,
    gw::RunState::Failed,
    gw::RunState::Cancelled,
];

/// `RUN_STATE_AWAITING_HUMAN` -> `awaiting_human`.
fn state_name(state: gw::RunState) -> String {
    state.as_str_name().trim_start_matches("RUN_STATE_").to_ascii_lowercase()
}

/// The store's counts, queried on `handle` (export callbacks are synchronous and run on the
/// exporter's own thread, or on the thread that forces a flush).
fn counts(handle: &tokio::runtime::Handle, store: &Weak<dyn RunStorage>) -> Option<Vec<(i32, i64)>> {
    let store = store.upgrade()?;
    // Blocking the only thread of a current-thread runtime would wait on itself.
    if let Ok(current) = tokio::runtime::Handle::try_current()
        && current.runtime_flavor() == tokio::runtime::RuntimeFlavor::CurrentThread
    {
        return None;
    }
    let (tx, rx) = std::sync::mpsc::channel();
    handle.spawn(async move {
        let counts = store.count_by_state().await;
        // Let go of the store before answering: a caller that drops it next must see it closed.
        drop(store);
        let _ = tx.send(counts);
    });
    match rx.recv_timeout(COUNT_TIMEOUT) {
        Ok(Ok(counts)) => Some(counts),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "run counts for metrics failed");
            None
        }
        Err(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn state_names_are_short_and_lowercase() {
        assert_eq!(state_name(gw::RunState::AwaitingHuman), "awaiting_human");
        assert_eq!(state_name(gw::RunState::Succeeded), "succeeded");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn counts_come_from_the_store() {
        let store = RunStore::open(":memory:").unwrap();
        let run =
            |id: &str, state: gw::RunState| gw::Run { run_id: id.into(), state: state as i32, ..Default::default() };
        store.create(run("a", gw::RunState::Running), Default::default()).await.unwrap();
        store.create(run("b", gw::RunState::Succeeded), Default::default()).await.unwrap();
        store.create(run("c", gw::RunState::Succeeded), Default::default()).await.unwrap();
        let handle = tokio::runtime::Handle::current();
        let weak = store.downgrade();
        // As the exporter's thread calls it: off the runtime.
        let got = tokio::task::spawn_blocking(move || counts(&handle, &weak)).await.unwrap();
        assert_eq!(got, Some(vec![(gw::RunState::Running as i32, 1), (gw::RunState::Succeeded as i32, 2)]));
        let weak = store.downgrade();
        drop(store);
        let handle = tokio::runtime::Handle::current();
        assert_eq!(tokio::task::spawn_blocking(move || counts(&handle, &weak)).await.unwrap(), None, "store closed");
    }
}
