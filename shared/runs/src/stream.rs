//! Replay-then-follow: a run's stored events after a sequence number, then its live ones, without
//! gaps or repeats, ending after `RunCompleted`.

use assay_domain::StageError;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::run_event::Event;
use tokio::sync::broadcast;

use crate::store::RunStore;

fn completes(ev: &gw::RunEvent) -> bool {
    matches!(ev.event, Some(Event::Completed(_)))
}

/// How often a run executed by another gateway is read again from the shared store.
const POLL: std::time::Duration = std::time::Duration::from_millis(100);

/// Past events, then live ones with a sequence above the last one sent, ending after
/// `RunCompleted`. A watcher that falls too far behind gets RESOURCE_EXHAUSTED and reattaches from
/// its last sequence. With `poll` (the store and the run's id), a run with no live events here
/// (another gateway executes it, or this one has yet to resume it) is followed from the store, and
/// on a shared store so is a run whose execution here stops before it completes (lease lost).
pub fn replay_then_follow(
    past: Vec<gw::RunEvent>,
    live: Option<broadcast::Receiver<std::sync::Arc<gw::RunEvent>>>,
    after: u64,
    poll: Option<(RunStore, String)>,
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
        let followed_live = live.is_some();
        if let Some(mut live) = live {
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
                    Err(broadcast::error::RecvError::Closed) => break,
                }
            }
        }
        let Some((store, run_id)) = poll else { return };
        // On a store of one gateway, a live run whose events stop before it completes is this
        // gateway stopping: the watcher reattaches to the next one.
        if followed_live && !store.shared() {
            return;
        }
        loop {
            match store.events_after(&run_id, last).await {
                // Nothing new: stop once the run has ended (its last event was already sent).
                Ok(events) if events.is_empty() => match store.get(&run_id).await {
                    Ok(Some(stored)) if crate::clock::is_terminal(stored.run.state) => return,
                    Ok(_) => {}
                    Err(e) => {
                        let _ = tx.send(Err(e)).await;
                        return;
                    }
                },
                Ok(events) => {
                    for ev in events {
                        last = ev.sequence;
                        let done = completes(&ev);
                        if tx.send(Ok(ev)).await.is_err() || done {
                            return;
                        }
                    }
                }
                Err(e) => {
                    let _ = tx.send(Err(e)).await;
                    return;
                }
            }
            tokio::select! {
                () = tokio::time::sleep(POLL) => {}
                () = tx.closed() => return,
            }
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}
