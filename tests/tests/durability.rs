//! Durability of accepted runs: the whole mesh (`assay up`, one process, a SQLite run store in a
//! temp dir, the scripted backend on loopback) is killed with SIGKILL at 20 different points of
//! a running evaluation and started again on the same store. Every run completes; every record is
//! in the result exactly once with the scores of a clean run, and none is reported scored twice.
//!
//! Needs the `assay` binary of this workspace (built by `cargo build -p assay-cli`, and by any
//! workspace test run).

#![allow(clippy::wildcard_enum_match_arm)]

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use assay_proto::common::v1 as pb;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_proto::gateway::v1::run_event::Event;
use assay_testkit::{RecordedRequest, Reply, ScriptedLlm};
use assay_tests::{evaluation, scores, watch_all};
use serde_json::json;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tonic::transport::Channel;

const RECORDS: usize = 30;
const KILLS: usize = 20;

fn assay_binary() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let dir = exe.parent().and_then(Path::parent).expect("target profile directory");
    let bin = dir.join("assay");
    assert!(bin.exists(), "{} is missing: build it with `cargo build -p assay-cli`", bin.display());
    bin
}

/// `assay up` on the scripted backend and the store at `store`: the child and its gateway address.
async fn up(store: &Path, backend: &str) -> (Child, String) {
    let mut child = Command::new(assay_binary())
        .args(["up", "--backend", "openai"])
        .env("OPENAI_BASE_URL", backend)
        .env("OPENAI_API_KEY", "durability")
        .env("OPENAI_MODEL", "scripted")
        .env("ASSAY__GATEWAY__STORE", store)
        .env("ASSAY__GATEWAY__CONCURRENCY", "4")
        .env("ASSAY__CACHE__ENABLED", "false")
        .env("RUST_LOG", "warn")
        .env("NO_COLOR", "1")
        .envs(
            ["GATEWAY", "GENERATOR", "REFINERS", "SCORER", "ARBITER", "DELTA_JUDGE", "DEBATE", "ADMIN"]
                .map(|p| (format!("ASSAY__PORTS__{p}"), "0")),
        )
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("assay up starts");
    let mut lines = BufReader::new(child.stderr.take().expect("stderr")).lines();
    let addr = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await.expect("read stderr") {
            if let Some(rest) = line.split("gateway on ").nth(1) {
                return rest.split_whitespace().next().map(str::to_string);
            }
        }
        None
    })
    .await
    .expect("the mesh says it is up within 60 s")
    .expect("the mesh prints its gateway address");
    // Keep draining stderr so the child never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, format!("http://{addr}"))
}

async fn client(url: &str) -> GatewayServiceClient<Channel> {
    GatewayServiceClient::new(Channel::from_shared(url.to_string()).unwrap().connect().await.expect("connect"))
}

fn pipeline() -> gw::ChecklistEvalPipeline {
    gw::ChecklistEvalPipeline {
        source: Some(gw::ChecklistSource {
            source: Some(gw::checklist_source::Source::Checklist(pb::Checklist {
                items: vec![
                    pb::ChecklistItem { id: "a".into(), question: "Mentions leaves?".into(), ..Default::default() },
                    pb::ChecklistItem { id: "b".into(), question: "Is it short?".into(), ..Default::default() },
                ],
                ..Default::default()
            })),
        }),
        records: (0..RECORDS)
            .map(|i| gw::EvalRecord {
                id: format!("r{i}"),
                target: if i % 3 == 0 { format!("leaves {i}") } else { format!("stones {i}") },
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    }
}

fn model(req: &RecordedRequest) -> Reply {
    let prompt = req.last_user_message().unwrap_or_default();
    let first = if prompt.contains("leaves") { "YES" } else { "NO" };
    Reply::json(json!({"answers": [{"question_index": 1, "answer": first}, {"question_index": 2, "answer": "YES"}]}))
        .delay(Duration::from_millis(15))
}

#[tokio::test(flavor = "multi_thread")]
async fn runs_survive_sigkill_of_the_whole_mesh_at_20_points() {
    let llm = ScriptedLlm::start().await;
    llm.set_handler(model);
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("runs.db");
    let (mut child, url) = up(&store, &llm.base_url()).await;
    let mut gateway = client(&url).await;

    let request = |label: String| gw::RunPipelineRequest {
        pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(pipeline())),
        label,
    };
    let mut stream = gateway.run_pipeline(request("clean".into())).await.unwrap().into_inner();
    let mut last = None;
    while let Some(m) = stream.message().await.unwrap() {
        last = m.event;
    }
    let clean = evaluation(&last.unwrap()).expect("the clean run completes");
    assert_eq!(clean.results.iter().filter(|r| r.score.is_some()).count(), RECORDS);

    let mut resent = 0usize;
    for kill in 0..KILLS {
        // Kill points spread over the run: before any record, after some, near the end.
        let after = (kill * 7) % RECORDS;
        let calls_before = llm.request_count();
        let mut stream = gateway.run_pipeline(request(format!("kill-{kill}"))).await.unwrap().into_inner();
        let mut run_id = String::new();
        let mut scored = 0;
        while scored < after {
            let ev = stream.message().await.unwrap().expect("the run goes on").event.unwrap();
            run_id.clone_from(&ev.run_id);
            scored += usize::from(matches!(ev.event, Some(Event::RecordScored(_))));
        }
        if run_id.is_empty() {
            run_id = stream.message().await.unwrap().unwrap().event.unwrap().run_id;
        }
        child.start_kill().expect("SIGKILL");
        child.wait().await.expect("reaped");
        drop(stream);

        let (next, url) = up(&store, &llm.base_url()).await;
        child = next;
        gateway = client(&url).await;
        let events = watch_all(&mut gateway, &run_id).await;
        let done = evaluation(events.last().expect("events")).unwrap_or_else(|| panic!("run {run_id} completes"));
        assert_eq!(scores(&done), scores(&clean), "kill {kill} after {after} records: same records and scores");
        assert_eq!(done.aggregate, clean.aggregate, "kill {kill}: same aggregate");
        let indices: Vec<u32> = events
            .iter()
            .filter_map(|e| match &e.event {
                Some(Event::RecordScored(r)) => Some(r.index),
                _ => None,
            })
            .collect();
        let unique: HashSet<u32> = indices.iter().copied().collect();
        assert_eq!(unique.len(), indices.len(), "kill {kill}: no record reported scored twice: {indices:?}");
        let seqs: Vec<u64> = events.iter().map(|e| e.sequence).collect();
        assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>(), "kill {kill}: one gap-free sequence");
        let run = gateway.get_run(gw::GetRunRequest { run_id }).await.unwrap().into_inner().run.unwrap();
        assert_eq!(run.state, gw::RunState::Succeeded as i32);
        // Calls made twice: the records in flight at the kill, sent again after the restart.
        resent += llm.request_count() - calls_before - RECORDS;
    }
    eprintln!("{KILLS} kills: every run completed with the clean run's scores; {resent} calls repeated in all");
    child.start_kill().ok();
    child.wait().await.ok();
}
