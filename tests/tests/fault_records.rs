//! No record is lost to transient faults: 20 tick evaluations of 200 records (a checklist
//! generated per record, then scored) against a backend that answers 20% of attempts 429, 10% 5xx
//! and leaves 5% unanswered (the mix), each run with its own seed. A
//! record's stage call that fails after the client's own retries is tried again by the run in
//! further rounds (pipelines::rounds), so every record is scored.

use std::sync::Arc;

use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient as Client;
use assay_testkit::{FaultCounts, FaultMix, RecordedRequest, Reply, with_faults};
use assay_tests::{MeshSandbox, SandboxOptions, leaves_eval};
use serde_json::json;

fn answer(r: &RecordedRequest) -> Reply {
    let prompt = r.last_user_message().unwrap_or_default();
    if prompt.contains("Q1:") {
        let n = prompt.lines().filter(|l| l.starts_with('Q') && l.contains(':')).count().max(1);
        let answers: Vec<_> = (1..=n).map(|i| json!({"question_index": i, "answer": "YES"})).collect();
        Reply::json(json!({ "answers": answers }))
    } else {
        Reply::json(json!({"items": [{"question": "Does it answer?"}, {"question": "Is it short?"}]}))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transient_faults_lose_no_record() {
    for seed in 1..=20_u64 {
        let sandbox =
            MeshSandbox::start_with(SandboxOptions { concurrency: Some(256), ..SandboxOptions::default() }).await;
        let counts = Arc::new(FaultCounts::default());
        let mix = FaultMix { rate_limited: 0.2, server_error: 0.1, unanswered: 0.05 };
        sandbox.llm.set_handler(with_faults(answer, mix, seed, counts.clone()));
        let mut p = leaves_eval(200);
        p.source = Some(gw::ChecklistSource {
            source: Some(gw::checklist_source::Source::Preset(assay_proto::generator::v1::Preset::Tick as i32)),
        });
        for (i, r) in p.records.iter_mut().enumerate() {
            r.input = format!("Write about topic {i}.");
        }
        let mut client = Client::new(sandbox.gateway().await);
        let request = gw::RunPipelineRequest {
            open: false,
            pipeline: Some(gw::run_pipeline_request::Pipeline::ChecklistEval(p)),
            label: "faults".into(),
            budget: None,
        };
        let mut stream = client.run_pipeline(request).await.expect("run starts").into_inner();
        let mut last = None;
        while let Some(m) = stream.message().await.expect("events") {
            last = m.event;
        }
        let done = assay_tests::evaluation(&last.expect("events")).expect("an evaluation");
        let failed: Vec<&str> = done.results.iter().filter(|r| r.score.is_none()).map(|r| r.error.as_str()).collect();
        eprintln!(
            "seed {seed}: {} attempts, {} answered 429, {} 5xx; {} of 200 records failed",
            counts.attempts.load(std::sync::atomic::Ordering::Relaxed),
            counts.rate_limited.load(std::sync::atomic::Ordering::Relaxed),
            counts.server_error.load(std::sync::atomic::Ordering::Relaxed),
            failed.len()
        );
        assert!(failed.is_empty(), "seed {seed}: records lost to transient faults: {failed:?}");
        sandbox.shutdown().await.unwrap();
    }
}
