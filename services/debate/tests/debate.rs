//! The debate service over real gRPC on port 0, against the scripted OpenAI-compatible backend,
//! which answers every call from what the request says: the reply schema names the stage, the
//! prompt names the solver (and, for a review, the solution under review). Every check of who saw
//! what is made on the requests the backend recorded.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use assay_domain::debate::{Debate, DebateEvent, DebateRequest, DebateStage};
use assay_llm::ModelHub;
use assay_llm::OpenAiConfig;
use assay_proto::common::v1 as common;
use assay_proto::debate::v1 as pb;
use assay_proto::debate::v1::debate_service_client::DebateServiceClient;
use assay_proto::debate::v1::run_debate_stream_response::Event;
use assay_testkit::{RecordedRequest, Reply, ScriptedLlm, TestServer};
use serde_json::json;
use tonic::Code;
use tonic_types::StatusExt;

const IDS: [&str; 3] = ["solver_1", "solver_2", "solver_3"];
const PROBLEM: &str = "A farmer has 17 sheep; all but 9 run away. How many are left?";

/// What the scripted solvers and judge answer.
#[derive(Clone)]
struct Script {
    original: [&'static str; 3],
    original_confidence: [f64; 3],
    refined: [&'static str; 3],
    refined_confidence: [f64; 3],
    /// Successive judge replies (raw text); the last one repeats.
    judge: Vec<String>,
    /// `stage:solver` keys whose first reply is not JSON (the retry gets a good one).
    bad_first: BTreeSet<String>,
    /// `stage:solver` keys that never reply with JSON.
    always_bad: BTreeSet<String>,
}

impl Default for Script {
    fn default() -> Self {
        Script {
            original: ["orig-one", "orig-two", "orig-three"],
            original_confidence: [0.6, 0.7, 0.8],
            refined: ["ref-x", "ref-y", "ref-y"],
            refined_confidence: [0.9, 0.5, 0.8],
            judge: vec![judge_reply("solver_1", 0.75)],
            bad_first: BTreeSet::new(),
            always_bad: BTreeSet::new(),
        }
    }
}

fn judge_reply(winner: &str, confidence: f64) -> String {
    json!({"reasoning": format!("{winner} checks every condition"), "winner": winner, "confidence": confidence})
        .to_string()
}

/// The solver whose solution a review prompt shows.
fn review_target(r: &RecordedRequest) -> String {
    r.first_user_message()
        .lines()
        .find_map(|l| l.strip_prefix("The solution of ").and_then(|t| t.strip_suffix(':')))
        .unwrap_or("?")
        .to_string()
}

fn index(id: &str) -> usize {
    IDS.iter().position(|i| *i == id).unwrap_or_else(|| panic!("unknown solver {id}"))
}

fn strength_marker(by: &str, of: &str) -> String {
    format!("strength-by-{by}-of-{of}")
}

fn answer(script: &Script, r: &RecordedRequest, calls: &Mutex<HashMap<String, usize>>) -> Reply {
    let stage = r.schema_name();
    let who = r.debate_speaker();
    let key = format!("{stage}:{who}");
    let n = {
        let mut calls = calls.lock().unwrap();
        let n = calls.entry(key.clone()).or_default();
        *n += 1;
        *n
    };
    if script.always_bad.contains(&key) || (n == 1 && script.bad_first.contains(&key)) {
        return Reply::text("I would rather explain in prose.").usage(10, 5);
    }
    let reply = match stage {
        "debate_solution" => {
            let i = index(&who);
            json!({"approach": format!("approach of {who}"), "reasoning_steps": [format!("step of {who}")],
                   "final_answer": script.original[i], "confidence": script.original_confidence[i]})
        }
        "debate_review" => {
            let target = review_target(r);
            json!({"strengths": [strength_marker(&who, &target)], "weaknesses": [],
                   "errors": [{"location": "step 1", "error_type": "logic", "severity": "major",
                               "description": format!("error-by-{who}-in-{target}")}],
                   "suggested_changes": ["re-read the question"]})
        }
        "debate_refinement" => {
            let i = index(&who);
            json!({"critiques_accepted": [format!("accepted by {who}")],
                   "critiques_rejected": [{"critique": "wrong approach", "reason": "it is right"}],
                   "refinement_reasoning": "re-read the question", "reasoning_steps": [format!("refined step of {who}")],
                   "final_answer": script.refined[i], "confidence": script.refined_confidence[i],
                   "changed_from_original": true, "improvement_explanation": "fixed the reading"})
        }
        "debate_judgment" => {
            let text = script.judge.get(n - 1).or(script.judge.last()).cloned().unwrap_or_default();
            return Reply::text(text).usage(100, 20);
        }
        other => panic!("unexpected stage {other}"),
    };
    Reply::json(reply).usage(50, 10)
}

struct Harness {
    llm: ScriptedLlm,
    server: TestServer,
}

async fn harness(script: Script) -> Harness {
    let llm = ScriptedLlm::start().await;
    let calls = Mutex::new(HashMap::new());
    llm.set_handler(move |r| answer(&script, r, &calls));
    let mut cfg = OpenAiConfig::new(llm.base_url());
    cfg.default_model = "debater".into();
    cfg.base_backoff = Duration::from_millis(5);
    cfg.max_retries = 0;
    let hub = Arc::new(ModelHub::single_openai(cfg).unwrap());
    let server = TestServer::start(
        assay_debate::routes(Arc::new(assay_debate::DebateCore::new(hub))),
        &[assay_proto::service_names::DEBATE],
    )
    .await;
    Harness { llm, server }
}

impl Harness {
    async fn client(&self) -> DebateServiceClient<tonic::transport::Channel> {
        DebateServiceClient::new(self.server.channel().await)
    }

    fn requests(&self, stage_name: &str) -> Vec<RecordedRequest> {
        self.llm.requests().into_iter().filter(|r| r.schema_name() == stage_name).collect()
    }
}

fn debate(rounds: Option<u32>, early_stop: bool) -> pb::RunDebateRequest {
    pb::RunDebateRequest { problem: PROBLEM.into(), rounds, early_stop_on_agreement: early_stop, ..Default::default() }
}

#[tokio::test]
async fn each_solver_reviews_the_other_two_refines_with_its_two_reviews_and_the_judge_sees_everything() {
    let h = harness(Script::default()).await;
    let r = h.client().await.run_debate(debate(None, false)).await.unwrap().into_inner();

    // 3 solutions, 6 reviews, 3 refinements, 1 judgment.
    assert_eq!(h.llm.request_count(), 13);
    assert_eq!(r.usage.as_ref().unwrap().calls, 13);
    assert_eq!(r.usage.as_ref().unwrap().prompt_tokens, 12 * 50 + 100);

    // Stage 1: the default solvers, one model at three temperatures, each its own persona.
    let solves = h.requests("debate_solution");
    assert_eq!(solves.len(), 3);
    let temperatures: BTreeMap<String, f64> =
        solves.iter().map(|s| (s.debate_speaker(), s.body["temperature"].as_f64().unwrap())).collect();
    assert_eq!(temperatures.values().map(|t| (t * 10.0).round() as i64).collect::<Vec<_>>(), [2, 5, 8]);
    let personas: BTreeSet<String> =
        solves.iter().map(|s| s.first_user_message().lines().next().unwrap().to_string()).collect();
    assert_eq!(personas.len(), 3);
    assert!(solves.iter().all(|s| s.first_user_message().contains(PROBLEM) && s.model() == Some("debater")));
    assert_eq!(r.solutions.iter().map(|s| s.final_answer.as_str()).collect::<Vec<_>>(), Script::default().original);
    let record = r.solutions[1].model.as_ref().unwrap();
    assert_eq!(
        (record.phase.as_str(), record.temperature, record.model.as_str()),
        ("debate_solver", Some(0.5), "debater")
    );
    assert_eq!(record.prompt_template_sha256.len(), 64);

    // Stage 2: every ordered pair exactly once; a review shows its target's solution and no other.
    let reviews = h.requests("debate_review");
    let pairs: BTreeSet<(String, String)> = reviews.iter().map(|q| (q.debate_speaker(), review_target(q))).collect();
    let expected: BTreeSet<(String, String)> = IDS
        .iter()
        .flat_map(|a| IDS.iter().filter(move |b| *b != a).map(move |b| (a.to_string(), b.to_string())))
        .collect();
    assert_eq!((reviews.len(), &pairs), (6, &expected));
    for q in &reviews {
        let target = index(&review_target(q));
        for (i, answer) in Script::default().original.iter().enumerate() {
            assert_eq!(
                q.first_user_message().contains(answer),
                i == target,
                "review {:?}",
                (q.debate_speaker(), review_target(q))
            );
        }
    }
    assert_eq!(r.reviews.len(), 6);
    assert!(r.reviews.iter().all(|x| x.model.as_ref().unwrap().phase == "debate_reviewer"));
    assert_eq!(r.reviews[0].errors[0].severity, common::Severity::Major as i32);

    // Stage 3: each solver gets exactly the two reviews about it.
    let refines = h.requests("debate_refinement");
    assert_eq!(refines.len(), 3);
    assert_eq!(refines.iter().map(RecordedRequest::debate_speaker).collect::<BTreeSet<_>>().len(), 3);
    for q in &refines {
        let me = q.debate_speaker();
        let text = q.first_user_message();
        for by in IDS {
            for of in IDS.iter().filter(|of| **of != by) {
                let shown = text.contains(&strength_marker(by, of));
                assert_eq!(shown, *of == me, "{me}'s refinement and the review of {of} by {by}");
            }
        }
        assert!(text.contains(Script::default().original[index(&me)]));
    }
    assert_eq!(r.refined.len(), 3);
    assert!(r.refined.iter().all(|x| x.changed && x.critiques_rejected.len() == 1));

    // Stage 4: the judge sees the problem, 3 originals, 6 reviews and 3 refined solutions.
    let judges = h.requests("debate_judgment");
    assert_eq!(judges.len(), 1);
    let text = judges[0].first_user_message();
    assert!(text.contains(PROBLEM));
    for answer in Script::default().original.iter().chain(&["ref-x", "ref-y"]) {
        assert!(text.contains(answer), "judge prompt lacks {answer}");
    }
    for by in IDS {
        for of in IDS.iter().filter(|of| **of != by) {
            assert!(text.contains(&strength_marker(by, of)) && text.contains(&format!("error-by-{by}-in-{of}")));
        }
    }
    let schema = judges[0].body.pointer("/response_format/json_schema/schema/properties/winner/enum").unwrap();
    assert_eq!(schema, &json!(IDS));

    // The judge picked the minority answer: the final answer is the winner's refined answer.
    let j = r.judgment.as_ref().unwrap();
    assert_eq!((j.winner_solver_id.as_str(), j.final_answer.as_str(), j.confidence), ("solver_1", "ref-x", 0.75));
    assert!(!j.majority_vote_fallback);
    assert_eq!(j.model.as_ref().unwrap().phase, "debate_judge");
    assert_eq!(j.model.as_ref().unwrap().temperature, Some(0.0));
    assert_eq!((r.final_answer.as_str(), r.winner_solver_id.as_str()), ("ref-x", "solver_1"));
    assert_eq!(r.decided_by, pb::DebateDecision::Judge as i32);
    assert!(r.answers_changed && !r.consensus && !r.stopped_early);
    assert_eq!(r.rounds.len(), 1);
    assert_eq!(r.rounds[0].reviews, r.reviews);
}

#[tokio::test]
async fn an_unparseable_judge_is_retried_once_then_the_majority_vote_decides_and_says_so() {
    let script = Script {
        judge: vec!["The best one is clearly the second.".into(), judge_reply("solver_9", 0.9)],
        ..Script::default()
    };
    let h = harness(script).await;
    let r = h.client().await.run_debate(debate(None, false)).await.unwrap().into_inner();

    let judges = h.requests("debate_judgment");
    assert_eq!(judges.len(), 2, "one call and one retry");
    let retry = judges[1].messages();
    assert_eq!(retry.len(), 3);
    assert_eq!(retry[1], ("assistant".to_string(), "The best one is clearly the second.".to_string()));
    assert!(retry[2].1.contains("could not be used: the reply holds no JSON object"), "{}", retry[2].1);

    let j = r.judgment.as_ref().unwrap();
    assert!(j.majority_vote_fallback);
    assert!(j.fallback_reason.contains("\"solver_9\" is not one of the solvers"), "{}", j.fallback_reason);
    // ref-y is held by solver_2 (0.5) and solver_3 (0.8): the more confident one wins.
    assert_eq!((j.winner_solver_id.as_str(), j.final_answer.as_str()), ("solver_3", "ref-y"));
    assert!((j.confidence - 2.0 / 3.0).abs() < 1e-9);
    assert!(j.reasoning.contains("majority vote") && j.reasoning.contains("2 of 3"), "{}", j.reasoning);
    assert_eq!(j.usage.as_ref().unwrap().calls, 2);
    assert_eq!(r.decided_by, pb::DebateDecision::MajorityVote as i32);
    assert_eq!(r.final_answer, "ref-y");
    assert_eq!(r.usage.unwrap().calls, 14);
}

#[tokio::test]
async fn agreement_before_the_reviews_stops_the_debate_without_reviews_or_judge() {
    let script = Script { original: ["9", " 9.0 ", "9."], original_confidence: [0.6, 0.9, 0.7], ..Script::default() };
    let h = harness(script).await;
    let r = h.client().await.run_debate(debate(Some(3), true)).await.unwrap().into_inner();
    assert_eq!(h.llm.request_count(), 3);
    assert!(h.requests("debate_review").is_empty());
    assert!(r.stopped_early && r.consensus && !r.answers_changed);
    assert!(r.judgment.is_none() && r.reviews.is_empty() && r.refined.is_empty() && r.rounds.is_empty());
    assert_eq!(r.decided_by, pb::DebateDecision::Consensus as i32);
    // The most confident solver's words (trimmed as every reply text is).
    assert_eq!((r.winner_solver_id.as_str(), r.final_answer.as_str()), ("solver_2", "9.0"));
    assert_eq!(r.usage.unwrap().calls, 3);
}

#[tokio::test]
async fn without_early_stop_agreeing_solvers_are_still_reviewed() {
    let script = Script { original: ["9", "9", "9"], refined: ["9", "9", "9"], ..Script::default() };
    let h = harness(script).await;
    let r = h.client().await.run_debate(debate(None, false)).await.unwrap().into_inner();
    assert_eq!(h.requests("debate_review").len(), 6);
    assert!(r.consensus && !r.stopped_early && !r.answers_changed);
    assert_eq!(r.decided_by, pb::DebateDecision::Judge as i32);
}

#[tokio::test]
async fn agreement_after_refinement_ends_the_rounds_and_the_judge_decides() {
    let script = Script { refined: ["ref-y", "ref-y", "REF-Y."], ..Script::default() };
    let h = harness(script).await;
    let r = h.client().await.run_debate(debate(Some(3), true)).await.unwrap().into_inner();
    assert_eq!(h.requests("debate_review").len(), 6, "one round only");
    assert_eq!(h.llm.request_count(), 13);
    assert_eq!(r.rounds.len(), 1);
    assert!(r.rounds[0].consensus && r.consensus && r.stopped_early);
    assert_eq!(r.decided_by, pb::DebateDecision::Judge as i32);
}

#[tokio::test]
async fn the_stream_reports_every_stage_in_order_with_its_artifacts() {
    let h = harness(Script::default()).await;
    let mut stream = h
        .client()
        .await
        .run_debate_stream(pb::RunDebateStreamRequest { request: Some(debate(Some(2), false)) })
        .await
        .unwrap()
        .into_inner();
    let mut stages = Vec::new();
    let mut result = None;
    while let Some(msg) = stream.message().await.unwrap() {
        match msg.event.unwrap() {
            Event::StageCompleted(e) => {
                assert!(result.is_none(), "an event after the result");
                let produced = match e.stage.as_str() {
                    "solve" => e.solutions.len(),
                    "review" => e.reviews.len(),
                    "refine" => e.refined.len(),
                    "judge" => usize::from(e.judgment.is_some()),
                    other => panic!("unknown stage {other}"),
                };
                assert!(e.usage.unwrap().calls > 0);
                stages.push((e.stage, e.round, produced));
            }
            Event::Result(r) => result = Some(r),
        }
    }
    let expect =
        [("solve", 0, 3), ("review", 1, 6), ("refine", 1, 3), ("review", 2, 6), ("refine", 2, 3), ("judge", 2, 1)];
    assert_eq!(stages, expect.map(|(s, r, n)| (s.to_string(), r, n)).to_vec());
    let r = result.expect("a result");
    assert_eq!(r.rounds.len(), 2);
    assert_eq!(r.usage.unwrap().calls, 3 + 2 * 9 + 1);

    // Round 2 reviews the refined solutions of round 1.
    let round_two: Vec<RecordedRequest> = h.requests("debate_review").into_iter().skip(6).collect();
    assert!(round_two.iter().all(|q| {
        let text = q.first_user_message();
        text.contains("ref-") && !text.contains("orig-")
    }));
}

#[tokio::test]
async fn the_remote_client_relays_the_stream_to_its_sink() {
    let h = harness(Script::default()).await;
    let remote = assay_rpc::remote::RemoteDebate::new(h.server.channel().await, None);
    let seen: Mutex<Vec<(DebateStage, u32)>> = Mutex::new(Vec::new());
    let sink = |e: DebateEvent| match e {
        DebateEvent::StageCompleted { stage, round, .. } => seen.lock().unwrap().push((stage, round)),
    };
    let out =
        remote.run_debate(DebateRequest { problem: PROBLEM.into(), ..DebateRequest::default() }, &sink).await.unwrap();
    assert_eq!(
        seen.into_inner().unwrap(),
        [(DebateStage::Solve, 0), (DebateStage::Review, 1), (DebateStage::Refine, 1), (DebateStage::Judge, 1)]
    );
    assert_eq!((out.final_answer.as_str(), out.rounds.len(), out.usage.calls), ("ref-x", 1, 13));

    // Errors come back with the request's own field names.
    let bad = DebateRequest { problem: String::new(), ..DebateRequest::default() };
    let e = remote.run_debate(bad, &assay_domain::no_events).await.unwrap_err();
    assert!(e.to_string().contains("problem: must not be empty") && !e.to_string().contains("request."), "{e}");
    assert_eq!(h.llm.request_count(), 13);
}

#[tokio::test]
async fn the_stages_chain_over_their_own_rpcs() {
    let h = harness(Script::default()).await;
    let mut client = h.client().await;
    let solved =
        client.solve(pb::SolveRequest { problem: PROBLEM.into(), solvers: Vec::new() }).await.unwrap().into_inner();
    assert_eq!(solved.solutions.len(), 3);
    let reviewed = client
        .review(pb::ReviewRequest { problem: PROBLEM.into(), solvers: Vec::new(), solutions: solved.solutions.clone() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reviewed.reviews.len(), 6);
    let refined = client
        .refine_solutions(pb::RefineSolutionsRequest {
            problem: PROBLEM.into(),
            solvers: Vec::new(),
            solutions: solved.solutions.clone(),
            reviews: reviewed.reviews.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(refined.refined.len(), 3);
    let judged = client
        .judge_debate(pb::JudgeDebateRequest {
            problem: PROBLEM.into(),
            solutions: solved.solutions,
            reviews: reviewed.reviews,
            refined: refined.refined,
            judge_model: Some(common::ModelSpec { temperature: Some(0.3), ..Default::default() }),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((judged.winner_solver_id.as_str(), judged.final_answer.as_str()), ("solver_1", "ref-x"));
    assert_eq!(judged.model.unwrap().temperature, Some(0.3));
    assert_eq!(h.llm.request_count(), 13);
}

#[tokio::test]
async fn an_unusable_solver_is_retried_once_then_fails_the_stage_naming_it() {
    let script = Script {
        bad_first: ["debate_solution:solver_1".to_string()].into(),
        always_bad: ["debate_solution:solver_2".to_string()].into(),
        ..Script::default()
    };
    let h = harness(script).await;
    let st = h.client().await.run_debate(debate(None, false)).await.unwrap_err();
    assert_eq!(st.code(), Code::Unavailable);
    assert!(st.message().contains("solver \"solver_2\" gave no usable solution after one retry"), "{}", st.message());
    assert!(h.requests("debate_review").is_empty());
    let solver_two = h.requests("debate_solution").into_iter().filter(|r| r.debate_speaker() == "solver_2").count();
    assert_eq!(solver_two, 2);

    // A solver that recovers on its retry carries on, and both calls count.
    let script = Script { bad_first: ["debate_solution:solver_1".to_string()].into(), ..Script::default() };
    let h = harness(script).await;
    let r = h.client().await.solve(pb::SolveRequest { problem: PROBLEM.into(), solvers: Vec::new() }).await.unwrap();
    let r = r.into_inner();
    assert_eq!(r.solutions[0].final_answer, "orig-one");
    assert_eq!(r.usage.unwrap().calls, 4);
}

#[tokio::test]
async fn given_solvers_keep_their_models_and_personas() {
    let h = harness(Script::default()).await;
    let solvers: Vec<pb::Solver> = IDS
        .iter()
        .enumerate()
        .map(|(i, id)| pb::Solver {
            id: id.to_string(),
            persona: format!("persona number {i}"),
            model: Some(common::ModelSpec {
                model: format!("model-{i}"),
                temperature: Some(0.1 * i as f64),
                ..Default::default()
            }),
        })
        .collect();
    let r = h
        .client()
        .await
        .run_debate(pb::RunDebateRequest { solvers, ..debate(None, false) })
        .await
        .unwrap()
        .into_inner();
    for stage_name in ["debate_solution", "debate_review", "debate_refinement"] {
        for q in h.requests(stage_name) {
            let i = index(&q.debate_speaker());
            assert_eq!(q.model(), Some(format!("model-{i}").as_str()), "{stage_name}");
            assert!(q.first_user_message().contains(&format!("persona number {i}")));
        }
    }
    assert_eq!(h.requests("debate_judgment")[0].model(), Some("debater"));
    assert_eq!(r.solutions[2].model.as_ref().unwrap().model, "model-2");
}

fn violation(st: &tonic::Status, field: &str) -> String {
    assert_eq!(st.code(), Code::InvalidArgument, "{field}: {st:?}");
    let bad = st.get_details_bad_request().expect("bad request details");
    bad.field_violations
        .iter()
        .find(|v| v.field == field)
        .unwrap_or_else(|| panic!("no violation of {field}: {bad:?}"))
        .description
        .clone()
}

#[tokio::test]
async fn bad_input_is_refused_naming_the_field_before_any_model_call() {
    let h = harness(Script::default()).await;
    let mut client = h.client().await;
    let two = vec![pb::Solver::default(), pb::Solver::default()];
    let cases: Vec<(pb::RunDebateRequest, &str, &str)> = vec![
        (pb::RunDebateRequest { solvers: two.clone(), ..debate(None, false) }, "solvers", "exactly 3"),
        (pb::RunDebateRequest { problem: "  ".into(), ..debate(None, false) }, "problem", "must not be empty"),
        (
            pb::RunDebateRequest { problem: "x".repeat(40_000), ..debate(None, false) },
            "problem",
            "the limit is 32768 bytes",
        ),
        (debate(Some(0), false), "rounds", "between 1 and 5"),
        (debate(Some(6), false), "rounds", "between 1 and 5"),
        (
            pb::RunDebateRequest {
                solvers: vec![
                    pb::Solver::default(),
                    pb::Solver {
                        model: Some(common::ModelSpec { backend: "nowhere".into(), ..Default::default() }),
                        ..Default::default()
                    },
                    pb::Solver::default(),
                ],
                ..debate(None, false)
            },
            "solvers[1].model.backend",
            "unknown chat backend",
        ),
        (
            pb::RunDebateRequest {
                judge_model: Some(common::ModelSpec { temperature: Some(5.0), ..Default::default() }),
                ..debate(None, false)
            },
            "judge_model.temperature",
            "between 0 and 2",
        ),
        (
            pb::RunDebateRequest {
                solvers: vec![
                    pb::Solver { id: "a".into(), ..Default::default() },
                    pb::Solver { id: "a".into(), ..Default::default() },
                    pb::Solver::default(),
                ],
                ..debate(None, false)
            },
            "solvers[1].id",
            "duplicate",
        ),
    ];
    for (request, field, text) in cases {
        let st = client.run_debate(request).await.unwrap_err();
        let description = violation(&st, field);
        assert!(description.contains(text), "{field}: {description}");
    }

    // The stream names fields under `request`.
    let st = client.run_debate_stream(pb::RunDebateStreamRequest { request: None }).await.unwrap_err();
    violation(&st, "request");
    let st = client
        .run_debate_stream(pb::RunDebateStreamRequest {
            request: Some(pb::RunDebateRequest { solvers: two.clone(), ..debate(None, false) }),
        })
        .await
        .unwrap_err();
    violation(&st, "request.solvers");
    let st = client.solve(pb::SolveRequest { problem: PROBLEM.into(), solvers: two }).await.unwrap_err();
    violation(&st, "solvers");

    // Refinement needs every solution and exactly the two reviews about each solver.
    let solution = |id: &str| pb::Solution {
        solver_id: id.into(),
        final_answer: "9".into(),
        confidence: 0.5,
        ..Default::default()
    };
    let review =
        |by: &str, of: &str| pb::Review { reviewer_id: by.into(), target_solver_id: of.into(), ..Default::default() };
    let all_reviews: Vec<pb::Review> =
        IDS.iter().flat_map(|a| IDS.iter().filter(move |b| *b != a).map(move |b| review(a, b))).collect();
    let refine = |solutions: Vec<pb::Solution>, reviews: Vec<pb::Review>| pb::RefineSolutionsRequest {
        problem: PROBLEM.into(),
        solvers: Vec::new(),
        solutions,
        reviews,
    };
    let st = client
        .refine_solutions(refine(vec![solution("solver_1"), solution("solver_2")], all_reviews.clone()))
        .await
        .unwrap_err();
    assert!(violation(&st, "solutions").contains("no solution of solver \"solver_3\""));
    let st = client.refine_solutions(refine(IDS.map(solution).to_vec(), all_reviews[..5].to_vec())).await.unwrap_err();
    let description = violation(&st, "reviews");
    assert!(
        description.contains("solver \"solver_2\"") && description.contains("missing the review by solver_3"),
        "{description}"
    );
    let st = client.refine_solutions(refine(IDS.map(solution).to_vec(), Vec::new())).await.unwrap_err();
    assert_eq!(st.code(), Code::FailedPrecondition);
    assert!(st.message().contains("reviews is empty: run Review (stage 2) first"), "{}", st.message());
    let st = client
        .review(pb::ReviewRequest { problem: PROBLEM.into(), solvers: Vec::new(), solutions: Vec::new() })
        .await
        .unwrap_err();
    assert_eq!(st.code(), Code::FailedPrecondition);
    assert!(st.message().contains("solutions"));
    let st = client
        .judge_debate(pb::JudgeDebateRequest {
            problem: PROBLEM.into(),
            solutions: IDS.map(solution).to_vec(),
            reviews: all_reviews,
            refined: Vec::new(),
            judge_model: None,
        })
        .await
        .unwrap_err();
    assert_eq!(st.code(), Code::FailedPrecondition);
    assert!(st.message().contains("refined is empty"), "{}", st.message());

    assert_eq!(h.llm.request_count(), 0, "no model call for bad input");
}

/// A model call that fails transiently after its client's retries (none here) is made again, up
/// to `CALL_RETRIES` times, before its stage fails: one call's bad luck does not lose the problem.
#[tokio::test]
async fn a_call_failing_transiently_is_made_again_and_the_debate_still_succeeds() {
    let flaky = |failures: usize| {
        let script = Script::default();
        let calls = Mutex::new(HashMap::new());
        let failed = Mutex::new(0usize);
        move |r: &RecordedRequest| {
            if r.schema_name() == "debate_review" && r.debate_speaker() == "solver_1" && review_target(r) == "solver_3"
            {
                let mut failed = failed.lock().unwrap();
                if *failed < failures {
                    *failed += 1;
                    return if *failed % 2 == 1 { Reply::status(503) } else { Reply::status(429) };
                }
            }
            answer(&script, r, &calls)
        }
    };
    let retries = assay_debate::core::CALL_RETRIES as usize;
    let h = harness(Script::default()).await;
    h.llm.set_handler(flaky(retries));
    let r = h.client().await.run_debate(debate(None, false)).await.unwrap().into_inner();
    assert_eq!(r.reviews.len(), 6);
    assert_eq!((r.final_answer.as_str(), r.winner_solver_id.as_str()), ("ref-x", "solver_1"));
    assert_eq!(h.requests("debate_review").len(), 6 + retries, "the failed review made again, each time");
    assert_eq!(h.llm.request_count(), 13 + retries);

    // One more failure than that fails the stage, naming the backend's error.
    let h = harness(Script::default()).await;
    h.llm.set_handler(flaky(retries + 1));
    let st = h.client().await.run_debate(debate(None, false)).await.unwrap_err();
    assert!(matches!(st.code(), Code::Unavailable | Code::ResourceExhausted), "{st:?}");
    assert!(h.requests("debate_refinement").is_empty());
}

// ---------------------------------------------------------------------------------------------
// A small context: a server that refuses a prompt over it, as llama.cpp's `llama-server` does.

/// Tokens the small-context server counts for a request: its messages at four characters a token.
fn server_tokens(r: &RecordedRequest) -> u64 {
    r.messages().iter().map(|(_, c)| c.chars().count() as u64).sum::<u64>() / 4
}

/// `n` model-written texts of about 230 characters, each naming `who` and its place.
fn long_texts(who: &str, what: &str, n: usize) -> Vec<String> {
    (1..=n).map(|i| format!("{what} {i} of {who}: {}", "the count of sheep left is what remains ".repeat(5))).collect()
}

/// The debate as the default script answers it, with long reasoning and reviews (ten steps, five
/// points a list), refusing with llama-server's 400 any prompt over `n_ctx` tokens.
fn small_context(n_ctx: u64) -> impl Fn(&RecordedRequest) -> Reply + Send + Sync + 'static {
    let script = Script::default();
    move |r: &RecordedRequest| {
        let tokens = server_tokens(r);
        if tokens > n_ctx {
            return Reply::status(400).body(
                json!({"error": {"code": 400, "message": "the request exceeds the available context size, try increasing it",
                                 "type": "exceed_context_size_error", "n_prompt_tokens": tokens, "n_ctx": n_ctx}})
                .to_string(),
            );
        }
        let who = r.debate_speaker();
        let reply = match r.schema_name() {
            "debate_solution" => {
                let i = index(&who);
                json!({"approach": format!("approach of {who}"), "reasoning_steps": long_texts(&who, "step", 10),
                       "final_answer": script.original[i], "confidence": script.original_confidence[i]})
            }
            "debate_review" => {
                let target = review_target(r);
                let mut strengths = long_texts(&who, "strength", 4);
                strengths.push(strength_marker(&who, &target));
                json!({"strengths": strengths, "weaknesses": long_texts(&who, "weakness", 5),
                       "errors": [{"location": "step 1", "error_type": "logic", "severity": "major",
                                   "description": format!("error-by-{who}-in-{target}")}],
                       "suggested_changes": long_texts(&who, "change", 5)})
            }
            "debate_refinement" => {
                let i = index(&who);
                json!({"critiques_accepted": long_texts(&who, "accepted", 5), "critiques_rejected": [],
                       "refinement_reasoning": "re-read the question", "reasoning_steps": long_texts(&who, "refined step", 10),
                       "final_answer": script.refined[i], "confidence": script.refined_confidence[i],
                       "changed_from_original": true, "improvement_explanation": "fixed the reading"})
            }
            "debate_judgment" => {
                json!({"reasoning": "solver_1 checks every condition", "winner": "solver_1", "confidence": 0.75})
            }
            other => panic!("unexpected stage {other}"),
        };
        Reply::json(reply).usage(tokens, 10)
    }
}

/// Whether a prompt has every final answer and the problem whole.
fn keeps_the_answers(prompt: &str, answers: &[&str]) -> bool {
    prompt.contains(PROBLEM) && answers.iter().all(|a| prompt.contains(a))
}

/// A server that says its context (llama-server's `/props`): every prompt is fitted to it before
/// it is sent (the judge's, 3 solutions, 6 reviews and 3 refinements of long text, more than twice
/// over it, is cut; the short ones are not), so none is refused, each leaves its reply room, and
/// the records say how far each prompt was cut.
#[tokio::test]
async fn a_debate_fits_its_prompts_to_the_context_the_server_reports() {
    const N_CTX: u64 = 4096;
    let h = harness(Script::default()).await;
    h.llm.set_props(json!({"total_slots": 1, "default_generation_settings": {"n_ctx": N_CTX}}));
    h.llm.set_handler(small_context(N_CTX));
    let r = h.client().await.run_debate(debate(None, false)).await.unwrap().into_inner();

    assert_eq!(h.llm.request_count(), 13, "one call each, none refused");
    for q in h.llm.requests() {
        let max_tokens = q.body["max_tokens"].as_u64().unwrap();
        assert!(server_tokens(&q) + max_tokens <= N_CTX, "{}: {} + {max_tokens}", q.schema_name(), server_tokens(&q));
    }
    // Unfitted, the judge's prompt is more than twice the context: it was cut, and still shows the
    // problem, every answer and every review's marker.
    let judge = &h.requests("debate_judgment")[0];
    let text = judge.first_user_message();
    assert!(keeps_the_answers(&text, &["orig-one", "orig-two", "orig-three", "ref-x", "ref-y"]), "{text}");
    assert!(text.contains('…'));
    for by in IDS {
        for of in IDS.iter().filter(|of| **of != by) {
            assert!(text.contains(&format!("error-by-{by}-in-{of}")), "the judge lost a review's error");
        }
    }
    let j = r.judgment.as_ref().unwrap();
    assert!(!j.majority_vote_fallback);
    let cut = j.model.as_ref().unwrap().prompt_cut_chars;
    assert!((40..230).contains(&cut), "judge cut at {cut}");
    assert!(r.solutions.iter().all(|s| s.model.as_ref().unwrap().prompt_cut_chars == 0), "the solve prompts fit whole");
    assert_eq!(r.final_answer, "ref-x");
}

/// A server that does not say its context until it refuses a prompt (as vLLM, OpenAI and
/// llama-server without `/props` do): the refusal's figures fit the prompt, and it is sent once
/// more; later prompts to that model are fitted before they are sent.
#[tokio::test]
async fn a_prompt_refused_for_the_context_is_fitted_by_the_refusals_figures_and_sent_again() {
    const N_CTX: u64 = 4096;
    let h = harness(Script::default()).await;
    h.llm.set_handler(small_context(N_CTX));
    let r = h.client().await.run_debate(debate(None, false)).await.unwrap().into_inner();

    let refused: Vec<RecordedRequest> = h.llm.requests().into_iter().filter(|q| server_tokens(q) > N_CTX).collect();
    assert!(!refused.is_empty(), "the judge's whole prompt is over the context");
    let judges = h.requests("debate_judgment");
    // The first judge prompt, sent whole, was refused; the context is known from then on, so
    // the next went fitted and was served.
    assert_eq!(judges.len(), 2, "refused once, then served");
    assert!(server_tokens(&judges[0]) > N_CTX && server_tokens(&judges[1]) <= N_CTX);
    assert!(keeps_the_answers(&judges[1].first_user_message(), &["ref-x", "ref-y", "orig-three"]));
    assert!(r.judgment.as_ref().unwrap().model.as_ref().unwrap().prompt_cut_chars > 0);
    assert!(!r.judgment.as_ref().unwrap().majority_vote_fallback);
    assert_eq!(h.llm.request_count(), 13 + refused.len());
    assert_eq!(r.usage.as_ref().unwrap().calls as usize, 13, "a refused prompt is no call served");
}

/// A context too small for a prompt however it is cut: the debate fails at once, before any model
/// call, naming the context and what to change.
#[tokio::test]
async fn a_context_too_small_for_any_cut_fails_naming_it_before_any_call() {
    let h = harness(Script::default()).await;
    h.llm.set_props(json!({"total_slots": 1, "default_generation_settings": {"n_ctx": 400}}));
    h.llm.set_handler(small_context(400));
    let st = h.client().await.run_debate(debate(None, false)).await.unwrap_err();
    assert_eq!(st.code(), Code::FailedPrecondition, "{st:?}");
    assert!(st.message().contains("400 tokens") && st.message().contains("--ctx-size"), "{}", st.message());
    assert_eq!(h.llm.request_count(), 0);
}
