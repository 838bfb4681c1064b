//! Replay-then-follow: a run's stored events after a sequence number, then its live ones, without
//! gaps or repeats, ending after `RunCompleted`.

use assay_domain::StageError;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::run_event::Event;
use tokio::sync::broadcast;

fn completes(ev: &gw::RunEvent) -> bool {
    matches!(ev.event, Some(Event::Completed(_)))
}

/// Past events, then live ones with a sequence above the last one sent, ending after
/// `RunCompleted`. A watcher that falls too far behind gets RESOURCE_EXHAUSTED and reattaches from
/// its last sequence.
pub fn replay_then_follow(
    past: Vec<gw::RunEvent>,
    live: Option<broadcast::Receiver<std::sync::Arc<gw::RunEvent>>>,
    after: u64,
) -> impl futures::Stream<Item = Result<gw::RunEvent, StageError>> + Send + 'static {
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<gw::RunEvent, StageError>>(256);
    tokio::spawn(async move {
        let mut last = after;
        for ev in past {
            last = last.max(ev.sequence);
            let done = completes(&ev);
            if tx.send(Ok(ev)).await.is_err() || done {
                return;
            }
        }
        let Some(mut live) = live else { return };
        loop {
            match live.recv().await {
                Ok(ev) if ev.sequence <= last => {}
                Ok(ev) => {
                    let ev = std::sync::Arc::unwrap_or_clone(ev);
                    last = ev.sequence;
                    let done = completes(&ev);
                    if tx.send(Ok(ev)).await.is_err() || done {
                        return;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(n)) => {
                    let _ = tx
                        .send(Err(StageError::ResourceExhausted(format!(
                            "watcher fell {n} events behind; reattach with WatchRun from the last sequence seen"
                        ))))
                        .await;
                    return;
                }
                Err(broadcast::error::RecvError::Closed) => return,
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
