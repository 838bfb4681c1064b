//! Consolidate, Route and Plan over real gRPC on port 0, against the scripted OpenAI-compatible
//! backend (embeddings for issue matching, chat for the synthesised instructions).

use std::sync::Arc;
use std::time::Duration;

use assay_domain::arbiter::Arbiter;
use assay_llm::ModelHub;
use assay_llm::OpenAiConfig;
use assay_proto::arbiter::v1::arbiter_service_client::ArbiterServiceClient;
use assay_proto::arbiter::v1::{
    AgreementLevel, ConsolidateRequest, ConsolidateResponse, FixAction, PlanRequest, RouteRequest,
};
use assay_proto::common::v1 as pb;
use assay_testkit::{RecordedRequest, Reply, ScriptedLlm, TestServer};
use serde_json::json;
use tonic::Code;
use tonic_types::StatusExt;

const CRITERIA: [&str; 6] = [
    "factual_accuracy",
    "learning_objective_alignment",
    "pedagogical_structure",
    "clarity_readability",
    "engagement_examples",
    "completeness",
];

/// Keyword embeddings: texts sharing the vocabulary's words point the same way.
fn keyword_vector(text: &str) -> Vec<f32> {
    const WORDS: [&str; 8] = ["funnel", "simplify", "jargon", "example", "date", "transition", "detail", "formula"];
    let t = text.to_lowercase();
    let mut v: Vec<f32> = WORDS.iter().map(|w| if t.contains(w) { 1.0 } else { 0.0 }).collect();
    v.push(0.05); // never a zero vector
    v
}

/// Embeddings by keyword; synthesis replies name the section they were asked about.
fn handler(request: &RecordedRequest) -> Reply {
    if request.is_embeddings() {
        return Reply::embeddings(request.embedding_inputs().iter().map(|t| keyword_vector(t)).collect());
    }
    let prompt = request.last_user_message().unwrap_or_default();
    let section = prompt
        .lines()
        .find_map(|l| l.strip_prefix("<section id=\""))
        .unwrap_or("?")
        .split('"')
        .next()
        .unwrap_or("?")
        .to_string();
    if prompt.contains("funnel") {
        return Reply::json(json!({
            "instruction": "Add more details about funnel stages using concise bullet points to maintain clarity"
        }));
    }
    Reply::json(json!({ "instruction": format!("Synthesised fix for {section}") }))
}

struct Harness {
    llm: ScriptedLlm,
    server: TestServer,
    hub: Arc<ModelHub>,
}

async fn harness() -> Harness {
    let llm = ScriptedLlm::start().await;
    llm.set_handler(handler);
    let mut cfg = OpenAiConfig::new(llm.base_url());
    cfg.default_model = "arbiter-model".into();
    cfg.base_backoff = Duration::from_millis(5);
    cfg.max_retries = 0;
    let hub = Arc::new(ModelHub::single_openai(cfg).unwrap());
    let server = TestServer::start(
        assay_arbiter::routes(Arc::new(assay_arbiter::ArbiterCore::new(hub.clone()))),
        &[assay_proto::service_names::ARBITER],
    )
    .await;
    Harness { llm, server, hub }
}

impl Harness {
    async fn client(&self) -> ArbiterServiceClient<tonic::transport::Channel> {
        ArbiterServiceClient::new(self.server.channel().await)
    }
}

fn sections(n: usize) -> Vec<pb::Section> {
    (1..=n)
        .map(|i| pb::Section {
            id: format!("s{i}"),
            index: i as u32,
            title: format!("Part {i}"),
            content: format!("Section {i} explains one idea in a few plain sentences. ").repeat(8),
        })
        .collect()
}

fn issue(section: &str, criterion: &str, severity: pb::Severity, text: &str) -> pb::JudgeIssue {
    pb::JudgeIssue {
        criterion: criterion.into(),
        severity: severity as i32,
        section_id: section.into(),
        description: text.into(),
        fix_instruction: text.into(),
        ..Default::default()
    }
}

fn verdict(judge: &str, scores: &[f64], issues: Vec<pb::JudgeIssue>) -> pb::JudgeVerdict {
    pb::JudgeVerdict {
        judge_id: judge.into(),
        criterion_scores: CRITERIA.iter().zip(scores).map(|(c, x)| (c.to_string(), *x)).collect(),
        overall_score: scores.iter().sum::<f64>() / scores.len() as f64,
        issues,
        ..Default::default()
    }
}

/// Three judges' scores whose interval alpha is 0.7355065752917207 per the `krippendorff`
/// package (moderate agreement).
const MODERATE: [[f64; 6]; 3] =
    [[0.85, 0.75, 0.65, 0.55, 0.45, 0.35], [0.99, 0.61, 0.79, 0.41, 0.59, 0.21], [0.71, 0.61, 0.79, 0.69, 0.31, 0.21]];
const AGREE: [[f64; 6]; 3] =
    [[0.9, 0.8, 0.7, 0.6, 0.5, 0.4], [0.9, 0.8, 0.7, 0.6, 0.5, 0.45], [0.85, 0.8, 0.7, 0.6, 0.5, 0.4]];
/// Opposite rankings: alpha -0.259 (low agreement).
const DISAGREE: [[f64; 6]; 3] =
    [[0.9, 0.8, 0.7, 0.6, 0.5, 0.4], [0.4, 0.5, 0.6, 0.7, 0.8, 0.9], [0.6, 0.9, 0.4, 0.8, 0.5, 0.7]];

fn consolidate(scores: [[f64; 6]; 3], issues: [Vec<pb::JudgeIssue>; 3]) -> ConsolidateRequest {
    let [a, b, c] = issues;
    ConsolidateRequest {
        verdicts: vec![verdict("a", &scores[0], a), verdict("b", &scores[1], b), verdict("c", &scores[2], c)],
        sections: sections(5),
        ..Default::default()
    }
}

fn ids(r: &ConsolidateResponse) -> Vec<(String, Vec<String>)> {
    r.issues.iter().map(|i| (i.description.clone(), i.raised_by.clone())).collect()
}

#[tokio::test]
async fn the_funnel_conflict_is_resolved_by_priority_and_synthesised_into_one_instruction() {
    let h = harness().await;
    let mut client = h.client().await;
    let reply = client
        .consolidate(consolidate(
            AGREE,
            [
                vec![issue("s2", "completeness", pb::Severity::Major, "Add more details about funnel stages")],
                vec![issue("s2", "clarity_readability", pb::Severity::Major, "Simplify the language")],
                vec![],
            ],
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.agreement(), AgreementLevel::High);
    assert!(reply.alpha.unwrap() > 0.8);
    assert_eq!(reply.conflicts.len(), 1);
    let c = &reply.conflicts[0];
    assert_eq!((c.winning_criterion.as_str(), c.losing_criterion.as_str()), ("clarity_readability", "completeness"));
    assert_eq!(c.constraint, "Add more details about funnel stages.");
    assert_eq!(reply.instructions.len(), 1);
    let i = &reply.instructions[0];
    assert!(i.synthesized, "{i:?}");
    assert_eq!(i.instruction, "Add more details about funnel stages using concise bullet points to maintain clarity");
    assert_eq!(i.constraints, vec!["Add more details about funnel stages."]);
    assert_eq!(i.primary_criterion, "clarity_readability");
    // The synthesis call saw both demands in priority order and the resolved conflict.
    let prompt = h.llm.requests().iter().find(|r| r.is_chat()).unwrap().last_user_message().unwrap();
    let (clarity, completeness) = (prompt.find("[clarity_readability").unwrap(), prompt.find("[completeness").unwrap());
    assert!(clarity < completeness, "{prompt}");
    assert!(prompt.contains("clarity_readability wins over completeness"), "{prompt}");
    let usage = reply.usage.unwrap();
    assert_eq!(usage.calls, 1, "one synthesis call, no embedding call (no issue pair to match)");
    assert_eq!(reply.model_record.unwrap().phase, "stage_6_arbiter");
}

#[tokio::test]
async fn issues_match_across_judges_by_section_criterion_and_meaning() {
    let h = harness().await;
    let mut client = h.client().await;
    let reply = client
        .consolidate(consolidate(
            AGREE,
            [
                vec![
                    issue("s1", "clarity_readability", pb::Severity::Minor, "Too much jargon in the intro"),
                    issue("s1", "engagement_examples", pb::Severity::Minor, "Add an example"),
                ],
                vec![
                    issue("s1", "clarity_readability", pb::Severity::Major, "The jargon confuses beginners"),
                    issue("s1", "clarity_readability", pb::Severity::Minor, "The transition to part 2 is abrupt"),
                ],
                vec![
                    issue("s1", "clarity_readability", pb::Severity::Minor, "Replace jargon with plain words"),
                    // Same words, other section: another problem.
                    issue("s3", "clarity_readability", pb::Severity::Minor, "Too much jargon"),
                ],
            ],
        ))
        .await
        .unwrap()
        .into_inner();
    let mut got = ids(&reply);
    got.sort();
    let s = |x: &str| x.to_string();
    assert_eq!(
        got,
        vec![
            (s("Add an example"), vec![s("a")]),
            (s("The jargon confuses beginners"), vec![s("a"), s("b"), s("c")]),
            (s("The transition to part 2 is abrupt"), vec![s("b")]),
            (s("Too much jargon"), vec![s("c")]),
        ]
    );
    assert_eq!(reply.issues_merged, 2);
    assert_eq!(reply.issues_dropped, 0);
    // One embedding call over the four clarity issues of s1 (only they can match across judges).
    let embeds: Vec<_> = h.llm.requests().into_iter().filter(|r| r.is_embeddings()).collect();
    assert_eq!(embeds.len(), 1);
    assert_eq!(embeds[0].embedding_inputs().len(), 4);
}

/// Issue 60: a backend whose model cannot embed (llama-cpp-python's 500 "must be created with
/// embedding=True", the same every time) does not fail the consolidation: the issues are matched
/// by their words, the response says so, the refusal is not retried and the backend is not asked
/// again. Before, the 500 was retried and the consolidation (and the refinement run) failed.
#[tokio::test]
async fn a_backend_that_cannot_embed_matches_issues_by_their_words_and_is_asked_once() {
    let llm = ScriptedLlm::start().await;
    llm.set_handler(|r| {
        if r.is_embeddings() {
            return Reply::status(500).body(
                r#"{"error":{"message":"Llama model must be created with embedding=True to call this method","type":"internal_server_error"}}"#,
            );
        }
        handler(r)
    });
    let mut cfg = OpenAiConfig::new(llm.base_url());
    cfg.default_model = "chat-only".into();
    cfg.base_backoff = Duration::from_millis(5);
    cfg.max_retries = 3;
    let hub = Arc::new(ModelHub::single_openai(cfg).unwrap());
    let server = TestServer::start(
        assay_arbiter::routes(Arc::new(assay_arbiter::ArbiterCore::new(hub))),
        &[assay_proto::service_names::ARBITER],
    )
    .await;
    let mut client = ArbiterServiceClient::new(server.channel().await);
    let request = consolidate(
        AGREE,
        [
            vec![issue("s1", "clarity_readability", pb::Severity::Minor, "Too much jargon in the intro")],
            vec![issue("s1", "clarity_readability", pb::Severity::Major, "The intro uses too much jargon")],
            vec![
                issue("s1", "clarity_readability", pb::Severity::Minor, "The transition to part 2 is abrupt"),
                // No section named: it would be placed by embedding; without embeddings it stays
                // unassigned, and says why.
                issue("", "completeness", pb::Severity::Minor, "The lesson never defines a funnel"),
            ],
        ],
    );
    let embedding_calls = || llm.requests().iter().filter(|r| r.is_embeddings()).count();
    for round in 0..2 {
        let reply = client.consolidate(request.clone()).await.expect("no failure for want of embeddings").into_inner();
        let mut got = ids(&reply);
        got.sort();
        let s = |x: &str| x.to_string();
        assert_eq!(
            got,
            vec![
                (s("The intro uses too much jargon"), vec![s("a"), s("b")]),
                (s("The lesson never defines a funnel"), vec![s("c")]),
                (s("The transition to part 2 is abrupt"), vec![s("c")]),
            ],
            "round {round}"
        );
        assert_eq!(reply.localizations.len(), 1);
        let l = &reply.localizations[0];
        assert!(l.section_ids.is_empty() && l.reason.starts_with("not placed: embeddings unavailable"), "{l:?}");
        assert_eq!(reply.unassigned_issues, 1);
        assert!(
            reply.similarity_degraded.starts_with("issues matched by their words")
                && reply.similarity_degraded.contains("embedding=True"),
            "{}",
            reply.similarity_degraded
        );
        assert_eq!(embedding_calls(), 1, "round {round}: asked once, not retried, not asked again");
    }
}

/// An embedding backend the request names that does not exist is refused, naming the field, even
/// when no issue pair needs an embedding (working without embeddings is for a backend that cannot
/// embed, not for a wrong request).
#[tokio::test]
async fn an_unknown_embedding_backend_is_refused_even_with_nothing_to_match() {
    let h = harness().await;
    let mut client = h.client().await;
    let mut request =
        consolidate(AGREE, [vec![issue("s1", "clarity_readability", pb::Severity::Minor, "Jargon")], vec![], vec![]]);
    request.embedding_model = Some(pb::ModelSpec { backend: "nope".into(), ..Default::default() });
    let status = client.consolidate(request).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let fields: Vec<String> = status
        .get_details_bad_request()
        .map(|b| b.field_violations.into_iter().map(|v| v.field).collect())
        .unwrap_or_default();
    assert!(fields.iter().any(|f| f.ends_with("embedding_model.backend")), "{fields:?}");
}

#[tokio::test]
async fn moderate_agreement_keeps_issues_raised_by_two_judges() {
    let h = harness().await;
    let mut client = h.client().await;
    let reply = client
        .consolidate(consolidate(
            MODERATE,
            [
                vec![issue("s2", "factual_accuracy", pb::Severity::Critical, "Wrong date for the treaty")],
                vec![issue("s2", "factual_accuracy", pb::Severity::Major, "The treaty date is wrong")],
                vec![issue("s4", "engagement_examples", pb::Severity::Critical, "Add an example")],
            ],
        ))
        .await
        .unwrap()
        .into_inner();
    assert!((reply.alpha.unwrap() - 0.735_506_575_291_720_7).abs() < 1e-9, "{:?}", reply.alpha);
    assert_eq!(reply.agreement(), AgreementLevel::Moderate);
    assert!(!reply.flagged_for_review);
    assert_eq!(ids(&reply), vec![("Wrong date for the treaty".to_string(), vec!["a".to_string(), "b".to_string()])]);
    assert_eq!(reply.issues_dropped, 1);
}

#[tokio::test]
async fn low_agreement_keeps_critical_issues_only_and_flags_the_plan() {
    let h = harness().await;
    let mut client = h.client().await;
    let reply = client
        .consolidate(consolidate(
            DISAGREE,
            [
                vec![issue("s2", "clarity_readability", pb::Severity::Major, "Simplify the language")],
                vec![issue("s2", "clarity_readability", pb::Severity::Major, "Simplify the wording")],
                vec![issue("s4", "factual_accuracy", pb::Severity::Critical, "The formula is wrong")],
            ],
        ))
        .await
        .unwrap()
        .into_inner();
    assert!(reply.alpha.unwrap() < 0.67);
    assert_eq!(reply.agreement(), AgreementLevel::Low);
    assert!(reply.flagged_for_review);
    assert_eq!(ids(&reply), vec![("The formula is wrong".to_string(), vec!["c".to_string()])]);
    assert_eq!(reply.issues_dropped, 1, "the two clarity issues are one problem, dropped once");
    assert_eq!(reply.criterion_scores.len(), 6);
    assert!((reply.criterion_scores["factual_accuracy"] - (0.9 + 0.4 + 0.6) / 3.0).abs() < 1e-12);
}

#[tokio::test]
async fn a_failed_or_empty_synthesis_keeps_the_judges_instructions_and_says_why() {
    let h = harness().await;
    h.llm.set_handler(|r: &RecordedRequest| {
        if r.is_embeddings() {
            Reply::embeddings(r.embedding_inputs().iter().map(|t| keyword_vector(t)).collect())
        } else if r.last_user_message().unwrap_or_default().contains("<section id=\"s1\"") {
            Reply::status(500)
        } else {
            Reply::json(json!({ "instruction": "  " }))
        }
    });
    let mut client = h.client().await;
    let reply = client
        .consolidate(consolidate(
            AGREE,
            [
                vec![issue("s1", "clarity_readability", pb::Severity::Minor, "Simplify the intro")],
                vec![issue("s3", "engagement_examples", pb::Severity::Minor, "Add an example")],
                vec![],
            ],
        ))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(reply.instructions.len(), 2);
    for i in &reply.instructions {
        assert!(!i.synthesized);
        assert!(!i.error.is_empty());
    }
    assert_eq!(reply.instructions[0].instruction, "Simplify the intro.");
    assert!(reply.instructions[0].error.contains("synthesis call failed"), "{}", reply.instructions[0].error);
    assert!(reply.instructions[1].error.contains("no instruction"), "{}", reply.instructions[1].error);
}

#[tokio::test]
async fn plan_batches_tasks_skips_locked_sections_and_estimates_tokens() {
    let h = harness().await;
    let mut client = h.client().await;
    let request = PlanRequest {
        verdicts: vec![
            verdict(
                "a",
                &AGREE[0],
                vec![
                    issue("s1", "factual_accuracy", pb::Severity::Critical, "Wrong date"),
                    issue("s3", "clarity_readability", pb::Severity::Minor, "Simplify"),
                    issue("s6", "engagement_examples", pb::Severity::Minor, "Add an example"),
                    issue("s8", "clarity_readability", pb::Severity::Minor, "Shorter sentences"),
                ],
            ),
            verdict("b", &AGREE[1], vec![issue("s5", "clarity_readability", pb::Severity::Minor, "Jargon")]),
            verdict("c", &AGREE[2], vec![]),
        ],
        sections: sections(8),
        locked_section_ids: vec!["s8".into()],
        ..Default::default()
    };
    let plan = client.plan(request).await.unwrap().into_inner();
    let routing = plan.routing.unwrap();
    assert!(!routing.full_regenerate);
    assert_eq!(routing.skipped_locked_section_ids, vec!["s8"]);
    let tasks: Vec<(&str, FixAction, bool)> =
        routing.tasks.iter().map(|t| (t.section_id.as_str(), t.action(), t.consistency_check)).collect();
    assert_eq!(
        tasks,
        vec![
            ("s1", FixAction::RegenerateSection, false),
            ("s2", FixAction::SurgicalEdit, true),
            ("s3", FixAction::SurgicalEdit, false),
            ("s5", FixAction::SurgicalEdit, false),
            ("s6", FixAction::SurgicalEdit, false),
        ]
    );
    // Instructions come from the synthesis (consistency checks have their own).
    let s3 = routing.tasks.iter().find(|t| t.section_id == "s3").unwrap();
    assert_eq!(s3.instruction, "Synthesised fix for s3");
    assert_eq!((s3.previous_section_id.as_str(), s3.next_section_id.as_str()), ("s2", "s4"));
    let batches: Vec<Vec<&str>> =
        plan.batches.iter().map(|b| b.tasks.iter().map(|t| t.section_id.as_str()).collect()).collect();
    // The expander alone first; s2's check (with the regeneration's priority) right after it;
    // non-adjacent patches together (at most 3), adjacent ones apart.
    assert_eq!(batches, vec![vec!["s1"], vec!["s2", "s5"], vec!["s3", "s6"]]);
    let total: u64 = routing.tasks.iter().map(|t| u64::from(t.estimated_tokens)).sum();
    assert!(total > 0);
    assert_eq!(plan.estimated_tokens, total);
    assert_eq!(plan.batches.iter().map(|b| u64::from(b.estimated_tokens)).sum::<u64>(), total);
    // One synthesis call per section task with issues (the consistency check needs none).
    let chats = h.llm.requests().iter().filter(|r| r.is_chat()).count();
    assert_eq!(chats, 4);
}

#[tokio::test]
async fn route_regenerates_everything_on_low_structure_or_many_critical_sections() {
    let h = harness().await;
    let mut client = h.client().await;
    let mut scores = std::collections::HashMap::new();
    scores.insert("pedagogical_structure".to_string(), 0.55);
    let r = client
        .route(RouteRequest {
            issues: vec![issue("s1", "clarity_readability", pb::Severity::Minor, "x")],
            sections: sections(5),
            criterion_scores: scores,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(r.full_regenerate && r.tasks.is_empty());
    let critical: Vec<_> =
        ["s1", "s2", "s4"].iter().map(|s| issue(s, "engagement_examples", pb::Severity::Critical, "x")).collect();
    let r = client
        .route(RouteRequest { issues: critical, sections: sections(5), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert!(r.full_regenerate, "{r:?}");
    assert!((r.critical_section_ratio - 0.6).abs() < 1e-12);
    assert_eq!(h.llm.request_count(), 0, "routing calls no model");
}

fn violations(status: &tonic::Status) -> Vec<String> {
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    status
        .get_details_bad_request()
        .map(|b| b.field_violations.into_iter().map(|v| v.field).collect())
        .unwrap_or_default()
}

#[tokio::test]
async fn bad_input_names_the_field_and_calls_no_model() {
    let h = harness().await;
    let mut client = h.client().await;
    let good =
        || consolidate(AGREE, [vec![issue("s1", "clarity_readability", pb::Severity::Minor, "x")], vec![], vec![]]);
    let cases: Vec<(ConsolidateRequest, &str)> = vec![
        (ConsolidateRequest { verdicts: vec![], ..good() }, "verdicts"),
        (ConsolidateRequest { sections: vec![], ..good() }, "sections"),
        (
            {
                let mut r = good();
                r.sections[1].id = "s1".into();
                r
            },
            "sections[1].id",
        ),
        (
            {
                let mut r = good();
                r.verdicts[1].judge_id = "a".into();
                r
            },
            "verdicts[1].judge_id",
        ),
        (
            {
                let mut r = good();
                r.verdicts[2].criterion_scores.insert("completeness".into(), 1.5);
                r
            },
            "verdicts[2].criterion_scores[\"completeness\"]",
        ),
        (
            {
                let mut r = good();
                r.verdicts[0].issues[0].severity = 9;
                r
            },
            "verdicts[0].issues[0].severity",
        ),
        (
            {
                let mut r = good();
                r.verdicts[0].issues[0].severity = 0;
                r
            },
            "verdicts[0].issues[0].severity",
        ),
        (ConsolidateRequest { level: 7, ..good() }, "level"),
        (ConsolidateRequest { match_threshold: Some(1.2), ..good() }, "match_threshold"),
    ];
    for (request, field) in cases {
        let status = client.consolidate(request).await.unwrap_err();
        let fields = violations(&status);
        assert!(fields.iter().any(|f| f == field), "{field} not in {fields:?}");
    }
    let status = client
        .plan(PlanRequest {
            verdicts: good().verdicts,
            sections: sections(3),
            max_parallel_patchers: Some(4),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(violations(&status), vec!["max_parallel_patchers"]);
    let status = client
        .consolidate(ConsolidateRequest {
            model: Some(pb::ModelSpec { backend: "nope".into(), ..Default::default() }),
            ..good()
        })
        .await
        .unwrap_err();
    assert_eq!(violations(&status), vec!["model.backend"]);
    assert_eq!(h.llm.request_count(), 0);
}

#[tokio::test]
async fn the_remote_client_plans_through_the_service() {
    let h = harness().await;
    let remote = assay_rpc::remote::RemoteArbiter::new(h.server.channel().await, None);
    let request = assay_proto::convert::arbiter::plan_request(PlanRequest {
        verdicts: consolidate(
            AGREE,
            [vec![issue("s2", "clarity_readability", pb::Severity::Minor, "Simplify")], vec![], vec![]],
        )
        .verdicts,
        sections: sections(3),
        ..Default::default()
    })
    .unwrap();
    let remote_plan = remote.plan(request.clone()).await.unwrap();
    let local_plan = assay_arbiter::ArbiterCore::new(h.hub.clone()).plan(request).await.unwrap();
    assert_eq!(remote_plan.batches, local_plan.batches);
    assert_eq!(remote_plan.routing, local_plan.routing);
    assert_eq!(remote_plan.consolidation.instructions, local_plan.consolidation.instructions);
    assert_eq!(remote_plan.consolidation.issues, local_plan.consolidation.issues);
    assert_eq!(remote_plan.batches[0].tasks[0].instruction, "Synthesised fix for s2");
}
