//! Pause holds in every pipeline: a model call in flight when the pause is taken finishes, and no
//! model call starts until the run is resumed (between stage calls, between self-refine passes);
//! the resumed run goes on from where it was, redoing nothing. The engine's own controls refuse
//! what does not fit the run's state (FAILED_PRECONDITION naming it), and audit only what they did.
//! (Targeted refinement's pause and the concurrent human controls are in targeted_refinement.rs.)

#![allow(clippy::wildcard_enum_match_arm)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Duration;

use assay_proto::common::v1 as pb;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::control_run_request::Action;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_proto::gateway::v1::run_event::Event;
use assay_proto::generator::v1 as gen_pb;
use assay_proto::refiners::v1 as rf;
use assay_testkit::{Gate, RecordedRequest, Reply, ScriptedLlm, eventually, hash_embedding, schema_reply};
use assay_tests::MeshSandbox;
use serde_json::{Value, json};
use tonic::Code;
use tonic::transport::Channel;

/// How long a paused run is watched for a model call it must not start (proving an absence
/// takes a window; everything the run was doing has finished before it opens).
const WINDOW: Duration = Duration::from_millis(700);
const WAIT: Duration = Duration::from_secs(20);

type Client = GatewayServiceClient<Channel>;

async fn start(
    client: &mut Client,
    pipeline: gw::run_pipeline_request::Pipeline,
) -> (tonic::Streaming<gw::RunPipelineResponse>, String) {
    let request =
        gw::RunPipelineRequest { open: false, pipeline: Some(pipeline), label: "pause test".into(), budget: None };
    let mut stream = client.run_pipeline(request).await.expect("the run starts").into_inner();
    let run_id = stream.message().await.unwrap().unwrap().event.unwrap().run_id;
    (stream, run_id)
}

async fn control(client: &mut Client, run_id: &str, action: Action) -> Result<gw::Run, tonic::Status> {
    let request = gw::ControlRunRequest {
        run_id: run_id.into(),
        action: Some(action),
        actor: "ops".into(),
        reason: "test".into(),
    };
    client.control_run(request).await.map(|r| r.into_inner().run.expect("the run"))
}

async fn get(client: &mut Client, run_id: &str) -> gw::Run {
    client.get_run(gw::GetRunRequest { run_id: run_id.into() }).await.unwrap().into_inner().run.unwrap()
}

/// Pause the run (answered PAUSED) while the backend holds a reply at `gate` (the stage call's
/// last model call), then let the reply go and wait until it is answered: returns how many calls
/// the backend had received when the pause was taken.
async fn pause_with_a_call_in_flight(client: &mut Client, run_id: &str, llm: &ScriptedLlm, gate: &Gate) -> usize {
    assert!(eventually(WAIT, || gate.waiting() == 1).await, "a model call is held in flight");
    let paused = control(client, run_id, Action::Pause(gw::PauseRun {})).await.expect("pause");
    assert_eq!(paused.state, gw::RunState::Paused as i32);
    let calls = llm.request_count();
    gate.open();
    assert!(eventually(WAIT, || gate.passed() == 1 && llm.completed_count() >= calls).await);
    calls
}

/// No model call starts while the run stays paused.
async fn nothing_starts_while_paused(client: &mut Client, run_id: &str, llm: &ScriptedLlm, calls: usize) {
    tokio::time::sleep(WINDOW).await;
    let run = get(client, run_id).await;
    assert_eq!(run.state, gw::RunState::Paused as i32, "{run:?}");
    let seen: Vec<String> = llm.requests().iter().skip(calls).map(|r| r.path.clone()).collect();
    assert_eq!(llm.request_count(), calls, "no model call started while paused: {seen:?}");
}

/// Every remaining event; the last one.
async fn drain(stream: &mut tonic::Streaming<gw::RunPipelineResponse>) -> gw::RunEvent {
    let mut last = None;
    while let Some(m) = tokio::time::timeout(WAIT, stream.message()).await.expect("events keep coming").unwrap() {
        last = m.event;
    }
    last.expect("at least one event")
}

fn completed(ev: &gw::RunEvent) -> &gw::RunCompleted {
    match &ev.event {
        Some(Event::Completed(c)) => c,
        other => panic!("the run completes: {other:?}"),
    }
}

fn schema_name(r: &RecordedRequest) -> &str {
    r.body.pointer("/response_format/json_schema/name").and_then(Value::as_str).unwrap_or("")
}

/// Schema-following replies; the first one is held at the gate.
fn first_held(llm: &ScriptedLlm) -> Gate {
    let gate = Gate::new();
    let g = gate.clone();
    let first = AtomicBool::new(true);
    llm.set_handler(move |r| {
        let reply = schema_reply(r);
        if first.swap(false, Ordering::SeqCst) { reply.gated(&g) } else { reply }
    });
    gate
}

fn tagged() -> Vec<rf::RefinerStep> {
    vec![rf::RefinerStep { step: Some(rf::refiner_step::Step::Tag(rf::TagRequest::default())) }]
}

fn tick() -> Option<gw::ChecklistSource> {
    Some(gw::ChecklistSource { source: Some(gw::checklist_source::Source::Preset(gen_pb::Preset::Tick as i32)) })
}

/// generate_checklist: paused while the checklist is generated, the generation finishes and the
/// refiner chain (its tagger calls the model) waits for the resume; the checklist is generated once.
#[tokio::test]
async fn generate_checklist_holds_before_the_refiner_chain() {
    let sandbox = MeshSandbox::start().await;
    let gate = first_held(&sandbox.llm);
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let pipeline = gw::GenerateChecklistPipeline {
        source: tick(),
        record: Some(gw::EvalRecord { input: "Write a limerick about tea.".into(), ..Default::default() }),
        refiners: tagged(),
        ..Default::default()
    };
    let (mut stream, run_id) =
        start(&mut client, gw::run_pipeline_request::Pipeline::GenerateChecklist(pipeline)).await;
    let calls = pause_with_a_call_in_flight(&mut client, &run_id, &sandbox.llm, &gate).await;
    nothing_starts_while_paused(&mut client, &run_id, &sandbox.llm, calls).await;
    let generations = |llm: &ScriptedLlm| llm.requests().iter().filter(|r| schema_name(r) == "checklist").count();
    assert_eq!(generations(&sandbox.llm), calls, "only the generation ran");

    control(&mut client, &run_id, Action::Resume(gw::ResumeRun {})).await.expect("resume");
    let last = drain(&mut stream).await;
    let done = completed(&last);
    assert_eq!(done.state, gw::RunState::Succeeded as i32, "{done:?}");
    let Some(gw::run_result::Result::Checklist(c)) = done.result.as_ref().and_then(|r| r.result.clone()) else {
        panic!("a checklist: {done:?}")
    };
    assert_eq!(c.metadata.get("refiners").map(String::as_str), Some("tagger"));
    assert_eq!(generations(&sandbox.llm), calls, "the generation is not redone");
    assert!(
        sandbox.llm.requests().iter().any(|r| schema_name(r) == "question_tags"),
        "the tagger ran after the resume"
    );
    sandbox.shutdown().await.unwrap();
}

/// checklist_eval: the same with a generated, refined checklist and records to score; after the
/// resume the chain and the scoring run, the generation is not redone.
#[tokio::test]
async fn checklist_eval_holds_before_the_refiner_chain() {
    let sandbox = MeshSandbox::start().await;
    let gate = first_held(&sandbox.llm);
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let pipeline = gw::ChecklistEvalPipeline {
        source: tick(),
        records: vec![gw::EvalRecord {
            id: "r0".into(),
            input: "Write a limerick about tea.".into(),
            target: "There once was a pot full of tea.".into(),
            ..Default::default()
        }],
        refiners: tagged(),
        ..Default::default()
    };
    let (mut stream, run_id) = start(&mut client, gw::run_pipeline_request::Pipeline::ChecklistEval(pipeline)).await;
    let calls = pause_with_a_call_in_flight(&mut client, &run_id, &sandbox.llm, &gate).await;
    nothing_starts_while_paused(&mut client, &run_id, &sandbox.llm, calls).await;

    control(&mut client, &run_id, Action::Resume(gw::ResumeRun {})).await.expect("resume");
    let last = drain(&mut stream).await;
    let done = completed(&last);
    assert_eq!(done.state, gw::RunState::Succeeded as i32, "{done:?}");
    let Some(gw::run_result::Result::ChecklistEval(e)) = done.result.as_ref().and_then(|r| r.result.clone()) else {
        panic!("an evaluation: {done:?}")
    };
    assert!(e.results.iter().all(|r| r.score.is_some()), "{e:?}");
    let requests = sandbox.llm.requests();
    assert_eq!(requests.iter().filter(|r| schema_name(r) == "checklist").count(), calls, "generated once");
    assert!(requests.iter().any(|r| schema_name(r) == "question_tags"));
    assert_eq!(requests.iter().filter(|r| schema_name(r) == "checklist_answers").count(), 1, "scored once");
    sandbox.shutdown().await.unwrap();
}

const DRAFT: &str = "Photosynthesis is how plants make food. They use light. Water and carbon dioxide \
                     go in and sugar and oxygen come out. This happens in the leaves of the plant, inside \
                     small parts of the cells that hold a green pigment.";

fn revision(pass: usize) -> String {
    format!(
        "Photosynthesis is how plants make their food from light. Water and carbon dioxide go in; sugar \
         and oxygen come out. It happens in the chloroplasts of leaf cells, which hold the green pigment \
         chlorophyll. Revision {pass} names the parts plainly, and pass {pass} adds a different closing line \
         number {pass}{pass}{pass}."
    )
}

/// self_refine (two passes): paused during pass 1's model call, pass 1 finishes and pass 2 does
/// not start until the resume; then pass 2 runs on pass 1's revision, pass 1 is not redone.
#[tokio::test]
async fn self_refine_holds_between_passes_and_resumes_from_the_pass_reached() {
    let sandbox = MeshSandbox::start().await;
    let gate = Gate::new();
    let g = gate.clone();
    let chats = Arc::new(AtomicUsize::new(0));
    let c = chats.clone();
    sandbox.llm.set_handler(move |r| {
        if r.is_embeddings() {
            return Reply::embeddings(r.embedding_inputs().iter().map(|t| hash_embedding(t, 32)).collect());
        }
        let n = c.fetch_add(1, Ordering::SeqCst) + 1;
        let reply = Reply::text(format!(
            "<critique>\n- Name the cell parts ({n}).\n</critique>\n<revised>\n{}\n</revised>",
            revision(n)
        ));
        if n == 1 { reply.gated(&g) } else { reply }
    });
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let pipeline = gw::SelfRefinePipeline {
        request: Some(rf::SelfRefineRequest {
            draft: DRAFT.into(),
            instruction: "Explain photosynthesis to a ten-year-old.".into(),
            max_passes: Some(2),
            convergence_mode: rf::ConvergenceMode::Strict as i32,
            ..Default::default()
        }),
    };
    let (mut stream, run_id) = start(&mut client, gw::run_pipeline_request::Pipeline::SelfRefine(pipeline)).await;
    assert!(eventually(WAIT, || gate.waiting() == 1).await, "pass 1's model call is in flight");
    let paused = control(&mut client, &run_id, Action::Pause(gw::PauseRun {})).await.expect("pause");
    assert_eq!(paused.state, gw::RunState::Paused as i32);
    gate.open();
    // Pass 1 finishes (its event arrives); nothing starts after it while paused.
    let mut events = Vec::new();
    loop {
        let ev = tokio::time::timeout(WAIT, stream.message()).await.unwrap().unwrap().unwrap().event.unwrap();
        let pass = matches!(&ev.event, Some(Event::SelfRefinePass(p)) if p.pass == 1);
        events.push(ev);
        if pass {
            break;
        }
    }
    assert!(eventually(WAIT, || sandbox.llm.completed_count() == sandbox.llm.request_count()).await);
    let calls = sandbox.llm.request_count();
    nothing_starts_while_paused(&mut client, &run_id, &sandbox.llm, calls).await;
    assert_eq!(chats.load(Ordering::SeqCst), 1, "only pass 1's model call");

    control(&mut client, &run_id, Action::Resume(gw::ResumeRun {})).await.expect("resume");
    let last = drain(&mut stream).await;
    let done = completed(&last);
    assert_eq!(done.state, gw::RunState::Succeeded as i32, "{done:?}");
    let Some(gw::run_result::Result::SelfRefine(out)) = done.result.as_ref().and_then(|r| r.result.clone()) else {
        panic!("a self-refine result: {done:?}")
    };
    let numbers: Vec<u32> = out.passes.iter().map(|p| p.pass).collect();
    assert_eq!(numbers, vec![1, 2], "{out:?}");
    assert_eq!(out.passes[0].revised, revision(1), "pass 1 as it ran before the pause");
    assert_eq!(out.passes[1].revised, revision(2));
    assert_eq!(chats.load(Ordering::SeqCst), 2, "one model call a pass: pass 1 not redone");
    let second = sandbox.llm.requests().into_iter().filter(|r| r.is_chat()).nth(1).unwrap();
    assert!(second.last_user_message().unwrap_or_default().contains("Revision 1"), "pass 2 revises pass 1's text");
    let run = get(&mut client, &run_id).await;
    assert_eq!(run.usage.unwrap().calls, 2, "usage counts each pass once");
    let audit: Vec<&str> = run.audit_log.iter().map(|a| a.action.as_str()).collect();
    assert_eq!(audit, vec!["pause", "resume"]);
    sandbox.shutdown().await.unwrap();
}

/// debate (with baselines): paused during the debate's judgment, the debate finishes and the
/// baseline samples wait for the resume; the debate is not redone.
#[tokio::test]
async fn debate_holds_between_stage_calls() {
    let sandbox = MeshSandbox::start().await;
    let gate = Gate::new();
    let g = gate.clone();
    sandbox.llm.set_handler(move |r| {
        let stage = schema_name(r).to_string();
        let prompt = r.last_user_message().unwrap_or_default();
        let reply = match stage.as_str() {
            "debate_solution" => Reply::json(json!({"approach": "direct", "reasoning_steps": ["multiply"],
                                                     "final_answer": "391", "confidence": 0.7})),
            "debate_review" => Reply::json(json!({"strengths": ["clear"], "weaknesses": [], "errors": [],
                                                   "suggested_changes": []})),
            "debate_refinement" => Reply::json(json!({"critiques_accepted": [], "critiques_rejected": [],
                   "refinement_reasoning": "checked", "reasoning_steps": ["checked"], "final_answer": "391",
                   "confidence": 0.8, "changed_from_original": false, "improvement_explanation": "none"})),
            "debate_judgment" => {
                return Reply::text(
                    json!({"reasoning": "all agree", "winner": "solver_1", "confidence": 0.9}).to_string(),
                )
                .gated(&g);
            }
            other => panic!("unexpected stage {other}: {prompt}"),
        };
        reply.usage(10, 5)
    });
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let pipeline = gw::DebatePipeline {
        problems: vec![gw::DebateProblem {
            id: "mul".into(),
            problem: "What is 17 * 23?".into(),
            reference: Some("391".into()),
        }],
        baselines: true,
        concurrency: 1,
        ..Default::default()
    };
    let (mut stream, run_id) = start(&mut client, gw::run_pipeline_request::Pipeline::Debate(pipeline)).await;
    let calls = pause_with_a_call_in_flight(&mut client, &run_id, &sandbox.llm, &gate).await;
    nothing_starts_while_paused(&mut client, &run_id, &sandbox.llm, calls).await;
    let baseline = |r: &RecordedRequest| r.last_user_message().unwrap_or_default().starts_with("You are baseline_");
    assert!(!sandbox.llm.requests().iter().any(baseline), "no baseline sample while paused");

    control(&mut client, &run_id, Action::Resume(gw::ResumeRun {})).await.expect("resume");
    let last = drain(&mut stream).await;
    let done = completed(&last);
    assert_eq!(done.state, gw::RunState::Succeeded as i32, "{done:?}");
    let requests = sandbox.llm.requests();
    assert!(requests.iter().any(baseline), "the baselines ran after the resume");
    assert_eq!(requests.iter().filter(|r| schema_name(r) == "debate_judgment").count(), 1, "the debate is not redone");
    assert_eq!(requests.iter().filter(|r| !baseline(r)).count(), calls, "every debate call ran once, before the pause");
    sandbox.shutdown().await.unwrap();
}

/// The engine's controls refuse what does not fit the state, naming it, and audit nothing then:
/// resume on a running run, pause on a paused one, anything on a finished one.
#[tokio::test]
async fn controls_that_do_not_fit_the_state_are_refused_and_not_audited() {
    let sandbox = MeshSandbox::start().await;
    let gate = Gate::new();
    let g = gate.clone();
    sandbox
        .llm
        .set_handler(move |_| Reply::json(json!({"answers": [{"question_index": 1, "answer": "YES"}]})).gated(&g));
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let pipeline = gw::ChecklistEvalPipeline {
        source: Some(gw::ChecklistSource {
            source: Some(gw::checklist_source::Source::Checklist(pb::Checklist {
                items: vec![pb::ChecklistItem {
                    id: "a".into(),
                    question: "Mentions tea?".into(),
                    ..Default::default()
                }],
                ..Default::default()
            })),
        }),
        records: vec![gw::EvalRecord { id: "r0".into(), target: "tea".into(), ..Default::default() }],
        ..Default::default()
    };
    let (mut stream, run_id) = start(&mut client, gw::run_pipeline_request::Pipeline::ChecklistEval(pipeline)).await;
    assert!(eventually(WAIT, || gate.waiting() == 1).await);

    let refused = |r: Result<gw::Run, tonic::Status>, state: &str| {
        let e = r.expect_err("refused");
        assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
        assert!(e.message().contains(state), "names {state}: {}", e.message());
    };
    refused(control(&mut client, &run_id, Action::Resume(gw::ResumeRun {})).await, "RUN_STATE_RUNNING");
    control(&mut client, &run_id, Action::Pause(gw::PauseRun {})).await.expect("pause");
    refused(control(&mut client, &run_id, Action::Pause(gw::PauseRun {})).await, "RUN_STATE_PAUSED");
    // Two resumes at once: one takes effect, the other finds the run running.
    let mut other = GatewayServiceClient::new(sandbox.gateway().await);
    let (a, b) = tokio::join!(
        control(&mut client, &run_id, Action::Resume(gw::ResumeRun {})),
        control(&mut other, &run_id, Action::Resume(gw::ResumeRun {}))
    );
    assert_eq!(usize::from(a.is_ok()) + usize::from(b.is_ok()), 1, "exactly one resume: {a:?} {b:?}");
    refused(if a.is_ok() { b } else { a }, "RUN_STATE_RUNNING");
    gate.open();
    let last = drain(&mut stream).await;
    assert_eq!(completed(&last).state, gw::RunState::Succeeded as i32);
    refused(control(&mut client, &run_id, Action::Pause(gw::PauseRun {})).await, "RUN_STATE_SUCCEEDED");
    let run = get(&mut client, &run_id).await;
    let audit: Vec<&str> = run.audit_log.iter().map(|a| a.action.as_str()).collect();
    assert_eq!(audit, vec!["pause", "resume"], "only what took effect is audited");
    sandbox.shutdown().await.unwrap();
}
