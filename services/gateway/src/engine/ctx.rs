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

use super::spend::SpendCaps;
use super::store::{RunStore, RunWrite};

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

/// What a run's writer is asked to store, and where to say it was.
type Append = (Op, oneshot::Sender<Result<(), StageError>>);
type Ack = oneshot::Sender<Result<(), StageError>>;

/// One write queued for a run's writer.
enum Op {
    Write(Write),
    Guarded(Box<Guarded>),
}

/// An event or a checkpoint.
enum Write {
    Event(Box<Event>),
    Checkpoint(String, Vec<u8>),
}

/// Writes stored in a transaction of their own, only if the run's stored state is then one of
/// `expect` (else none of them: FAILED_PRECONDITION naming the state found, and their events
/// take no sequence); the run is in `state` once they are, when set.
struct Guarded {
    expect: Vec<i32>,
    writes: Vec<Write>,
    state: Option<i32>,
}

tokio::task_local! {
    /// The pause gate of the run whose pipeline this task executes (set by the engine).
    static RUN_GATE: RunGate;
}

/// A run's pause gate and cancellation, as the stage calls of its pipeline see them.
#[derive(Clone)]
pub(super) struct RunGate {
    paused: watch::Receiver<bool>,
    cancelled: watch::Receiver<bool>,
}

impl RunGate {
    async fn wait(mut self) -> Result<(), StageError> {
        let released = tokio::select! {
            biased;
            _ = self.cancelled.wait_for(|c| *c) => false,
            _ = self.paused.wait_for(|p| !*p) => true,
        };
        if released && !*self.cancelled.borrow() {
            Ok(())
        } else {
            Err(StageError::Cancelled("the run was cancelled".into()))
        }
    }

    /// Run `f` (a pipeline) with this gate in scope for every stage call it makes on its task.
    pub(super) async fn scope<F: Future>(self, f: F) -> F::Output {
        RUN_GATE.scope(self, f).await
    }
}

/// Before a stage call: waits while the run whose pipeline makes it is paused; CANCELLED once the
/// run is cancelled. Straight through outside a run. Every stage a pipeline holds calls it (see
/// `crate::pipelines::Stages`), so no model call starts on a paused run.
pub async fn stage_gate() -> Result<(), StageError> {
    match RUN_GATE.try_with(RunGate::clone) {
        Ok(gate) => gate.wait().await,
        Err(_) => Ok(()),
    }
}

/// The name of a stored state (`RUN_STATE_PAUSED`).
pub(crate) fn state_name(state: i32) -> &'static str {
    gw::RunState::try_from(state).map(|s| s.as_str_name()).unwrap_or("RUN_STATE_UNKNOWN")
}

/// Writes a run's writer puts in one transaction at most.
const MAX_BATCH: usize = 512;

/// A queued write of a run ([`RunCtx::emit_queued`], [`RunCtx::checkpoint_queued`]): resolves
/// once it is stored (or failed). Writes are stored in the order they were queued, whether or
/// not this is awaited; dropping it does not withdraw the write.
pub struct Written(WrittenState);

enum WrittenState {
    Queued(oneshot::Receiver<Result<(), StageError>>),
    Done(Option<Result<(), StageError>>),
}

impl Written {
    fn done(result: Result<(), StageError>) -> Self {
        Self(WrittenState::Done(Some(result)))
    }
}

impl Future for Written {
    type Output = Result<(), StageError>;

    fn poll(mut self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> std::task::Poll<Self::Output> {
        match &mut self.0 {
            WrittenState::Queued(rx) => std::pin::Pin::new(rx)
                .poll(cx)
                .map(|r| r.unwrap_or_else(|_| Err(StageError::Internal("the run's event writer stopped".into())))),
            WrittenState::Done(r) => std::task::Poll::Ready(r.take().unwrap_or(Ok(()))),
        }
    }
}

/// Queued writes a pipeline has not waited for yet: poll [`Writes::next_error`] next to its own
/// work so a failed write ends the run early, and [`Writes::flush`] before relying on them.
#[derive(Default)]
pub struct Writes(futures::stream::FuturesUnordered<Written>);

impl Writes {
    pub fn push(&mut self, w: Written) {
        self.0.push(w);
    }

    /// Resolves with the first failed write; pending forever while none fails (so it can sit in
    /// a `select!`).
    pub async fn next_error(&mut self) -> StageError {
        use futures::StreamExt;
        loop {
            match self.0.next().await {
                Some(Err(e)) => return e,
                Some(Ok(())) => {}
                None => std::future::pending::<()>().await,
            }
        }
    }

    /// Wait for every queued write; the first failure.
    pub async fn flush(&mut self) -> Result<(), StageError> {
        use futures::StreamExt;
        let mut first = Ok(());
        while let Some(r) = self.0.next().await {
            if let (Ok(()), Err(e)) = (&first, r) {
                first = Err(e);
            }
        }
        first
    }
}

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
    /// Serialises the controls of the run (the engine's): each sees the state the one before left.
    pub(super) controls: tokio::sync::Mutex<()>,
    /// The run's spending limit with what its stage calls spent so far (restored from the
    /// stored usage after a restart): every stage call reserves a slice of it ([`super::meter`]).
    budget: Option<Arc<assay_budget::Budget>>,
    /// The daily spend caps of the capped backends the run uses (every stage call holds its
    /// slice on them in the store).
    spend: Option<(Arc<SpendCaps>, std::collections::BTreeSet<String>)>,
}

/// Checkpoint key prefix of the posted pipeline actions.
const ACTION: &str = "engine:action:";
/// Checkpoint key prefix of the audit log.
const AUDIT: &str = "engine:audit:";
/// Checkpoint: what the run's stage calls in flight hold of its budget (`tokens nano-dollars`).
const HELD: &str = "engine:budget:held";
/// Checkpoint: holds left behind by processes that stopped with calls in flight, counted as spent.
const LOST: &str = "engine:budget:lost";

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

/// The writer task of a run: `seq` is the last sequence already stored. Everything queued while
/// a write was under way goes into the next one, one transaction (group commit): a pipeline that
/// queues many writes without waiting for each pays one store round trip per batch. A guarded
/// group ([`Guarded`]) is a transaction of its own, in order with the rest.
async fn write_events(
    run_id: String,
    seq: u64,
    store: Option<RunStore>,
    run: Arc<Mutex<gw::Run>>,
    events: broadcast::Sender<Arc<gw::RunEvent>>,
    mut rx: mpsc::UnboundedReceiver<Append>,
) {
    let mut writer = Writer { run_id, seq, store, run, events };
    let mut batch: Vec<Append> = Vec::new();
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let mut plain: Vec<Write> = Vec::new();
        let mut acks: Vec<Ack> = Vec::new();
        for (op, ack) in batch.drain(..) {
            match op {
                Op::Write(w) => {
                    plain.push(w);
                    acks.push(ack);
                }
                Op::Guarded(g) => {
                    if !plain.is_empty() {
                        writer.commit(std::mem::take(&mut plain), std::mem::take(&mut acks), None).await;
                    }
                    let Guarded { expect, writes, state } = *g;
                    writer.commit(writes, vec![ack], Some((expect, state))).await;
                }
            }
        }
        if !plain.is_empty() {
            writer.commit(plain, acks, None).await;
        }
    }
}

/// A run's writer: the last sequence stored, and where writes go.
struct Writer {
    run_id: String,
    seq: u64,
    store: Option<RunStore>,
    run: Arc<Mutex<gw::Run>>,
    events: broadcast::Sender<Arc<gw::RunEvent>>,
}

impl Writer {
    /// Store `ops` in one transaction (guarded by `guard`: expected states, the state after) and
    /// answer every ack with the outcome.
    async fn commit(&mut self, ops: Vec<Write>, acks: Vec<Ack>, guard: Option<(Vec<i32>, Option<i32>)>) {
        let (expect, new_state) = guard.map_or((None, None), |(e, s)| (Some(e), s));
        let mut writes = Vec::with_capacity(ops.len() + 2);
        if let (Some(expect), Some(_)) = (&expect, &self.store) {
            writes.push(RunWrite::Expect(expect.clone()));
        }
        let mut stored = Vec::new();
        let mut next = self.seq;
        for op in ops {
            match op {
                Write::Event(event) => {
                    next += 1;
                    let ev = gw::RunEvent {
                        run_id: self.run_id.clone(),
                        sequence: next,
                        time: Some(now()),
                        event: Some(*event),
                    };
                    if self.store.is_some() {
                        writes.push(RunWrite::Event(Box::new(ev.clone())));
                    }
                    stored.push(ev);
                }
                Write::Checkpoint(key, value) => writes.push(RunWrite::Checkpoint { key, value }),
            }
        }
        let written = async {
            if stored.last().is_some() || new_state.is_some() {
                let summary = {
                    let r = self.run.lock().map_err(|_| StageError::Internal("run lock poisoned".into()))?;
                    let mut summary = r.clone();
                    if let Some(last) = stored.last() {
                        summary.last_sequence = last.sequence;
                        summary.updated_at = last.time;
                    }
                    if let Some(state) = new_state {
                        summary.state = state;
                    }
                    self.store.is_some().then_some(summary)
                };
                if let Some(summary) = summary {
                    writes.push(RunWrite::Summary(Box::new(summary)));
                }
            }
            if let Some(store) = &self.store {
                store.write(&self.run_id, writes).await?;
            }
            Ok(())
        }
        .await;
        if written.is_ok() {
            self.seq = next;
            if let Ok(mut r) = self.run.lock() {
                if let Some(last) = stored.last() {
                    r.last_sequence = last.sequence;
                    r.updated_at = last.time;
                }
                if let Some(state) = new_state {
                    r.state = state;
                }
            }
            if self.store.is_some() {
                for ev in stored {
                    let _ = self.events.send(Arc::new(ev));
                }
            }
        }
        for ack in acks {
            let _ = ack.send(written.clone());
        }
    }
}

/// Charging usage to a run's summary. Shared by [`RunCtx::add_usage`] and the sink of failed
/// stage calls. The budget and the caps are settled by the stage call's slice ([`super::meter`]).
#[derive(Clone)]
struct Charge {
    run: Arc<Mutex<gw::Run>>,
}

impl Charge {
    fn add(&self, usage: &Usage) {
        if let Ok(mut run) = self.run.lock() {
            let mut total = convert::usage_from(run.usage.take());
            total.add(usage);
            run.usage = Some(convert::usage_to(&total));
        }
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
        let budget = run.budget.as_ref().map(|b| {
            let limits = assay_budget::Limits { max_tokens: b.max_tokens, max_cost_usd: b.max_cost_usd };
            assay_budget::Budget::resumed(limits, &convert::usage_from(run.usage.clone()))
        });
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
            controls: tokio::sync::Mutex::new(()),
            budget,
            spend: None,
        }
    }

    /// Hold the run to the daily spend caps of `backends` (the capped backends it uses): every
    /// stage call holds its slice on their caps in the store before it is sent (a run with no
    /// budget of its own gets one, limited by the caps alone).
    #[must_use]
    pub(super) fn with_spend(mut self, caps: Arc<SpendCaps>, backends: std::collections::BTreeSet<String>) -> Self {
        if backends.is_empty() {
            return self;
        }
        let spent = convert::usage_from(self.snapshot().usage);
        let budget = self
            .budget
            .take()
            .unwrap_or_else(|| assay_budget::Budget::resumed(assay_budget::Limits::default(), &spent));
        self.budget = Some(budget);
        self.spend = Some((caps, backends));
        self
    }

    /// Run `fut` (the pipeline) with the run's budget current: every stage call it makes runs on
    /// a slice of it ([`super::meter`]), and a stage call that fails after spending is charged
    /// what it spent.
    pub(super) async fn budget_scope<F: std::future::Future>(&self, fut: F) -> F::Output {
        let charge = self.charge();
        let fut = assay_budget::with_sink(Arc::new(move |usage: &Usage| charge.add(usage)), fut);
        match &self.budget {
            Some(b) => {
                self.count_lost_holds(b).await;
                let mut meter = super::meter::RunMeter::new(self.run_id.clone(), b.clone(), self.spend.clone());
                meter.held_log = self.held_log(b);
                assay_budget::scope(b.clone(), super::meter::scope(Arc::new(meter), fut)).await
            }
            None => fut.await,
        }
    }

    /// What the run's stage calls hold of its budget, stored before each is sent ([`HELD`]): a
    /// process killed with calls in flight leaves it behind, and the next one counts it as spent
    /// ([`RunCtx::count_lost_holds`]). None for a run kept in memory.
    fn held_log(&self, budget: &Arc<assay_budget::Budget>) -> Option<super::meter::HeldLog> {
        if !matches!(self.persistence, Persistence::Store(_)) {
            return None;
        }
        let writer = self.writer.clone();
        let budget = budget.clone();
        // Read and queued under one lock: the last value queued is the last value read.
        let order = Arc::new(Mutex::new(()));
        Some(Arc::new(move || {
            let _in_order = order.lock().unwrap_or_else(|p| p.into_inner());
            let held = budget.held().header_value().into_bytes();
            let (ack, done) = oneshot::channel();
            let written = match writer.send((Op::Write(Write::Checkpoint(HELD.to_string(), held)), ack)) {
                Ok(()) => Written(WrittenState::Queued(done)),
                Err(_) => Written::done(Err(StageError::Internal("the run's event writer stopped".into()))),
            };
            Box::pin(written)
        }))
    }

    /// Count as spent what stage calls held when the process before this one stopped (killed with
    /// them in flight: a provider may have served every one): added to what earlier restarts
    /// found ([`LOST`]), charged to the budget, and the held record cleared.
    async fn count_lost_holds(&self, budget: &assay_budget::Budget) {
        let read = |rows: Vec<(String, Vec<u8>)>, key: &str| {
            rows.into_iter()
                .find(|(k, _)| k == key)
                .and_then(|(_, v)| assay_budget::Cost::from_header(&String::from_utf8_lossy(&v)))
                .unwrap_or_default()
        };
        let (held, lost) = match (self.raw(HELD).await, self.raw(LOST).await) {
            (Ok(h), Ok(l)) => (read(h, HELD), read(l, LOST)),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(run_id = %self.run_id, error = %e, "could not read the run's holds");
                return;
            }
        };
        let lost = if held == assay_budget::Cost::default() {
            lost
        } else {
            tracing::warn!(run_id = %self.run_id, tokens = held.tokens, usd = held.nano_usd as f64 / 1e9,
                "stage calls were in flight when the run's last gateway stopped: their holds count as spent");
            let lost = lost.plus(held);
            let stored = async {
                self.put_raw(LOST, lost.header_value().into_bytes()).await?;
                self.put_raw(HELD, assay_budget::Cost::default().header_value().into_bytes()).await
            };
            if let Err(e) = stored.await {
                tracing::warn!(run_id = %self.run_id, error = %e, "could not store the run's lost holds");
            }
            lost
        };
        if lost != assay_budget::Cost::default() {
            budget.charge(&Usage {
                prompt_tokens: lost.tokens,
                cost_usd: lost.nano_usd as f64 / 1e9,
                ..Usage::default()
            });
        }
    }

    /// What is left of the run's budget (its own limits, and a spend cap's ceiling), if it has one.
    pub fn budget_left(&self) -> Option<assay_budget::Limits> {
        self.budget.as_ref().map(|b| b.remaining())
    }

    /// The run's token limit, if it has one.
    pub fn token_limit(&self) -> Option<u64> {
        self.budget.as_ref()?.limits().max_tokens
    }

    /// Whether the run has a spending limit.
    pub fn has_budget(&self) -> bool {
        self.budget.is_some()
    }

    /// Why the run may start no more model calls (its budget is spent), recorded in the run the
    /// first time; None while it may.
    pub fn budget_exhausted(&self) -> Option<String> {
        let why = self.budget.as_ref()?.exhausted()?;
        self.update(|r| {
            if r.budget_exhausted.is_empty() {
                r.budget_exhausted = why.clone();
            }
        });
        Some(why)
    }

    /// Record why the run's budget stopped it (a call it needed could not be paid for), if it
    /// did and nothing was recorded yet.
    pub fn record_budget_stop(&self) {
        if let Some(why) = self.budget.as_ref().and_then(|b| b.stopped()) {
            self.update(|r| {
                if r.budget_exhausted.is_empty() {
                    r.budget_exhausted = why;
                }
            });
        }
    }

    /// The run's pause gate, for the stage calls of its pipeline.
    pub(super) fn run_gate(&self) -> RunGate {
        RunGate { paused: self.paused.subscribe(), cancelled: self.cancelled.subscribe() }
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
        self.emit_queued(event).await
    }

    /// Queue an event without waiting for it to be stored: its sequence is taken now, in order
    /// with every other event and checkpoint of the run; await the result (or push it into a
    /// [`Writes`]) to know it was stored.
    pub fn emit_queued(&self, event: Event) -> Written {
        self.queue(Op::Write(Write::Event(Box::new(event))))
    }

    fn queue(&self, op: Op) -> Written {
        let (ack, done) = oneshot::channel();
        match self.writer.send((op, ack)) {
            Ok(()) => Written(WrittenState::Queued(done)),
            Err(_) => Written::done(Err(StageError::Internal("the run's event writer stopped".into()))),
        }
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
        self.relay_with(rx, call, move |p| self.progress(service, p)).await
    }

    /// Await a stage call while handing each event it reports through `rx` (fed by the sink handed
    /// to the stage) to `relay` (which emits it as the pipeline's run event), one at a time in
    /// order; events left in the channel when the call ends are relayed before returning. The
    /// first error of `relay` stops the relay (and drops the call).
    pub async fn relay_with<E, T, R>(
        &self,
        rx: &mut mpsc::UnboundedReceiver<E>,
        call: impl Future<Output = T>,
        mut relay: impl FnMut(E) -> R,
    ) -> Result<T, StageError>
    where
        R: Future<Output = Result<(), StageError>>,
    {
        tokio::pin!(call);
        loop {
            tokio::select! {
                biased;
                out = &mut call => {
                    while let Ok(e) = rx.try_recv() {
                        relay(e).await?;
                    }
                    return Ok(out);
                }
                Some(e) = rx.recv() => relay(e).await?,
            }
        }
    }

    /// Store a checkpoint under `key` (a resumed run reads it back with [`RunCtx::checkpoints`]).
    pub async fn checkpoint(&self, key: &str, value: &impl prost::Message) -> Result<(), StageError> {
        self.put_raw(key, value.encode_to_vec()).await
    }

    /// Queue a checkpoint without waiting for it to be stored (in order with the run's events and
    /// other checkpoints); see [`RunCtx::emit_queued`].
    pub fn checkpoint_queued(&self, key: &str, value: &impl prost::Message) -> Written {
        self.put_queued(key, value.encode_to_vec())
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
        self.put_queued(key, bytes).await
    }

    fn put_queued(&self, key: &str, bytes: Vec<u8>) -> Written {
        match &self.persistence {
            // Through the writer: in order with the run's events, in their transactions.
            Persistence::Store(_) => self.queue(Op::Write(Write::Checkpoint(key.to_string(), bytes))),
            Persistence::Memory(m) => Written::done(
                m.lock()
                    .map(|mut m| {
                        m.insert(key.to_string(), bytes);
                    })
                    .map_err(|_| StageError::Internal("checkpoint lock poisoned".into())),
            ),
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
        let entry = self.audit_entry(actor, action, detail).await?;
        self.put_raw(&entry.0, entry.1).await
    }

    /// The next audit entry's key and value (call with the journal held).
    async fn audit_entry(&self, actor: &str, action: &str, detail: &str) -> Result<(String, Vec<u8>), StageError> {
        let n = self.raw(AUDIT).await?.len();
        let entry = gw::AuditEntry {
            time: Some(now()),
            actor: if actor.is_empty() { "unknown".into() } else { actor.to_string() },
            action: action.to_string(),
            detail: detail.to_string(),
        };
        Ok((format!("{AUDIT}{n:08}"), prost::Message::encode_to_vec(&entry)))
    }

    /// Store `writes` only if the run is in one of the `expect` states, atomically: the stored
    /// state is checked in the transaction that writes them (FAILED_PRECONDITION naming the state
    /// found, nothing written, otherwise). `state`: the run's state once they are (a
    /// `RunStateChanged` event with `reason` is among the writes).
    async fn guarded(
        &self,
        expect: &[gw::RunState],
        mut writes: Vec<Write>,
        state: Option<(gw::RunState, &str)>,
    ) -> Result<(), StageError> {
        let current = self.state();
        if !expect.contains(&current) {
            return Err(StageError::FailedPrecondition(format!("run {} is {}", self.run_id, current.as_str_name())));
        }
        if let Some((s, reason)) = state {
            writes.push(Write::Event(Box::new(Event::StateChanged(gw::RunStateChanged {
                state: s as i32,
                reason: reason.to_string(),
            }))));
        }
        let guarded =
            Guarded { expect: expect.iter().map(|s| *s as i32).collect(), writes, state: state.map(|(s, _)| s as i32) };
        match &self.persistence {
            Persistence::Store(_) => self.queue(Op::Guarded(Box::new(guarded))).await,
            Persistence::Memory(m) => {
                let mut events = Vec::new();
                {
                    let mut m = m.lock().map_err(|_| StageError::Internal("checkpoint lock poisoned".into()))?;
                    for w in guarded.writes {
                        match w {
                            Write::Checkpoint(k, v) => {
                                m.insert(k, v);
                            }
                            Write::Event(e) => events.push(e),
                        }
                    }
                }
                if let Some((s, _)) = state {
                    self.update(|r| r.state = s as i32);
                }
                for e in events {
                    self.emit_queued(*e).await?;
                }
                Ok(())
            }
        }
    }

    /// A control of the engine's, taken only if the run is in one of the `expect` states: its
    /// audit entry and the state it moves the run to (if any) are written together, in one
    /// transaction with the check of the stored state; nothing is audited when it is refused.
    pub(super) async fn control_write(
        &self,
        request: &gw::ControlRunRequest,
        action: &str,
        expect: &[gw::RunState],
        state: Option<gw::RunState>,
    ) -> Result<(), StageError> {
        let _guard = self.journal.lock().await;
        let (key, value) = self.audit_entry(&request.actor, action, &request.reason).await?;
        self.guarded(expect, vec![Write::Checkpoint(key, value)], state.map(|s| (s, request.reason.as_str()))).await
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
        let (key, value) = self.audit_entry(&request.actor, action, detail).await?;
        // Taken only in the state the pipeline checked it against, audit and action together.
        let writes = vec![
            Write::Checkpoint(key, value),
            Write::Checkpoint(format!("{ACTION}{n:08}"), prost::Message::encode_to_vec(request)),
        ];
        self.guarded(&[self.state()], writes, None).await?;
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
        self.charge().add(usage);
    }

    /// What charging usage to the run touches.
    fn charge(&self) -> Charge {
        Charge { run: self.run.clone() }
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

#[cfg(test)]
mod tests {
    use futures::FutureExt;

    use super::*;
    use crate::engine::store::ObservedStore;

    async fn stored_run() -> (Arc<ObservedStore>, RunStore, gw::Run) {
        let counted = Arc::new(ObservedStore::new(RunStore::open(":memory:").unwrap()));
        let store = RunStore::from_storage(counted.clone());
        let run = gw::Run { run_id: "r".into(), state: gw::RunState::Running as i32, ..Default::default() };
        store.create(run.clone(), gw::RunPipelineRequest::default()).await.unwrap();
        (counted, store, run)
    }

    fn scored(i: u32) -> Event {
        Event::RecordScored(gw::RecordResult { index: i, ..Default::default() })
    }

    #[tokio::test]
    async fn relay_hands_over_every_event_in_order_those_left_at_the_end_included() {
        let ctx = RunCtx::new(gw::Run { run_id: "r".into(), ..Default::default() }, 0, None);
        let (tx, mut rx) = mpsc::unbounded_channel::<u32>();
        let call = async move {
            for n in 0..10 {
                tx.send(n).unwrap();
                tokio::task::yield_now().await;
            }
            // Still in the channel when the call ends.
            for n in 10..20 {
                tx.send(n).unwrap();
            }
            "done"
        };
        let seen = Mutex::new(Vec::new());
        let relay = |n| {
            seen.lock().unwrap().push(n);
            async { Ok(()) }
        };
        assert_eq!(ctx.relay_with(&mut rx, call, relay).await, Ok("done"));
        assert_eq!(*seen.lock().unwrap(), (0..20).collect::<Vec<u32>>());
    }

    #[tokio::test]
    async fn a_failed_relay_stops_the_call() {
        let ctx = RunCtx::new(gw::Run { run_id: "r".into(), ..Default::default() }, 0, None);
        let (tx, mut rx) = mpsc::unbounded_channel::<u32>();
        let (held, dropped) = oneshot::channel::<()>();
        let call = async move {
            let _held = held;
            tx.send(1).unwrap();
            std::future::pending::<()>().await;
        };
        let relay = |_| async { Err(StageError::Unavailable("run store down".into())) };
        let out = ctx.relay_with(&mut rx, call, relay).await;
        assert_eq!(out, Err(StageError::Unavailable("run store down".into())));
        assert!(dropped.await.is_err(), "the call was dropped");
    }

    #[tokio::test]
    async fn queued_writes_are_stored_in_order_many_per_transaction() {
        let (counted, store, run) = stored_run().await;
        let ctx = RunCtx::new(run, 0, Some(store.clone()));
        let mut writes = Writes::default();
        for i in 0..300u32 {
            writes.push(
                ctx.checkpoint_queued(&format!("rec:{i:04}"), &gw::RecordResult { index: i, ..Default::default() }),
            );
            ctx.add_done();
            writes.push(ctx.emit_queued(scored(i)));
        }
        writes.flush().await.unwrap();
        let events = store.events_after("r", 0).await.unwrap();
        assert_eq!(events.iter().map(|e| e.sequence).collect::<Vec<_>>(), (1..=300).collect::<Vec<u64>>());
        let indices: Vec<u32> = events
            .iter()
            .map(|e| match &e.event {
                Some(Event::RecordScored(r)) => r.index,
                other => panic!("unexpected event {other:?}"),
            })
            .collect();
        assert_eq!(indices, (0..300).collect::<Vec<u32>>(), "events keep the order they were queued in");
        assert_eq!(store.checkpoints("r", "rec:").await.unwrap().len(), 300);
        let summary = store.get("r").await.unwrap().unwrap().run;
        assert_eq!((summary.last_sequence, summary.records_done), (300, 300));
        // 600 writes queued before the writer ran: two transactions (512 + the rest), each with
        // the run's summary once.
        assert_eq!(counted.batches(), [513, 89]);
    }

    #[tokio::test]
    async fn a_failed_batch_fails_every_write_in_it_and_takes_no_sequence() {
        let (counted, store, run) = stored_run().await;
        let ctx = RunCtx::new(run, 0, Some(store.clone()));
        counted.set_failing(true);
        let mut writes = Writes::default();
        writes.push(ctx.checkpoint_queued("k", &gw::RecordResult::default()));
        writes.push(ctx.emit_queued(scored(1)));
        writes.push(ctx.emit_queued(scored(2)));
        let e = writes.flush().await.unwrap_err();
        assert!(e.to_string().contains("run store down"), "{e}");
        let mut again = Writes::default();
        again.push(ctx.emit_queued(scored(3)));
        assert!(again.next_error().now_or_never().is_none(), "pending while the write is under way");
        counted.set_failing(false);
        // The earlier write may still be failing; wait for this one by itself.
        ctx.emit(scored(4)).await.unwrap();
        let seqs: Vec<u64> = store.events_after("r", 0).await.unwrap().iter().map(|e| e.sequence).collect();
        assert_eq!(*seqs.last().unwrap(), seqs.len() as u64, "gap-free after a failed batch: {seqs:?}");
        assert!(store.checkpoints("r", "k").await.unwrap().is_empty(), "the failed batch's checkpoint is not kept");
    }
}
