//! The engine: starts, executes, watches and controls runs (see the crate's documentation).

mod control;
mod help;
mod records;
mod retention;
mod supervise;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use assay_domain::StageError;
use assay_proto::common::v1 as pb;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::run_event::Event;
use tokio::sync::watch;

use crate::clock::{is_terminal, now};
use crate::ctx::{RunCtx, stored_audit_log};
use crate::pipeline::{Pipeline, PipelineFactory, RunOutcome};
use crate::spend::SpendCaps;
use crate::store::{self, RunStore};
use crate::{metrics, stream};

fn check_label(label: &str) -> Result<(), StageError> {
    let max = assay_domain::limits::MAX_LABEL_BYTES;
    if label.len() > max {
        return Err(StageError::invalid("label", format!("is {} bytes; the limit is {max} bytes", label.len())));
    }
    Ok(())
}

/// A budget's limits: each set one positive and finite.
fn check_budget(budget: Option<&gw::RunBudget>) -> Result<(), StageError> {
    let Some(b) = budget else { return Ok(()) };
    let mut v = assay_domain::Violations::default();
    if b.max_tokens == Some(0) {
        v.push("budget.max_tokens", "must be at least 1 (leave it unset for no token limit)");
    }
    if let Some(usd) = b.max_cost_usd
        && !(usd.is_finite() && usd > 0.0)
    {
        v.push("budget.max_cost_usd", format!("must be a finite number above 0 (US dollars), got {usd}"));
    }
    v.into_result()
}

/// A run being executed by this gateway.
struct Live {
    ctx: Arc<RunCtx>,
    pipeline: Arc<dyn Pipeline>,
    /// Set once the run's executor has returned (the run ended, or this gateway is stopping).
    done: watch::Sender<bool>,
    /// Set when this gateway lost the run's lease (a shared store): the executor quits without
    /// touching the run, which another gateway executes now.
    lost: watch::Sender<bool>,
}

impl Live {
    fn new(ctx: Arc<RunCtx>, pipeline: Arc<dyn Pipeline>) -> Arc<Self> {
        Arc::new(Self { ctx, pipeline, done: watch::channel(false).0, lost: watch::channel(false).0 })
    }
}

/// How often a gateway on a shared store looks for controls posted by other gateways for the runs
/// it executes.
const CONTROL_POLL: std::time::Duration = std::time::Duration::from_millis(200);
/// How long a control posted for another gateway's run waits to be taken.
const CONTROL_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// How long a cancel waits for the run's executor to stop before answering with the state it
/// has then (every await of a pipeline is a cancellation point, so this is a safety bound only).
const CANCEL_WAIT: std::time::Duration = std::time::Duration::from_secs(30);

/// The run engine. Cheap to clone.
#[derive(Clone)]
pub struct Engine {
    store: RunStore,
    factory: Arc<dyn PipelineFactory>,
    live: Arc<Mutex<HashMap<String, Arc<Live>>>>,
    /// Set when this gateway stops: executors quit without touching stored state, so the next
    /// gateway resumes the runs where they were.
    halt: Arc<watch::Sender<bool>>,
    /// Runs executing now (started, resumed and Evaluate calls), and the most accepted at once:
    /// beyond it a new run is refused with RESOURCE_EXHAUSTED instead of queueing without bound.
    active: Arc<AtomicUsize>,
    max_active: usize,
    /// Spend per backend and the daily caps.
    spend: Option<Arc<SpendCaps>>,
    /// Runs other gateways execute that this one helps with (spread runs).
    helping: Arc<Mutex<std::collections::HashSet<String>>>,
}

/// One executing run's place under [`Engine::with_max_active_runs`].
struct ActiveSlot(Arc<AtomicUsize>);

impl Drop for ActiveSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Engine {
    pub fn new(store: RunStore, factory: Arc<dyn PipelineFactory>) -> Self {
        let active = Arc::default();
        metrics::observe(&store, &active);
        Self {
            store,
            factory,
            live: Arc::default(),
            halt: Arc::new(watch::channel(false).0),
            active,
            max_active: usize::MAX,
            spend: None,
            helping: Arc::default(),
        }
    }

    /// Hold runs to the backends' daily spend caps (a no-op when no backend has one).
    #[must_use]
    pub fn with_spend_caps(mut self, caps: Arc<SpendCaps>) -> Self {
        self.spend = caps.any().then_some(caps);
        self
    }

    /// The capped backends a run of `request` uses; refused (RESOURCE_EXHAUSTED) when one of
    /// them reached its daily cap.
    async fn admit_spend(
        &self,
        request: &gw::RunPipelineRequest,
    ) -> Result<Option<(Arc<SpendCaps>, std::collections::BTreeSet<String>)>, StageError> {
        let Some(caps) = &self.spend else { return Ok(None) };
        let backends = caps.capped_backends_of(request);
        caps.admit(&backends).await?;
        Ok(Some((caps.clone(), backends)))
    }

    /// `ctx` held to the caps of the capped backends its request uses.
    fn capped(&self, ctx: RunCtx, spend: Option<(Arc<SpendCaps>, std::collections::BTreeSet<String>)>) -> RunCtx {
        match spend {
            Some((caps, backends)) => ctx.with_spend(caps, backends),
            None => ctx,
        }
    }

    /// Refuse new runs (RunPipeline, Evaluate) while `n` are executing (0 = no limit). Runs
    /// resumed after a restart are always taken back.
    #[must_use]
    pub fn with_max_active_runs(mut self, n: usize) -> Self {
        self.max_active = if n == 0 { usize::MAX } else { n };
        self
    }

    /// Runs executing now.
    pub fn active_runs(&self) -> usize {
        self.active.load(Ordering::SeqCst)
    }

    /// A place for a new run, or RESOURCE_EXHAUSTED when the gateway is full.
    fn admit(&self) -> Result<ActiveSlot, StageError> {
        let max = self.max_active;
        self.active.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| (n < max).then_some(n + 1)).map_err(|n| {
            StageError::ResourceExhausted(format!(
                "the gateway is executing {n} runs, its limit (gateway.max_active_runs = {max}); retry later"
            ))
        })?;
        Ok(ActiveSlot(self.active.clone()))
    }

    /// A place for a resumed run (never refused).
    fn readmit(&self) -> ActiveSlot {
        self.active.fetch_add(1, Ordering::SeqCst);
        ActiveSlot(self.active.clone())
    }

    /// Stop executing runs (gateway shutdown). Unfinished runs stay RUNNING in the store.
    pub fn halt(&self) {
        self.halt.send_replace(true);
    }

    pub fn store(&self) -> &RunStore {
        &self.store
    }

    fn live(&self, run_id: &str) -> Option<Arc<Live>> {
        self.live.lock().ok().and_then(|m| m.get(run_id).cloned())
    }

    fn new_run(pipeline: &dyn Pipeline, label: String, budget: Option<gw::RunBudget>, open: bool) -> gw::Run {
        let t = now();
        gw::Run {
            run_id: uuid::Uuid::now_v7().to_string(),
            kind: pipeline.kind() as i32,
            state: gw::RunState::Running as i32,
            label,
            created_at: Some(t),
            updated_at: Some(t),
            last_sequence: 0,
            records_total: pipeline.total(),
            records_done: 0,
            result: None,
            usage: Some(pb::Usage::default()),
            progress: None,
            audit_log: Vec::new(),
            budget,
            budget_exhausted: String::new(),
            open,
            gateways: Vec::new(),
        }
    }

    /// Parse, store and start a pipeline; returns the run id (its first event, RunStarted, is stored
    /// before this returns).
    pub async fn start(&self, mut request: gw::RunPipelineRequest) -> Result<String, StageError> {
        check_label(&request.label)?;
        check_budget(request.budget.as_ref())?;
        let pipeline = self.factory.parse(&request)?;
        // An open run's records become rows; its request is stored without them.
        let rows = if request.open {
            let inline = self.factory.take_records(&mut request);
            Some(pipeline.check_records(inline)?)
        } else {
            None
        };
        let spend = self.admit_spend(&request).await?;
        let slot = self.admit()?;
        let run = Self::new_run(pipeline.as_ref(), request.label.clone(), request.budget, request.open);
        let run_id = run.run_id.clone();
        self.store.create(run.clone(), request).await?;
        if let Some(rows) = rows {
            self.store.append_records(&run_id, rows, false, pipeline.max_records()).await?;
        }
        let ctx = Arc::new(self.capped(RunCtx::new(run, 0, Some(self.store.clone())), spend));
        ctx.log
            .emit(Event::Started(gw::RunStarted { kind: pipeline.kind() as i32, records: pipeline.total() }))
            .await?;
        self.spawn(Live::new(ctx, pipeline), slot);
        Ok(run_id)
    }

    /// Run a pipeline to the end without persisting its progress (Evaluate), then store it once,
    /// finished, so GetRun and ListRuns see it. Bad input, and any error that would fail the run,
    /// are returned as errors.
    pub async fn run_unpersisted(&self, request: gw::RunPipelineRequest) -> Result<gw::Run, StageError> {
        check_budget(request.budget.as_ref())?;
        let pipeline = self.factory.parse(&request)?;
        let spend = self.admit_spend(&request).await?;
        if request.open {
            return Err(StageError::invalid("open", "an evaluation answered at once cannot be open; use RunPipeline"));
        }
        let _slot = self.admit()?;
        let run = Self::new_run(pipeline.as_ref(), request.label.clone(), request.budget, false);
        let ctx = self.capped(RunCtx::new(run, 0, None), spend);
        let outcome = ctx.spending.scope(pipeline.run(&ctx)).await;
        let outcome = outcome?;
        let result = gw::RunResult { result: outcome.result, error: String::new() };
        ctx.update(|r| {
            r.state = outcome.state as i32;
            r.result = Some(result.clone());
            r.last_sequence = 1;
            r.updated_at = Some(now());
        });
        let run = ctx.snapshot();
        let (store, stored, request) = (self.store.clone(), run.clone(), request);
        // Stored off the response path.
        tokio::spawn(tracing::Instrument::in_current_span(async move {
            let event = gw::RunEvent {
                run_id: stored.run_id.clone(),
                sequence: 1,
                time: stored.updated_at,
                event: Some(Event::Completed(gw::RunCompleted { state: stored.state, result: stored.result.clone() })),
            };
            let saved = async {
                let run_id = stored.run_id.clone();
                store.create(stored, request).await?;
                store.write(&run_id, vec![store::RunWrite::Event(Box::new(event))]).await
            };
            if let Err(e) = saved.await {
                tracing::warn!(error = %e, "could not store the evaluation run");
            }
        }));
        Ok(run)
    }

    fn spawn(&self, live: Arc<Live>, slot: ActiveSlot) {
        let run_id = live.ctx.run_id().to_string();
        if let Ok(mut m) = self.live.lock() {
            m.insert(run_id.clone(), live.clone());
        }
        let this = self.clone();
        let mut halt = self.halt.subscribe();
        let mut lost = live.lost.subscribe();
        tokio::spawn(async move {
            let _slot = slot;
            let ctx = &live.ctx;
            // Every stage call of the pipeline waits at the run's pause gate.
            let gate = ctx.gate.run_gate();
            tokio::select! {
                outcome = gate.scope(ctx.spending.scope(live.pipeline.run(ctx))) => {
                    if let Err(e) = this.finish(ctx, outcome).await {
                        tracing::error!(run_id = %run_id, error = %e, "could not record the end of a run");
                    }
                }
                () = async { let _ = halt.wait_for(|h| *h).await; } => {
                    tracing::info!(run_id = %run_id, "gateway stopping; run left to resume");
                    if let Err(e) = this.store.release(&run_id).await {
                        tracing::warn!(run_id = %run_id, error = %e, "could not release the run's lease");
                    }
                }
                () = async { let _ = lost.wait_for(|l| *l).await; } => {
                    tracing::warn!(run_id = %run_id, "lease lost; another gateway executes the run now");
                }
            }
            if let Ok(mut m) = this.live.lock() {
                m.remove(&run_id);
            }
            live.done.send_replace(true);
        });
    }

    /// Record how a run ended: its state, result and the RunCompleted event.
    async fn finish(&self, ctx: &RunCtx, outcome: Result<RunOutcome, StageError>) -> Result<(), StageError> {
        ctx.spending.record_budget_stop();
        let (state, result) = match outcome {
            Ok(o) => (o.state, gw::RunResult { result: o.result, error: String::new() }),
            Err(StageError::Cancelled(_)) if ctx.gate.is_cancelled() => {
                (gw::RunState::Cancelled, gw::RunResult { result: None, error: String::new() })
            }
            Err(e) => {
                tracing::warn!(run_id = %ctx.run_id(), error = %e, "run failed");
                (gw::RunState::Failed, gw::RunResult { result: None, error: e.to_string() })
            }
        };
        ctx.update(|r| {
            r.state = state as i32;
            r.result = Some(result.clone());
        });
        ctx.log.emit(Event::Completed(gw::RunCompleted { state: state as i32, result: Some(result) })).await
    }

    /// Up to `limit` of a run's stored results from position `first` on, by position, encoded (see
    /// [`crate::Results`]).
    pub async fn results_page(
        &self,
        run_id: &str,
        first: u64,
        limit: usize,
    ) -> Result<Vec<(u64, Vec<u8>)>, StageError> {
        crate::ctx::stored_results_page(&self.store, run_id, first, limit).await
    }

    /// A run's summary (with result).
    pub async fn get(&self, run_id: &str) -> Result<gw::Run, StageError> {
        let mut run = match self.live(run_id) {
            Some(live) => live.ctx.snapshot(),
            None => self
                .store
                .get(run_id)
                .await?
                .map(|s| s.run)
                .ok_or_else(|| StageError::NotFound(format!("run {run_id}")))?,
        };
        run.audit_log = stored_audit_log(&self.store, run_id).await?;
        Ok(run)
    }

    /// Replay events after `after`, then follow live ones until the run completes.
    pub async fn watch(
        &self,
        run_id: &str,
        after: u64,
    ) -> Result<impl futures::Stream<Item = Result<gw::RunEvent, StageError>> + Send + 'static, StageError> {
        // Subscribe before reading the past, so nothing falls between the two.
        let live_rx = self.live(run_id).map(|l| l.ctx.log.subscribe());
        let ended = match &live_rx {
            Some(_) => false,
            None => {
                let stored =
                    self.store.get(run_id).await?.ok_or_else(|| StageError::NotFound(format!("run {run_id}")))?;
                is_terminal(stored.run.state)
            }
        };
        let past = self.store.events_after(run_id, after).await?;
        let finished = ended || past.iter().any(|e| matches!(e.event, Some(Event::Completed(_))));
        // A run this gateway does not execute is followed from the store: another gateway on a
        // shared store executes it (or will take it over), or this one is about to resume it
        // (just restarted).
        let poll =
            (!finished && (self.store.shared() || live_rx.is_none())).then(|| (self.store.clone(), run_id.to_string()));
        Ok(stream::replay_then_follow(past, live_rx.filter(|_| !finished), after, poll))
    }
}
