//! A run's event log: one writer task per run assigns gap-free sequences, persists events and
//! checkpoints (grouped into transactions), then broadcasts the events; a run kept in memory
//! (Evaluate) writes its checkpoints to a map instead.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};

use assay_domain::StageError;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::run_event::Event;
use tokio::sync::{broadcast, mpsc, oneshot};

use super::summary::Summary;
use crate::clock::now;
use crate::store::{RunStore, RunWrite};

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

/// Writes a run's writer puts in one transaction at most.
const MAX_BATCH: usize = 512;

/// A queued write of a run ([`EventLog::emit_queued`], [`super::Checkpoints::queued`]): resolves
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

/// A run's event log (and the storage of its checkpoints). Cheap to clone (shared).
#[derive(Clone)]
pub struct EventLog(Arc<Inner>);

struct Inner {
    run_id: String,
    persistence: Persistence,
    events: broadcast::Sender<Arc<gw::RunEvent>>,
    /// The run's event writer: one task per run assigns sequences, persists and broadcasts, in
    /// the order events were sent. No caller holds a lock while it waits, so a producer that is
    /// left unpolled (in a buffered stream whose consumer is itself emitting) cannot block the
    /// others, and a caller dropped mid-emit leaves no sequence half-used.
    writer: mpsc::UnboundedSender<Append>,
    summary: Summary,
}

impl EventLog {
    /// The log of a run; `seq` is the last sequence already stored. Starts the run's event writer
    /// (on the current Tokio runtime).
    pub(crate) fn new(run_id: String, seq: u64, store: Option<RunStore>, summary: Summary) -> Self {
        // Watchers of a stored run may lag behind by this many events before they must reattach
        // (from the store, by sequence); a run kept in memory has no watchers. The ring holds
        // pointers, allocated up front: a few KiB per run, however many runs are live.
        let capacity = if store.is_some() { 1024 } else { 1 };
        let events = broadcast::channel(capacity).0;
        let (writer, rx) = mpsc::unbounded_channel();
        tokio::spawn(write_events(run_id.clone(), seq, store.clone(), summary.run.clone(), events.clone(), rx));
        let persistence = match store {
            Some(s) => Persistence::Store(s),
            None => Persistence::Memory(Mutex::default()),
        };
        Self(Arc::new(Inner { run_id, persistence, events, writer, summary }))
    }

    pub(crate) fn run_id(&self) -> &str {
        &self.0.run_id
    }

    /// Whether events and checkpoints are kept in memory only (Evaluate).
    pub fn is_ephemeral(&self) -> bool {
        matches!(self.0.persistence, Persistence::Memory(_))
    }

    /// The run's stored events as they are written, for a watcher.
    pub(crate) fn subscribe(&self) -> broadcast::Receiver<Arc<gw::RunEvent>> {
        self.0.events.subscribe()
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
        match self.0.writer.send((op, ack)) {
            Ok(()) => Written(WrittenState::Queued(done)),
            Err(_) => Written::done(Err(StageError::Internal("the run's event writer stopped".into()))),
        }
    }

    /// Store `bytes` under `key`, in order with the run's events.
    pub(crate) async fn put(&self, key: &str, bytes: Vec<u8>) -> Result<(), StageError> {
        self.put_queued(key, bytes).await
    }

    pub(crate) fn put_queued(&self, key: &str, bytes: Vec<u8>) -> Written {
        match &self.0.persistence {
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

    /// At most `limit` of the run's stored events after sequence `after`, in order (none for a run
    /// kept in memory): what a resumed executor reads to know what was said before it.
    pub async fn stored_events(&self, after: u64, limit: usize) -> Result<Vec<gw::RunEvent>, StageError> {
        match &self.0.persistence {
            Persistence::Store(store) => store.events_page(&self.0.run_id, after, limit).await,
            Persistence::Memory(_) => Ok(Vec::new()),
        }
    }

    /// The stored values whose key starts with `prefix`, by key.
    pub(crate) async fn raw(&self, prefix: &str) -> Result<Vec<(String, Vec<u8>)>, StageError> {
        match &self.0.persistence {
            Persistence::Store(store) => store.checkpoints(&self.0.run_id, prefix).await,
            Persistence::Memory(m) => Ok(m
                .lock()
                .map_err(|_| StageError::Internal("checkpoint lock poisoned".into()))?
                .range(prefix.to_string()..)
                .take_while(|(k, _)| k.starts_with(prefix))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()),
        }
    }

    /// Up to `limit` checkpoints under `prefix` sorting after `after`, by key.
    pub(crate) async fn raw_page(
        &self,
        prefix: &str,
        after: &str,
        limit: usize,
    ) -> Result<Vec<(String, Vec<u8>)>, StageError> {
        match &self.0.persistence {
            Persistence::Store(store) => store.checkpoints_page(&self.0.run_id, prefix, after, limit).await,
            Persistence::Memory(m) => Ok(m
                .lock()
                .map_err(|_| StageError::Internal("checkpoint lock poisoned".into()))?
                .range(prefix.to_string()..)
                .take_while(|(k, _)| k.starts_with(prefix))
                .filter(|(k, _)| k.as_str() > after)
                .take(limit)
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()),
        }
    }

    /// The checkpoints stored under any of `keys`.
    pub(crate) async fn raw_keys(&self, keys: Vec<String>) -> Result<Vec<(String, Vec<u8>)>, StageError> {
        match &self.0.persistence {
            Persistence::Store(store) => store.checkpoints_get(&self.0.run_id, keys).await,
            Persistence::Memory(m) => {
                let m = m.lock().map_err(|_| StageError::Internal("checkpoint lock poisoned".into()))?;
                Ok(keys.into_iter().filter_map(|k| m.get(&k).cloned().map(|v| (k, v))).collect())
            }
        }
    }

    /// Store checkpoints `writes` (key, value) only if the run is in one of the `expect` states,
    /// atomically: the stored state is checked in the transaction that writes them
    /// (FAILED_PRECONDITION naming the state found, nothing written, otherwise). `state`: the
    /// run's state once they are (a `RunStateChanged` event with `reason` is among the writes).
    pub(crate) async fn guarded(
        &self,
        expect: &[gw::RunState],
        checkpoints: Vec<(String, Vec<u8>)>,
        state: Option<(gw::RunState, &str)>,
    ) -> Result<(), StageError> {
        let current = self.0.summary.state();
        if !expect.contains(&current) {
            return Err(StageError::FailedPrecondition(format!("run {} is {}", self.0.run_id, current.as_str_name())));
        }
        let mut writes: Vec<Write> = checkpoints.into_iter().map(|(k, v)| Write::Checkpoint(k, v)).collect();
        if let Some((s, reason)) = state {
            writes.push(Write::Event(Box::new(Event::StateChanged(gw::RunStateChanged {
                state: s as i32,
                reason: reason.to_string(),
            }))));
        }
        let guarded =
            Guarded { expect: expect.iter().map(|s| *s as i32).collect(), writes, state: state.map(|(s, _)| s as i32) };
        match &self.0.persistence {
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
                    self.0.summary.update(|r| r.state = s as i32);
                }
                for e in events {
                    self.emit_queued(*e).await?;
                }
                Ok(())
            }
        }
    }
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
