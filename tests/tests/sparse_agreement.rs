//! Agreement compares like with like (issue 31, point 4): alpha pools the units at least two
//! judges scored, so sparse, volunteered section scores never collapse agreement to LOW by
//! themselves. The arbiter's Plan RPC on the running mesh, against the scripted backend.

use assay_proto::arbiter::v1::arbiter_service_client::ArbiterServiceClient;
use assay_proto::arbiter::v1::{AgreementLevel, PlanRequest};
use assay_proto::common::v1 as pb;
use assay_testkit::{RecordedRequest, Reply, hash_embedding};
use assay_tests::MeshSandbox;
use serde_json::json;

const CRITERIA: [&str; 6] = [
    "factual_accuracy",
    "learning_objective_alignment",
    "pedagogical_structure",
    "clarity_readability",
    "engagement_examples",
    "completeness",
];

fn handler(request: &RecordedRequest) -> Reply {
    if request.is_embeddings() {
        return Reply::embeddings(request.embedding_inputs().iter().map(|t| hash_embedding(t, 32)).collect());
    }
    Reply::json(json!({ "instruction": "Fix what the judge raised in this section, nothing else." }))
}

fn sections() -> Vec<pb::Section> {
    (1..=6)
        .map(|i| pb::Section {
            id: format!("s{i}"),
            index: i as u32,
            title: format!("Part {i}"),
            content: format!("Part {i} explains one idea of the lesson in plain sentences. ").repeat(6),
        })
        .collect()
}

fn score(section: &str, criterion: &str, x: f64) -> pb::SectionScore {
    pb::SectionScore { section_id: section.into(), criterion: criterion.into(), score: x }
}

/// Three judges who agree on the criterion scores (each a hundredth or two apart), each raising
/// one minor issue of its own on a different section.
fn verdicts() -> Vec<pb::JudgeVerdict> {
    let base = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4];
    let shifts = [0.0, 0.02, -0.01];
    ["a", "b", "c"]
        .iter()
        .zip(shifts)
        .enumerate()
        .map(|(n, (judge, shift))| pb::JudgeVerdict {
            judge_id: judge.to_string(),
            criterion_scores: CRITERIA.iter().zip(base).map(|(c, x)| (c.to_string(), x + shift)).collect(),
            overall_score: 0.65 + shift,
            issues: vec![pb::JudgeIssue {
                id: format!("{judge}-1"),
                criterion: "engagement_examples".into(),
                severity: pb::Severity::Minor as i32,
                section_id: format!("s{}", n + 2),
                description: format!("Part {} needs a concrete example ({judge}).", n + 2),
                fix_instruction: format!("Add one concrete example to part {}.", n + 2),
                ..Default::default()
            }],
            ..Default::default()
        })
        .collect()
}

async fn plan(sandbox: &MeshSandbox, verdicts: Vec<pb::JudgeVerdict>) -> assay_proto::arbiter::v1::PlanResponse {
    let mut client = ArbiterServiceClient::new(sandbox.channel(sandbox.mesh().addrs.arbiter).await);
    client.plan(PlanRequest { verdicts, sections: sections(), ..Default::default() }).await.expect("plan").into_inner()
}

#[tokio::test]
async fn volunteered_section_scores_do_not_collapse_agreement() {
    let sandbox = MeshSandbox::start().await;
    sandbox.llm.set_handler(handler);

    // One judge volunteers two section scores that nobody else gives.
    let mut one = verdicts();
    one[0].section_scores = vec![score("s1", "clarity_readability", 0.2), score("s4", "completeness", 0.95)];
    // Every judge volunteers a few section scores, mostly on different sections: only s1 x
    // clarity is scored by two judges (and they differ by 0.05). The old rule measured alpha over
    // section units alone here and found next to nothing to pair.
    let mut every = verdicts();
    every[0].section_scores = vec![score("s1", "clarity_readability", 0.2), score("s4", "completeness", 0.95)];
    every[1].section_scores = vec![score("s1", "clarity_readability", 0.25), score("s2", "factual_accuracy", 0.1)];
    every[2].section_scores = vec![score("s6", "engagement_examples", 0.9)];

    for (what, verdicts, units) in [("one judge", one, "criterion"), ("every judge", every, "criterion")] {
        let plan = plan(&sandbox, verdicts).await;
        let c = plan.consolidation.unwrap();
        assert_eq!(c.agreement(), AgreementLevel::High, "{what}: {c:#?}");
        assert!(c.alpha.is_some_and(|a| a >= 0.8), "{what}: {:?} {}", c.alpha, c.alpha_undefined_reason);
        assert!(!c.flagged_for_review, "{what}");
        assert_eq!(c.agreement_units, units, "{what}");
        // Nothing filtered for agreement: each judge's own minor issue is kept and routed.
        assert_eq!(c.issues_dropped, 0, "{what}");
        let mut kept: Vec<&str> = c.issues.iter().map(|i| i.id.as_str()).collect();
        kept.sort_unstable();
        assert_eq!(kept, ["a-1", "b-1", "c-1"], "{what}");
        let routing = plan.routing.unwrap();
        let routed: Vec<&str> = routing.tasks.iter().map(|t| t.section_id.as_str()).collect();
        assert_eq!(routed, ["s2", "s3", "s4"], "{what}");
    }
    sandbox.shutdown().await.unwrap();
}
