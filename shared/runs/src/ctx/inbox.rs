//! A run's human loop: the audit log of every control taken (actor, action, reason), and the
//! inbox of pipeline actions (human decisions, persisted until consumed, in order).

use assay_domain::StageError;
use assay_proto::gateway::v1 as gw;
use tokio::sync::watch;

use super::checkpoints::Checkpoints;
use super::log::EventLog;
use super::summary::Summary;
use crate::clock::now;
use crate::store::RunStore;

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

/// A run's audit log and action inbox.
pub struct Inbox {
    log: EventLog,
    checkpoints: Checkpoints,
    summary: Summary,
    paused: watch::Receiver<bool>,
    cancelled: watch::Receiver<bool>,
    /// Pipeline actions posted so far (bumped on every post, to wake waiters).
    posted: watch::Sender<u32>,
    /// Serialises posts and audit entries (their keys are counters).
    journal: tokio::sync::Mutex<()>,
}

impl Inbox {
    pub(crate) fn new(
        log: EventLog,
        summary: Summary,
        paused: watch::Receiver<bool>,
        cancelled: watch::Receiver<bool>,
    ) -> Self {
        let checkpoints = Checkpoints::new(log.clone());
        Self {
            log,
            checkpoints,
            summary,
            paused,
            cancelled,
            posted: watch::channel(0).0,
            journal: tokio::sync::Mutex::new(()),
        }
    }

    /// Append to the run's audit log (persisted).
    pub async fn audit(&self, actor: &str, action: &str, detail: &str) -> Result<(), StageError> {
        let _guard = self.journal.lock().await;
        let entry = self.audit_entry(actor, action, detail).await?;
        self.log.put(&entry.0, entry.1).await
    }

    /// The next audit entry's key and value (call with the journal held).
    async fn audit_entry(&self, actor: &str, action: &str, detail: &str) -> Result<(String, Vec<u8>), StageError> {
        let n = self.log.raw(AUDIT).await?.len();
        let entry = gw::AuditEntry {
            time: Some(now()),
            actor: if actor.is_empty() { "unknown".into() } else { actor.to_string() },
            action: action.to_string(),
            detail: detail.to_string(),
        };
        Ok((format!("{AUDIT}{n:08}"), prost::Message::encode_to_vec(&entry)))
    }

    /// A control of the engine's, taken only if the run is in one of the `expect` states: its
    /// audit entry and the state it moves the run to (if any) are written together, in one
    /// transaction with the check of the stored state; nothing is audited when it is refused.
    pub(crate) async fn control_write(
        &self,
        request: &gw::ControlRunRequest,
        action: &str,
        expect: &[gw::RunState],
        state: Option<gw::RunState>,
    ) -> Result<(), StageError> {
        let _guard = self.journal.lock().await;
        let entry = self.audit_entry(&request.actor, action, &request.reason).await?;
        self.log.guarded(expect, vec![entry], state.map(|s| (s, request.reason.as_str()))).await
    }

    /// The audit log, oldest first.
    pub async fn audit_log(&self) -> Result<Vec<gw::AuditEntry>, StageError> {
        Ok(self.checkpoints.all::<gw::AuditEntry>(AUDIT).await?.into_iter().map(|(_, e)| e).collect())
    }

    /// Post a pipeline action (a human decision the pipeline consumes in order with
    /// [`Inbox::next_action`] / [`Inbox::gate_or_action`]): audited, persisted (it survives a
    /// restart until consumed), then the run is woken. Returns its index.
    pub async fn post_action(
        &self,
        request: &gw::ControlRunRequest,
        action: &str,
        detail: &str,
    ) -> Result<u32, StageError> {
        let _guard = self.journal.lock().await;
        let n = self.log.raw(ACTION).await?.len() as u32;
        let audit = self.audit_entry(&request.actor, action, detail).await?;
        // Taken only in the state the pipeline checked it against, audit and action together.
        let writes = vec![audit, (format!("{ACTION}{n:08}"), prost::Message::encode_to_vec(request))];
        self.log.guarded(&[self.summary.state()], writes, None).await?;
        self.posted.send_replace(n + 1);
        Ok(n)
    }

    /// Posted actions with index >= `consumed`, in order.
    pub async fn actions_from(&self, consumed: u32) -> Result<Vec<gw::ControlRunRequest>, StageError> {
        Ok(self
            .checkpoints
            .all::<gw::ControlRunRequest>(ACTION)
            .await?
            .into_iter()
            .skip(consumed as usize)
            .map(|(_, a)| a)
            .collect())
    }

    fn is_cancelled(&self) -> bool {
        *self.cancelled.borrow()
    }

    async fn cancelled(&self) {
        let mut rx = self.cancelled.clone();
        let _ = rx.wait_for(|c| *c).await;
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

    /// Like [`super::Gate::wait`], but a posted action not yet consumed is returned at once
    /// (paused or not); `None` once the run is not paused and nothing is pending.
    pub async fn gate_or_action(&self, consumed: u32) -> Result<Option<gw::ControlRunRequest>, StageError> {
        let mut posted = self.posted.subscribe();
        let mut paused = self.paused.clone();
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
}
