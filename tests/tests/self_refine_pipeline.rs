//! The gateway's `self_refine` pipeline across the whole mesh: gateway -> refiners (SelfRefineStream)
//! -> scripted backend; one `self_refine_pass` event per pass, the outcome in the run's result.

use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_proto::gateway::v1::run_event::Event;
use assay_proto::refiners::v1 as rf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use assay_testkit::{RecordedRequest, Reply, eventually, hash_embedding};
use assay_tests::{MeshSandbox, SandboxOptions, run_to_end, watch_all};

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
                open: false,
                pipeline: Some(gw::run_pipeline_request::Pipeline::SelfRefine(pipeline)),
                label: String::new(),
                budget: None,
            })
            .await
            .expect_err("refused");
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
        assert!(err.message().contains(field), "{field}: {}", err.message());
    }
    assert!(sandbox.llm.requests().is_empty(), "no model call");
    sandbox.shutdown().await.unwrap();
}

fn passes_of(events: &[gw::RunEvent]) -> Vec<rf::SelfRefinePass> {
    events
        .iter()
        .filter_map(|e| match &e.event {
            Some(Event::SelfRefinePass(p)) => Some(p.clone()),
            _ => None,
        })
        .collect()
}

/// The final state and self-refine result of a run's events.
fn outcome_of(events: &[gw::RunEvent]) -> (i32, rf::SelfRefineResponse) {
    let Some(Event::Completed(done)) = events.last().and_then(|e| e.event.as_ref()) else {
        panic!("the run completes: {events:?}")
    };
    let Some(gw::run_result::Result::SelfRefine(out)) = done.result.as_ref().and_then(|r| r.result.clone()) else {
        panic!("a self-refine result: {done:?}")
    };
    (done.state, out)
}

fn chat_calls(sandbox: &MeshSandbox) -> usize {
    sandbox.llm.requests().iter().filter(|r| r.is_chat()).count()
}

/// A model that answers the draft instead of revising it ("YES", a refusal) never replaces it:
/// the run succeeds with the draft unchanged, stop reason REFINER_ERROR (not CONVERGED, which a
/// second pass agreeing with the first "YES" used to report) and the pass saying why; a refusal
/// inside a <revised> block is not a revision either (REFINER_ERROR; pass 1 has no guard).
#[tokio::test]
async fn a_reply_that_is_not_a_revision_never_converges_and_keeps_the_draft() {
    let refusal = "I am sorry, but I cannot help with that request.";
    let cases = [
        ("YES".to_string(), rf::SelfRefineStopReason::RefinerError),
        (refusal.to_string(), rf::SelfRefineStopReason::RefinerError),
        (
            format!("<critique>\n- Cannot.\n</critique>\n<revised>\n{refusal}\n</revised>"),
            rf::SelfRefineStopReason::RefinerError,
        ),
    ];
    for (reply, stop) in cases {
        let sandbox = MeshSandbox::start().await;
        let text = reply.clone();
        sandbox.llm.set_handler(move |r| {
            if r.is_embeddings() {
                return Reply::embeddings(r.embedding_inputs().iter().map(|t| hash_embedding(t, 32)).collect());
            }
            Reply::text(text.clone())
        });
        let events =
            run_to_end(sandbox.gateway().await, gw::run_pipeline_request::Pipeline::SelfRefine(request(2))).await;
        let (state, out) = outcome_of(&events);
        assert_eq!(state, gw::RunState::Succeeded as i32, "{reply}");
        assert_eq!(out.stop_reason, stop as i32, "{reply}: {out:?}");
        assert!(!out.converged && !out.changed, "{reply}: {out:?}");
        assert_eq!(out.final_text, DRAFT, "{reply}: the draft is kept");
        let passes = passes_of(&events);
        assert_eq!(passes.len(), 1, "{reply}: the loop stops at pass 1");
        assert_eq!(passes, out.passes, "{reply}: the event is the result's pass");
        let p = &passes[0];
        assert!(!p.converged, "{reply}");
        assert!(p.error.contains("is not a revision of the draft"), "{reply}: {}", p.error);
        assert!(!p.rolled_back && p.rollback_threshold.is_none(), "{reply}: no guard on pass 1: {p:?}");
        // Without a <revised> block, or inside one (refused on its own terms, issue 59 point 12).
        assert_eq!(p.revised_block_missing, !reply.contains("<revised>"), "{reply}: {p:?}");
        assert_eq!(chat_calls(&sandbox), 1, "{reply}: no second pass");
        sandbox.shutdown().await.unwrap();
    }
}

/// A refiner error keeps the previous draft and is reported, on pass 1 too: the model
/// backend failing every attempt leaves the run SUCCEEDED with the draft unchanged, stop reason
/// REFINER_ERROR, and the backend's failure in pass 1 (its event and the result's pass).
#[tokio::test]
async fn a_backend_failure_on_pass_one_keeps_the_draft_and_reports_it() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(move |r| {
        if r.is_embeddings() {
            return Reply::embeddings(r.embedding_inputs().iter().map(|t| hash_embedding(t, 32)).collect());
        }
        Reply::status(503).body("the backend is down")
    });
    let events = run_to_end(sandbox.gateway().await, gw::run_pipeline_request::Pipeline::SelfRefine(request(2))).await;
    let (state, out) = outcome_of(&events);
    assert_eq!(state, gw::RunState::Succeeded as i32, "{out:?}");
    assert_eq!(out.stop_reason, rf::SelfRefineStopReason::RefinerError as i32, "{out:?}");
    assert_eq!((out.final_text.as_str(), out.changed, out.converged), (DRAFT, false, false));
    let passes = passes_of(&events);
    assert_eq!(passes, out.passes, "the event is the result's pass");
    assert_eq!(passes.len(), 1);
    assert!(passes[0].error.contains("unavailable") || passes[0].error.contains("circuit"), "{:?}", passes[0]);
    assert!(passes[0].revised.is_empty());
    assert!(chat_calls(&sandbox) >= 1, "the backend was asked");
    sandbox.shutdown().await.unwrap();
}

/// Issue 59, point 11: the same rule on every pass. A 400 (context too long) or a 401 on pass 1
/// used to fail the run while the same error on pass 2 kept the draft; now each leaves the run
/// SUCCEEDED with the text the passes so far left (the draft on pass 1, pass 1's revision on pass
/// 2) and the error in the failed pass.
#[tokio::test]
async fn a_refused_request_keeps_the_draft_on_every_pass() {
    for (status, body, fail_on) in [
        (400, "This model's maximum context length is 2048 tokens", 1usize),
        (401, "invalid api key", 1),
        (400, "This model's maximum context length is 2048 tokens", 2),
    ] {
        let sandbox = MeshSandbox::start().await;
        let calls = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let seen = calls.clone();
        sandbox.llm.set_handler(move |r| {
            if r.is_embeddings() {
                return Reply::embeddings(r.embedding_inputs().iter().map(|t| hash_embedding(t, 32)).collect());
            }
            let n = seen.fetch_add(1, Ordering::SeqCst) + 1;
            if n >= fail_on {
                return Reply::status(status).body(body);
            }
            Reply::text(format!("<critique>\n- Name the parts.\n</critique>\n<revised>\n{}\n</revised>", revision(n)))
        });
        let events =
            run_to_end(sandbox.gateway().await, gw::run_pipeline_request::Pipeline::SelfRefine(request(3))).await;
        let (state, out) = outcome_of(&events);
        assert_eq!(state, gw::RunState::Succeeded as i32, "{status} on pass {fail_on}: {out:?}");
        assert_eq!(out.stop_reason, rf::SelfRefineStopReason::RefinerError as i32, "{out:?}");
        let passes = passes_of(&events);
        assert_eq!(passes, out.passes, "the events are the result's passes");
        assert_eq!(passes.len(), fail_on, "{passes:?}");
        let failed = passes.last().unwrap();
        assert!(
            failed.error.contains("rejected the request") || failed.error.contains("refused credentials"),
            "{failed:?}"
        );
        let want = if fail_on == 1 { DRAFT.to_string() } else { revision(1) };
        assert_eq!((out.final_text.as_str(), out.changed), (want.as_str(), fail_on > 1), "{status} on pass {fail_on}");
        sandbox.shutdown().await.unwrap();
    }
}

/// The draft a self-refine prompt quotes.
fn draft_of(r: &RecordedRequest) -> String {
    let prompt = r.last_user_message().unwrap_or_default();
    prompt.split("DRAFT:\n<draft>\n").nth(1).and_then(|d| d.split("\n</draft>").next()).unwrap_or_default().to_string()
}

/// A gateway restarted while pass 2 waits for its model appends only what is new: pass 1's event
/// is not repeated, the sequence stays gap-free, and the events are the result's passes.
#[tokio::test]
async fn a_restart_mid_run_appends_only_new_pass_events() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("runs.db").display().to_string();
    let mut sandbox = MeshSandbox::start_with(SandboxOptions { store: Some(store), ..Default::default() }).await;
    // Pass 1 revises the draft; pass 2 (on the revision) hangs until the restart, then repeats
    // the revision (converged).
    let hang = Arc::new(AtomicBool::new(true));
    let h = hang.clone();
    sandbox.llm.set_handler(move |r| {
        if r.is_embeddings() {
            return Reply::embeddings(r.embedding_inputs().iter().map(|t| hash_embedding(t, 32)).collect());
        }
        if draft_of(r) != DRAFT && h.load(Ordering::SeqCst) {
            return Reply::hang();
        }
        Reply::text(format!("<critique>\n- Name the cell parts.\n</critique>\n<revised>\n{}\n</revised>", revision(1)))
    });
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let mut stream = client
        .run_pipeline(gw::RunPipelineRequest {
            open: false,
            pipeline: Some(gw::run_pipeline_request::Pipeline::SelfRefine(request(3))),
            label: "interrupted".into(),
            budget: None,
        })
        .await
        .unwrap()
        .into_inner();
    let mut run_id = String::new();
    loop {
        let ev = stream.message().await.unwrap().expect("events until pass 1").event.unwrap();
        run_id.clone_from(&ev.run_id);
        if matches!(ev.event, Some(Event::SelfRefinePass(ref p)) if p.pass == 1) {
            break;
        }
    }
    // Pass 2's call is in flight (so pass 1 is behind the run).
    assert!(eventually(Duration::from_secs(20), || chat_calls(&sandbox) == 2).await, "pass 2 started");
    drop(stream);
    sandbox.mesh.take().unwrap().shutdown().await.unwrap();

    hang.store(false, Ordering::SeqCst);
    sandbox.restart(sandbox.hub()).await;
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let events = watch_all(&mut client, &run_id).await;
    let seqs: Vec<u64> = events.iter().map(|e| e.sequence).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>(), "one gap-free sequence across the restart");
    let (state, out) = outcome_of(&events);
    assert_eq!(state, gw::RunState::Succeeded as i32, "{out:?}");
    let passes = passes_of(&events);
    let numbers: Vec<u32> = passes.iter().map(|p| p.pass).collect();
    assert_eq!(numbers, vec![1, 2], "pass 1's event is not repeated: {passes:?}");
    assert_eq!(
        passes.iter().map(|p| &p.revised).collect::<Vec<_>>(),
        out.passes.iter().map(|p| &p.revised).collect::<Vec<_>>()
    );
    assert!(out.converged && out.final_text == revision(1), "{out:?}");
    sandbox.shutdown().await.unwrap();
}
