//! An open run's records, as rows of the run store: read a page at a time, and the wait for more
//! (an append on this gateway wakes the run at once; one on another gateway sharing the store is
//! seen at the next look).

use std::sync::Arc;

use assay_domain::StageError;
use tokio::sync::Notify;

use crate::store::{RecordsPage, RunStore};

/// How long a run waiting for records goes before it looks again without being woken.
const LOOK_AGAIN: std::time::Duration = std::time::Duration::from_millis(500);

/// An open run's records. Cheap to clone (shared).
#[derive(Clone)]
pub struct Inputs {
    run_id: String,
    store: Option<RunStore>,
    arrived: Arc<Notify>,
}

impl Inputs {
    pub(crate) fn new(run_id: String, store: Option<RunStore>) -> Self {
        Self { run_id, store, arrived: Arc::default() }
    }

    fn store(&self) -> Result<&RunStore, StageError> {
        self.store.as_ref().ok_or_else(|| StageError::Internal("a run kept in memory has no records as rows".into()))
    }

    /// Up to `limit` records from index `first` on, with how many the run holds and whether it is
    /// sealed.
    pub async fn page(&self, first: u64, limit: usize) -> Result<RecordsPage, StageError> {
        self.store()?.records(&self.run_id, first, limit).await
    }

    /// Resolves when records may have arrived: woken by an append on this gateway, or after a
    /// while (an append on another gateway).
    pub async fn arrival(&self) {
        let _ = tokio::time::timeout(LOOK_AGAIN, self.arrived.notified()).await;
    }

    /// Records were appended.
    pub(crate) fn nudge(&self) {
        self.arrived.notify_waiters();
        self.arrived.notify_one();
    }
}
