//! What a pipeline sees of its run: events (gap-free sequences, persisted, then broadcast),
//! checkpoints, the pause gate and cancellation, usage and model records, progress counters.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Mutex;
use std::time::{SystemTime, UNIX_EPOCH};

use assay_domain::{ModelRecord, StageError, Usage};
use assay_proto::common::v1 as pb;
use assay_proto::convert;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::run_event::Event;
use tokio::sync::{broadcast, mpsc, watch};

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

/// The state of one run being executed by this gateway.
pub struct RunCtx {
    run_id: String,
    persistence: Persistence,
    pub(super) events: broadcast::Sender<gw::RunEvent>,
    /// Serialises sequence assignment + persistence so sequences are gap-free and ordered.
    seq: tokio::sync::Mutex<u64>,
    pub(super) run: Mutex<gw::Run>,
    pub(super) paused: watch::Sender<bool>,
    pub(super) cancelled: watch::Sender<bool>,
    models: Mutex<Vec<ModelRecord>>,
}

impl RunCtx {
    pub(super) fn new(run: gw::Run, seq: u64, store: Option<RunStore>) -> Self {
        // Watchers of a stored run may lag behind by this many events before they must reattach;
        // a run kept in memory has no watchers.
        let capacity = if store.is_some() { 4096 } else { 1 };
        Self {
            run_id: run.run_id.clone(),
            persistence: match store {
                Some(s) => Persistence::Store(s),
                None => Persistence::Memory(Mutex::default()),
            },
            events: broadcast::channel(capacity).0,
            seq: tokio::sync::Mutex::new(seq),
            run: Mutex::new(run),
            paused: watch::channel(false).0,
            cancelled: watch::channel(false).0,
            models: Mutex::new(Vec::new()),
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

    /// Append an event: next sequence, persisted (with the run summary), then broadcast.
    pub async fn emit(&self, event: Event) -> Result<(), StageError> {
        let mut seq = self.seq.lock().await;
        if self.is_ephemeral() {
            // Nobody can watch a run kept in memory: the sequence still counts its events.
            *seq += 1;
            let n = *seq;
            self.update(|r| r.last_sequence = n);
            drop(event);
            return Ok(());
        }
        let ev =
            gw::RunEvent { run_id: self.run_id.clone(), sequence: *seq + 1, time: Some(now()), event: Some(event) };
        if let Persistence::Store(store) = &self.persistence {
            store.append_event(ev.clone()).await?;
        }
        *seq += 1;
        let run = {
            let mut r = self.run.lock().map_err(|_| StageError::Internal("run lock poisoned".into()))?;
            r.last_sequence = *seq;
            r.updated_at = ev.time;
            r.clone()
        };
        if let Persistence::Store(store) = &self.persistence {
            store.update(run).await?;
        }
        let _ = self.events.send(ev);
        Ok(())
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
        match &self.persistence {
            Persistence::Store(store) => store.put_checkpoint(&self.run_id, key, value.encode_to_vec()).await,
            Persistence::Memory(m) => {
                m.lock()
                    .map_err(|_| StageError::Internal("checkpoint lock poisoned".into()))?
                    .insert(key.to_string(), value.encode_to_vec());
                Ok(())
            }
        }
    }

    /// The checkpoints whose key starts with `prefix`, by key, decoded.
    pub async fn checkpoints<M: prost::Message + Default>(&self, prefix: &str) -> Result<Vec<(String, M)>, StageError> {
        let raw = match &self.persistence {
            Persistence::Store(store) => store.checkpoints(&self.run_id, prefix).await?,
            Persistence::Memory(m) => m
                .lock()
                .map_err(|_| StageError::Internal("checkpoint lock poisoned".into()))?
                .range(prefix.to_string()..)
                .take_while(|(k, _)| k.starts_with(prefix))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
        };
        raw.into_iter()
            .map(|(k, v)| {
                M::decode(v.as_slice())
                    .map(|m| (k, m))
                    .map_err(|e| StageError::Internal(format!("run store: corrupt checkpoint: {e}")))
            })
            .collect()
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
