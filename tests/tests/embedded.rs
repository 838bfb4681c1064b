//! The whole mesh on the embedded default backend (local models, no API key, no network): an
//! evaluation through the gateway is judged by the local model, and a repeat is served from the
//! response cache. Needs `assay models fetch` (scripts/test.sh runs it first).

use std::sync::Arc;

use assay_proto::common::v1 as pb;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;

#[tokio::test]
async fn evaluate_on_the_embedded_default_and_repeat_from_cache() {
    let config = assay_config::load_from(
        "[ports]\ngateway = 0\ngenerator = 0\nrefiners = 0\nscorer = 0\narbiter = 0\ndelta_judge = 0\ndebate = 0\n[gateway]\nstore = \":memory:\"\n",
    )
    .unwrap();
    assert_eq!(config.models.default.backend, "local", "the embedded backend is the default");
    let (hub, loading) = assay_runtime::build_hub(&config, &assay_runtime::default_loaders()).unwrap();
    let mesh = assay_cli::start_mesh(&config, Arc::new(hub), false).await.unwrap();
    loading.await.expect("embedded models load (run `assay models fetch` first)");
    mesh.set_serving().await;

    let request = gw::EvaluateRequest {
        pipeline: Some(gw::ChecklistEvalPipeline {
            source: Some(gw::ChecklistSource {
                source: Some(gw::checklist_source::Source::Checklist(pb::Checklist {
                    items: vec![
                        pb::ChecklistItem {
                            id: "a".into(),
                            question: "Does the response mention Paris?".into(),
                            ..Default::default()
                        },
                        pb::ChecklistItem {
                            id: "b".into(),
                            question: "Is the response written in English?".into(),
                            ..Default::default()
                        },
                    ],
                    ..Default::default()
                })),
            }),
            records: vec![gw::EvalRecord {
                input: "What is the capital of France?".into(),
                target: "The capital of France is Paris.".into(),
                ..Default::default()
            }],
            ..Default::default()
        }),
        budget: None,
    };
    let mut client = GatewayServiceClient::connect(format!("http://{}", mesh.addrs.gateway)).await.unwrap();
    let first = client.evaluate(request.clone()).await.unwrap().into_inner();
    let score = first.results[0].score.clone().unwrap();
    assert_eq!(score.item_scores.len(), 2);
    assert!(
        score.item_scores.iter().all(|i| i.status == pb::ItemStatus::Answered as i32),
        "constrained decoding always yields parseable answers: {score:?}"
    );
    let usage = first.usage.unwrap();
    assert_eq!(usage.calls, 1);
    assert!(usage.prompt_tokens > 0 && usage.completion_tokens > 0);
    assert_eq!(first.models[0].backend, "local");

    let second = client.evaluate(request).await.unwrap().into_inner();
    let again = second.results[0].score.clone().unwrap();
    assert_eq!(again.item_scores, score.item_scores, "identical answers from the cache");
    let usage = second.usage.unwrap();
    assert_eq!((usage.calls, usage.cache_hits), (0, 1), "the repeat is free");
    mesh.shutdown().await.unwrap();
}
