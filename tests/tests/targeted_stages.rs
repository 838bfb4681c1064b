//! The targeted-refinement stages across the whole mesh, each on its own loopback port: the
//! scorer's judge panel produces verdicts, the arbiter plans from them, the delta judge verifies
//! a fix, all over gRPC against the scripted OpenAI-compatible backend.

use assay_proto::arbiter::v1::arbiter_service_client::ArbiterServiceClient;
use assay_proto::arbiter::v1::{FixAction, PlanRequest};
use assay_proto::common::v1 as pb;
use assay_proto::delta_judge::v1::VerifyRequest;
use assay_proto::delta_judge::v1::delta_judge_service_client::DeltaJudgeServiceClient;
use assay_proto::scorer::v1::JudgeSectionsRequest;
use assay_proto::scorer::v1::scorer_service_client::ScorerServiceClient;
use assay_testkit::{RecordedRequest, Reply, hash_embedding};
use assay_tests::MeshSandbox;
use serde_json::json;

fn sections() -> Vec<pb::Section> {
    let text = [
        ("intro", "What a funnel is", "A sales funnel shows how strangers become customers. It has four stages."),
        ("stages", "The stages", "Awareness comes last. Interest, desire and action follow in some order."),
        ("example", "An example", "A bakery posts photos online, offers a tasting, and sells a cake."),
        ("summary", "Summary", "Funnels help teams see where people drop out and what to fix first."),
    ];
    text.iter()
        .enumerate()
        .map(|(i, (id, title, content))| pb::Section {
            id: id.to_string(),
            index: i as u32,
            title: title.to_string(),
            content: content.to_string(),
        })
        .collect()
}

/// Judges agree on the scores (by temperature, slightly apart) and all find the wrong order of the
/// stages; the 0.6 judge also wants a livelier example.
fn judge_reply(request: &RecordedRequest) -> serde_json::Value {
    let t = request.body.get("temperature").and_then(serde_json::Value::as_f64).unwrap_or(0.0);
    let mut issues = vec![json!({
        "section_id": "stages", "criterion": "factual_accuracy", "severity": "critical",
        "description": "The order of the funnel stages is wrong",
        "fix_instruction": "Give the stages in order: awareness, interest, desire, action.",
        "location": "Awareness comes last."
    })];
    if t > 0.5 {
        issues.push(json!({
            "section_id": "example", "criterion": "engagement_examples", "severity": "minor",
            "description": "The example is flat", "fix_instruction": "Name each stage in the bakery example.",
            "location": ""
        }));
    }
    json!({
        "criterion_scores": {
            "factual_accuracy": 0.4 + t / 10.0, "learning_objective_alignment": 0.8,
            "pedagogical_structure": 0.75 + t / 20.0, "clarity_readability": 0.85,
            "engagement_examples": 0.7 - t / 10.0, "completeness": 0.8
        },
        "issues": issues,
        "section_scores": []
    })
}

fn handler(request: &RecordedRequest) -> Reply {
    if request.is_embeddings() {
        // Descriptions of one problem share their opening words.
        return Reply::embeddings(
            request.embedding_inputs().iter().map(|t| hash_embedding(&t[..t.len().min(16)], 32)).collect(),
        );
    }
    let schema = request.body.pointer("/response_format/json_schema/name").and_then(serde_json::Value::as_str);
    match schema {
        Some("section_verdict") => Reply::json(judge_reply(request)),
        Some("section_instruction") => Reply::json(json!({
            "instruction": "List the four stages in the order awareness, interest, desire, action."
        })),
        _ if request.body.get("logprobs").is_some() => Reply::with_logprobs("YES", vec![("YES", -0.02), ("NO", -4.0)]),
        _ => Reply::text("YES"),
    }
}

#[tokio::test]
async fn panel_then_plan_then_verify_over_the_mesh() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(handler);
    let addrs = &sandbox.mesh().addrs;
    let mut scorer = ScorerServiceClient::new(sandbox.channel(addrs.scorer).await);
    let mut arbiter = ArbiterServiceClient::new(sandbox.channel(addrs.arbiter).await);
    let mut delta = DeltaJudgeServiceClient::new(sandbox.channel(addrs.delta_judge).await);
    let brief = pb::Brief {
        objectives: vec!["Name the four funnel stages in order".into()],
        audience: "new marketers".into(),
        language: "en".into(),
        description: String::new(),
    };

    // 1. The default panel: three judges.
    let panel = scorer
        .judge_sections(JudgeSectionsRequest { sections: sections(), brief: Some(brief.clone()), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((panel.succeeded, panel.failed), (3, 0), "{panel:?}");
    let verdicts: Vec<pb::JudgeVerdict> = panel.results.into_iter().filter_map(|r| r.verdict).collect();
    assert_eq!(verdicts.len(), 3);

    // 2. The arbiter's plan from those verdicts.
    let plan = arbiter
        .plan(PlanRequest { verdicts, sections: sections(), brief: Some(brief), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    let consolidation = plan.consolidation.unwrap();
    assert!(consolidation.alpha.is_some(), "{consolidation:?}");
    let stages = consolidation.issues.iter().find(|i| i.section_id == "stages").expect("the shared issue is kept");
    assert_eq!(stages.raised_by.len(), 3, "three judges raised one problem: {stages:?}");
    let routing = plan.routing.unwrap();
    let task = routing.tasks.iter().find(|t| t.section_id == "stages").unwrap();
    assert_eq!(task.action(), FixAction::RegenerateSection, "critical factual issue regenerates the section");
    assert_eq!(task.instruction, "List the four stages in the order awareness, interest, desire, action.");
    assert!(routing.tasks.iter().any(|t| t.section_id == "example" && t.consistency_check));
    assert!(plan.estimated_tokens > 0);

    // 3. The delta judge verifies a fix of that section.
    let before = sections().into_iter().find(|s| s.id == "stages").unwrap();
    let after = pb::Section {
        content: "The stages come in order: awareness, interest, desire and action.".into(),
        ..before.clone()
    };
    let verified = delta
        .verify(VerifyRequest {
            before: Some(before),
            after: Some(after),
            issues: consolidation.issues.iter().filter(|i| i.section_id == "stages").cloned().collect(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(verified.accepted, "{verified:?}");
    assert_eq!(verified.issues.len(), 1);
    assert!(verified.issues[0].fixed);
    assert!(verified.issues[0].confidence.unwrap() > 0.9);
}
