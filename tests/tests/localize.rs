//! Issues that name no section are localized and routed (issue 31, point 3): the arbiter's Plan
//! RPC on the running mesh, against the scripted backend whose embeddings place an issue in the
//! sections sharing its distinctive word.

use std::collections::HashMap;

use assay_proto::arbiter::v1::arbiter_service_client::ArbiterServiceClient;
use assay_proto::arbiter::v1::{FixAction, PlanRequest, PlanResponse};
use assay_proto::common::v1 as pb;
use assay_proto::gateway::v1 as gw;
use assay_testkit::{RecordedRequest, Reply};
use assay_tests::MeshSandbox;
use serde_json::{Value, json};

const LESSON: &str = include_str!("../fixtures/lesson_compound_interest.json");

fn lesson() -> (pb::Brief, Vec<pb::Section>) {
    assay_tests::lesson_fixture(LESSON)
}

/// Words the scripted embedding model knows: a text points along the words it holds, a text
/// holding none along a dimension of its own, so only texts sharing a word are similar.
const WORDS: [&str; 3] = ["triple", "staking", "schedules"];

fn keyword_vector(text: &str) -> Vec<f32> {
    let t = text.to_lowercase();
    let mut v: Vec<f32> = WORDS.iter().map(|w| if t.contains(w) { 1.0 } else { 0.0 }).collect();
    v.push(if v.iter().all(|x| *x == 0.0) { 1.0 } else { 0.0 });
    v
}

fn handler(request: &RecordedRequest) -> Reply {
    if request.is_embeddings() {
        let inputs = request.embedding_inputs();
        let tokens = inputs.iter().map(|t| t.len() as u64 / 4).sum();
        return Reply::embeddings(inputs.iter().map(|t| keyword_vector(t)).collect()).usage(tokens, 0);
    }
    let prompt = request.last_user_message().unwrap_or_default();
    match request.schema_name() {
        "section_instruction" => {
            let section = prompt.split("<section id=\"").nth(1).and_then(|r| r.split('"').next()).unwrap_or("?");
            Reply::json(json!({ "instruction": format!("Fix what the judges raised in {section}.") })).usage(900, 30)
        }
        other => Reply::status(500).body(format!("unexpected call {other:?}")),
    }
}

const CRITERIA: [&str; 6] = [
    "factual_accuracy",
    "learning_objective_alignment",
    "pedagogical_structure",
    "clarity_readability",
    "engagement_examples",
    "completeness",
];

fn verdict(judge: &str, shift: f64, issues: Vec<pb::JudgeIssue>) -> pb::JudgeVerdict {
    let scores = [0.55, 0.8, 0.75, 0.7, 0.65, 0.8];
    pb::JudgeVerdict {
        judge_id: judge.into(),
        criterion_scores: CRITERIA.iter().zip(scores).map(|(c, x)| (c.to_string(), x + shift)).collect(),
        overall_score: 0.7,
        issues,
        ..Default::default()
    }
}

fn document_level(id: &str, criterion: &str, severity: pb::Severity, description: &str) -> pb::JudgeIssue {
    pb::JudgeIssue {
        id: id.into(),
        criterion: criterion.into(),
        severity: severity as i32,
        section_id: String::new(),
        description: description.into(),
        fix_instruction: "Correct it where the lesson says it.".into(),
        ..Default::default()
    }
}

const TRIPLE: &str = "The compound interest rule of thumb says 'triple': the Rule of 72 estimates doubling time.";

async fn plan(sandbox: &MeshSandbox, issues: Vec<pb::JudgeIssue>) -> PlanResponse {
    let (brief, sections) = lesson();
    let mut client = ArbiterServiceClient::new(sandbox.channel(sandbox.mesh().addrs.arbiter).await);
    client
        .plan(PlanRequest {
            verdicts: vec![verdict("a", 0.0, issues), verdict("b", 0.01, vec![]), verdict("c", -0.01, vec![])],
            sections,
            brief: Some(brief),
            ..Default::default()
        })
        .await
        .expect("plan")
        .into_inner()
}

#[tokio::test]
async fn a_document_level_critical_issue_is_localized_and_routed() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(handler);
    let plan = plan(&sandbox, vec![document_level("a-1", "factual_accuracy", pb::Severity::Critical, TRIPLE)]).await;
    let consolidation = plan.consolidation.unwrap();
    let routing = plan.routing.unwrap();
    assert!(routing.unassigned_issue_ids.is_empty(), "{routing:#?}");
    assert_eq!(consolidation.unassigned_issues, 0);
    // Placed in the one section that says "triple", keeping its id.
    let issue = consolidation.issues.iter().find(|i| i.id == "a-1").expect("the issue is kept");
    assert_eq!(issue.section_id, "rule72");
    let located = &consolidation.localizations;
    assert_eq!(located.len(), 1, "{located:?}");
    assert_eq!(
        (located[0].issue_id.as_str(), located[0].section_ids.clone(), located[0].issue_ids.clone()),
        ("a-1", vec!["rule72".to_string()], vec!["a-1".to_string()])
    );
    assert_eq!(located[0].method, "embedding");
    // Routed like any other critical factual issue: its section is regenerated, the next one
    // checked for consistency.
    let task = routing.tasks.iter().find(|t| t.section_id == "rule72").expect("a task for rule72");
    assert_eq!(task.action(), FixAction::RegenerateSection);
    assert_eq!(task.issue_ids, vec!["a-1"]);
    assert_eq!(task.instruction, "Fix what the judges raised in rule72.");
    assert!(routing.tasks.iter().any(|t| t.section_id == "apy" && t.consistency_check && t.issue_ids.is_empty()));
    assert_eq!(routing.tasks.len(), 2, "{routing:#?}");
    // One embedding call placed it: the issue and every section's passages; its usage lands in
    // the consolidation's usage.
    let requests = sandbox.llm.requests();
    let embeddings: Vec<&RecordedRequest> = requests.iter().filter(|r| r.is_embeddings()).collect();
    assert_eq!(embeddings.len(), 1);
    let inputs = embeddings[0].embedding_inputs();
    assert!(inputs[0].contains("'triple'"), "{:?}", inputs[0]);
    let (_, sections) = lesson();
    for s in &sections {
        let first = s.content.split("\n\n").map(str::trim).find(|p| !p.is_empty()).unwrap();
        assert!(inputs.iter().any(|i| i.contains(first)), "{} is compared", s.id);
    }
    let usage = consolidation.usage.unwrap();
    let embedded: u64 = inputs.iter().map(|t| t.len() as u64 / 4).sum();
    assert!(usage.prompt_tokens >= embedded + 900, "{usage:?}");
    sandbox.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_issue_the_localizer_cannot_place_stays_unassigned_and_one_in_two_sections_is_copied() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(handler);
    let plan = plan(
        &sandbox,
        vec![
            document_level("a-1", "factual_accuracy", pb::Severity::Critical, TRIPLE),
            document_level(
                "a-2",
                "completeness",
                pb::Severity::Critical,
                "The lesson never says how 'staking' rewards on crypto savings compound.",
            ),
            document_level(
                "a-3",
                "clarity_readability",
                pb::Severity::Minor,
                "The word 'schedules' is used for compounding intervals without saying so.",
            ),
        ],
    )
    .await;
    let consolidation = plan.consolidation.unwrap();
    let routing = plan.routing.unwrap();
    // No section holds anything like the staking issue: it stays unassigned, reported as such.
    assert_eq!(routing.unassigned_issue_ids, vec!["a-2"]);
    assert_eq!(consolidation.unassigned_issues, 1);
    let by_id: HashMap<&str, _> = consolidation.localizations.iter().map(|l| (l.issue_id.as_str(), l)).collect();
    assert!(by_id["a-2"].section_ids.is_empty() && by_id["a-2"].issue_ids.is_empty());
    assert!(by_id["a-2"].reason.contains("no section is similar enough"), "{:?}", by_id["a-2"]);
    let staking = consolidation.issues.iter().find(|i| i.id == "a-2").unwrap();
    assert_eq!(staking.section_id, "");
    // "schedules" is in two sections: one traceable copy per section, each routed.
    assert_eq!(by_id["a-3"].section_ids, vec!["intro", "apy"]);
    assert_eq!(by_id["a-3"].issue_ids, vec!["a-3@intro", "a-3@apy"]);
    for (copy, section) in [("a-3@intro", "intro"), ("a-3@apy", "apy")] {
        let issue = consolidation.issues.iter().find(|i| i.id == copy).expect("the copy is kept");
        assert_eq!(issue.section_id, section);
        let task = routing.tasks.iter().find(|t| t.section_id == section).expect("a task");
        assert!(task.issue_ids.contains(&copy.to_string()), "{task:?}");
    }
    assert!(!consolidation.issues.iter().any(|i| i.id == "a-3"), "the original is replaced by its copies");
    assert!(routing.tasks.iter().any(|t| t.section_id == "rule72" && t.issue_ids == vec!["a-1"]));
    sandbox.shutdown().await.unwrap();
}

/// The text between `start` and the next `end` after it.
fn between<'a>(text: &'a str, start: &str, end: &str) -> Option<&'a str> {
    let from = text.find(start)? + start.len();
    let to = text[from..].find(end)? + from;
    Some(&text[from..to])
}

/// The whole pipeline's scripted backend: judges find the planted "triple" wherever it is and
/// report it without a section; the section expander writes "double" instead; the verifier
/// answers YES when the text after the edit no longer says "triple"; every other yes/no check
/// answers YES.
fn pipeline_handler(request: &RecordedRequest) -> Reply {
    let prompt = request.last_user_message().unwrap_or_default();
    let yes = |ok: bool| {
        if ok {
            Reply::with_logprobs("YES", vec![("YES", -0.02), ("NO", -4.5)])
        } else {
            Reply::with_logprobs("NO", vec![("NO", -0.02), ("YES", -4.5)])
        }
    };
    if request.is_embeddings() || request.schema_name() == "section_instruction" {
        return handler(request);
    }
    if request.schema_name() == "section_verdict" {
        let wrong = prompt.contains("triple");
        let factual = if wrong { 0.3 } else { 0.95 };
        let issues = if wrong {
            vec![json!({
                "section_id": "", "criterion": "factual_accuracy", "severity": "critical",
                "description": TRIPLE, "fix_instruction": "Say that the Rule of 72 estimates doubling time.",
                "location": ""
            })]
        } else {
            vec![]
        };
        let scores: serde_json::Map<String, Value> = CRITERIA
            .iter()
            .map(|c| (c.to_string(), json!(if *c == "factual_accuracy" { factual } else { 0.95 })))
            .collect();
        return Reply::json(json!({"criterion_scores": scores, "issues": issues, "section_scores": []}));
    }
    if prompt.starts_with("You are a writer.") {
        let content =
            between(&prompt, "The current section (rewrite it):\n<section title=\"", "\n</section>\n\nIssues")
                .and_then(|s| s.split_once("\">\n"))
                .map(|(_, c)| c.replace("triple", "double"))
                .unwrap_or_default();
        return Reply::text(format!("<section>\n{content}\n</section>"));
    }
    if prompt.starts_with("You are a careful editor.") {
        let content = between(&prompt, "The section to fix:\n<section title=\"", "\n</section>\n\nIssues")
            .and_then(|s| s.split_once("\">\n"))
            .map(|(_, c)| c.to_string())
            .unwrap_or_default();
        return Reply::text(format!("<section>\n{content}\n</section>"));
    }
    if let Some(after) = between(&prompt, "<section version=\"after\">\n", "\n</section>") {
        return yes(!after.contains("triple"));
    }
    yes(true)
}

/// Targeted refinement through the gateway with the verdicts given in the request (no first
/// judging): their document-level critical issue is localized, fixed and verified.
#[tokio::test]
async fn targeted_refinement_fixes_a_document_level_critical_issue() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(pipeline_handler);
    let (brief, sections) = lesson();
    let given = |judge: &str| {
        let mut v = verdict(judge, 0.0, vec![document_level("", "factual_accuracy", pb::Severity::Critical, TRIPLE)]);
        v.criterion_scores.insert("factual_accuracy".into(), 0.3);
        v
    };
    let pipeline = gw::TargetedRefinementPipeline {
        sections: sections.clone(),
        brief: Some(brief),
        verdicts: vec![given("reviewer-a"), given("reviewer-b")],
        mode: gw::RefinementMode::FullAuto as i32,
        ..Default::default()
    };
    let events = sandbox.run_pipeline(gw::run_pipeline_request::Pipeline::TargetedRefinement(pipeline)).await;
    let result = refinement_result(&events).unwrap_or_else(|| panic!("the run completes: {events:#?}"));
    // The refinement events, shortened, for failure messages.
    let trace: Vec<String> = events
        .iter()
        .filter_map(|e| match &e.event {
            Some(gw::run_event::Event::Refinement(r)) => {
                r.event.as_ref().map(|x| format!("{x:?}").chars().take(160).collect())
            }
            _ => None,
        })
        .collect();
    // The localized issue was fixed by regenerating rule72, verified, and the run accepted.
    let fixed = events.iter().any(|e| match &e.event {
        Some(gw::run_event::Event::Refinement(r)) => matches!(
            &r.event,
            Some(gw::refinement_event::Event::VerificationResult(v)) if v.section_id == "rule72" && v.accepted
        ),
        _ => false,
    });
    assert!(fixed, "{trace:#?}");
    let rule72 = result.sections.iter().find(|s| s.id == "rule72").expect("rule72");
    assert!(
        !rule72.content.contains("triple") && rule72.content.contains("double"),
        "the result returns the fix: {trace:#?}\n{result:#?}"
    );
    for (after, before) in result.sections.iter().zip(&sections) {
        if after.id != "rule72" && after.id != "apy" {
            assert_eq!(after, before, "only the localized section changes");
        }
    }
    assert!(result.unresolved_issues.iter().all(|i| i.severity != pb::Severity::Critical as i32), "{result:#?}");
    let expanded = sandbox
        .llm
        .requests()
        .iter()
        .filter(|r| r.last_user_message().is_some_and(|p| p.starts_with("You are a writer.")))
        .count();
    assert_eq!(expanded, 1, "one regeneration, of rule72");
    sandbox.shutdown().await.unwrap();
}

/// Once the arbiter placed a section-less issue, it belongs to that section: the focused
/// re-judging of the fixed section credits the fix at once (the judges no longer raise it), where
/// the section-less issue used to be carried forward with its penalty until a full judging.
#[tokio::test]
async fn a_placed_issue_is_credited_by_the_focused_rejudging_of_its_section() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(pipeline_handler);
    let (brief, sections) = lesson();
    let pipeline = gw::TargetedRefinementPipeline {
        sections: sections.clone(),
        brief: Some(brief),
        mode: gw::RefinementMode::FullAuto as i32,
        ..Default::default()
    };
    let events = sandbox.run_pipeline(gw::run_pipeline_request::Pipeline::TargetedRefinement(pipeline)).await;
    let judged: Vec<(u32, gw::Judged)> = events
        .iter()
        .filter_map(|e| match &e.event {
            Some(gw::run_event::Event::Refinement(r)) => match &r.event {
                Some(gw::refinement_event::Event::Judged(j)) => Some((r.iteration, j.clone())),
                _ => None,
            },
            _ => None,
        })
        .collect();
    let scores: Vec<(u32, bool, f64)> = judged.iter().map(|(k, j)| (*k, j.focused, j.score)).collect();
    assert!(judged.first().is_some_and(|(k, j)| *k == 0 && j.score < 0.9 && j.critical_issues == 1), "{scores:?}");
    let (_, focused) = judged.iter().find(|(k, j)| *k == 1 && j.focused).expect("a focused re-judging");
    assert!((focused.score - 0.95).abs() < 1e-9, "the fix is credited by the focused judging: {scores:?}");
    assert_eq!((focused.open_issues, focused.critical_issues), (0, 0), "{scores:?}");
    let result = refinement_result(&events).expect("the run completes");
    assert_eq!(result.outcome(), gw::RefinementOutcome::Accepted, "{result:#?}");
    assert_eq!(result.iterations, 1);
    sandbox.shutdown().await.unwrap();
}

/// The targeted refinement result of a run's events.
fn refinement_result(events: &[gw::RunEvent]) -> Option<gw::TargetedRefinementResult> {
    events.iter().find_map(|e| match &e.event {
        Some(gw::run_event::Event::Completed(c)) => match c.result.as_ref().and_then(|r| r.result.clone()) {
            Some(gw::run_result::Result::TargetedRefinement(r)) => Some(r),
            _ => None,
        },
        _ => None,
    })
}
