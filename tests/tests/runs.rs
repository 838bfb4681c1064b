//! Gateway runs: streamed events, storage, listing, watching, cancel, and resume after a restart.

#![allow(clippy::wildcard_enum_match_arm)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use assay_proto::common::v1 as pb;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_proto::gateway::v1::run_event::Event;
use assay_testkit::Reply;
use assay_tests::{MeshSandbox, SandboxOptions};
use serde_json::json;
use tonic::Code;
use tonic::transport::Channel;

fn pipeline(n: usize) -> gw::ChecklistEvalPipeline {
    gw::ChecklistEvalPipeline {
        source: Some(gw::ChecklistSource {
            source: Some(gw::checklist_source::Source::Checklist(pb::Checklist {
                items: vec![
                    pb::ChecklistItem { id: "a".into(), question: "Mentions foliage?".into(), ..Default::default() },
                    pb::ChecklistItem {
                        id: "b".into(),
                        question: "Is it short?".into(),
                        category: "style".into(),
                        ..Default::default()
                    },
                ],
                ..Default::default()
            })),
        }),
        records: (0..n)
            .map(|i| gw::EvalRecord {
                id: format!("rec-{i}"),
                target: if i % 2 == 0 { format!("leaves {i}") } else { format!("stones {i}") },
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

/// YES to "leaves" targets' first question, NO otherwise; always YES to the second.
fn answer(req: &assay_testkit::RecordedRequest) -> Reply {
    let prompt = req.last_user_message().unwrap_or_default();
    let first = if prompt.contains("leaves") { "YES" } else { "NO" };
    Reply::json(json!({"answers": [{"question_index": 1, "answer": first}, {"question_index": 2, "answer": "YES"}]}))
        .usage(10, 5)
}

async fn run_to_end(ch: Channel, p: gw::ChecklistEvalPipeline) -> Vec<gw::RunEvent> {
    assay_tests::run_to_end(ch, gw::run_pipeline_request::Pipeline::ChecklistEval(p)).await
}

fn eval_result(ev: &gw::RunEvent) -> Option<gw::EvaluateResponse> {
    match &ev.event {
        Some(Event::Completed(c)) => match c.result.as_ref()?.result.as_ref()? {
            gw::run_result::Result::ChecklistEval(e) => Some(e.clone()),
            _ => None,
        },
        _ => None,
    }
}

#[tokio::test]
async fn run_pipeline_streams_ordered_events_and_stores_the_run() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(answer);
    let events = run_to_end(sandbox.gateway().await, pipeline(4)).await;
    let seqs: Vec<u64> = events.iter().map(|e| e.sequence).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>(), "gap-free sequences from 1");
    let run_id = events[0].run_id.clone();
    assert!(events.iter().all(|e| e.run_id == run_id));
    assert!(matches!(events[0].event, Some(Event::Started(gw::RunStarted { records: 4, .. }))));
    assert!(matches!(events[1].event, Some(Event::ChecklistReady(_))));
    let scored = events.iter().filter(|e| matches!(e.event, Some(Event::RecordScored(_)))).count();
    assert_eq!(scored, 4);
    let n = events.len();
    assert!(matches!(events[n - 2].event, Some(Event::Aggregate(_))));
    let result = eval_result(&events[n - 1]).expect("completed with a result");
    let agg = result.aggregate.unwrap();
    assert!((agg.macro_pass_rate - 0.75).abs() < 1e-9);
    assert!((agg.micro_pass_rate - 0.75).abs() < 1e-9);
    assert_eq!(agg.category_pass_rates.iter().find(|c| c.category == "style").unwrap().pass_rate, 1.0);
    assert_eq!(
        result.results.iter().map(|r| r.record_id.clone()).collect::<Vec<_>>(),
        vec!["rec-0", "rec-1", "rec-2", "rec-3"]
    );
    assert_eq!(result.usage.unwrap().calls, 4);

    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let run = client.get_run(gw::GetRunRequest { run_id: run_id.clone() }).await.unwrap().into_inner().run.unwrap();
    assert_eq!(run.state, gw::RunState::Succeeded as i32);
    assert_eq!((run.records_done, run.records_total, run.last_sequence), (4, 4, n as u64));

    // Reattach from sequence 2: everything after it, ending with the completion.
    let mut watch =
        client.watch_run(gw::WatchRunRequest { run_id: run_id.clone(), after_sequence: 2 }).await.unwrap().into_inner();
    let mut replay = Vec::new();
    while let Some(m) = watch.message().await.unwrap() {
        replay.push(m.event.unwrap().sequence);
    }
    assert_eq!(replay, (3..=n as u64).collect::<Vec<_>>());

    let missing = client.get_run(gw::GetRunRequest { run_id: "nope".into() }).await.unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn list_runs_pages_newest_first() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(answer);
    let mut ids = Vec::new();
    for _ in 0..3 {
        let ev = run_to_end(sandbox.gateway().await, pipeline(1)).await;
        ids.push(ev[0].run_id.clone());
    }
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let mut seen = Vec::new();
    let mut token = String::new();
    loop {
        let page = client
            .list_runs(gw::ListRunsRequest { page_size: 2, page_token: token.clone(), ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        assert!(page.runs.len() <= 2);
        seen.extend(page.runs.into_iter().map(|r| r.run_id));
        if page.next_page_token.is_empty() {
            break;
        }
        token = page.next_page_token;
    }
    ids.reverse();
    assert_eq!(seen, ids, "uuid v7 ids: newest first, every run once");
    let bad = client.list_runs(gw::ListRunsRequest { page_size: 501, ..Default::default() }).await.unwrap_err();
    assert_eq!(bad.code(), Code::InvalidArgument);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_cancelled_run_stops_and_says_so() {
    let sandbox = MeshSandbox::start_with(SandboxOptions { concurrency: Some(1), ..Default::default() }).await;
    sandbox.llm.set_handler(|_| Reply::hang());
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let mut stream = client
        .run_pipeline(gw::RunPipelineRequest {
            open: false,
            pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(pipeline(3))),
            label: String::new(),
            budget: None,
        })
        .await
        .unwrap()
        .into_inner();
    let first = stream.message().await.unwrap().unwrap().event.unwrap();
    assert!(assay_testkit::eventually(Duration::from_secs(10), || sandbox.llm.request_count() == 1).await);
    let run = client
        .control_run(gw::ControlRunRequest {
            run_id: first.run_id.clone(),
            action: Some(gw::control_run_request::Action::Cancel(gw::CancelRun {})),
            actor: "tester".into(),
            reason: "enough".into(),
        })
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap();
    // The answer comes once the run has stopped: it is the state the run ends in.
    assert_eq!(run.state, gw::RunState::Cancelled as i32);
    assert_eq!(sandbox.llm.request_count(), 1, "no call started after the cancel");
    let mut last = None;
    while let Some(m) = stream.message().await.unwrap() {
        last = m.event;
    }
    match last.and_then(|e| e.event) {
        Some(Event::Completed(c)) => assert_eq!(c.state, gw::RunState::Cancelled as i32),
        other => panic!("expected a cancelled completion, got {other:?}"),
    }
    assert!(assay_testkit::eventually(Duration::from_secs(10), || sandbox.llm.cancelled_count() == 1).await);
    let again = client
        .control_run(gw::ControlRunRequest {
            run_id: first.run_id,
            action: Some(gw::control_run_request::Action::Pause(gw::PauseRun {})),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(again.code(), Code::FailedPrecondition);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_interrupted_run_resumes_after_a_restart_with_the_same_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("runs.db").display().to_string();
    let mut sandbox = MeshSandbox::start_with(SandboxOptions {
        concurrency: Some(1),
        store: Some(store.clone()),
        ..Default::default()
    })
    .await;
    // Reference: the same evaluation, uninterrupted.
    sandbox.llm.set_handler(answer);
    let reference = run_to_end(sandbox.gateway().await, pipeline(6)).await;
    let reference = eval_result(reference.last().unwrap()).unwrap();
    let calls_before = sandbox.llm.request_count();

    // Interrupted: three records answered, the fourth hangs when the gateway stops.
    let served = Arc::new(AtomicUsize::new(0));
    let s2 = served.clone();
    sandbox.llm.set_handler(move |req| if s2.fetch_add(1, Ordering::SeqCst) < 3 { answer(req) } else { Reply::hang() });
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let mut stream = client
        .run_pipeline(gw::RunPipelineRequest {
            open: false,
            pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(pipeline(6))),
            label: "interrupted".into(),
            budget: None,
        })
        .await
        .unwrap()
        .into_inner();
    let mut run_id = String::new();
    let mut scored = 0;
    while scored < 3 {
        let ev = stream.message().await.unwrap().unwrap().event.unwrap();
        run_id = ev.run_id.clone();
        if matches!(ev.event, Some(Event::RecordScored(_))) {
            scored += 1;
        }
    }
    drop(stream);
    let old = sandbox.mesh.take().unwrap();
    old.shutdown().await.unwrap();

    // A new gateway on the same store resumes the run and scores only what was left.
    sandbox.llm.set_handler(answer);
    let before_resume = sandbox.llm.request_count();
    sandbox.restart(sandbox.hub()).await;
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let mut watch =
        client.watch_run(gw::WatchRunRequest { run_id: run_id.clone(), after_sequence: 0 }).await.unwrap().into_inner();
    let mut events = Vec::new();
    while let Some(m) = watch.message().await.unwrap() {
        events.push(m.event.unwrap());
    }
    let seqs: Vec<u64> = events.iter().map(|e| e.sequence).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>(), "one gap-free sequence across the restart");
    let resumed = eval_result(events.last().unwrap()).expect("completed");
    assert_eq!(resumed.aggregate, reference.aggregate, "same aggregates as the uninterrupted run");
    let ids = |r: &gw::EvaluateResponse| {
        r.results.iter().map(|x| (x.record_id.clone(), x.score.as_ref().map(|s| s.pass_rate))).collect::<Vec<_>>()
    };
    assert_eq!(ids(&resumed), ids(&reference));
    assert_eq!(sandbox.llm.request_count() - before_resume, 3, "only the three unscored records were sent again");
    assert!(calls_before >= 6);
    let run = client.get_run(gw::GetRunRequest { run_id }).await.unwrap().into_inner().run.unwrap();
    assert_eq!(run.state, gw::RunState::Succeeded as i32);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn evaluate_is_stored_as_a_run() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(answer);
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let r =
        client.evaluate(gw::EvaluateRequest { pipeline: Some(pipeline(2)), budget: None }).await.unwrap().into_inner();
    // Evaluate stores its run off the response path: poll (bounded) until it is there.
    let mut run = None;
    for _ in 0..200 {
        match client.get_run(gw::GetRunRequest { run_id: r.run_id.clone() }).await {
            Ok(x) => {
                run = x.into_inner().run;
                break;
            }
            Err(s) if s.code() == Code::NotFound => tokio::time::sleep(Duration::from_millis(10)).await,
            Err(s) => panic!("{s:?}"),
        }
    }
    let run = run.expect("evaluate run stored");
    assert_eq!(run.state, gw::RunState::Succeeded as i32);
    assert_eq!(run.records_done, 2);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn tick_preset_generates_once_per_distinct_input_and_scores_every_record() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(|req| {
        let prompt = req.last_user_message().unwrap_or_default();
        if prompt.contains("Q1:") {
            // Scoring.
            let first = if prompt.contains("leaves") { "YES" } else { "NO" };
            Reply::json(
                json!({"answers": [{"question_index": 1, "answer": first}, {"question_index": 2, "answer": "YES"}]}),
            )
        } else {
            // Generation.
            Reply::json(json!({"items": [
                {"question": "Does it mention foliage?"},
                {"question": "Is it under fifty words?"},
                {"question": "Is it cheerful?"}
            ]}))
        }
    });
    let mut p = pipeline(4);
    p.source = Some(gw::ChecklistSource {
        source: Some(gw::checklist_source::Source::Preset(assay_proto::generator::v1::Preset::Tick as i32)),
    });
    p.max_items = Some(2);
    for (i, r) in p.records.iter_mut().enumerate() {
        r.input = if i < 2 { "Write about autumn.".into() } else { "Write about rivers.".into() };
    }
    let events = run_to_end(sandbox.gateway().await, p.clone()).await;
    let ready: Vec<Vec<u32>> = events
        .iter()
        .filter_map(|e| match &e.event {
            Some(Event::ChecklistReady(c)) => Some(c.record_indices.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(ready.len(), 2, "one checklist per distinct input");
    let mut all: Vec<u32> = ready.concat();
    all.sort();
    assert_eq!(all, vec![0, 1, 2, 3]);
    let result = eval_result(events.last().unwrap()).unwrap();
    assert_eq!(result.checklists.len(), 2);
    assert!(result.checklists.iter().all(|c| c.items.len() == 2 && c.source_method == "tick"), "max_items override");
    assert!((result.aggregate.as_ref().unwrap().micro_pass_rate - 0.75).abs() < 1e-9);
    let usage = result.usage.unwrap();
    assert_eq!(usage.calls, 2 + 4, "two generations, four scorings");
    // Unary Evaluate runs the same pipeline.
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let r = client.evaluate(gw::EvaluateRequest { pipeline: Some(p), budget: None }).await.unwrap().into_inner();
    assert_eq!(r.aggregate, result.aggregate);
    // A preset needing a reference names the field.
    let mut bad = pipeline(1);
    bad.source = Some(gw::ChecklistSource {
        source: Some(gw::checklist_source::Source::Preset(assay_proto::generator::v1::Preset::RlcfDirect as i32)),
    });
    bad.records[0].input = "x".into();
    let st = client.evaluate(gw::EvaluateRequest { pipeline: Some(bad), budget: None }).await.unwrap_err();
    assert_eq!(st.code(), Code::InvalidArgument, "{st:?}");
    assert!(st.message().contains("reference"), "{}", st.message());
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_checklist_that_cannot_be_generated_fails_only_its_records() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(|req| {
        let prompt = req.last_user_message().unwrap_or_default();
        if prompt.contains("Q1:") {
            Reply::json(
                json!({"answers": [{"question_index": 1, "answer": "YES"}, {"question_index": 2, "answer": "NO"}]}),
            )
        } else if prompt.contains("rivers") {
            // The generator's model answers with no JSON at all for this input.
            Reply::text("I would rather not write questions today.")
        } else {
            Reply::json(json!({"items": [{"question": "Does it mention foliage?"}, {"question": "Is it short?"}]}))
        }
    });
    let mut p = pipeline(4);
    p.source = Some(gw::ChecklistSource {
        source: Some(gw::checklist_source::Source::Preset(assay_proto::generator::v1::Preset::Tick as i32)),
    });
    for (i, r) in p.records.iter_mut().enumerate() {
        r.input = if i == 1 { "Write about rivers.".into() } else { "Write about autumn.".into() };
    }
    let events = run_to_end(sandbox.gateway().await, p).await;
    let Some(Event::Completed(c)) = &events.last().unwrap().event else { panic!("not completed") };
    assert_eq!(c.state, gw::RunState::Partial as i32);
    let result = eval_result(events.last().unwrap()).unwrap();
    assert_eq!(result.results.len(), 4);
    let failed: Vec<&gw::RecordResult> = result.results.iter().filter(|r| r.score.is_none()).collect();
    assert_eq!(failed.len(), 1);
    assert_eq!(failed[0].record_id, "rec-1");
    assert!(failed[0].error.contains("checklist generation failed"), "{}", failed[0].error);
    assert_eq!(result.checklists.len(), 1, "only the checklist that exists is reported");
    let agg = result.aggregate.unwrap();
    assert_eq!(agg.targets, 3);
    assert!((agg.micro_pass_rate - 0.5).abs() < 1e-9);
    sandbox.shutdown().await.unwrap();
}

/// A stage's progress relayed while other checklists of the same run are being produced: every
/// checklist's refiner events, its ChecklistReady and every record arrive, and the run completes
/// (the event writer is never held by a producer nobody polls).
#[tokio::test]
async fn preset_with_a_refiner_over_several_inputs_completes() {
    use assay_proto::refiners::v1::refiner_step::Step;
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(assay_testkit::schema_handler(Duration::from_millis(20)));
    let steps = [
        ("tag", Step::Tag(Default::default())),
        ("deduplicate", Step::Deduplicate(Default::default())),
        ("select", Step::Select(Default::default())),
    ];
    for (name, step) in steps {
        for inputs in [2usize, 3] {
            let mut p = pipeline(inputs);
            p.source = Some(gw::ChecklistSource {
                source: Some(gw::checklist_source::Source::Preset(assay_proto::generator::v1::Preset::Tick as i32)),
            });
            p.refiners = vec![assay_proto::refiners::v1::RefinerStep { step: Some(step.clone()) }];
            for (i, r) in p.records.iter_mut().enumerate() {
                r.input = format!("Write about topic {i} ({name}).");
            }
            let events = tokio::time::timeout(Duration::from_secs(60), run_to_end(sandbox.gateway().await, p))
                .await
                .unwrap_or_else(|_| panic!("{name} over {inputs} inputs completes instead of hanging"));
            let count = |f: fn(&Event) -> bool| events.iter().filter(|e| e.event.as_ref().is_some_and(f)).count();
            assert_eq!(count(|e| matches!(e, Event::ChecklistReady(_))), inputs, "{name}");
            assert_eq!(count(|e| matches!(e, Event::RecordScored(_))), inputs, "{name}");
            let seqs: Vec<u64> = events.iter().map(|e| e.sequence).collect();
            assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>(), "gap-free sequences");
            let Some(Event::Completed(c)) = &events.last().unwrap().event else {
                panic!("last event is not RunCompleted")
            };
            assert_eq!(c.state, gw::RunState::Succeeded as i32, "{name} over {inputs}: {c:?}");
        }
    }
    sandbox.shutdown().await.unwrap();
}

/// A paused run survives a gateway restart paused, starts no model call until resumed, then
/// completes with every record once; a second paused run is cancelled after the restart.
#[tokio::test]
async fn a_paused_run_stays_paused_across_a_restart_and_can_be_resumed_or_cancelled() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("runs.db").display().to_string();
    let mut sandbox =
        MeshSandbox::start_with(SandboxOptions { concurrency: Some(1), store: Some(store), ..Default::default() })
            .await;
    // Slow enough that a pause sent on the first scored record finds the run in progress.
    sandbox.llm.set_handler(|req| answer(req).delay(Duration::from_millis(100)));
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let control = |run_id: &str, action: gw::control_run_request::Action| gw::ControlRunRequest {
        run_id: run_id.to_string(),
        action: Some(action),
        actor: "tester".into(),
        reason: "check".into(),
    };
    // Two runs, each paused after its first scored record.
    let mut ids = Vec::new();
    for _ in 0..2 {
        let mut stream = client
            .run_pipeline(gw::RunPipelineRequest {
                open: false,
                pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(pipeline(5))),
                label: "paused".into(),
                budget: None,
            })
            .await
            .unwrap()
            .into_inner();
        loop {
            let ev = stream.message().await.unwrap().unwrap().event.unwrap();
            if matches!(ev.event, Some(Event::RecordScored(_))) {
                let paused =
                    client.control_run(control(&ev.run_id, gw::control_run_request::Action::Pause(gw::PauseRun {})));
                assert_eq!(paused.await.unwrap().into_inner().run.unwrap().state, gw::RunState::Paused as i32);
                ids.push(ev.run_id);
                break;
            }
        }
    }
    let old = sandbox.mesh.take().unwrap();
    old.shutdown().await.unwrap();

    sandbox.restart(sandbox.hub()).await;
    let calls = sandbox.llm.request_count();
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    for id in &ids {
        let run = client.get_run(gw::GetRunRequest { run_id: id.clone() }).await.unwrap().into_inner().run.unwrap();
        assert_eq!(run.state, gw::RunState::Paused as i32, "still paused after the restart");
    }
    // Cancel the second; resume the first and follow it to the end.
    let cancelled = client.control_run(control(&ids[1], gw::control_run_request::Action::Cancel(gw::CancelRun {})));
    cancelled.await.unwrap();
    let mut watch =
        client.watch_run(gw::WatchRunRequest { run_id: ids[1].clone(), after_sequence: 0 }).await.unwrap().into_inner();
    let mut last = None;
    while let Some(m) = watch.message().await.unwrap() {
        last = m.event;
    }
    let Some(Event::Completed(c)) = last.and_then(|e| e.event) else { panic!("no completion") };
    assert_eq!(c.state, gw::RunState::Cancelled as i32);
    assert_eq!(sandbox.llm.request_count(), calls, "no model call while paused, none for the cancelled run");
    let resumed = client.control_run(control(&ids[0], gw::control_run_request::Action::Resume(gw::ResumeRun {})));
    assert_eq!(resumed.await.unwrap().into_inner().run.unwrap().state, gw::RunState::Running as i32);
    let mut watch =
        client.watch_run(gw::WatchRunRequest { run_id: ids[0].clone(), after_sequence: 0 }).await.unwrap().into_inner();
    let mut events = Vec::new();
    while let Some(m) = watch.message().await.unwrap() {
        events.push(m.event.unwrap());
    }
    let seqs: Vec<u64> = events.iter().map(|e| e.sequence).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>(), "one gap-free sequence across the restart");
    let result = eval_result(events.last().unwrap()).expect("completed");
    let mut indices: Vec<u32> = result.results.iter().map(|r| r.index).collect();
    indices.sort();
    assert_eq!(indices, vec![0, 1, 2, 3, 4], "every record once");
    assert!(result.results.iter().all(|r| r.score.is_some()));
    sandbox.shutdown().await.unwrap();
}

/// Evaluate is the waited-for form: when its caller goes away (here its deadline passes), the
/// pipeline stops: the model calls in flight are dropped and no new one starts.
#[tokio::test]
async fn evaluate_with_a_preset_stops_when_its_caller_goes_away() {
    let sandbox = MeshSandbox::start_with(SandboxOptions { concurrency: Some(4), ..Default::default() }).await;
    sandbox.llm.set_handler(|_| Reply::hang());
    let p = preset_pipeline(40);
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let mut request = tonic::Request::new(gw::EvaluateRequest { pipeline: Some(p), budget: None });
    request.set_timeout(Duration::from_millis(500));
    let err = client.evaluate(request).await.unwrap_err();
    assert!(matches!(err.code(), Code::DeadlineExceeded | Code::Cancelled), "{err:?}");
    // The four generations in flight (concurrency 4) are cancelled at the backend...
    assert!(
        assay_testkit::eventually(Duration::from_secs(10), || sandbox.llm.cancelled_count() == 4).await,
        "cancelled {} of {} requests",
        sandbox.llm.cancelled_count(),
        sandbox.llm.request_count()
    );
    // ...and none was started in their place.
    assert_eq!(sandbox.llm.request_count(), 4);
    sandbox.shutdown().await.unwrap();
}

/// Evaluate stops when its caller cancels the call (the request future is dropped mid-flight).
#[tokio::test]
async fn evaluate_with_a_preset_stops_when_its_caller_cancels() {
    let sandbox = MeshSandbox::start_with(SandboxOptions { concurrency: Some(4), ..Default::default() }).await;
    sandbox.llm.set_handler(|_| Reply::hang());
    let p = preset_pipeline(40);
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let call =
        tokio::spawn(async move { client.evaluate(gw::EvaluateRequest { pipeline: Some(p), budget: None }).await });
    assert!(assay_testkit::eventually(Duration::from_secs(10), || sandbox.llm.request_count() == 4).await);
    call.abort();
    assert!(call.await.unwrap_err().is_cancelled());
    assert!(
        assay_testkit::eventually(Duration::from_secs(10), || sandbox.llm.cancelled_count() == 4).await,
        "cancelled {} of {} requests",
        sandbox.llm.cancelled_count(),
        sandbox.llm.request_count()
    );
    assert_eq!(sandbox.llm.request_count(), 4, "no generation starts after the caller left");
    sandbox.shutdown().await.unwrap();
}

/// Evaluate answers with the cause and the code of the stage's failure, as the explicit-checklist
/// path does: a rate-limited backend is RESOURCE_EXHAUSTED, a failing one UNAVAILABLE.
#[tokio::test]
async fn evaluate_with_a_preset_keeps_the_cause_and_code_of_a_backend_failure() {
    let sandbox = MeshSandbox::start().await;
    let mut p = pipeline(2);
    p.source = Some(gw::ChecklistSource {
        source: Some(gw::checklist_source::Source::Preset(assay_proto::generator::v1::Preset::Tick as i32)),
    });
    for r in &mut p.records {
        r.input = "Write about autumn.".into();
    }
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    for (status, code, cause) in [(429, Code::ResourceExhausted, "rate limited"), (503, Code::Unavailable, "503")] {
        sandbox.llm.set_handler(move |_| Reply::status(status));
        let err = client.evaluate(gw::EvaluateRequest { pipeline: Some(p.clone()), budget: None }).await.unwrap_err();
        assert_eq!(err.code(), code, "{err:?}");
        assert!(err.message().contains(cause), "the cause is kept: {}", err.message());
        // The explicit-checklist path maps the same failure the same way.
        let explicit =
            client.evaluate(gw::EvaluateRequest { pipeline: Some(pipeline(1)), budget: None }).await.unwrap_err();
        assert_eq!(explicit.code(), code, "{explicit:?}");
    }
    sandbox.shutdown().await.unwrap();
}

/// RunPipeline rejects what Evaluate rejects (no records), ids and labels beyond their limits and
/// duplicate record ids; WatchRun past the last sequence, even beyond 2^63, replays nothing.
#[tokio::test]
async fn contract_edges_of_runs() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(answer);
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let empty = client
        .run_pipeline(gw::RunPipelineRequest {
            open: false,
            pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(pipeline(0))),
            label: String::new(),
            budget: None,
        })
        .await
        .unwrap_err();
    assert_eq!(empty.code(), Code::InvalidArgument);
    assert!(empty.message().contains("pipeline.records"), "{}", empty.message());
    // Ids and labels have limits; given record ids are unique, as item ids are.
    let mut long_ids = pipeline(3);
    long_ids.records[0].id = "r".repeat(1 << 20);
    long_ids.records[2].id = long_ids.records[1].id.clone();
    if let Some(gw::checklist_source::Source::Checklist(c)) = long_ids.source.as_mut().and_then(|s| s.source.as_mut()) {
        c.items[0].id = "i".repeat(1024);
        c.items[1].category = "c".repeat(1024);
    }
    let err = client
        .run_pipeline(gw::RunPipelineRequest {
            open: false,
            pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(long_ids)),
            label: String::new(),
            budget: None,
        })
        .await
        .unwrap_err();
    let fields: Vec<String> = tonic_types::StatusExt::get_error_details(&err)
        .bad_request()
        .unwrap()
        .field_violations
        .iter()
        .map(|v| v.field.clone())
        .collect();
    for f in [
        "pipeline.records[0].id",
        "pipeline.records[2].id",
        "pipeline.source.checklist.items[0].id",
        "pipeline.source.checklist.items[1].category",
    ] {
        assert!(fields.contains(&f.to_string()), "{f} in {fields:?}");
    }
    assert!(err.message().len() < 4096, "the message does not echo the id back");
    let err = client
        .run_pipeline(gw::RunPipelineRequest {
            open: false,
            pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(pipeline(1))),
            label: "l".repeat(4 << 20),
            budget: None,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("label"), "{}", err.message());
    let events = run_to_end(sandbox.gateway().await, pipeline(2)).await;
    let run_id = events[0].run_id.clone();
    for after in [events.len() as u64, 1 << 63, u64::MAX] {
        let mut watch = client
            .watch_run(gw::WatchRunRequest { run_id: run_id.clone(), after_sequence: after })
            .await
            .unwrap()
            .into_inner();
        assert!(watch.message().await.unwrap().is_none(), "nothing after sequence {after}");
    }
    sandbox.shutdown().await.unwrap();
}

fn preset_pipeline(n: usize) -> gw::ChecklistEvalPipeline {
    let mut p = pipeline(n);
    p.source = Some(gw::ChecklistSource {
        source: Some(gw::checklist_source::Source::Preset(assay_proto::generator::v1::Preset::Tick as i32)),
    });
    for (i, r) in p.records.iter_mut().enumerate() {
        r.input = format!("Write about topic {i}.");
    }
    p
}

/// Start a checklist evaluation: its event stream and the run's id (from the first event).
async fn start(
    client: &mut GatewayServiceClient<Channel>,
    p: gw::ChecklistEvalPipeline,
) -> (tonic::Streaming<gw::RunPipelineResponse>, String) {
    let request = gw::RunPipelineRequest {
        open: false,
        pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(p)),
        label: String::new(),
        budget: None,
    };
    let mut stream = client.run_pipeline(request).await.unwrap().into_inner();
    let run_id = stream.message().await.unwrap().unwrap().event.unwrap().run_id;
    (stream, run_id)
}

/// Control a run; the run as the answer describes it.
async fn control(
    client: &mut GatewayServiceClient<Channel>,
    run_id: &str,
    action: gw::control_run_request::Action,
) -> gw::Run {
    let request = gw::ControlRunRequest { run_id: run_id.to_string(), action: Some(action), ..Default::default() };
    client.control_run(request).await.unwrap().into_inner().run.unwrap()
}

/// Every remaining event of a stream; the last one.
async fn drain(stream: &mut tonic::Streaming<gw::RunPipelineResponse>) -> gw::RunEvent {
    let mut last = None;
    while let Some(m) = stream.message().await.unwrap() {
        last = m.event;
    }
    last.expect("the stream ends with an event")
}

/// Cancel while checklists are generated: the generations in flight are dropped at the backend,
/// none starts after, and the run ends CANCELLED.
#[tokio::test]
async fn cancel_while_generating_drops_the_calls_in_flight() {
    let sandbox = MeshSandbox::start_with(SandboxOptions { concurrency: Some(2), ..Default::default() }).await;
    sandbox.llm.set_handler(|_| Reply::hang());
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let (mut stream, run_id) = start(&mut client, preset_pipeline(20)).await;
    assert!(assay_testkit::eventually(Duration::from_secs(10), || sandbox.llm.request_count() == 2).await);
    let run = control(&mut client, &run_id, gw::control_run_request::Action::Cancel(gw::CancelRun {})).await;
    assert_eq!(run.state, gw::RunState::Cancelled as i32);
    let last = drain(&mut stream).await;
    let Some(Event::Completed(c)) = last.event else { panic!("no completion") };
    assert_eq!(c.state, gw::RunState::Cancelled as i32);
    assert!(assay_testkit::eventually(Duration::from_secs(10), || sandbox.llm.cancelled_count() == 2).await);
    assert_eq!(sandbox.llm.request_count(), 2, "no generation started after the cancel");
    sandbox.shutdown().await.unwrap();
}

/// Pause while checklists are generated: the generations in flight finish, no new one starts
/// until resume; then every input is generated once and every record scored.
#[tokio::test]
async fn pause_while_generating_starts_nothing_until_resumed() {
    let sandbox = MeshSandbox::start_with(SandboxOptions { concurrency: Some(2), ..Default::default() }).await;
    sandbox.llm.set_handler(|req| {
        let prompt = req.last_user_message().unwrap_or_default();
        if prompt.contains("Q1:") {
            Reply::json(json!({"answers": [{"question_index": 1, "answer": "YES"}]}))
        } else {
            Reply::json(json!({"items": [{"question": "Does it stay on topic?"}]})).delay(Duration::from_millis(200))
        }
    });
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let (mut stream, run_id) = start(&mut client, preset_pipeline(6)).await;
    assert!(assay_testkit::eventually(Duration::from_secs(10), || sandbox.llm.request_count() == 2).await);
    control(&mut client, &run_id, gw::control_run_request::Action::Pause(gw::PauseRun {})).await;
    // The two generations in flight finish (their checklists arrive); nothing else starts.
    let mut ready = 0;
    while ready < 2 {
        if let Some(Event::ChecklistReady(_)) = stream.message().await.unwrap().unwrap().event.unwrap().event {
            ready += 1;
        }
    }
    let run = client.get_run(gw::GetRunRequest { run_id: run_id.clone() }).await.unwrap().into_inner().run.unwrap();
    assert_eq!(run.state, gw::RunState::Paused as i32);
    assert_eq!(sandbox.llm.request_count(), 2, "no call started while paused");
    control(&mut client, &run_id, gw::control_run_request::Action::Resume(gw::ResumeRun {})).await;
    let last = drain(&mut stream).await;
    let result = eval_result(&last).expect("completed");
    assert_eq!(result.checklists.len(), 6);
    assert!(result.results.iter().all(|r| r.score.is_some()));
    assert_eq!(sandbox.llm.request_count(), 6 + 6, "each input generated once, each record scored once");
    sandbox.shutdown().await.unwrap();
}

/// Pause while records are scored: the calls in flight finish, none starts until resume; then
/// every record is scored once.
#[tokio::test]
async fn pause_while_scoring_starts_nothing_until_resumed() {
    let sandbox = MeshSandbox::start_with(SandboxOptions { concurrency: Some(2), ..Default::default() }).await;
    sandbox.llm.set_handler(|req| answer(req).delay(Duration::from_millis(200)));
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let (mut stream, run_id) = start(&mut client, pipeline(8)).await;
    assert!(assay_testkit::eventually(Duration::from_secs(10), || sandbox.llm.request_count() >= 1).await);
    let paused = control(&mut client, &run_id, gw::control_run_request::Action::Pause(gw::PauseRun {})).await;
    assert_eq!(paused.state, gw::RunState::Paused as i32);
    let started = sandbox.llm.request_count();
    assert!(started < 8, "the pause came before the last record");
    // Every call in flight at the pause finishes and its record is scored; nothing else starts.
    let mut scored = 0;
    while scored < started {
        if let Some(Event::RecordScored(_)) = stream.message().await.unwrap().unwrap().event.unwrap().event {
            scored += 1;
        }
    }
    assert_eq!(sandbox.llm.request_count(), started, "no call started while paused");
    control(&mut client, &run_id, gw::control_run_request::Action::Resume(gw::ResumeRun {})).await;
    let last = drain(&mut stream).await;
    let result = eval_result(&last).expect("completed");
    assert_eq!(result.results.len(), 8);
    assert!(result.results.iter().all(|r| r.score.is_some()));
    assert_eq!(sandbox.llm.request_count(), 8, "each record scored once");
    sandbox.shutdown().await.unwrap();
}

/// Cancel while records are scored: the answer is CANCELLED, the calls in flight are dropped at
/// the backend and none starts after.
#[tokio::test]
async fn cancel_while_scoring_drops_the_calls_in_flight() {
    let sandbox = MeshSandbox::start_with(SandboxOptions { concurrency: Some(2), ..Default::default() }).await;
    let calls = Arc::new(AtomicUsize::new(0));
    let seen = calls.clone();
    // Two records are scored, then every call hangs.
    sandbox
        .llm
        .set_handler(move |req| if seen.fetch_add(1, Ordering::SeqCst) < 2 { answer(req) } else { Reply::hang() });
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let (mut stream, run_id) = start(&mut client, pipeline(10)).await;
    assert!(assay_testkit::eventually(Duration::from_secs(10), || sandbox.llm.request_count() == 4).await);
    let run = control(&mut client, &run_id, gw::control_run_request::Action::Cancel(gw::CancelRun {})).await;
    assert_eq!(run.state, gw::RunState::Cancelled as i32);
    assert!(assay_testkit::eventually(Duration::from_secs(10), || sandbox.llm.cancelled_count() == 2).await);
    assert_eq!(sandbox.llm.request_count(), 4, "no call started after the cancel");
    let last = drain(&mut stream).await;
    let Some(Event::Completed(c)) = last.event else { panic!("no completion") };
    assert_eq!(c.state, gw::RunState::Cancelled as i32);
    let stored = client.get_run(gw::GetRunRequest { run_id }).await.unwrap().into_inner().run.unwrap();
    assert_eq!(stored.records_done, 2, "the records scored before the cancel are kept");
    sandbox.shutdown().await.unwrap();
}
