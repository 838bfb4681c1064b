//! Repeated judging through the whole mesh: a checklist evaluation with `scorer.samples = 3`
//! reaches the scorer, every record carries its samples, and the aggregate's interval is clustered
//! by record, the same whether the gateway scores every record in one call (Evaluate) or one
//! record at a time with checkpoints (RunPipeline). Bad sample settings are refused by the gateway
//! naming the field.

use assay_proto::common::v1 as pb;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_testkit::{RecordedRequest, Reply};
use assay_tests::{MeshSandbox, evaluation};
use serde_json::{Value, json};
use tonic::Code;
use tonic_types::StatusExt;

const RECORDS: usize = 4;

/// Batch replies: requirement 1 is always met; requirement 2 is met by records 0 and 1 only, except
/// that record 1's third sample (seed 2) says NO, so record 1 is flaky.
fn judge(r: &RecordedRequest) -> Reply {
    let prompt = r.last_user_message().unwrap_or_default();
    let record = (0..RECORDS).find(|i| prompt.contains(&format!("RESPONSE-{i} "))).expect("a scoring prompt");
    let seed = r.body.get("seed").and_then(Value::as_u64);
    let second = record == 0 || (record == 1 && seed != Some(2));
    Reply::json(json!({"answers": [
        {"question_index": 1, "answer": "YES"},
        {"question_index": 2, "answer": if second { "YES" } else { "NO" }}
    ]}))
}

fn pipeline(samples: Option<u32>) -> gw::ChecklistEvalPipeline {
    let checklist = pb::Checklist {
        id: "cl".into(),
        items: (1..=2)
            .map(|i| pb::ChecklistItem {
                id: format!("q{i}"),
                question: format!("Does it meet requirement {i}?"),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    gw::ChecklistEvalPipeline {
        source: Some(gw::ChecklistSource { source: Some(gw::checklist_source::Source::Checklist(checklist)) }),
        records: (0..RECORDS)
            .map(|i| gw::EvalRecord {
                id: format!("r{i}"),
                input: "Answer briefly.".into(),
                target: format!("RESPONSE-{i} of the model"),
                ..Default::default()
            })
            .collect(),
        scorer: Some(pb::ScorerConfig { mode: pb::ScoringMode::Batch as i32, samples, ..Default::default() }),
        ..Default::default()
    }
}

/// The per-record samples and the clustered interval of one evaluation.
fn check(e: &gw::EvaluateResponse, what: &str) {
    let samples: Vec<Vec<f64>> =
        e.results.iter().map(|r| r.score.as_ref().expect("scored").sample_primary_scores.clone()).collect();
    assert_eq!(samples, vec![vec![1.0; 3], vec![1.0, 1.0, 0.5], vec![0.5; 3], vec![0.5; 3]], "{what}");
    let flaky = &e.results[1].score.as_ref().unwrap().item_scores[1];
    assert!(flaky.flaky && flaky.answer == pb::Answer::Yes as i32, "{what}: {flaky:?}");
    let u = e.aggregate.as_ref().and_then(|a| a.uncertainty).expect("an interval");
    let obs: Vec<(String, f64)> =
        samples.iter().enumerate().flat_map(|(i, s)| s.iter().map(move |p| (format!("r{i}"), *p))).collect();
    let obs: Vec<(&str, f64)> = obs.iter().map(|(id, p)| (id.as_str(), *p)).collect();
    let want = assay_domain::stats::standard_error(&obs, 0.05).unwrap();
    assert_eq!((u.observations, u.clusters), (12, 4), "{what}");
    assert_eq!(u.se_clustered, want.se_clustered, "{what}");
    assert_eq!((u.se, u.ci_low, u.ci_high), (want.se(), want.ci().0, want.ci().1), "{what}");
}

#[tokio::test]
async fn samples_reach_the_scorer_and_the_interval_is_clustered_by_record() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(judge);

    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let together = client
        .evaluate(gw::EvaluateRequest { pipeline: Some(pipeline(Some(3))), budget: None })
        .await
        .expect("evaluate")
        .into_inner();
    check(&together, "evaluate");
    let calls = sandbox.llm.request_count();
    assert_eq!(calls, RECORDS * 3, "one batch call per record and sample");
    assert_eq!(together.usage.as_ref().map(|u| u.calls), Some((RECORDS * 3) as u32));

    let events = sandbox.run_pipeline(gw::run_pipeline_request::Pipeline::ChecklistEval(pipeline(Some(3)))).await;
    let stored = events.iter().find_map(evaluation).expect("the run's evaluation");
    check(&stored, "run");

    // One sample: one observation per record, no clusters.
    let once = client
        .evaluate(gw::EvaluateRequest { pipeline: Some(pipeline(None)), budget: None })
        .await
        .expect("evaluate")
        .into_inner();
    let u = once.aggregate.and_then(|a| a.uncertainty).expect("an interval");
    assert_eq!((u.observations, u.clusters, u.se_clustered), (RECORDS as u32, 0, None));
    assert!(once.results.iter().all(|r| r.score.as_ref().is_some_and(|s| s.sample_primary_scores.is_empty())));

    for (samples, field) in [(0, "pipeline.scorer.samples"), (11, "pipeline.scorer.samples")] {
        let status = client
            .evaluate(gw::EvaluateRequest { pipeline: Some(pipeline(Some(samples))), budget: None })
            .await
            .expect_err("refused");
        assert_eq!(status.code(), Code::InvalidArgument);
        let bad = status.get_details_bad_request().expect("field violations");
        assert!(
            bad.field_violations.iter().any(|v| v.field == field && v.description.contains("10")),
            "{:?}",
            bad.field_violations
        );
    }
    sandbox.shutdown().await.unwrap();
}
