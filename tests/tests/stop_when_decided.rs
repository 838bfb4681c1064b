//! A comparison of two responders that stops once decided (`stop_when_decided`): the records are
//! taken in a seeded random order, an anytime-valid confidence sequence is fed record by record,
//! and once it decides no new record is asked. Through the whole mesh on the scripted backend,
//! where model-b answers well every time and model-a weakly on two inputs in three.

use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_proto::gateway::v1::run_event::Event;
use assay_testkit::{RecordedRequest, Reply, ScriptedLlm};
use assay_tests::{MeshSandbox, all_results, assay_up, evaluation, responders_backend, start_open_run, watch_all};
use tonic::transport::Channel;

const RECORDS: usize = 300;

/// Generations: a schema-shaped checklist; responses: model-a weak on two inputs in three, model-b
/// strong; scorings: NO to the first question of a weak answer, YES to the rest.
fn handler(r: &RecordedRequest) -> Reply {
    responders_backend(|model, n| model == "model-a" && !n.is_multiple_of(3))(r)
}

fn responder(model: &str) -> gw::Responder {
    gw::Responder {
        model: Some(assay_proto::common::v1::ModelSpec { model: model.into(), ..Default::default() }),
        template: "Please answer: {input}".into(),
        ..Default::default()
    }
}

fn pipeline(stop: Option<gw::StopWhenDecided>) -> gw::ChecklistEvalPipeline {
    gw::ChecklistEvalPipeline {
        source: Some(gw::ChecklistSource {
            source: Some(gw::checklist_source::Source::Preset(assay_proto::generator::v1::Preset::Tick as i32)),
        }),
        records: (0..RECORDS)
            .map(|i| gw::EvalRecord {
                id: format!("q{i}"),
                input: format!("What about topic {i}?"),
                ..Default::default()
            })
            .collect(),
        responders: vec![responder("model-a"), responder("model-b")],
        stop_when_decided: stop,
        ..Default::default()
    }
}

fn stop(seed: u64) -> gw::StopWhenDecided {
    gw::StopWhenDecided { seed: Some(seed), ..Default::default() }
}

fn request(p: gw::ChecklistEvalPipeline) -> gw::RunPipelineRequest {
    gw::RunPipelineRequest {
        pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(p)),
        ..Default::default()
    }
}

async fn run(client: &mut GatewayServiceClient<Channel>, p: gw::ChecklistEvalPipeline) -> Vec<gw::RunEvent> {
    let mut stream = client.run_pipeline(request(p)).await.unwrap().into_inner();
    let mut events = Vec::new();
    while let Some(m) = stream.message().await.unwrap() {
        events.extend(m.event);
    }
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clear_difference_stops_the_run_early_and_the_backend_serves_less_than_half() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(handler);
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);

    let events = run(&mut client, pipeline(Some(stop(7)))).await;
    let served = sandbox.llm.request_count();
    let e = evaluation(events.last().unwrap()).expect("an evaluation");
    let q = e.sequential.clone().expect("the sequential result");
    let c = &q.comparisons[0];
    assert_eq!((c.baseline.as_str(), c.candidate.as_str()), ("model-a", "model-b"));
    assert_eq!(c.decision, gw::SequentialDecision::Better as i32, "{q:?}");
    assert!(c.low > 0.0 && c.mean_difference > 0.0, "{c:?}");
    assert!(q.stopped_early && q.records_used >= 30 && (q.records_used as usize) < RECORDS, "{q:?}");
    assert_eq!(q.seed, 7);
    // Every record asked has both responses judged; the others are listed, not failed.
    let asked = RECORDS - q.records_not_asked.len();
    assert_eq!(e.results.len(), 2 * asked);
    assert!(e.results.iter().all(|r| r.score.is_some()), "no record failed");
    assert!(e.responders.iter().all(|r| r.missing.is_empty()), "records not asked are not missing: {:?}", e.responders);
    let Some(Event::Completed(done)) = &events.last().unwrap().event else { panic!("no completion") };
    assert_eq!(done.state, gw::RunState::Succeeded as i32);
    // What the backend served: a generation, two responses and two scorings per record asked, less
    // than half of the full run's, and what the run says it spent.
    let full = RECORDS * 5;
    assert_eq!(served, asked * 5, "{asked} records asked");
    assert!(served * 2 < full, "served {served} of a full run's {full}");
    assert_eq!(e.usage.as_ref().unwrap().calls as usize, served);
    assert_eq!(q.calls_saved as usize, 5 * q.records_not_asked.len());
    // The interval as it narrowed: at most one update a second, records used growing.
    let updates: Vec<(&gw::ComparisonUpdated, &prost_types::Timestamp)> = events
        .iter()
        .filter_map(|ev| match &ev.event {
            Some(Event::ComparisonUpdated(u)) => Some((u, ev.time.as_ref().unwrap())),
            _ => None,
        })
        .collect();
    assert!(!updates.is_empty(), "the comparison was said");
    for pair in updates.windows(2) {
        let gap = (pair[1].1.seconds - pair[0].1.seconds) as f64 + f64::from(pair[1].1.nanos - pair[0].1.nanos) / 1e9;
        assert!(gap >= 0.99, "updates {gap:.3} s apart");
        assert!(pair[1].0.records_used > pair[0].0.records_used);
    }

    // The same request again: the same order, the same decision at the same record.
    let again = evaluation(run(&mut client, pipeline(Some(stop(7)))).await.last().unwrap()).unwrap();
    let q2 = again.sequential.unwrap();
    assert_eq!((q2.records_used, q2.comparisons[0].decision), (q.records_used, c.decision));
    sandbox.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_settings_are_checked_naming_the_field() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(handler);
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let mut one = pipeline(Some(stop(1)));
    one.responders.truncate(1);
    let alpha = pipeline(Some(gw::StopWhenDecided { alpha: 0.9, ..stop(1) }));
    let margin = pipeline(Some(gw::StopWhenDecided { margin: Some(1.5), ..stop(1) }));
    let min = pipeline(Some(gw::StopWhenDecided { min_records: 1000, ..stop(1) }));
    for (p, field) in [
        (one, "pipeline.stop_when_decided"),
        (alpha, "pipeline.stop_when_decided.alpha"),
        (margin, "pipeline.stop_when_decided.margin"),
        (min, "pipeline.stop_when_decided.min_records"),
    ] {
        let e = client.run_pipeline(request(p)).await.expect_err("refused");
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
        assert!(e.message().contains(field), "{field}: {}", e.message());
    }
    let mut open_one = pipeline(Some(stop(1)));
    open_one.responders.truncate(1);
    let e = client.run_pipeline(gw::RunPipelineRequest { open: true, ..request(open_one) }).await.expect_err("refused");
    assert!(e.code() == tonic::Code::InvalidArgument && e.message().contains("pipeline.stop_when_decided"), "{e:?}");
    assert_eq!(sandbox.llm.request_count(), 0, "nothing asked");
    sandbox.shutdown().await.unwrap();
}

/// SIGKILL of `assay up` mid-run: the restarted gateway reads the stored results back in the run's
/// order and reaches the same decision at the same record as a run never killed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_killed_midway_reaches_the_same_decision_at_the_same_record() {
    killed_midway(false).await;
}

/// The same for a run created open, its records appended and sealed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_run_killed_midway_reaches_the_same_decision_at_the_same_record() {
    killed_midway(true).await;
}

/// A run stopping when decided (seed 11): inline, or created open with the records appended and
/// sealed; its id and its events.
async fn start(
    client: &mut GatewayServiceClient<Channel>,
    open: bool,
) -> (Option<String>, tonic::Streaming<gw::RunPipelineResponse>) {
    if !open {
        return (None, client.run_pipeline(request(pipeline(Some(stop(11))))).await.unwrap().into_inner());
    }
    let mut p = pipeline(Some(stop(11)));
    let records = std::mem::take(&mut p.records);
    let (run_id, events) = start_open_run(client, p, "", None).await;
    let message = gw::AppendRecordsRequest { run_id: run_id.clone(), records, seal: true };
    client.append_records(futures::stream::iter([message])).await.expect("appended");
    (Some(run_id), events)
}

async fn killed_midway(open: bool) {
    let llm = ScriptedLlm::start().await;
    llm.set_handler(handler);
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("runs.db");
    let (mut child, url) = assay_up(&store, &llm.base_url(), &[]).await;
    let connect = |url: String| async move {
        GatewayServiceClient::new(Channel::from_shared(url).unwrap().connect().await.expect("connect"))
    };
    let mut client = connect(url).await;
    let (_, mut stream) = start(&mut client, open).await;
    let mut events = Vec::new();
    while let Some(m) = stream.message().await.unwrap() {
        events.extend(m.event);
    }
    let clean = evaluation(events.last().unwrap()).unwrap().sequential.unwrap();

    // Kill early, and late: after three quarters of the clean run's results (past its decision).
    let total = 2 * (RECORDS - clean.records_not_asked.len());
    for kill_at in [20, total * 3 / 4] {
        let (id, mut stream) = start(&mut client, open).await;
        let (mut run_id, mut scored) = (id.unwrap_or_default(), 0);
        while scored < kill_at {
            let ev = stream.message().await.unwrap().expect("the run goes on").event.unwrap();
            run_id.clone_from(&ev.run_id);
            scored += usize::from(matches!(ev.event, Some(Event::RecordScored(_))));
        }
        child.start_kill().expect("SIGKILL");
        child.wait().await.expect("reaped");
        drop(stream);
        let (next, url) = assay_up(&store, &llm.base_url(), &[]).await;
        child = next;
        client = connect(url).await;
        let events = watch_all(&mut client, &run_id).await;
        let resumed = evaluation(events.last().unwrap()).expect("an evaluation").sequential.unwrap();
        assert_eq!(resumed.records_used, clean.records_used, "killed after {kill_at}: {resumed:?} vs {clean:?}");
        assert_eq!(resumed.comparisons[0].decision, clean.comparisons[0].decision);
        assert_eq!(resumed.comparisons[0].pairs, clean.comparisons[0].pairs);
        assert!(resumed.stopped_early);
    }
    child.start_kill().ok();
    child.wait().await.ok();
}

/// An open run takes its records a block of 1,024 at a time, each shuffled once whole: here the
/// first block decides before the run is sealed, so the run ends SUCCEEDED with what it asked,
/// the records it never read are listed as not asked, and a later append is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_run_stops_once_decided_before_it_is_sealed() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(handler);
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    const N: usize = 1500;
    let mut p = pipeline(Some(stop(5)));
    p.records.clear();
    let records: Vec<gw::EvalRecord> = (0..N)
        .map(|i| gw::EvalRecord { id: format!("q{i}"), input: format!("What about topic {i}?"), ..Default::default() })
        .collect();
    let (run_id, mut stream) = start_open_run(&mut client, p, "open", None).await;
    let messages = [
        gw::AppendRecordsRequest { run_id: run_id.clone(), records: records[..1024].to_vec(), seal: false },
        gw::AppendRecordsRequest { run_id: run_id.clone(), records: records[1024..].to_vec(), seal: false },
    ];
    client.append_records(futures::stream::iter(messages)).await.expect("appended");
    let mut events = Vec::new();
    while let Some(m) = stream.message().await.unwrap() {
        events.extend(m.event);
    }
    let served = sandbox.llm.request_count();
    let Some(Event::Completed(done)) = &events.last().unwrap().event else { panic!("no completion") };
    assert_eq!(done.state, gw::RunState::Succeeded as i32, "{done:?}");
    let e = evaluation(events.last().unwrap()).expect("an evaluation");
    let q = e.sequential.clone().expect("the sequential result");
    assert_eq!(q.comparisons[0].decision, gw::SequentialDecision::Better as i32, "{q:?}");
    assert!(q.stopped_early && q.records_used >= 30, "{q:?}");
    assert_eq!(q.seed, 5);
    // Every record asked is from the first block; the rest (the second block never read) are
    // listed, each once.
    let (results, _) = all_results(&mut client, &run_id, 500).await;
    let asked = N - q.records_not_asked.len();
    assert_eq!(results.len(), 2 * asked);
    assert!(results.iter().all(|r| r.index < 2 * 1024 && r.score.is_some()), "asked from the first block, none failed");
    let mut listed = q.records_not_asked.clone();
    listed.sort();
    listed.dedup();
    assert_eq!(listed.len(), q.records_not_asked.len(), "each record listed once");
    for i in 1024..N {
        assert!(q.records_not_asked.contains(&format!("q{i}")), "q{i} is not asked");
    }
    assert_eq!(served, asked * 5, "{asked} records asked");
    assert_eq!(e.usage.as_ref().unwrap().calls as usize, served);
    // The run's progress ends whole: what it asked.
    let run = client.get_run(gw::GetRunRequest { run_id: run_id.clone() }).await.unwrap().into_inner().run.unwrap();
    assert_eq!((run.records_done, run.records_total), (2 * asked as u32, 2 * asked as u32));
    // The run has ended: more records are refused, saying so.
    let late = gw::AppendRecordsRequest { run_id: run_id.clone(), records: records[..1].to_vec(), seal: true };
    let refused = client.append_records(futures::stream::iter([late])).await.expect_err("the run has ended");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
    sandbox.shutdown().await.unwrap();
}

/// `assay eval --open --stop-when-decided` as a user runs it: a file of 12,000 records streamed
/// into an open run (two AppendRecords messages), which decides on its first block and ends,
/// sealed or not; the CLI writes what was asked and counts only that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assay_eval_open_stops_when_decided_and_counts_what_it_asked() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(handler);
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("prompts.jsonl");
    const N: usize = 12_000;
    let lines: Vec<String> = (0..N)
        .map(|i| serde_json::json!({"id": format!("q{i}"), "input": format!("What about topic {i}?")}).to_string())
        .collect();
    std::fs::write(&data, lines.join("\n") + "\n").unwrap();
    let out = dir.path().join("out.jsonl");
    let run = tokio::process::Command::new(assay_tests::workspace_binary("assay", "assay-cli"))
        .args(["eval", "--preset", "tick", "--gateway", &sandbox.gateway_url(), "--open", "--json"])
        .args([
            "--respond",
            "openai:model-a",
            "--respond",
            "openai:model-b",
            "--stop-when-decided",
            "--order-seed",
            "3",
        ])
        .arg("--data")
        .arg(&data)
        .arg("--out")
        .arg(&out)
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{stderr}");
    let stdout = String::from_utf8_lossy(&run.stdout);
    let summary: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let q = &summary["sequential"];
    assert_eq!(q["stoppedEarly"], true, "{summary}");
    assert_eq!(q["comparisons"][0]["decision"], "SEQUENTIAL_DECISION_BETTER", "{summary}");
    let not_asked = q["recordsNotAsked"].as_array().unwrap().len();
    let asked = N - not_asked;
    assert!(asked < 1024, "asked from the first block only: {asked}");
    assert_eq!(summary["records"], 2 * asked, "the responses it asked: {summary}");
    assert_eq!(std::fs::read_to_string(&out).unwrap().lines().count(), 2 * asked, "a line per response asked");
    assert_eq!(sandbox.llm.request_count(), 5 * asked);
    sandbox.shutdown().await.unwrap();
}
