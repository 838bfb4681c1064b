//! A checklist evaluation does not wait for its run store to score: with every store write held
//! (a stalled database), checklists are generated and every record is scored; the events and
//! checkpoints queued meanwhile are stored, in order, once the store answers again.

use std::sync::Arc;
use std::time::Duration;

use assay_gateway::{Engine, Pipelines, RunStore, Stages};
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::run_event::Event;
use assay_runs::store::ObservedStore;
use assay_tests::MeshSandbox;
use futures::StreamExt;

const RECORDS: usize = 6;

fn request() -> gw::RunPipelineRequest {
    let records = (0..RECORDS)
        .map(|i| gw::EvalRecord {
            id: format!("r{i}"),
            input: format!("Describe autumn in one sentence ({i})."),
            target: format!("Leaves turn red and fall ({i})."),
            reference: "Leaves change colour and fall.".into(),
            ..Default::default()
        })
        .collect();
    let pipeline = gw::ChecklistEvalPipeline {
        source: Some(gw::ChecklistSource {
            source: Some(gw::checklist_source::Source::Preset(assay_proto::generator::v1::Preset::RlcfDirect as i32)),
        }),
        records,
        ..Default::default()
    };
    gw::RunPipelineRequest {
        open: false,
        label: "stalled store".into(),
        pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(pipeline)),
        budget: None,
    }
}

#[tokio::test]
async fn records_are_scored_while_the_run_store_is_stalled() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(assay_testkit::schema_handler(Duration::ZERO));
    let hub = sandbox.hub();
    let observed = Arc::new(ObservedStore::new(RunStore::open(":memory:").unwrap()));
    let stages = Stages::new(Arc::new(assay_scorer::ScorerCore::new(hub.clone(), 16)), 16)
        .with_generator(Arc::new(assay_generator::Generator::new(hub)));
    let engine = Engine::new(RunStore::from_storage(observed.clone()), Arc::new(Pipelines::new(stages)));

    // The run and its RunStarted event are stored; then the store stalls.
    let run_id = engine.start(request()).await.unwrap();
    observed.set_held(true);
    let batches_before = observed.batches().len();

    // One generation per record, then its items scored one call each: all of it happens while
    // no write can complete (a pipeline waiting for its checkpoints would stop after the first
    // generation).
    let llm = &sandbox.llm;
    let scored_calls = || {
        llm.requests().iter().filter(|r| r.last_user_message().is_some_and(|m| m.contains("single criterion"))).count()
    };
    let generations = || llm.request_count() - scored_calls();
    assert!(
        assay_testkit::eventually(Duration::from_secs(20), || generations() == RECORDS && scored_calls() >= RECORDS)
            .await,
        "with the store stalled: {} generations and {} scoring calls",
        generations(),
        scored_calls()
    );
    assert!(observed.batches().len() > batches_before, "the pipeline's writes reached the store and wait there");
    assert_eq!(engine.get(&run_id).await.unwrap().state, gw::RunState::Running as i32);

    // Released: the run ends with every queued event stored, gap-free and in order.
    observed.set_held(false);
    let mut watch = Box::pin(engine.watch(&run_id, 0).await.unwrap());
    let last = tokio::time::timeout(Duration::from_secs(20), async {
        let mut last = None;
        while let Some(ev) = watch.next().await {
            last = Some(ev.unwrap());
        }
        last
    })
    .await
    .expect("the run ends once the store answers");
    assert!(
        matches!(last.and_then(|e| e.event), Some(Event::Completed(c)) if c.state == gw::RunState::Succeeded as i32),
        "the run succeeds"
    );
    let store = engine.store();
    let events = store.events_after(&run_id, 0).await.unwrap();
    let seqs: Vec<u64> = events.iter().map(|e| e.sequence).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>());
    let count = |f: fn(&Event) -> bool| events.iter().filter(|e| e.event.as_ref().is_some_and(f)).count();
    assert_eq!(count(|e| matches!(e, Event::ChecklistReady(_))), RECORDS);
    assert_eq!(count(|e| matches!(e, Event::RecordScored(_))), RECORDS);
    assert_eq!(store.checkpoints(&run_id, "record:").await.unwrap().len(), RECORDS);
}
