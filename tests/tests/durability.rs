//! Durability of accepted runs: the whole mesh (`assay up`, one process, a SQLite run store in a
//! temp dir, the scripted backend on loopback) is killed with SIGKILL at 20 different points of
//! a running evaluation and started again on the same store. Every run completes; every record is
//! in the result exactly once with the scores of a clean run, and none is reported scored twice.
//!
//! Needs the `assay` binary of this workspace (built by `cargo build -p assay-cli`, and by any
//! workspace test run).

#![allow(clippy::wildcard_enum_match_arm)]

use std::path::Path;
use std::time::Duration;

use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_proto::gateway::v1::run_event::Event;
use assay_testkit::ScriptedLlm;
use assay_tests::{check_like_clean, clean_leaves_run, leaves_eval, leaves_judge, watch_all};
use tokio::process::Child;
use tonic::transport::Channel;

const RECORDS: usize = 30;
const KILLS: usize = 20;

/// `assay up` on the scripted backend and the store at `store`: the child and its gateway address.
async fn up(store: &Path, backend: &str) -> (Child, String) {
    assay_tests::assay_up(store, backend, &[("ASSAY__GATEWAY__CONCURRENCY", "4")]).await
}

async fn client(url: &str) -> GatewayServiceClient<Channel> {
    GatewayServiceClient::new(Channel::from_shared(url.to_string()).unwrap().connect().await.expect("connect"))
}

#[tokio::test(flavor = "multi_thread")]
async fn runs_survive_sigkill_of_the_whole_mesh_at_20_points() {
    let llm = ScriptedLlm::start().await;
    llm.set_handler(leaves_judge(Duration::from_millis(15)));
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("runs.db");
    let (mut child, url) = up(&store, &llm.base_url()).await;
    let mut gateway = client(&url).await;

    let request = |label: String| gw::RunPipelineRequest {
        open: false,
        pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(leaves_eval(RECORDS))),
        label,
        budget: None,
    };
    let clean = clean_leaves_run(&mut gateway, RECORDS).await;

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
        check_like_clean(&events, &clean, &format!("run {run_id}, kill {kill} after {after} records"));
        let run = gateway.get_run(gw::GetRunRequest { run_id }).await.unwrap().into_inner().run.unwrap();
        assert_eq!(run.state, gw::RunState::Succeeded as i32);
        // Calls made twice: the records in flight at the kill, sent again after the restart.
        resent += llm.request_count() - calls_before - RECORDS;
    }
    eprintln!("{KILLS} kills: every run completed with the clean run's scores; {resent} calls repeated in all");
    child.start_kill().ok();
    child.wait().await.ok();
}
