//! An open run's records, as rows of the run store: read a page at a time, and the wait for more
//! (an append on this gateway wakes the run at once; one on another gateway sharing the store is
//! seen at the next look).

use std::sync::Arc;

use assay_domain::StageError;
use tokio::sync::Notify;

use crate::store::{ChunkCommit, ChunkRow, Claim, RecordsPage, RunStore};

/// How long a run waiting for records goes before it looks again without being woken.
const LOOK_AGAIN: std::time::Duration = std::time::Duration::from_millis(500);

/// An open run's records. Cheap to clone (shared).
#[derive(Clone)]
pub struct Inputs {
    run_id: String,
    store: Option<RunStore>,
    arrived: Arc<Notify>,
    /// This context's claim on chunks of a spread run (one per executor or helper).
    token: Arc<str>,
}

impl Inputs {
    pub(crate) fn new(run_id: String, store: Option<RunStore>) -> Self {
        Self { run_id, store, arrived: Arc::default(), token: uuid::Uuid::now_v7().to_string().into() }
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

    /// Whether the run's records can be spread over several gateways: the store is shared.
    pub fn can_spread(&self) -> bool {
        self.store.as_ref().is_some_and(|s| s.shared())
    }

    /// This context's claim token.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// Let other gateways claim chunks of the run.
    pub async fn spread(&self) -> Result<(), StageError> {
        self.store()?.spread(&self.run_id).await
    }

    /// Claim a chunk of at most `max` records (see [`crate::store::ChunkStorage::claim_chunk`]).
    pub async fn claim(&self, max: u32) -> Result<Claim, StageError> {
        self.store()?.claim_chunk(&self.run_id, &self.token, max).await
    }

    /// Store the work of this context's claims; returns the chunks it lost.
    pub async fn commit(&self, commit: ChunkCommit) -> Result<Vec<u64>, StageError> {
        self.store()?.commit_chunks(&self.run_id, &self.token, commit).await
    }

    /// Give up this context's unfinished chunks.
    pub async fn release(&self) -> Result<(), StageError> {
        self.store()?.release_chunks(&self.run_id, &self.token).await
    }

    /// The run's chunks from index `first` on.
    pub async fn chunks(&self, first: u64) -> Result<Vec<ChunkRow>, StageError> {
        self.store()?.chunks(&self.run_id, first).await
    }

    /// Stored checkpoints of the run under any of `keys`, read from the store whatever this
    /// context keeps its own writes in (a helper keeps none).
    pub async fn stored(&self, keys: Vec<String>) -> Result<Vec<(String, Vec<u8>)>, StageError> {
        self.store()?.checkpoints_get(&self.run_id, keys).await
    }

    /// Up to `limit` stored checkpoints under `prefix` sorting after `after`, by key.
    pub async fn stored_page(
        &self,
        prefix: &str,
        after: &str,
        limit: usize,
    ) -> Result<Vec<(String, Vec<u8>)>, StageError> {
        self.store()?.checkpoints_page(&self.run_id, prefix, after, limit).await
    }

    /// Records were appended.
    pub(crate) fn nudge(&self) {
        self.arrived.notify_waiters();
        self.arrived.notify_one();
    }
}
