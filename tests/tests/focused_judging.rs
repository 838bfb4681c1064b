//! Focused judging across the whole mesh (issue 31, incremental re-judging): the scorer's
//! JudgeSections re-judges only the sections an iteration changed, with their neighbours as
//! read-only context. On the realistic 8-section lesson the focused prompt is a fraction of the
//! whole-document prompt; the scripted backend records every prompt and answers from the request's
//! own schema, so the judged ids it scores are the ones the scorer asked for.

use assay_proto::common::v1 as pb;
use assay_proto::scorer::v1::JudgeSectionsRequest;
use assay_proto::scorer::v1::scorer_service_client::ScorerServiceClient;
use assay_testkit::{RecordedRequest, Reply};
use assay_tests::MeshSandbox;
use serde_json::{Value, json};
use tonic::Code;
use tonic_types::StatusExt;

const FIXTURE: &str = include_str!("../fixtures/lesson_compound_interest.json");

const CRITERIA: [&str; 6] = [
    "factual_accuracy",
    "learning_objective_alignment",
    "pedagogical_structure",
    "clarity_readability",
    "engagement_examples",
    "completeness",
];

/// The lesson's brief and its eight sections, `index` = position (document order).
fn lesson() -> (pb::Brief, Vec<pb::Section>) {
    assay_tests::lesson_fixture(FIXTURE)
}

/// Judge `judged` (ids) of the lesson; the sections next to them are the context.
fn focused(judged: &[&str]) -> JudgeSectionsRequest {
    let (brief, all) = lesson();
    let at: Vec<usize> =
        all.iter().enumerate().filter(|(_, s)| judged.contains(&s.id.as_str())).map(|(i, _)| i).collect();
    let near = |i: usize| at.iter().any(|&j| i + 1 == j || j + 1 == i);
    let (mut sections, mut context) = (Vec::new(), Vec::new());
    for (i, s) in all.into_iter().enumerate() {
        if at.contains(&i) {
            sections.push(s);
        } else if near(i) {
            context.push(s);
        }
    }
    JudgeSectionsRequest { sections, brief: Some(brief), context, ..Default::default() }
}

/// The ids a request lets the judge score (the schema's section-score enum).
fn schema_ids(request: &RecordedRequest) -> Vec<String> {
    let ids = request
        .body
        .pointer("/response_format/json_schema/schema/properties/section_scores/items/properties/section_id/enum")
        .and_then(Value::as_array)
        .expect("the judge call carries its schema");
    ids.iter().filter_map(Value::as_str).map(str::to_string).collect()
}

/// A judge: scores every criterion, gives a section score for every id the schema allows, raises
/// one issue on the first of them and one on the first context section of the prompt (if any).
fn judge(request: &RecordedRequest) -> Reply {
    let ids = schema_ids(request);
    let prompt = request.first_user_message();
    let scores: serde_json::Map<String, Value> = CRITERIA.iter().map(|c| (c.to_string(), json!(0.7))).collect();
    let section_scores: Vec<Value> = ids
        .iter()
        .flat_map(|id| CRITERIA.iter().map(move |c| json!({"section_id": id, "criterion": c, "score": 0.7})))
        .collect();
    let issue = |id: &str| {
        json!({"section_id": id, "criterion": "clarity_readability", "severity": "minor",
               "description": "One sentence runs on for too long.",
               "fix_instruction": "Split the longest sentence in two.", "location": ""})
    };
    let mut issues = vec![issue(&ids[0])];
    if let Some(at) = prompt.find("<context id=\"") {
        let rest = &prompt[at + "<context id=\"".len()..];
        issues.push(issue(&rest[..rest.find('"').unwrap()]));
    }
    Reply::json(json!({"criterion_scores": scores, "issues": issues, "section_scores": section_scores}))
}

/// Prompt characters and the reply limit of the calls from `from` on (one panel).
fn panel_figures(sandbox: &MeshSandbox, from: usize) -> (usize, u64) {
    let calls = &sandbox.llm.requests()[from..];
    assert_eq!(calls.len(), 3, "one call per judge of the default panel");
    let chars: Vec<usize> = calls.iter().map(|r| r.first_user_message().chars().count()).collect();
    assert!(chars.iter().all(|c| *c == chars[0]), "every judge reads the same prompt: {chars:?}");
    let limit = calls[0].body.get("max_tokens").or_else(|| calls[0].body.get("max_completion_tokens"));
    (chars[0], limit.and_then(Value::as_u64).unwrap_or_default())
}

#[tokio::test]
async fn focused_judging_reads_a_fraction_of_the_whole_document() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(judge);
    let mut scorer = ScorerServiceClient::new(sandbox.channel(sandbox.mesh().addrs.scorer).await);
    let (brief, all) = lesson();
    assert_eq!(all.len(), 8);

    // The whole document, as the first judging reads it.
    let whole = scorer
        .judge_sections(JudgeSectionsRequest { sections: all.clone(), brief: Some(brief), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((whole.succeeded, whole.failed), (3, 0));
    let (whole_chars, whole_limit) = panel_figures(&sandbox, 0);
    let whole_prompt = sandbox.llm.requests()[0].first_user_message();
    assert!(!whole_prompt.contains("<context"), "no context, the whole-document prompt");

    // One changed section (the worked example) with its neighbours as context.
    let one = scorer.judge_sections(focused(&["example"])).await.unwrap().into_inner();
    assert_eq!((one.succeeded, one.failed), (3, 0));
    let (one_chars, one_limit) = panel_figures(&sandbox, 3);
    let prompt = sandbox.llm.requests()[3].first_user_message();
    let example = all.iter().find(|s| s.id == "example").unwrap();
    assert!(prompt.contains(example.content.trim_end()), "the judged section is shown in full");
    assert!(prompt.contains("<context id=\"formula\"") && prompt.contains("<context id=\"frequency\""), "{prompt}");
    for far in ["intro", "simple", "rule72", "apy", "practice"] {
        assert!(!prompt.contains(&format!("id=\"{far}\"")), "{far} is neither judged nor context");
    }
    let formula = all.iter().find(|s| s.id == "formula").unwrap();
    let formula_end: String =
        formula.content.trim_end().chars().rev().take(80).collect::<Vec<_>>().into_iter().rev().collect();
    let formula_start: String = formula.content.chars().take(80).collect();
    assert!(prompt.contains(&formula_end) && !prompt.contains(&formula_start), "the section before shows its end");
    for r in &one.results {
        let v = r.verdict.as_ref().unwrap();
        let on: Vec<&str> = v.issues.iter().map(|i| i.section_id.as_str()).collect();
        assert_eq!(on, vec!["example"], "issues only on the judged section");
        assert!(r.error.contains("names the context section \"formula\", which is read-only"), "{}", r.error);
        assert_eq!(v.section_scores.len(), 6, "every criterion of the judged section");
        assert!(v.section_scores.iter().all(|s| s.section_id == "example"));
    }

    // Two changed sections, apart (the formula and the Rule of 72).
    let two = scorer.judge_sections(focused(&["formula", "rule72"])).await.unwrap().into_inner();
    assert_eq!((two.succeeded, two.failed), (3, 0));
    let (two_chars, two_limit) = panel_figures(&sandbox, 6);
    for r in &two.results {
        assert_eq!(r.verdict.as_ref().unwrap().section_scores.len(), 12);
    }

    // Two changed sections side by side (the worked example and compounding frequency).
    let pair = scorer.judge_sections(focused(&["example", "frequency"])).await.unwrap().into_inner();
    assert_eq!((pair.succeeded, pair.failed), (3, 0));
    let (pair_chars, pair_limit) = panel_figures(&sandbox, 9);

    let tokens = |chars: usize| chars / 4;
    eprintln!("focused judging on lesson_compound_interest.json (prompt tokens = characters / 4, one judge):");
    eprintln!("  judged                    prompt chars  prompt tokens  % of whole  reply limit  panel of 3 (prompt)");
    for (what, chars, limit) in [
        ("whole document (8)", whole_chars, whole_limit),
        ("1: example", one_chars, one_limit),
        ("2 apart: formula, rule72", two_chars, two_limit),
        ("2 adjacent: example, freq.", pair_chars, pair_limit),
    ] {
        eprintln!(
            "  {what:<26}{chars:>12}  {:>13}  {:>9.0}%  {limit:>11}  {:>19}",
            tokens(chars),
            100.0 * chars as f64 / whole_chars as f64,
            3 * tokens(chars)
        );
    }
    // One changed section of eight: about a third of the whole-document prompt (the brief, the
    // criteria and the instructions are read either way); two sections well under the whole.
    assert!(one_chars * 100 < whole_chars * 35, "{one_chars} vs {whole_chars}");
    assert!(pair_chars * 100 < whole_chars * 50, "{pair_chars} vs {whole_chars}");
    assert!(two_chars * 100 < whole_chars * 60, "{two_chars} vs {whole_chars}");
    assert!(one_limit < whole_limit && two_limit < whole_limit, "the reply limit follows the judged sections");
}

#[tokio::test]
async fn a_context_section_that_is_also_judged_is_invalid_argument() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(judge);
    let mut scorer = ScorerServiceClient::new(sandbox.channel(sandbox.mesh().addrs.scorer).await);
    let mut request = focused(&["example"]);
    request.context[0].id = "example".into();
    let status = scorer.judge_sections(request).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let bad = status.get_details_bad_request().expect("bad request details");
    let fields: Vec<&str> = bad.field_violations.iter().map(|v| v.field.as_str()).collect();
    assert_eq!(fields, vec!["context[0].id"], "{:?}", bad.field_violations);
    assert!(bad.field_violations[0].description.contains("sections[0]"), "{:?}", bad.field_violations);
    assert_eq!(sandbox.llm.request_count(), 0, "bad input never reaches the backend");
}
