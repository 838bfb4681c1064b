//! Stage replicas without a service mesh: a gateway whose `upstreams.scorer` lists two `assay serve
//! scorer` processes spreads a run's scoring calls over both (each on its own scripted backend, so
//! each replica's share is counted where it was served), and a replica killed with SIGKILL mid-run
//! loses no record: the calls it held are tried again and land on the other.
//!
//! Needs the workspace's `assay` binary (built by any workspace test run, or `cargo build -p
//! assay-cli`).

#![allow(clippy::wildcard_enum_match_arm)]

use std::time::Duration;

use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_proto::gateway::v1::run_event::Event;
use assay_testkit::ScriptedLlm;
use assay_tests::{check_like_clean, leaves_eval, leaves_judge, serve, watch_all};
use tokio::process::Child;
use tonic::transport::Channel;

async fn scorer(llm: &ScriptedLlm) -> (Child, String) {
    serve(
        "scorer",
        &[
            ("ASSAY__PORTS__SCORER", "0".into()),
            ("ASSAY__MODELS__DEFAULT__BACKEND", "openai".into()),
            ("OPENAI_BASE_URL", llm.base_url()),
            ("OPENAI_API_KEY", "replicas".into()),
            ("OPENAI_MODEL", "scripted".into()),
            ("ASSAY__CACHE__ENABLED", "false".into()),
        ],
    )
    .await
}

async fn gateway(scorers: &str) -> (Child, GatewayServiceClient<Channel>) {
    let (child, url) = serve(
        "gateway",
        &[
            ("ASSAY__PORTS__GATEWAY", "0".into()),
            ("ASSAY__GATEWAY__STORE", ":memory:".into()),
            ("ASSAY__GATEWAY__CONCURRENCY", "8".into()),
            ("ASSAY__UPSTREAMS__SCORER", scorers.into()),
        ],
    )
    .await;
    let channel = Channel::from_shared(url).unwrap().connect().await.expect("connect to the gateway");
    (child, GatewayServiceClient::new(channel))
}

fn request(records: usize) -> gw::RunPipelineRequest {
    gw::RunPipelineRequest {
        open: false,
        label: "replicas".into(),
        pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(leaves_eval(records))),
        budget: None,
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn two_scorer_replicas_share_a_run_and_a_killed_one_loses_no_record() {
    const RECORDS: usize = 200;
    let (llm_a, llm_b) = (ScriptedLlm::start().await, ScriptedLlm::start().await);
    llm_a.set_handler(leaves_judge(Duration::from_millis(20)));
    llm_b.set_handler(leaves_judge(Duration::from_millis(20)));
    let (_a, url_a) = scorer(&llm_a).await;
    let (mut b, url_b) = scorer(&llm_b).await;
    let (_gateway, mut client) = gateway(&format!("{url_a},{url_b}")).await;

    // One run: every record scored once (one batch call each), the calls split between the two.
    let clean = assay_tests::clean_leaves_run(&mut client, RECORDS).await;
    let (served_a, served_b) = (llm_a.request_count(), llm_b.request_count());
    assert_eq!(served_a + served_b, RECORDS, "one scoring call per record");
    let share = served_a as f64 / RECORDS as f64;
    assert!((0.4..=0.6).contains(&share), "calls split {served_a}/{served_b}, outside 60/40");
    eprintln!("{RECORDS} records over two scorer replicas: {served_a} / {served_b} calls");

    // Replica b killed with SIGKILL after 40 records: the run completes, every record once, the
    // scores of the clean run; b's calls in flight at the kill were made again on a.
    llm_a.set_handler(leaves_judge(Duration::from_millis(40)));
    llm_b.set_handler(leaves_judge(Duration::from_millis(40)));
    let (a_before, b_before) = (llm_a.request_count(), llm_b.request_count());
    let mut stream = client.run_pipeline(request(RECORDS)).await.expect("run starts").into_inner();
    let mut run_id = String::new();
    let mut scored = 0;
    while scored < 40 {
        let ev = stream.message().await.unwrap().expect("the run goes on").event.unwrap();
        run_id.clone_from(&ev.run_id);
        scored += usize::from(matches!(ev.event, Some(Event::RecordScored(_))));
    }
    b.start_kill().expect("SIGKILL");
    b.wait().await.expect("reaped");
    let events = watch_all(&mut client, &run_id).await;
    if let Some(done) = events.last().and_then(assay_tests::evaluation) {
        for r in done.results.iter().filter(|r| !r.error.is_empty()) {
            eprintln!("record {} failed: {}", r.record_id, r.error);
        }
    }
    check_like_clean(&events, &clean, "a scorer replica killed after 40 records");
    let (on_a, on_b) = (llm_a.request_count() - a_before, llm_b.request_count() - b_before);
    assert!(on_b > 0 && on_a > on_b, "b served {on_b} before it died, a {on_a}");
    assert!(on_a + on_b >= RECORDS, "{on_a} + {on_b} calls for {RECORDS} records");
    eprintln!("replica b killed after 40 records: a served {on_a}, b {on_b}; no record failed");
}
