//! Targeted refinement at its default settings on a realistic document (issue 31): the 8-section,
//! 18,432-character compound-interest lesson (`tests/fixtures/lesson_compound_interest.json`) with
//! a planted factual error (the Rule of 72 "triples" money) and a missing step (the worked example
//! uses 1.004 without computing it), sent through the whole mesh with no options at all.
//!
//! The scripted backend plays judges that find both problems, an expander that fixes what it is
//! asked to, a delta judge and a consistency checker. Token usage is what a real backend would
//! report for these prompts: characters / 4 of the prompt and of the reply.

use std::sync::{Arc, Mutex};

use assay_proto::common::v1 as pb;
use assay_proto::gateway::v1 as gw;
use assay_proto::gateway::v1::refinement_event::Event as Rev;
use assay_testkit::prompts::{edited_text, judged_sections, prompt_of};
use assay_testkit::{RecordedRequest, Reply, hash_embedding};
use assay_tests::MeshSandbox;
use serde_json::{Value, json};

const TRIPLE: &str = "for money to triple at a given yearly rate";
const DOUBLE: &str = "for money to double at a given yearly rate";
const MISSING_STEP: &str = "The growth factor is 1.004, so";
const WITH_STEP: &str = "The growth factor per period is 1 + 0.048 / 12 = 1.004, so";
const CRITERIA: [&str; 6] = [
    "factual_accuracy",
    "learning_objective_alignment",
    "pedagogical_structure",
    "clarity_readability",
    "engagement_examples",
    "completeness",
];

fn lesson() -> (Vec<pb::Section>, pb::Brief) {
    let (brief, sections) = assay_tests::lesson_fixture(include_str!("../fixtures/lesson_compound_interest.json"));
    (sections, brief)
}

/// The planted problems still in a judged section: (criterion, severity, description, quote).
fn problems(id: &str, text: &str) -> Vec<(&'static str, &'static str, &'static str, &'static str)> {
    let mut out = Vec::new();
    if id == "rule72" && text.contains(TRIPLE) {
        out.push((
            "factual_accuracy",
            "critical",
            "The Rule of 72 estimates the doubling time, not the tripling time.",
            TRIPLE,
        ));
    }
    if id == "example" && text.contains(MISSING_STEP) {
        out.push((
            "completeness",
            "major",
            "Step 3 uses the growth factor 1.004 without showing how it comes from 0.048 / 12.",
            MISSING_STEP,
        ));
    }
    out
}

/// How the scripted panel and stages behave; `inconsistent` makes the consistency check say NO
/// for that section.
#[derive(Clone, Default)]
struct World {
    inconsistent: Option<&'static str>,
}

impl World {
    fn judge(&self, prompt: &str) -> Value {
        let judged = judged_sections(prompt);
        let focused = prompt.contains("You see PART of a longer document");
        let mut criterion: serde_json::Map<String, Value> =
            CRITERIA.iter().map(|c| (c.to_string(), json!(0.9))).collect();
        let mut issues = Vec::new();
        let mut section_scores = Vec::new();
        for (id, text) in &judged {
            let found = problems(id, text);
            for (c, severity, description, quote) in &found {
                let drop = if *severity == "critical" { 0.3 } else { 0.25 };
                criterion.insert(c.to_string(), json!(0.9 - drop));
                issues.push(json!({"section_id": id, "criterion": c, "severity": severity,
                    "description": description, "fix_instruction": format!("{description} Correct it."),
                    "location": quote}));
                section_scores.push(json!({"section_id": id, "criterion": c, "score": 0.2}));
            }
            if focused {
                // Every judged section on every criterion; clarity volunteered a little lower than
                // the document's clarity (a section unit, never compared with the document's lock).
                for c in CRITERIA.iter().filter(|c| !found.iter().any(|f| f.0 == **c)) {
                    let score = if *c == "clarity_readability" { 0.8 } else { 0.92 };
                    section_scores.push(json!({"section_id": id, "criterion": c, "score": score}));
                }
            }
        }
        json!({"criterion_scores": criterion, "issues": issues, "section_scores": section_scores})
    }

    fn reply(&self, r: &RecordedRequest) -> Reply {
        if r.is_embeddings() {
            return Reply::embeddings(r.embedding_inputs().iter().map(|t| hash_embedding(t, 32)).collect());
        }
        let prompt = prompt_of(r);
        let schema = r.body.pointer("/response_format/json_schema/name").and_then(Value::as_str);
        let text = if schema == Some("section_verdict") {
            self.judge(&prompt).to_string()
        } else if schema == Some("section_instruction") {
            json!({"instruction": "Correct the problem the judges found and keep everything else."}).to_string()
        } else if prompt.starts_with("You are a writer.") {
            let current = edited_text(&prompt).unwrap_or_default();
            format!("<section>\n{}\n</section>", current.replace(TRIPLE, DOUBLE).replace(MISSING_STEP, WITH_STEP))
        } else if prompt.starts_with("You are a careful editor. Fix one") {
            let current = edited_text(&prompt).unwrap_or_default();
            format!(
                "<section>\n{current}\n\nAs the Rule of 72 section shows, money doubles in about 72 / r years.\n</section>"
            )
        } else if prompt.starts_with("You are checking one section of a document after the section before it") {
            let checked = self.inconsistent.is_some_and(|id| prompt.contains(opening_of(id).as_str()));
            if checked {
                "NO. It still says money triples, which no longer matches the rewritten section before it.".into()
            } else {
                "YES".into()
            }
        } else if prompt.starts_with("You are verifying an edit") {
            "YES".into()
        } else {
            return Reply::status(500).body(json!({"error": {"message": "unexpected call"}}).to_string());
        };
        let reply = if text == "YES" || text.starts_with("NO") {
            let (a, b) = if text == "YES" { ("YES", "NO") } else { ("NO", "YES") };
            Reply::with_logprobs(&text, vec![(a, -0.02), (b, -4.5)])
        } else if text.starts_with('{') {
            Reply::json(serde_json::from_str(&text).expect("json"))
        } else {
            Reply::text(text.clone())
        };
        reply.usage((prompt.len() / 4) as u64, (text.len() / 4).max(1) as u64)
    }
}

/// The first 80 characters of a section as given (to recognise it in a prompt).
fn opening_of(id: &str) -> String {
    lesson().0.into_iter().find(|s| s.id == id).map(|s| s.content.chars().take(80).collect()).unwrap_or_default()
}

struct Outcome {
    result: gw::TargetedRefinementResult,
    events: Vec<gw::RunEvent>,
    calls: Vec<RecordedRequest>,
}

async fn refine(world: World) -> Outcome {
    let sandbox = MeshSandbox::start().await;
    let seen: Arc<Mutex<Vec<RecordedRequest>>> = Arc::default();
    let log = seen.clone();
    sandbox.llm.set_handler(move |r| {
        if let Ok(mut l) = log.lock() {
            l.push(r.clone());
        }
        world.reply(r)
    });
    let (sections, brief) = lesson();
    // No options: mode, budgets, panel, models and criteria all at their defaults.
    let pipeline = gw::TargetedRefinementPipeline { sections, brief: Some(brief), ..Default::default() };
    let events = sandbox.run_pipeline(gw::run_pipeline_request::Pipeline::TargetedRefinement(pipeline)).await;
    let result = events
        .iter()
        .find_map(|e| match &e.event {
            Some(gw::run_event::Event::Completed(c)) => match c.result.as_ref().and_then(|r| r.result.clone()) {
                Some(gw::run_result::Result::TargetedRefinement(t)) => Some(t),
                _ => None,
            },
            _ => None,
        })
        .expect("the run completes with a refinement result");
    let calls = seen.lock().map(|l| l.clone()).unwrap_or_default();
    sandbox.shutdown().await.unwrap();
    Outcome { result, events, calls }
}

fn revs(events: &[gw::RunEvent]) -> Vec<Rev> {
    events
        .iter()
        .filter_map(|e| match &e.event {
            Some(gw::run_event::Event::Refinement(r)) => r.event.clone(),
            _ => None,
        })
        .collect()
}

fn tokens(u: &Option<pb::Usage>) -> u64 {
    u.as_ref().map_or(0, |u| u.prompt_tokens + u.completion_tokens)
}

/// With no options, both planted problems are fixed, verified and returned within the default
/// budget; the other six sections come back byte-identical; the re-judging reads the two changed
/// sections (with their neighbours as context), not the document; the consistency checks of the
/// sections after the regenerated ones find them consistent and edit nothing.
#[tokio::test]
async fn an_ordinary_lesson_sent_with_no_options_gets_its_planted_problems_fixed() {
    let (given, _) = lesson();
    let document_chars: usize = given.iter().map(|s| s.content.chars().count() + s.title.chars().count()).sum();
    assert!(document_chars > 18_000, "a realistic, full-size lesson: {document_chars}");
    let Outcome { result, events, calls } = refine(World::default()).await;
    let r = &result;
    assert_eq!(r.outcome(), gw::RefinementOutcome::Accepted, "{r:#?}");
    let out = |id: &str| r.sections.iter().find(|s| s.id == id).map(|s| s.content.clone()).unwrap_or_default();
    assert!(out("rule72").contains(DOUBLE) && !out("rule72").contains(TRIPLE), "the factual error is fixed");
    assert!(out("example").contains(WITH_STEP), "the missing step is added");
    for g in given.iter().filter(|g| g.id != "rule72" && g.id != "example") {
        assert_eq!(out(&g.id), g.content, "section {} is untouched", g.id);
    }
    assert_eq!(r.changed_section_ids, vec!["example".to_string(), "rule72".to_string()]);
    assert!(!r.score_predates_fixes);
    assert!(r.unresolved_issues.is_empty(), "{:?}", r.unresolved_issues);

    // Both fixes verified by the delta judge, none rolled back (the focused judging's lower
    // clarity score for rule72 is a section unit, never compared with the document's lock).
    let verified: Vec<gw::VerificationResult> = revs(&events)
        .into_iter()
        .filter_map(|e| if let Rev::VerificationResult(v) = e { Some(v) } else { None })
        .collect();
    assert!(verified.iter().all(|v| v.accepted && !v.rolled_back), "{verified:#?}");
    let mut ids: Vec<&str> = verified.iter().map(|v| v.section_id.as_str()).collect();
    ids.sort_unstable();
    assert_eq!(ids, ["example", "rule72"]);

    // N+1: the sections after the regenerated ones were checked, found consistent, not edited.
    let checks: Vec<gw::ConsistencyChecked> = revs(&events)
        .into_iter()
        .filter_map(|e| if let Rev::ConsistencyChecked(c) = e { Some(c) } else { None })
        .collect();
    let mut checked: Vec<(&str, &str, bool)> =
        checks.iter().map(|c| (c.section_id.as_str(), c.previous_section_id.as_str(), c.consistent)).collect();
    checked.sort_unstable();
    assert_eq!(checked, [("apy", "rule72", true), ("frequency", "example", true)]);

    // Judgings: the document, then only the two changed sections with their neighbours as
    // context (a full judging to confirm does not fit the budget that is left).
    let judged: Vec<gw::Judged> =
        revs(&events).into_iter().filter_map(|e| if let Rev::Judged(j) = e { Some(j) } else { None }).collect();
    assert_eq!(judged.len(), 2, "{judged:#?}");
    assert!(!judged[0].focused && judged[1].focused);
    assert_eq!(judged[1].judged_section_ids, ["example", "rule72"]);
    let judge_prompts: Vec<String> = calls
        .iter()
        .filter(|c| {
            c.body.pointer("/response_format/json_schema/name").and_then(Value::as_str) == Some("section_verdict")
        })
        .map(prompt_of)
        .collect();
    assert_eq!(judge_prompts.len(), 6);
    assert!(judge_prompts[3..].iter().all(|p| p.len() * 2 < judge_prompts[0].len()), "focused prompts are small");

    // The budget: the first assessment apart, everything after it within the default budget.
    let default_budget = 15_000u64.max(5 * (document_chars as u64).div_ceil(4));
    let budgeted: u64 = r.phase_usage.iter().filter(|p| p.budgeted).map(|p| tokens(&p.usage)).sum();
    assert!(budgeted <= default_budget, "{budgeted} of {default_budget}: {:#?}", r.phase_usage);
    let assessment = r.phase_usage.iter().find(|p| p.phase == "assessment").expect("assessment");
    assert!(!assessment.budgeted && tokens(&assessment.usage) > 15_000, "{assessment:?}");
    let all: u64 = r.phase_usage.iter().map(|p| tokens(&p.usage)).sum();
    assert_eq!(all, tokens(&r.usage), "every token is in one phase: {:#?}", r.phase_usage);
    for phase in ["judging", "editing", "verification"] {
        let p = r.phase_usage.iter().find(|p| p.phase == phase).unwrap_or_else(|| panic!("{phase} missing"));
        assert!(tokens(&p.usage) > 0, "{phase} used tokens: {p:?}");
    }
    println!(
        "phase usage (used / estimated): {}",
        r.phase_usage
            .iter()
            .map(|p| format!("{} {}/{}", p.phase, tokens(&p.usage), p.estimated_tokens))
            .collect::<Vec<_>>()
            .join(", ")
    );
}

/// N+1: when the check finds the section after a regenerated one inconsistent, exactly one patch
/// of it runs, carrying the inconsistency as its issue; the other check edits nothing.
#[tokio::test]
async fn an_inconsistent_next_section_gets_exactly_one_patch_with_the_inconsistency_as_its_issue() {
    let Outcome { result, events, calls } = refine(World { inconsistent: Some("apy") }).await;
    let patches: Vec<gw::PatchApplied> =
        revs(&events).into_iter().filter_map(|e| if let Rev::PatchApplied(p) = e { Some(p) } else { None }).collect();
    let mut patched: Vec<&str> = patches.iter().map(|p| p.section_id.as_str()).collect();
    patched.sort_unstable();
    assert_eq!(patched, ["apy", "example", "rule72"], "one patch of apy, no edit of frequency");
    let patch_prompts: Vec<String> =
        calls.iter().map(prompt_of).filter(|p| p.starts_with("You are a careful editor. Fix one")).collect();
    assert_eq!(patch_prompts.len(), 1);
    assert!(
        patch_prompts[0].contains("no longer matches the rewritten section before it"),
        "the check's reason is the issue"
    );
    // The patch of apy comes after the regeneration of rule72 (N before N+1).
    let order: Vec<String> = revs(&events)
        .into_iter()
        .filter_map(|e| if let Rev::PatchApplied(p) = e { Some(p.section_id) } else { None })
        .collect();
    let at = |id: &str| order.iter().position(|x| x == id).unwrap_or(usize::MAX);
    assert!(at("rule72") < at("apy"), "{order:?}");
    assert!(result.changed_section_ids.contains(&"apy".to_string()), "{:?}", result.changed_section_ids);
}
