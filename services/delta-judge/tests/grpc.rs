//! The delta judge over real gRPC on port 0.

use assay_proto::delta_judge::v1::ReadabilityRequest;
use assay_proto::delta_judge::v1::delta_judge_service_client::DeltaJudgeServiceClient;
use assay_testkit::TestServer;
use tonic::Code;
use tonic_types::StatusExt;

#[tokio::test]
async fn readability_measures_any_language_and_refuses_blank_text() {
    let server = TestServer::start(assay_delta_judge::routes(), &[assay_proto::service_names::DELTA_JUDGE]).await;
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
