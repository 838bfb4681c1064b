//! Self-refine's rollback returns the best draft seen, not the previous one, across the whole mesh:
//! gateway `self_refine` pipeline -> refiners (one pass per call, earlier passes handed back) ->
//! scripted backend. The regression guard scores every revision by its embedding cosine to the
//! original; the scripted embeddings set those scores.

use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_proto::gateway::v1::run_event::Event;
use assay_proto::refiners::v1 as rf;

use assay_testkit::{RecordedRequest, Reply};
use assay_tests::{MeshSandbox, run_to_end};

const DRAFT: &str = "A customer interview replaces a guess with evidence from the people who live with the \
                     problem every day. It costs an hour and can save months of building the wrong thing. Plan \
                     the questions, run the talk, and use what you hear for the next product decision.";

const REVISION_1: &str = "A customer interview swaps a hunch for evidence from the people who face the problem \
                          daily. One hour of talking can spare months of building the wrong feature. Prepare open \
                          questions, listen more than you speak, and bring the notes to the next product decision.";

const REVISION_2: &str = "Customer interviews turn hunches into evidence gathered from users who meet the problem \
                          daily. Sixty minutes of conversation may prevent months spent shipping unwanted features. \
                          Draft open questions, keep quiet while they answer, then share the notes before deciding.";

const REVISION_3: &str = "Interviews are one research method among surveys, analytics dashboards and usability \
                          studies; each suits different stages of discovery. Choose a method by budget, timeline and \
                          the confidence your organisation needs before committing engineering capacity.";

/// A unit vector at cosine `c` to the original's `[1, 0]`.
fn at(c: f32) -> Vec<f32> {
    vec![c, (1.0 - c * c).sqrt()]
}

/// The guard's score of each text (cosine to the original).
fn vector(text: &str) -> Vec<f32> {
    match text {
        DRAFT => at(1.0),
        REVISION_1 => at(0.95),
        // Lower than revision 1 but above 0.85 x 0.95 = 0.8075: kept, the loop goes on.
        REVISION_2 => at(0.84),
        // Under 0.8075: a regression, rolled back.
        REVISION_3 => at(0.5),
        _ => at(0.0),
    }
}

/// The draft a self-refine prompt quotes.
fn draft_of(r: &RecordedRequest) -> String {
    let prompt = r.last_user_message().unwrap_or_default();
    prompt.split("DRAFT:\n<draft>\n").nth(1).and_then(|d| d.split("\n</draft>").next()).unwrap_or_default().to_string()
}

fn reply(revised: &str) -> Reply {
    Reply::text(format!("<critique>\n- Tighten the wording.\n</critique>\n<revised>\n{revised}\n</revised>"))
}

/// Draft 1 scores high, draft 2 lower (kept: above the rollback threshold), draft 3 regresses: the
/// result is draft 1, the best seen, where the loop used to return draft 2, the previous one.
#[tokio::test]
async fn a_regression_returns_the_best_draft_seen_not_the_previous_one() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(|r| {
        if r.is_embeddings() {
            return Reply::embeddings(r.embedding_inputs().iter().map(|t| vector(t)).collect());
        }
        match draft_of(r).as_str() {
            DRAFT => reply(REVISION_1),
            REVISION_1 => reply(REVISION_2),
            REVISION_2 => reply(REVISION_3),
            other => {
                Reply::text(format!("<critique>\n- unexpected draft\n</critique>\n<revised>\n{other}\n</revised>"))
            }
        }
    });
    let pipeline = gw::SelfRefinePipeline {
        request: Some(rf::SelfRefineRequest {
            draft: DRAFT.into(),
            instruction: "Explain why product teams interview customers.".into(),
            max_passes: Some(3),
            ..Default::default()
        }),
    };
    let events = run_to_end(sandbox.gateway().await, gw::run_pipeline_request::Pipeline::SelfRefine(pipeline)).await;
    let Some(Event::Completed(done)) = events.last().and_then(|e| e.event.as_ref()) else {
        panic!("the run completes: {events:?}")
    };
    assert_eq!(done.state, gw::RunState::Succeeded as i32, "{done:?}");
    let Some(gw::run_result::Result::SelfRefine(out)) = done.result.as_ref().and_then(|r| r.result.clone()) else {
        panic!("a self-refine result: {done:?}")
    };
    let revised: Vec<&str> = out.passes.iter().map(|p| p.revised.as_str()).collect();
    assert_eq!(revised, vec![REVISION_1, REVISION_2, REVISION_3], "three passes ran");
    let scores: Vec<Option<f64>> = out.passes.iter().map(|p| p.similarity_to_original).collect();
    assert!((scores[0].unwrap() - 0.95).abs() < 1e-6 && (scores[1].unwrap() - 0.84).abs() < 1e-6, "{scores:?}");
    assert!(!out.passes[1].rolled_back, "draft 2 is lower but above the threshold: kept");
    let last = &out.passes[2];
    assert!(last.rolled_back && last.similarity_measure == "embedding", "{last:?}");
    assert!((last.rollback_threshold.unwrap() - 0.85 * 0.95).abs() < 1e-6, "{last:?}");
    assert_eq!(out.stop_reason, rf::SelfRefineStopReason::RolledBack as i32);
    assert!(out.rolled_back && out.changed && !out.converged);
    assert_eq!(out.final_text, REVISION_1, "the best draft seen, not the previous one (draft 2)");
    assert_eq!(out.returned_pass, 1, "the result says which draft came back");

    // The stored run carries the same result.
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let run = client.get_run(gw::GetRunRequest { run_id: events[0].run_id.clone() }).await.unwrap().into_inner();
    let Some(gw::run_result::Result::SelfRefine(stored)) = run.run.and_then(|r| r.result).and_then(|r| r.result) else {
        panic!("a stored self-refine result")
    };
    assert_eq!((stored.final_text.as_str(), stored.returned_pass), (REVISION_1, 1));
    sandbox.shutdown().await.unwrap();
}

/// A pass-1 reply that is not a revision of the draft leaves nothing kept: the original is the
/// best draft, and the result says so (returned pass 0).
#[tokio::test]
async fn with_nothing_kept_the_original_is_the_best_draft() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(|r| {
        if r.is_embeddings() {
            return Reply::embeddings(r.embedding_inputs().iter().map(|t| vector(t)).collect());
        }
        // Nothing like the draft (character similarity under 0.3) and far from it by cosine.
        reply("I cannot help with that.")
    });
    let pipeline = gw::SelfRefinePipeline {
        request: Some(rf::SelfRefineRequest { draft: DRAFT.into(), max_passes: Some(3), ..Default::default() }),
    };
    let events = run_to_end(sandbox.gateway().await, gw::run_pipeline_request::Pipeline::SelfRefine(pipeline)).await;
    let Some(Event::Completed(done)) = events.last().and_then(|e| e.event.as_ref()) else {
        panic!("the run completes: {events:?}")
    };
    let Some(gw::run_result::Result::SelfRefine(out)) = done.result.as_ref().and_then(|r| r.result.clone()) else {
        panic!("a self-refine result: {done:?}")
    };
    assert_eq!(out.passes.len(), 1, "{out:?}");
    // Not a revision at all: refused on pass 1 (there is no guard on pass 1).
    assert!(out.passes[0].error.contains("is not a revision of the draft"), "{out:?}");
    assert_eq!(out.stop_reason, rf::SelfRefineStopReason::RefinerError as i32);
    assert_eq!((out.final_text.as_str(), out.returned_pass, out.changed), (DRAFT, 0, false));
    sandbox.shutdown().await.unwrap();
}

/// The cascade's embedding step is off by default (no embedding call for a comparison Jaccard
/// leaves undecided) and a request turns it on with `embedding_step`.
#[tokio::test]
async fn the_embedding_step_is_off_by_default_and_a_request_turns_it_on() {
    for (embedding_step, decided_by, embedding_calls) in [(None, "jaccard", 0), (Some(true), "embedding", 1)] {
        let sandbox = MeshSandbox::start().await;
        sandbox.llm.set_handler(|r| {
            if r.is_embeddings() {
                return Reply::embeddings(r.embedding_inputs().iter().map(|t| vector(t)).collect());
            }
            reply(REVISION_1)
        });
        let pipeline = gw::SelfRefinePipeline {
            request: Some(rf::SelfRefineRequest {
                draft: DRAFT.into(),
                max_passes: Some(1),
                embedding_step,
                ..Default::default()
            }),
        };
        let events =
            run_to_end(sandbox.gateway().await, gw::run_pipeline_request::Pipeline::SelfRefine(pipeline)).await;
        let Some(Event::Completed(done)) = events.last().and_then(|e| e.event.as_ref()) else {
            panic!("the run completes: {events:?}")
        };
        let Some(gw::run_result::Result::SelfRefine(out)) = done.result.as_ref().and_then(|r| r.result.clone()) else {
            panic!("a self-refine result: {done:?}")
        };
        let p = &out.passes[0];
        assert_eq!(p.decided_by, decided_by, "{embedding_step:?}: {p:?}");
        assert!(p.degraded_from.is_empty(), "turned off is not degraded: {p:?}");
        let calls = sandbox.llm.requests().iter().filter(|r| r.is_embeddings()).count();
        assert_eq!(calls, embedding_calls, "{embedding_step:?}");
        assert_eq!((out.final_text.as_str(), out.returned_pass), (REVISION_1, 1));
        sandbox.shutdown().await.unwrap();
    }
}
