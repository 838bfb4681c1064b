//! The gateway's `self_refine` pipeline across the whole mesh: gateway -> refiners (SelfRefineStream)
//! -> scripted backend; one `self_refine_pass` event per pass, the outcome in the run's result.

use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_proto::gateway::v1::run_event::Event;
use assay_proto::refiners::v1 as rf;
use assay_testkit::{Reply, hash_embedding};
use assay_tests::{MeshSandbox, run_to_end};

const DRAFT: &str = "Photosynthesis is how plants make food. They use light. Water and carbon dioxide \
                     go in and sugar and oxygen come out. This happens in the leaves of the plant, inside \
                     small parts of the cells that hold a green pigment.";

fn revision(pass: usize) -> String {
    format!(
        "Photosynthesis is how plants make their food from light. Water and carbon dioxide go in; sugar \
         and oxygen come out. It happens in the chloroplasts of leaf cells, which hold the green pigment \
         chlorophyll. Revision {pass} names the parts plainly."
    )
}

fn request(max_passes: u32) -> gw::SelfRefinePipeline {
    gw::SelfRefinePipeline {
        request: Some(rf::SelfRefineRequest {
            draft: DRAFT.into(),
            instruction: "Explain photosynthesis to a ten-year-old.".into(),
            max_passes: Some(max_passes),
            ..Default::default()
        }),
    }
}

#[tokio::test]
async fn passes_stream_as_events_and_the_outcome_is_the_result() {
    let sandbox = MeshSandbox::start().await;
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let c = calls.clone();
    sandbox.llm.set_handler(move |r| {
        if r.is_embeddings() {
            return Reply::embeddings(r.embedding_inputs().iter().map(|t| hash_embedding(t, 32)).collect());
        }
        let n = c.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
        Reply::text(format!("<critique>\n- Name the cell parts.\n</critique>\n<revised>\n{}\n</revised>", revision(n)))
    });
    let events = run_to_end(sandbox.gateway().await, gw::run_pipeline_request::Pipeline::SelfRefine(request(2))).await;
    let passes: Vec<&rf::SelfRefinePass> = events
        .iter()
        .filter_map(|e| match &e.event {
            Some(Event::SelfRefinePass(p)) => Some(p),
            _ => None,
        })
        .collect();
    let Some(Event::Completed(done)) = events.last().and_then(|e| e.event.as_ref()) else {
        panic!("the run completes: {events:?}")
    };
    assert_eq!(done.state, gw::RunState::Succeeded as i32, "{done:?}");
    let Some(gw::run_result::Result::SelfRefine(out)) = done.result.as_ref().and_then(|r| r.result.clone()) else {
        panic!("a self-refine result: {done:?}")
    };
    assert_eq!(passes.len(), out.passes.len(), "one event per pass");
    assert!(!passes.is_empty() && passes.len() <= 2);
    assert_eq!(passes[0].pass, 1);
    assert_eq!(passes[0].critique, vec!["Name the cell parts."]);
    assert_eq!(passes[0].revised, revision(1));
    assert!(out.final_text.starts_with("Photosynthesis is how plants make their food from light."), "{out:?}");
    assert_eq!(calls.load(std::sync::atomic::Ordering::SeqCst), passes.len(), "one model call a pass");
    // The run is stored with its result and usage.
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let run_id = events[0].run_id.clone();
    let run = client.get_run(gw::GetRunRequest { run_id }).await.unwrap().into_inner().run.unwrap();
    assert_eq!(run.kind, gw::PipelineKind::SelfRefine as i32);
    assert_eq!(run.records_done as usize, passes.len());
    assert!(run.usage.unwrap().calls >= passes.len() as u32);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_requests_name_the_field_and_call_no_model() {
    let sandbox = MeshSandbox::start().await;
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let mut empty = request(1);
    if let Some(r) = empty.request.as_mut() {
        r.draft = "  ".into();
    }
    for (pipeline, field) in [
        (empty, "pipeline.request.draft"),
        (request(0), "pipeline.request.max_passes"),
        (gw::SelfRefinePipeline { request: None }, "pipeline.request"),
    ] {
        let err = client
            .run_pipeline(gw::RunPipelineRequest {
                pipeline: Some(gw::run_pipeline_request::Pipeline::SelfRefine(pipeline)),
                label: String::new(),
            })
            .await
            .expect_err("refused");
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains(field), "{field}: {}", err.message());
    }
    assert!(sandbox.llm.requests().is_empty(), "no model call");
    sandbox.shutdown().await.unwrap();
}
