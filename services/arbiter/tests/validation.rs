//! Caller-supplied verdicts, issues and instructions over real gRPC on port 0: what Consolidate,
//! Route and Plan cannot use is refused with INVALID_ARGUMENT and a BadRequest violation naming
//! the field, under the limits of the stages the request feeds (Patch, ExpandSection).

use std::sync::Arc;

use assay_domain::content::{MAX_CONSTRAINTS, MAX_EDIT_ISSUES, MAX_INSTRUCTION_BYTES};
use assay_domain::document::{MAX_ISSUES_PER_VERDICT, MAX_JUDGES};
use assay_proto::arbiter::v1::arbiter_service_client::ArbiterServiceClient;
use assay_proto::arbiter::v1::{ConsolidateRequest, PlanRequest, RouteRequest, SectionInstruction};
use assay_proto::common::v1 as pb;
use assay_testkit::TestServer;
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

/// The arbiter over a hub without backends: every request here is refused before any model call.
async fn client() -> (TestServer, ArbiterServiceClient<tonic::transport::Channel>) {
    let core = assay_arbiter::ArbiterCore::new(Arc::new(assay_llm::ModelHub::default()));
    let server = TestServer::start(assay_arbiter::routes(Arc::new(core)), &[assay_proto::service_names::ARBITER]).await;
    let client = ArbiterServiceClient::new(server.channel().await);
    (server, client)
}

fn sections(n: usize) -> Vec<pb::Section> {
    (1..=n)
        .map(|i| pb::Section {
            id: format!("s{i}"),
            index: i as u32,
            title: format!("Part {i}"),
            content: format!("Section {i} explains one idea. "),
        })
        .collect()
}

fn issue(id: &str, section: &str) -> pb::JudgeIssue {
    pb::JudgeIssue {
        id: id.into(),
        criterion: "clarity_readability".into(),
        severity: pb::Severity::Minor as i32,
        section_id: section.into(),
        description: "Too dense.".into(),
        fix_instruction: "Simplify.".into(),
        ..Default::default()
    }
}

fn score(section: &str, criterion: &str, x: f64) -> pb::SectionScore {
    pb::SectionScore { section_id: section.into(), criterion: criterion.into(), score: x }
}

fn verdict(judge: &str) -> pb::JudgeVerdict {
    pb::JudgeVerdict {
        judge_id: judge.into(),
        criterion_scores: CRITERIA.iter().map(|c| (c.to_string(), 0.8)).collect(),
        overall_score: 0.8,
        section_scores: vec![score("s1", "completeness", 0.8), score("s2", "completeness", 0.7)],
        ..Default::default()
    }
}

fn consolidate() -> ConsolidateRequest {
    ConsolidateRequest {
        verdicts: vec![verdict("a"), verdict("b"), verdict("c")],
        sections: sections(3),
        skip_synthesis: true,
        ..Default::default()
    }
}

fn instruction(section: &str) -> SectionInstruction {
    SectionInstruction { section_id: section.into(), instruction: "Simplify the wording.".into(), ..Default::default() }
}

fn route() -> RouteRequest {
    RouteRequest {
        issues: vec![issue("i1", "s1"), issue("i2", "s2")],
        sections: sections(3),
        instructions: vec![instruction("s1")],
        locked_section_ids: vec!["s3".into()],
        ..Default::default()
    }
}

/// The fields of an INVALID_ARGUMENT status's BadRequest.
fn violations(status: &tonic::Status) -> Vec<String> {
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    let bad = status.get_details_bad_request().expect("a BadRequest detail");
    bad.field_violations.into_iter().map(|v| v.field).collect()
}

#[tokio::test]
async fn consolidate_refuses_section_scores_naming_no_section_or_criterion() {
    let (_server, mut client) = client().await;
    let with = |judge: usize, scores: Vec<pb::SectionScore>| {
        let mut r = consolidate();
        r.verdicts[judge].section_scores = scores;
        r
    };
    let cases = [
        (with(1, vec![score("nope", "completeness", 0.1)]), "verdicts[1].section_scores[0].section_id"),
        (
            with(0, vec![score("s1", "completeness", 0.8), score("s2", "tone", 0.1)]),
            "verdicts[0].section_scores[1].criterion",
        ),
        // Custom criteria: a default criterion is no longer one of the request's.
        (
            ConsolidateRequest {
                criteria: vec![pb::Criterion { name: "accuracy".into(), description: String::new(), priority: 1 }],
                verdicts: vec![pb::JudgeVerdict {
                    criterion_scores: [("accuracy".to_string(), 0.8)].into(),
                    section_scores: vec![score("s1", "accuracy", 0.8), score("s1", "completeness", 0.8)],
                    ..verdict("a")
                }],
                ..consolidate()
            },
            "verdicts[0].section_scores[1].criterion",
        ),
        (
            with(2, vec![score("s1", "completeness", 0.8), score("s1", "completeness", 0.1)]),
            "verdicts[2].section_scores[1]",
        ),
    ];
    for (request, field) in cases {
        let status = client.consolidate(request).await.unwrap_err();
        assert_eq!(violations(&status), vec![field.to_string()], "{field}");
    }
    // Plan takes the same verdicts, and its locked ids name sections of the document.
    let c = with(1, vec![score("s9", "completeness", 0.1)]);
    let status = client
        .plan(PlanRequest {
            verdicts: c.verdicts,
            sections: c.sections,
            locked_section_ids: vec!["s1".into(), "s7".into()],
            skip_synthesis: true,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(violations(&status), vec!["verdicts[1].section_scores[0].section_id", "locked_section_ids[1]"]);
}

#[tokio::test]
async fn route_holds_issues_and_instructions_to_the_limits_of_the_edits_they_feed() {
    let (_server, mut client) = client().await;
    // The valid request routes.
    let ok = client.route(route()).await.unwrap().into_inner();
    assert_eq!(ok.skipped_locked_section_ids, Vec::<String>::new());
    assert_eq!(ok.tasks.len(), 2, "{ok:?}");
    assert_eq!(ok.tasks[0].instruction, "Simplify the wording.");

    let many = |n: usize| (0..n).map(|i| issue(&format!("i{i}"), "s1")).collect::<Vec<_>>();
    let mut too_many = many(MAX_JUDGES * MAX_ISSUES_PER_VERDICT + 1);
    for (i, x) in too_many.iter_mut().enumerate() {
        x.section_id = format!("s{}", i % 3 + 1);
    }
    let with_instruction = |f: &dyn Fn(&mut SectionInstruction)| {
        let mut r = route();
        f(&mut r.instructions[0]);
        r
    };
    let big = "x".repeat(MAX_INSTRUCTION_BYTES + 1);
    let cases: Vec<(RouteRequest, Vec<&str>)> = vec![
        // More issues on one section than one edit (Patch) takes.
        (RouteRequest { issues: many(MAX_EDIT_ISSUES), ..route() }, vec![]),
        (RouteRequest { issues: many(MAX_EDIT_ISSUES + 1), ..route() }, vec!["issues[100].section_id"]),
        // More issues than a full panel can raise.
        (RouteRequest { issues: too_many, ..route() }, vec!["issues"]),
        // Duplicate issue ids, given or filled in ("issue-2" for the second issue).
        (RouteRequest { issues: vec![issue("i1", "s1"), issue("i1", "s2")], ..route() }, vec!["issues[1].id"]),
        (RouteRequest { issues: vec![issue("issue-2", "s1"), issue("", "s2")], ..route() }, vec!["issues[1].id"]),
        // Instructions: Patch's 8 KiB, also for a 10 MB one, and its constraint limits.
        (with_instruction(&|i| i.instruction = big.clone()), vec!["instructions[0].instruction"]),
        (with_instruction(&|i| i.instruction = "x".repeat(10 << 20)), vec!["instructions[0].instruction"]),
        (with_instruction(&|i| i.constraints = vec![big.clone()]), vec!["instructions[0].constraints[0]"]),
        (
            with_instruction(&|i| i.constraints = vec!["keep it short".into(); MAX_CONSTRAINTS + 1]),
            vec!["instructions[0].constraints"],
        ),
        (
            RouteRequest { instructions: vec![instruction("s1"), instruction("s1")], ..route() },
            vec!["instructions[1].section_id"],
        ),
        (RouteRequest { instructions: vec![instruction("s9")], ..route() }, vec!["instructions[0].section_id"]),
        // Locked ids name sections of the document.
        (
            RouteRequest { locked_section_ids: vec!["s3".into(), "nope".into()], ..route() },
            vec!["locked_section_ids[1]"],
        ),
    ];
    for (request, fields) in cases {
        let result = client.route(request).await;
        if fields.is_empty() {
            result.expect("within the limits");
            continue;
        }
        let got = violations(&result.unwrap_err());
        for f in &fields {
            assert!(got.iter().any(|g| g == f), "{f} not in {got:?}");
        }
        if fields != ["issues"] {
            assert_eq!(got, fields);
        }
    }
}
