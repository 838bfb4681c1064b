//! Runs of any size: a run created open takes its records as rows of the run store
//! (AppendRecords, at most 10,000 per message), scores them as they arrive, finishes once sealed,
//! and its results are read a page at a time (ListRunResults). `assay score` streams a file over
//! the per-request limit into one such run.

use std::collections::HashSet;
use std::time::Duration;

use assay_proto::common::v1 as pb;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_testkit::ScriptedLlm;
use assay_tests::{MeshSandbox, all_results, assay_up, leaves_eval, leaves_judge, start_open_run, workspace_binary};
use serde_json::Value;
use tonic::Code;
use tonic::transport::Channel;

type Client = GatewayServiceClient<Channel>;

fn leaves_records(range: std::ops::Range<usize>) -> Vec<gw::EvalRecord> {
    range
        .map(|i| gw::EvalRecord {
            id: format!("r{i}"),
            target: if i % 3 == 0 { format!("leaves {i}") } else { format!("stones {i}") },
            ..Default::default()
        })
        .collect()
}

/// An open run of the leaves checklist with `inline` records in its request: its id and events.
async fn start_open(
    client: &mut Client,
    inline: Vec<gw::EvalRecord>,
) -> (String, tonic::Streaming<gw::RunPipelineResponse>) {
    let mut pipeline = leaves_eval(0);
    pipeline.records = inline;
    start_open_run(client, pipeline, "open", None).await
}

async fn append(
    client: &mut Client,
    messages: Vec<gw::AppendRecordsRequest>,
) -> Result<gw::AppendRecordsResponse, tonic::Status> {
    client.append_records(futures::stream::iter(messages)).await.map(tonic::Response::into_inner)
}

fn message(run_id: &str, records: Vec<gw::EvalRecord>, seal: bool) -> gw::AppendRecordsRequest {
    gw::AppendRecordsRequest { run_id: run_id.into(), records, seal }
}

async fn get(client: &mut Client, run_id: &str) -> gw::Run {
    client.get_run(gw::GetRunRequest { run_id: run_id.into() }).await.unwrap().into_inner().run.unwrap()
}

fn evaluation(run: &gw::Run) -> gw::EvaluateResponse {
    match run.result.clone().and_then(|r| r.result) {
        Some(gw::run_result::Result::ChecklistEval(e)) => e,
        other => panic!("no evaluation: {other:?}"),
    }
}

fn invalid_field(s: &tonic::Status) -> Vec<String> {
    use tonic_types::StatusExt;
    assert_eq!(s.code(), Code::InvalidArgument, "{s:?}");
    s.get_details_bad_request().expect("BadRequest details").field_violations.iter().map(|v| v.field.clone()).collect()
}

/// The aggregates of two runs on the same records, to 1e-12.
fn assert_same_aggregate(a: &pb::AggregateScores, b: &pb::AggregateScores) {
    assert_eq!(a.targets, b.targets);
    for (x, y, what) in [
        (a.mean_primary_score, b.mean_primary_score, "mean"),
        (a.macro_pass_rate, b.macro_pass_rate, "macro"),
        (a.micro_pass_rate, b.micro_pass_rate, "micro"),
    ] {
        assert!((x - y).abs() < 1e-12, "{what}: {x} vs {y}");
    }
    assert_eq!(a.category_pass_rates.len(), b.category_pass_rates.len());
    for (x, y) in a.category_pass_rates.iter().zip(&b.category_pass_rates) {
        assert_eq!((&x.category, x.items), (&y.category, y.items));
        assert!((x.pass_rate - y.pass_rate).abs() < 1e-12, "{x:?} vs {y:?}");
    }
    let (ua, ub) = (a.uncertainty.unwrap(), b.uncertainty.unwrap());
    assert!((ua.se - ub.se).abs() < 1e-12 && (ua.mean - ub.mean).abs() < 1e-12, "{ua:?} vs {ub:?}");
    assert_eq!(ua.observations, ub.observations);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_run_takes_records_until_sealed_and_pages_its_results() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(leaves_judge(Duration::ZERO));
    let mut client = Client::new(sandbox.gateway().await);

    // The same 30 records inline, as the reference.
    let mut inline = leaves_eval(0);
    inline.records = leaves_records(0..30);
    let events = sandbox.run_pipeline(gw::run_pipeline_request::Pipeline::ChecklistEval(inline)).await;
    let reference = events.iter().rev().find_map(assay_tests::evaluation).unwrap();
    assert!(!reference.results_paged && reference.results.len() == 30);
    let calls = sandbox.llm.request_count();

    // Open with 5 inline, then 25 in two messages of one call; the run waits while unsealed.
    let (run_id, mut events) = start_open(&mut client, leaves_records(0..5)).await;
    let reply = append(
        &mut client,
        vec![message(&run_id, leaves_records(5..20), false), message("", leaves_records(20..25), false)],
    )
    .await
    .unwrap();
    assert_eq!((reply.appended, reply.records_total, reply.sealed), (20, 25, false));
    assert!(
        assay_testkit::eventually(Duration::from_secs(30), || sandbox.llm.request_count() == calls + 25).await,
        "the records appended are scored before the run is sealed"
    );
    let waiting = get(&mut client, &run_id).await;
    assert_eq!(waiting.state, gw::RunState::Running as i32, "unsealed: the run waits for more");
    assert!(waiting.open);
    assert_eq!(waiting.records_total, 25);

    // Refused appends: each names the field and leaves the run as it was.
    let dup = append(&mut client, vec![message(&run_id, leaves_records(3..4), false)]).await.unwrap_err();
    assert_eq!(invalid_field(&dup), ["records[0].id"]);
    assert!(dup.message().contains("\"r3\""), "{dup:?}");
    let mut bad = leaves_records(40..42);
    bad[1].target = " ".into();
    let bad = append(&mut client, vec![message(&run_id, bad, false)]).await.unwrap_err();
    assert_eq!(invalid_field(&bad), ["records[1].target"]);
    let too_many = append(&mut client, vec![message(&run_id, leaves_records(100..10_101), false)]).await.unwrap_err();
    assert_eq!(invalid_field(&too_many), ["records"]);
    assert!(too_many.message().contains("10000"), "{too_many:?}");
    let other = append(&mut client, vec![message(&run_id, vec![], false), message("someone-else", vec![], false)])
        .await
        .unwrap_err();
    assert_eq!(invalid_field(&other), ["run_id"]);
    let unknown = append(&mut client, vec![message("no-such-run", leaves_records(0..1), false)]).await.unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    let reference_run = &reference.run_id;
    let closed = append(&mut client, vec![message(reference_run, leaves_records(50..51), false)]).await.unwrap_err();
    assert_eq!(closed.code(), Code::FailedPrecondition, "{closed:?}");
    assert_eq!(get(&mut client, &run_id).await.records_total, 25);

    // Sealed with the last 5: the run finishes, its results paged.
    let reply = append(&mut client, vec![message(&run_id, leaves_records(25..30), true)]).await.unwrap();
    assert_eq!((reply.appended, reply.records_total, reply.sealed), (5, 30, true));
    while events.message().await.unwrap().is_some() {}
    let run = get(&mut client, &run_id).await;
    assert_eq!(
        (run.state, run.records_total, run.records_done, run.open),
        (gw::RunState::Succeeded as i32, 30, 30, false)
    );
    let e = evaluation(&run);
    assert!(e.results_paged && e.results.is_empty());
    assert_eq!(sandbox.llm.request_count(), calls + 30, "every record scored once");
    let sealed = append(&mut client, vec![message(&run_id, leaves_records(60..61), false)]).await.unwrap_err();
    assert_eq!(sealed.code(), Code::FailedPrecondition);
    assert!(sealed.message().contains("sealed") || sealed.message().contains("SUCCEEDED"), "{sealed:?}");

    // Pages of 7: 5 pages, the records in order, each as the inline run scored it.
    let (results, pages) = all_results(&mut client, &run_id, 7).await;
    assert_eq!(pages, 5);
    let ids: Vec<&str> = results.iter().map(|r| r.record_id.as_str()).collect();
    let want: Vec<String> = (0..30).map(|i| format!("r{i}")).collect();
    assert_eq!(ids, want);
    for (a, b) in results.iter().zip(&reference.results) {
        assert_eq!(
            (a.index, &a.score.as_ref().unwrap().primary_score),
            (b.index, &b.score.as_ref().unwrap().primary_score)
        );
    }
    assert_same_aggregate(e.aggregate.as_ref().unwrap(), reference.aggregate.as_ref().unwrap());

    // An inline run pages its results too; bad pages are named.
    let (inline_results, pages) = all_results(&mut client, reference_run, 8).await;
    assert_eq!((inline_results.len(), pages), (30, 4));
    assert_eq!(inline_results, reference.results);
    for (size, token, field) in [(10_001, "", "page_size"), (10, "x", "page_token"), (10, "0", "page_token")] {
        let s = client
            .list_run_results(gw::ListRunResultsRequest {
                run_id: run_id.clone(),
                page_size: size,
                page_token: token.into(),
            })
            .await
            .unwrap_err();
        assert_eq!(invalid_field(&s), [field]);
    }
    let missing = client
        .list_run_results(gw::ListRunResultsRequest { run_id: "nope".into(), ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), Code::NotFound);

    // Only checklist_eval runs are created open.
    let debate = client
        .run_pipeline(gw::RunPipelineRequest {
            pipeline: Some(gw::run_pipeline_request::Pipeline::Debate(gw::DebatePipeline::default())),
            label: String::new(),
            budget: None,
            open: true,
        })
        .await
        .unwrap_err();
    assert_eq!(invalid_field(&debate), ["open"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_run_cancelled_before_it_is_sealed_ends_cancelled_with_what_it_scored() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(leaves_judge(Duration::ZERO));
    let mut client = Client::new(sandbox.gateway().await);
    let (run_id, mut events) = start_open(&mut client, leaves_records(0..4)).await;
    // Cancel once all four are stored: a reply still on its way when the run is cancelled is cut off.
    let mut scored = 0;
    while scored < 4 {
        let ev = events.message().await.unwrap().expect("the run goes on").event.unwrap();
        scored += usize::from(matches!(ev.event, Some(gw::run_event::Event::RecordScored(_))));
    }
    assert_eq!(sandbox.llm.request_count(), 4);
    client
        .control_run(gw::ControlRunRequest {
            run_id: run_id.clone(),
            action: Some(gw::control_run_request::Action::Cancel(gw::CancelRun {})),
            actor: "tester".into(),
            reason: "no more data".into(),
        })
        .await
        .unwrap();
    while events.message().await.unwrap().is_some() {}
    let run = get(&mut client, &run_id).await;
    assert_eq!(run.state, gw::RunState::Cancelled as i32);
    let (results, _) = all_results(&mut client, &run_id, 100).await;
    assert_eq!(results.len(), 4, "what it scored is kept");
    let late = append(&mut client, vec![message(&run_id, leaves_records(4..5), true)]).await.unwrap_err();
    assert_eq!(late.code(), Code::FailedPrecondition);
}

/// The leaves checklist as `assay score` reads it.
fn checklist_file(dir: &std::path::Path) -> std::path::PathBuf {
    let path = dir.join("checklist.json");
    let items = serde_json::json!({"items": [
        {"id": "a", "question": "Mentions leaves?"},
        {"id": "b", "question": "Is it short?"},
    ]});
    std::fs::write(&path, items.to_string()).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assay_score_streams_a_file_over_the_request_limit_into_one_run() {
    const N: usize = 25_000;
    let llm = ScriptedLlm::start().await;
    llm.set_handler(leaves_judge(Duration::ZERO));
    let dir = tempfile::tempdir().unwrap();
    let (mut up, gateway) = assay_up(&dir.path().join("runs.db"), &llm.base_url(), &[]).await;
    let data = dir.path().join("records.jsonl");
    let lines: Vec<String> =
        leaves_records(0..N).iter().map(|r| serde_json::json!({"id": r.id, "target": r.target}).to_string()).collect();
    std::fs::write(&data, lines.join("\n") + "\n").unwrap();
    let out = dir.path().join("out.jsonl");
    let o = tokio::process::Command::new(workspace_binary("assay", "assay-cli"))
        .args(["score", "--checklist"])
        .arg(checklist_file(dir.path()))
        .arg("--data")
        .arg(&data)
        .arg("--out")
        .arg(&out)
        .args(["--json", "--gateway", &gateway])
        .env("NO_COLOR", "1")
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{stderr}");
    let summary: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((summary["records"].as_u64(), summary["failed"].as_u64()), (Some(N as u64), Some(0)), "{summary}");
    let run_id = summary["runId"].as_str().unwrap().to_string();

    // Every record asked about: one scorer call per record, and a few more when the backend
    // client's adaptive attempt timeout sent a slow call again (its result is written once).
    let asked: HashSet<String> = llm.requests().iter().map(|r| r.last_user_message().unwrap_or_default()).collect();
    assert_eq!(asked.len(), N, "every record asked about");
    let served = llm.request_count();
    assert!(
        (N..=N + N / 100).contains(&served),
        "{served} calls served for {N} records; the run counted {}",
        summary["usage"]["calls"]
    );

    // The --out lines: one per record, in record order, every one scored.
    let written = std::fs::read_to_string(&out).unwrap();
    let written: Vec<Value> = written.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(written.len(), N);
    for (i, line) in written.iter().enumerate() {
        assert_eq!((line["index"].as_u64(), line["id"].as_str()), (Some(i as u64), Some(format!("r{i}").as_str())));
        assert!(line["primary_score"].is_f64(), "{line}");
    }

    // The stored run: one run of N records, its results read back page by page equal to the
    // records sent, its aggregates those of the results.
    let mut client = Client::connect(gateway.clone()).await.unwrap();
    let run = get(&mut client, &run_id).await;
    assert_eq!((run.state, run.records_total, run.records_done), (gw::RunState::Succeeded as i32, N as u32, N as u32));
    let (results, pages) = all_results(&mut client, &run_id, 10_000).await;
    assert_eq!(pages, 3);
    let ids: Vec<&str> = results.iter().map(|r| r.record_id.as_str()).collect();
    let sent: Vec<String> = (0..N).map(|i| format!("r{i}")).collect();
    assert_eq!(ids, sent);
    let checklist = assay_domain::Checklist {
        items: vec![
            assay_domain::ChecklistItem::new("a", "Mentions leaves?"),
            assay_domain::ChecklistItem::new("b", "Is it short?"),
        ],
        ..Default::default()
    };
    let scores: Vec<assay_domain::Score> =
        results.iter().map(|r| assay_proto::convert::score_from(r.score.clone().unwrap())).collect();
    let want = assay_proto::convert::aggregate_to(&assay_domain::AggregateScores::compute(
        scores.iter().map(|s| (s, &checklist)),
    ));
    assert_same_aggregate(evaluation(&run).aggregate.as_ref().unwrap(), &want);

    // `assay runs results` reads the same lines.
    let again = tokio::process::Command::new(workspace_binary("assay", "assay-cli"))
        .args(["runs", "results", &run_id, "--gateway", &gateway])
        .output()
        .await
        .unwrap();
    assert!(again.status.success(), "{}", String::from_utf8_lossy(&again.stderr));
    assert_eq!(String::from_utf8_lossy(&again.stdout), std::fs::read_to_string(&out).unwrap());
    up.kill().await.unwrap();
}

/// An open run of `n` leaves records through `assay up` on `store`, killed (SIGKILL) once
/// `kill_at` calls are served and started again on the same store: the run is taken back, every
/// record has one result, in order, and the calls made again are at most those in flight at the
/// kill. Killed past the first page of records (1,024), the resumed run reads pages whose records
/// all have a result before it finds work.
async fn killed_and_resumed(store: &std::path::Path, n: usize, kill_at: usize) {
    let llm = ScriptedLlm::start().await;
    llm.set_handler(leaves_judge(Duration::from_millis(5)));
    let (mut up, gateway) = assay_up(store, &llm.base_url(), &[("ASSAY__GATEWAY__INSTANCE_ID", "gw-1")]).await;
    let mut client = Client::connect(gateway).await.unwrap();
    let (run_id, _events) = start_open(&mut client, Vec::new()).await;
    let messages = (0..n).step_by(1000).map(|s| message(&run_id, leaves_records(s..(s + 1000).min(n)), s + 1000 >= n));
    let reply = append(&mut client, messages.collect()).await.unwrap();
    assert_eq!((reply.records_total, reply.sealed), (n as u64, true));
    assert!(assay_testkit::eventually(Duration::from_secs(60), || llm.request_count() >= kill_at).await);
    up.start_kill().unwrap();
    up.wait().await.unwrap();
    let served_before = llm.request_count();
    assert!(served_before < n, "killed before the end ({served_before} of {n} served)");

    let (mut up, gateway) = assay_up(store, &llm.base_url(), &[("ASSAY__GATEWAY__INSTANCE_ID", "gw-1")]).await;
    let mut client = Client::connect(gateway).await.unwrap();
    let mut watch =
        client.watch_run(gw::WatchRunRequest { run_id: run_id.clone(), after_sequence: 0 }).await.unwrap().into_inner();
    let ended =
        tokio::time::timeout(Duration::from_secs(120), async { while watch.message().await.unwrap().is_some() {} })
            .await;
    let run = get(&mut client, &run_id).await;
    assert!(ended.is_ok(), "the resumed run never ended: {} of {n} done", run.records_done);
    assert_eq!((run.state, run.records_total, run.records_done), (gw::RunState::Succeeded as i32, n as u32, n as u32));
    let (results, _) = all_results(&mut client, &run_id, 10_000).await;
    let ids: Vec<String> = results.iter().map(|r| r.record_id.clone()).collect();
    assert_eq!(ids, (0..n).map(|i| format!("r{i}")).collect::<Vec<_>>(), "one result per record, in order");
    assert!(results.iter().all(|r| r.score.is_some()));
    // Calls in flight at the kill are asked again, and on a shared store (the run spread in
    // chunks, results stored a batch at a time by the claim) those of its chunk not stored yet:
    // at most the chunk of 1,024. Nothing stored before is asked again.
    let again = llm.request_count() - n;
    let bound = if store.to_string_lossy().starts_with("postgres") { 1024 } else { 512 };
    assert!(again <= bound, "{again} calls made again after the restart");
    assert_eq!(evaluation(&run).aggregate.unwrap().targets, n as u32);
    up.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_run_killed_midway_resumes_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    killed_and_resumed(&dir.path().join("runs.db"), 3000, 1000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_run_killed_past_its_first_page_resumes_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    killed_and_resumed(&dir.path().join("runs.db"), 3000, 2400).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_run_killed_midway_resumes_on_postgres() {
    let Some(pg) = assay_testkit::TempPostgres::start_or_skip("an_open_run_killed_midway_resumes_on_postgres") else {
        return;
    };
    killed_and_resumed(std::path::Path::new(&pg.url()), 3000, 1000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_run_killed_past_its_first_page_resumes_on_postgres() {
    let Some(pg) =
        assay_testkit::TempPostgres::start_or_skip("an_open_run_killed_past_its_first_page_resumes_on_postgres")
    else {
        return;
    };
    killed_and_resumed(std::path::Path::new(&pg.url()), 3000, 2400).await;
}

/// More distinct inputs than the run keeps checklists of in memory (4,096): each input's
/// checklist generated once, every record scored against it, and the aggregates read back from
/// the store at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_tick_run_generates_each_inputs_checklist_once_past_the_cache() {
    const N: usize = 10_000;
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(assay_testkit::schema_handler(Duration::ZERO));
    let mut client = Client::new(sandbox.gateway().await);
    let mut pipeline = gw::ChecklistEvalPipeline {
        source: Some(gw::ChecklistSource {
            source: Some(gw::checklist_source::Source::Preset(assay_proto::generator::v1::Preset::Tick as i32)),
        }),
        ..Default::default()
    };
    // Two records per input, far apart: the second reads its input's checklist back.
    pipeline.records = Vec::new();
    let records: Vec<gw::EvalRecord> = (0..N)
        .map(|i| gw::EvalRecord {
            id: format!("r{i}"),
            input: format!("Explain topic {} simply.", i % (N / 2)),
            target: format!("An answer {i}."),
            ..Default::default()
        })
        .collect();
    let (run_id, mut events) = start_open_run(&mut client, pipeline, "tick", None).await;
    let messages: Vec<_> =
        records.chunks(1000).enumerate().map(|(k, c)| message(&run_id, c.to_vec(), k == N / 1000 - 1)).collect();
    append(&mut client, messages).await.unwrap();
    let mut ready = 0;
    while let Some(m) = events.message().await.unwrap() {
        ready += usize::from(matches!(m.event.and_then(|e| e.event), Some(gw::run_event::Event::ChecklistReady(_))));
    }
    let run = get(&mut client, &run_id).await;
    assert_eq!(run.state, gw::RunState::Succeeded as i32, "{:?}", run.result);
    assert_eq!(ready, N / 2, "one checklist per distinct input");
    let (results, _) = all_results(&mut client, &run_id, 10_000).await;
    assert_eq!(results.len(), N);
    for i in 0..N / 2 {
        assert_eq!(
            results[i].checklist_id,
            results[i + N / 2].checklist_id,
            "records {i} and {} share an input",
            i + N / 2
        );
    }
    assert_eq!(sandbox.llm.request_count(), N / 2 + N, "a generation per input and a scoring per record");
    assert_eq!(evaluation(&run).aggregate.unwrap().targets, N as u32);
}

/// A checklist with categories: the open run's category pass rates, read back with each record's
/// checklist at the end, are the inline run's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_runs_category_rates_are_the_inline_runs() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(leaves_judge(Duration::ZERO));
    let mut client = Client::new(sandbox.gateway().await);
    let mut pipeline = leaves_eval(0);
    if let Some(gw::checklist_source::Source::Checklist(c)) = pipeline.source.as_mut().and_then(|s| s.source.as_mut()) {
        c.items[0].category = "topic".into();
    }
    let mut inline = pipeline.clone();
    inline.records = leaves_records(0..12);
    let events = sandbox.run_pipeline(gw::run_pipeline_request::Pipeline::ChecklistEval(inline)).await;
    let reference = events.iter().rev().find_map(assay_tests::evaluation).unwrap();
    let want = reference.aggregate.unwrap();
    assert_eq!(want.category_pass_rates.len(), 2, "{want:?}");

    pipeline.records = leaves_records(0..12);
    let (run_id, mut events) = start_open_run(&mut client, pipeline, "open", None).await;
    append(&mut client, vec![message(&run_id, Vec::new(), true)]).await.unwrap();
    while events.message().await.unwrap().is_some() {}
    let run = get(&mut client, &run_id).await;
    assert_same_aggregate(evaluation(&run).aggregate.as_ref().unwrap(), &want);
}

/// A second `assay up` on the SQLite file a live one holds is refused at start, naming the file,
/// the process and PostgreSQL for several gateways: before, it resumed the first one's running
/// run and both executed it. The first one finishes its run alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_gateway_on_a_live_sqlite_file_is_refused_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("runs.db");
    let llm = ScriptedLlm::start().await;
    llm.set_handler(leaves_judge(Duration::from_millis(5)));
    let (mut up, gateway) = assay_up(&store, &llm.base_url(), &[]).await;
    let mut client = Client::connect(gateway).await.unwrap();
    let (run_id, _events) = start_open(&mut client, leaves_records(0..50)).await;
    let second = tokio::process::Command::new(workspace_binary("assay", "assay-cli"))
        .args(["up", "--backend", "openai"])
        .env("OPENAI_BASE_URL", llm.base_url())
        .env("OPENAI_API_KEY", "assay-tests")
        .env("ASSAY__GATEWAY__STORE", &store)
        .env("NO_COLOR", "1")
        .envs(
            ["GATEWAY", "GENERATOR", "REFINERS", "SCORER", "ARBITER", "DELTA_JUDGE", "DEBATE", "ADMIN"]
                .map(|p| (format!("ASSAY__PORTS__{p}"), "0")),
        )
        .output();
    let second = tokio::time::timeout(Duration::from_secs(60), second).await.expect("refused at once").unwrap();
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "a second gateway started on a live SQLite file: {stderr}");
    assert!(stderr.contains("in use by another gateway") && stderr.contains("postgres://"), "{stderr}");
    assert!(stderr.contains(&store.display().to_string()), "names the file: {stderr}");
    append(&mut client, vec![message(&run_id, Vec::new(), true)]).await.unwrap();
    let mut watch =
        client.watch_run(gw::WatchRunRequest { run_id: run_id.clone(), after_sequence: 0 }).await.unwrap().into_inner();
    while watch.message().await.unwrap().is_some() {}
    let run = get(&mut client, &run_id).await;
    assert_eq!((run.state, run.records_done), (gw::RunState::Succeeded as i32, 50));
    assert_eq!(llm.request_count(), 50, "each record judged once, by the one gateway");
    up.kill().await.unwrap();
}
