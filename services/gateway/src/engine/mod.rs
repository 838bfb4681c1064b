//! The run engine: durable runs of any pipeline. It stores the request, gives a run gap-free event
//! sequences (persisted, then broadcast), replays then follows them for watchers, pauses, resumes and
//! cancels, keeps checkpoints, and after a restart rebuilds each unfinished pipeline from its stored
//! request through the [`PipelineFactory`]. It knows no pipeline kinds: a pipeline is a
//! [`Pipeline`] (see `crate::pipelines`).

mod ctx;
mod meter;
mod metrics;
mod spend;
pub mod store;
mod stream;

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use assay_domain::StageError;
use assay_proto::common::v1 as pb;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::control_run_request::Action;
use assay_proto::gateway::v1::run_event::Event;
use tokio::sync::watch;

pub use ctx::{RunCtx, Writes, Written, stage_gate};
use ctx::{now, state_name};
pub use meter::metered;
pub use spend::SpendCaps;
pub use store::{PostgresStore, RunStorage, RunStore, SqliteStore, StoredRun};

/// How a pipeline ended: its final state (SUCCEEDED, PARTIAL, FAILED or CANCELLED) and result.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOutcome {
    pub state: gw::RunState,
    pub result: Option<gw::run_result::Result>,
}

/// What a pipeline-specific control did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ControlEffect {
    /// Taken; the run goes on.
    Taken,
    /// Taken; the run ends because of it (the engine answers once it has).
    Ends,
}

/// One pipeline run, parsed from its request.
#[async_trait::async_trait]
pub trait Pipeline: Send + Sync {
    fn kind(&self) -> gw::PipelineKind;
    /// Units of work the run reports progress in (records), 0 when it has none.
    fn total(&self) -> u32;
    /// Run to the end (or until cancelled), resuming from the run's checkpoints. An error fails
    /// the run; observe [`RunCtx::gate`] before starting new work.
    async fn run(&self, ctx: &RunCtx) -> Result<RunOutcome, StageError>;
    /// A pipeline-specific control: accept, review, edit_section, and resume while the run awaits
    /// a human. Validate it against the run's state, then post it with [`RunCtx::post_action`]
    /// (which audits it) for the run to consume.
    async fn control(&self, ctx: &RunCtx, request: &gw::ControlRunRequest) -> Result<ControlEffect, StageError> {
        let _ = (ctx, request);
        Err(StageError::FailedPrecondition(
            "accept, review and edit_section apply to targeted refinement runs only".into(),
        ))
    }
}

/// Builds pipelines from requests: at start (the request is parsed once, here) and after a
/// restart (from the stored request).
pub trait PipelineFactory: Send + Sync {
    fn parse(&self, request: &gw::RunPipelineRequest) -> Result<Arc<dyn Pipeline>, StageError>;
}

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

fn is_terminal(state: i32) -> bool {
    [gw::RunState::Succeeded, gw::RunState::Partial, gw::RunState::Failed, gw::RunState::Cancelled]
        .iter()
        .any(|s| *s as i32 == state)
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

    fn new_run(pipeline: &dyn Pipeline, label: String, budget: Option<gw::RunBudget>) -> gw::Run {
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
        }
    }

    /// Parse, store and start a pipeline; returns the run id (its first event, RunStarted, is stored
    /// before this returns).
    pub async fn start(&self, request: gw::RunPipelineRequest) -> Result<String, StageError> {
        check_label(&request.label)?;
        check_budget(request.budget.as_ref())?;
        let pipeline = self.factory.parse(&request)?;
        let spend = self.admit_spend(&request).await?;
        let slot = self.admit()?;
        let run = Self::new_run(pipeline.as_ref(), request.label.clone(), request.budget);
        let run_id = run.run_id.clone();
        self.store.create(run.clone(), request).await?;
        let ctx = Arc::new(self.capped(RunCtx::new(run, 0, Some(self.store.clone())), spend));
        ctx.emit(Event::Started(gw::RunStarted { kind: pipeline.kind() as i32, records: pipeline.total() })).await?;
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
        let _slot = self.admit()?;
        let run = Self::new_run(pipeline.as_ref(), request.label.clone(), request.budget);
        let ctx = self.capped(RunCtx::new(run, 0, None), spend);
        let outcome = ctx.budget_scope(pipeline.run(&ctx)).await;
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
            let gate = ctx.run_gate();
            tokio::select! {
                outcome = gate.scope(ctx.budget_scope(live.pipeline.run(ctx))) => {
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
        ctx.record_budget_stop();
        let (state, result) = match outcome {
            Ok(o) => (o.state, gw::RunResult { result: o.result, error: String::new() }),
            Err(StageError::Cancelled(_)) if ctx.is_cancelled() => {
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
        ctx.emit(Event::Completed(gw::RunCompleted { state: state as i32, result: Some(result) })).await
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
        run.audit_log = ctx::stored_audit_log(&self.store, run_id).await?;
        Ok(run)
    }

    /// Replay events after `after`, then follow live ones until the run completes.
    pub async fn watch(
        &self,
        run_id: &str,
        after: u64,
    ) -> Result<impl futures::Stream<Item = Result<gw::RunEvent, StageError>> + Send + 'static, StageError> {
        // Subscribe before reading the past, so nothing falls between the two.
        let live_rx = self.live(run_id).map(|l| l.ctx.events.subscribe());
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

    /// Pause, resume or cancel (the engine's), or a pipeline-specific control. Every action taken
    /// is in the run's audit log with its actor and reason.
    pub async fn control(&self, req: gw::ControlRunRequest) -> Result<gw::Run, StageError> {
        let Some(action) = req.action.clone() else {
            return Err(StageError::invalid(
                "action",
                "is required (pause, resume, cancel, accept, review or edit_section)",
            ));
        };
        let run_id = req.run_id.clone();
        let Some(live) = self.live(&run_id) else {
            let stored = self.store.get(&run_id).await?.ok_or_else(|| StageError::NotFound(format!("run {run_id}")))?;
            if self.store.shared() && !is_terminal(stored.run.state) {
                return self.control_elsewhere(req).await;
            }
            return Err(StageError::FailedPrecondition(format!(
                "run {run_id} is not in progress (state {})",
                gw::RunState::try_from(stored.run.state).map(|s| s.as_str_name()).unwrap_or("unknown")
            )));
        };
        // The caller's text quoted and escaped (`?`): never a raw newline or escape in a log line.
        tracing::info!(run_id = %run_id, actor = ?req.actor, reason = ?req.reason, "run control");
        let ctx = &live.ctx;
        // One control at a time on a run (every control of a run comes here, on the gateway
        // executing it): the first decides, the next sees the state it left. Each is taken only
        // in the state it was checked against, its audit entry written with its effect.
        let _one = ctx.controls.lock().await;
        let state = ctx.state();
        if is_terminal(state as i32) {
            return Err(StageError::FailedPrecondition(format!(
                "run {run_id} is not in progress (state {})",
                state_name(state as i32)
            )));
        }
        let awaiting = state == gw::RunState::AwaitingHuman;
        let effect = match action {
            Action::Pause(_) => {
                match state {
                    gw::RunState::AwaitingHuman => {
                        return Err(StageError::FailedPrecondition(format!(
                            "run {run_id} is waiting for a human decision (RUN_STATE_AWAITING_HUMAN): edit_section, resume, accept or review"
                        )));
                    }
                    gw::RunState::Paused => {
                        return Err(StageError::FailedPrecondition(format!(
                            "run {run_id} is already paused (RUN_STATE_PAUSED): resume or cancel it"
                        )));
                    }
                    gw::RunState::Unspecified
                    | gw::RunState::Pending
                    | gw::RunState::Running
                    | gw::RunState::Succeeded
                    | gw::RunState::Partial
                    | gw::RunState::Failed
                    | gw::RunState::Cancelled => {}
                }
                // The gate closes first: no stage call starts once the pause is taken.
                let was = ctx.paused.send_replace(true);
                if let Err(e) = ctx.control_write(&req, "pause", &[state], Some(gw::RunState::Paused)).await {
                    ctx.paused.send_replace(was);
                    return Err(e);
                }
                ControlEffect::Taken
            }
            Action::Resume(_) if awaiting => {
                let effect = live.pipeline.control(ctx, &req).await?;
                // Decided: the run no longer waits for a human (a concurrent accept or review
                // finds it running); the pipeline goes on once it takes the posted resume.
                ctx.set_state(gw::RunState::Running, "resumed by a human").await?;
                // A run that escalated while paused goes on too.
                ctx.paused.send_replace(false);
                effect
            }
            Action::Resume(_) => {
                if state != gw::RunState::Paused {
                    return Err(StageError::FailedPrecondition(format!(
                        "run {run_id} is not paused (state {}); resume applies to a paused run or one waiting for a human",
                        state_name(state as i32)
                    )));
                }
                ctx.control_write(&req, "resume", &[gw::RunState::Paused], Some(gw::RunState::Running)).await?;
                ctx.paused.send_replace(false);
                ControlEffect::Taken
            }
            Action::Cancel(_) => {
                ctx.control_write(&req, "cancel", &[state], None).await?;
                ctx.paused.send_replace(false);
                ctx.cancelled.send_replace(true);
                ControlEffect::Ends
            }
            Action::Accept(_) | Action::EditSection(_) | Action::Review(_) => live.pipeline.control(ctx, &req).await?,
        };
        if effect == ControlEffect::Ends {
            // A human ended the run: a pause no longer holds it (its last stage calls, the
            // self-refine hook say, run to their end).
            ctx.paused.send_replace(false);
            // Answer once the run has stopped (in-flight calls dropped, its end recorded), so the
            // state returned is the one the run ends in; the control lock is held until then, so
            // a control that came meanwhile finds the run ended.
            let mut done = live.done.subscribe();
            if tokio::time::timeout(CANCEL_WAIT, done.wait_for(|d| *d)).await.is_err() {
                tracing::warn!(run_id = %run_id, "control: run still stopping after {CANCEL_WAIT:?}");
            }
            return self.get(&run_id).await;
        }
        Ok(ctx.snapshot())
    }

    /// A control for a run another gateway executes (shared store): posted for it, answered
    /// once that gateway has taken it, with the run as stored then.
    async fn control_elsewhere(&self, req: gw::ControlRunRequest) -> Result<gw::Run, StageError> {
        let run_id = req.run_id.clone();
        let id = self.store.post_control(req).await?;
        let deadline = tokio::time::Instant::now() + CONTROL_WAIT;
        loop {
            match self.store.control_outcome(id).await? {
                store::ControlOutcome::Taken => return self.get(&run_id).await,
                // The executing gateway's answer, as it would have given it.
                store::ControlOutcome::Refused(r) => {
                    self.store.remove_control(id).await?;
                    let status =
                        tonic::Status::with_details(tonic::Code::from_i32(r.code), r.message, r.details.into());
                    return Err(assay_rpc::from_status(status));
                }
                store::ControlOutcome::Pending => {}
            }
            if tokio::time::Instant::now() >= deadline {
                self.store.remove_control(id).await?;
                return Err(StageError::Unavailable(format!(
                    "run {run_id}: the gateway executing it did not take the control within {CONTROL_WAIT:?}; retry"
                )));
            }
            tokio::time::sleep(CONTROL_POLL / 2).await;
        }
    }

    /// On a shared store, keep this gateway's runs and take over orphaned ones, until halted:
    /// renew the leases of the runs executing here (a run whose lease was lost stops here), take
    /// controls other gateways posted for them, and resume unfinished runs whose lease expired.
    /// Nothing to do on a store of one gateway.
    pub async fn supervise(&self, lease: std::time::Duration) {
        if !self.store.shared() {
            return;
        }
        let mut halt = self.halt.subscribe();
        let renew_every = lease / 3;
        let mut last_renew = tokio::time::Instant::now();
        loop {
            tokio::select! {
                () = tokio::time::sleep(CONTROL_POLL) => {}
                _ = halt.wait_for(|h| *h) => return,
            }
            let live: Vec<(String, Arc<Live>)> =
                self.live.lock().map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect()).unwrap_or_default();
            let ids: Vec<String> = live.iter().map(|(k, _)| k.clone()).collect();
            match self.store.posted_controls(&ids).await {
                Ok(posted) => {
                    for p in posted {
                        let kept = match self.control(p.request.clone()).await {
                            Ok(_) => self.store.remove_control(p.id).await,
                            // Kept, with the refusal, for the gateway that posted it to answer with.
                            Err(e) => {
                                tracing::info!(run_id = %p.request.run_id, error = %e, "posted control refused");
                                let status = assay_rpc::to_status(e);
                                let refusal = store::ControlRefusal {
                                    code: status.code() as i32,
                                    message: status.message().to_string(),
                                    details: status.details().to_vec(),
                                };
                                self.store.refuse_control(p.id, refusal).await
                            }
                        };
                        if let Err(e) = kept {
                            tracing::warn!(error = %e, "could not record a posted control's outcome");
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "could not read posted controls"),
            }
            if last_renew.elapsed() < renew_every {
                continue;
            }
            last_renew = tokio::time::Instant::now();
            match self.store.renew(&ids).await {
                Ok(lost) => {
                    for run_id in lost {
                        if let Some((_, l)) = live.iter().find(|(k, _)| *k == run_id) {
                            l.lost.send_replace(true);
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "could not renew run leases"),
            }
            match self.store.claim_orphans(false).await {
                Ok(runs) => {
                    for stored in runs {
                        if self.live(&stored.run.run_id).is_some() {
                            continue;
                        }
                        tracing::info!(run_id = %stored.run.run_id, "taking over a run whose lease expired");
                        if let Err(e) = self.resume(stored, "taken over from a gateway whose lease expired").await {
                            tracing::error!(error = %e, "could not take over a run");
                        }
                    }
                }
                Err(e) => tracing::warn!(error = %e, "could not look for orphaned runs"),
            }
        }
    }

    /// Resume every run left unfinished by a previous gateway process (any state but the terminal
    /// ones) that no other gateway executes: each pipeline is rebuilt from its stored request and
    /// goes on from its checkpoints; a paused run stays paused until resumed or cancelled.
    pub async fn resume_unfinished(&self) -> Result<usize, StageError> {
        let runs = self.store.claim_orphans(true).await?;
        let n = runs.len();
        for stored in runs {
            self.resume(stored, "resumed after a gateway restart").await?;
        }
        Ok(n)
    }

    /// Execute a stored unfinished run here, from its checkpoints.
    async fn resume(&self, stored: StoredRun, why: &str) -> Result<(), StageError> {
        let StoredRun { run, request } = stored;
        {
            if is_terminal(run.state) {
                return Ok(());
            }
            let last = self.store.events_after(&run.run_id, 0).await?.last().map_or(0, |e| e.sequence);
            let run_id = run.run_id.clone();
            let run_state = run.state;
            // A resumed run is never refused: the caps' ceiling stops it where they are reached.
            let spend = match &self.spend {
                Some(c) => {
                    let backends = c.capped_backends_of(&request);
                    if let Err(e) = c.refresh(&backends).await {
                        tracing::warn!(run_id = %run_id, error = %e, "could not read today's spend of the capped backends");
                    }
                    Some((c.clone(), backends))
                }
                None => None,
            };
            let ctx = Arc::new(self.capped(RunCtx::new(run, last, Some(self.store.clone())), spend));
            let pipeline = match self.factory.parse(&request) {
                Ok(p) => p,
                Err(e) => {
                    // A stored request this gateway cannot run any more fails its run.
                    self.finish(&ctx, Err(e)).await?;
                    return Ok(());
                }
            };
            // A paused run stays paused (controllable: resume or cancel), a run waiting for a
            // human keeps waiting; any other unfinished state goes on running.
            let (state, reason) = if run_state == gw::RunState::Paused as i32 {
                ctx.paused.send_replace(true);
                (gw::RunState::Paused, "recovered after a gateway restart; paused until resumed")
            } else if run_state == gw::RunState::AwaitingHuman as i32 {
                (gw::RunState::AwaitingHuman, "recovered after a gateway restart; waiting for a human decision")
            } else {
                (gw::RunState::Running, why)
            };
            ctx.update(|r| r.state = state as i32);
            ctx.emit(Event::StateChanged(gw::RunStateChanged { state: state as i32, reason: reason.into() })).await?;
            tracing::info!(run_id = %run_id, "resuming run");
            let slot = self.readmit();
            self.spawn(Live::new(ctx, pipeline), slot);
        }
        Ok(())
    }
}
