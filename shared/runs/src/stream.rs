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
                    Ok(Some(_)) => {}
                    // Deleted meanwhile (DeleteRun, retention): the stream ends with NOT_FOUND.
                    Ok(None) => {
                        let _ = tx.send(Err(StageError::NotFound(format!("run {run_id} (deleted)")))).await;
                        return;
                    }
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

#[cfg(test)]
mod tests {
    use futures::StreamExt;

    use super::*;

    /// A run followed from the store (executed by another gateway, or about to be resumed) that
    /// is deleted meanwhile ends its watchers' streams with NOT_FOUND instead of polling forever.
    #[tokio::test]
    async fn a_run_deleted_while_followed_ends_the_stream_with_not_found() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("runs.db");
        let path = path.to_str().unwrap().to_string();
        let store = RunStore::open(&path).unwrap();
        let run = gw::Run { run_id: "w".into(), state: gw::RunState::Running as i32, ..Default::default() };
        store.create(run, gw::RunPipelineRequest::default()).await.unwrap();
        let mut events = Box::pin(replay_then_follow(Vec::new(), None, 0, Some((store.clone(), "w".into()))));
        // The run's end and its deletion in one transaction (another gateway's), so no poll can
        // fall between them.
        let c = rusqlite::Connection::open(&path).unwrap();
        c.execute_batch(
            "BEGIN; UPDATE runs SET state = 5 WHERE run_id = 'w'; DELETE FROM runs WHERE run_id = 'w'; COMMIT;",
        )
        .unwrap();
        let next = tokio::time::timeout(std::time::Duration::from_secs(30), events.next())
            .await
            .expect("the watcher polled a deleted run without end");
        match next {
            Some(Err(StageError::NotFound(m))) => assert_eq!(m, "run w (deleted)"),
            other => panic!("expected NOT_FOUND, got {other:?}"),
        }
        assert!(events.next().await.is_none(), "and the stream ends");
    }
}
