//! What a pipeline sees of its run: events (gap-free sequences, persisted, then broadcast),
//! checkpoints, the pause gate and cancellation, human actions (an inbox of persisted controls a
//! pipeline consumes in order, and the audit log), usage and model records, progress.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{SystemTime, UNIX_EPOCH};

use assay_domain::{ModelRecord, StageError, Usage};
use assay_proto::common::v1 as pb;
use assay_proto::convert;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::run_event::Event;
use tokio::sync::{broadcast, mpsc, oneshot, watch};

use super::store::RunStore;

pub(crate) fn now() -> prost_types::Timestamp {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    prost_types::Timestamp { seconds: d.as_secs() as i64, nanos: d.subsec_nanos() as i32 }
}

/// Where a run's events and checkpoints go.
enum Persistence {
    /// The run store (runs started with RunPipeline).
    Store(RunStore),
    /// Memory only (Evaluate: the run is stored once, finished).
    Memory(Mutex<BTreeMap<String, Vec<u8>>>),
}

/// An event to append, and where to say it was.
type Append = (Event, oneshot::Sender<Result<(), StageError>>);

/// The state of one run being executed by this gateway.
pub struct RunCtx {
    run_id: String,
    persistence: Persistence,
    pub(super) events: broadcast::Sender<Arc<gw::RunEvent>>,
    /// The run's event writer: one task per run assigns sequences, persists and broadcasts, in
    /// the order events were sent. No caller holds a lock while it waits, so a producer that is
    /// left unpolled (in a buffered stream whose consumer is itself emitting) cannot block the
    /// others, and a caller dropped mid-emit leaves no sequence half-used.
    writer: mpsc::UnboundedSender<Append>,
    pub(super) run: Arc<Mutex<gw::Run>>,
    pub(super) paused: watch::Sender<bool>,
    pub(super) cancelled: watch::Sender<bool>,
    models: Mutex<Vec<ModelRecord>>,
    /// Pipeline actions posted so far (bumped on every post, to wake waiters).
    posted: watch::Sender<u32>,
    /// Serialises posts and audit entries (their keys are counters).
    journal: tokio::sync::Mutex<()>,
}

/// Checkpoint key prefix of the posted pipeline actions.
const ACTION: &str = "engine:action:";
/// Checkpoint key prefix of the audit log.
const AUDIT: &str = "engine:audit:";

/// The audit log of a stored run, oldest first (empty for a run kept in memory only).
pub(crate) async fn stored_audit_log(store: &RunStore, run_id: &str) -> Result<Vec<gw::AuditEntry>, StageError> {
    store
        .checkpoints(run_id, AUDIT)
        .await?
        .into_iter()
        .map(|(_, v)| {
            <gw::AuditEntry as prost::Message>::decode(v.as_slice())
                .map_err(|e| StageError::Internal(format!("run store: corrupt audit entry: {e}")))
        })
        .collect()
}

/// The writer task of a run: `seq` is the last sequence already stored.
async fn write_events(
    run_id: String,
    mut seq: u64,
    store: Option<RunStore>,
    run: Arc<Mutex<gw::Run>>,
    events: broadcast::Sender<Arc<gw::RunEvent>>,
    mut rx: mpsc::UnboundedReceiver<Append>,
) {
    while let Some((event, ack)) = rx.recv().await {
        let ev = gw::RunEvent { run_id: run_id.clone(), sequence: seq + 1, time: Some(now()), event: Some(event) };
        let written = async {
            if let Some(store) = &store {
                store.append_event(ev.clone()).await?;
            }
            let summary = {
                let mut r = run.lock().map_err(|_| StageError::Internal("run lock poisoned".into()))?;
                r.last_sequence = ev.sequence;
                r.updated_at = ev.time;
                store.is_some().then(|| r.clone())
            };
            if let (Some(store), Some(summary)) = (&store, summary) {
                store.update(summary).await?;
            }
            Ok(())
        }
        .await;
        if written.is_ok() {
            seq += 1;
            if store.is_some() {
                let _ = events.send(Arc::new(ev));
            }
        }
        let _ = ack.send(written);
    }
}

impl RunCtx {
    /// A run's context; `seq` is the last sequence already stored. Starts the run's event writer
    /// (on the current Tokio runtime).
    pub(super) fn new(run: gw::Run, seq: u64, store: Option<RunStore>) -> Self {
        // Watchers of a stored run may lag behind by this many events before they must reattach
        // (from the store, by sequence); a run kept in memory has no watchers. The ring holds
        // pointers, allocated up front: a few KiB per run, however many runs are live.
        let capacity = if store.is_some() { 1024 } else { 1 };
        let events = broadcast::channel(capacity).0;
        let run_id = run.run_id.clone();
        let run = Arc::new(Mutex::new(run));
        let (writer, rx) = mpsc::unbounded_channel();
        tokio::spawn(write_events(run_id.clone(), seq, store.clone(), run.clone(), events.clone(), rx));
        Self {
            run_id,
            persistence: match store {
                Some(s) => Persistence::Store(s),
                None => Persistence::Memory(Mutex::default()),
            },
            events,
            writer,
            run,
            paused: watch::channel(false).0,
            cancelled: watch::channel(false).0,
            models: Mutex::new(Vec::new()),
            posted: watch::channel(0).0,
            journal: tokio::sync::Mutex::new(()),
        }
    }

    pub fn run_id(&self) -> &str {
        &self.run_id
    }

    /// Whether events and checkpoints are kept in memory only (Evaluate).
    pub fn is_ephemeral(&self) -> bool {
        matches!(self.persistence, Persistence::Memory(_))
    }

    /// The run's summary as it stands.
    pub fn snapshot(&self) -> gw::Run {
        self.run.lock().map(|r| r.clone()).unwrap_or_default()
    }

    pub(super) fn update(&self, f: impl FnOnce(&mut gw::Run)) {
        if let Ok(mut r) = self.run.lock() {
            f(&mut r);
        }
    }

    /// Append an event: next sequence, persisted (with the run summary), then broadcast; returns
    /// once it is stored. Events of one caller are appended in the order they were emitted.
    pub async fn emit(&self, event: Event) -> Result<(), StageError> {
        let (ack, done) = oneshot::channel();
        self.writer.send((event, ack)).map_err(|_| StageError::Internal("the run's event writer stopped".into()))?;
        done.await.map_err(|_| StageError::Internal("the run's event writer stopped".into()))?
    }

    /// Relay a stage's progress as a run event.
    pub async fn progress(&self, service: &str, p: pb::Progress) -> Result<(), StageError> {
        self.emit(Event::Progress(gw::StageProgress { service: service.into(), progress: Some(p) })).await
    }

    /// Await a stage call while relaying the progress it reports through `rx` (fed by the sink
    /// handed to the stage) as run events, in order; progress left in the channel when the call
    /// ends is relayed before returning.
    pub async fn relay<T>(
        &self,
        service: &str,
        rx: &mut mpsc::UnboundedReceiver<pb::Progress>,
        call: impl Future<Output = T>,
    ) -> Result<T, StageError> {
        tokio::pin!(call);
        loop {
            tokio::select! {
                biased;
                out = &mut call => {
                    while let Ok(p) = rx.try_recv() {
                        self.progress(service, p).await?;
                    }
                    return Ok(out);
                }
                Some(p) = rx.recv() => self.progress(service, p).await?,
            }
        }
    }

    /// Store a checkpoint under `key` (a resumed run reads it back with [`RunCtx::checkpoints`]).
    pub async fn checkpoint(&self, key: &str, value: &impl prost::Message) -> Result<(), StageError> {
        self.put_raw(key, value.encode_to_vec()).await
    }

    /// The checkpoints whose key starts with `prefix`, by key, decoded.
    pub async fn checkpoints<M: prost::Message + Default>(&self, prefix: &str) -> Result<Vec<(String, M)>, StageError> {
        self.raw(prefix)
            .await?
            .into_iter()
            .map(|(k, v)| {
                M::decode(v.as_slice())
                    .map(|m| (k, m))
                    .map_err(|e| StageError::Internal(format!("run store: corrupt checkpoint: {e}")))
            })
            .collect()
    }

    /// Store a serde value as a checkpoint under `key` (JSON).
    pub async fn checkpoint_json(&self, key: &str, value: &impl serde::Serialize) -> Result<(), StageError> {
        let bytes = serde_json::to_vec(value).map_err(|e| StageError::Internal(format!("checkpoint {key}: {e}")))?;
        self.put_raw(key, bytes).await
    }

    /// The serde checkpoint stored under `key`, if any.
    pub async fn load_json<T: serde::de::DeserializeOwned>(&self, key: &str) -> Result<Option<T>, StageError> {
        let raw = self.raw(key).await?;
        let Some((_, bytes)) = raw.into_iter().find(|(k, _)| k == key) else { return Ok(None) };
        serde_json::from_slice(&bytes)
            .map(Some)
            .map_err(|e| StageError::Internal(format!("run store: corrupt checkpoint {key}: {e}")))
    }

    async fn put_raw(&self, key: &str, bytes: Vec<u8>) -> Result<(), StageError> {
        match &self.persistence {
            Persistence::Store(store) => store.put_checkpoint(&self.run_id, key, bytes).await,
            Persistence::Memory(m) => {
                m.lock()
                    .map_err(|_| StageError::Internal("checkpoint lock poisoned".into()))?
                    .insert(key.to_string(), bytes);
                Ok(())
            }
        }
    }

    async fn raw(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StageError> {
        match &self.persistence {
            Persistence::Store(store) => store.checkpoints(&self.run_id, prefix).await,
            Persistence::Memory(m) => Ok(m
                .lock()
                .map_err(|_| StageError::Internal("checkpoint lock poisoned".into()))?
                .range(prefix.to_string()..)
                .take_while(|(k, _)| k.starts_with(prefix))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()),
        }
    }

    /// Append to the run's audit log (persisted).
    pub async fn audit(&self, actor: &str, action: &str, detail: &str) -> Result<(), StageError> {
        let _guard = self.journal.lock().await;
        self.audit_locked(actor, action, detail).await
    }

    async fn audit_locked(&self, actor: &str, action: &str, detail: &str) -> Result<(), StageError> {
        let n = self.raw(AUDIT).await?.len();
        let entry = gw::AuditEntry {
            time: Some(now()),
            actor: if actor.is_empty() { "unknown".into() } else { actor.to_string() },
            action: action.to_string(),
            detail: detail.to_string(),
        };
        self.checkpoint(&format!("{AUDIT}{n:08}"), &entry).await
    }

    /// The audit log, oldest first.
    pub async fn audit_log(&self) -> Result<Vec<gw::AuditEntry>, StageError> {
        Ok(self.checkpoints::<gw::AuditEntry>(AUDIT).await?.into_iter().map(|(_, e)| e).collect())
    }

    /// Post a pipeline action (a human decision the pipeline consumes in order with
    /// [`RunCtx::next_action`] / [`RunCtx::gate_or_action`]): audited, persisted (it survives a
    /// restart until consumed), then the run is woken. Returns its index.
    pub async fn post_action(
        &self,
        request: &gw::ControlRunRequest,
        action: &str,
        detail: &str,
    ) -> Result<u32, StageError> {
        let _guard = self.journal.lock().await;
        let n = self.raw(ACTION).await?.len() as u32;
        self.audit_locked(&request.actor, action, detail).await?;
        self.checkpoint(&format!("{ACTION}{n:08}"), request).await?;
        self.posted.send_replace(n + 1);
        Ok(n)
    }

    /// Posted actions with index >= `consumed`, in order.
    pub async fn actions_from(&self, consumed: u32) -> Result<Vec<gw::ControlRunRequest>, StageError> {
        Ok(self
            .checkpoints::<gw::ControlRunRequest>(ACTION)
            .await?
            .into_iter()
            .skip(consumed as usize)
            .map(|(_, a)| a)
            .collect())
    }

    /// The first posted action not yet consumed (`consumed` = how many the pipeline has
    /// consumed); waits for one. CANCELLED once cancel is asked for.
    pub async fn next_action(&self, consumed: u32) -> Result<gw::ControlRunRequest, StageError> {
        let mut posted = self.posted.subscribe();
        loop {
            if let Some(a) = self.actions_from(consumed).await?.into_iter().next() {
                return Ok(a);
            }
            tokio::select! {
                biased;
                () = self.cancelled() => return Err(StageError::Cancelled("the run was cancelled".into())),
                r = posted.changed() => { if r.is_err() { return Err(StageError::Internal("run context dropped".into())); } }
            }
        }
    }

    /// Like [`RunCtx::gate`], but a posted action not yet consumed is returned at once (paused or
    /// not); `None` once the run is not paused and nothing is pending.
    pub async fn gate_or_action(&self, consumed: u32) -> Result<Option<gw::ControlRunRequest>, StageError> {
        let mut posted = self.posted.subscribe();
        let mut paused = self.paused.subscribe();
        loop {
            if self.is_cancelled() {
                return Err(StageError::Cancelled("the run was cancelled".into()));
            }
            if let Some(a) = self.actions_from(consumed).await?.into_iter().next() {
                return Ok(Some(a));
            }
            if !*paused.borrow_and_update() {
                return Ok(None);
            }
            tokio::select! {
                biased;
                () = self.cancelled() => return Err(StageError::Cancelled("the run was cancelled".into())),
                _ = posted.changed() => {}
                _ = paused.changed() => {}
            }
        }
    }

    /// Whether the run is paused.
    pub fn is_paused(&self) -> bool {
        *self.paused.borrow()
    }

    /// The run's state.
    pub fn state(&self) -> gw::RunState {
        gw::RunState::try_from(self.snapshot().state).unwrap_or(gw::RunState::Unspecified)
    }

    /// Move the run to `state` (an event says why) unless it is there already.
    pub async fn set_state(&self, state: gw::RunState, reason: &str) -> Result<(), StageError> {
        if self.state() == state {
            return Ok(());
        }
        self.update(|r| r.state = state as i32);
        self.emit(Event::StateChanged(gw::RunStateChanged { state: state as i32, reason: reason.to_string() })).await
    }

    /// Set the run's pipeline-specific progress (stored with the next event).
    pub fn set_progress(&self, progress: gw::run::Progress) {
        self.update(|r| r.progress = Some(progress));
    }

    /// Whether cancel was asked for.
    pub fn is_cancelled(&self) -> bool {
        *self.cancelled.borrow()
    }

    /// Resolves once cancel is asked for.
    pub async fn cancelled(&self) {
        let mut rx = self.cancelled.subscribe();
        let _ = rx.wait_for(|c| *c).await;
    }

    /// Before starting new work: waits while the run is paused; CANCELLED once cancel is asked for.
    pub async fn gate(&self) -> Result<(), StageError> {
        let mut paused = self.paused.subscribe();
        tokio::select! {
            biased;
            () = self.cancelled() => Err(StageError::Cancelled("the run was cancelled".into())),
            _ = paused.wait_for(|p| !*p) => {
                if self.is_cancelled() { Err(StageError::Cancelled("the run was cancelled".into())) } else { Ok(()) }
            }
        }
    }

    /// Add to the run's usage.
    pub fn add_usage(&self, usage: &Usage) {
        self.update(|run| {
            let mut total = convert::usage_from(run.usage);
            total.add(usage);
            run.usage = Some(convert::usage_to(&total));
        });
    }

    /// The run's usage so far.
    pub fn usage(&self) -> pb::Usage {
        self.snapshot().usage.unwrap_or_default()
    }

    /// Record a model used (once per distinct record).
    pub fn add_model(&self, model: &ModelRecord) {
        if let Ok(mut m) = self.models.lock()
            && !m.contains(model)
        {
            m.push(model.clone());
        }
    }

    /// Models used so far.
    pub fn models(&self) -> Vec<ModelRecord> {
        self.models.lock().map(|m| m.clone()).unwrap_or_default()
    }

    /// Set how many units of work are done.
    pub fn set_done(&self, done: u32) {
        self.update(|r| r.records_done = done);
    }

    /// One more unit of work done.
    pub fn add_done(&self) {
        self.update(|r| r.records_done += 1);
    }
}
