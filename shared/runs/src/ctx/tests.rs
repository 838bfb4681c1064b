//! The run context's writer and relay.

use std::sync::{Arc, Mutex};

use assay_domain::StageError;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::run_event::Event;
use futures::FutureExt;
use tokio::sync::{mpsc, oneshot};

use super::{RunCtx, Writes, relay_with};
use crate::store::{ObservedStore, RunStore};

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
    assert_eq!(relay_with(&mut rx, call, relay).await, Ok("done"));
    assert_eq!(*seen.lock().unwrap(), (0..20).collect::<Vec<u32>>());
}

#[tokio::test]
async fn a_failed_relay_stops_the_call() {
    let (tx, mut rx) = mpsc::unbounded_channel::<u32>();
    let (held, dropped) = oneshot::channel::<()>();
    let call = async move {
        let _held = held;
        tx.send(1).unwrap();
        std::future::pending::<()>().await;
    };
    let relay = |_| async { Err(StageError::Unavailable("run store down".into())) };
    let out = relay_with(&mut rx, call, relay).await;
    assert_eq!(out, Err(StageError::Unavailable("run store down".into())));
    assert!(dropped.await.is_err(), "the call was dropped");
}

#[tokio::test]
async fn queued_writes_are_stored_in_order_many_per_transaction() {
    let (counted, store, run) = stored_run().await;
    let ctx = RunCtx::new(run, 0, Some(store.clone()));
    let mut writes = Writes::default();
    for i in 0..300u32 {
        writes
            .push(ctx.checkpoints.queued(&format!("rec:{i:04}"), &gw::RecordResult { index: i, ..Default::default() }));
        ctx.progress.add_done();
        writes.push(ctx.log.emit_queued(scored(i)));
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
    writes.push(ctx.checkpoints.queued("k", &gw::RecordResult::default()));
    writes.push(ctx.log.emit_queued(scored(1)));
    writes.push(ctx.log.emit_queued(scored(2)));
    let e = writes.flush().await.unwrap_err();
    assert!(e.to_string().contains("run store down"), "{e}");
    let mut again = Writes::default();
    again.push(ctx.log.emit_queued(scored(3)));
    assert!(again.next_error().now_or_never().is_none(), "pending while the write is under way");
    counted.set_failing(false);
    // The earlier write may still be failing; wait for this one by itself.
    ctx.log.emit(scored(4)).await.unwrap();
    let seqs: Vec<u64> = store.events_after("r", 0).await.unwrap().iter().map(|e| e.sequence).collect();
    assert_eq!(*seqs.last().unwrap(), seqs.len() as u64, "gap-free after a failed batch: {seqs:?}");
    assert!(store.checkpoints("r", "k").await.unwrap().is_empty(), "the failed batch's checkpoint is not kept");
}
