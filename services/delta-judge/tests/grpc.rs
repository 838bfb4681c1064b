//! The delta judge over real gRPC on port 0.

use assay_proto::delta_judge::v1::ReadabilityRequest;
use assay_proto::delta_judge::v1::delta_judge_service_client::DeltaJudgeServiceClient;
use assay_testkit::TestServer;
use tonic::Code;
use tonic_types::StatusExt;

/// The service on a hub with no backends (these RPCs call no model).
fn routes() -> tonic::service::Routes {
    let hub = std::sync::Arc::new(assay_llm::ModelHub::default());
    assay_delta_judge::routes(std::sync::Arc::new(assay_delta_judge::DeltaJudgeCore::new(hub)))
}

#[tokio::test]
async fn readability_measures_any_language_and_refuses_blank_text() {
    let server = TestServer::start(routes(), &[assay_proto::service_names::DELTA_JUDGE]).await;
    let mut client = DeltaJudgeServiceClient::new(server.channel().await);
    let text = "Кошка сидела на коврике. Было тепло!\n\nПотом она долго спала.";
    let r = client.readability(ReadabilityRequest { text: text.into() }).await.unwrap().into_inner();
    assert_eq!((r.sentences, r.paragraphs, r.max_sentence_words), (3, 2, 4));
    assert!((r.paragraph_break_ratio - 2.0 / 3.0).abs() < 1e-12);
    assert!(!r.dense_text && !r.within_targets, "3.3 words a sentence is under the 15-20 target");
    for (text, words) in [(" \n ".to_string(), "blank"), ("a. ".repeat(100_000), "limit")] {
        let err = client.readability(ReadabilityRequest { text }).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument);
        let bad = err.get_details_bad_request().unwrap();
        assert_eq!(bad.field_violations[0].field, "text");
        assert!(bad.field_violations[0].description.contains(words), "{bad:?}");
    }
}

#[tokio::test]
async fn quality_locks_and_convergence_over_grpc() {
    use assay_proto::delta_judge::v1::{CheckConvergenceRequest, CheckQualityLocksRequest, QualityLock};
    let server = TestServer::start(routes(), &[assay_proto::service_names::DELTA_JUDGE]).await;
    let mut client = DeltaJudgeServiceClient::new(server.channel().await);
    let lock = |c: &str, baseline: f64| QualityLock { criterion: c.into(), baseline, max_drop: None };
    let r = client
        .check_quality_locks(CheckQualityLocksRequest {
            locks: vec![lock("clarity", 0.8), lock("factual_accuracy", 0.9)],
            criterion_scores: [("clarity".to_string(), 0.76), ("factual_accuracy".to_string(), 0.8)].into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!r.ok);
    assert_eq!(r.violations.len(), 1);
    assert_eq!((r.violations[0].criterion.as_str(), r.violations[0].current), ("factual_accuracy", 0.8));
    assert!((r.violations[0].max_drop - 0.05).abs() < 1e-12);

    let r = client
        .check_convergence(CheckConvergenceRequest {
            scores: vec![0.6, 0.75, 0.76, 0.77],
            section_edits: [("intro".to_string(), 2), ("body".to_string(), 1)].into(),
            tokens_used: 4_000,
            elapsed_ms: 20_000,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.converged);
    assert_eq!(r.reason, "gain_below_threshold");
    assert_eq!(r.locked_section_ids, vec!["intro"]);
    assert_eq!(r.best_iteration, 3);

    // Bad input names the field; nothing is guessed.
    let cases: Vec<(Result<(), tonic::Status>, &str)> = vec![
        (
            client
                .check_quality_locks(CheckQualityLocksRequest {
                    locks: vec![lock("clarity", 0.8)],
                    criterion_scores: Default::default(),
                })
                .await
                .map(|_| ()),
            "criterion_scores",
        ),
        (
            client
                .check_quality_locks(CheckQualityLocksRequest {
                    locks: vec![lock("clarity", 1.5)],
                    criterion_scores: [("clarity".to_string(), 0.5)].into(),
                })
                .await
                .map(|_| ()),
            "locks[0].baseline",
        ),
        (client.check_convergence(CheckConvergenceRequest::default()).await.map(|_| ()), "scores"),
        (
            client
                .check_convergence(CheckConvergenceRequest { scores: vec![0.5, 1.2], ..Default::default() })
                .await
                .map(|_| ()),
            "scores[1]",
        ),
    ];
    for (result, field) in cases {
        let err = result.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}");
        assert_eq!(err.get_details_bad_request().unwrap().field_violations[0].field, field);
    }
}
