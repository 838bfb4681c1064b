//! The gateway as its own process, with the stages in separate processes (as deployed): killed
//! with SIGKILL mid-run and restarted on its SQLite store; and two gateways sharing one
//! PostgreSQL run store (a real server started on loopback), where killing the one executing a
//! run lets the other take it over and finish it, with every record once and the scores of a
//! clean run. Controls and watching work through either gateway.
//!
//! Needs the workspace's `assay` binary (`assay serve gateway`, `assay serve scorer`; built by any
//! workspace test run, or `cargo build -p assay-cli`).

#![allow(clippy::wildcard_enum_match_arm)]

use std::time::{Duration, Instant};

use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_proto::gateway::v1::run_event::Event;
use assay_testkit::{ScriptedLlm, TempPostgres};
use assay_tests::{check_like_clean as check, clean_leaves_run, leaves_eval, leaves_judge, watch_all};
use tokio::process::Child;
use tonic::transport::Channel;

const RECORDS: usize = 24;

use assay_tests::serve as spawn;

async fn scorer(llm: &ScriptedLlm) -> (Child, String) {
    spawn(
        "scorer",
        &[
            ("ASSAY__PORTS__SCORER", "0".into()),
            ("ASSAY__MODELS__DEFAULT__BACKEND", "openai".into()),
            ("OPENAI_BASE_URL", llm.base_url()),
            ("OPENAI_API_KEY", "multi".into()),
            ("OPENAI_MODEL", "scripted".into()),
            ("ASSAY__CACHE__ENABLED", "false".into()),
        ],
    )
    .await
}

async fn gateway(store: &str, name: &str, scorer: &str) -> (Child, GatewayServiceClient<Channel>) {
    let (child, url) = spawn(
        "gateway",
        &[
            ("ASSAY__PORTS__GATEWAY", "0".into()),
            ("ASSAY__GATEWAY__STORE", store.into()),
            ("ASSAY__GATEWAY__INSTANCE_ID", name.into()),
            ("ASSAY__GATEWAY__LEASE_SECONDS", "2".into()),
            ("ASSAY__GATEWAY__CONCURRENCY", "2".into()),
            ("ASSAY__UPSTREAMS__SCORER", scorer.into()),
        ],
    )
    .await;
    let channel = Channel::from_shared(url).unwrap().connect().await.expect("connect to the gateway");
    (child, GatewayServiceClient::new(channel))
}

fn request(label: &str) -> gw::RunPipelineRequest {
    gw::RunPipelineRequest {
        open: false,
        label: label.into(),
        pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(leaves_eval(RECORDS))),
        budget: None,
    }
}

/// Start a run and read its stream until `after` records are scored; returns the run id.
async fn start_until(client: &mut GatewayServiceClient<Channel>, label: &str, after: usize) -> String {
    let mut stream = client.run_pipeline(request(label)).await.expect("run starts").into_inner();
    let mut run_id = String::new();
    let mut scored = 0;
    while run_id.is_empty() || scored < after {
        let ev = stream.message().await.unwrap().expect("the run goes on").event.unwrap();
        run_id.clone_from(&ev.run_id);
        scored += usize::from(matches!(ev.event, Some(Event::RecordScored(_))));
    }
    run_id
}

#[tokio::test(flavor = "multi_thread")]
async fn standalone_gateway_survives_sigkill_with_stages_in_separate_processes() {
    let llm = ScriptedLlm::start().await;
    llm.set_handler(leaves_judge(Duration::from_millis(40)));
    let (_scorer, scorer_url) = scorer(&llm).await;
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("runs.db").display().to_string();
    let (mut child, mut client) = gateway(&store, "solo", &scorer_url).await;
    let clean = clean_leaves_run(&mut client, RECORDS).await;
    let mut resent = 0;
    for (kill, after) in [0usize, 5, 11, 17, 23].into_iter().enumerate() {
        let calls_before = llm.request_count();
        let run_id = start_until(&mut client, &format!("kill-{kill}"), after).await;
        child.start_kill().expect("SIGKILL");
        child.wait().await.expect("reaped");
        (child, client) = gateway(&store, "solo", &scorer_url).await;
        let events = watch_all(&mut client, &run_id).await;
        check(&events, &clean, &format!("kill {kill} after {after} records"));
        // Calls made twice: the records in flight at the kill, sent again after the restart.
        resent += llm.request_count() - calls_before - RECORDS;
    }
    eprintln!("5 kills of the gateway alone: every run completed with the clean run's scores; {resent} calls repeated");
}

#[tokio::test(flavor = "multi_thread")]
async fn two_gateways_on_one_postgres_store_survive_the_loss_of_either() {
    let Some(pg) = TempPostgres::start_or_skip("two_gateways_on_one_postgres_store") else { return };
    let store = pg.url();
    let llm = ScriptedLlm::start().await;
    llm.set_handler(leaves_judge(Duration::from_millis(40)));
    let (_scorer, scorer_url) = scorer(&llm).await;
    let (mut a, mut client_a) = gateway(&store, "gw-a", &scorer_url).await;
    let (mut b, mut client_b) = gateway(&store, "gw-b", &scorer_url).await;
    let clean = clean_leaves_run(&mut client_a, RECORDS).await;

    // A run executed by A is seen, controlled and watched through B.
    let run_id = start_until(&mut client_a, "controlled", 2).await;
    let control = |action: gw::control_run_request::Action| gw::ControlRunRequest {
        run_id: run_id.clone(),
        actor: "operator".into(),
        reason: "through the other gateway".into(),
        action: Some(action),
    };
    let paused = client_b.control_run(control(gw::control_run_request::Action::Pause(gw::PauseRun {}))).await.unwrap();
    assert_eq!(paused.into_inner().run.unwrap().state, gw::RunState::Paused as i32, "paused through B");
    let on_a = client_a.get_run(gw::GetRunRequest { run_id: run_id.clone() }).await.unwrap().into_inner();
    assert_eq!(on_a.run.unwrap().state, gw::RunState::Paused as i32, "A executes the pause");
    // A control A refuses is refused through B too, with A's reason.
    let refused = client_b
        .control_run(control(gw::control_run_request::Action::Accept(gw::AcceptRun {})))
        .await
        .expect_err("accept does not apply to a checklist_eval run");
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("targeted refinement runs only"), "A's reason: {}", refused.message());
    client_b.control_run(control(gw::control_run_request::Action::Resume(gw::ResumeRun {}))).await.unwrap();
    let events = watch_all(&mut client_b, &run_id).await;
    check(&events, &clean, "controlled through B, watched through B");

    // Kill whichever gateway executes a run: the other takes it over once the lease expires and
    // finishes it; a watcher on the survivor follows it from start to end.
    let mut takeovers = Vec::new();
    for round in 0..2 {
        let after = [3, 9][round];
        let run_id = start_until(&mut client_a, &format!("takeover-{round}"), after).await;
        let watcher = {
            let mut client_b = client_b.clone();
            let run_id = run_id.clone();
            tokio::spawn(async move { watch_all(&mut client_b, &run_id).await })
        };
        let killed_at = Instant::now();
        a.start_kill().expect("SIGKILL");
        a.wait().await.expect("reaped");
        let events = watcher.await.unwrap();
        takeovers.push(killed_at.elapsed());
        check(&events, &clean, &format!("round {round}: A killed after {after} records, B finished"));
        let took_over =
            events.iter().any(|e| matches!(&e.event, Some(Event::StateChanged(s)) if s.reason.contains("taken over")));
        assert!(took_over, "round {round}: the run says it was taken over");
        // The survivor becomes A for the next round; a new gateway joins as B.
        (a, client_a) = (b, client_b);
        (b, client_b) = gateway(&store, &format!("gw-{round}"), &scorer_url).await;
    }
    eprintln!("takeovers finished {:?} after the kill (leases of 2 s)", takeovers);
    a.start_kill().ok();
    b.start_kill().ok();
}
