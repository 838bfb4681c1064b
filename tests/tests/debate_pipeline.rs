//! The gateway's `debate` pipeline across the whole mesh: gateway -> debate service
//! (RunDebateStream, Solve for the baselines) -> scripted backend. The backend answers every call
//! from what the request says: the reply schema names the stage, the prompt names the speaker
//! ("You are solver_2, ..." or "You are baseline_4, ...") and holds the problem.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use assay_proto::debate::v1 as dpb;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::gateway_service_client::GatewayServiceClient;
use assay_proto::gateway::v1::run_event::Event;
use assay_proto::refiners::v1 as rf;
use assay_testkit::{RecordedRequest, Reply};
use assay_tests::{MeshSandbox, SandboxOptions, run_to_end};
use serde_json::json;
use tonic_types::StatusExt;

/// A scripted problem: what the three solvers answer first and after refinement, and what the
/// baseline sample `n` (1-based) answers.
struct Scripted {
    id: &'static str,
    problem: &'static str,
    reference: &'static str,
    original: [&'static str; 3],
    refined: [&'static str; 3],
    baseline: fn(usize) -> &'static str,
}

/// 17 * 23: one solver corrects itself after review; the judge's pick is right; the single-model
/// sample is wrong and self-consistency right.
/// 2 + 2: two solvers keep a wrong answer and the judge picks one of them; both baselines right.
/// Capital of France: everybody agrees from the start.
const SET: [Scripted; 3] = [
    Scripted {
        id: "mul",
        problem: "What is 17 * 23?",
        reference: "391",
        original: ["391", "391", "390"],
        refined: ["391", "391", "391"],
        baseline: |n| if n == 1 { "390" } else { "391" },
    },
    Scripted {
        id: "add",
        problem: "What is 2 + 2?",
        reference: "4",
        original: ["5", "5", "4"],
        refined: ["5", "5", "4"],
        baseline: |_| "4",
    },
    Scripted {
        id: "capital",
        problem: "What is the capital of France?",
        reference: "Paris",
        original: ["Paris", "paris", "Paris."],
        refined: ["Paris", "Paris", "Paris"],
        baseline: |_| "Paris",
    },
];

fn problem_of(r: &RecordedRequest) -> &'static Scripted {
    let p = r.first_user_message();
    SET.iter().find(|s| p.contains(s.problem)).unwrap_or_else(|| panic!("no known problem in {p}"))
}

fn answer(r: &RecordedRequest) -> Reply {
    let s = problem_of(r);
    let who = r.debate_speaker();
    let reply = match r.schema_name() {
        "debate_solution" => {
            let answer = match who.strip_prefix("baseline_") {
                Some(n) => (s.baseline)(n.parse().unwrap()),
                None => s.original[solver_index(&who)],
            };
            json!({"approach": "direct", "reasoning_steps": [format!("step of {who}")], "final_answer": answer,
                   "confidence": 0.7})
        }
        "debate_review" => json!({"strengths": ["clear"], "weaknesses": [], "errors": [],
                                  "suggested_changes": ["double-check"]}),
        "debate_refinement" => {
            let i = solver_index(&who);
            json!({"critiques_accepted": ["double-check"], "critiques_rejected": [],
                   "refinement_reasoning": "checked again", "reasoning_steps": ["checked"],
                   "final_answer": s.refined[i], "confidence": 0.8,
                   "changed_from_original": s.refined[i] != s.original[i], "improvement_explanation": "checked"})
        }
        "debate_judgment" => {
            return Reply::text(
                json!({"reasoning": "solver_1 is careful", "winner": "solver_1", "confidence": 0.9}).to_string(),
            )
            .usage(100, 20);
        }
        other => panic!("unexpected stage {other}"),
    };
    Reply::json(reply).usage(50, 10)
}

fn solver_index(id: &str) -> usize {
    ["solver_1", "solver_2", "solver_3"].iter().position(|i| *i == id).unwrap_or_else(|| panic!("solver {id}"))
}

fn pipeline(problems: &[&Scripted], baselines: bool, early_stop: bool) -> gw::DebatePipeline {
    gw::DebatePipeline {
        problems: problems
            .iter()
            .map(|s| gw::DebateProblem {
                id: s.id.into(),
                problem: s.problem.into(),
                reference: Some(s.reference.into()),
            })
            .collect(),
        baselines,
        early_stop_on_agreement: early_stop,
        concurrency: 1,
        ..Default::default()
    }
}

fn debate_result(events: &[gw::RunEvent]) -> (i32, gw::DebateRunResult) {
    let Some(Event::Completed(done)) = events.last().and_then(|e| e.event.as_ref()) else {
        panic!("the run completes: {events:?}")
    };
    let Some(gw::run_result::Result::Debate(d)) = done.result.as_ref().and_then(|r| r.result.clone()) else {
        panic!("a debate result: {done:?}")
    };
    (done.state, d)
}

/// Requests per (problem id, stage, speaker kind).
fn requests_of(requests: &[RecordedRequest], id: &str, stage_name: &str, baseline: bool) -> usize {
    requests
        .iter()
        .filter(|r| {
            problem_of(r).id == id
                && r.schema_name() == stage_name
                && r.debate_speaker().starts_with("baseline_") == baseline
        })
        .count()
}

#[tokio::test]
async fn three_problems_are_debated_graded_and_compared_with_the_baselines() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(answer);
    let set: Vec<&Scripted> = SET.iter().collect();
    let events =
        run_to_end(sandbox.gateway().await, gw::run_pipeline_request::Pipeline::Debate(pipeline(&set, true, false)))
            .await;
    let (state, d) = debate_result(&events);
    assert_eq!(state, gw::RunState::Succeeded as i32, "{d:?}");

    // Per problem: the judge's pick (solver_1's refined answer), graded against the reference.
    let got: Vec<(&str, &str, Option<bool>, bool, bool)> = d
        .problems
        .iter()
        .map(|p| (p.id.as_str(), p.final_answer.as_str(), p.correct, p.consensus, p.answers_changed))
        .collect();
    assert_eq!(
        got,
        [
            ("mul", "391", Some(true), true, true),
            ("add", "5", Some(false), false, false),
            ("capital", "Paris", Some(true), true, false),
        ]
    );
    assert!(d.problems.iter().all(|p| p.decided_by == dpb::DebateDecision::Judge as i32 && p.error.is_empty()));
    let artifacts = d.problems[0].debate.as_ref().unwrap();
    assert_eq!((artifacts.solutions.len(), artifacts.reviews.len(), artifacts.refined.len()), (3, 6, 3));
    assert_eq!(artifacts.usage.as_ref().unwrap().calls, 13);

    // Aggregates.
    assert_eq!((d.problems_total, d.problems_failed, d.graded, d.correct), (3, 0, 3, 2));
    assert!((d.accuracy.unwrap() - 2.0 / 3.0).abs() < 1e-9);
    assert!((d.consensus_rate - 2.0 / 3.0).abs() < 1e-9);
    assert!((d.changed_rate - 1.0 / 3.0).abs() < 1e-9);
    assert_eq!(d.calls, 3 * 13);
    assert_eq!(d.tokens, 3 * (12 * 60 + 120));

    // Baselines: 13 samples (the debate's 13 calls) from 5 Solve calls of 3 samples each.
    let requests = sandbox.llm.requests();
    for s in &SET {
        assert_eq!(requests_of(&requests, s.id, "debate_solution", false), 3, "{}", s.id);
        assert_eq!(requests_of(&requests, s.id, "debate_review", false), 6, "{}", s.id);
        assert_eq!(requests_of(&requests, s.id, "debate_solution", true), 15, "{}: 5 Solve calls", s.id);
    }
    let b: Vec<&gw::DebateBaselines> = d.problems.iter().map(|p| p.baselines.as_ref().unwrap()).collect();
    assert!(b.iter().all(|b| b.samples == 13 && b.sample_answers.len() == 13 && b.usage.as_ref().unwrap().calls == 15));
    assert_eq!((b[0].single_model_answer.as_str(), b[0].single_model_correct), ("390", Some(false)));
    assert_eq!((b[0].self_consistency_answer.as_str(), b[0].self_consistency_correct), ("391", Some(true)));
    assert_eq!(b[0].votes, 12);
    assert!((d.single_model_accuracy.unwrap() - 2.0 / 3.0).abs() < 1e-9);
    assert_eq!(d.self_consistency_accuracy, Some(1.0));
    assert_eq!(d.baseline_usage.unwrap().calls, 45);
    assert_eq!(requests.len(), 3 * 13 + 45);
    // The baseline samples use the first solver's model (temperature 0.2 by default).
    let temps: Vec<f64> = requests
        .iter()
        .filter(|r| r.debate_speaker().starts_with("baseline_"))
        .map(|r| r.body["temperature"].as_f64().unwrap())
        .collect();
    assert!(temps.iter().all(|t| (t - 0.2).abs() < 1e-6), "{temps:?}");

    // Events: the four stages of every problem with its id, one problem-done event each.
    let mut stages: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut done = Vec::new();
    for e in &events {
        match &e.event {
            Some(Event::DebateStage(s)) => {
                stages.entry(s.problem_id.clone()).or_default().push(s.stage.as_ref().unwrap().stage.clone());
            }
            Some(Event::DebateProblemDone(p)) => done.push(p.id.clone()),
            _ => {}
        }
    }
    for s in &SET {
        assert_eq!(stages[s.id], ["solve", "review", "refine", "judge"], "{}", s.id);
    }
    assert_eq!(done, ["mul", "add", "capital"]);

    // The stored run: progress in problems, usage of debates and baselines.
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let run_id = events[0].run_id.clone();
    let run = client.get_run(gw::GetRunRequest { run_id }).await.unwrap().into_inner().run.unwrap();
    assert_eq!((run.kind, run.records_total, run.records_done), (gw::PipelineKind::Debate as i32, 3, 3));
    assert_eq!(run.usage.unwrap().calls, 3 * 13 + 45);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn agreeing_solvers_stop_early_without_reviews_and_the_baselines_follow_the_call_count() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(answer);
    let events = sandbox
        .run_pipeline(gw::run_pipeline_request::Pipeline::Debate(pipeline(&[&SET[2], &SET[0]], true, true)))
        .await;
    let (state, d) = debate_result(&events);
    assert_eq!(state, gw::RunState::Succeeded as i32);
    let capital = &d.problems[0];
    assert_eq!(capital.decided_by, dpb::DebateDecision::Consensus as i32);
    assert_eq!((capital.final_answer.as_str(), capital.correct, capital.consensus), ("Paris", Some(true), true));
    let artifacts = capital.debate.as_ref().unwrap();
    assert!(artifacts.stopped_early && artifacts.reviews.is_empty() && artifacts.judgment.is_none());
    assert_eq!(artifacts.usage.as_ref().unwrap().calls, 3);
    let requests = sandbox.llm.requests();
    for stage_name in ["debate_review", "debate_refinement", "debate_judgment"] {
        assert_eq!(requests_of(&requests, "capital", stage_name, false), 0, "{stage_name}");
    }
    // Three debate calls: three samples, one Solve call.
    let b = capital.baselines.as_ref().unwrap();
    assert_eq!((b.samples, b.usage.as_ref().unwrap().calls), (3, 3));
    assert_eq!(requests_of(&requests, "capital", "debate_solution", true), 3);
    // The other problem disagrees at first: one full round (its refined answers then agree).
    let mul = &d.problems[1];
    assert_eq!(mul.debate.as_ref().unwrap().usage.as_ref().unwrap().calls, 13);
    assert_eq!(mul.baselines.as_ref().unwrap().samples, 13);
    assert_eq!(d.calls, 16);
    assert_eq!(d.consensus_rate, 1.0);
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_restarted_gateway_resumes_without_redoing_finished_problems() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("runs.db").display().to_string();
    let mut sandbox = MeshSandbox::start_with(SandboxOptions { store: Some(store), ..Default::default() }).await;
    // The third problem hangs until the gateway stops.
    let hang = Arc::new(AtomicBool::new(true));
    let h = hang.clone();
    sandbox.llm.set_handler(move |r| {
        if h.load(Ordering::SeqCst) && problem_of(r).id == "capital" { Reply::hang() } else { answer(r) }
    });
    let set: Vec<&Scripted> = SET.iter().collect();
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let mut stream = client
        .run_pipeline(gw::RunPipelineRequest {
            open: false,
            pipeline: Some(gw::run_pipeline_request::Pipeline::Debate(pipeline(&set, false, false))),
            label: "interrupted".into(),
            budget: None,
        })
        .await
        .unwrap()
        .into_inner();
    let mut run_id = String::new();
    let mut before = Vec::new();
    while before.len() < 2 {
        let ev = stream.message().await.unwrap().unwrap().event.unwrap();
        run_id.clone_from(&ev.run_id);
        if let Some(Event::DebateProblemDone(p)) = ev.event {
            before.push(p);
        }
    }
    drop(stream);
    sandbox.mesh.take().unwrap().shutdown().await.unwrap();

    hang.store(false, Ordering::SeqCst);
    let sent_before = sandbox.llm.requests().len();
    sandbox.restart(sandbox.hub()).await;
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let mut watch =
        client.watch_run(gw::WatchRunRequest { run_id: run_id.clone(), after_sequence: 0 }).await.unwrap().into_inner();
    let mut events = Vec::new();
    while let Some(m) = watch.message().await.unwrap() {
        events.push(m.event.unwrap());
    }
    let seqs: Vec<u64> = events.iter().map(|e| e.sequence).collect();
    assert_eq!(seqs, (1..=events.len() as u64).collect::<Vec<_>>(), "one gap-free sequence across the restart");
    let (state, d) = debate_result(&events);
    assert_eq!(state, gw::RunState::Succeeded as i32);
    assert_eq!(d.problems.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(), ["mul", "add", "capital"]);
    assert_eq!(d.problems[..2], before[..], "finished problems are kept as they were");
    assert_eq!(d.correct, 2);
    // After the restart only the unfinished problem reached the backend: one whole debate; the
    // finished ones were debated once in all.
    let requests = sandbox.llm.requests();
    assert!(requests[sent_before..].iter().all(|r| problem_of(r).id == "capital"));
    for id in ["mul", "add"] {
        assert_eq!(requests.iter().filter(|r| problem_of(r).id == id).count(), 13, "{id}");
    }
    assert_eq!(requests_of(&requests, "capital", "debate_judgment", false), 1);
    let done_events = events.iter().filter(|e| matches!(e.event, Some(Event::DebateProblemDone(_)))).count();
    assert_eq!(done_events, 3, "each problem finished once");
    sandbox.shutdown().await.unwrap();
}

/// With the self-refine hook, every final answer not excluded is polished after its debate (the
/// problem as the instruction); grading uses the debate's answer; "too_short" answers cost no call.
#[tokio::test]
async fn the_self_refine_hook_polishes_final_answers_and_grading_uses_the_debate_answer() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(|r| {
        let p = r.first_user_message();
        if p.starts_with("TASK:") {
            let draft = p.split("DRAFT:\n<draft>\n").nth(1).and_then(|d| d.split("\n</draft>").next()).unwrap_or("");
            return Reply::text(format!(
                "<critique>\n- Say it plainly.\n</critique>\n<revised>\n{draft}, ok\n</revised>"
            ))
            .usage(40, 8);
        }
        answer(r)
    });
    let set: Vec<&Scripted> = SET.iter().collect();
    let mut p = pipeline(&set, false, false);
    p.self_refine = Some(rf::SelfRefineHook { min_bytes: Some(0), exclude: vec!["add".into()], ..Default::default() });
    let events = run_to_end(sandbox.gateway().await, gw::run_pipeline_request::Pipeline::Debate(p)).await;
    let (state, d) = debate_result(&events);
    assert_eq!(state, gw::RunState::Succeeded as i32);
    assert_eq!(d.correct, 2, "graded on the debate's answers: {d:?}");
    for pr in &d.problems {
        let hook = pr.self_refined.as_ref().expect("the hook's entry");
        assert_eq!((hook.target.as_str(), hook.producer.as_str()), (pr.id.as_str(), "debate"));
        let debated = pr.debate.as_ref().unwrap().final_answer.clone();
        assert_eq!(hook.before, debated);
        if pr.id == "add" {
            assert_eq!(hook.skipped, "excluded");
            assert_eq!(pr.final_answer, debated);
        } else {
            assert_eq!(pr.final_answer, format!("{debated}, ok"), "{pr:?}");
            assert_eq!(hook.refine.as_ref().map(|r| r.passes.len()), Some(1));
        }
    }
    let hooked: Vec<&gw::SelfRefined> = events
        .iter()
        .filter_map(|e| match &e.event {
            Some(Event::SelfRefined(x)) => Some(x),
            _ => None,
        })
        .collect();
    assert_eq!(hooked.len(), 3, "one event per problem");
    let polish: Vec<String> = sandbox
        .llm
        .requests()
        .iter()
        .map(RecordedRequest::first_user_message)
        .filter(|p| p.starts_with("TASK:"))
        .collect();
    assert_eq!(polish.len(), 2, "the excluded problem cost no call");
    assert!(polish.iter().any(|p| p.contains("What is 17 * 23?")), "the problem is the instruction");
    sandbox.shutdown().await.unwrap();

    // The default min_bytes (200) leaves short answers alone: no self-refine call at all.
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(answer);
    let mut p = pipeline(&[&SET[0]], false, false);
    p.self_refine = Some(rf::SelfRefineHook::default());
    let events = run_to_end(sandbox.gateway().await, gw::run_pipeline_request::Pipeline::Debate(p)).await;
    let (_, d) = debate_result(&events);
    assert_eq!(d.problems[0].self_refined.as_ref().map(|h| h.skipped.as_str()), Some("too_short"));
    assert_eq!(d.problems[0].final_answer, "391");
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_bad_problem_is_named_and_no_model_is_called() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(answer);
    let mut client = GatewayServiceClient::new(sandbox.gateway().await);
    let mut blank = pipeline(&SET.iter().collect::<Vec<_>>(), true, false);
    blank.problems[1].problem = "   ".into();
    let mut duplicate = pipeline(&[&SET[0], &SET[0]], false, false);
    duplicate.concurrency = 65;
    let cases = [
        (blank, "pipeline.problems[1].problem", "must not be empty"),
        (duplicate.clone(), "pipeline.problems[1].id", "duplicate id"),
        (duplicate, "pipeline.concurrency", "the limit is 64"),
        (
            gw::DebatePipeline { rounds: Some(6), ..pipeline(&[&SET[0]], false, false) },
            "pipeline.rounds",
            "between 1 and 5",
        ),
        (gw::DebatePipeline::default(), "pipeline.problems", "must not be empty"),
        (
            gw::DebatePipeline {
                self_refine: Some(rf::SelfRefineHook { convergence_mode: 7, ..Default::default() }),
                ..pipeline(&[&SET[0]], false, false)
            },
            "pipeline.self_refine.convergence_mode",
            "unknown",
        ),
    ];
    for (p, field, text) in cases {
        let st = client
            .run_pipeline(gw::RunPipelineRequest {
                open: false,
                pipeline: Some(gw::run_pipeline_request::Pipeline::Debate(p)),
                label: String::new(),
                budget: None,
            })
            .await
            .expect_err("refused");
        assert_eq!(st.code(), tonic::Code::InvalidArgument, "{field}: {st:?}");
        let bad = st.get_details_bad_request().expect("field violations");
        let v = bad.field_violations.iter().find(|v| v.field == field).unwrap_or_else(|| panic!("{field}: {bad:?}"));
        assert!(v.description.contains(text), "{field}: {}", v.description);
    }
    assert_eq!(sandbox.llm.request_count(), 0, "no model call");
    sandbox.shutdown().await.unwrap();
}

// ---------------------------------------------------------------------------------------------
// Raw replies, accuracy over every problem, reply schemas sized for a stronger model.

/// The exact text the scripted backend sends for a call: pretty-printed JSON with a key the
/// parser drops (`scratchpad`), so only the raw text shows what the model said.
fn raw_text(r: &RecordedRequest) -> String {
    let who = r.debate_speaker();
    let retry = r.messages().len() > 1;
    let s = problem_of(r);
    let mut reply = match r.schema_name() {
        "debate_solution" => json!({"approach": "direct", "reasoning_steps": [format!("step of {who}")],
                                    "final_answer": s.original[solver_index(&who)], "confidence": 0.7}),
        "debate_review" => json!({"strengths": ["clear"], "weaknesses": [], "errors": [],
                                  "suggested_changes": ["double-check"]}),
        "debate_refinement" => {
            let i = solver_index(&who);
            json!({"critiques_accepted": ["double-check"], "critiques_rejected": [],
                   "refinement_reasoning": "checked again", "reasoning_steps": ["checked"],
                   "final_answer": s.refined[i], "confidence": 0.8,
                   "changed_from_original": s.refined[i] != s.original[i], "improvement_explanation": "checked"})
        }
        other => panic!("unexpected stage {other}"),
    };
    reply["scratchpad"] = json!(format!("{who} thinking aloud about {} (retry: {retry})", r.schema_name()));
    serde_json::to_string_pretty(&reply).unwrap()
}

/// Every solve, review, refine and judge call's reply is in the artifacts exactly as the backend
/// sent it; an unusable reply (solver_3's first solution, both of the judge's replies) is kept
/// with why it could not be used, beside the retry's reply.
#[tokio::test]
async fn every_model_reply_is_kept_raw_in_the_debate_artifacts() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(|r| {
        let retry = r.messages().len() > 1;
        match (r.schema_name(), r.debate_speaker().as_str()) {
            ("debate_solution", "solver_3") if !retry => Reply::text("I think it is 391, roughly."),
            ("debate_judgment", _) => Reply::text(format!("The best is solver one (retry: {retry}).")),
            _ => Reply::text(raw_text(r)),
        }
        .usage(50, 10)
    });
    let events =
        sandbox.run_pipeline(gw::run_pipeline_request::Pipeline::Debate(pipeline(&[&SET[0]], false, false))).await;
    let (state, d) = debate_result(&events);
    assert_eq!(state, gw::RunState::Succeeded as i32, "{d:?}");
    let debate = d.problems[0].debate.as_ref().unwrap();
    // Every reply the backend sent, by (stage, speaker, target, retry).
    let sent: Vec<(String, String, bool)> = sandbox
        .llm
        .requests()
        .iter()
        .map(|r| {
            let retry = r.messages().len() > 1;
            let text = match (r.schema_name(), r.debate_speaker().as_str()) {
                ("debate_solution", "solver_3") if !retry => "I think it is 391, roughly.".to_string(),
                ("debate_judgment", _) => format!("The best is solver one (retry: {retry})."),
                _ => raw_text(r),
            };
            (r.schema_name().to_string(), text, retry)
        })
        .collect();
    let kept = |raw: &[dpb::RawReply]| raw.iter().map(|x| x.text.clone()).collect::<Vec<_>>();
    let was_sent = |stage: &str, text: &str| sent.iter().any(|(s, t, _)| s == stage && t == text);

    for s in &debate.solutions {
        let raw = &s.raw_replies;
        if s.solver_id == "solver_3" {
            assert_eq!(kept(raw)[0], "I think it is 391, roughly.");
            assert!(raw[0].unusable_reason.contains("no JSON"), "{:?}", raw[0]);
            assert_eq!(raw.len(), 2, "the first reply and the retry's");
            assert!(raw[1].unusable_reason.is_empty() && raw[1].text.contains("(retry: true)"));
        } else {
            assert_eq!(raw.len(), 1, "{}", s.solver_id);
            assert!(raw[0].unusable_reason.is_empty());
        }
        let used = raw.last().unwrap();
        assert!(was_sent("debate_solution", &used.text), "kept as sent: {used:?}");
        assert!(used.text.contains("\"scratchpad\"") && used.text.contains("\n  "), "the exact text: {used:?}");
        assert_eq!((used.bytes as usize, used.finish_reason.as_str()), (used.text.len(), "stop"));
    }
    assert_eq!(debate.reviews.len(), 6);
    for r in &debate.reviews {
        assert_eq!(r.raw_replies.len(), 1);
        assert!(was_sent("debate_review", &r.raw_replies[0].text), "{r:?}");
        assert!(r.raw_replies[0].text.contains(&format!("{} thinking aloud about debate_review", r.reviewer_id)));
    }
    for r in &debate.refined {
        assert_eq!(r.raw_replies.len(), 1);
        assert!(was_sent("debate_refinement", &r.raw_replies[0].text), "{r:?}");
    }
    let j = debate.judgment.as_ref().unwrap();
    assert!(j.majority_vote_fallback);
    assert_eq!(
        kept(&j.raw_replies),
        ["The best is solver one (retry: false).", "The best is solver one (retry: true)."]
    );
    assert!(j.raw_replies.iter().all(|x| !x.unusable_reason.is_empty()));
    // The stage events carry them too.
    let solve_event = events
        .iter()
        .find_map(|e| match &e.event {
            Some(Event::DebateStage(s)) if s.stage.as_ref().unwrap().stage == "solve" => s.stage.clone(),
            _ => None,
        })
        .unwrap();
    assert_eq!(solve_event.solutions[2].raw_replies, debate.solutions[2].raw_replies);
    sandbox.shutdown().await.unwrap();
}

/// A problem that fails counts as wrong in the accuracy over every problem, beside the accuracy
/// over the graded ones; its error quotes the start of the unusable reply.
#[tokio::test]
async fn accuracy_counts_a_failed_problem_as_wrong_beside_the_graded_accuracy() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(|r| {
        if problem_of(r).id == "capital" && r.debate_speaker() == "solver_2" {
            return Reply::text("Paris, obviously; no JSON from me.").usage(5, 5);
        }
        answer(r)
    });
    let set: Vec<&Scripted> = SET.iter().collect();
    let events = sandbox.run_pipeline(gw::run_pipeline_request::Pipeline::Debate(pipeline(&set, false, false))).await;
    let (state, d) = debate_result(&events);
    assert_eq!(state, gw::RunState::Partial as i32, "{d:?}");
    let capital = &d.problems[2];
    assert!(capital.error.contains("no usable solution"), "{}", capital.error);
    assert!(capital.error.contains("Paris, obviously; no JSON from me."), "the reply is quoted: {}", capital.error);
    // mul right, add wrong, capital failed.
    assert_eq!((d.problems_total, d.problems_failed, d.graded, d.correct), (3, 1, 2, 1));
    assert_eq!(d.accuracy, Some(0.5), "over the graded problems");
    assert_eq!(d.failed_with_reference, 1);
    let all = d.accuracy_all.expect("accuracy over every problem");
    assert!((all - 1.0 / 3.0).abs() < 1e-9, "{all}");
    sandbox.shutdown().await.unwrap();
}

/// `reply` cut to what `schema` allows, as a backend that enforces the schema (constrained
/// decoding, strict structured output) would write it: lists stop at `maxItems`, texts at
/// `maxLength` characters.
fn fit(reply: &serde_json::Value, schema: &serde_json::Value) -> serde_json::Value {
    use serde_json::Value;
    let max = |k: &str| schema.get(k).and_then(Value::as_u64).map(|n| n as usize);
    match reply {
        Value::Object(o) => {
            let props = &schema["properties"];
            Value::Object(o.iter().map(|(k, v)| (k.clone(), fit(v, &props[k]))).collect())
        }
        Value::Array(a) => Value::Array(
            a.iter().take(max("maxItems").unwrap_or(usize::MAX)).map(|v| fit(v, &schema["items"])).collect(),
        ),
        Value::String(s) => Value::String(s.chars().take(max("maxLength").unwrap_or(usize::MAX)).collect()),
        other @ (Value::Null | Value::Bool(_) | Value::Number(_)) => other.clone(),
    }
}

/// What a stronger model writes: 12 reasoning steps, a 200-character answer, reviews with five
/// weaknesses, errors and suggestions each (ten critiques per review), refinements accepting six
/// critiques and rejecting five.
fn stronger_reply(r: &RecordedRequest) -> serde_json::Value {
    let who = r.debate_speaker();
    let steps: Vec<String> = (1..=12).map(|i| format!("step {i} of {who}: one line of careful working")).collect();
    let answer = format!("391, because {}", "seventeen times twenty-three is three hundred ninety-one; ".repeat(4));
    let answer = answer.chars().take(200).collect::<String>();
    let list = |what: &str, n: usize| (1..=n).map(|i| format!("{what} {i}")).collect::<Vec<_>>();
    match r.schema_name() {
        "debate_solution" => json!({"approach": "long multiplication", "reasoning_steps": steps,
                                    "final_answer": answer, "confidence": 0.9}),
        "debate_review" => json!({
            "strengths": list("strength", 5), "weaknesses": list("weakness", 5),
            "errors": (1..=5).map(|i| json!({"location": format!("step {i}"), "error_type": "calculation",
                                              "severity": "minor", "description": format!("error {i}")}))
                             .collect::<Vec<_>>(),
            "suggested_changes": list("suggestion", 5)}),
        "debate_refinement" => json!({
            "critiques_accepted": list("accepted", 6),
            "critiques_rejected": (1..=5).map(|i| json!({"critique": format!("rejected {i}"), "reason": "wrong"}))
                                         .collect::<Vec<_>>(),
            "refinement_reasoning": "weighed every critique", "reasoning_steps": steps, "final_answer": answer,
            "confidence": 0.95, "changed_from_original": false, "improvement_explanation": "clearer"}),
        "debate_judgment" => json!({"reasoning": "all agree", "winner": "solver_1", "confidence": 0.9}),
        other => panic!("unexpected stage {other}"),
    }
}

/// A stronger model's longer reply keeps every step, critique and character of its answer as far
/// as the request allows, through a backend that enforces the reply schema and its token limit.
#[tokio::test]
async fn a_stronger_models_longer_replies_are_not_cut_by_the_reply_schemas() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(|r| {
        let schema = r.body.pointer("/response_format/json_schema/schema").cloned().unwrap_or_default();
        let text = fit(&stronger_reply(r), &schema).to_string();
        let limit = ["max_tokens", "max_completion_tokens"].iter().find_map(|k| r.body[*k].as_u64()).unwrap();
        // A reply over its token limit (four characters a token) is cut there.
        if text.len() as u64 > 4 * limit {
            return Reply::text(text.chars().take(4 * limit as usize).collect::<String>()).finish_reason("length");
        }
        let tokens = text.len() as u64 / 4;
        Reply::text(text).usage(500, tokens)
    });
    let problem = gw::DebateProblem { id: "mul".into(), problem: SET[0].problem.into(), reference: None };
    let p = gw::DebatePipeline { problems: vec![problem], concurrency: 1, ..Default::default() };
    let events = sandbox.run_pipeline(gw::run_pipeline_request::Pipeline::Debate(p)).await;
    let (state, d) = debate_result(&events);
    assert_eq!(state, gw::RunState::Succeeded as i32, "{d:?}");
    let debate = d.problems[0].debate.as_ref().unwrap();
    let answer = stronger_reply(&sandbox.llm.requests()[0])["final_answer"].as_str().unwrap().to_string();
    assert_eq!(answer.len(), 200);
    for s in &debate.solutions {
        assert_eq!((s.reasoning_steps.len(), s.final_answer.as_str()), (12, answer.as_str()), "{}", s.solver_id);
    }
    for r in &debate.reviews {
        let counts = (r.strengths.len(), r.weaknesses.len(), r.errors.len(), r.suggested_changes.len());
        assert_eq!(counts, (5, 5, 5, 5), "{} on {}", r.reviewer_id, r.target_solver_id);
    }
    for r in &debate.refined {
        let counts = (r.critiques_accepted.len(), r.critiques_rejected.len(), r.reasoning_steps.len());
        assert_eq!(counts, (6, 5, 12), "{}", r.solver_id);
        assert_eq!(r.final_answer, answer);
    }
    assert_eq!(d.problems[0].final_answer, answer);
    // No call was cut at its token limit (no retry: 13 calls).
    assert_eq!(sandbox.llm.request_count(), 13);
    sandbox.shutdown().await.unwrap();
}

/// With a price table, a debate's cost is its calls at the table's prices: the judge's replies
/// (100 + 20 tokens) and every other call (50 + 10), counted at the backend, summed into the
/// debate's and the baselines' usage.
#[tokio::test]
async fn a_priced_debate_costs_its_calls_at_the_price_table() {
    let prices = BTreeMap::from([(
        "scripted-judge".to_string(),
        assay_llm::pricing::Price { input: 2.0, output: 8.0, cached_input: None },
    )]);
    let sandbox = MeshSandbox::start_with(SandboxOptions { prices: Some(prices), ..Default::default() }).await;
    sandbox.llm.set_handler(answer);
    let set: Vec<&Scripted> = SET.iter().collect();
    let events =
        run_to_end(sandbox.gateway().await, gw::run_pipeline_request::Pipeline::Debate(pipeline(&set, true, false)))
            .await;
    let (state, d) = debate_result(&events);
    assert_eq!(state, gw::RunState::Succeeded as i32, "{d:?}");
    let requests = sandbox.llm.requests();
    let judgments = requests.iter().filter(|r| r.schema_name() == "debate_judgment").count() as f64;
    let others = requests.len() as f64 - judgments;
    let want = (judgments * (100.0 * 2.0 + 20.0 * 8.0) + others * (50.0 * 2.0 + 10.0 * 8.0)) / 1e6;
    let cost = |u: &Option<assay_proto::common::v1::Usage>| u.as_ref().and_then(|u| u.cost_usd).expect("priced");
    let got = cost(&d.debate_usage) + cost(&d.baseline_usage);
    assert!(judgments > 0.0 && others > 0.0);
    assert!((got - want).abs() < 1e-12, "debate + baselines ${got}, calls at the prices ${want}");
    let run = GatewayServiceClient::new(sandbox.gateway().await)
        .get_run(gw::GetRunRequest { run_id: events[0].run_id.clone() })
        .await
        .unwrap()
        .into_inner()
        .run
        .unwrap();
    assert!((cost(&run.usage) - want).abs() < 1e-12, "the run's cost: {:?}", run.usage);
    sandbox.shutdown().await.unwrap();
}
