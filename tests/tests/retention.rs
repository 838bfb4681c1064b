//! Deleting runs and keeping the store to a retention period: DeleteRun over gRPC and the admin
//! API (finished runs only; the id NOT_FOUND everywhere afterwards, watchers included), `assay runs
//! delete` (named, `--older-than`, `--dry-run`) and `gateway.retention_days` swept by `assay up`
//! on SQLite and PostgreSQL, with the runs' events and audit entries going with them.

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_runs::RunStore;
use assay_runs::store::RunWrite;
use assay_testkit::{Reply, ScriptedLlm, TempPostgres};
use assay_tests::{MeshSandbox, SandboxOptions, assay_up, workspace_binary};
use serde_json::Value;
use tonic::Code;

fn days_ago(days: i64) -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_secs() as i64 - days * 86_400
}

/// A finished run created `days` ago, with its completion event and an audit entry, written as
/// a gateway writes them (created running, ended in one write).
async fn stored_run(store: &RunStore, id: &str, days: i64, state: gw::RunState) {
    let mut run = gw::Run {
        run_id: id.into(),
        kind: gw::PipelineKind::ChecklistEval as i32,
        state: gw::RunState::Running as i32,
        label: format!("label of {id}"),
        created_at: Some(prost_types_timestamp(days_ago(days))),
        ..Default::default()
    };
    store.create(run.clone(), gw::RunPipelineRequest::default()).await.unwrap();
    run.state = state as i32;
    let completed = gw::RunEvent {
        run_id: id.into(),
        sequence: 1,
        time: None,
        event: Some(gw::run_event::Event::Completed(gw::RunCompleted { state: state as i32, result: None })),
    };
    let audit = RunWrite::Checkpoint { key: "engine:audit:00000001".into(), value: Vec::new() };
    store.write(id, vec![RunWrite::Event(Box::new(completed)), audit, RunWrite::Summary(Box::new(run))]).await.unwrap();
}

fn prost_types_timestamp(seconds: i64) -> prost_types::Timestamp {
    prost_types::Timestamp { seconds, nanos: 0 }
}

async fn get(client: &mut GatewayServiceClient<tonic::transport::Channel>, id: &str) -> Result<gw::Run, tonic::Status> {
    client.get_run(gw::GetRunRequest { run_id: id.into() }).await.map(|r| r.into_inner().run.unwrap())
}

/// `assay runs ...` against `gateway`: (exit code, stdout, stderr).
async fn runs(gateway: &str, args: &[&str]) -> (i32, String, String) {
    let o = tokio::process::Command::new(workspace_binary("assay", "assay-cli"))
        .arg("runs")
        .args(args)
        .args(["--gateway", gateway])
        .env("NO_COLOR", "1")
        .output()
        .await
        .unwrap();
    let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
    (o.status.code().unwrap_or(-1), text(&o.stdout), text(&o.stderr))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_run_is_not_found_anywhere_and_a_running_one_is_not_deleted() {
    let sandbox =
        MeshSandbox::start_with(SandboxOptions { concurrency: Some(1), admin: true, ..Default::default() }).await;
    sandbox.llm.set_handler(|_| Reply::hang());
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let mut stream = client
        .run_pipeline(gw::RunPipelineRequest {
            open: false,
            pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(assay_tests::leaves_eval(3))),
            label: "to delete".into(),
            budget: None,
        })
        .await
        .unwrap()
        .into_inner();
    let run_id = stream.message().await.unwrap().unwrap().event.unwrap().run_id;
    assert!(assay_testkit::eventually(Duration::from_secs(10), || sandbox.llm.request_count() == 1).await);

    // Running: refused, and the run goes on untouched.
    let refused = client.delete_run(gw::DeleteRunRequest { run_id: run_id.clone() }).await.unwrap_err();
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("still executing") && refused.message().contains("cancel"), "{refused:?}");
    let empty = client.delete_run(gw::DeleteRunRequest { run_id: String::new() }).await.unwrap_err();
    assert_eq!(empty.code(), Code::InvalidArgument);
    assert!(empty.message().contains("run_id"), "{empty:?}");

    // Cancelled (an audit entry), then deleted: the answer is the run as it was.
    client
        .control_run(gw::ControlRunRequest {
            run_id: run_id.clone(),
            action: Some(gw::control_run_request::Action::Cancel(gw::CancelRun {})),
            actor: "tester".into(),
            reason: "enough".into(),
        })
        .await
        .unwrap();
    while stream.message().await.unwrap().is_some() {}
    assert_eq!(get(&mut client, &run_id).await.unwrap().audit_log.len(), 1, "the cancel is audited");
    let deleted = client.delete_run(gw::DeleteRunRequest { run_id: run_id.clone() }).await.unwrap().into_inner();
    let deleted = deleted.run.unwrap();
    assert_eq!((deleted.state, deleted.label.as_str()), (gw::RunState::Cancelled as i32, "to delete"));

    // NOT_FOUND everywhere: GetRun, WatchRun, ControlRun, DeleteRun again; gone from ListRuns.
    assert_eq!(get(&mut client, &run_id).await.unwrap_err().code(), Code::NotFound);
    let watched = client.watch_run(gw::WatchRunRequest { run_id: run_id.clone(), after_sequence: 0 }).await;
    assert_eq!(watched.err().map(|s| s.code()), Some(Code::NotFound));
    let again = client.delete_run(gw::DeleteRunRequest { run_id: run_id.clone() }).await.unwrap_err();
    assert_eq!(again.code(), Code::NotFound);
    let control = client
        .control_run(gw::ControlRunRequest {
            run_id: run_id.clone(),
            action: Some(gw::control_run_request::Action::Pause(gw::PauseRun {})),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(control.code(), Code::NotFound);
    let listed = client.list_runs(gw::ListRunsRequest::default()).await.unwrap().into_inner();
    assert!(listed.runs.iter().all(|r| r.run_id != run_id));

    // The admin API: the same answers.
    let admin = sandbox.admin_url();
    let token = sandbox.admin_token().unwrap();
    let post = |method: &'static str, body: String| {
        let (admin, token) = (admin.clone(), token.clone());
        async move {
            let resp = reqwest::Client::new()
                .post(format!("{admin}/api/{method}"))
                .header("content-type", "application/json")
                .bearer_auth(token)
                .body(body)
                .send()
                .await
                .unwrap();
            (resp.status().as_u16(), resp.json::<Value>().await.unwrap())
        }
    };
    let body = serde_json::json!({"runId": run_id}).to_string();
    let (status, v) = post("GetRun", body.clone()).await;
    assert_eq!((status, v["code"].as_str()), (404, Some("NOT_FOUND")), "{v}");
    let (status, _) = post("DeleteRun", body).await;
    assert_eq!(status, 404);
    // A finished run deleted through the admin API.
    sandbox.llm.set_handler(assay_tests::leaves_judge(Duration::ZERO));
    let events =
        sandbox.run_pipeline(gw::run_pipeline_request::Pipeline::ChecklistEval(assay_tests::leaves_eval(2))).await;
    let second = events[0].run_id.clone();
    let (status, v) = post("DeleteRun", serde_json::json!({"runId": second}).to_string()).await;
    assert_eq!((status, v["run"]["state"].as_str()), (200, Some("RUN_STATE_SUCCEEDED")), "{v}");
    assert_eq!(get(&mut client, &second).await.unwrap_err().code(), Code::NotFound);
}

/// The CLI on a store holding runs of every age: named runs, `--older-than` with `--dry-run`.
async fn cli_deletes(gateway: &str) {
    let (code, out, err) = runs(gateway, &["delete", "new", "no-such-run"]).await;
    assert_eq!(code, 1, "a named run not deleted fails the command: {out} {err}");
    assert!(out.lines().any(|l| l.starts_with("deleted new ") && l.contains("succeeded")), "{out}");
    assert!(out.lines().any(|l| l == "not deleted no-such-run: NOT_FOUND: run no-such-run"), "{out}");
    assert!(err.contains("1 of the runs named could not be deleted"), "{err}");

    let (code, out, _) = runs(gateway, &["delete", "--older-than", "30d", "--dry-run"]).await;
    assert_eq!(code, 0);
    let mut would: Vec<&str> = out.lines().filter_map(|l| l.strip_prefix("would delete ")).collect();
    would.sort_unstable();
    assert_eq!(would, ["old-cancelled", "old-failed"], "{out}");
    let (code, out, _) = runs(gateway, &["show", "old-failed"]).await;
    assert_eq!(code, 0, "a dry run deletes nothing: {out}");

    let (code, out, err) = runs(gateway, &["delete", "--older-than", "30d", "--json"]).await;
    assert_eq!(code, 0, "{err}");
    let lines: Vec<Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(lines.iter().all(|l| l["deleted"] == true), "{out}");
    for id in ["old-failed", "old-cancelled", "new"] {
        let (code, _, err) = runs(gateway, &["show", id]).await;
        assert_eq!(code, 1, "{id}");
        assert!(err.contains("NOT_FOUND"), "{id}: {err}");
    }
    let (code, out, _) = runs(gateway, &["show", "recent"]).await;
    assert_eq!(code, 0, "younger than 30 days: kept: {out}");

    let (code, _, err) = runs(gateway, &["delete"]).await;
    assert_eq!(code, 1);
    assert!(err.contains("--older-than"), "{err}");
    let (code, _, err) = runs(gateway, &["delete", "--older-than", "30"]).await;
    assert_eq!(code, 2, "a bad age is a usage error: {err}");
    assert!(err.contains("expected a whole number and a unit"), "{err}");
}

/// The retention sweep of `assay up` on `store`: finished runs past 30 days go (with their events
/// and checkpoints), younger ones stay.
async fn swept(store: &RunStore, location: &str) {
    stored_run(store, "expired", 31, gw::RunState::Succeeded).await;
    stored_run(store, "kept", 29, gw::RunState::Succeeded).await;
    let llm = ScriptedLlm::start().await;
    let (mut up, gateway) = assay_up(
        Path::new(location),
        &llm.base_url(),
        &[("ASSAY__GATEWAY__RETENTION_DAYS", "30"), ("ASSAY__GATEWAY__INSTANCE_ID", "sweeper")],
    )
    .await;
    let mut client = GatewayServiceClient::connect(gateway.clone()).await.unwrap();
    let mut gone = false;
    for _ in 0..200 {
        if store.get("expired").await.unwrap().is_none() {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(gone, "the run past the retention period was not swept");
    assert!(store.events_after("expired", 0).await.unwrap().is_empty(), "its events went with it");
    assert!(store.checkpoints("expired", "").await.unwrap().is_empty(), "and its audit entries");
    assert_eq!(store.checkpoints("kept", "engine:audit:").await.unwrap().len(), 1);
    assert_eq!(get(&mut client, "expired").await.unwrap_err().code(), Code::NotFound);
    assert_eq!(get(&mut client, "kept").await.unwrap().label, "label of kept");
    up.kill().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_are_deleted_by_the_cli_and_swept_past_the_retention_on_sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("runs.db");
    {
        let store = RunStore::open_unlocked(path.to_str().unwrap()).unwrap();
        stored_run(&store, "old-failed", 45, gw::RunState::Failed).await;
        stored_run(&store, "old-cancelled", 31, gw::RunState::Cancelled).await;
        stored_run(&store, "recent", 2, gw::RunState::Partial).await;
        stored_run(&store, "new", 0, gw::RunState::Succeeded).await;
    }
    let llm = ScriptedLlm::start().await;
    let (mut up, gateway) = assay_up(&path, &llm.base_url(), &[]).await;
    cli_deletes(&gateway).await;
    up.kill().await.unwrap();
    let _ = up.wait().await;

    let sweep = dir.path().join("sweep.db");
    let store = RunStore::open_unlocked(sweep.to_str().unwrap()).unwrap();
    swept(&store, sweep.to_str().unwrap()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_are_deleted_by_the_cli_and_swept_past_the_retention_on_postgres() {
    let test = "runs_are_deleted_by_the_cli_and_swept_past_the_retention_on_postgres";
    let Some(pg) = TempPostgres::start_or_skip(test) else { return };
    let store = RunStore::connect(&pg.url(), "seeder", Duration::from_secs(30)).await.unwrap();
    stored_run(&store, "old-failed", 45, gw::RunState::Failed).await;
    stored_run(&store, "old-cancelled", 31, gw::RunState::Cancelled).await;
    stored_run(&store, "recent", 2, gw::RunState::Partial).await;
    stored_run(&store, "new", 0, gw::RunState::Succeeded).await;
    let llm = ScriptedLlm::start().await;
    let (mut up, gateway) = assay_up(Path::new(&pg.url()), &llm.base_url(), &[]).await;
    cli_deletes(&gateway).await;
    up.kill().await.unwrap();
    let _ = up.wait().await;
    swept(&store, &pg.url()).await;
}
