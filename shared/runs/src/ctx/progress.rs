//! A run's progress: its state, how many units of work are done, the models used, and the
//! progress its stage calls report, relayed as run events.

use std::future::Future;

use assay_domain::{ModelRecord, StageError};
use assay_proto::common::v1 as pb;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::run_event::Event;
use tokio::sync::mpsc;

use super::log::EventLog;
use super::summary::Summary;

/// A run's progress.
pub struct Progress {
    log: EventLog,
    summary: Summary,
}

impl Progress {
    pub(crate) fn new(log: EventLog, summary: Summary) -> Self {
        Self { log, summary }
    }

    /// The run's state.
    pub fn state(&self) -> gw::RunState {
        self.summary.state()
    }

    /// Move the run to `state` (an event says why) unless it is there already.
    pub async fn set_state(&self, state: gw::RunState, reason: &str) -> Result<(), StageError> {
        if self.state() == state {
            return Ok(());
        }
        self.summary.update(|r| r.state = state as i32);
        self.log
            .emit(Event::StateChanged(gw::RunStateChanged { state: state as i32, reason: reason.to_string() }))
            .await
    }

    /// Set the run's pipeline-specific progress (stored with the next event).
    pub fn set(&self, progress: gw::run::Progress) {
        self.summary.update(|r| r.progress = Some(progress));
    }

    /// Set how many units of work are done.
    pub fn set_done(&self, done: u32) {
        self.summary.update(|r| r.records_done = done);
    }

    /// Set how many units of work the run has (an open run's records, as they arrive), and
    /// whether more can come.
    pub fn set_total(&self, total: u32, open: bool) {
        self.summary.update(|r| {
            r.records_total = total;
            r.open = open;
        });
    }

    /// Each gateway's share of a spread run (stored with the next event).
    pub fn set_gateways(&self, gateways: Vec<gw::GatewayShare>) {
        self.summary.update(|r| r.gateways = gateways);
    }

    /// One more unit of work done.
    pub fn add_done(&self) {
        self.summary.update(|r| r.records_done += 1);
    }

    /// Record a model used (once per distinct record).
    pub fn add_model(&self, model: &ModelRecord) {
        self.summary.add_model(model);
    }

    /// Models used so far.
    pub fn models(&self) -> Vec<ModelRecord> {
        self.summary.models()
    }

    /// Relay a stage's progress as a run event.
    pub async fn stage(&self, service: &str, p: pb::Progress) -> Result<(), StageError> {
        self.log.emit(Event::Progress(gw::StageProgress { service: service.into(), progress: Some(p) })).await
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
        relay_with(rx, call, move |p| self.stage(service, p)).await
    }
}

/// Await a stage call while handing each event it reports through `rx` (fed by the sink handed
/// to the stage) to `relay` (which emits it as the pipeline's run event), one at a time in order;
/// events left in the channel when the call ends are relayed before returning. The first error of
/// `relay` stops the relay (and drops the call).
pub async fn relay_with<E, T, R>(
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
