//! The section judge panel (JudgeSections, JudgeSectionsStream) over real gRPC on port 0, against
//! the scripted OpenAI-compatible backend. Judges run concurrently, so the scripted backend answers
//! by looking at each request (its temperature or model), never by arrival order.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use assay_domain::judge::{JudgeEvent, SectionJudge};
use assay_llm::ModelHub;
use assay_llm::OpenAiConfig;
use assay_proto::common::v1 as pb;
use assay_proto::scorer::v1::judge_sections_stream_response::Event;
use assay_proto::scorer::v1::scorer_service_client::ScorerServiceClient;
use assay_proto::scorer::v1::{JudgeSectionsRequest, JudgeSectionsStreamRequest, PanelJudge};
use assay_rpc::remote::RemoteScorer;
use assay_scorer::ScorerCore;
use assay_testkit::{RecordedRequest, Reply, ScriptedLlm, TestServer};
use serde_json::{Value, json};
use tonic::Code;
use tonic::transport::Channel;
use tonic_types::StatusExt;

const CRITERIA: [&str; 6] = [
    "factual_accuracy",
    "learning_objective_alignment",
    "pedagogical_structure",
    "clarity_readability",
    "engagement_examples",
    "completeness",
];

struct Harness {
    llm: ScriptedLlm,
    server: TestServer,
}

impl Harness {
    async fn client(&self) -> ScorerServiceClient<Channel> {
        ScorerServiceClient::new(self.server.channel().await)
    }
}

async fn harness() -> Harness {
    let llm = ScriptedLlm::start().await;
    let mut cfg = OpenAiConfig::new(llm.base_url());
    cfg.default_model = "panel-model".into();
    cfg.base_backoff = Duration::from_millis(5);
    // Calls are counted one request each: no hedged duplicates of stragglers.
    cfg.adaptive_timeout.hedge_factor = 0.0;
    let hub = Arc::new(ModelHub::single_openai(cfg).unwrap());
    let server = TestServer::start(
        assay_scorer::routes(Arc::new(ScorerCore::new(hub, 8))),
        &[assay_proto::service_names::SCORER],
    )
    .await;
    Harness { llm, server }
}

fn section(id: &str, title: &str, content: &str) -> pb::Section {
    pb::Section { id: id.into(), index: 0, title: title.into(), content: content.into() }
}

fn document() -> JudgeSectionsRequest {
    JudgeSectionsRequest {
        sections: vec![
            section(
                "intro",
                "What a funnel is",
                "A sales funnel has four stages: awareness, interest, desire, action.",
            ),
            section("stages", "The stages", "Awareness comes last.\n\nAction is where people buy."),
        ],
        brief: Some(pb::Brief {
            objectives: vec!["Name the four funnel stages in order".into()],
            audience: "new marketers".into(),
            language: "en".into(),
            description: "A short lesson on sales funnels.".into(),
        }),
        criteria: Vec::new(),
        judges: Vec::new(),
        context: Vec::new(),
    }
}

/// A section at its place in the document.
fn at(index: u32, id: &str, title: &str, content: &str) -> pb::Section {
    pb::Section { index, ..section(id, title, content) }
}

/// Focused judging of the document's "stages" (index 1) with its neighbours as context.
fn focused() -> JudgeSectionsRequest {
    let mut r = document();
    r.sections = vec![at(1, "stages", "The stages", "Awareness comes last.\n\nAction is where people buy.")];
    r.context = vec![
        at(0, "intro", "What a funnel is", "A sales funnel has four stages: awareness, interest, desire, action."),
        at(2, "example", "An example", "A bakery posts photos online, offers a tasting, and sells a cake."),
    ];
    r
}

/// A well-formed reply: every default criterion at `score`, plus `issues`.
fn verdict(score: f64, issues: Value) -> Value {
    let scores: serde_json::Map<String, Value> = CRITERIA.iter().map(|c| (c.to_string(), json!(score))).collect();
    json!({"criterion_scores": scores, "issues": issues, "section_scores": []})
}

fn factual_issue(section: &str) -> Value {
    json!({"section_id": section, "criterion": "factual_accuracy", "severity": "critical",
           "description": "Awareness is the first stage, not the last.",
           "fix_instruction": "State that awareness comes first.", "location": "Awareness comes last."})
}

/// The request's temperature (sent as an f32 widened to f64, so rounded back here).
fn temperature(req: &RecordedRequest) -> f64 {
    let t = req.body["temperature"].as_f64().expect("every judge call sets a temperature");
    (t * 1e6).round() / 1e6
}

/// Which default judge (0, 1, 2) a request belongs to, by its temperature.
fn judge_index(req: &RecordedRequest) -> usize {
    (temperature(req) / 0.3).round() as usize
}

#[tokio::test]
async fn default_panel_runs_three_judges_at_their_temperatures() {
    let h = harness().await;
    h.llm.set_handler(|req| {
        let i = judge_index(req);
        let score = [0.9, 0.6, 0.3][i];
        Reply::json(verdict(score, json!([factual_issue("stages")]))).usage(100 + i as u64, 20)
    });
    let reply = h.client().await.judge_sections(document()).await.unwrap().into_inner();

    // Three calls, one per temperature, each with the schema and the whole document.
    let reqs = h.llm.requests();
    let mut temps: Vec<f64> = reqs.iter().map(temperature).collect();
    temps.sort_by(f64::total_cmp);
    assert_eq!(temps, vec![0.0, 0.3, 0.6]);
    for r in &reqs {
        assert_eq!(r.body["response_format"]["type"], "json_schema");
        let prompt = r.last_user_message().unwrap();
        assert!(prompt.contains("<section id=\"stages\" title=\"The stages\">\nAwareness comes last."), "{prompt}");
        assert!(prompt.contains("- Name the four funnel stages in order"), "{prompt}");
        assert!(prompt.contains("Audience: new marketers"), "{prompt}");
        assert!(prompt.contains("- factual_accuracy (priority 1): Facts"), "{prompt}");
    }

    assert_eq!((reply.succeeded, reply.failed), (3, 0));
    let ids: Vec<&str> = reply.results.iter().map(|r| r.judge_id.as_str()).collect();
    assert_eq!(ids, vec!["judge-1", "judge-2", "judge-3"]);
    for (i, r) in reply.results.iter().enumerate() {
        assert!(r.error.is_empty(), "{}", r.error);
        let v = r.verdict.as_ref().unwrap();
        assert_eq!(v.judge_id, r.judge_id);
        assert_eq!(v.model, "panel-model");
        assert_eq!(v.criterion_scores.len(), 6);
        assert!((v.overall_score - [0.9, 0.6, 0.3][i]).abs() < 1e-9);
        assert_eq!(v.issues.len(), 1);
        let issue = &v.issues[0];
        assert_eq!(issue.id, format!("judge-{}-1", i + 1));
        assert_eq!(issue.section_id, "stages");
        assert_eq!(issue.severity, pb::Severity::Critical as i32);
        assert_eq!(issue.context_window, "Awareness comes last.");
        assert_eq!(v.unknown_section_issues, 0);
        let record = r.model_record.as_ref().unwrap();
        assert_eq!(record.phase, "stage_6_judge");
        assert_eq!(record.model, "panel-model");
        assert_eq!(record.temperature, Some([0.0, 0.3, 0.6][i]));
        assert_eq!(record.prompt_template_sha256.len(), 64);
        assert_eq!(v.model_record.as_ref(), Some(record));
        let usage = r.usage.clone().unwrap();
        assert_eq!((usage.calls, usage.prompt_tokens, usage.completion_tokens), (1, 100 + i as u64, 20));
        assert_eq!(v.usage, r.usage);
    }
    let usage = reply.usage.unwrap();
    assert_eq!((usage.calls, usage.prompt_tokens, usage.completion_tokens), (3, 303, 60));
}

#[tokio::test]
async fn a_garbage_reply_fails_its_judge_and_the_others_stand() {
    let h = harness().await;
    h.llm.set_handler(|req| match judge_index(req) {
        1 => Reply::text("What a lovely lesson! I would give it top marks.").usage(90, 12),
        _ => Reply::json(verdict(0.8, json!([]))).usage(90, 12),
    });
    let reply = h.client().await.judge_sections(document()).await.unwrap().into_inner();
    assert_eq!((reply.succeeded, reply.failed), (2, 1));
    let bad = &reply.results[1];
    assert_eq!(bad.judge_id, "judge-2");
    assert!(bad.verdict.is_none());
    assert!(bad.error.contains("no JSON"), "{}", bad.error);
    assert_eq!(bad.usage.as_ref().unwrap().prompt_tokens, 90, "a failed judge still reports its usage");
    assert_eq!(bad.model_record.as_ref().unwrap().temperature, Some(0.3));
    for i in [0, 2] {
        assert!((reply.results[i].verdict.as_ref().unwrap().overall_score - 0.8).abs() < 1e-9);
    }
    assert_eq!(reply.usage.unwrap().calls, 3);
}

#[tokio::test]
async fn a_score_out_of_range_fails_that_judge_only() {
    let h = harness().await;
    h.llm.set_handler(|req| match judge_index(req) {
        2 => Reply::json(verdict(7.0, json!([]))),
        _ => Reply::json(verdict(0.5, json!([]))),
    });
    let reply = h.client().await.judge_sections(document()).await.unwrap().into_inner();
    assert_eq!((reply.succeeded, reply.failed), (2, 1));
    let bad = &reply.results[2];
    assert!(bad.verdict.is_none());
    assert!(bad.error.contains("outside [0, 1]"), "{}", bad.error);
    assert!(reply.results[0].verdict.is_some() && reply.results[1].verdict.is_some());
}

#[tokio::test]
async fn unknown_sections_are_kept_empty_and_counted_and_bad_severities_dropped() {
    let h = harness().await;
    // Two explicit judges on their own models; criteria given by the caller.
    h.llm.set_handler(|req| {
        let issues = json!([
            factual_issue("STAGES"),
            factual_issue("conclusion"),
            {"section_id": "intro", "criterion": "tone", "severity": "minor", "description": "Too dry.",
             "fix_instruction": "Add a question.", "location": "paragraph 1"},
            {"section_id": "intro", "criterion": "tone", "severity": "blocker", "description": "x",
             "fix_instruction": "y", "location": ""}
        ]);
        let scores = json!({"factual_accuracy": 0.4, "tone": 0.9});
        let _ = req;
        Reply::json(json!({"criterion_scores": scores, "issues": issues, "section_scores": [
            {"section_id": "intro", "criterion": "tone", "score": 0.95}
        ]}))
    });
    let mut req = document();
    req.criteria = vec![
        pb::Criterion { name: "factual_accuracy".into(), description: "Correct facts.".into(), priority: 1 },
        pb::Criterion { name: "tone".into(), description: "Friendly.".into(), priority: 2 },
    ];
    req.judges = vec![
        PanelJudge { id: "strict".into(), model: Some(pb::ModelSpec { model: "big".into(), ..Default::default() }) },
        PanelJudge { id: String::new(), model: Some(pb::ModelSpec { model: "small".into(), ..Default::default() }) },
    ];
    let reply = h.client().await.judge_sections(req).await.unwrap().into_inner();
    assert_eq!((reply.succeeded, reply.failed), (2, 0));
    let mut models: Vec<String> = h.llm.requests().iter().map(|r| r.model().unwrap().to_string()).collect();
    models.sort();
    assert_eq!(models, vec!["big", "small"]);
    let ids: Vec<&str> = reply.results.iter().map(|r| r.judge_id.as_str()).collect();
    assert_eq!(ids, vec!["strict", "judge-2"]);

    let r = &reply.results[0];
    let v = r.verdict.as_ref().unwrap();
    assert_eq!(v.model, "big");
    assert_eq!(r.model_record.as_ref().unwrap().temperature, Some(0.0), "unset temperature is recorded as used");
    assert!((v.overall_score - 0.65).abs() < 1e-9);
    let got: Vec<(&str, &str, &str)> =
        v.issues.iter().map(|i| (i.id.as_str(), i.section_id.as_str(), i.criterion.as_str())).collect();
    assert_eq!(
        got,
        vec![
            ("strict-1", "stages", "factual_accuracy"),
            ("strict-2", "", "factual_accuracy"),
            ("strict-3", "intro", "tone")
        ]
    );
    assert_eq!(v.unknown_section_issues, 1);
    assert_eq!(v.section_scores.len(), 1);
    assert!(r.error.contains("issue 4 has unknown severity \"blocker\""), "notes: {}", r.error);
    assert_eq!(reply.results[1].verdict.as_ref().unwrap().model, "small");
}

#[tokio::test]
async fn stream_emits_each_judge_as_it_finishes_then_the_result() {
    let h = harness().await;
    // judge-1 is the slowest, judge-3 the fastest.
    h.llm.set_handler(|req| {
        let i = judge_index(req);
        Reply::json(verdict(0.7, json!([]))).delay(Duration::from_millis([600, 300, 0][i]))
    });
    let mut stream = h
        .client()
        .await
        .judge_sections_stream(JudgeSectionsStreamRequest { request: Some(document()) })
        .await
        .unwrap()
        .into_inner();
    let mut finished = Vec::new();
    let mut result = None;
    while let Some(ev) = stream.message().await.unwrap() {
        match ev.event.unwrap() {
            Event::JudgeFinished(f) => {
                assert!(result.is_none(), "judge events come before the result");
                let r = f.result.unwrap();
                assert!(r.verdict.is_some());
                finished.push((f.index, r.judge_id));
            }
            Event::Result(r) => result = Some(r),
            Event::Progress(_) => {}
        }
    }
    assert_eq!(
        finished,
        vec![(2, "judge-3".to_string()), (1, "judge-2".to_string()), (0, "judge-1".to_string())],
        "in finishing order"
    );
    let r = result.expect("result event");
    assert_eq!((r.succeeded, r.failed, r.results.len()), (3, 0, 3));
    assert_eq!(r.results[0].judge_id, "judge-1", "the result keeps panel order");
}

#[tokio::test]
async fn all_judges_failing_is_still_an_answer() {
    let h = harness().await;
    h.llm.set_handler(|_| Reply::status(400));
    let reply = h.client().await.judge_sections(document()).await.unwrap().into_inner();
    assert_eq!((reply.succeeded, reply.failed), (0, 3));
    for r in &reply.results {
        assert!(r.verdict.is_none());
        assert!(r.error.starts_with("model call failed"), "{}", r.error);
        assert_eq!(r.model_record.as_ref().unwrap().phase, "stage_6_judge");
    }
}

#[tokio::test]
async fn bad_input_is_invalid_argument_naming_the_field_with_no_model_call() {
    let h = harness().await;
    let mut client = h.client().await;
    let with = |f: &dyn Fn(&mut JudgeSectionsRequest)| {
        let mut r = document();
        f(&mut r);
        r
    };
    let judge = |id: &str, spec: Option<pb::ModelSpec>| PanelJudge { id: id.into(), model: spec };
    let cases: Vec<(JudgeSectionsRequest, &str)> = vec![
        (with(&|r| r.sections.clear()), "sections"),
        (with(&|r| r.sections[1].id = "intro".into()), "sections[1].id"),
        (with(&|r| r.sections[0].id = " ".into()), "sections[0].id"),
        (with(&|r| r.sections[1].content = "  \n".into()), "sections[1].content"),
        (with(&|r| r.sections[0].content = "x".repeat(256 * 1024 + 1)), "sections"),
        (with(&|r| r.judges = vec![judge("", None); 10]), "judges"),
        (with(&|r| r.judges = vec![judge("a", None), judge("a", None)]), "judges[1].id"),
        (
            with(&|r| {
                r.judges = vec![
                    judge("a", None),
                    judge("b", Some(pb::ModelSpec { temperature: Some(2.5), ..Default::default() })),
                ]
            }),
            "judges[1].model.temperature",
        ),
        (
            with(&|r| {
                r.judges = vec![judge("a", Some(pb::ModelSpec { backend: "nope".into(), ..Default::default() }))]
            }),
            "judges[0].model.backend",
        ),
        (
            with(&|r| r.criteria = vec![pb::Criterion { name: String::new(), description: "d".into(), priority: 1 }]),
            "criteria[0].name",
        ),
        (
            with(&|r| {
                r.criteria = vec![
                    pb::Criterion { name: "a".into(), description: String::new(), priority: 1 },
                    pb::Criterion { name: "a".into(), description: String::new(), priority: 2 },
                ]
            }),
            "criteria[1].name",
        ),
        (
            with(&|r| r.criteria = vec![pb::Criterion { name: "a".into(), description: String::new(), priority: 0 }]),
            "criteria[0].priority",
        ),
        // Focused judging: a context section is never also a judged one; document order needs
        // distinct indexes; context entries follow the sections' rules.
        (
            with(&|r| {
                r.sections[1].index = 1;
                r.context = vec![at(2, "stages", "", "The stages again.")];
            }),
            "context[0].id",
        ),
        (
            with(&|r| {
                r.sections[1].index = 1;
                r.context = vec![at(1, "example", "", "A bakery.")];
            }),
            "context[0].index",
        ),
        (
            with(&|r| {
                r.sections[1].index = 1;
                r.context = vec![at(2, "example", "", " ")];
            }),
            "context[0].content",
        ),
    ];
    for (req, field) in cases {
        let status = client.judge_sections(req.clone()).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
        let bad = status.get_details_bad_request().expect("bad request details");
        assert!(bad.field_violations.iter().any(|v| v.field == field), "{field}: {:?}", bad.field_violations);

        // The stream form rejects it too: before streaming, or (for checks that need the
        // configuration, like the backend) as the stream's only message.
        let status = match client.judge_sections_stream(JudgeSectionsStreamRequest { request: Some(req) }).await {
            Err(status) => status,
            Ok(stream) => stream.into_inner().message().await.expect_err("an error, not an event"),
        };
        assert_eq!(status.code(), Code::InvalidArgument, "{field}: {status:?}");
        let bad = status.get_details_bad_request().expect("bad request details");
        let want = format!("request.{field}");
        assert!(bad.field_violations.iter().any(|v| v.field == want), "{want}: {:?}", bad.field_violations);
    }
    let status = client.judge_sections_stream(JudgeSectionsStreamRequest { request: None }).await.err().unwrap();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(h.llm.request_count(), 0, "bad input never reaches the backend");
}

#[tokio::test]
async fn focused_judging_quotes_context_read_only_and_drops_issues_on_it() {
    let h = harness().await;
    h.llm.set_handler(|_| {
        let section_scores: Vec<Value> =
            CRITERIA.iter().map(|c| json!({"section_id": "stages", "criterion": c, "score": 0.4})).collect();
        let mut reply = verdict(0.4, json!([factual_issue("stages"), factual_issue("intro")]));
        reply["section_scores"] = json!(section_scores);
        Reply::json(reply)
    });
    let reply = h.client().await.judge_sections(focused()).await.unwrap().into_inner();
    assert_eq!((reply.succeeded, reply.failed), (3, 0));
    for r in h.llm.requests() {
        let prompt = r.last_user_message().unwrap();
        assert!(prompt.contains("You see PART of a longer document"), "{prompt}");
        assert!(prompt.contains("<section id=\"stages\" title=\"The stages\">\nAwareness comes last."), "{prompt}");
        assert!(prompt.contains("<context id=\"intro\" title=\"What a funnel is\" shows=\"all\">"), "{prompt}");
        assert!(prompt.find("<context id=\"intro\"") < prompt.find("<section id=\"stages\""), "{prompt}");
        assert!(prompt.find("<section id=\"stages\"") < prompt.find("<context id=\"example\""), "{prompt}");
        let schema = &r.body["response_format"]["json_schema"]["schema"];
        assert_eq!(schema["properties"]["issues"]["items"]["properties"]["section_id"]["enum"], json!(["stages"]));
        assert_eq!(schema["properties"]["section_scores"]["minItems"], json!(6));
        let limit = r.body.get("max_tokens").or_else(|| r.body.get("max_completion_tokens")).unwrap();
        assert_eq!(limit, &json!(assay_scorer::core::judge::focused_max_tokens(1, 6)));
    }
    for r in &reply.results {
        let v = r.verdict.as_ref().unwrap();
        let on: Vec<&str> = v.issues.iter().map(|i| i.section_id.as_str()).collect();
        assert_eq!(on, vec!["stages"], "the issue on the context section is dropped");
        assert_eq!(v.unknown_section_issues, 0);
        assert_eq!(v.section_scores.len(), 6);
        assert!(r.error.contains("issue 2 names the context section \"intro\", which is read-only"), "{}", r.error);
        assert_eq!(
            r.model_record.as_ref().unwrap().prompt_template_sha256,
            assay_domain::template::template_sha256(assay_scorer::core::judge::FOCUSED_TEMPLATE)
        );
    }
}

#[tokio::test]
async fn remote_scorer_is_a_section_judge_relaying_progress() {
    let h = harness().await;
    h.llm.set_handler(|req| match judge_index(req) {
        0 => Reply::text("no idea").usage(0, 0),
        _ => Reply::json(verdict(0.5, json!([factual_issue("ghost")]))).usage(10, 5),
    });
    let remote: Arc<dyn SectionJudge> = Arc::new(RemoteScorer::new(h.server.channel().await, None));
    let request = assay_proto::convert::judge::judge_sections_request(document(), "").unwrap();
    let seen = Mutex::new(Vec::new());
    let sink = |e: JudgeEvent| match e {
        JudgeEvent::JudgeFinished { index, result } => seen.lock().unwrap().push((index, result.succeeded())),
    };
    let out = remote.judge_sections(request.clone(), &sink).await.unwrap();
    let mut seen = seen.into_inner().unwrap();
    seen.sort();
    assert_eq!(seen, vec![(0, false), (1, true), (2, true)]);
    assert_eq!((out.succeeded, out.failed), (2, 1));
    assert_eq!((out.usage.calls, out.usage.prompt_tokens), (3, 20));
    let v = out.results[1].verdict.as_ref().unwrap();
    assert_eq!(v.unknown_section_issues, 1);
    assert_eq!(v.issues[0].section_id, "");
    assert_eq!(v.model_record.as_ref().unwrap().phase, "stage_6_judge");
    assert!(!out.results[0].error.is_empty());

    // Field paths come back relative to the domain request.
    let mut bad = request;
    bad.sections.clear();
    let e = remote.judge_sections(bad, &assay_domain::no_events).await.unwrap_err();
    let assay_domain::StageError::InvalidArgument(v) = e else { panic!("expected invalid argument, got {e:?}") };
    assert!(v.iter().any(|f| f.field == "sections"), "{v:?}");
    assert_eq!(h.llm.request_count(), 3);

    // The context travels with the request: the judges get the focused prompt, and a context id
    // repeating a judged one comes back named.
    let focused = assay_proto::convert::judge::judge_sections_request(focused(), "").unwrap();
    remote.judge_sections(focused.clone(), &assay_domain::no_events).await.unwrap();
    let prompts: Vec<String> = h.llm.requests()[3..].iter().map(|r| r.last_user_message().unwrap()).collect();
    assert_eq!(prompts.len(), 3);
    assert!(prompts.iter().all(|p| p.contains("<context id=\"example\" title=\"An example\"")), "{prompts:?}");
    let mut clash = focused;
    clash.context[0].id = "stages".into();
    let e = remote.judge_sections(clash, &assay_domain::no_events).await.unwrap_err();
    let assay_domain::StageError::InvalidArgument(v) = e else { panic!("expected invalid argument, got {e:?}") };
    assert_eq!(v.iter().map(|f| f.field.as_str()).collect::<Vec<_>>(), vec!["context[0].id"], "{v:?}");
    assert_eq!(h.llm.request_count(), 6);
}

#[tokio::test]
async fn a_client_going_away_cancels_every_judge_call() {
    let h = harness().await;
    h.llm.set_handler(|_| Reply::hang());
    let stream = h
        .client()
        .await
        .judge_sections_stream(JudgeSectionsStreamRequest { request: Some(document()) })
        .await
        .unwrap()
        .into_inner();
    assert!(assay_testkit::eventually(Duration::from_secs(5), || h.llm.request_count() == 3).await);
    drop(stream);
    assert!(
        assay_testkit::eventually(Duration::from_secs(5), || h.llm.cancelled_count() == 3).await,
        "cancelled {} of 3",
        h.llm.cancelled_count()
    );
}
