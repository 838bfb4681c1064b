//! A store around another one that shows and steers its batched writes, for tests of what the
//! engine does while its store is slow or failing: the size of every batch, writes that fail, or
//! writes held until released. Everything else passes through.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use assay_domain::StageError;
use assay_proto::gateway::v1 as gw;
use tokio::sync::watch;

use super::contract::{
    Appended, ChunkCommit, ChunkRow, ChunkStorage, Claim, ControlOutcome, ControlRefusal, HoldOutcome, NewRecord,
    PostedControl, RecordStorage, RecordsPage, RunStorage, RunWrite, SpendHold, SpendLedger, StoredRun,
};
use super::handle::RunStore;

pub struct ObservedStore {
    inner: RunStore,
    batches: Mutex<Vec<usize>>,
    failing: AtomicBool,
    held: watch::Sender<bool>,
}

impl ObservedStore {
    pub fn new(inner: RunStore) -> Self {
        Self { inner, batches: Mutex::default(), failing: AtomicBool::new(false), held: watch::channel(false).0 }
    }

    /// The number of writes in each batch so far, in order (held and failed batches included).
    pub fn batches(&self) -> Vec<usize> {
        self.batches.lock().map(|b| b.clone()).unwrap_or_default()
    }

    /// Fail every batch from now on (`true`) or no longer (`false`).
    pub fn set_failing(&self, failing: bool) {
        self.failing.store(failing, Ordering::SeqCst);
    }

    /// Hold every batch from now on until released (`false`), as a stalled database would.
    pub fn set_held(&self, held: bool) {
        self.held.send_replace(held);
    }
}

#[async_trait::async_trait]
impl RunStorage for ObservedStore {
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn shared(&self) -> bool {
        self.inner.shared()
    }
    async fn create(&self, run: gw::Run, request: gw::RunPipelineRequest) -> Result<(), StageError> {
        self.inner.create(run, request).await
    }
    async fn write(&self, run_id: &str, writes: Vec<RunWrite>) -> Result<(), StageError> {
        if let Ok(mut b) = self.batches.lock() {
            b.push(writes.len());
        }
        let _ = self.held.subscribe().wait_for(|held| !*held).await;
        if self.failing.load(Ordering::SeqCst) {
            return Err(StageError::Unavailable("run store down".into()));
        }
        self.inner.write(run_id, writes).await
    }
    async fn events_after(&self, run_id: &str, after: u64) -> Result<Vec<gw::RunEvent>, StageError> {
        self.inner.events_after(run_id, after).await
    }
    async fn events_page(&self, run_id: &str, after: u64, limit: usize) -> Result<Vec<gw::RunEvent>, StageError> {
        self.inner.events_page(run_id, after, limit).await
    }
    async fn checkpoints(&self, run_id: &str, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StageError> {
        self.inner.checkpoints(run_id, prefix).await
    }
    async fn get(&self, run_id: &str) -> Result<Option<StoredRun>, StageError> {
        self.inner.get(run_id).await
    }
    async fn list(
        &self,
        kind: i32,
        state: i32,
        cursor: Option<(i64, String)>,
        limit: usize,
    ) -> Result<Vec<gw::Run>, StageError> {
        self.inner.list(kind, state, cursor, limit).await
    }
    async fn claim_orphans(&self, startup: bool) -> Result<Vec<StoredRun>, StageError> {
        self.inner.claim_orphans(startup).await
    }
    async fn renew(&self, run_ids: &[String]) -> Result<Vec<String>, StageError> {
        self.inner.renew(run_ids).await
    }
    async fn release(&self, run_id: &str) -> Result<(), StageError> {
        self.inner.release(run_id).await
    }
    async fn post_control(&self, request: gw::ControlRunRequest) -> Result<i64, StageError> {
        self.inner.post_control(request).await
    }
    async fn posted_controls(&self, run_ids: &[String]) -> Result<Vec<PostedControl>, StageError> {
        self.inner.posted_controls(run_ids).await
    }
    async fn remove_control(&self, id: i64) -> Result<(), StageError> {
        self.inner.remove_control(id).await
    }
    async fn refuse_control(&self, id: i64, refusal: ControlRefusal) -> Result<(), StageError> {
        self.inner.refuse_control(id, refusal).await
    }
    async fn control_outcome(&self, id: i64) -> Result<ControlOutcome, StageError> {
        self.inner.control_outcome(id).await
    }
    async fn count_by_state(&self) -> Result<Vec<(i32, i64)>, StageError> {
        self.inner.count_by_state().await
    }
    async fn delete(&self, run_id: &str) -> Result<gw::Run, StageError> {
        self.inner.delete(run_id).await
    }
    async fn finished_before(&self, before: i64, limit: usize) -> Result<Vec<String>, StageError> {
        self.inner.finished_before(before, limit).await
    }
    async fn hold_store_lease(&self, name: &str, seconds: f64) -> Result<bool, StageError> {
        self.inner.hold_store_lease(name, seconds).await
    }
}

#[async_trait::async_trait]
impl SpendLedger for ObservedStore {
    async fn add_spend(&self, day: &str, backend: &str, nano_usd: i64) -> Result<i64, StageError> {
        self.inner.add_spend(day, backend, nano_usd).await
    }
    async fn spend(&self, day: &str) -> Result<Vec<(String, i64)>, StageError> {
        self.inner.spend(day).await
    }
    async fn note_need(&self, day: &str, backend: &str, nano_usd: i64) -> Result<(), StageError> {
        self.inner.note_need(day, backend, nano_usd).await
    }
    async fn needs(&self, day: &str) -> Result<Vec<(String, i64)>, StageError> {
        self.inner.needs(day).await
    }
    async fn hold_spend(&self, hold: &SpendHold, min: i64, cap: i64) -> Result<HoldOutcome, StageError> {
        self.inner.hold_spend(hold, min, cap).await
    }
    async fn settle_spend(
        &self,
        day: &str,
        backend: &str,
        id: &str,
        reserved: i64,
        actual: i64,
    ) -> Result<i64, StageError> {
        self.inner.settle_spend(day, backend, id, reserved, actual).await
    }
}

#[async_trait::async_trait]
impl RecordStorage for ObservedStore {
    async fn append_records(
        &self,
        run_id: &str,
        records: Vec<NewRecord>,
        seal: bool,
        max_total: u64,
    ) -> Result<Appended, StageError> {
        self.inner.append_records(run_id, records, seal, max_total).await
    }
    async fn records(&self, run_id: &str, first: u64, limit: usize) -> Result<RecordsPage, StageError> {
        self.inner.records(run_id, first, limit).await
    }
    async fn checkpoints_get(&self, run_id: &str, keys: Vec<String>) -> Result<Vec<(String, Vec<u8>)>, StageError> {
        self.inner.checkpoints_get(run_id, keys).await
    }
    async fn checkpoints_page(
        &self,
        run_id: &str,
        prefix: &str,
        after: &str,
        limit: usize,
    ) -> Result<Vec<(String, Vec<u8>)>, StageError> {
        self.inner.checkpoints_page(run_id, prefix, after, limit).await
    }
}

#[async_trait::async_trait]
impl ChunkStorage for ObservedStore {
    async fn spread(&self, run_id: &str) -> Result<(), StageError> {
        self.inner.spread(run_id).await
    }
    async fn claim_chunk(&self, run_id: &str, token: &str, max: u32) -> Result<Claim, StageError> {
        self.inner.claim_chunk(run_id, token, max).await
    }
    async fn commit_chunks(&self, run_id: &str, token: &str, commit: ChunkCommit) -> Result<Vec<u64>, StageError> {
        self.inner.commit_chunks(run_id, token, commit).await
    }
    async fn release_chunks(&self, run_id: &str, token: &str) -> Result<(), StageError> {
        self.inner.release_chunks(run_id, token).await
    }
    async fn chunks(&self, run_id: &str, first: u64) -> Result<Vec<ChunkRow>, StageError> {
        self.inner.chunks(run_id, first).await
    }
    async fn runs_to_help(&self, limit: usize) -> Result<Vec<String>, StageError> {
        self.inner.runs_to_help(limit).await
    }
}
